/* SPDX-License-Identifier: MIT */
/*
 * sibling.h - libc functions that do the same thing under other names.
 *
 * `mv` calls renameat2, rsync renameat, not rename: a lock on rename
 * catches neither. The start-up report (redirect.c) asks sibling_note about
 * each symbol no method caught; when a sibling of it (sibling.c's table,
 * one entry per family) is called by a loaded object and guarded by no
 * lock, the report says so, with the `symbols` list that would guard it
 * too. A lock whose other symbol is caught is not reported as a failure
 * for the symbol the program does not call.
 */
#ifndef LOCKSHIM_SIBLING_H
#define LOCKSHIM_SIBLING_H

#include <stddef.h>

#include "conf.h"

/* sibling_note's result when another symbol of the lock is caught. */
#define SIBLING_COVERED (-1)

/*
 * For the symbol of l (a spec of cfg) that no method caught, whose
 * report line why (len bytes, NUL-terminated) the report logs at level
 * (caught: whether a method caught a call site or entry of a symbol):
 * appends "; the program calls SIBLING (a sibling): guard it too with
 * symbols = ( ... )" when loaded objects call siblings of it that no lock
 * guards (found in their dynamic relocations), or "; the lock guards
 * SYMBOL, which the program calls" when another symbol of l's lock is
 * caught. Returns the level to log at: LOG_WARN with a sibling called,
 * SIBLING_COVERED when the lock's other symbol is caught (not unguarded:
 * no failure for `strict` nor `check`), else level. Allocates nothing.
 */
int sibling_note(const struct conf *cfg, const struct lock_spec *l,
		 int (*caught)(const char *symbol), char *why, size_t len, int level);

#endif
