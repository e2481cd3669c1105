/* SPDX-License-Identifier: MIT */
/*
 * backend.h - the lock store, as a small table of functions.
 *
 * lock.c and renew.c speak only through this table; all protocol text lives
 * in the implementation (backend_redis.c). A connection is never shared
 * between concurrent callers. Every operation returns 1 (done), 0 (refused:
 * held by another owner / not ours) or -1 (error: the connection must be
 * closed and reopened; backend_errstr says why).
 */
#ifndef LOCKSHIM_BACKEND_H
#define LOCKSHIM_BACKEND_H

#include <stddef.h>

struct redis_spec;
struct backend_conn;

struct backend_item {
	const char *key;
	size_t klen;
	const char *val;
	size_t vlen;
	long long lease_ms;
};

struct backend_ops {
	/* Returns a new connection, or NULL with a message in err. */
	struct backend_conn *(*open)(const struct redis_spec *r, char *err,
				     size_t errlen);
	/* Closes c without sending anything (also safe in a fork child). */
	void (*close)(struct backend_conn *c);
	/* SET key val NX PX lease. */
	int (*acquire)(struct backend_conn *c, const struct backend_item *it);
	/* Deletes key only while it still holds val. */
	int (*release)(struct backend_conn *c, const struct backend_item *it);
	/*
	 * Extends n keys still holding their values, in one round trip.
	 * Fills results[i] with 1 (renewed) or 0 (gone or owned by another).
	 * Returns 0, or -1 when the batch could not be completed.
	 */
	int (*renew)(struct backend_conn *c, int n, const struct backend_item *items,
		     int *results);
	/* Returns the last error text of c (never NULL). */
	const char *(*errstr)(const struct backend_conn *c);
	/* Sends PING; returns 1 or -1. Used by `lockshim check`. */
	int (*ping)(struct backend_conn *c);
};

extern const struct backend_ops backend_redis;

#endif
