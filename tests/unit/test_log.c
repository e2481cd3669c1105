/* SPDX-License-Identifier: MIT */
/*
 * test_log.c - log_format_time (the log file's RFC 3339 UTC timestamps,
 * computed without gmtime) against known instants, leap days, 2038 and
 * later, times before 1970, millisecond truncation, and against glibc's
 * gmtime_r for every day from 1900 to 2500; log_json_escape (quotes,
 * control bytes, UTF-8 kept or not); owner_describe (the holder a slow
 * wait names); log_prefix's form.
 */
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "owner.h"
#include "test.h"

static int time_is(long long sec, long nsec, const char *want)
{
	char buf[64];
	size_t n = log_format_time(buf, sizeof(buf), sec, nsec);

	if (n != strlen(want) || strcmp(buf, want) != 0) {
		fprintf(stderr, "  %lld.%09ld: got \"%s\", want \"%s\"\n", sec, nsec, buf, want);
		return 0;
	}
	return 1;
}

/* Returns 1 when every day from 1900 to 2500 (at 13:57:31) formats as
 * gmtime_r + strftime would. */
static int matches_gmtime(void)
{
	for (long long s = -2208988800LL + 50251; s < 16725225600LL; s += 86400) {
		time_t t = (time_t)s;
		struct tm tm;
		char want[64], got[64];

		gmtime_r(&t, &tm);
		strftime(want, sizeof(want), "%Y-%m-%dT%H:%M:%S.042Z", &tm);
		log_format_time(got, sizeof(got), s, 42999999);
		if (strcmp(want, got) != 0) {
			fprintf(stderr, "  %lld: got \"%s\", want \"%s\"\n", s, got, want);
			return 0;
		}
	}
	return 1;
}

static int holder_is(const char *val, const char *want)
{
	char buf[128];
	size_t n = owner_describe(val, strlen(val), buf, sizeof(buf));

	if (n != strlen(want) || strcmp(buf, want) != 0) {
		fprintf(stderr, "  got \"%s\", want \"%s\"\n", buf, want);
		return 0;
	}
	return 1;
}

/* Whether escape (log_escape or log_json_escape) writes want for
 * src[0..len) into cap bytes. */
static int escaped_is(size_t (*escape)(char *, size_t, const char *, size_t),
		      const char *src, size_t len, size_t cap, const char *want)
{
	char buf[256];
	size_t n = escape(buf, cap, src, len);

	buf[n] = 0;
	if (strcmp(buf, want) != 0) {
		fprintf(stderr, "  got \"%s\", want \"%s\"\n", buf, want);
		return 0;
	}
	return 1;
}

#define text_is(...) escaped_is(log_escape, __VA_ARGS__)
#define json_is(...) escaped_is(log_json_escape, __VA_ARGS__)

