/* SPDX-License-Identifier: MIT */
/*
 * test.h - a minimal harness in the style of hiredis's test.c.
 *
 * test_cond(expr) records a pass or a failure with its line; test_report()
 * prints "N passed, N failed" and returns the exit status.
 */
#ifndef LOCKSHIM_TEST_H
#define LOCKSHIM_TEST_H

#include <stdio.h>

static int tests_passed, tests_failed;
static const char *test_name = "";

#define test(name) (test_name = (name))
#define test_cond(c)                                                           \
	do {                                                                   \
		if (c) {                                                       \
			tests_passed++;                                        \
		} else {                                                       \
			tests_failed++;                                        \
			fprintf(stderr, "FAIL %s:%d: %s: %s\n", __FILE__,      \
				__LINE__, test_name, #c);                      \
		}                                                              \
	} while (0)

static inline int test_report(const char *suite)
{
	printf("%s: %d passed, %d failed\n", suite, tests_passed, tests_failed);
	return tests_failed ? 1 : 0;
}

#endif
