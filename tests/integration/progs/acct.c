/* SPDX-License-Identifier: MIT */
/*
 * A legacy accounts library for test_multikey.py: each account is a file
 * holding its balance. acct_transfer moves n from one account to another,
 * a read-modify-write of both with a window; nested (acct_nested(1)), it
 * takes its own account and calls acct_deposit for the other, as a
 * program guarding each function by one key would. acct_hold waits for a
 * line on standard input with an account held. The first transfer of each
 * of two threads waits up to 300 ms for the other inside (acct_inside says
 * whether both were inside at once): with exclusion, the second cannot
 * enter; with two nested locks taken in call order, both hold their first.
 */
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#define WINDOW_NS 100000 /* between a read and its write */

static int nested;
static int inside, met, first_done[2];

static long balance(const char *path)
{
	long v = 0;
	FILE *f = fopen(path, "r");

	if (f) {
		if (fscanf(f, "%ld", &v) != 1)
			v = 0;
		fclose(f);
	}
	return v;
}

static int set_balance(const char *path, long v)
{
	FILE *f = fopen(path, "w");

	if (!f)
		return -1;
	fprintf(f, "%ld\n", v);
	fclose(f);
	return 0;
}

static void pause_window(void)
{
	struct timespec ts = { 0, WINDOW_NS };

	nanosleep(&ts, NULL);
}

void acct_nested(int on)
{
	nested = on;
}

int acct_inside(void)
{
	return met;
}

static int credit(const char *to, long n)
{
	long v = balance(to);

	pause_window();
	return set_balance(to, v + n) == 0 ? 1 : -1;
}

int acct_deposit(const char *to, long n)
{
	return credit(to, n);
}

/* The first transfer of thread `who` (0 or 1): waits up to 300 ms for the
 * other thread's first transfer to be inside too. */
static void meet(int who)
{
	if (who < 0 || who > 1 || __atomic_exchange_n(&first_done[who], 1, __ATOMIC_SEQ_CST))
		return;
	__atomic_add_fetch(&inside, 1, __ATOMIC_SEQ_CST);
	for (int i = 0; i < 300; i++) {
		if (__atomic_load_n(&inside, __ATOMIC_SEQ_CST) == 2) {
			met = 1;
			break;
		}
		usleep(1000);
	}
	__atomic_sub_fetch(&inside, 1, __ATOMIC_SEQ_CST);
}

int acct_transfer(const char *from, const char *to, long n, int who)
{
	long v;

	meet(who);
	v = balance(from);
	pause_window();
	if (set_balance(from, v - n))
		return -1;
	return nested ? acct_deposit(to, n) : credit(to, n);
}

int acct_hold(const char *path)
{
	char c;

	printf("holding %s\n", path);
	fflush(stdout);
	while (read(0, &c, 1) == 1 && c != '\n')
		;
	return 1;
}
