/* SPDX-License-Identifier: MIT */
/*
 * staticlib.h - the streams the statically linked libconfig reads through
 * (staticlib.c says why), set by staticlib_init before the first parse.
 */
#ifndef LOCKSHIM_STATICLIB_H
#define LOCKSHIM_STATICLIB_H

#include <stdio.h>

extern FILE *staticlib_stdin, *staticlib_stdout, *staticlib_stderr;

/* Points the three at the C library's stdin, stdout and stderr. */
void staticlib_init(void);

#endif
