/* SPDX-License-Identifier: MIT */
/*
 * backend_redis_conf.c - the `redis` group of the file: its table (with
 * tls and the entries of masters), the checks that complete it (password
 * files, LOCKSHIM_REDIS_PASSWORD, one topology: a server, sentinels,
 * cluster or masters) and the locks it refuses. In secure-execution mode
 * (conf_secure) the variable is not read and a password file is read only
 * when conf_open_trusted accepts it. It is the redis backend's
 * struct conf_group, backend_redis_settings, which backend.c registers:
 * conf.c never names it. See backend_redis_conf.h for the struct.
 */
#include "backend_redis_conf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conf.h"
#include "conf_field.h"

/* ---- the tables --------------------------------------------------------- */

/* The tls group of the redis group and of a master: its presence is
 * tls.enabled. */
#define TLS_GROUP(...)                                                          \
	FIELD(struct redis_spec, "tls", tls, F_GROUP, 0, 0, .sub = backend_tls_fields,  \
	      .label = "tls", .check = backend_tls_check, .flags = FL_PRESENT,         \
	      .off2 = offsetof(struct redis_spec, tls.enabled), __VA_ARGS__)

#define REDIS_FIELD(n, k, lo, hi, ...) FIELD(struct redis_spec, #n, n, k, lo, hi, __VA_ARGS__)
/* An entry of redis.masters: one server. What it leaves unset, it takes
 * from the redis group (master_inherit); -1 and NULL mark "not set". */
static const struct conf_field master_fields[] = {
	REDIS_FIELD(host, F_STR, 1, 0),
	REDIS_FIELD(port, F_INT, 1, 65535, .def = 6379),
	REDIS_FIELD(socket, F_STR, 1, 0),
	REDIS_FIELD(password, F_STR, 1, 0, .flags = FL_SECRET, .dflt = "=redis.password"),
	REDIS_FIELD(username, F_STR, 1, 0, .dflt = "=redis.username"),
	REDIS_FIELD(password_file, F_STR, 1, 0),
	REDIS_FIELD(db, F_INT, 0, INT_MAX, .def = -1, .dflt = "=redis.db"),
	TLS_GROUP(.dflt = "=redis.tls"),
	{ .name = NULL }
};

static const struct conf_field redis_fields[] = {
	REDIS_FIELD(host, F_STR, 1, 0, .def_str = "127.0.0.1"),
	REDIS_FIELD(port, F_INT, 1, 65535, .def = 6379),
	REDIS_FIELD(socket, F_STR, 1, 0),
	REDIS_FIELD(password, F_STR, 1, 0, .flags = FL_SECRET),
	REDIS_FIELD(username, F_STR, 1, 0),
	REDIS_FIELD(db, F_INT, 0, INT_MAX),
	REDIS_FIELD(connect_timeout_ms, F_INT, 1, 600000, .def = 500),
	REDIS_FIELD(command_timeout_ms, F_INT, 1, 600000, .def = 500),
	REDIS_FIELD(sentinels, F_STRS, 0, 0),
	REDIS_FIELD(master_name, F_STR, 1, 0),
	REDIS_FIELD(sentinel_username, F_STR, 1, 0),
	REDIS_FIELD(sentinel_password, F_STR, 1, 0, .flags = FL_SECRET),
	REDIS_FIELD(password_file, F_STR, 1, 0),
	REDIS_FIELD(wait_replicas, F_INT, 0, 64),
	REDIS_FIELD(wait_replicas_ms, F_INT, 1, 600000, .def = 100),
	TLS_GROUP(.dflt = "none"),
	REDIS_FIELD(cluster, F_STRS, 0, 0),
	FIELD(struct redis_spec, "masters", masters, F_SERVERS, 0, 0, .sub = master_fields,
	      .label = "master", .elem = sizeof(struct redis_spec),
	      .off2 = offsetof(struct redis_spec, nmasters)),
	{ .name = NULL }
};

