/* SPDX-License-Identifier: MIT */
/*
 * backend_postgres_conf.c - the `postgres` group of the file (conninfo,
 * password, password_file, connect_timeout_ms, command_timeout_ms), its
 * check, and the lock settings the postgres backend refuses: when set,
 * retry_max_ms and break_dead_holders; by value, fair with limit > 1.
 * Honoured (postgres.c): lease_ms, on_lost (the session's
 * idle_session_timeout, kept by the renewal's pings), fair, limit, mode,
 * max_hold_ms, on_overrun, linger_ms (default 0 here: conf_no_linger), and
 * handoff_ms, which only caps linger_ms (the server hands a released lock
 * over itself). The password file is read with conf_read_password_file (in
 * secure-execution mode only a trusted one); the module reads
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
	.lock_defaults = conf_no_linger,
	.request_ms = pg_request_ms,
};
