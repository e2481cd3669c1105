/* SPDX-License-Identifier: MIT */
/*
 * backend_local_conf.h - the settings of the local backend (kernel file
 * locks on this host): the `local` group of the file, read into a struct
 * local_spec by the table of backend_local_conf.c (backend_local_settings,
 * registered in backend.c), and the check of its directory that both the
 * config load and the backend's start make. Frozen after conf_load;
 * reached with conf_group_data(cfg, &backend_local_settings).
 */
#ifndef LOCKSHIM_BACKEND_LOCAL_CONF_H
#define LOCKSHIM_BACKEND_LOCAL_CONF_H

#include <stddef.h>

struct conf_group;

/* The longest dir: room is left for "/" and a file name (at most 196 bytes). */
#define LOCAL_DIR_MAX 3800

struct local_spec {
	char *dir; /* absolute; one lock file per key in it */
};

/* The `local` group: its table, checks and per-lock refusals. */
extern const struct conf_group backend_local_settings;

/*
 * Checks that dir is an absolute path (at most LOCAL_DIR_MAX bytes) of a
 * directory this process can create files in. A missing dir is created
 * (mode 0755; its parent must exist) when create, else only its parent is
 * checked. Returns 0, or -1 with one line in err.
 */
int local_dir_check(const char *dir, int create, char *err, size_t errlen);

#endif