/* ---- the checks --------------------------------------------------------- */

/* Checks the "host:port" entries of the list v, the setting what (at
 * least one). Returns 0, or -1 (said). */
static int check_endpoints(struct conf_err *e, const config_setting_t *g, const char *what,
			   char *const *v)
{
	if (!v[0])
		return conf_fail(e, g, what, "is empty");
	for (; *v; v++) {
		const char *colon = strrchr(*v, ':');
		char *end;
		long port;

		if (!colon || colon == *v)
			return conf_fail(e, g, what, "\"%s\" is not host:port", *v);
		port = strtol(colon + 1, &end, 10);
		if (*end || port < 1 || port > 65535)
			return conf_fail(e, g, what, "\"%s\": port out of range (1..65535)", *v);
	}
	return 0;
}

/* Fails when g sets one of the settings (NULL-terminated) besides what,
 * which replaces them. Returns 0, or -1 (said). */
static int check_replaces(struct conf_err *e, const config_setting_t *g, const char *what,
			  const char *const *settings)
{
	for (; *settings; settings++)
		if (config_setting_get_member(g, *settings))
			return conf_fail(e, g, what, "replaces %s: give one of them", *settings);
	return 0;
}

/* Copies what the redis.masters entry m leaves unset from r, the redis
 * group: password, username, db, TLS and the timeouts (the port's default
 * is master_fields'). Returns 0, or
 * -1 (said). */
static int master_inherit(struct conf_err *e, const config_setting_t *g, struct redis_spec *m,
			  int i, const struct redis_spec *r)
{
	const struct conf_field *password = conf_field_find(master_fields, "password");
	const struct conf_field *username = conf_field_find(master_fields, "username");
	char what[48];

	snprintf(what, sizeof(what), "redis.masters[%d]", i);
	if (!m->host == !m->socket)
		return conf_fail(e, g, what, "give host (and port) or socket");
	if (m->password && m->password_file)
		return conf_fail(e, g, what, "give password or password_file, not both");
	if (m->password_file && conf_read_password_file(e, g, "redis.password_file",
							m->password_file, &m->password))
		return -1;
	if (m->db < 0)
		m->db = r->db;
	if (!m->password && ((r->password && conf_field_copy(password, m, r)) ||
			     (r->username && conf_field_copy(username, m, r))))
		return conf_fail(e, g, what, "out of memory");
	if (m->username && !m->password)
		return conf_fail(e, g, what, "username needs a password as well");
	if (!m->tls.enabled && r->tls.enabled) {
		if (conf_fields_copy(backend_tls_fields, &m->tls, &r->tls))
			return conf_fail(e, g, what, "out of memory");
		m->tls.enabled = 1;
	}
	if (m->tls.enabled && m->socket)
		return conf_fail(e, g, what, "TLS is for TCP connections, not the unix socket");
	m->connect_timeout_ms = r->connect_timeout_ms;
	m->command_timeout_ms = r->command_timeout_ms;
	m->wait_replicas_ms = r->wait_replicas_ms;
	return 0;
}

/* Checks the topology settings of r: sentinels, cluster or masters, each
 * instead of host, port and socket. Returns 0, or -1 (said). */
