/* SPDX-License-Identifier: MIT */
/*
 * redirect.h - the seam between "how calls are caught" and the lock code.
 *
 * A redirection method makes calls to configured symbols reach their hook's
 * stub. Today there is one, relocation patching (redirect_reloc.c); entry
 * patching can be added as a second struct redirect_method without touching
 * the dispatcher or the lock code. Methods run at init and after every
 * dlopen, serialised by redirect.c.
 */
#ifndef LOCKSHIM_REDIRECT_H
#define LOCKSHIM_REDIRECT_H

#include "config.h"

struct redirect_method {
	const char *name;
	/* Redirects what is not redirected yet in every loaded object.
	 * Returns the number of call sites redirected, or -1. */
	int (*scan)(const struct config *cfg);
};

extern const struct redirect_method redirect_reloc;

/* Runs every method once (constructor, single-threaded). Returns 0 or -1. */
int redirect_init(const struct config *cfg);

/* Catches objects loaded since the last scan (called after dlopen). */
void redirect_refresh(void);

/*
 * Maps the address a symbol lookup (dlsym) found for name to what callers
 * must get: the hook's stub when name is guarded, else addr itself.
 */
void *redirect_resolved(const char *name, void *addr);

/* Internal wrappers the methods install beside the configured symbols
 * (dlopen, dlsym, the longjmp family). Returns the wrapper for name or NULL. */
void *interpose_lookup(const char *name);

#endif