int main(void)
{
	char buf[64], want[64];

	test("the epoch");
	test_cond(time_is(0, 0, "1970-01-01T00:00:00.000Z"));
	test("the issue's example");
	test_cond(time_is(1795693405, 123000000, "2026-11-26T11:43:25.123Z"));
	test("leap days: 2000 (divisible by 400), 2024; 2100 is not a leap year");
	test_cond(time_is(951782400, 0, "2000-02-29T00:00:00.000Z"));
	test_cond(time_is(1709164800, 0, "2024-02-29T00:00:00.000Z"));
	test_cond(time_is(4107542399, 0, "2100-02-28T23:59:59.000Z"));
	test_cond(time_is(4107542400, 0, "2100-03-01T00:00:00.000Z"));
	test("past 2038 (a 32-bit time_t's end) and at 9999");
	test_cond(time_is(2147483648LL, 0, "2038-01-19T03:14:08.000Z"));
	test_cond(time_is(253402300799LL, 0, "9999-12-31T23:59:59.000Z"));
	test("before 1970");
	test_cond(time_is(-1, 0, "1969-12-31T23:59:59.000Z"));
	test_cond(time_is(-2208988800LL, 0, "1900-01-01T00:00:00.000Z"));
	test("milliseconds are truncated: .9999999 stays in its second");
	test_cond(time_is(59, 999999999, "1970-01-01T00:00:59.999Z"));
	test_cond(time_is(0, 1000000, "1970-01-01T00:00:00.001Z"));
	test_cond(time_is(0, 999999, "1970-01-01T00:00:00.000Z"));
	test("every day 1900-2500 as gmtime_r says");
	test_cond(matches_gmtime());
	test("a short buffer is cut, NUL-terminated");
	test_cond(log_format_time(buf, 11, 0, 0) == 10 && strcmp(buf, "1970-01-01") == 0);
	test("JSON strings: quote and backslash escaped, control bytes as \\u00XX");
	test_cond(json_is("a\"b\\c", 5, 64, "a\\\"b\\\\c"));
	test_cond(json_is("\r\n\t\x01\x1f\x7f", 6, 64, "\\u000d\\u000a\\u0009\\u0001\\u001f\x7f"));
	test_cond(json_is("x\0y", 3, 64, "x\\u0000y"));
	test("JSON strings: well-formed UTF-8 kept, anything else byte by byte");
	test_cond(json_is("\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80", 9, 64,
			  "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80"));
	test_cond(json_is("\xff\xc3", 2, 64, "\\u00ff\\u00c3"));      /* bad, cut short */
	test_cond(json_is("\xc0\xaf", 2, 64, "\\u00c0\\u00af"));      /* overlong '/' */
	test_cond(json_is("\xed\xa0\x80", 3, 64, "\\u00ed\\u00a0\\u0080")); /* surrogate */
	test_cond(json_is("\xf4\x90\x80\x80", 4, 64, "\\u00f4\\u0090\\u0080\\u0080"));
	test("JSON strings: C1 controls as \\u0080..\\u009f");
	test_cond(json_is("a\xc2\x9b" "1m\xc2\xa0", 7, 64, "a\\u009b1m\xc2\xa0"));
	test("text: control bytes as \\n, \\r, \\t or \\xNN; UTF-8 kept, other bytes as \\xNN");
	test_cond(text_is("a\nb\r\t\x1b[1m\x7f", 10, 64, "a\\nb\\r\\t\\x1b[1m\\x7f"));
	test_cond(text_is("\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80", 9, 64,
			  "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80"));
	test_cond(text_is("NOSCRIP-\x94q\xa5\xcc\xd3T", 14, 64,
			  "NOSCRIP-\\x94q\\xa5\\xcc\\xd3T")); /* a fuzzed reply */
	test_cond(text_is("\xc2\x9b" "1m", 4, 64, "\\xc2\\x9b1m"));   /* C1 CSI */
	test_cond(text_is("\xed\xa0\x80\xe2\x82", 5, 64, "\\xed\\xa0\\x80\\xe2\\x82"));
	test("text: an escape that does not fit is dropped whole");
	test_cond(text_is("ab\x01", 3, 5, "ab"));
	test_cond(text_is("a\xc3\xa9", 3, 2, "a"));
	test("JSON strings: an escape that does not fit is dropped with the rest");
	test_cond(json_is("ab\ncd", 5, 7, "ab"));
	test_cond(json_is("a\xc3\xa9", 3, 2, "a"));
	test("the holder a wait line names (owner_describe)");
	test_cond(holder_is("0123456789abcdef0123456789abcdef:db2:4242:4243:-:0:0:1764000000000:batch",
			    "host db2, pid 4242, program batch"));
	test_cond(holder_is("0123456789abcdef0123456789abcdef:d\x1b\xff b:7:7:-:0:0:1:p\x01",
			    "host d---b, pid 7, program p-"));
	test_cond(holder_is("0123456789abcdef0123456789abcdef::7:7:-:0:0:1:p", "unknown"));
	test_cond(holder_is("0123456789abcdef0123456789abcdef:h:x7:7:-:0:0:1:p", "unknown"));
	test_cond(holder_is("0123456789abcdef0123456789abcdef:db2:4242:4243:-:0:0",
			    "unknown")); /* the 7 fields before since_ms and program */
	test_cond(holder_is("short:h:7:7:-:0:0:1:p", "unknown"));
	test_cond(holder_is("", "unknown"));
	test("the prefix: lockshim[pid] program: (the executable's file name)");
	snprintf(want, sizeof(want), "lockshim[%d] test_log: ", (int)getpid());
	test_cond(log_prefix(buf, sizeof(buf)) == strlen(want) && strcmp(buf, want) == 0);
	return test_report("log");
}
