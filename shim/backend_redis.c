/* SPDX-License-Identifier: MIT */
/*
 * backend_redis.c - the Redis implementation of backend.h, over hiredis.
 *
 * An uncontended acquire is a plain SET NX PX; everything else is one Lua
 * script sent by EVALSHA (EVAL on NOSCRIPT), named by the SHA-1 computed
 * here, so a new connection sends its first command at once (AUTH and
 * SELECT, when configured, go ahead of it in one round trip). Keys and
 * values are separate arguments with lengths, never spliced into command
 * text. Auxiliary keys hang off the lock key:
 *   <key>:q, :qx     waiters by arrival (a counter: Redis runs many
 *                    arrivals in one millisecond) and by expiry (a waiter
 *                    that stops refreshing is purged within its waiter TTL)
 *   <key>:due        while waiters queue: when a release must hand over (µs, Redis TIME)
 *   <key>:w:<token>  a waiter's signal list: "g" (the lock was handed to it)
 *                    or "w" (it is free: try again); waiters BLPOP it
 * A release with a waiter due hands the lock straight to the queue head
 * (fair mode: always; default mode: handoff_ms after the head arrived or
 * after the last hand-off, or when the releaser has had it that long or is
 * idle); otherwise it deletes the key and wakes the head, and the releaser
 * may take it again first, which keeps a busy caller fast without starving
 * others.
 * Asynchronous releases are written at once (as EVAL, so NOSCRIPT cannot
 * delay them) and remembered; their replies are read in front of the next
 * command's reply (one round trip for both), or by flush. hiredis is linked
 * statically with hidden symbols.
 */
#include "backend.h"

#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include "config.h"
#include "log.h"
#include "sha1.h"

#define LUA_NOW                                                                 \
	"local t = redis.call('time') local nowu = t[1] * 1000000 + t[2] "      \
	"local now = math.floor(nowu / 1000) "
#define LUA_PURGE                                                               \
	"for _, w in ipairs(redis.call('zrangebyscore', qx, '-inf', now)) do "  \
	"redis.call('zrem', q, w) redis.call('zrem', qx, w) end "

enum script { S_ENQUEUE, S_RELEASE, S_RENEW, S_LEAVE, NSCRIPTS };

