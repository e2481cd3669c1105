/* SPDX-License-Identifier: MIT */
/*
 * count.h - the shim's counts of what its guarded calls did (metrics.h's
 * series), per lock spec, and shipping them to the server.
 *
 * The config is frozen, so count_setup allocates one block of counters
 * per spec of cfg->locks once; a spec's block is found by its place in
 * that array. Counting is a relaxed atomic add on that block: no lock, no
 * system call, no round trip. count_ship sends what changed since the last
 * shipment, in one round trip, as HINCRBYs on the host's hash (backend
 * count); renew.c calls it from the renewal thread at most once a second,
 * and at exec and exit.
 */
#ifndef LOCKSHIM_COUNT_H
#define LOCKSHIM_COUNT_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "conf.h"
#include "metrics.h"

struct count_block {
	uint64_t v[METRICS_NVALUES]; /* relaxed atomics */
};

/* Set by count_setup; read-only afterwards. */
extern struct count_block *count_blocks;
extern const struct lock_spec *count_specs;
extern int count_nspecs;

/*
 * Allocates the counters of cfg's locks and names the hash they are
 * shipped to: "<namespace>:metrics:{<host>}" (metrics_host). Returns 0
 * or -1 (then nothing is counted).
 */
int count_setup(const struct conf *cfg);

/* Returns s's counters, or NULL when s is not one of the config's specs
 * (a spec made by hand: nothing counted). */
static inline struct count_block *count_of(const struct lock_spec *s)
{
	ptrdiff_t i = s - count_specs;

	return count_blocks && i >= 0 && i < count_nspecs ? &count_blocks[i] : NULL;
}

/* Adds 1 to counter c (enum metrics_counter) of s. */
static inline void count_add(const struct lock_spec *s, int c)
{
	struct count_block *b = count_of(s);

	if (b)
		__atomic_fetch_add(&b->v[c], 1, __ATOMIC_RELAXED);
}

/* Adds 1 to counter c of s and observes us µs in its histogram h. */
static inline void count_observe(const struct lock_spec *s, int c, int h, int64_t us)
{
	struct count_block *b = count_of(s);

	if (!b)
		return;
	if (c >= 0)
		__atomic_fetch_add(&b->v[c], 1, __ATOMIC_RELAXED);
	if (us < 0)
		us = 0;
	__atomic_fetch_add(&b->v[METRICS_BUCKET(h, metrics_bucket(us))], 1, __ATOMIC_RELAXED);
	__atomic_fetch_add(&b->v[METRICS_SUM(h)], (uint64_t)us, __ATOMIC_RELAXED);
}

/*
 * Sends every count that changed since the last shipment on *c (opened
 * with b when NULL and something is to be sent), in one round trip.
 * Returns 0 (sent, or nothing to send) or -1 with err filled: the counts
 * stay unsent for the next call, and the caller drops *c. One shipment at
 * a time (a mutex): the exit's waits for the renewal thread's.
 */
int count_ship(const struct backend *b, struct backend_conn **c, char *err, size_t errlen);

/* Fork child: what the parent counted is the parent's to ship. */
void count_atfork_child(void);

#endif
