/* SPDX-License-Identifier: MIT */
/*
 * metrics.c - the table of lockshim's metrics, their hash fields and the
 * Prometheus text writer (see metrics.h).
 *
 * families[] is the one list of series: each names the values of the
 * vector it covers (a counter, a counter with one value per label value,
 * a histogram) and the label that tells them apart. The field names are
 * made from it once (pthread_once) and the writer walks it, so a series
 * added there is stored, summed and printed without another edit.
 */
#include "metrics.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const int64_t metrics_bucket_us[METRICS_NBUCKETS - 1] = {
	100, 250, 500, 1000, 2500, 5000, 10000, 25000, 50000, 100000, 250000, 500000,
	1000000, 2500000, 5000000, 10000000, 30000000, 60000000,
};

static const char *const bucket_le[METRICS_NBUCKETS] = {
	"0.0001", "0.00025", "0.0005", "0.001", "0.0025", "0.005", "0.01", "0.025", "0.05",
	"0.1", "0.25", "0.5", "1", "2.5", "5", "10", "30", "60", "+Inf",
};

enum kind { COUNTER, HISTOGRAM, GAUGE };

struct family {
	const char *name;
	enum kind kind;
	const char *help;
	int first;                 /* its first value (COUNTER) or histogram (HISTOGRAM) */
	int n;                     /* values: 1, or one per label value */
	const char *label;         /* the label telling its values apart, or NULL */
	const char *const *values; /* the label's values */
};

static const char *const how[] = { "fast", "waited", "reentrant", "kept" };

static const struct family families[] = {
	{ "lockshim_calls_total", COUNTER, "Guarded calls (a nested reentrant call is a call).",
	  MC_CALLS, 1, NULL, NULL },
	{ "lockshim_acquired_total", COUNTER, "Calls that entered holding the lock, by how it "
	  "was obtained (fast: first try; waited; reentrant; kept: a lock kept by linger_ms).",
	  MC_ACQ_FAST, 4, "how", how },
	{ "lockshim_timeouts_total", COUNTER, "Calls whose lock wait timed out (wait_ms).",
	  MC_TIMEOUTS, 1, NULL, NULL },
	{ "lockshim_errors_total", COUNTER, "Calls whose lock could not be taken for an error "
	  "(server unreachable, lease not kept).", MC_ERRORS, 1, NULL, NULL },
	{ "lockshim_lost_total", COUNTER, "Leases lost (renewal refused, or the server "
	  "unreachable for a whole lease).", MC_LOST, 1, NULL, NULL },
	{ "lockshim_overruns_total", COUNTER, "Calls that held their lock past max_hold_ms.",
	  MC_OVERRUNS, 1, NULL, NULL },
	{ "lockshim_skipped_total", COUNTER, "Calls skipped by on_timeout or on_error = skip.",
	  MC_SKIPPED, 1, NULL, NULL },
	{ "lockshim_dead_holders_broken_total", COUNTER, "Locks broken because their holder, "
	  "a process of the same machine, was gone.", MC_DEAD_BROKEN, 1, NULL, NULL },
	{ "lockshim_wait_seconds", HISTOGRAM, "Time from a call's start to its lock being "
	  "granted by the server (fast and waited acquisitions).", MH_WAIT, 0, NULL, NULL },
	{ "lockshim_hold_seconds", HISTOGRAM, "Time a call held its lock (outermost calls, "
	  "from entering to returning).", MH_HOLD, 0, NULL, NULL },
	{ "lockshim_held", GAUGE, "Locks held now (lock keys in the server; each holder "
	  "of a holder set).", 0, 0, NULL, NULL },
	{ "lockshim_waiting", GAUGE, "Callers waiting now (queued in the server).", 1, 0, NULL,
	  NULL },
};

#define NFAMILIES (sizeof(families) / sizeof(families[0]))
#define FIELD_MAX 64

static char fields[METRICS_NVALUES][FIELD_MAX];
static size_t field_len[METRICS_NVALUES];
static pthread_once_t fields_once = PTHREAD_ONCE_INIT;

/* Sets value v's field tail: "<series>\x1f<label>". */
static void set_field(int v, const char *series, const char *label)
{
	field_len[v] = (size_t)snprintf(fields[v], FIELD_MAX, "%s%c%s", series, METRICS_SEP,
					label);
}

static void fields_init(void)
{
	for (size_t f = 0; f < NFAMILIES; f++) {
		const struct family *fm = &families[f];

		if (fm->kind == COUNTER) {
			for (int i = 0; i < fm->n; i++)
				set_field(fm->first + i, fm->name, fm->values ? fm->values[i] : "");
		} else if (fm->kind == HISTOGRAM) {
			for (int i = 0; i < METRICS_NBUCKETS; i++)
				set_field(METRICS_BUCKET(fm->first, i), fm->name, bucket_le[i]);
			set_field(METRICS_SUM(fm->first), fm->name, "sum_us");
		}
	}
}

const char *metrics_field(int v)
{
	pthread_once(&fields_once, fields_init);
	return v >= 0 && v < METRICS_NVALUES ? fields[v] : "";
}

