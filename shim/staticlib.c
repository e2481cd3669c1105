/* SPDX-License-Identifier: MIT */
/*
 * staticlib.c - what the libraries linked statically into the shim need
 * from it.
 *
 * Debian ships libconfig.a built without -fPIC: its flex scanner reads the
 * C library's stdin, stdout and stderr through PC-relative references,
 * which a shared object cannot bind to another object's data. The Makefile
 * renames those three references in a copy of the archive (objcopy
 * --redefine-sym) to the hidden variables here, and staticlib_init points
 * them at the C library's streams before the config is parsed. Nothing
 * else of libconfig needs an address outside the shim, so the shim loads
 * into a program whose image has no libconfig9 (doc/deploying.md).
 */
#include <stdio.h>

#include "staticlib.h"

FILE *staticlib_stdin, *staticlib_stdout, *staticlib_stderr;

void staticlib_init(void)
{
	staticlib_stdin = stdin;
	staticlib_stdout = stdout;
	staticlib_stderr = stderr;
}
