/* SPDX-License-Identifier: MIT */
/*
 * libwrap.so: an interposing library, the way profilers and compatibility
 * layers are written. Loaded before libbiz.so and libc, it defines its own
 * biz_price (libbiz.so's) and umask (libc's); each wrapper finds the next
 * definition with dlsym(RTLD_NEXT, name) and calls it. biz_price adds 1 to
 * the next definition's result, so the caller can tell the wrapper ran;
 * wrap_calls() counts the wrappers' entries.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <sys/stat.h>

static int entries;

int biz_price(int x)
{
	int (*next)(int);

	entries++;
	*(void **)&next = dlsym(RTLD_NEXT, "biz_price");
	return next ? next(x) + 1 : -1000;
}

mode_t umask(mode_t mask)
{
	mode_t (*next)(mode_t);

	entries++;
	*(void **)&next = dlsym(RTLD_NEXT, "umask");
	return next ? next(mask) : (mode_t)01000;
}

int wrap_calls(void)
{
	return entries;
}
