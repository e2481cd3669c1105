/* SPDX-License-Identifier: MIT */
/*
 * scope.h - which programs the shim acts in: the lock servers' own
 * programs and lockshim's command never, then the config's `programs`
 * (top level and per lock).
 *
 * A program is named by its executable, /proc/self/exe as the kernel
 * resolves it (the real path, symbolic links followed; not argv[0]), and
 * by that path's file name. A pattern (fnmatch(3) without FNM_PATHNAME,
 * so `*` crosses '/') matches the program when it matches either. The
 * constructor asks scope_exempt before it reads any config, and
 * scope_match / scope_keep after, before anything else looks at the
 * locks (init.c).
 */
#ifndef LOCKSHIM_SCOPE_H
#define LOCKSHIM_SCOPE_H

#include <limits.h>

#include "conf.h"

/* The running program: its absolute path and that path's file name. */
struct scope_exe {
	char path[PATH_MAX];
	const char *name; /* inside path */
};

/* Fills x from /proc/self/exe (" (deleted)" taken off). Returns 0, or -1
 * when it cannot be read (x->path and x->name are then ""). */
int scope_self(struct scope_exe *x);

/* Returns the pattern of the table of programs never in scope that x's
 * file name matches, or NULL: the lock servers' own programs
 * ("redis-server", "valkey-*", ...) and lockshim's command are never in
 * scope, whatever the config says. */
const char *scope_exempt(const struct scope_exe *x);

/* Returns 1 when pats (NULL-terminated) is NULL (every program) or one of
 * its patterns matches x's path or file name, else 0. */
int scope_match(char *const *pats, const struct scope_exe *x);

/*
 * Removes from cfg the locks whose `programs` do not match x
 * (conf_keep_locks); when report >= 0 (`lockshim check -- PROGRAM`), writes
 * one line per removed lock there ("SYMBOL: out of scope (...)"). Returns
 * how many specs remain.
 */
int scope_keep(struct conf *cfg, const struct scope_exe *x, int report);

/* Writes to fd (`lockshim check -- PROGRAM`) one line, control
 * characters escaped: "PATH: out of scope (WHY); nothing is guarded in
 * this program", WHY naming the exempt program when pats is NULL, else the
 * top-level programs pats that x does not match. */
void scope_report_program(int fd, const struct scope_exe *x, char *const *pats);

#endif
