/* SPDX-License-Identifier: MIT */
/*
 * backend_local_conf.c - the `local` group of the file (its table: dir),
 * the check of that directory, and the lock settings the local backend
 * refuses. A kernel file lock has no lease, no server-side queue and no
 * hand-over: the settings that tune those (lease_ms, on_lost,
 * retry_max_ms, break_dead_holders, handoff_ms) cannot be honoured and are
 * refused when the file sets them, in a lock or in `defaults` (fair,
 * limit, mode "shared", linger_ms and max_hold_ms/on_overrun are built:
 * byte-range locks, tickets, backend_local.c; the renewal thread,
 * shim/renew.c). file_mode is the
 * mode lock files get. linger_ms's built-in value is 0 here
 * (conf_no_linger): a lock kept between calls needs the renewal
 * thread, which only a lock that asks for it starts. It is the local
 * backend's struct conf_group, backend_local_settings, which backend.c
 * registers: conf.c never names it.
 */
#include "backend_local_conf.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "conf.h"
#include "conf_field.h"

#define LOCAL_FIELD(n, k, lo, hi, ...) FIELD(struct local_spec, #n, n, k, lo, hi, __VA_ARGS__)
static const struct conf_field local_fields[] = {
	LOCAL_FIELD(dir, F_STR, 1, LOCAL_DIR_MAX, .def_str = "/run/lockshim"),
	LOCAL_FIELD(file_mode, F_STR, 4, 4, .def_str = "0644"),
	{ .name = NULL }
};

/* Checks that the directory dir is on a local filesystem (its waiters are
 * woken by inotify, which sees only this host's changes). Returns 0, or
 * -1 with one line in err. */
static int dir_local(const char *dir, char *err, size_t errlen)
{
	struct statfs fs;
	const char *remote;

	if (statfs(dir, &fs) != 0) {
		snprintf(err, errlen, "\"%s\": statfs: %s", dir, strerror(errno));
		return -1;
	}
	if ((remote = local_fs_remote((long)fs.f_type)) != NULL) {
		snprintf(err, errlen, "\"%s\" is on a %s filesystem (type 0x%lx): a waiter "
			 "would not see another host's release, and its locks would be a server's "
			 "(use a local directory, or another backend)", dir, remote,
			 (unsigned long)fs.f_type);
		return -1;
	}
	return 0;
}

/* Checks that the existing directory dir can take new files. Returns 0, or
 * -1 with one line in err. */
static int dir_usable(const char *dir, char *err, size_t errlen)
{
	struct stat st;

	if (stat(dir, &st) != 0) {
		snprintf(err, errlen, "\"%s\": %s", dir, strerror(errno));
		return -1;
	}
	if (!S_ISDIR(st.st_mode)) {
		snprintf(err, errlen, "\"%s\" is not a directory", dir);
		return -1;
	}
	if (access(dir, W_OK | X_OK) != 0) {
		snprintf(err, errlen, "\"%s\" is not writable by this process (uid %u): %s", dir,
			 (unsigned)geteuid(), strerror(errno));
		return -1;
	}
	return dir_local(dir, err, errlen);
}

int local_dir_check(const char *dir, int create, char *err, size_t errlen)
{
	char parent[LOCAL_DIR_MAX + 1];
	const char *slash;
	struct stat st;
	size_t n = strlen(dir);

	if (dir[0] != '/' || n > LOCAL_DIR_MAX) {
		snprintf(err, errlen, "\"%s\" is not an absolute path (of at most %d bytes)", dir,
			 LOCAL_DIR_MAX);
		return -1;
	}
	if (stat(dir, &st) == 0 || errno != ENOENT)
		return dir_usable(dir, err, errlen);
	while (n > 1 && dir[n - 1] == '/')
		n--;
	slash = memrchr(dir, '/', n);
	snprintf(parent, sizeof(parent), "%.*s", slash == dir ? 1 : (int)(slash - dir), dir);
	if (stat(parent, &st) != 0 || !S_ISDIR(st.st_mode)) {
		snprintf(err, errlen, "\"%s\" does not exist, nor does its parent \"%s\" "
			 "(parents are not created)", dir, parent);
		return -1;
	}
	if (!create)
		return 0;
	if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
		snprintf(err, errlen, "cannot create \"%s\": %s", dir, strerror(errno));
		return -1;
	}
	return dir_usable(dir, err, errlen);
}

int local_file_mode(const char *file_mode, char *err, size_t errlen)
{
	int mode = 0;

	for (const char *p = file_mode; *p && mode >= 0; p++)
		mode = *p >= '0' && *p <= '7' && mode < 01000 ? mode * 8 + (*p - '0') : -1;
	if (file_mode[0] != '0' || strlen(file_mode) != 4 || mode < 0600 || mode > 0666 ||
	    (mode & 0111)) {
		snprintf(err, errlen, "\"%s\" is not a file mode of four octal digits from "
			 "\"0600\" to \"0666\" without an execute bit", file_mode);
		return -1;
	}
	return mode;
}

/* The group's check: dir, without creating it (the backend's start does),
 * and file_mode. */
static int local_check(struct conf_err *e, const config_setting_t *g, void *data)
{
	const struct local_spec *ls = data;
	char err[512];

	if (local_dir_check(ls->dir, 0, err, sizeof(err)))
		return conf_fail(e, config_setting_get_member(g, "dir"), "local.dir", "%s", err);
	if (local_file_mode(ls->file_mode, err, sizeof(err)) < 0)
		return conf_fail(e, config_setting_get_member(g, "file_mode"), "local.file_mode",
				 "%s", err);
	return 0;
}

/* The settings a kernel lock cannot honour, refused when the file sets them. */
static const struct conf_refusal unavailable[] = {
	{ "lease_ms", "a kernel lock has no lease: its holder keeps it until it releases "
	  "it or dies" },
	{ "on_lost", "a kernel lock is not lost while its holder lives (no lease to lose)" },
	{ "retry_max_ms", "a waiter is woken by the release itself and asks nothing of a "
	  "server" },
	{ "break_dead_holders", "the kernel frees a dead holder's lock itself, at once" },
	{ "handoff_ms", "the kernel hands nothing over: a released lock goes to the first "
	  "waiter that locks it" },
	{ NULL, NULL }
};

/* The values not built yet for this backend, refused when a lock asks:
 * none since step 3 (fair, linger_ms, max_hold_ms were). */
static const struct conf_refusal unbuilt[] = {
	{ NULL, NULL }
};

const struct conf_group backend_local_settings = {
	.name = "local",
	.fields = local_fields,
	.size = sizeof(struct local_spec),
	.check = local_check,
	.unavailable = unavailable,
	.unbuilt = unbuilt,
	.lock_defaults = conf_no_linger,
};
