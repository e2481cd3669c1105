/* SPDX-License-Identifier: MIT */
/*
 * backend.h - the lock store, as a small table of functions.
 *
 * lock.c and renew.c speak only through this table; all protocol text lives
 * in the implementations (backend_redis.c: one server; backend_sentinel.c,
 * backend_cluster.c and backend_redlock.c build on its connections;
 * backend_local.c: kernel file locks, no server).
 * backend.c's table lists them; backend_init picks the first whose
 * serves() accepts the settings of its group (struct conf_group, such as
 * `redis`: backend_redis_conf.c). Callers hold the backend's state as an
 * opaque `struct backend_config`, made once at start-up. A connection is
 * never shared between concurrent callers. Operations return an enum
 * backend_result.
 *
 * A NEW BACKEND (NAME, with its own top-level group of the file) is its
 * files and one table entry:
 *   1. backend/backend_NAME_conf.h: struct NAME_spec, its settings, and
 *      `extern const struct conf_group backend_NAME_settings;`.
 *   2. backend/backend_NAME_conf.c: the table of its settings, one
 *      conf_field.h FIELD(struct NAME_spec, "setting", member, kind, min,
 *      max, .def = ... or .def_str = ...) per setting, default included;
 *      and backend_NAME_settings = { .name = "NAME" (the group),
 *      .fields, .size = sizeof(struct NAME_spec), and as needed .check
 *      (rules across settings, once the group is read), .unavailable
 *      and .unbuilt (the lock settings it refuses, each with why: exit
 *      78), .check_lock (other rules of a lock: return conf_fail(e, lg,
 *      where, "...")), .lock_defaults (conf_no_linger where a lock is not
 *      kept between calls by default), .request_ms (the longest request,
 *      for waiter_ttl_ms), .hash_tag }.
 *   3. backend/backend_NAME.c: `const struct backend_ops backend_NAME =
 *      { .name, .settings = &backend_NAME_settings, .serves, .config_new,
 *      .config_free, .open, .close, .acquire, .release, .wait, .leave,
 *      .flush, .unconfirmed, .renew, .errstr, .ping }` (.describe,
 *      .count, .node_count and .node_open optional; .renew too when
 *      .leaseless; without .count `lockshim metrics` says it is not
 *      built for it, and a backend other than Redis's has .count_read
 *      for it; .holders lists the locks for `lockshim status`,
 *      and .status_why/.unlock_why say why those verbs are not there).
 *      serves and config_new get its struct NAME_spec.
 *   4. backend/backend.c: `&backend_NAME,` in backends[], and its name on
 *      the extern line above it.
 *   5. Its documentation: the group's settings in the settings reference
 *      (test_docs checks it against `lockshim settings`).
 * A backend whose locks have no lease sets .leaseless (backend_local.c).
 * A backend whose client library must not be loaded into every guarded
 * program is a module (backend_module.h: backend/postgres/): its table
 * entry is a stub with .module, and its settings group stays here.
 * Nothing else: common/ (conf_load reads, checks and releases the group;
 * conf_group_data finds it), cli/ (`lockshim settings` and `check` describe
 * it) and the Makefile (every .c of a folder) take it from the table. A new
 * topology of an existing backend (as Sentinel is of redis) is steps 3 and
 * 4 with that backend's .settings, and its settings are entries of that
 * group's table.
 *
 * Releases may be sent asynchronously: the command is written at once and
 * its reply read before the next command on that connection (or by flush),
 * so an uncontended guarded call costs one round trip. A failed asynchronous
 * release is logged when its reply is read; one whose reply never comes is
 * handed back to the caller (unconfirmed), who retries it elsewhere. One
 * that could not be sent at all returns BACKEND_ERR and is not remembered:
 * its fate is the caller's.
 */
#ifndef LOCKSHIM_BACKEND_H
#define LOCKSHIM_BACKEND_H

#include <stddef.h>
#include <string.h>

#include "key.h" /* KEY_BUF_SIZE */

/* A lock value (token and holder identity, owner.h) is at most this long:
 * 32 + 357 (the identity, a 255-byte host) + 86 (since_ms, program). */
#define BACKEND_VAL_MAX 512

struct conf;
struct conf_group;
struct backend_module_file;
struct backend_conn;   /* one connection (or set of them), per thread */
struct backend_config; /* a backend's settings, opaque to its callers */