static const char *const scripts[NSCRIPTS] = {
	/*
	 * ARGV: token, lease, waiter ttl, fair, hand-off µs. Takes the lock when
	 * free (fair: only with nobody ahead), else joins the queue or refreshes
	 * our place; the first waiter sets :due, when a release must hand over.
	 * Returns -1 when the lock is ours; else how long to wait for a signal
	 * at most: the lock's remaining TTL, or the head's expiry when the lock
	 * is free but someone else is ahead.
	 */
	[S_ENQUEUE] =
	"local K, tok = KEYS[1], ARGV[1] local q, qx, due = K .. ':q', K .. ':qx', K .. ':due' "
	"if redis.call('get', K) == tok then redis.call('zrem', q, tok) "
	"redis.call('zrem', qx, tok) redis.call('del', K .. ':w:' .. tok) return -1 end "
	LUA_NOW LUA_PURGE
	"local ttl, lease = tonumber(ARGV[3]), tonumber(ARGV[2]) "
	"local head = redis.call('zrange', q, 0, 0)[1] "
	"if (ARGV[4] == '0' or not head or head == tok) and "
	"redis.call('set', K, tok, 'NX', 'PX', lease) then "
	"redis.call('zrem', q, tok) redis.call('zrem', qx, tok) "
	"if redis.call('exists', q) == 0 then redis.call('del', due) end return -1 end "
	"local keep = 4 * ttl + lease "
	"if not redis.call('zscore', q, tok) then "
	"if not head then redis.call('set', due, nowu + tonumber(ARGV[5]), 'PX', keep) end "
	"local last = redis.call('zrange', q, -1, -1, 'WITHSCORES')[2] "
	"redis.call('zadd', q, (tonumber(last) or 0) + 1, tok) head = head or tok end "
	"redis.call('zadd', qx, now + ttl, tok) "
	"redis.call('pexpire', q, keep) redis.call('pexpire', qx, keep) "
	"redis.call('pexpire', due, keep) "
	"local left = redis.call('pttl', K) "
	"if left <= 0 then return math.max(tonumber(redis.call('zscore', qx, head)) - now, 1) end "
	"return left",
	/*
	 * ARGV: token, grant ttl, hand-off µs, signal ttl, turn done. Releases the
	 * lock only while it holds our token. Nobody queued: delete it. The head
	 * not due yet (it has waited less than hand-off µs) and the releaser not
	 * done with its turn: delete it and wake the head ("w": try again; the
	 * releaser may take it first). Else hand it to the head: the key takes
	 * the head's token (for the grant ttl, until its first renewal), the
	 * head's list gets "g", and the next waiter is due hand-off µs from now.
	 */
	[S_RELEASE] =
	"local K, tok = KEYS[1], ARGV[1] "
	"if redis.call('get', K) ~= tok then return 0 end "
	"local due = redis.call('get', K .. ':due') "
	"if not due then redis.call('del', K) return 1 end "
	LUA_NOW
	"local q, qx = K .. ':q', K .. ':qx' " LUA_PURGE
	"local head = redis.call('zrange', q, 0, 0)[1] "
	"if not head then redis.call('del', K, K .. ':due') return 1 end "
	"local function signal(w, v) local s = K .. ':w:' .. w redis.call('del', s) "
	"redis.call('rpush', s, v) redis.call('pexpire', s, ARGV[4]) end "
	"if nowu < tonumber(due) and ARGV[5] ~= '1' then "
	"redis.call('del', K) signal(head, 'w') return 1 end "
	"redis.call('set', K, head, 'PX', ARGV[2]) "
	"redis.call('zrem', q, head) redis.call('zrem', qx, head) "
	"signal(head, 'g') "
	"if redis.call('exists', q) == 0 then redis.call('del', K .. ':due') return 1 end "
	"redis.call('set', K .. ':due', nowu + tonumber(ARGV[3]), 'KEEPTTL') return 1",
	/* ARGV: token, lease. 1 renewed, 0 gone or not ours. */
	[S_RENEW] =
	"if redis.call('get', KEYS[1]) == ARGV[1] then "
	"return redis.call('pexpire', KEYS[1], ARGV[2]) else return 0 end",
	/* ARGV: token, signal ttl. Leaves the queue; when the lock is free, the
	 * next head is woken ("w") to take it. */
	[S_LEAVE] =
	"local K, tok = KEYS[1], ARGV[1] local q, qx = K .. ':q', K .. ':qx' "
	"redis.call('zrem', q, tok) redis.call('zrem', qx, tok) "
	"redis.call('del', K .. ':w:' .. tok) "
	"if redis.call('exists', q) == 0 then redis.call('del', K .. ':due') return 1 end "
	"if redis.call('exists', K) == 0 then "
	"local s = K .. ':w:' .. redis.call('zrange', q, 0, 0)[1] "
	"redis.call('del', s) redis.call('rpush', s, 'w') redis.call('pexpire', s, ARGV[2]) end "
	"return 1",
};

#define PENDING_MAX 16
#define WAKE_TTL_MS 1000 /* a wake-up outlives a waiter's race window, no more */
#define NAME_MAX_LEN (KEY_BUF_SIZE + 512)

/* An asynchronous command whose reply is still unread. */
struct pending {
	size_t klen;
	char key[KEY_BUF_SIZE];
};

static char script_sha[NSCRIPTS][41];
static pthread_once_t sha_once = PTHREAD_ONCE_INIT;

struct backend_conn {
	redisContext *ctx;
	long long cmd_ms; /* command timeout */
	int npending;
	struct pending pend[PENDING_MAX];
	char errstr[192];
};

