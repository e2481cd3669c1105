/* SPDX-License-Identifier: MIT */
/*
 * backend_zookeeper_conf.h - the settings of the zookeeper backend: the
 * `zookeeper` group of the file, read into a struct zookeeper_spec by the
 * table of backend_zookeeper_conf.c (backend_zookeeper_settings,
 * registered in backend.c). The group lives in the core, not in the
 * module backend/zookeeper/, so that `lockshim settings`, validation (78)
 * and the docs work where the module or libzookeeper-mt is not installed.
 * Frozen after conf_load; the module reads it through config_new's
 * settings argument, so this struct is part of the module ABI
 * (BACKEND_MODULE_ABI in backend_module.h).
 */
#ifndef LOCKSHIM_BACKEND_ZOOKEEPER_CONF_H
#define LOCKSHIM_BACKEND_ZOOKEEPER_CONF_H

struct conf_group;

struct zookeeper_spec {
	char *hosts;             /* "h1:2181,h2:2181" (the client's connect string) */
	char *root;              /* the znode under which each key is a child */
	int session_timeout_ms;  /* the session (the process's lease) */
	int connect_timeout_ms;  /* bound of the session's set-up */
	int command_timeout_ms;  /* bound of every request (a wait: its time) */
};

/* The `zookeeper` group: its table, checks and per-lock refusals. */
extern const struct conf_group backend_zookeeper_settings;

#endif
