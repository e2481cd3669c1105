/* SPDX-License-Identifier: MIT */
/*
 * etcd.h - what the etcd module offers besides its table of operations:
 * the locks under its prefix, each with its holder and its waiters, for
 * `lockshim status` (etcd_holders, in etcd.c). Read-only: range reads and
 * lease TTL lookups, nothing written. Not exported by the module yet
 * (etcd.map): the CLI reaches it once the backend table has a slot for it.
 */
#ifndef LOCKSHIM_ETCD_H
#define LOCKSHIM_ETCD_H

#include <stddef.h>

struct backend_conn;

/* One lock, as etcd_holders reports it (every pointer valid during the
 * call only). */
struct etcd_lock_view {
	const char *key;         /* the stored key (namespace:key), unescaped */
	size_t klen;
	const char *val;         /* the holder's lock value (owner record) */
	size_t vlen;
	long long fence;         /* the holder's key's create revision */
	long long lease_left_ms; /* its lease's TTL left (whole seconds, in ms);
				  * -1 when etcd no longer knows the lease */
	int nwaiters;            /* the other keys, oldest (lowest create
				  * revision) first: */
	const char *const *wval; /* ... their lock values */
	const size_t *wlen;
};

/*
 * Calls fn once per lock under c's prefix, in key order: its holder (the
 * key of the lowest create revision under <prefix><key>/) and its waiters
 * (the rest, in create revision order). Reads the prefix in pages of at
 * most 64 keys (fewer while a page overflows the connection's buffer),
 * then one lease TTL per lock. Keys under the prefix not of the form
 * <prefix><escaped key>/<lease hex> are skipped. Returns BACKEND_OK, or
 * BACKEND_ERR with the reason in the connection's errstr (nothing was
 * reported then).
 */
int etcd_holders(struct backend_conn *c, void (*fn)(void *arg, const struct etcd_lock_view *l),
		 void *arg);

#endif
