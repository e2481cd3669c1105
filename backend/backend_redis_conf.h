/* SPDX-License-Identifier: MIT */
/*
 * backend_redis_conf.h - the settings of the redis backend: the `redis`
 * group of the file, read into a struct redis_spec by the table of
 * backend_redis_conf.c (backend_redis_settings, registered in backend.c).
 * Its topologies share it: one server (backend_redis.c), Sentinel
 * (redis.sentinels), Cluster (redis.cluster) and Redlock (redis.masters).
 * Frozen after conf_load; reached with
 * conf_group_data(cfg, &backend_redis_settings).
 */
#ifndef LOCKSHIM_BACKEND_REDIS_CONF_H
#define LOCKSHIM_BACKEND_REDIS_CONF_H

#include "backend_tls_conf.h"

struct conf_group;

struct redis_spec {
	char *host;
	int port;
	char *socket;
	char *password;          /* LOCKSHIM_REDIS_PASSWORD, password_file, or the file's */
	char *username;
	int db;
	int connect_timeout_ms;
	int command_timeout_ms;
	char **sentinels;        /* "host:port" of Redis Sentinels, NULL-terminated; NULL: none */
	char *master_name;       /* required with sentinels */
	char *sentinel_username;
	char *sentinel_password;
	char *password_file;     /* the password is its first line */
	int wait_replicas;       /* WAIT for this many replicas after acquires and renewals */
	int wait_replicas_ms;
	struct backend_tls tls;  /* the `tls` group (backend_tls_conf.h) */
	char **cluster;          /* "host:port" seed nodes of a Redis Cluster, NULL-terminated */
	struct redis_spec *masters; /* Redlock: nmasters independent masters, each a whole
				     * single-server spec (unset settings taken from this one) */
	int nmasters;
};

/* The `redis` group: its table, checks and per-lock refusals. */
extern const struct conf_group backend_redis_settings;

#endif
