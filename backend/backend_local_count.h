/* SPDX-License-Identifier: MIT */
/*
 * backend_local_count.h - the local backend's metrics: the hosts' counts
 * as files of local.dir (backend_local_count.c), for backend_local.c's
 * .count and .count_read.
 */
#ifndef LOCKSHIM_BACKEND_LOCAL_COUNT_H
#define LOCKSHIM_BACKEND_LOCAL_COUNT_H

#include <stddef.h>

/* Adds deltas[i] to field fields[i] (flens[i] bytes) of the counts of key
 * (klen bytes) in dir, for each i < n, at once; a new file gets mode.
 * Returns 0, or -1 with the reason in err. */
int local_count_add(const char *dir, int mode, const char *key, size_t klen, int n,
		    const char *const *fields, const size_t *flens, const long long *deltas,
		    char *err, size_t errlen);

/* Calls fn once per field of each counts file of dir whose key starts with
 * "<ns>:". Returns 0, or -1 with the reason in err (dir unreadable). */
int local_count_read(const char *dir, const char *ns,
		     void (*fn)(void *arg, const char *key, size_t klen, const char *field,
				size_t flen, long long value),
		     void *arg, char *err, size_t errlen);

#endif
