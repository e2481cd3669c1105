/* SPDX-License-Identifier: MIT */
/*
 * selftest.c - the lock server's self-test for `lockshim check` (see
 * selftest.h).
 *
 * Every step goes through the backend's table, so it sends byte for byte
 * what a guarded call sends. The probe key holds a token of the check's
 * own and is deleted at the end, and so is its fencing counter (with DEL on
 * the one server, or on each node of a topology of several); a step that fails is explained from
 * Redis's error text or the transport's (TLS's: unknown CA, name
 * mismatch, expiry).
 */
#include "selftest.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "backend_redis.h"
#include "backend_redis_conf.h"
#include "conf.h"

#define PROBE_LEASE_MS 10000

struct cause {
	const char *says, *means;
};

/* With redis.tls, looked up first: a TLS-only port is then no suspect. */
static const struct cause tls_causes[] = {
	{ "(unknown CA)", "the server's certificate is not signed by a CA of redis.tls.ca_file "
			  "or ca_dir (without them: of the system's CA store)" },
	{ "name mismatch", "the server's certificate does not hold the name connected to: set "
			   "redis.tls.server_name to a name it holds" },
	{ "certificate expired", "the server's certificate must be renewed (or this machine's "
				 "clock is wrong)" },
	{ "Server closed the connection", "the server closed the TLS connection: see its log" },
	{ "Connection reset", "the server reset the TLS connection: see its log" },
	{ "timed out", "no answer within redis.command_timeout_ms: a frozen server or a "
		       "filtered port?" },
};

/* Returns the likely cause of a failure whose text is err, or NULL; tls:
 * the config has redis.tls. */
static const char *cause(const char *err, int tls)
{
	static const struct cause causes[] = {
		{ "NOPERM", "the ACL user may not run a command lockshim sends (it needs EVAL, "
			    "EVALSHA, BLPOP and DEL, and what its scripts run: GET, SET, "
			    "PEXPIRE, HINCRBY, HGET, HSET, HDEL and the sorted-set and list "
			    "commands, on the keys under the namespace)" },
		{ "NOAUTH", "the server wants a password: set redis.password" },
		{ "WRONGPASS", "wrong redis.username or redis.password" },
		{ "MOVED", "this server is a Redis Cluster node: list the cluster's nodes in "
			   "redis.cluster instead of host and port" },
		{ "ASK ", "this server is a Redis Cluster node: list the cluster's nodes in "
			  "redis.cluster instead of host and port" },
		{ "CLUSTERDOWN", "the Redis Cluster is down (slots not served, or a failover "
				 "in progress)" },
		{ "CROSSSLOT", "this server is a Redis Cluster node: list the cluster's nodes "
			       "in redis.cluster instead of host and port" },
		{ "READONLY", "this server is a read-only replica: point lockshim at the primary" },
		{ "unknown command", "the server lacks a command lockshim sends (Redis 2.6 or "
				     "later is needed, 7.0 or later recommended)" },
		{ "timed out", "no answer within redis.command_timeout_ms: a frozen server, a "
			       "filtered port, or a TLS-only port waiting for a handshake?" },
	};

	/* the sentinels' replies, each already explained by backend_sentinel.c */
	if (strstr(err, "through the sentinels:"))
		return NULL;
	for (size_t i = 0; tls && i < sizeof(tls_causes) / sizeof(tls_causes[0]); i++)
		if (strstr(err, tls_causes[i].says))
			return tls_causes[i].means;
	for (size_t i = 0; i < sizeof(causes) / sizeof(causes[0]); i++)
		if (strstr(err, causes[i].says))
			return causes[i].means;
	return tls ? NULL : backend_plain_tls_hint(err);
}

static int failed(char *msg, size_t len, const char *step, const char *err)
{
	snprintf(msg, len, "%s: %s", step, err);
	return -1;
}

/* Runs the probe steps on c, a connection of ops, with key. Returns 0, or
 * -1 with the failed step in msg. */
static int probe(const struct backend_ops *ops, struct backend_conn *c, const char *key,
		 size_t klen, char *msg, size_t len)
{
	struct backend_item it = { .key = key, .klen = klen };
	char val[64], holder[BACKEND_VAL_MAX];
	long long wait = 0, fence = 0;
	size_t hlen;
	int rc, renewed = 0;

	it.val = val;
	it.vlen = (size_t)snprintf(val, sizeof(val), "lockshim-check-%d", (int)getpid());
	it.lease_ms = PROBE_LEASE_MS;
	it.waiter_ttl_ms = 1000;
	it.handoff_us = 500;
	if ((rc = ops->acquire(c, &it, &wait, holder, &hlen, &fence)) != BACKEND_OK)
		goto fail_acquire;
	if (ops->renew && ((rc = ops->renew(c, 1, &it, &renewed)) != BACKEND_OK ||
			   renewed != BACKEND_OK))
		return failed(msg, len, "renew (EVALSHA)", rc != BACKEND_OK ? ops->errstr(c) :
			      "the probe key was not ours");
	it.waiting = 1;
	if ((rc = ops->acquire(c, &it, &wait, holder, &hlen, &fence)) != BACKEND_OK)
		goto fail_acquire;
	if (ops->wait(c, &it, 10, &fence) == BACKEND_ERR)
		return failed(msg, len, "wait for a wake-up (BLPOP)", ops->errstr(c));
	if ((rc = ops->release(c, &it, 0)) != BACKEND_OK)
		return failed(msg, len, "release (EVALSHA)", rc == BACKEND_ERR ? ops->errstr(c) :
			      "the probe key was not ours");
	if (ops->leave(c, &it, 0) == BACKEND_ERR)
		return failed(msg, len, "leave (EVALSHA)", ops->errstr(c));
	return 0;
fail_acquire:
	return failed(msg, len, it.waiting ? "acquire through the queue (EVALSHA)" :
		      "acquire (EVALSHA)", rc == BACKEND_ERR ? ops->errstr(c) :
		      "the probe key is held by someone else");
}

