/* SPDX-License-Identifier: MIT */
/*
 * backend_local.h - what the local backend shows besides its table of
 * operations: the holders of its lock files, for `lockshim status`
 * (cli/lockview.c). Read-only: the files are opened for reading and tested
 * with F_OFD_GETLK, never locked.
 */
#ifndef LOCKSHIM_BACKEND_LOCAL_H
#define LOCKSHIM_BACKEND_LOCAL_H

#include <stddef.h>

struct backend_config;

/* One held lock file, as local_holders reports it. */
struct local_holder {
	const char *key;  /* the key as its file name says it: exact, or, for a
			   * name shortened with a hash, its first bytes, "~"
			   * and the hash */
	size_t klen;
	const char *val;  /* the holder's lock value (owner record) */
	size_t vlen;
	long long fence;  /* the record's fence */
	long long since_ms; /* when the record was written (CLOCK_REALTIME ms) */
	int limit;        /* the holders' limit: 1 exclusive or shared */
	int shared;       /* a shared holder (mode "shared") */
	int in_set;       /* one holder of a set (shared, or a permit) */
};

/*
 * Calls fn for each holder of a lock file of bc's dir that a process holds
 * now (its strings valid during the call only): the exclusive holder, or
 * each holder of a set (shared holders, permits) from its slot's record. A
 * file no one holds (its record is the last holder's) is skipped. Returns 0, or -1 with the reason in err
 * (the dir cannot be read).
 */
int local_holders(const struct backend_config *bc,
		  void (*fn)(void *arg, const struct local_holder *h), void *arg,
		  char *err, size_t errlen);

#endif
