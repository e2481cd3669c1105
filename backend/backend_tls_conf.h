/* SPDX-License-Identifier: MIT */
/*
 * backend_tls_conf.h - the `tls` group of a backend's settings (redis.tls,
 * an entry of redis.masters, etcd.tls): one struct and one table, so the
 * settings have the same names, defaults and check wherever they appear,
 * and `lockshim settings` and lockshim.cfg(5) list them once (TLS). Each
 * backend gives them to its own TLS engine: mbedTLS for Redis (net_tls.c),
 * libcurl's OpenSSL for etcd. The table is backend_tls_conf.c's.
 */
#ifndef LOCKSHIM_BACKEND_TLS_CONF_H
#define LOCKSHIM_BACKEND_TLS_CONF_H

#include "conf_field.h"

/* A `tls` group: present (enabled) makes every connection TLS. */
struct backend_tls {
	int enabled;
	char *ca_file;           /* NULL with ca_dir NULL: the system's CA store */
	char *ca_dir;
	char *cert_file;         /* client certificate, with key_file */
	char *key_file;
	char *server_name;       /* SNI and the name verified; NULL: the host */
	int verify;              /* verify the certificate and the name */
};

/* The settings of a tls group, for a FIELD of kind F_GROUP (.sub). */
extern const struct conf_field backend_tls_fields[];

/* That FIELD's .check: cert_file and key_file go together. Returns 0, or
 * -1 said with conf_fail. */
int backend_tls_check(struct conf_err *e, const config_setting_t *g, void *member);

#endif
