/* SPDX-License-Identifier: MIT */
/*
 * dlpath.c - finding a library name the way the caller's dlopen would.
 *
 * glibc's dlopen expands $ORIGIN in the name to the calling object's
 * directory and searches the calling object's DT_RUNPATH (or DT_RPATH). Our
 * dlopen wrapper calls the real dlopen from inside the shim, so the caller
 * would be the shim: "$ORIGIN/plugins/libp.so" would name the shim's
 * directory, and a program that loads "libplugin.so" through its own
 * "$ORIGIN/plugins" RUNPATH would fail. dlpath_search expands $ORIGIN for
 * the caller, and looks a bare name up in the caller's path list first, in
 * glibc's order (RPATH before LD_LIBRARY_PATH, RUNPATH after it), and
 * returns the full path; the rest of the search (cache, default
 * directories) is left to dlopen.
 */
#include "dlpath.h"

#include <dlfcn.h>
#include <elf.h>
#include <libgen.h>
#include <limits.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Writes dir (with $ORIGIN expanded) + "/" + file into out (dir alone
 * when file is NULL). */
static void join(char *out, size_t n, const char *dir, size_t dlen, const char *origin,
		 const char *file)
{
	size_t used = 0;

	for (size_t i = 0; i < dlen && used + 1 < n; ) {
		size_t skip = !strncmp(dir + i, "${ORIGIN}", 9) ? 9 :
			      !strncmp(dir + i, "$ORIGIN", 7) ? 7 : 0;

		if (skip && i + skip <= dlen) {
			used += (size_t)snprintf(out + used, n - used, "%s", origin);
			i += skip;
		} else {
			out[used++] = dir[i++];
		}
	}
	if (used >= n)
		used = n - 1;
	out[used] = 0;
	if (file)
		snprintf(out + used, n - used, "/%s", file);
}

/* Returns a malloc'd path of file in the ':'-separated list, or NULL. */
static char *search(const char *list, const char *origin, const char *file)
{
	char path[PATH_MAX];

	while (list && *list) {
		const char *end = strchr(list, ':');
		size_t len = end ? (size_t)(end - list) : strlen(list);

		if (len) {
			join(path, sizeof(path), list, len, origin, file);
			if (access(path, F_OK) == 0)
				return strdup(path);
		}
		list = end ? end + 1 : NULL;
	}
	return NULL;
}

/* Writes the directory of the object lm into origin. */
static void origin_of(const struct link_map *lm, char *origin, size_t n)
{
	char *dir;

	if (lm->l_name && lm->l_name[0]) {
		snprintf(origin, n, "%s", lm->l_name);
	} else {
		ssize_t r = readlink("/proc/self/exe", origin, n - 1);

		origin[r > 0 ? r : 0] = 0;
	}
	dir = dirname(origin);
	memmove(origin, dir, strlen(dir) + 1);
}

char *dlpath_search(const void *caller, const char *file)
{
	struct link_map *lm = NULL;
	const char *strtab = NULL, *env = getenv("LD_LIBRARY_PATH");
	long runpath = -1, rpath = -1;
	char origin[PATH_MAX], path[PATH_MAX], *found;
	Dl_info di;
	void *h;

	if (!file || !dladdr1(caller, &di, (void **)&lm, RTLD_DL_LINKMAP) || !lm || !lm->l_ld)
		return NULL;
	if (strstr(file, "$ORIGIN") || strstr(file, "${ORIGIN}")) {
		origin_of(lm, origin, sizeof(origin));
		join(path, sizeof(path), file, strlen(file), origin, NULL);
		return strdup(path);
	}
	if (strchr(file, '/'))
		return NULL;
	if ((h = dlopen(file, RTLD_LAZY | RTLD_NOLOAD)) != NULL) {
		dlclose(h); /* already loaded: dlopen finds it by name */
		return NULL;
	}
	for (const ElfW(Dyn) *d = lm->l_ld; d->d_tag != DT_NULL; d++) {
		if (d->d_tag == DT_STRTAB)
			strtab = (const char *)(d->d_un.d_ptr < lm->l_addr ?
						d->d_un.d_ptr + lm->l_addr : d->d_un.d_ptr);
		else if (d->d_tag == DT_RUNPATH)
			runpath = (long)d->d_un.d_val;
		else if (d->d_tag == DT_RPATH)
			rpath = (long)d->d_un.d_val;
	}
	if (!strtab || (runpath < 0 && rpath < 0))
		return NULL;
	origin_of(lm, origin, sizeof(origin));
	if (runpath >= 0) {
		if (env && (found = search(env, origin, file)) != NULL) {
			free(found);
			return NULL; /* LD_LIBRARY_PATH comes first: dlopen finds it */
		}
		return search(strtab + runpath, origin, file);
	}
	return search(strtab + rpath, origin, file);
}
