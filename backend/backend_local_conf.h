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
	char *dir;       /* absolute; one lock file per key in it */
	char *file_mode; /* octal, "0600".."0666": the lock files' mode */
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

/* Returns the mode that file_mode ("0644": octal, 0600..0666, no execute
 * bit) says, or -1 with one line in err. */
int local_file_mode(const char *file_mode, char *err, size_t errlen);

/*
 * Returns the name of the filesystem whose statfs(2) f_type is type when
 * it is remote (NFS, CIFS/SMB, FUSE, ...: inotify does not see another
 * host's changes there, and its locks are a server's, not this kernel's),
 * or NULL. Inline, a table of numbers: the unit tests check it without
 * linking the backend.
 */
static inline const char *local_fs_remote(long type)
{
	static const struct {
		long magic;
		const char *name;
	} remote[] = {
		{ 0x6969, "NFS" },            /* NFS_SUPER_MAGIC */
		{ 0xFF534D42, "CIFS" },       /* CIFS_SUPER_MAGIC */
		{ 0xFE534D42, "SMB2" },       /* SMB2_SUPER_MAGIC */
		{ 0x517B, "SMB" },            /* SMB_SUPER_MAGIC */
		{ 0x65735546, "FUSE" },       /* FUSE_SUPER_MAGIC */
		{ 0x564C, "NCP" },            /* NCP_SUPER_MAGIC */
		{ 0x6B414653, "AFS" },        /* AFS_FS_MAGIC */
		{ 0x5346414F, "OpenAFS" },    /* AFS_SUPER_MAGIC */
		{ 0x00C36400, "Ceph" },       /* CEPH_SUPER_MAGIC */
		{ 0x01021997, "9P" },         /* V9FS_MAGIC */
		{ 0x47504653, "GPFS" },
		{ 0x0BD00BD0, "Lustre" },
		{ 0x013111A8, "IBRIX" },
		{ 0x73757245, "Coda" },       /* CODA_SUPER_MAGIC */
	};

	for (size_t i = 0; i < sizeof(remote) / sizeof(remote[0]); i++)
		if ((unsigned long)type == (unsigned long)remote[i].magic ||
		    (unsigned int)type == (unsigned int)remote[i].magic)
			return remote[i].name;
	return NULL;
}

#endif
