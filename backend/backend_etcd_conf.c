/* SPDX-License-Identifier: MIT */
/*
 * backend_etcd_conf.c - the `etcd` group of the file (endpoints, prefix,
 * connect_timeout_ms, command_timeout_ms), its check, and the lock
 * settings the etcd backend refuses. A lock is an etcd key under a lease
 * (renewed by the renewal thread), so lease_ms, on_lost, wait_ms and fair
 * (the recipe is FIFO) keep their meaning; handoff_ms (no barging to
 * allow) is refused when set, and what is not built yet (limit > 1, mode
 * "shared", linger_ms > 0) by value. linger_ms's built-in value is 0 here
 * (etcd_lock_defaults). User/password and TLS are not built yet: the group
 * has no such settings, so the file cannot ask for them. This file is in
 * the core: backend.c registers backend_etcd_settings.
 */
#include "backend_etcd_conf.h"

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
	{ .name = NULL }
};

/* The group's check: endpoints are host:port (no scheme: plain HTTP). */
static int etcd_check(struct conf_err *e, const config_setting_t *g, void *data)
{
	struct etcd_spec *p = data;
	char *const *v = p->endpoints;

	if (!v || !v[0])
		return conf_fail(e, g, "etcd.endpoints", "is empty");
	for (; *v; v++) {
		const char *colon = strrchr(*v, ':');
		char *end;
		long port;

		if (strstr(*v, "://"))
			return conf_fail(e, g, "etcd.endpoints", "\"%s\": give host:port, without "
					 "a scheme (plain HTTP; TLS is not built yet)", *v);
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

/* The values not built yet for this backend, refused when a lock asks. */
static const struct conf_refusal unbuilt[] = {
	{ "limit", "limit > 1 (a semaphore)" },
	{ "mode", "mode = \"shared\"" },
	{ "linger_ms", "linger_ms > 0 (its default is 0 with this backend)" },
	{ NULL, NULL }
};

/* Refuses what the etcd backend cannot honour or does not have yet
 * (conf_refuse_lock). Returns 0, or -1 said with conf_fail. */
static int etcd_check_lock(struct conf_err *e, const config_setting_t *lg, const char *where,
			   const struct lock_spec *l, const struct conf *cfg, const void *data)
{
	(void)cfg;
	(void)data;
	return conf_refuse_lock(e, lg, where, l, "etcd", unavailable, unbuilt);
}

/* No lock is kept between calls in this step. */
static void etcd_lock_defaults(struct lock_spec *d)
{
	d->linger_ms = 0;
}

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
	.check_lock = etcd_check_lock,
	.check_defaults = etcd_check_lock,
	.lock_defaults = etcd_lock_defaults,
	.request_ms = etcd_request_ms,
};
