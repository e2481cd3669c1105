/* SPDX-License-Identifier: MIT */
/*
 * batch LEDGER N - the "legacy" program: posts N entries of 1 to LEDGER.
 * It knows nothing of locks; lockshim guards post_entry from outside.
 */
#include <stdio.h>
#include <stdlib.h>

long post_entry(const char *ledger, long amount);

int main(int argc, char **argv)
{
	int n = argc > 2 ? atoi(argv[2]) : 50;

	if (argc < 2) {
		fprintf(stderr, "usage: batch LEDGER [N]\n");
		return 2;
	}
	for (int i = 0; i < n; i++)
		if (post_entry(argv[1], 1) < 0) {
			perror(argv[1]);
			return 1;
		}
	return 0;
}
