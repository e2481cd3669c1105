/* SPDX-License-Identifier: MIT */
/*
 * backend_postgres_conf.c - the `postgres` group of the file (conninfo,
 * password, password_file, connect_timeout_ms, command_timeout_ms), its
 * check, and the lock settings the postgres backend refuses. A session
 * advisory lock's lease is its session's idle_session_timeout, kept by the
 * renewal thread's pings (lease_ms, on_lost). Refused when the file sets
 * them, in a lock or in `defaults`: retry_max_ms, break_dead_holders,
 * handoff_ms, on_overrun; by value: linger_ms > 0, max_hold_ms, and
 * fair with limit > 1 (fair, limit and mode "shared" are honoured:
 * postgres.c). linger_ms's built-in value is 0 here
 * (pg_lock_defaults). The password file is read with conf_read_password_file
 * (in secure-execution mode only a trusted one, as redis.password_file); the module reads
 * LOCKSHIM_POSTGRES_PASSWORD itself (secure_getenv). This file is in the
 * core: backend.c registers backend_postgres_settings, conf.c never names it.
 */
#include "backend_postgres_conf.h"

#include <stdio.h>

#include "conf.h"
#include "conf_field.h"

#define PG_FIELD(n, k, lo, hi, ...) FIELD(struct postgres_spec, #n, n, k, lo, hi, __VA_ARGS__)
static const struct conf_field pg_fields[] = {
	PG_FIELD(conninfo, F_STR, 0, 4096, .def_str = ""),
	PG_FIELD(password, F_STR, 1, 0, .flags = FL_SECRET),
	PG_FIELD(password_file, F_STR, 1, 0),
	PG_FIELD(connect_timeout_ms, F_INT, 1, 600000, .def = 2000),
	PG_FIELD(command_timeout_ms, F_INT, 1, 600000, .def = 2000),
	{ .name = NULL }
};

/* The group's check: one password source at most, the file read. */
static int pg_check(struct conf_err *e, const config_setting_t *g, void *data)
{
	struct postgres_spec *p = data;

	if (p->password && p->password_file)
		return conf_fail(e, config_setting_get_member(g, "password_file"),
				 "postgres.password_file", "give password or password_file, not both");
	if (p->password_file &&
	    conf_read_password_file(e, config_setting_get_member(g, "password_file"),
				    "postgres.password_file", p->password_file, &p->password))
		return -1;
	return 0;
}

/* The settings a session advisory lock cannot honour, refused when the
 * file sets them. */
static const struct conf_refusal unavailable[] = {
	{ "retry_max_ms", "a waiter blocks in the server, which wakes it at the release" },
	{ "break_dead_holders", "the server frees a dead holder's lock itself, when its "
	  "connection closes" },
	{ "handoff_ms", "the server hands the lock to the first waiter at the release" },
	{ "on_overrun", "max_hold_ms is not built yet for this backend" },
	{ NULL, NULL }
};

/* The values not built yet for this backend, refused when a lock asks. */
static const struct conf_refusal unbuilt[] = {
	{ "linger_ms", "linger_ms > 0 (its default is 0 with this backend)" },
	{ "max_hold_ms", "max_hold_ms" },
	{ NULL, NULL }
};

/* Refuses fair with a limit: a permit's waiters poll. Returns 0, or -1
 * said with conf_fail. */
static int pg_check_lock(struct conf_err *e, const config_setting_t *lg, const char *where,
			 const struct lock_spec *l, const struct conf *cfg, const void *data)
{
	char what[64];

	(void)cfg;
	(void)data;
	if (!l->fair || l->limit <= 1)
		return 0;
	snprintf(what, sizeof(what), "%s.fair", where);
	return conf_fail(e, lg ? config_setting_get_member(lg, "fair") : NULL, what,
			 "fair = true with limit > 1 is not built yet for backend \"postgres\" (a "
			 "permit's waiters poll: their order is not kept)");
}

/* The longest request: a command (a wait adds its own time). */
static long long pg_request_ms(const void *data)
{
	return ((const struct postgres_spec *)data)->command_timeout_ms;
}

const struct conf_group backend_postgres_settings = {
	.name = "postgres",
	.fields = pg_fields,
	.size = sizeof(struct postgres_spec),
	.check = pg_check,
	.check_lock = pg_check_lock,
	.check_defaults = pg_check_lock,
	.unavailable = unavailable,
	.unbuilt = unbuilt,
	.lock_defaults = conf_no_linger,
	.request_ms = pg_request_ms,
};
