/* SPDX-License-Identifier: MIT */
/*
 * lockview.h - the locks a server holds, as `lockshim status` and
 * `lockshim unlock` read and print them (lockview.c), and those two verbs
 * (status.c, unlock.c).
 *
 * A lock is read from every node that may hold it (the primary; each
 * Cluster primary; each Redlock master) with GET, PTTL, HMGET <key>:f n g k
 * l m and ZRANGE <key>:q 0 -1 pipelined; a key whose GET says WRONGTYPE is
 * a holder set (a semaphore's permits, shared holders: a ZSET of values
 * scored by expiry), read in a second round with TIME and ZRANGE WITHSCORES,
 * one struct lv_lock per live holder. With Redlock a holder is shown when
 * a quorum of masters holds its value. Nothing here writes to the server.
 */
#ifndef LOCKSHIM_LOCKVIEW_H
#define LOCKSHIM_LOCKVIEW_H

#include <stddef.h>

#include "backend.h"
#include "owner.h"

struct conf;

/* One holder of a lock, as read: a string lock's, or one of a holder set's. */
struct lv_lock {
	char key[KEY_BUF_SIZE]; /* as stored, namespace included */
	size_t klen;
	char val[BACKEND_VAL_MAX];
	size_t vlen;
	struct owner_info owner;
	long long since_ms;     /* when it was taken (CLOCK_REALTIME ms); 0 unknown */
	long long lease_left_ms; /* PTTL (a holder set's: its expiry); -1 no expiry */
	long long fence;        /* -1 when unknown (always for a holder set's) */
	int limit;              /* holders at once: 1 for a string lock */
	int shared;             /* a shared holder (mode "shared") */
	int in_set;             /* one holder of a holder set */
	int kept;               /* parked between calls (field k is the holder's) */
	int masters;            /* Redlock: on how many masters; else 0 */
	int nwaiters;
	struct owner_info *waiters; /* oldest first; malloc'd (lv_lock_free) */
};

/* Holders read, in key order, then value order. */
struct lv_set {
	struct lv_lock *v;
	int n, cap;
};

/* The server topology of a config, opened for reading. */
struct lockview {
	const struct conf *cfg;
	struct backend b;
	int redlock, quorum; /* Redlock masters: quorum = n / 2 + 1 */
	int tagged;          /* Redis Cluster: keys are "<ns>:{KEY}" */
};

/* Makes lv for cfg (which must outlive it). Returns 0, or -1 with the
 * reason in err. Release with lockview_close. */
int lockview_open(struct lockview *lv, const struct conf *cfg, char *err, size_t errlen);
void lockview_close(struct lockview *lv);

/*
 * Adds to out every holder of the namespace's locks whose KEY matches the glob
 * pattern (Redis MATCH syntax; NULL: all): SCAN ... MATCH COUNT 1000 on
 * every node, one pipelined read per page of keys. With a backend that
 * lists its holders itself (.holders: local's lock files, etcd's keys),
 * what it lists, matched with fnmatch(3) on KEY. Returns 0, or -1 with
 * the reason in err (a node, the dir or the server could not be read;
 * out keeps what was read).
 */
int lockview_scan(struct lockview *lv, const char *pattern, struct lv_set *out, char *err,
		  size_t errlen);

/*
 * Reads the lock of KEY (as the config names it; the namespace and a
 * Cluster's braces are added here) into out (empty; free it with
 * lv_set_free): a string lock's holder (with Redlock: the value on most
 * masters), or every holder of a holder set (on any master). Returns how
 * many, 0 when no node holds a lock value there, -1 with the reason in err.
 */
int lockview_read(struct lockview *lv, const char *key, struct lv_set *out, char *err,
		  size_t errlen);

/* Writes "<ns>:KEY" (or "<ns>:{KEY}" in a Cluster) into buf (KEY_BUF_SIZE
 * bytes). Returns its length, or 0 when it does not fit. */
size_t lockview_key(const struct lockview *lv, const char *key, char *buf);

/* Prints l on stdout: one line of text, or (json) one JSON object;
 * now_ms is CLOCK_REALTIME in ms. */
void lockview_print(const struct lockview *lv, const struct lv_lock *l, int json,
		    long long now_ms);

void lv_lock_free(struct lv_lock *l);
void lv_set_free(struct lv_set *s);

/* Options of status and unlock: [-c FILE] [--json] [--force] [--] [OPERAND].
 * Returns 0, or 64 after a usage message naming usage. */
struct lv_args {
	const char *config;
	const char *operand; /* NULL when none */
	int json, force;
};
int lockview_args(int argc, char **argv, int allow_force, const char *usage,
		  struct lv_args *a);

/* Loads the config a as the other verbs do (-c, $LOCKSHIM_CONFIG, the
 * default path); a config without locks is fine. Returns 0, or -1 after
 * printing the error. */
int lockview_load(struct conf *cfg, const struct lv_args *a);

/* The verb a lockview_start serves. */
enum lv_verb { LV_STATUS, LV_UNLOCK };

/* lockview_load, then lockview_open on it. Returns 0, or the exit status
 * (CONF_EXIT_CODE) after printing the error, cfg released; 1, cfg released,
 * after printing "lockshim: " and the backend's .status_why or .unlock_why
 * when it has one for verb (the verb is not there for it). */
int lockview_start(struct lockview *lv, struct conf *cfg, const struct lv_args *a,
		   enum lv_verb verb);

/* Returns the time of day in milliseconds since the epoch (for
 * lockview_print's now_ms). */
long long lockview_now_ms(void);

/* The verbs (cli.c's commands[]). */
int cmd_status(int argc, char **argv);
int cmd_unlock(int argc, char **argv);

#endif
