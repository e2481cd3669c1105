/* SPDX-License-Identifier: MIT */
/*
 * dlvsym_main HOW: looks up libc's read and readv at version GLIBC_2.2.5
 * with dlvsym in HOW: "default" (RTLD_DEFAULT), "handle" (a dlopen handle
 * of libc.so.6) or "next" (RTLD_NEXT, from the executable), then calls them
 * through the pointers, each on standard input:
 *   prints "ready read", reads once with read(0), prints "read N"
 *   prints "ready readv", reads once with readv(0), prints "readv N"
 * Exits 2 printing "dlopen: <dlerror>" when libc.so.6 cannot be opened,
 * 3 printing "dlvsym: <dlerror>" when a lookup fails.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

static void *lookup(void *where, const char *name)
{
	void *p = dlvsym(where, name, "GLIBC_2.2.5");

	if (!p) {
		printf("dlvsym: %s\n", dlerror());
		fflush(stdout);
	}
	return p;
}

int main(int argc, char **argv)
{
	ssize_t (*rd)(int, void *, size_t);
	ssize_t (*rdv)(int, const struct iovec *, int);
	const char *how = argc > 1 ? argv[1] : "default";
	void *where = RTLD_DEFAULT;
	char buf[64];
	struct iovec iov = { buf, sizeof(buf) };

	if (!strcmp(how, "handle") && !(where = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD))) {
		printf("dlopen: %s\n", dlerror());
		return 2;
	}
	if (!strcmp(how, "next"))
		where = RTLD_NEXT;
	if (!(*(void **)&rd = lookup(where, "read")) ||
	    !(*(void **)&rdv = lookup(where, "readv")))
		return 3;
	printf("ready read\n");
	fflush(stdout);
	printf("read %zd\n", rd(0, buf, sizeof(buf)));
	printf("ready readv\n");
	fflush(stdout);
	printf("readv %zd\n", rdv(0, &iov, 1));
	return 0;
}
