/* SPDX-License-Identifier: MIT */
/*
 * backend_etcd_conf.h - the settings of the etcd backend: the `etcd` group
 * of the file, read into a struct etcd_spec by the table of
 * backend_etcd_conf.c (backend_etcd_settings, registered in backend.c).
 * The group lives in the core, not in the module backend/etcd/, so that
 * `lockshim settings`, the validation (78) and the docs work where the
 * module or libcurl is not installed. Frozen after conf_load; the module
 * reads it through config_new's settings argument, so this struct is part
 * of the module ABI (BACKEND_MODULE_ABI in backend_module.h).
 */
#ifndef LOCKSHIM_BACKEND_ETCD_CONF_H
#define LOCKSHIM_BACKEND_ETCD_CONF_H

#include "backend_tls_conf.h"

struct conf_group;

struct etcd_spec {
	char **endpoints;        /* "host:port" of etcd members (client URLs: HTTP,
				  * or HTTPS with tls), NULL-terminated; tried in order */
	char *prefix;            /* every lock key lives under it ("/lockshim/") */
	int connect_timeout_ms;  /* bound of a connection's set-up */
	int command_timeout_ms;  /* bound of every request (a wait: its time + this) */
	char *username;          /* etcd user: with password, authenticated */
	char *password;          /* LOCKSHIM_ETCD_PASSWORD, password_file, or the file's */
	char *password_file;     /* the password is its first line */
	struct backend_tls tls;  /* the `tls` group: present, every endpoint is https */
};

/* The `etcd` group: its table, checks and per-lock refusals. */
extern const struct conf_group backend_etcd_settings;

#endif
