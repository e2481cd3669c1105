/* SPDX-License-Identifier: MIT */
/* The library whose functions test_hostile.py guards (libhostile.so). */
#include <stdio.h>
#include <string.h>

/* Prints "inside", then waits for one line on standard input: the test
 * acts while the call (and its lock) is in progress. */
int block_call(void)
{
	char line[64];

	printf("inside\n");
	fflush(stdout);
	if (!fgets(line, sizeof(line), stdin))
		return -2;
	return 7;
}

int quick_call(int x)
{
	return 2 * x + 1;
}

/* Ten integer arguments: the last four are passed on the stack. The result
 * depends on every argument and its position. */
long many_args(long a, long b, long c, long d, long e, long f, long g, long h,
	       long i, long j)
{
	long v[10] = { a, b, c, d, e, f, g, h, i, j }, r = 0;

	for (int k = 0; k < 10; k++)
		r = r * 31 + v[k];
	return r;
}
