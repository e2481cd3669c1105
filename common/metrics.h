/* SPDX-License-Identifier: MIT */
/*
 * metrics.h - the metrics of lockshim: one table of every series (name,
 * type, help, labels), the hash fields they are kept under in the server,
 * and the Prometheus text writer (exposition format 0.0.4). The shim
 * counts (shim/count.c) and the CLI sums and prints (cli/metrics.c)
 * through it, so a series is added here once.
 *
 * A lock's counts are a flat vector of METRICS_NVALUES integers: the
 * counters (enum metrics_counter), then for each histogram its buckets
 * (not cumulative; the last is +Inf) and its sum in microseconds. They
 * live in the hash "<namespace>:metrics:{<host>}", one field per value:
 * "<lock>\x1f<series>\x1f<label>" (metrics_field), incremented with
 * HINCRBY, kept until deleted.
 */
#ifndef LOCKSHIM_METRICS_H
#define LOCKSHIM_METRICS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

enum metrics_counter {
	MC_ACQ_FAST, MC_ACQ_WAITED, MC_ACQ_REENTRANT, MC_ACQ_KEPT,
	MC_TIMEOUTS, MC_ERRORS, MC_SKIPPED, MC_LOST, MC_OVERRUNS, MC_DEAD_BROKEN,
	MC_CALLS, /* never counted alone: every call is one of the outcomes above it */
	MC_N
};

enum metrics_hist { MH_WAIT, MH_HOLD, MH_N };

#define METRICS_NBUCKETS 19 /* 18 bounds, then +Inf */
#define METRICS_HIST_VALUES (METRICS_NBUCKETS + 1)
#define METRICS_BUCKET(h, i) (MC_N + (h) * METRICS_HIST_VALUES + (i))
#define METRICS_SUM(h) (MC_N + (h) * METRICS_HIST_VALUES + METRICS_NBUCKETS)
#define METRICS_NVALUES (MC_N + MH_N * METRICS_HIST_VALUES)

/* The upper bounds of the finite buckets, in µs (100 µs to 60 s). */
extern const int64_t metrics_bucket_us[METRICS_NBUCKETS - 1];

/* Separates a field's parts: lock, series, label. */
#define METRICS_SEP '\x1f'

/* Returns the index of the bucket of histogram h that an observation of
 * us microseconds falls in (the value's index is METRICS_BUCKET(h, i)). */
static inline int metrics_bucket(int64_t us)
{
	int i = 0;

	while (i < METRICS_NBUCKETS - 1 && us > metrics_bucket_us[i])
		i++;
	return i;
}

/* Returns the static text "<series>\x1f<label>" of value v (the field's
 * tail after "<lock>\x1f"). */
const char *metrics_field(int v);

/*
 * Parses a hash field "<lock>\x1f<series>\x1f<label>" of len bytes. Returns
 * the value's index and sets *lock_len (the lock name is field[0..
 * *lock_len)), or -1 for a field of no known value.
 */
int metrics_parse_field(const char *field, size_t len, size_t *lock_len);

/*
 * Writes "<ns>:metrics:{<host>}" into buf (cap bytes, NUL-terminated).
 * Returns the length, or 0 when it does not fit.
 */
size_t metrics_key(char *buf, size_t cap, const char *ns, const char *host);

/* Writes the host name counts are filed under into buf (cap bytes,
 * NUL-terminated): the machine's, or LOCKSHIM_TEST_HOST (for tests; not
 * read in secure-execution mode), with ':', braces, blanks and non-ASCII
 * bytes as '-'. */
void metrics_host(char *buf, size_t cap);

/* Counts of one lock from one host (the CLI's sums). */
struct metrics_row {
	const char *lock, *host;
	uint64_t v[METRICS_NVALUES];
};

/* The gauges of one lock name, read from the server. */
struct metrics_gauge {
	const char *lock;
	long long held, waiting;
};

/*
 * Writes every series of the table in the Prometheus text format 0.0.4 to
 * f: # HELP, # TYPE, then one sample per row (labels lock and host; the
 * gauges: lock), label values escaped. Histogram buckets are written
 * cumulative, with _sum in seconds and _count (the +Inf bucket).
 */
void metrics_write(FILE *f, const struct metrics_row *rows, size_t nrows,
		   const struct metrics_gauge *gauges, size_t ngauges);

#endif
