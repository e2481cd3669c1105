/* SPDX-License-Identifier: MIT */
/*
 * redirect.h - the seam between "how calls are caught" and the lock code.
 *
 * A redirection method makes calls to the names the shim is interested in
 * reach their hook's stub (a guarded symbol) or the shim's own wrapper
 * (interpose.c: dlopen, dlsym, exec, _exit, close, ...). Today there is one
 * method, relocation patching (redirect_reloc.c). Methods run at init and
 * after every dlopen, serialised by redirect.c, which also keeps the table
 * of names (hashed once at init, read-only afterwards but for the counters)
 * and reports, at start-up, every lock no method could reach.
 */
#ifndef LOCKSHIM_REDIRECT_H
#define LOCKSHIM_REDIRECT_H

#include "config.h"

/* One name the methods look for. */
struct redirect_name {
	const char *name;
	const struct lock_spec *spec; /* the lock guarding name, or NULL */
	void *wrapper;                /* the shim's own wrapper for name, or NULL */
	void *canonical;              /* a non-PIE executable's PLT entry standing for
				       * name (function pointer equality): calls
				       * through it reach the executable's redirected
				       * slot, so it is never wrapped again */
	int sites;                    /* call sites redirected, for the report */
	unsigned hash;
};

struct redirect_method {
	const char *name;
	/* Redirects what is not redirected yet in objects it has not seen.
	 * Returns the number of call sites redirected, or -1. */
	int (*scan)(void);
};

extern const struct redirect_method redirect_reloc;

/* Builds the name table and runs every method once (constructor,
 * single-threaded), then reports the locks nothing reaches. Returns 0, or
 * -1 with a message in err when a lock with `strict` cannot be guarded. */
int redirect_init(const struct config *cfg, char *err, size_t errlen);

/* Catches objects loaded since the last scan (called after dlopen). */
void redirect_refresh(void);

/* Returns the entry for name (len bytes), or NULL. */
struct redirect_name *redirect_find(const char *name);

/*
 * Returns what a slot that holds addr for n, or a lookup that found addr for
 * n, must give callers: for a guarded name, the stub of the hook whose
 * target is addr (its call: the shim's wrapper when there is one, else
 * addr); else the wrapper; addr itself when it is a stub or wrapper
 * already, or n's canonical PLT entry.
 */
void *redirect_target(struct redirect_name *n, void *addr);

/* The same for a symbol lookup (dlsym) that found addr for name. */
void *redirect_resolved(const char *name, void *addr);

/*
 * Returns the definition of name (of version, when not NULL) in the first
 * object after the one containing `after` in load order, as RTLD_NEXT from
 * that object would; NULL when none defines it.
 */
void *redirect_next_definition(const void *after, const char *name, const char *version);

/* Internal wrappers (interpose.c): their names and functions, a table
 * ending with a NULL name. */
struct interpose_entry {
	const char *name;
	void *fn;
};
extern const struct interpose_entry interpose_table[];

#endif
