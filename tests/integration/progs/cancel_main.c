/* SPDX-License-Identifier: MIT */
/*
 * cancel_main: a worker thread calls block_read (libcancel.so) on a pipe
 * nobody writes, so it blocks in read(2), a cancellation point, inside the
 * call. The main thread then runs one step per line of standard input:
 *   1. pthread_cancel(worker) (deferred, the default) and pthread_join;
 *      prints "joined canceled" when the join yields PTHREAD_CANCELED,
 *      else "joined returned"
 *   2. prints "quick R" for R = quick_call(20) (41; -1 when skipped)
 *   3. exits 0
 * The worker prints "returned N" only if block_read ever returns.
 */
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>

int block_read(int fd);
int quick_call(int x);

static int pipefd[2];

static void *worker(void *arg)
{
	(void)arg;
	printf("returned %d\n", block_read(pipefd[0]));
	fflush(stdout);
	return NULL;
}

static int step(void)
{
	char line[64];

	return fgets(line, sizeof(line), stdin) != NULL;
}

int main(void)
{
	pthread_t t;
	void *res;

	if (pipe(pipefd) != 0 || pthread_create(&t, NULL, worker, NULL) != 0)
		return 3;
	if (!step())
		return 4;
	pthread_cancel(t);
	pthread_join(t, &res);
	printf("joined %s\n", res == PTHREAD_CANCELED ? "canceled" : "returned");
	fflush(stdout);
	if (!step())
		return 4;
	printf("quick %d\n", quick_call(20));
	fflush(stdout);
	if (!step())
		return 4;
	return 0;
}
