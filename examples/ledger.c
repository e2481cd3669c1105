/* SPDX-License-Identifier: MIT */
/*
 * libledger.so - the "legacy" library of the example: post_entry() reads a
 * balance file, thinks for a moment, and writes the new balance back. Two
 * copies running at once lose updates, exactly like a real batch job.
 */
#include <stdio.h>
#include <unistd.h>

long post_entry(const char *ledger, long amount)
{
	long balance = 0;
	FILE *f = fopen(ledger, "r");

	if (f) {
		if (fscanf(f, "%ld", &balance) != 1)
			balance = 0;
		fclose(f);
	}
	usleep(2000); /* validation, auditing, ... */
	f = fopen(ledger, "w");
	if (!f)
		return -1;
	fprintf(f, "%ld\n", balance + amount);
	fclose(f);
	return balance + amount;
}