enum backend_result {
	BACKEND_ERR = -1,    /* error: close and reopen the connection; errstr says why */
	BACKEND_NO = 0,      /* refused: held by another owner, not ours, nothing
			      * happened; wait: timed out */
	BACKEND_OK = 1,      /* done; wait: woken, try again */
	BACKEND_GRANTED = 2, /* wait: the lock was handed to this waiter */
	BACKEND_MISMATCH = 3, /* acquire: the key's holders took it with another
			       * limit; errstr names both */
};

/* acquire's *wait_ms when the caller is not queued yet: call again, waiting. */
#define BACKEND_NOT_QUEUED (-1)

/* release's async when more releases follow at once on the same
 * connection: the command may wait to be written with the next command
 * (the last release of the run passes 1), so a call of several keys
 * writes its releases in one send. */
#define BACKEND_ASYNC_MORE 2

struct backend_item {
	const char *key;
	size_t klen;
	const char *val;
	size_t vlen;
	long long lease_ms;
	int fair;                /* waiters enter in arrival order */
	int waiting;             /* default mode: queued (not the plain fast path) */
	long long waiter_ttl_ms; /* a waiter silent this long leaves the queue;
				  * also the TTL of a lock handed to a waiter */
	long long handoff_us;    /* default mode: barging allowed this long */
	int turn_done;           /* release: the holder has had the lock handoff_us,
				  * or is idle: a queued waiter gets it even if not
				  * due yet */
	long long ticket;        /* waiting: the waiter's place in the queue, the
				  * same on every server (0: its arrival order) */
	int kept;                /* renew: 1 the lease is kept between calls
				  * (the counter's k names it), 2 in use again
				  * (k forgotten), 0 neither */
	int limit;               /* holders at once (lock_spec's limit; 0 counts as 1) */
	int pick;                /* acquire of a holder set: the holder reported
				  * is the pick-th by lease end (modulo their
				  * number; 0: the first to end), so that a
				  * caller asking again sees each in turn */
	int shared;              /* lock_spec's mode is shared */
};

/* Whether it is kept in a holder set (a permit of a semaphore, or a shared
 * entry) rather than as the key's one string value. */
static inline int backend_item_set(const struct backend_item *it)
{
	return it->limit > 1 || it->shared;
}

/* A backend_item kept past the call that gave it (an asynchronous command
 * whose reply is unread, a token to forget later): key, value, lease and
 * mode (a permit is forgotten as a permit). */
struct backend_copy {
	long long lease_ms;
	int limit, shared;
	size_t klen, vlen;
	char key[KEY_BUF_SIZE];
	char val[BACKEND_VAL_MAX];
};

/* Copies its key, value and lease into c. Returns 0, or -1 when the key
 * or the value is too long. */
static inline int backend_copy_set(struct backend_copy *c, const struct backend_item *it)
{
	if (it->klen > sizeof(c->key) || it->vlen > sizeof(c->val))
		return -1;
	c->lease_ms = it->lease_ms;
	c->limit = it->limit;
	c->shared = it->shared;
	c->klen = it->klen;
	memcpy(c->key, it->key, it->klen);
	c->vlen = it->vlen;
	memcpy(c->val, it->val, it->vlen);
	return 0;
}

/* Returns the item c holds (its strings are c's; its mode c's; the other
 * fields 0). */
static inline struct backend_item backend_copy_item(const struct backend_copy *c)
{
	struct backend_item it = { .key = c->key, .klen = c->klen, .val = c->val,
				   .vlen = c->vlen, .lease_ms = c->lease_ms,
				   .limit = c->limit, .shared = c->shared };

	return it;
}

/* One holder of a lock as a backend's .holders reports it, for `lockshim
 * status` (its pointers valid during the call only). */
struct backend_holder {
	const char *key;          /* as stored (namespace:key); a name the
				   * backend shortened with a hash: as kept */
	size_t klen;
	const char *val;          /* the holder's lock value (owner record) */
	size_t vlen;
	long long fence;          /* its fencing token; -1 unknown */
	long long since_ms;       /* when taken (CLOCK_REALTIME ms); 0 unknown */
	long long lease_left_ms;  /* -1: no lease, or unknown */
	int limit;                /* the holders' limit: 1 exclusive or shared */
	int shared;               /* a shared holder (mode "shared") */
	int in_set;               /* one holder of a set (shared, or a permit) */
	int nwaiters;             /* its waiters, oldest first: their values */
	const char *const *wval;
	const size_t *wlen;
};

