/* SPDX-License-Identifier: MIT */
/*
 * acct_main: runs progs/acct.c's transfers (test_multikey.py).
 *   acct_main race A B ITER [nested]  two threads at once: the first moves 1
 *       from A to B ITER times, the second 2 from B to A; prints
 *       "done met=M failed=F" (M: both first transfers were inside at once;
 *       F: transfers that did not return 1, such as skipped ones)
 *   acct_main once FROM TO N [nested]  one transfer; prints "rc=R us=U" (U: the
 *       call's time in µs)
 *   acct_main hold A                   holds A until a line comes (acct_hold)
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void acct_nested(int on);
int acct_inside(void);
int acct_transfer(const char *from, const char *to, long n, int who);
int acct_hold(const char *path);

static const char *acct[2];
static long iters;
static long failed;
static pthread_barrier_t start;

static void *mover(void *arg)
{
	int who = (int)(long)arg;
	long bad = 0;

	pthread_barrier_wait(&start);
	for (long i = 0; i < iters; i++)
		bad += acct_transfer(acct[who], acct[1 - who], who + 1, who) != 1;
	__atomic_add_fetch(&failed, bad, __ATOMIC_SEQ_CST);
	return NULL;
}

int main(int argc, char **argv)
{
	pthread_t th[2];

	if (argc < 3)
		return 2;
	acct_nested(argc == 6 && !strcmp(argv[5], "nested"));
	if (!strcmp(argv[1], "hold"))
		return acct_hold(argv[2]) == 1 ? 0 : 1;
	if (!strcmp(argv[1], "once") && argc >= 5) {
		struct timespec t0, t1;
		int rc;

		clock_gettime(CLOCK_MONOTONIC, &t0);
		rc = acct_transfer(argv[2], argv[3], atol(argv[4]), -1);
		clock_gettime(CLOCK_MONOTONIC, &t1);
		printf("rc=%d us=%ld\n", rc, (long)((t1.tv_sec - t0.tv_sec) * 1000000 +
						      (t1.tv_nsec - t0.tv_nsec) / 1000));
		return 0;
	}
	if (strcmp(argv[1], "race") || argc < 5)
		return 2;
	acct[0] = argv[2];
	acct[1] = argv[3];
	iters = atol(argv[4]);
	pthread_barrier_init(&start, NULL, 2);
	for (long i = 0; i < 2; i++)
		pthread_create(&th[i], NULL, mover, (void *)i);
	for (int i = 0; i < 2; i++)
		pthread_join(th[i], NULL);
	printf("done met=%d failed=%ld\n", acct_inside(), failed);
	return 0;
}