/* Writes the probe key into key (KEY_BUF_SIZE bytes): under ns, in the
 * cluster layout (a hash tag: tag when given, else the key's own), with
 * this host and pid. Returns its length. */
static size_t probe_key(char *key, const char *ns, const char *tag)
{
	char host[64] = "localhost";

	gethostname(host, sizeof(host) - 1);
	return (size_t)snprintf(key, KEY_BUF_SIZE, "%s:{%s%slockshim-check:%s:%d}", ns, tag,
				*tag ? "}" : "", host, (int)getpid());
}

/* The probe key of a leaseless backend (local lock files, never removed):
 * one per host, reused by every check. Returns its length. */
static size_t probe_key_kept(char *key, const char *ns)
{
	char host[64] = "localhost";

	gethostname(host, sizeof(host) - 1);
	return (size_t)snprintf(key, KEY_BUF_SIZE, "%s:lockshim-check:%s", ns, host);
}

/* Deletes the fencing counter of the probe key key[0..klen) on c, a
 * backend_redis connection (a cluster node that does not serve it answers
 * MOVED: nothing to delete there). */
static void drop_counter(struct backend_conn *c, const char *key, size_t klen)
{
	char f[KEY_BUF_SIZE + 3];
	const char *argv[2] = { "DEL", f };
	redisReply *r;

	snprintf(f, sizeof(f), "%.*s:f", (int)klen, key);
	if ((r = backend_redis_command(c, 2, argv)) != NULL)
		freeReplyObject(r);
}

/* Runs the probe through the topology (ops, bc), then on each of its
 * nodes when it has several. Returns 0 with what was done in msg, or -1
 * with the failed step in msg. */
static int probe_all(const struct backend_ops *ops, const struct backend_config *bc,
		     const char *ns, char *msg, size_t len)
{
	char key[KEY_BUF_SIZE], top[KEY_BUF_SIZE], err[256], name[160], tag[16];
	size_t klen = probe_key(key, ns, ""), tlen = probe_key(top, ns, ""), k;
	struct backend_conn *c;
	int rc, n;

	if (ops->leaseless)
		klen = probe_key_kept(key, ns);
	if (!(c = ops->open(bc, err, sizeof(err))))
		return failed(msg, len, "connect", err);
	n = ops->node_count ? ops->node_count(bc) : 0;
	rc = probe(ops, c, key, klen, msg, len);
	if (!n && ops->settings == &backend_redis_settings) /* c is backend_redis's */
		drop_counter(c, key, klen);
	ops->close(c);
	if (rc != 0)
		return rc;
	k = (size_t)snprintf(msg, len, "acquire, renew, queue, wait, release and leave on "
			     "%.*s", (int)klen, key);
	if (ops->describe && k + 4 < len) {
		k += (size_t)snprintf(msg + k, len - k, " at ");
		ops->describe(bc, msg + k, len - k);
	}
	for (int i = 0; i < n; i++) {
		char step[200];

		c = ops->node_open(bc, i, name, sizeof(name), tag, sizeof(tag), err, sizeof(err));
		snprintf(step, sizeof(step), "node %s: connect", name);
		if (!c)
			return failed(msg, len, step, err);
		klen = probe_key(key, ns, tag);
		rc = probe(&backend_redis, c, key, klen, err, sizeof(err));
		drop_counter(c, key, klen);
		drop_counter(c, top, tlen); /* the topology's probe's, wherever it is */
		backend_redis.close(c);
		if (rc != 0) {
			snprintf(step, sizeof(step), "node %s", name);
			return failed(msg, len, step, err);
		}
		k = strlen(msg);
		if (k + 2 < len)
			snprintf(msg + k, len - k, "%s %s", i ? "," : "; each node too:", name);
	}
	return 0;
}

int selftest_run(const struct conf *cfg, char *msg, size_t len)
{
	const struct redis_spec *r = conf_group_data(cfg, &backend_redis_settings);
	struct backend b;
	const char *why;
	size_t n;
	int rc;

	if ((rc = backend_init(&b, cfg, msg, len)) != 0)
		return rc;
	rc = probe_all(b.ops, b.cfg, cfg->ns, msg, len);
	backend_release(&b);
	/* a backend's own error may say it already (backend_plain_tls_hint) */
	if (rc != 0 && !strstr(msg, "likely cause:") &&
	    (why = cause(msg, r && r->tls.enabled)) && (n = strlen(msg)) < len)
		snprintf(msg + n, len - n, "; likely cause: %s", why);
	return rc;
}