struct backend_ops {
	const char *name;
	/* 1: a lock has no lease and no server-side queue (a kernel lock, kept
	 * while its holder lives): no renewal thread is started for it (renew
	 * is never called: leave it NULL), a token is never left behind to
	 * forget, and a waiter waits for its wake-up without asking again
	 * every retry_max_ms. */
	int leaseless;
	/* 1: a waiter's wait ends when the lock is freed (etcd: a watch on its
	 * predecessor), so it asks again only when the acquire's hint says
	 * (to keep its own place), not every retry_max_ms; and the first
	 * acquire that is refused queues the caller already (a caller that
	 * then gives up leaves, as a waiter does). */
	int watched;
	/* 1: the backend tells when its locks are lost (a module's
	 * host->lost_all: zookeeper's session expiry), so renew.c lists its
	 * leaseless locks (never renewing them) to report them. */
	int reports_lost;
	/* 1: a lock past max_hold_ms under on_overrun "log" is released at
	 * once (renew.c, overrun_release), as a leaseless backend's is, rather
	 * than left to expire: postgres, whose lease is its whole session's
	 * (one overrun lock would end the session's other locks with it). */
	int overrun_release;
	/* 1: .count only touches this machine (local's files): a leaseless
	 * process ships its counts at a release, about once a second, rather
	 * than start a thread for them (which a leaseless backend without it
	 * does, as for linger_ms). */
	int count_inline;
	/* What log lines call the lock store (backend_store: "Redis" when NULL). */
	const char *store;
	/* When `lockshim status` or `lockshim unlock` cannot serve this
	 * backend: why, and what to do instead (one sentence, printed after
	 * "lockshim: "; the verb exits 1). NULL when it can. */
	const char *status_why;
	const char *unlock_why;
	/* A stub of a backend built as a module (backend_module.h): the file
	 * backend_init opens to get the real table; NULL for the built-in. */
	const struct backend_module_file *module;
	/* The settings group the backend reads (conf_field.h): its table, its
	 * checks, the locks it refuses. Topologies of one server share one
	 * (redis: backend_redis_settings). */
	const struct conf_group *settings;
	/* Returns 1 when this backend serves the group's settings (a struct
	 * of the group's type, such as struct redis_spec), else 0. */
	int (*serves)(const void *settings);
	/* Returns the backend's state made from settings (which must outlive
	 * it), freed with config_free; or NULL with a message in err. */
	struct backend_config *(*config_new)(const void *settings, char *err,
					     size_t errlen);
	void (*config_free)(struct backend_config *bc);
	/* Returns a new connection, or NULL with a message in err. */
	struct backend_conn *(*open)(const struct backend_config *bc, char *err,
				     size_t errlen);
	/* Optional: writes which node the last open reached, for `lockshim
	 * check` ("primary HOST:PORT ..."); NULL when the config says it. */
	void (*describe)(const struct backend_config *bc, char *buf, size_t len);
	/* Closes c without sending anything (also safe in a fork child). */
	void (*close)(struct backend_conn *c);
	/*
	 * Takes the lock: a script that sets the key when it is free, or (fair,
	 * or waiting) one that takes it when free and nobody is ahead, else
	 * joins the queue. The key holding it->val already (an earlier attempt
	 * whose reply was lost) counts as taken. On BACKEND_OK, *fence is the
	 * fencing token of the grant (the key's counter "<key>:f" n, incremented
	 * by the same script; 0 when the backend keeps none). On BACKEND_NO,
	 * *wait_ms is how long a wait for a signal may take at most (the key's
	 * remaining TTL, or the queue head's), or BACKEND_NOT_QUEUED; and
	 * holder[0..*holder_len) is the holder's value (BACKEND_VAL_MAX bytes
	 * at most; length 0 when unknown; in a holder set, the it->pick-th
	 * member). A holder-set item (backend_item_set) takes an
	 * entry of the key's set instead, when it has room for it; shared and
	 * exclusive holders wait for each other. BACKEND_MISMATCH: the key's
	 * holders took it with another limit (errstr names both; nothing
	 * changed, but a queued caller is still queued: leave).
	 */
	int (*acquire)(struct backend_conn *c, const struct backend_item *it,
		       long long *wait_ms, char *holder, size_t *holder_len, long long *fence);
	/* Deletes key only while it still holds val, or hands it to the queue
	 * head: BACKEND_OK, or BACKEND_NO when it was not ours. async: do not
	 * wait for the reply (BACKEND_OK once sent, or once queued to be sent
	 * with the next command: BACKEND_ASYNC_MORE). A holder-set item removes
	 * its own entry (a string key holding val too) and wakes the head. */
	int (*release)(struct backend_conn *c, const struct backend_item *it, int async);
	/* Blocks until a release signals this waiter or timeout_ms passes.
	 * Returns BACKEND_GRANTED (with the grant's fencing token in *fence),
	 * BACKEND_OK (woken), BACKEND_NO (timed out) or BACKEND_ERR. */
	int (*wait)(struct backend_conn *c, const struct backend_item *it,
		    long long timeout_ms, long long *fence);
	/*
	 * Forgets token it->val: leaves the queue, and deletes the key when it
	 * holds the token (a grant the waiter will not use, or an acquire whose
	 * reply was lost), waking the next waiter. Returns BACKEND_OK when the
	 * key held it, BACKEND_NO when not; async: BACKEND_OK once sent.
	 */
	int (*leave)(struct backend_conn *c, const struct backend_item *it, int async);
	/* Reads the replies of asynchronous commands. Returns BACKEND_OK or
	 * BACKEND_ERR. */
	int (*flush)(struct backend_conn *c);
	/*
	 * After a failure of c: passes each asynchronous command whose reply was
	 * never read (a release or a leave that Redis may or may not have run)
	 * to fn, as an item to be forgotten later, and drops them. The item's
	 * strings are valid during the call only.
	 */
	void (*unconfirmed)(struct backend_conn *c,
			    void (*fn)(void *arg, const struct backend_item *it), void *arg);
	/*
	 * Extends n keys still holding their values, in one round trip.
	 * Fills results[i] with BACKEND_OK (renewed) or BACKEND_NO (gone or
	 * owned by another). Returns BACKEND_OK, or BACKEND_ERR when the batch
	 * could not be completed. NULL for a leaseless backend: nothing calls
	 * it then (no renewal thread; `lockshim check` skips the step).
	 */
	int (*renew)(struct backend_conn *c, int n, const struct backend_item *items,
		     int *results);
	/*
	 * Adds deltas[i] to field fields[i] (flens[i] bytes) of the hash key
	 * (klen bytes; never expires), for each i < n, in one round trip: the
	 * shim's metrics (shim/count.c). Returns BACKEND_OK or BACKEND_ERR
	 * (the caller sends them again later: an increment Redis ran without
	 * answering may then count twice). Optional.
	 */
	int (*count)(struct backend_conn *c, const char *key, size_t klen, int n,
		     const char *const *fields, const size_t *flens, const long long *deltas);
	/*
	 * Optional, with .count, for `lockshim metrics` of a backend that is
	 * not Redis's (metrics.c scans Redis itself): calls fn once per value
	 * the store keeps under a metrics hash of namespace ns (every host's
	 * "<ns>:metrics:{<host>}"), key and field as .count was given them,
	 * value the sum of its deltas. Read-only. Returns BACKEND_OK, or
	 * BACKEND_ERR with the reason in errstr.
	 */
	int (*count_read)(struct backend_conn *c, const char *ns,
			  void (*fn)(void *arg, const char *key, size_t klen, const char *field,
				     size_t flen, long long value),
			  void *arg);
	/* Returns the last error text of c (never NULL). */
	const char *(*errstr)(const struct backend_conn *c);
	/* Sends PING; returns BACKEND_OK or BACKEND_ERR. Used by `lockshim check`. */
	int (*ping)(struct backend_conn *c);
	/* Optional, for topologies of several nodes (`lockshim check` self-tests
	 * each): returns how many nodes bc has (after an open). */
	int (*node_count)(const struct backend_config *bc);
	/* Optional, with node_count: opens node i as a connection of backend_redis's
	 * operations; writes its name ("HOST:PORT" and what it serves) into name,
	 * and into tag a hash tag routing a key to it ("" when none is needed).
	 * Returns the connection or NULL with err. */
	struct backend_conn *(*node_open)(const struct backend_config *bc, int i, char *name,
					  size_t namelen, char *tag, size_t taglen, char *err,
					  size_t errlen);
	/*
	 * Optional: the first attempts of a call of several keys (lock.c), in
	 * one round trip: acquire of each of the n items (the plain acquire:
	 * neither fair nor waiting), all written at once, every reply read.
	 * Fills results[i] with BACKEND_OK (taken, its fencing token in
	 * fences[i]) or BACKEND_NO (held by another). Returns BACKEND_OK; or
	 * BACKEND_NO when this connection cannot batch them (nothing sent: take
	 * them one by one); or BACKEND_ERR (any of them may have run).
	 */
	int (*acquire_batch)(struct backend_conn *c, int n, const struct backend_item *items,
			     int *results, long long *fences);
	/*
	 * Optional, for `lockshim status` of a backend that is not Redis's
	 * (lockview.c reads Redis itself): calls fn once per holder the store
	 * has now, in key order. Read-only. Returns BACKEND_OK, or BACKEND_ERR
	 * with the reason in errstr (nothing reported then).
	 */
	int (*holders)(struct backend_conn *c,
		       void (*fn)(void *arg, const struct backend_holder *h), void *arg);
	/*
	 * Optional, for `lockshim unlock` where only its holder can give a
	 * lock back (.release would find it not held): removes the holder of
	 * it's key whose value is it's (as .holders reported it) by what that
	 * takes (postgres: its session ended). The keys of the other locks
	 * that go with it are written to also ("k1, k2"; "" none; cut to
	 * alen). Returns BACKEND_OK removed, BACKEND_NO no such holder (any
	 * more), BACKEND_ERR with errstr.
	 */
	int (*remove)(struct backend_conn *c, const struct backend_item *it, char *also,
		      size_t alen);
};