static int conn_fail(struct backend_conn *c, const char *what, const redisReply *r)
{
	if (r && r->type == REDIS_REPLY_ERROR)
		snprintf(c->errstr, sizeof(c->errstr), "%s: %s", what, r->str);
	else if (c->ctx && c->ctx->err)
		snprintf(c->errstr, sizeof(c->errstr), "%s: %s", what, c->ctx->errstr);
	else
		snprintf(c->errstr, sizeof(c->errstr), "%s: unexpected reply", what);
	return -1;
}

static struct timeval ms_tv(long long ms)
{
	struct timeval tv = { (time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000 };
	return tv;
}

static void redis_close(struct backend_conn *c)
{
	if (!c)
		return;
	if (c->ctx)
		redisFree(c->ctx);
	free(c);
}

/* Sends AUTH and SELECT, when configured, in one round trip. */
static int conn_setup(struct backend_conn *c, const struct redis_spec *r)
{
	const char *argv[3];
	size_t lens[3];
	int n = 0, rc = 0;
	char db[16];

	if (r->password) {
		int k = 0;

		argv[k++] = "AUTH";
		if (r->username)
			argv[k++] = r->username;
		argv[k++] = r->password;
		for (int i = 0; i < k; i++)
			lens[i] = strlen(argv[i]);
		redisAppendCommandArgv(c->ctx, k, argv, lens);
		n++;
	}
	if (r->db) {
		snprintf(db, sizeof(db), "%d", r->db);
		redisAppendCommand(c->ctx, "SELECT %s", db);
		n++;
	}
	for (int i = 0; i < n; i++) {
		redisReply *rep = NULL;

		if (redisGetReply(c->ctx, (void **)&rep) != REDIS_OK)
			return conn_fail(c, "setup", NULL);
		if (rep->type == REDIS_REPLY_ERROR && rc == 0)
			rc = conn_fail(c, i == 0 && r->password ? "AUTH" : "SELECT", rep);
		freeReplyObject(rep);
	}
	return rc;
}

/* Names every script by its SHA-1, as Redis's script cache does. */
static void sha_init(void)
{
	for (int s = 0; s < NSCRIPTS; s++)
		sha1_hex(scripts[s], strlen(scripts[s]), script_sha[s]);
}

static struct backend_conn *redis_open(const struct redis_spec *r, char *err,
				       size_t errlen)
{
	struct backend_conn *c = calloc(1, sizeof(*c));
	struct timeval ct = ms_tv(r->connect_timeout_ms);

	if (!c) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	pthread_once(&sha_once, sha_init);
	c->ctx = r->socket ? redisConnectUnixWithTimeout(r->socket, ct)
			   : redisConnectWithTimeout(r->host, r->port, ct);
	if (!c->ctx || c->ctx->err) {
		const char *why = c->ctx ? c->ctx->errstr : "out of memory";

		if (r->socket)
			snprintf(err, errlen, "connect to %s: %s", r->socket, why);
		else
			snprintf(err, errlen, "connect to %s:%d: %s", r->host, r->port, why);
		redis_close(c);
		return NULL;
	}
	fcntl(c->ctx->fd, F_SETFD, FD_CLOEXEC);
	c->cmd_ms = r->command_timeout_ms;
	if (redisSetTimeout(c->ctx, ms_tv(c->cmd_ms)) != REDIS_OK || conn_setup(c, r) != 0) {
		snprintf(err, errlen, "%s", c->errstr[0] ? c->errstr : "setup failed");
		redis_close(c);
		return NULL;
	}
	return c;
}

/*
 * Commands are written in RESP into a stack buffer and handed to hiredis
 * ready-made: no format parsing, no allocation on the hot path.
 */
struct resp {
	char *p, *end;
	char buf[KEY_BUF_SIZE + 3072];
};

/* Writes v in decimal at p; returns the end. */
static char *put_num(char *p, long long v)
{
	char tmp[24];
	int n = 0;
	unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;

	do
		tmp[n++] = (char)('0' + u % 10);
	while ((u /= 10) != 0);
	if (v < 0)
		*p++ = '-';
	while (n)
		*p++ = tmp[--n];
	return p;
}

static void resp_start(struct resp *r, int argc)
{
	r->p = r->buf;
	r->end = r->buf + sizeof(r->buf);
	*r->p++ = '*';
	r->p = put_num(r->p, argc);
	*r->p++ = '\r';
	*r->p++ = '\n';
}

/* Appends one bulk string; returns -1 when it does not fit. */
static int resp_arg(struct resp *r, const char *s, size_t n)
{
	if (!r->p || (size_t)(r->end - r->p) < n + 32) {
		r->p = NULL;
		return -1;
	}
	*r->p++ = '$';
	r->p = put_num(r->p, (long long)n);
	*r->p++ = '\r';
	*r->p++ = '\n';
	memcpy(r->p, s, n);
	r->p += n;
	*r->p++ = '\r';
	*r->p++ = '\n';
	return 0;
}

static int resp_num(struct resp *r, long long v)
{
	char tmp[24];

	return resp_arg(r, tmp, (size_t)(put_num(tmp, v) - tmp));
}

/* Appends the built command to c's output buffer. Returns 0 or -1. */
static int resp_append(struct backend_conn *c, struct resp *r)
{
	if (!r->p) {
		snprintf(c->errstr, sizeof(c->errstr), "command too long");
		return -1;
	}
	return redisAppendFormattedCommand(c->ctx, r->buf, (size_t)(r->p - r->buf)) ==
	       REDIS_OK ? 0 : conn_fail(c, "append", NULL);
}

/* Appends EVALSHA (or EVAL) of script s on it's key and value, followed by
 * the numeric arguments args[0..nargs). Returns 0 or -1. */
static int append_script(struct backend_conn *c, enum script s,
			 const struct backend_item *it, const long long *args, int nargs,
			 int eval)
{
	struct resp r;

	resp_start(&r, 5 + nargs);
	if (eval) {
		resp_arg(&r, "EVAL", 4);
		resp_arg(&r, scripts[s], strlen(scripts[s]));
	} else {
		resp_arg(&r, "EVALSHA", 7);
		resp_arg(&r, script_sha[s], 40);
	}
	resp_arg(&r, "1", 1);
	resp_arg(&r, it->key, it->klen);
	resp_arg(&r, it->val, it->vlen);
	for (int i = 0; i < nargs; i++)
		resp_num(&r, args[i]);
	return resp_append(c, &r);
}

static int is_noscript(const redisReply *r)
{
	return r->type == REDIS_REPLY_ERROR && strncmp(r->str, "NOSCRIPT", 8) == 0;
}

/* Logs the outcome of an asynchronous release read back later. */
static void settle_one(const struct pending *p, const redisReply *r)
{
	if (r->type == REDIS_REPLY_INTEGER && r->integer == 0)
		LOG(LOG_WARN, "%.*s was no longer ours at release (expired or taken "
		    "over); nothing deleted", (int)p->klen, p->key);
	else if (r->type != REDIS_REPLY_INTEGER)
		LOG(LOG_ERROR, "release of %.*s failed: %s", (int)p->klen, p->key,
		    r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply");
}

/*
 * Reads the replies of the pending asynchronous commands (they come before
 * any reply appended after them) and logs failures. Returns 0 or -1.
 */
static int settle(struct backend_conn *c)
{
	int n = c->npending;

	c->npending = 0;
	for (int i = 0; i < n; i++) {
		redisReply *r = NULL;

		if (redisGetReply(c->ctx, (void **)&r) != REDIS_OK) {
			LOG(LOG_ERROR, "%d release(s) unconfirmed (they expire with their "
			    "lease): %s", n - i, c->ctx->errstr);
			return conn_fail(c, "release", NULL);
		}
		settle_one(&c->pend[i], r);
		freeReplyObject(r);
	}
	return 0;
}

/*
 * Reads the reply of the command just appended, after the pending ones.
 * Returns it (the caller frees it) or NULL with errstr set.
 */
static redisReply *reply_after_pending(struct backend_conn *c, const char *what)
{
	redisReply *r = NULL;

	if (settle(c) != 0)
		return NULL;
	if (redisGetReply(c->ctx, (void **)&r) != REDIS_OK) {
		conn_fail(c, what, NULL);
		return NULL;
	}
	return r;
}

/* Runs script s and returns its reply, retrying as EVAL on NOSCRIPT. */
static redisReply *run_script(struct backend_conn *c, const char *what, enum script s,
			      const struct backend_item *it, const long long *args, int nargs)
{
	redisReply *r;

	if (append_script(c, s, it, args, nargs, 0) != 0)
		return NULL;
	r = reply_after_pending(c, what);
	if (r && is_noscript(r)) {
		freeReplyObject(r);
		if (append_script(c, s, it, args, nargs, 1) != 0)
			return NULL;
		r = reply_after_pending(c, what);
	}
	if (r && r->type == REDIS_REPLY_ERROR) {
		conn_fail(c, what, r);
		freeReplyObject(r);
		return NULL;
	}
	return r;
}

/* The uncontended path of the default mode: a plain SET NX PX. */
static int set_nx(struct backend_conn *c, const struct backend_item *it)
{
	struct resp r;
	redisReply *rep;
	int rc;

	resp_start(&r, 6);
	resp_arg(&r, "SET", 3);
	resp_arg(&r, it->key, it->klen);
	resp_arg(&r, it->val, it->vlen);
	resp_arg(&r, "NX", 2);
	resp_arg(&r, "PX", 2);
	resp_num(&r, it->lease_ms);
	if (resp_append(c, &r) != 0)
		return -1;
	rep = reply_after_pending(c, "SET NX");
	if (!rep)
		return -1;
	if (rep->type == REDIS_REPLY_STATUS)
		rc = 1;
	else if (rep->type == REDIS_REPLY_NIL)
		rc = 0;
	else
		rc = conn_fail(c, "SET NX", rep);
	freeReplyObject(rep);
	return rc;
}

static int redis_acquire(struct backend_conn *c, const struct backend_item *it,
			 long long *wait_ms)
{
	long long args[4] = { it->lease_ms, it->waiter_ttl_ms, it->fair,
			      it->fair ? 0 : it->handoff_us };
	redisReply *r;
	int rc;

	if (!it->fair && !it->waiting) {
		rc = set_nx(c, it);
		*wait_ms = -1; /* not queued yet: ask again, queueing */
		return rc;
	}
	r = run_script(c, "acquire", S_ENQUEUE, it, args, 4);
	if (!r)
		return -1;
	if (r->type != REDIS_REPLY_INTEGER) {
		rc = conn_fail(c, "acquire", r);
	} else if (r->integer == -1) {
		rc = 1;
	} else {
		*wait_ms = r->integer;
		rc = 0;
	}
	freeReplyObject(r);
	return rc;
}

static int redis_flush(struct backend_conn *c)
{
	return settle(c);
}

/*
 * Writes script s on it at once and remembers it; its reply is read later.
 * Sent as EVAL with the script text, so it can never meet NOSCRIPT (Redis
 * caches the script by its SHA1). Flushes first when the queue is full.
 */
static int send_async(struct backend_conn *c, enum script s, const struct backend_item *it,
		      const long long *args, int nargs)
{
	struct pending *p;
	int done = 0;

	if (it->klen > sizeof(p->key))
		return conn_fail(c, "release", NULL);
	if (c->npending == PENDING_MAX && settle(c) != 0)
		return -1;
	if (append_script(c, s, it, args, nargs, 1) != 0)
		return -1;
	p = &c->pend[c->npending++];
	p->klen = it->klen;
	memcpy(p->key, it->key, it->klen);
	while (!done && redisBufferWrite(c->ctx, &done) == REDIS_OK)
		;
	if (c->ctx->err)
		return conn_fail(c, "release", NULL);
	return 1;
}

static int redis_release(struct backend_conn *c, const struct backend_item *it, int async)
{
	long long args[4] = { it->waiter_ttl_ms, it->fair ? 0 : it->handoff_us, WAKE_TTL_MS,
			      it->turn_done };
	redisReply *r;
	int rc;

	if (async)
		return send_async(c, S_RELEASE, it, args, 4);
	r = run_script(c, "release", S_RELEASE, it, args, 4);
	if (!r)
		return -1;
	rc = r->type == REDIS_REPLY_INTEGER ? r->integer != 0 : conn_fail(c, "release", r);
	freeReplyObject(r);
	return rc;
}

static int redis_leave(struct backend_conn *c, const struct backend_item *it)
{
	long long ttl = WAKE_TTL_MS;

	return send_async(c, S_LEAVE, it, &ttl, 1);
}

static int redis_wait(struct backend_conn *c, const struct backend_item *it,
		      long long timeout_ms)
{
	char list[NAME_MAX_LEN], secs[32];
	const char *argv[3] = { "BLPOP", list, secs };
	size_t lens[3] = { 5, 0, 0 };
	redisReply *r;
	int rc;

	if (it->klen + it->vlen + 8 > sizeof(list))
		return conn_fail(c, "wait", NULL);
	memcpy(list, it->key, it->klen);
	memcpy(list + it->klen, ":w:", 3);
	memcpy(list + it->klen + 3, it->val, it->vlen);
	lens[1] = it->klen + 3 + it->vlen;
	lens[2] = (size_t)snprintf(secs, sizeof(secs), "%lld.%03lld", timeout_ms / 1000,
				   timeout_ms % 1000);
	/* The socket must outwait the server's own timeout. */
	redisSetTimeout(c->ctx, ms_tv(timeout_ms + c->cmd_ms));
	redisAppendCommandArgv(c->ctx, 3, argv, lens);
	r = reply_after_pending(c, "BLPOP");
	redisSetTimeout(c->ctx, ms_tv(c->cmd_ms));
	if (!r)
		return -1;
	if (r->type == REDIS_REPLY_ARRAY && r->elements == 2)
		rc = r->element[1]->str && r->element[1]->str[0] == 'g' ? 2 : 1;
	else if (r->type == REDIS_REPLY_NIL)
		rc = 0;
	else
		rc = conn_fail(c, "BLPOP", r);
	freeReplyObject(r);
	return rc;
}

static int redis_renew(struct backend_conn *c, int n, const struct backend_item *items,
		       int *results)
{
	int rc = 0;

	for (int i = 0; i < n; i++)
		if (append_script(c, S_RENEW, &items[i], &items[i].lease_ms, 1, 0) != 0)
			return -1;
	for (int i = 0; i < n; i++) {
		redisReply *r = NULL;

		if (redisGetReply(c->ctx, (void **)&r) != REDIS_OK)
			return conn_fail(c, "renew", NULL);
		if (is_noscript(r))
			results[i] = -2; /* redo below, after the pipeline drains */
		else if (r->type == REDIS_REPLY_INTEGER)
			results[i] = r->integer != 0;
		else
			rc = results[i] = conn_fail(c, "renew", r);
		freeReplyObject(r);
	}
	for (int i = 0; i < n && rc == 0; i++) {
		redisReply *r;

		if (results[i] != -2)
			continue;
		r = run_script(c, "renew", S_RENEW, &items[i], &items[i].lease_ms, 1);
		if (!r || r->type != REDIS_REPLY_INTEGER)
			rc = results[i] = -1;
		else
			results[i] = r->integer != 0;
		if (r)
			freeReplyObject(r);
	}
	return rc;
}

static const char *redis_errstr(const struct backend_conn *c)
{
	return c->errstr;
}

static int redis_ping(struct backend_conn *c)
{
	redisReply *r;
	int rc;

	redisAppendCommand(c->ctx, "PING");
	r = reply_after_pending(c, "PING");
	rc = r && r->type == REDIS_REPLY_STATUS ? 1 : conn_fail(c, "PING", r);
	if (r)
		freeReplyObject(r);
	return rc;
}

const struct backend_ops backend_redis = {
	.open = redis_open,
	.close = redis_close,
	.acquire = redis_acquire,
	.release = redis_release,
	.wait = redis_wait,
	.leave = redis_leave,
	.flush = redis_flush,
	.renew = redis_renew,
	.errstr = redis_errstr,
	.ping = redis_ping,
};