static int check_topology(struct conf_err *e, const config_setting_t *g, struct redis_spec *r)
{
	static const char *const single[] = { "host", "port", "socket", NULL };
	static const char *const not_cluster[] = { "host", "port", "socket", "sentinels",
						   "masters", NULL };
	static const char *const not_masters[] = { "host", "port", "socket", "sentinels",
						   "wait_replicas", NULL };

	if (r->sentinels) {
		if (check_endpoints(e, g, "redis.sentinels", r->sentinels))
			return -1;
		if (!r->master_name)
			return conf_fail(e, g, "redis.master_name", "is required with sentinels");
		if (check_replaces(e, g, "redis.sentinels", single))
			return -1;
	} else if (r->master_name || r->sentinel_username || r->sentinel_password) {
		return conf_fail(e, g, "redis.master_name", "master_name and the sentinel_* settings "
			    "need sentinels");
	}
	if (r->cluster) {
		if (check_endpoints(e, g, "redis.cluster", r->cluster) ||
		    check_replaces(e, g, "redis.cluster", not_cluster))
			return -1;
		if (r->db)
			return conf_fail(e, g, "redis.db", "a Redis Cluster has database 0 only");
	}
	if (r->masters) {
		if (r->nmasters < 3)
			return conf_fail(e, g, "redis.masters", "has %d entr%s: Redlock needs 3 or more "
				    "independent masters", r->nmasters, r->nmasters == 1 ? "y" : "ies");
		if (check_replaces(e, g, "redis.masters", not_masters))
			return -1;
		for (int i = 0; i < r->nmasters; i++)
			if (master_inherit(e, g, &r->masters[i], i, r))
				return -1;
	}
	return 0;
}

/* The group's check (struct conf_group): passwords, then the topology. */
static int redis_check(struct conf_err *e, const config_setting_t *g, void *data)
{
	struct redis_spec *r = data;
	const char *env = secure_getenv("LOCKSHIM_REDIS_PASSWORD");

	if (r->password && r->password_file)
		return conf_fail(e, g, "redis.password_file", "give password or password_file, not both");
	if (r->password_file && conf_read_password_file(e, g, "redis.password_file",
							r->password_file, &r->password))
		return -1;
	if (env && *env && conf_str_set(&r->password, env))
		return conf_fail(e, g, "redis", "out of memory");
	if (r->username && !r->password)
		return conf_fail(e, g, "redis.username", "needs redis.password as well");
	if (r->sentinel_username && !r->sentinel_password)
		return conf_fail(e, g, "redis.sentinel_username", "needs redis.sentinel_password as well");
	if (check_topology(e, g, r))
		return -1;
	if (r->tls.enabled && r->socket)
		return conf_fail(e, g, "redis.tls", "TLS is for TCP connections, not the unix socket");
	return 0;
}


/* Refuses what the topology cannot promise (struct conf_group). */
static int redis_check_lock(struct conf_err *e, const config_setting_t *lg, const char *where,
			    const struct lock_spec *l, const struct conf *cfg, const void *data)
{
	const struct redis_spec *r = data;

	if (l->fair && r->masters)
		return conf_fail(e, lg, where, "fair = true is not available with redis.masters: "
				 "the masters order their queues alike, but a free key can still "
				 "go to a caller not queued yet, so strict arrival order is not "
				 "promised");
	if (l->limit > 1 && r->masters)
		return conf_fail(e, lg, where, "limit = %d is not available with redis.masters "
				 "(Redlock): each master would admit %d holders and a holder needs "
				 "only a quorum of them, so about 1.5 x %d could hold at once with 3 "
				 "masters; use one server, Sentinel or Cluster for a semaphore",
				 l->limit, l->limit, l->limit);
	if (r->cluster && strpbrk(cfg->ns, "{}"))
		return conf_fail(e, lg, "namespace", "\"%s\": braces in the namespace would change "
				 "the lock's Redis Cluster hash tag", cfg->ns);
	return 0;
}

/* A Redis Cluster puts a lock's keys in one slot by a hash tag. */
static int redis_hash_tag(const void *data)
{
	return ((const struct redis_spec *)data)->cluster != NULL;
}

static long long redis_request_ms(const void *data)
{
	return ((const struct redis_spec *)data)->command_timeout_ms;
}

const struct conf_group backend_redis_settings = {
	.name = "redis",
	.fields = redis_fields,
	.size = sizeof(struct redis_spec),
	.check = redis_check,
	.check_lock = redis_check_lock,
	.hash_tag = redis_hash_tag,
	.request_ms = redis_request_ms,
};