/* Returns what log lines call ops's lock store (a static string): its
 * .store ("PostgreSQL"), else "lock file" for a leaseless backend (kernel
 * locks), else "Redis". */
static inline const char *backend_store(const struct backend_ops *ops)
{
	return ops->store ? ops->store : ops->leaseless ? "lock file" : "Redis";
}

/* The backend serving a config: its table and its settings. */
struct backend {
	const struct backend_ops *ops;
	struct backend_config *cfg;
};

/* backend_init's result when the backend's module (backend_module.h) or
 * its client library cannot be loaded: a config error (78) everywhere. */
#define BACKEND_INIT_MODULE (-2)

/*
 * Picks the backend that serves cfg (backend.c's table, first match; a
 * module is loaded then) and makes its state from its group's settings.
 * Returns 0; -1 with one line in err; or BACKEND_INIT_MODULE when the
 * backend's module cannot be loaded (err names what to install). Release
 * with backend_release.
 */
int backend_init(struct backend *b, const struct conf *cfg, char *err, size_t errlen);
void backend_release(struct backend *b);

/* Lends fn, the shim's lost-lease path (renew_lost_all), to the backends'
 * modules as host->lost_all (backend_module.h). The shim and `lockshim
 * lock` set it once their lock state is set up, before any lock; until
 * then a module's report is dropped. */
void backend_on_lost_all(void (*fn)(const char *why));

/* Opens a connection of b's backend; NULL with a message in err. */
static inline struct backend_conn *backend_open(const struct backend *b, char *err,
						size_t errlen)
{
	return b->ops->open(b->cfg, err, errlen);
}

/* For a backend's config_new and open: returns size zeroed bytes (the
 * caller frees them), or NULL with "out of memory" in err. */
void *backend_calloc(size_t size, char *err, size_t errlen);
/*
 * Returns, as a static string, the likely cause of err, a plain-TCP
 * connection's transport error before any reply, when it is what a
 * TLS-only port does to plain text (closes or resets the connection at the
 * first command); else NULL. `lockshim check` and the shim's own errors
 * both say it.
 */
const char *backend_plain_tls_hint(const char *err);

/*
 * Writes the settings groups of the backends of backend.c's table (each
 * once, NULL-terminated) into groups, for conf_load. Room for
 * CONF_GROUPS_MAX + 1 entries is enough.
 */
void backend_conf_groups(const struct conf_group **groups, size_t n);

#endif
