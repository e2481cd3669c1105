/* SPDX-License-Identifier: MIT */
/*
 * backend_postgres_conf.h - the settings of the postgres backend: the
 * `postgres` group of the file, read into a struct postgres_spec by the
 * table of backend_postgres_conf.c (backend_postgres_settings, registered
 * in backend.c). The group lives in the core (the shim and the command),
 * not in the module backend/postgres/, so that `lockshim settings`, the
 * config's validation (78) and the docs work where the module or libpq is
 * not installed. Frozen after conf_load; the module reads it through
 * config_new's settings argument, so this struct is part of the module
 * ABI (BACKEND_MODULE_ABI in backend_module.h).
 */
#ifndef LOCKSHIM_BACKEND_POSTGRES_CONF_H
#define LOCKSHIM_BACKEND_POSTGRES_CONF_H

struct conf_group;

struct postgres_spec {
	char *conninfo;          /* libpq connection string ("host=... dbname=...") */
	char *password;          /* set in the file, or read from password_file */
	char *password_file;     /* its first line is the password */
	int connect_timeout_ms;  /* bound of a connection's set-up */
	int command_timeout_ms;  /* bound of every command (a wait: its time + this) */
};

/* The `postgres` group: its table, checks and per-lock refusals. */
extern const struct conf_group backend_postgres_settings;

#endif
