/* SPDX-License-Identifier: MIT */
/*
 * backend_redis.c - the Redis implementation of backend.h, over hiredis.
 *
 * Acquire is SET key value NX PX lease. Release and renewal are Lua
 * compare-and-delete and compare-and-pexpire scripts, sent by EVALSHA with a
 * fallback to EVAL on NOSCRIPT; their SHA1s come from SCRIPT LOAD, pipelined
 * with AUTH and SELECT when a connection opens. Keys and values are passed as
 * separate arguments with lengths, never spliced into command text. hiredis
 * is linked statically with hidden symbols, so the program's own hiredis (if
 * any) is a different copy and our calls never pass through patched slots.
 */
#include "backend.h"

#include <errno.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/time.h>

#include "config.h"

static const char release_lua[] =
	"if redis.call('get', KEYS[1]) == ARGV[1] then "
	"return redis.call('del', KEYS[1]) else return 0 end";
static const char renew_lua[] =
	"if redis.call('get', KEYS[1]) == ARGV[1] then "
	"return redis.call('pexpire', KEYS[1], ARGV[2]) else return 0 end";

struct backend_conn {
	redisContext *ctx;
	char release_sha[41];
	char renew_sha[41];
	char errstr[160];
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

static struct timeval ms_tv(int ms)
{
	struct timeval tv = { ms / 1000, (ms % 1000) * 1000 };
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

/* Sends AUTH, SELECT and both SCRIPT LOADs in one round trip. */
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
	redisAppendCommand(c->ctx, "SCRIPT LOAD %s", release_lua);
	redisAppendCommand(c->ctx, "SCRIPT LOAD %s", renew_lua);
	n += 2;
	for (int i = 0; i < n; i++) {
		redisReply *rep = NULL;

		if (redisGetReply(c->ctx, (void **)&rep) != REDIS_OK)
			return conn_fail(c, "setup", NULL);
		if (rep->type == REDIS_REPLY_ERROR) {
			if (rc == 0)
				rc = conn_fail(c, i == 0 && r->password ? "AUTH" : "setup", rep);
		} else if (i >= n - 2 && rep->type == REDIS_REPLY_STRING) {
			char *dst = i == n - 2 ? c->release_sha : c->renew_sha;

			snprintf(dst, 41, "%s", rep->str);
		}
		freeReplyObject(rep);
	}
	return rc;
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
	if (redisSetTimeout(c->ctx, ms_tv(r->command_timeout_ms)) != REDIS_OK ||
	    conn_setup(c, r) != 0) {
		snprintf(err, errlen, "%s", c->errstr[0] ? c->errstr : "setup failed");
		redis_close(c);
		return NULL;
	}
	return c;
}

static int redis_acquire(struct backend_conn *c, const struct backend_item *it)
{
	char px[24];
	const char *argv[6] = { "SET", it->key, it->val, "NX", "PX", px };
	size_t lens[6] = { 3, it->klen, it->vlen, 2, 2, 0 };
	redisReply *r;
	int rc;

	lens[5] = (size_t)snprintf(px, sizeof(px), "%lld", it->lease_ms);
	r = redisCommandArgv(c->ctx, 6, argv, lens);
	if (!r)
		return conn_fail(c, "SET NX", NULL);
	if (r->type == REDIS_REPLY_STATUS)
		rc = 1;
	else if (r->type == REDIS_REPLY_NIL)
		rc = 0;
	else
		rc = conn_fail(c, "SET NX", r);
	freeReplyObject(r);
	return rc;
}

/* Appends EVALSHA (or EVAL when eval is set) of one script for it. */
static void append_script(struct backend_conn *c, const char *sha, const char *lua,
			  const struct backend_item *it, int with_lease, int eval)
{
	char ms[24];
	const char *argv[6] = { eval ? "EVAL" : "EVALSHA", eval ? lua : sha, "1",
				it->key, it->val, ms };
	size_t lens[6] = { strlen(argv[0]), strlen(argv[1]), 1, it->klen, it->vlen, 0 };

	lens[5] = (size_t)snprintf(ms, sizeof(ms), "%lld", it->lease_ms);
	redisAppendCommandArgv(c->ctx, with_lease ? 6 : 5, argv, lens);
}

static int is_noscript(const redisReply *r)
{
	return r->type == REDIS_REPLY_ERROR && strncmp(r->str, "NOSCRIPT", 8) == 0;
}

/* Reads one script reply: 1 when the integer reply is nonzero, 0, or -1. */
static int script_reply(struct backend_conn *c, const char *what, redisReply *r)
{
	int rc;

	if (r->type == REDIS_REPLY_INTEGER)
		rc = r->integer != 0;
	else
		rc = conn_fail(c, what, r);
	freeReplyObject(r);
	return rc;
}

/* Runs one script for it, falling back to EVAL on NOSCRIPT. */
static int run_script(struct backend_conn *c, const char *what, const char *sha,
		      const char *lua, const struct backend_item *it, int with_lease)
{
	redisReply *r = NULL;

	append_script(c, sha, lua, it, with_lease, 0);
	if (redisGetReply(c->ctx, (void **)&r) != REDIS_OK)
		return conn_fail(c, what, NULL);
	if (is_noscript(r)) {
		freeReplyObject(r);
		r = NULL;
		append_script(c, sha, lua, it, with_lease, 1);
		if (redisGetReply(c->ctx, (void **)&r) != REDIS_OK)
			return conn_fail(c, what, NULL);
	}
	return script_reply(c, what, r);
}

static int redis_release(struct backend_conn *c, const struct backend_item *it)
{
	return run_script(c, "release", c->release_sha, release_lua, it, 0);
}

static int redis_renew(struct backend_conn *c, int n, const struct backend_item *items,
		       int *results)
{
	int rc = 0;

	for (int i = 0; i < n; i++)
		append_script(c, c->renew_sha, renew_lua, &items[i], 1, 0);
	for (int i = 0; i < n; i++) {
		redisReply *r = NULL;

		if (redisGetReply(c->ctx, (void **)&r) != REDIS_OK)
			return conn_fail(c, "renew", NULL);
		if (is_noscript(r)) {
			freeReplyObject(r);
			results[i] = -2; /* redo below, after the pipeline drains */
			continue;
		}
		results[i] = script_reply(c, "renew", r);
		if (results[i] < 0)
			rc = -1;
	}
	for (int i = 0; i < n && rc == 0; i++)
		if (results[i] == -2) {
			results[i] = run_script(c, "renew", c->renew_sha, renew_lua,
						&items[i], 1);
			if (results[i] < 0)
				rc = -1;
		}
	return rc;
}

static const char *redis_errstr(const struct backend_conn *c)
{
	return c->errstr;
}

static int redis_ping(struct backend_conn *c)
{
	redisReply *r = redisCommand(c->ctx, "PING");
	int rc = r && r->type == REDIS_REPLY_STATUS ? 1 : conn_fail(c, "PING", r);

	if (r)
		freeReplyObject(r);
	return rc;
}

const struct backend_ops backend_redis = {
	.open = redis_open,
	.close = redis_close,
	.acquire = redis_acquire,
	.release = redis_release,
	.renew = redis_renew,
	.errstr = redis_errstr,
	.ping = redis_ping,
};
