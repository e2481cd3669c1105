/* SPDX-License-Identifier: MIT */
/*
 * conf.h - the frozen configuration: Redis endpoint and one spec per lock.
 *
 * conf_load parses a libconfig file once, validates every setting (unknown
 * names, types, ranges, placeholders, forbidden symbols) and compiles each
 * key template. After that the structures are read-only: hooks only read.
 */
#ifndef LOCKSHIM_CONF_H
#define LOCKSHIM_CONF_H

#include "key.h"

#define CONF_DEFAULT_PATH "/etc/lockshim/lockshim.cfg"
#define CONF_EXIT_CODE 78 /* EX_CONFIG */
#define STACK_ARGS_MAX 65536 /* largest stack_args_bytes */

/* on_timeout / on_error */
enum call_policy { POLICY_SKIP, POLICY_EXIT, POLICY_ABORT, POLICY_PROCEED };
/* on_lost / on_overrun */
enum hold_policy { HOLD_LOG, HOLD_KILL, HOLD_ABORT };
/* method: how calls are caught (redirect.h). AUTO: the entry of a function
 * the executable defines, relocations otherwise. */
enum catch_method { METHOD_AUTO, METHOD_ENTRY, METHOD_RELOC };

#define CONF_BUILD_ID_MAX 64 /* bytes of a GNU build-id (hex digits / 2) */

struct lock_spec {
	char *symbol;
	char *key_src;
	struct key_tmpl key;
	long long lease_ms;
	long long wait_ms;       /* -1 = forever */
	long long max_hold_ms;   /* 0 = unlimited */
	long long kill_grace_ms;
	long long retry_max_ms;
	long long handoff_us;    /* default mode: waiters let a releaser barge this long */
	long long linger_ms;     /* default mode: a released lock kept for the next call */
	long long ret;           /* value a skipped call returns in rax */
	double ret_double;       /* ... and in xmm0 */
	int err;                 /* errno a skipped call sets */
	int exit_code;
	int kill_signal;
	int on_timeout, on_error, on_lost, on_overrun;
	int reentrant;
	int fair;                /* waiters enter in arrival order */
	int break_dead;          /* break a lock whose holder died on this machine */
	int strict;              /* stop the program when the lock cannot be guarded */
	int stack_args_bytes;    /* caller stack copied for stack arguments */
	int method;              /* enum catch_method */
	char *object;            /* where the definition is looked up; NULL: the
				  * executable, then the libraries in load order */
	long long offset;        /* st_value of the function in object; -1: by symbol */
	char *build_id;          /* object's build-id, lowercase hex; NULL: any */
	int index;
	/*
	 * Derived at conf_load, after validation, for every lock (its own
	 * settings, `defaults` and the built-in values all applied): not a
	 * setting of the file. See conf_waiter_ttl_ms.
	 */
	long long waiter_ttl_ms;
};

/* The `tls` group of `redis`: present (enabled) makes every connection TLS. */
struct redis_tls {
	int enabled;
	char *ca_file;           /* NULL with ca_dir NULL: the system's CA store */
	char *ca_dir;
	char *cert_file;         /* client certificate, with key_file */
	char *key_file;
	char *server_name;       /* SNI and the name verified; NULL: the host */
	int verify;              /* verify the certificate and the name */
};

struct redis_spec {
	char *host;
	int port;
	char *socket;
	char *password;          /* LOCKSHIM_REDIS_PASSWORD, password_file, or the file's */
	char *username;
	int db;
	int connect_timeout_ms;
	int command_timeout_ms;
	char **sentinels;        /* "host:port" of Redis Sentinels, NULL-terminated; NULL: none */
	char *master_name;       /* required with sentinels */
	char *sentinel_username;
	char *sentinel_password;
	char *password_file;     /* the password is its first line */
	int wait_replicas;       /* WAIT for this many replicas after acquires and renewals */
	int wait_replicas_ms;
	struct redis_tls tls;
	char **cluster;          /* "host:port" seed nodes of a Redis Cluster, NULL-terminated */
	struct redis_spec *masters; /* Redlock: nmasters independent masters, each a whole
				     * single-server spec (unset settings taken from this one) */
	int nmasters;
};

struct conf {
	char *path;
	struct redis_spec redis;
	char *ns;
	int log_level;      /* -1 when not set */
	char *log_file;
	int strict;         /* the default of every lock's `strict` */
	char **debug_dirs;  /* where separate debug files are looked for; NULL-terminated */
	struct lock_spec *locks;
	int nlocks;
};

/*
 * Loads and validates path into cfg. Returns 0, or -1 with one line in err
 * naming the file, the line when known, the setting and the value.
 * The caller releases cfg with conf_release (also after a failure).
 */
int conf_load(struct conf *cfg, const char *path, char *err, size_t errlen);

void conf_release(struct conf *cfg);

/*
 * Checks what the environment adds to cfg's logging: LOCKSHIM_LOG_LEVEL
 * (a level name in any case) and that log_file can be opened for
 * appending. apply: also sets the level and sends the log there (the shim);
 * else the file is only opened and closed (`lockshim check`). Returns 0, or
 * -1 with one line in err.
 */
int conf_logging(const struct conf *cfg, int apply, char *err, size_t errlen);

/*
 * Returns 2 * l->retry_max_ms + r->command_timeout_ms: how long a waiter may
 * stay silent before it leaves the lock's queue, and the TTL of a lock
 * handed to a waiter (backend_item.waiter_ttl_ms). A waiter asks again at
 * least every retry_max_ms, and each ask may take up to command_timeout_ms,
 * so a live waiter is never dropped. conf_load stores it in every lock's
 * waiter_ttl_ms; code building a lock_spec by hand (tests) can call it.
 */
long long conf_waiter_ttl_ms(const struct lock_spec *l, const struct redis_spec *r);

/*
 * One setting the parser knows, described from the same tables it parses
 * with (`lockshim settings` prints one per line, "group name type default").
 *   group: "top" (top level), "redis" (the redis group) or "lock" (an
 *          entry of locks, and of defaults except symbol)
 *   type:  integer:MIN..MAX, decimal:MIN..MAX (whole or decimal), boolean,
 *          string, string:MIN.. or string:MIN..MAX (length in bytes),
 *          enum:A,B,C, errno:0..MAX and signal:MIN..MAX (a name or a
 *          number), number (integer or float), address (an integer or a
 *          "0x..." string, 0 or more), hex:MIN..MAX (a string of hex
 *          digits, length in bytes decoded), strings (a list of strings),
 *          group, list
 *   dflt:  a libconfig literal (30000, 0.5, true, "skip", {}, ()), none
 *          (not set), required, or =GROUP.NAME (that setting's value);
 *          never contains a blank.
 */
struct conf_setting_desc {
	const char *group;
	const char *name;
	char type[96];
	char dflt[96];
};

/* Describes the i-th setting (0, 1, ...; top, then redis, then lock, each
 * in table order) into d. Returns 1, or 0 when i is past the last. */
int conf_setting_describe(int i, struct conf_setting_desc *d);

/* Returns the lock guarding symbol, or NULL. */
const struct lock_spec *conf_find(const struct conf *cfg, const char *symbol);

/* Returns the policy name for messages. */
const char *conf_call_policy_name(int p);
const char *conf_method_name(int m);
const char *conf_hold_policy_name(int p);

#endif
