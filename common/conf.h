/* SPDX-License-Identifier: MIT */
/*
 * conf.h - the frozen configuration: the top level, one spec per lock, and
 * the settings of each backend (its own group, such as `redis`).
 *
 * conf_load parses a libconfig file once, validates every setting (unknown
 * names, types, ranges, placeholders, forbidden symbols) and compiles each
 * key template. After that the structures are read-only: hooks only read.
 * The settings are tables (conf_field.h): conf.c's for the top level and
 * the locks, a backend's own for its group (backend/backend_redis_conf.c),
 * registered in backend/backend.c and handed to conf_load, so this module
 * names no backend. The prefix is conf_: libconfig owns config_*.
 */
#ifndef LOCKSHIM_CONF_H
#define LOCKSHIM_CONF_H

#include "key.h"

#define CONF_DEFAULT_PATH "/etc/lockshim/lockshim.cfg"
#define CONF_EXIT_CODE 78 /* EX_CONFIG */
#define CONF_UNTRUSTED (-2) /* conf_load, conf_logging: secure mode refused a file */
#define STACK_ARGS_MAX 65536 /* largest stack_args_bytes */
#define CONF_KEYS_MAX 16 /* most templates in one lock's `keys` */

/* on_timeout / on_error */
enum call_policy { POLICY_SKIP, POLICY_EXIT, POLICY_ABORT, POLICY_PROCEED };
/* on_lost / on_overrun */
enum hold_policy { HOLD_LOG, HOLD_KILL, HOLD_ABORT };
/* method: how calls are caught (redirect.h). AUTO: the entry of a function
 * the executable defines, relocations otherwise. */
enum catch_method { METHOD_AUTO, METHOD_ENTRY, METHOD_RELOC };

#define CONF_BUILD_ID_MAX 64 /* bytes of a GNU build-id (hex digits / 2) */

/*
 * One guarded symbol of a lock. A lock of the file that names one symbol
 * (`symbol`) is one spec; a lock that names several (`symbols`) is that many
 * specs in a row of struct conf's locks, one per symbol in the list's order
 * (member 0, 1, ...): each has its own symbol and its key compiled with
 * {symbol} as that symbol, and all share every setting, the index and the
 * list. Calls of any of them that expand to one key take one lock (holds
 * are found by key, so reentrancy counts across them).
 */
struct lock_spec {
	char *symbol;            /* the symbol this spec guards */
	char **symbols;          /* the lock's `symbols` (NULL-terminated), or NULL */
	char *key_src;
	char **keys_src;         /* `keys`: the templates of a lock on several keys, or NULL */
	struct key_tmpl key;     /* the key, or the first of `keys` (conf_key) */
	struct key_tmpl *more_keys; /* `keys`: the others, nkeys - 1 of them (owned) */
	int nkeys;               /* templates: 1, or how many `keys` has (0 in a spec
				  * made by hand: one, key) */
	long long lease_ms;
	long long wait_ms;       /* -1 = forever */
	long long max_hold_ms;   /* 0 = unlimited */
	long long kill_grace_ms;
	long long retry_max_ms;
	long long handoff_us;    /* default mode: waiters let a releaser barge this long */
	long long linger_ms;     /* default mode: a released lock kept for the next call */
	long long warn_wait_ms;  /* a call that waited longer logs a warn line; 0: never */
	long long ret;           /* value a skipped call returns in rax */
	double ret_double;       /* ... and in xmm0 */
	int err;                 /* errno a skipped call sets */
	int exit_code;
	int kill_signal;
	int on_timeout, on_error, on_lost, on_overrun;
	int reentrant;
	int fair;                /* waiters enter in arrival order */
	int limit;               /* holders at once, 1..10000 (`limit`): a semaphore when > 1 */
	int shared;              /* `mode = "shared"`: holders run together, never beside an exclusive one */
	int break_dead;          /* break a lock whose holder died on this machine */
	int strict;              /* stop the program when the lock cannot be guarded */
	int stack_args_bytes;    /* caller stack copied for stack arguments */
	int method;              /* enum catch_method */
	char *object;            /* where the definition is looked up; NULL: the
				  * executable, then the libraries in load order */
	long long offset;        /* st_value of the function in object; -1: by symbol */
	char **programs;         /* fnmatch(3) patterns of the programs the lock
				  * applies in (shim/scope.h); NULL: every program */
	char *build_id;          /* object's build-id, lowercase hex; NULL: any */
	int index;               /* the lock's place in the file's `locks` */
	int member;              /* this symbol's place in symbols (0: the first) */
	/*
	 * Derived at conf_load, after validation, for every lock (its own
	 * settings, `defaults` and the built-in values all applied): not a
	 * setting of the file. See conf_waiter_ttl_ms.
	 */
	long long waiter_ttl_ms;
};