int metrics_parse_field(const char *field, size_t len, size_t *lock_len)
{
	const char *sep = NULL;
	int seps = 0;

	pthread_once(&fields_once, fields_init);
	for (size_t i = len; i-- > 0;) /* the lock name may hold anything: from the end */
		if (field[i] == METRICS_SEP && ++seps == 2) {
			sep = field + i;
			break;
		}
	if (!sep)
		return -1;
	for (int v = 0; v < METRICS_NVALUES; v++)
		if (field_len[v] == len - (size_t)(sep + 1 - field) &&
		    memcmp(fields[v], sep + 1, field_len[v]) == 0) {
			*lock_len = (size_t)(sep - field);
			return v;
		}
	return -1;
}

void metrics_host(char *buf, size_t cap)
{
	const char *env = secure_getenv("LOCKSHIM_TEST_HOST");

	if (env && *env)
		snprintf(buf, cap, "%s", env);
	else if (gethostname(buf, cap - 1) != 0 || !buf[0])
		snprintf(buf, cap, "unknown");
	buf[cap - 1] = 0;
	for (char *p = buf; *p; p++)
		if (*p == ':' || *p == '{' || *p == '}' || *p <= 0x20 || *p >= 0x7f)
			*p = '-';
}

size_t metrics_key(char *buf, size_t cap, const char *ns, const char *host)
{
	int n = snprintf(buf, cap, "%s:metrics:{%s}", ns, host);

	return n < 0 || (size_t)n >= cap ? 0 : (size_t)n;
}

/* Returns the length of the valid UTF-8 sequence at s (1 to 4), or 0 when
 * s[0] does not start one (overlong forms and surrogates included). */
static int utf8_len(const unsigned char *s)
{
	int n = s[0] < 0x80 ? 1 : s[0] >= 0xc2 && s[0] <= 0xdf ? 2 :
		s[0] >= 0xe0 && s[0] <= 0xef ? 3 : s[0] >= 0xf0 && s[0] <= 0xf4 ? 4 : 0;

	for (int i = 1; i < n; i++)
		if ((s[i] & 0xc0) != 0x80)
			return 0;
	if ((n == 3 && ((s[0] == 0xe0 && s[1] < 0xa0) || (s[0] == 0xed && s[1] >= 0xa0))) ||
	    (n == 4 && ((s[0] == 0xf0 && s[1] < 0x90) || (s[0] == 0xf4 && s[1] >= 0x90))))
		return 0;
	return n;
}

/* Writes s as a label value (UTF-8, as the format wants): backslash,
 * double quote and newline escaped; a byte that is not UTF-8 (a key
 * from `lockshim lock` may be any bytes) as the text \xNN. */
static void put_label(FILE *f, const char *s)
{
	while (*s) {
		int n = utf8_len((const unsigned char *)s);

		if (*s == '\\' || *s == '"')
			fprintf(f, "\\%c", *s);
		else if (*s == '\n')
			fputs("\\n", f);
		else if (n == 0)
			fprintf(f, "\\\\x%02X", (unsigned char)*s);
		else
			fwrite(s, 1, (size_t)n, f);
		s += n ? n : 1;
	}
}

/* Writes `name{lock="L",host="H"` (no closing brace: the caller adds
 * more labels or closes it). */
static void put_sample_start(FILE *f, const char *name, const char *suffix,
			     const struct metrics_row *r)
{
	fprintf(f, "%s%s{lock=\"", name, suffix);
	put_label(f, r->lock);
	fputs("\",host=\"", f);
	put_label(f, r->host);
	fputc('"', f);
}

static void write_histogram(FILE *f, const struct family *fm, const struct metrics_row *r)
{
	uint64_t cum = 0;

	for (int i = 0; i < METRICS_NBUCKETS; i++) {
		cum += r->v[METRICS_BUCKET(fm->first, i)];
		put_sample_start(f, fm->name, "_bucket", r);
		fprintf(f, ",le=\"%s\"} %llu\n", bucket_le[i], (unsigned long long)cum);
	}
	put_sample_start(f, fm->name, "_sum", r);
	fprintf(f, "} %.6f\n", (double)r->v[METRICS_SUM(fm->first)] / 1e6);
	put_sample_start(f, fm->name, "_count", r);
	fprintf(f, "} %llu\n", (unsigned long long)cum);
}

void metrics_write(FILE *f, const struct metrics_row *rows, size_t nrows,
		   const struct metrics_gauge *gauges, size_t ngauges)
{
	for (size_t k = 0; k < NFAMILIES; k++) {
		const struct family *fm = &families[k];

		fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", fm->name, fm->help, fm->name,
			fm->kind == COUNTER ? "counter" : fm->kind == HISTOGRAM ? "histogram" :
			"gauge");
		for (size_t j = 0; fm->kind == GAUGE && j < ngauges; j++) {
			fprintf(f, "%s{lock=\"", fm->name);
			put_label(f, gauges[j].lock);
			fprintf(f, "\"} %lld\n", fm->first ? gauges[j].waiting : gauges[j].held);
		}
		for (size_t j = 0; fm->kind != GAUGE && j < nrows; j++) {
			const struct metrics_row *r = &rows[j];

			if (fm->kind == HISTOGRAM) {
				write_histogram(f, fm, r);
				continue;
			}
			for (int i = 0; i < fm->n; i++) {
				put_sample_start(f, fm->name, "", r);
				if (fm->label)
					fprintf(f, ",%s=\"%s\"", fm->label, fm->values[i]);
				fprintf(f, "} %llu\n", (unsigned long long)r->v[fm->first + i]);
			}
		}
	}
}
