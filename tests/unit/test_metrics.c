/* SPDX-License-Identifier: MIT */
/*
 * test_metrics.c - the metrics table's hash fields (every value's field
 * parsed back to it, the lock name taken from the end so that it may hold
 * anything), the histogram buckets' edges, the host name's cleaning, and
 * the Prometheus writer (cumulative buckets, _sum in seconds, label
 * escaping).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "metrics.h"
#include "test.h"

/* Returns whether every value's field, after lock, parses back to it. */
static int fields_round_trip(const char *lock)
{
	for (int v = 0; v < METRICS_NVALUES; v++) {
		char f[256];
		size_t llen = 0;
		int n = snprintf(f, sizeof(f), "%s%c%s", lock, METRICS_SEP, metrics_field(v));

		if (metrics_parse_field(f, (size_t)n, &llen) != v || llen != strlen(lock) ||
		    memcmp(f, lock, llen) != 0)
			return 0;
	}
	return 1;
}

/* Returns the text metrics_write makes of one row (the caller frees it). */
static char *written(const struct metrics_row *r, const struct metrics_gauge *g)
{
	char *text = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);

	metrics_write(f, r, 1, g, 1);
	fclose(f);
	return text;
}

int main(void)
{
	struct metrics_row row = { .lock = "a\"b\\c\nd", .host = "h" };
	struct metrics_gauge g = { .lock = "k", .held = 2, .waiting = 3 };
	char host[16], *text;
	size_t llen;

	test("every value's field parses back to it, for plain and awkward lock names");
	test_cond(fields_round_trip("write") && fields_round_trip("a\x1f" "b") &&
		  fields_round_trip("x:{y}") && fields_round_trip(""));
	test("fields of no known value are refused");
	{
		static const char unknown[] = "lock\x1f" "lockshim_nothing\x1f", none[] = "no sep";

		test_cond(metrics_parse_field(unknown, sizeof(unknown) - 1, &llen) == -1 &&
			  metrics_parse_field(none, sizeof(none) - 1, &llen) == -1);
	}
	test("the values' fields are distinct");
	{
		int dup = 0;

		for (int a = 0; a < METRICS_NVALUES; a++)
			for (int b = a + 1; b < METRICS_NVALUES; b++)
				dup |= !strcmp(metrics_field(a), metrics_field(b));
		test_cond(!dup);
	}
	test("buckets: a bound is in its own bucket, one µs more in the next, beyond 60 s +Inf");
	test_cond(metrics_bucket(0) == 0 && metrics_bucket(100) == 0 && metrics_bucket(101) == 1 &&
		  metrics_bucket(1000000) == 12 && metrics_bucket(60000000) == 17 &&
		  metrics_bucket(60000001) == METRICS_NBUCKETS - 1);
	test("the key of a host's hash");
	{
		char k[64];

		test_cond(metrics_key(k, sizeof(k), "ns", "h1") == 15 && !strcmp(k, "ns:metrics:{h1}") &&
			  metrics_key(k, 8, "ns", "h1") == 0);
	}
	test("LOCKSHIM_TEST_HOST names the host, ':', braces and blanks made '-'");
	setenv("LOCKSHIM_TEST_HOST", "a:b{c} d\xe9", 1);
	metrics_host(host, sizeof(host));
	test_cond(!strcmp(host, "a-b-c--d-"));
	test("the writer: cumulative buckets, _count, _sum in seconds, labels escaped, gauges");
	row.v[MC_CALLS] = 7;
	row.v[METRICS_BUCKET(MH_HOLD, 0)] = 2;
	row.v[METRICS_BUCKET(MH_HOLD, 3)] = 1;
	row.v[METRICS_BUCKET(MH_HOLD, METRICS_NBUCKETS - 1)] = 1;
	row.v[METRICS_SUM(MH_HOLD)] = 61500000;
	text = written(&row, &g);
	test_cond(strstr(text, "lockshim_calls_total{lock=\"a\\\"b\\\\c\\nd\",host=\"h\"} 7\n") &&
		  strstr(text, ",le=\"0.0001\"} 2\n") && strstr(text, ",le=\"0.00025\"} 2\n") &&
		  strstr(text, ",le=\"0.001\"} 3\n") && strstr(text, ",le=\"60\"} 3\n") &&
		  strstr(text, ",le=\"+Inf\"} 4\n") &&
		  strstr(text, "lockshim_hold_seconds_sum{lock=\"a\\\"b\\\\c\\nd\",host=\"h\"} 61.5") &&
		  strstr(text, "lockshim_hold_seconds_count{lock=\"a\\\"b\\\\c\\nd\",host=\"h\"} 4\n") &&
		  strstr(text, "# TYPE lockshim_acquired_total counter\n") &&
		  strstr(text, "how=\"kept\"} 0\n") &&
		  strstr(text, "lockshim_held{lock=\"k\"} 2\n") &&
		  strstr(text, "lockshim_waiting{lock=\"k\"} 3\n"));
	free(text);
	return test_report("metrics");
}