/* Returns key template i of l (0 <= i < l->nkeys): key, then the others of
 * `keys`, in the file's order. */
static inline const struct key_tmpl *conf_key(const struct lock_spec *l, int i)
{
	return i ? &l->more_keys[i - 1] : &l->key;
}

/* At most this many backends' settings groups (conf_field.h's struct
 * conf_group, registered in backend/backend.c). */
#define CONF_GROUPS_MAX 8

struct conf_group;

struct conf {
	char *path;
	/* The settings groups of the backends (NULL-terminated), and each one's
	 * settings, a struct of its size with every setting of the group (the
	 * defaults when the file has no such group): see conf_group_data. */
	const struct conf_group *groups[CONF_GROUPS_MAX + 1];
	void *group_data[CONF_GROUPS_MAX];
	int backend;        /* `backend`: the store, an index of conf_backend_name's
			     * names; its group (same name) is the one read */
	char *ns;
	int log_level;      /* -1 when not set */
	char *log_file;
	int log_format;     /* 0 text, 1 json (log_set_json) */
	int log_syslog;     /* lines also to syslog (log_open_syslog) */
	int strict;         /* the default of every lock's `strict` */
	char **debug_dirs;  /* where separate debug files are looked for; NULL-terminated */
	char **programs;    /* fnmatch(3) patterns of the programs the file is for
			     * (shim/scope.h); NULL: every program */
	/* Every lock's settings before its own: the built-in values, then the
	 * file's `defaults` (no symbol, no key; waiter_ttl_ms derived). */
	struct lock_spec defaults;
	struct lock_spec *locks; /* one per guarded symbol (struct lock_spec) */
	int nlocks;              /* specs in locks; locks[nlocks - 1].index + 1 locks,
				  * until conf_keep_locks removed some */
};

/*
 * Loads and validates path into cfg. groups (NULL-terminated, at most
 * CONF_GROUPS_MAX) are the backends' settings groups the file may have
 * (backend_conf_groups); cfg keeps the pointers, which must outlive it.
 * Returns 0, or -1 with one line in err naming the file, the line when
 * known, the setting and the value. In secure-execution mode (conf_secure)
 * the file and every password_file are opened with conf_open_trusted, and
 * a file it refuses makes it return CONF_UNTRUSTED (the reason in err).
 * The caller releases cfg with conf_release (also after a failure).
 */
int conf_load(struct conf *cfg, const char *path, const struct conf_group *const *groups,
	      char *err, size_t errlen);

/* Frees everything cfg owns (every string and list its tables name, the
 * locks, the groups' settings), not cfg itself, and zeroes it. */
void conf_release(struct conf *cfg);

/*
 * Returns the settings of the group g in cfg (a struct of g's type, owned
 * by cfg), or NULL when g is not one of cfg's groups.
 */
void *conf_group_data(const struct conf *cfg, const struct conf_group *g);

