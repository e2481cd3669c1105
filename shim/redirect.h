/* SPDX-License-Identifier: MIT */
/*
 * redirect.h - the seam between "how calls are caught" and the lock code.
 *
 * A redirection method makes calls to the names the shim is interested in
 * reach their hook's stub (a guarded symbol) or the shim's own wrapper
 * (interpose.c: dlopen, dlsym, exec, _exit, close, ...). There are two:
 * entry patching (redirect_entry.c), which rewrites a guarded function's
 * first instructions so that every call of it, from anywhere, is guarded,
 * and relocation patching (redirect_reloc.c), which rewrites the slots
 * through which other objects call it. Methods run at init and after
 * every dlopen, in the order of redirect.c's `methods` table (entries
 * first: a hook keeps the call it was created with), serialised by
 * redirect.c, which also keeps the table of names (hashed once at init,
 * read-only afterwards but for the counters and what the methods record)
 * and reports, at start-up, every lock no method could reach.
 *
 * A method tells redirect.c what it caught (redirect_caught, per call site
 * or function entry it redirected) and what it will miss (its `missed`
 * callback, asked only about guarded names no method caught); the report
 * itself (where the function is defined, log level, `strict`) is
 * redirect.c's. A new method is a file redirect_<how>.c defining
 * `const struct redirect_method redirect_<how>`, its extern line beside the
 * others below, its entry in redirect.c's `methods` and its name in the
 * Makefile's SHIM_SRC. It gets stubs with hook_get (hook.h): the
 * function's address as target, what runs it as call.
 */
#ifndef LOCKSHIM_REDIRECT_H
#define LOCKSHIM_REDIRECT_H

#include "conf.h"

/* One name the methods look for: a guarded symbol, an internal wrapper's
 * name (interpose_table), or both. */
struct redirect_name {
	const char *name;
	const struct lock_spec *spec; /* the lock guarding name, or NULL */
	void *wrapper;                /* the shim's own wrapper for name, or NULL */
	void *canonical;              /* a non-PIE executable's PLT entry standing for
				       * name (function pointer equality): calls
				       * through it reach the executable's redirected
				       * slot, so it is never wrapped again */
	int caught;                   /* call sites or entries redirected by any
				       * method (redirect_caught), for the report */
	char *entry_in;               /* the object whose definition of name has its
				       * entry patched (redirect_entry), or NULL */
	char *refused;                /* "cannot patch the entry of ...": why method
				       * "entry" cannot guard name; fatal at start-up */
	unsigned hash;
};

struct redirect_method {
	const char *name; /* in debug lines: "<name>: N call site(s) redirected" */
	/* Redirects what is not redirected yet in objects it has not seen
	 * (cfg: the frozen config). Returns the number of call sites or
	 * entries redirected, or -1. */
	int (*scan)(const struct conf *cfg);
	/*
	 * For the start-up report, about guarded name n that no method caught
	 * and that def defines ("the executable" when in_exe, else a library's
	 * path): writes into why (len bytes, NUL-terminated) what calls of n
	 * this method cannot catch, as a clause following "<name> is defined
	 * in <def> and ". Returns its length (like snprintf: a longer one than
	 * len - 1 counts as cut there), 0 when it has nothing to say. Entry
	 * patching's is also asked with def NULL (no loaded object defines n
	 * where the report can see): where it looked, as a clause after "; ".
	 */
	size_t (*missed)(const struct redirect_name *n, const char *def, int in_exe,
			 char *why, size_t len);
};

extern const struct redirect_method redirect_entry;
extern const struct redirect_method redirect_reloc;

/* Called by a method for each call site (or function entry) of n it
 * redirected. */
void redirect_caught(struct redirect_name *n);

/*
 * Builds the name table and runs every method once (constructor,
 * single-threaded), then reports the locks nothing reaches. Returns 0, or
 * -1 with a message in err when a lock with `strict` cannot be guarded or
 * a lock with method "entry" cannot be patched. With check_fd >= 0
 * (`lockshim check -- PROGRAM`), writes there instead one line per lock
 * ("SYMBOL: entry in OBJECT", "SYMBOL: reloc (N call sites) in OBJECT",
 * "SYMBOL: unguarded: WHY") and returns the number of unguarded locks.
 */
int redirect_init(const struct conf *cfg, int check_fd, char *err, size_t errlen);

/* Catches objects loaded since the last scan (called after dlopen). */
void redirect_refresh(void);

/* Returns the entry for name (NUL-terminated), or NULL. One hash, rarely a
 * strcmp: the methods call it for every relocation they look at. */
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

/*
 * dlsym(RTLD_NEXT) from caller: the next definition, as redirect_resolved
 * makes it, except that a guarded name looked up by an object that defines
 * it too (an interposer calling the definition it wraps) gets the
 * definition itself: calls reach the interposer's definition through
 * redirected slots already, so each is wrapped once, not twice.
 */
void *redirect_resolved_next(const void *caller, const char *name, const char *version);

/*
 * The shim's internal wrappers (interpose.c), as data: a table ending with
 * a NULL name. Each becomes an ordinary entry of the name table with fn as
 * its wrapper, matched by every method like a guarded symbol; a name that
 * is also guarded gets a hook whose call is fn (the wrapper runs inside the
 * lock). A new wrapper is one more line in the table, any name.
 */
struct interpose_entry {
	const char *name;
	void *fn;
};
extern const struct interpose_entry interpose_table[];

#endif
