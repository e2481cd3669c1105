/* SPDX-License-Identifier: MIT */
/*
 * count.c - the shim's counters and their shipment (see count.h).
 *
 * Counters only grow. The shipper keeps what it has sent (sent[], under
 * ship_mu) and sends the differences: a shipment that fails leaves sent[]
 * alone, so its counts go with the next one (nothing is lost while the
 * process lives; nothing is queued either: the pending amount is one
 * difference per value). calls_total is not counted on the hot path: every
 * call ends as exactly one of acquired (4 ways), timeout or error, so
 * their sum is shipped as calls. Fields are "<lock>\x1f<series>\x1f<label>"
 * (metrics.h), the lock being the spec's symbol.
 */
#include "count.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


struct count_block *count_blocks;
const struct lock_spec *count_specs;
int count_nspecs;

static pthread_mutex_t ship_mu = PTHREAD_MUTEX_INITIALIZER;
static struct count_block *sent; /* ship_mu */
static char key[KEY_MAX_NAMESPACE + 300];
static size_t klen;

int count_setup(const struct conf *cfg)
{
	char host[256];

	metrics_host(host, sizeof(host));
	klen = metrics_key(key, sizeof(key), cfg->ns, host);
	if (!klen || cfg->nlocks <= 0)
		return -1;
	count_blocks = calloc((size_t)cfg->nlocks, sizeof(*count_blocks));
	sent = calloc((size_t)cfg->nlocks, sizeof(*sent));
	if (!count_blocks || !sent) {
		free(count_blocks);
		free(sent);
		count_blocks = sent = NULL;
		return -1;
	}
	count_specs = cfg->locks;
	count_nspecs = cfg->nlocks;
	return 0;
}

/* Reads block i's counters into now (calls: the sum of the outcomes). */
static void snapshot(int i, uint64_t *now)
{
	for (int v = 0; v < METRICS_NVALUES; v++)
		now[v] = __atomic_load_n(&count_blocks[i].v[v], __ATOMIC_RELAXED);
	now[MC_CALLS] = 0;
	for (int v = MC_ACQ_FAST; v <= MC_ERRORS; v++)
		now[MC_CALLS] += now[v];
}

/* The fields and increments of one shipment. */
struct batch {
	int n;
	const char **fields;
	size_t *flens;
	long long *deltas;
	char *text;
};

/* Fills b with every value that changed (now[i] against sent); returns
 * how many, or -1 when out of memory. Holds ship_mu. */
static int collect(struct batch *b, uint64_t (*now)[METRICS_NVALUES])
{
	size_t cap = 0, off = 0, max = 0;

	for (int i = 0; i < count_nspecs; i++) {
		snapshot(i, now[i]);
		for (int v = 0; v < METRICS_NVALUES; v++)
			if (now[i][v] != sent[i].v[v]) {
				max++;
				cap += strlen(count_specs[i].symbol) + strlen(metrics_field(v)) + 2;
			}
	}
	if (!max)
		return 0;
	b->fields = malloc(max * sizeof(*b->fields));
	b->flens = malloc(max * sizeof(*b->flens));
	b->deltas = malloc(max * sizeof(*b->deltas));
	b->text = malloc(cap);
	if (!b->fields || !b->flens || !b->deltas || !b->text)
		return -1;
	for (int i = 0; i < count_nspecs; i++)
		for (int v = 0; v < METRICS_NVALUES; v++) {
			int len;

			if (now[i][v] == sent[i].v[v])
				continue;
			len = snprintf(b->text + off, cap - off, "%s%c%s", count_specs[i].symbol,
				       METRICS_SEP, metrics_field(v));
			b->fields[b->n] = b->text + off;
			b->flens[b->n] = (size_t)len;
			b->deltas[b->n++] = (long long)(now[i][v] - sent[i].v[v]);
			off += (size_t)len + 1;
		}
	return b->n;
}

int count_ship(const struct backend *be, struct backend_conn **c, char *err, size_t errlen)
{
	struct batch b = { 0 };
	uint64_t (*now)[METRICS_NVALUES];
	int n, rc = 0;

	if (!count_blocks || !be->ops->count)
		return 0;
	pthread_mutex_lock(&ship_mu);
	now = malloc(sizeof(*now) * (size_t)count_nspecs);
	n = now ? collect(&b, now) : -1;
	if (n < 0) {
		snprintf(err, errlen, "out of memory");
		rc = -1;
	} else if (n > 0) {
		if (!*c)
			*c = backend_open(be, err, errlen);
		if (!*c)
			rc = -1;
		else if (be->ops->count(*c, key, klen, n, b.fields, b.flens, b.deltas) != BACKEND_OK)
			rc = -1, snprintf(err, errlen, "%s", be->ops->errstr(*c));
		else
			memcpy(sent, now, sizeof(*now) * (size_t)count_nspecs);
	}
	pthread_mutex_unlock(&ship_mu);
	free(now);
	free(b.fields);
	free(b.flens);
	free(b.deltas);
	free(b.text);
	return rc;
}

void count_atfork_child(void)
{
	pthread_mutex_init(&ship_mu, NULL);
	for (int i = 0; count_blocks && i < count_nspecs; i++)
		snapshot(i, sent[i].v);
}