/*
 * Checks what the environment adds to cfg's logging: LOCKSHIM_LOG_LEVEL
 * (a level name in any case; not read in secure-execution mode) and that
 * log_file can be opened for appending (in secure-execution mode with
 * conf_open_trusted: its directory must be root's). apply: also sets the
 * level and sends the log there (the shim); else the file is only opened
 * and closed (`lockshim check`). Returns 0, or -1 (CONF_UNTRUSTED when
 * secure mode refused the directory) with one line in err.
 */
int conf_logging(const struct conf *cfg, int apply, char *err, size_t errlen);

/*
 * Returns 2 * l->retry_max_ms + request_ms: how long a waiter may stay
 * silent before it leaves the lock's queue, and the TTL of a lock handed
 * to a waiter (backend_item.waiter_ttl_ms). A waiter asks again at least
 * every retry_max_ms, and each ask may take up to request_ms (the
 * backend's, redis.command_timeout_ms), so a live waiter is never
 * dropped. conf_load stores it in every lock's waiter_ttl_ms; code
 * building a lock_spec by hand (tests) can call it.
 */
long long conf_waiter_ttl_ms(const struct lock_spec *l, long long request_ms);

/*
 * Returns 1 in secure-execution mode (getauxval(AT_SECURE): a set-ID
 * program or one with file capabilities), else 0. There the shim reads no
 * LOCKSHIM_* variable (secure_getenv) and trusts only files that
 * conf_open_trusted accepts.
 */
int conf_secure(void);

/*
 * Opens path (absolute) with flags | O_NOFOLLOW | O_CLOEXEC (mode when
 * creating), walking from "/" one directory descriptor below the other
 * (openat, O_NOFOLLOW), and accepts it only when every directory on the
 * way, checked with fstat on its descriptor, is owned by root and not
 * writable by group or others, none is a symbolic link, the file is a
 * regular file, not a symbolic link, and, when file_too, the file itself
 * is owned by root and not writable by group or others. Returns the
 * descriptor (the caller closes it); -1 when it cannot be opened;
 * CONF_UNTRUSTED when refused; the reason in why.
 */
int conf_open_trusted(const char *path, int flags, int mode, int file_too, char *why,
		      size_t whylen);

/*
 * Appends to cfg->locks a lock on key taken literally (every byte is the
 * key's: no placeholder, a brace is a brace) with cfg->defaults' settings
 * and its derived waiter_ttl_ms, as `lockshim lock` takes it; its symbol
 * is key (log lines and metrics name the lock so). Returns it (owned by
 * cfg, valid until the next call or conf_release; the caller may adjust
 * its settings before use), or NULL with one line in err: a key the
 * layout refuses (empty, or one that could be another lock's queue key),
 * or no memory.
 */
struct lock_spec *conf_add_literal_lock(struct conf *cfg, const char *key, char *err,
					size_t errlen);

/*
 * Keeps in cfg->locks only the specs for which keep(spec, arg) returns
 * nonzero, in their order, and releases the others (what they own, their
 * keys). Each spec keeps its index, the lock's place in the file. Returns
 * how many remain (cfg->nlocks).
 */
int conf_keep_locks(struct conf *cfg, int (*keep)(const struct lock_spec *l, void *arg),
		    void *arg);

/* Returns the spec guarding symbol, or NULL. */
const struct lock_spec *conf_find(const struct conf *cfg, const char *symbol);

/* Returns the name of backend b (struct conf's backend), as the file
 * writes it: also the name of that backend's settings group. */
const char *conf_backend_name(int b);

/* Returns the index in cfg->groups of the selected backend's group (the
 * one named as `backend`), or -1 when no group of that name is registered
 * (conf_load refuses such a file). */
int conf_backend_group(const struct conf *cfg);

/* Returns the name of the policy or method, as the file writes it. */
const char *conf_call_policy_name(int p);
const char *conf_method_name(int m);
const char *conf_hold_policy_name(int p);

#endif
