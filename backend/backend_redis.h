/* SPDX-License-Identifier: MIT */
/*
 * backend_redis.h - what backend_redis.c shares with the backends that
 * speak the same protocol to a node they find another way (Sentinel:
 * backend_sentinel.c). Such a backend finds the node, opens it with
 * backend_redis_connect, and lists backend_redis.c's operations for
 * everything a connection then does: the commands, scripts, WAIT and
 * error handling stay in one file. Not for lock.c or renew.c, which see
 * backend.h only.
 *
 * The prefix is the module's, backend_redis_; hiredis owns redis*.
 */
#ifndef LOCKSHIM_BACKEND_REDIS_H
#define LOCKSHIM_BACKEND_REDIS_H

#include <hiredis/hiredis.h>

#include "backend.h"
#include "backend_redis_conf.h"

/* One node to connect to, and how to log in there. */
struct redis_endpoint {
	const char *host;
	int port;
	const char *socket;    /* used instead of host and port when not NULL */
	const char *username;
	const char *password;
	int db;
	int wait_replicas;     /* WAIT after acquires and renewals (0: none) */
};

/*
 * Opens a connection to ep with r's timeouts and TLS settings (AUTH and
 * SELECT sent). Returns it (released with the ops' close), or NULL with
 * the reason in err.
 */
struct backend_conn *backend_redis_connect(const struct redis_spec *r,
					   const struct redis_endpoint *ep,
					   char *err, size_t errlen);

/* Marks c as one master of several (Redlock): an asynchronous release that
 * finds the key not ours there is no news, logged at debug, not warn. */
void backend_redis_one_of_many(struct backend_conn *c);

/* Says whether c's next commands follow an ASK redirection (on: 1), after
 * an ASKING: their scripts then go as EVAL, never EVALSHA, since the EVAL
 * sent again after a NOSCRIPT would come without the ASKING (which covers
 * one command) and the importing node would send it back with MOVED. */
void backend_redis_asked(struct backend_conn *c, int on);

/* Sends one command of argc strings and returns its reply (the caller
 * frees it with freeReplyObject), or NULL (the reason in the ops'
 * errstr). */
redisReply *backend_redis_command(struct backend_conn *c, int argc, const char *const *argv);

/* Splits s, "host:port" (the host may be "[v6]"), into host (len bytes)
 * and port. Returns 0, or -1 when s is not host:port or host is too long. */
int backend_redis_split_addr(const char *s, char *host, size_t len, int *port);

/* Returns 1 when err, a Redis error reply, sends the command to another
 * cluster node or asks to retry it (MOVED, ASK, TRYAGAIN, CLUSTERDOWN). */
int backend_redis_is_redirect(const char *err);

/*
 * Passes each asynchronous release or leave whose reply was such an error
 * to fn, as an item to be forgotten on the right node, and drops them
 * (unconfirmed() hands them back too). The item's strings are valid during
 * the call only. Returns how many there were.
 */
int backend_redis_redirected(struct backend_conn *c,
		     void (*fn)(void *arg, const struct backend_item *it), void *arg);

/*
 * Pipelined halves of acquire and renew, for a backend that sends one
 * command to several nodes before reading any reply (backend_redlock.c):
 * *_send appends the command and writes it, reading nothing; *_recv reads
 * its replies, after those of the pending asynchronous commands, and
 * interprets them as the whole operation would. backend_redis_acquire and
 * backend_redis_renew are the two halves in a row, in one round trip. Each returns
 * an enum backend_result; after a transport error (not an error reply)
 * the connection must be closed.
 */
int backend_redis_acquire_send(struct backend_conn *c, const struct backend_item *it);
int backend_redis_acquire_recv(struct backend_conn *c, const struct backend_item *it,
		       long long *wait_ms, char *holder, size_t *holder_len, long long *fence);
int backend_redis_renew_send(struct backend_conn *c, int n, const struct backend_item *items);
int backend_redis_renew_recv(struct backend_conn *c, int n, const struct backend_item *items,
		     int *results);

/*
 * Raises it->key's fencing counter (<key>:f n) to fence when it is lower,
 * without waiting for the reply (read in front of the next command's, as
 * an asynchronous release's; never handed back by unconfirmed). For
 * Redlock: a grant's fence on each master of its quorum. Returns
 * BACKEND_OK once sent, or BACKEND_ERR.
 */
int backend_redis_fence_send(struct backend_conn *c, const struct backend_item *it,
			     long long fence);

/*
 * Deletes it->key only while it holds it->val, naming no other key: no
 * waiter is woken. For a Redis Cluster slot in migration, where the queue
 * scripts' keys are split between two nodes and get TRYAGAIN. Returns
 * BACKEND_OK (deleted), BACKEND_NO (not ours) or BACKEND_ERR.
 */
int backend_redis_unlock(struct backend_conn *c, const struct backend_item *it);

/*
 * Sends ncmd commands in one write and reads their replies (one round
 * trip): command i is argc[i] strings, taken in turn from argv (with their
 * lengths in argvlen). Returns 0 with replies[0..ncmd) set (each an error
 * reply, maybe; the caller frees each with freeReplyObject), or -1 with
 * every replies[i] NULL and the reason in the ops' errstr (a transport
 * error: close the connection). For `lockshim status` and `unlock`.
 */
int backend_redis_pipeline(struct backend_conn *c, int ncmd, const int *argc,
			   const char *const *argv, const size_t *argvlen, redisReply **replies);

/* backend_redis.c's table (the one-server backend), for the self-test's
 * probes of single nodes. */
extern const struct backend_ops backend_redis;

/* backend_redis.c's operations (backend.h), for other tables to list. */
void backend_redis_close(struct backend_conn *c);
int backend_redis_acquire(struct backend_conn *c, const struct backend_item *it, long long *wait_ms,
		  char *holder, size_t *holder_len, long long *fence);
int backend_redis_release(struct backend_conn *c, const struct backend_item *it, int async);
int backend_redis_wait(struct backend_conn *c, const struct backend_item *it, long long timeout_ms,
		       long long *fence);
int backend_redis_leave(struct backend_conn *c, const struct backend_item *it, int async);
int backend_redis_flush(struct backend_conn *c);
void backend_redis_unconfirmed(struct backend_conn *c,
		       void (*fn)(void *arg, const struct backend_item *it), void *arg);
int backend_redis_renew(struct backend_conn *c, int n, const struct backend_item *items,
			int *results);
const char *backend_redis_errstr(const struct backend_conn *c);
int backend_redis_ping(struct backend_conn *c);
int backend_redis_count(struct backend_conn *c, const char *key, size_t klen, int n,
			const char *const *fields, const size_t *flens, const long long *deltas);
int backend_redis_acquire_batch(struct backend_conn *c, int n, const struct backend_item *items,
				int *results, long long *fences);

/* The operations of a connection, for a backend table (backend.h) that
 * differs from backend_redis's only in finding the node. */
#define REDIS_CONN_OPS                                                          \
	.close = backend_redis_close, .acquire = backend_redis_acquire, .release = backend_redis_release, \
	.wait = backend_redis_wait, .leave = backend_redis_leave, .flush = backend_redis_flush,           \
	.unconfirmed = backend_redis_unconfirmed, .renew = backend_redis_renew,                   \
	.errstr = backend_redis_errstr, .ping = backend_redis_ping, .count = backend_redis_count, \
	.acquire_batch = backend_redis_acquire_batch

#endif
