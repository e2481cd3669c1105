/* SPDX-License-Identifier: MIT */
/*
 * backend_etcd_conf.c - the `etcd` group of the file (endpoints, prefix,
 * connect_timeout_ms, command_timeout_ms), its check, and the lock
 * settings the etcd backend refuses. A lock is an etcd key under a lease
 * (renewed by the renewal thread), so lease_ms, on_lost, wait_ms and fair
 * (the recipe is FIFO) keep their meaning; handoff_ms (no barging to
 * allow) is refused when set. linger_ms's built-in value is 0 here
 * (conf_no_linger): a kept lock keeps the queue waiting. username and password (password_file,
 * LOCKSHIM_ETCD_PASSWORD: as redis's, not read in secure-execution mode)
 * authenticate; the tls group (redis's table, backend_tls_conf.h) makes
 * every endpoint https. In the core: backend.c registers the group.
 */
#include "backend_etcd_conf.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "conf.h"
#include "conf_field.h"

#define ETCD_FIELD(n, k, lo, hi, ...) FIELD(struct etcd_spec, #n, n, k, lo, hi, __VA_ARGS__)
static const struct conf_field etcd_fields[] = {
	ETCD_FIELD(endpoints, F_STRS, 0, 0,
		   .def_strs = (const char *const[]){ "127.0.0.1:2379", NULL }),
	ETCD_FIELD(prefix, F_STR, 1, 1024, .def_str = "/lockshim/"),
	ETCD_FIELD(connect_timeout_ms, F_INT, 1, 600000, .def = 2000),
	ETCD_FIELD(command_timeout_ms, F_INT, 1, 600000, .def = 2000),
	ETCD_FIELD(username, F_STR, 1, 0),
	ETCD_FIELD(password, F_STR, 1, 0, .flags = FL_SECRET),
	ETCD_FIELD(password_file, F_STR, 1, 0),
	FIELD(struct etcd_spec, "tls", tls, F_GROUP, 0, 0, .sub = backend_tls_fields,
	      .label = "tls", .check = backend_tls_check, .flags = FL_PRESENT,
	      .off2 = offsetof(struct etcd_spec, tls.enabled), .dflt = "none"),
	{ .name = NULL }
};

/* Completes the password: password_file's first line, overridden by
 * LOCKSHIM_ETCD_PASSWORD (secure_getenv: not in a set-ID program); a user
 * and a password go together. Returns 0, or -1 said with conf_fail. */
static int check_password(struct conf_err *e, const config_setting_t *g, struct etcd_spec *p)
{
	const char *env = secure_getenv("LOCKSHIM_ETCD_PASSWORD");

	if (p->password && p->password_file)
		return conf_fail(e, g, "etcd.password_file", "give password or password_file, not both");
	if (p->password_file && conf_read_password_file(e, g, "etcd.password_file",
							p->password_file, &p->password))
		return -1;
	if (env && *env && conf_str_set(&p->password, env))
		return conf_fail(e, g, "etcd", "out of memory");
	if (p->username && !p->password)
		return conf_fail(e, g, "etcd.username", "needs etcd.password (or password_file, or "
				 "LOCKSHIM_ETCD_PASSWORD) as well");
	if (p->password && !p->username)
		return conf_fail(e, g, "etcd.password", "needs etcd.username: etcd authenticates a "
				 "user by name");
	return 0;
}

/* The group's check: endpoints are host:port (no scheme: the tls group
 * says https), and the password. */
static int etcd_check(struct conf_err *e, const config_setting_t *g, void *data)
{
	struct etcd_spec *p = data;
	char *const *v = p->endpoints;

	if (check_password(e, g, p))
		return -1;
	if (!v || !v[0])
		return conf_fail(e, g, "etcd.endpoints", "is empty");
	for (; *v; v++) {
		const char *colon = strrchr(*v, ':');
		char *end;
		long port;

		if (strstr(*v, "://"))
			return conf_fail(e, g, "etcd.endpoints", "\"%s\": give host:port, without "
					 "a scheme (a tls group makes every endpoint https)", *v);
		if (!colon || colon == *v)
			return conf_fail(e, g, "etcd.endpoints", "\"%s\" is not host:port", *v);
		port = strtol(colon + 1, &end, 10);
		if (*end || port < 1 || port > 65535)
			return conf_fail(e, g, "etcd.endpoints",
					 "\"%s\": port out of range (1..65535)", *v);
	}
	return 0;
}

/* The settings an etcd lock cannot honour, refused when the file sets them. */
static const struct conf_refusal unavailable[] = {
	{ "handoff_ms", "waiters queue by create revision: a release lets the next one in, "
	  "nobody barges" },
	{ NULL, NULL }
};

/* Every value is built for this backend: nothing refused by value. */
static const struct conf_refusal unbuilt[] = {
	{ NULL, NULL }
};

/* The longest request: a command (a wait adds its own time). */
static long long etcd_request_ms(const void *data)
{
	return ((const struct etcd_spec *)data)->command_timeout_ms;
}

const struct conf_group backend_etcd_settings = {
	.name = "etcd",
	.fields = etcd_fields,
	.size = sizeof(struct etcd_spec),
	.check = etcd_check,
	.unavailable = unavailable,
	.unbuilt = unbuilt,
	.lock_defaults = conf_no_linger,
	.request_ms = etcd_request_ms,
};
