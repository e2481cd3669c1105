/* SPDX-License-Identifier: MIT */
/*
 * backend_tls_conf.c - the `tls` group's table and check (backend_tls_conf.h),
 * one for every group that has one: redis.tls, an entry of redis.masters,
 * etcd.tls. Each backend gives the settings to its own TLS engine.
 */
#include "backend_tls_conf.h"

#include <stdio.h>

#include "conf.h"

/* The table: one FIELD per setting, default included. */
#define TLS_FIELD(n, k, lo, hi, ...) FIELD(struct backend_tls, #n, n, k, lo, hi, __VA_ARGS__)
const struct conf_field backend_tls_fields[] = {
	TLS_FIELD(ca_file, F_STR, 1, 0),
	TLS_FIELD(ca_dir, F_STR, 1, 0),
	TLS_FIELD(cert_file, F_STR, 1, 0),
	TLS_FIELD(key_file, F_STR, 1, 0),
	TLS_FIELD(server_name, F_STR, 1, 0),
	TLS_FIELD(verify, F_BOOL, 0, 1, .def = 1),
	{ .name = NULL }
};

/* Checks a tls group once read (its presence, enabled, is set by the
 * table: FL_PRESENT), in the redis or the etcd group. */
int backend_tls_check(struct conf_err *e, const config_setting_t *g, void *member)
{
	const struct backend_tls *t = member;
	const config_setting_t *up = config_setting_parent(g);
	const char *group = up ? config_setting_name(up) : NULL;
	char what[32];

	snprintf(what, sizeof(what), "%s.tls", group ? group : "redis.masters[]");
	if (!!t->cert_file != !!t->key_file)
		return conf_fail(e, g, what, "cert_file and key_file go together");
	return 0;
}
