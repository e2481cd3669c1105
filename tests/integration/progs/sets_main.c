/*
 * sets KIND THREADS ITERS MS [STOPFILE]: THREADS threads each make ITERS
 * calls of set_read (KIND r) or set_write (w) that last MS ms on average
 * (each between MS/2 and 3 MS/2, at random: threads never keep in step),
 * or, with STOPFILE, calls until that file exists (ITERS at least). Prints
 * "started" once a call returned, and at the end "done ok=N failed=N
 * max_ms=N" (calls that returned 1, calls that did not, the longest call).
 * sets rw|wr MS: one set_read_then(set_write) (rw) or set_write_then(set_read)
 * (wr) call; prints "nested rc=R errno=E".
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

int set_read(int ms);
int set_write(int ms);
int set_read_then(int (*inner)(int), int ms);
int set_write_then(int (*inner)(int), int ms);

static int (*fn)(int);
static long iters, ok, failed;
static int ms;
static double max_ms;
static const char *stop;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static double now_ms(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static void *work(void *arg)
{
	unsigned seed = (unsigned)getpid() * 2654435761u + (unsigned)(long)arg;

	for (long i = 0; i < iters || (stop && access(stop, F_OK) != 0); i++) {
		double t0 = now_ms(), d;
		int rc = fn(ms / 2 + (ms ? rand_r(&seed) % (ms + 1) : 0));

		d = now_ms() - t0;
		pthread_mutex_lock(&mu);
		if (rc == 1)
			ok++;
		else
			failed++;
		if (d > max_ms)
			max_ms = d;
		pthread_mutex_unlock(&mu);
		if (i == 0 && arg == NULL) {
			printf("started\n");
			fflush(stdout);
		}
	}
	return NULL;
}

int main(int argc, char **argv)
{
	pthread_t th[16];
	int n;

	if (argc == 3) {
		int rc = argv[1][0] == 'r' ? set_read_then(set_write, atoi(argv[2]))
					   : set_write_then(set_read, atoi(argv[2]));

		printf("nested rc=%d errno=%d\n", rc, rc == 1 ? 0 : errno);
		return 0;
	}
	if (argc < 5 || argc > 6)
		return 2;
	fn = argv[1][0] == 'w' ? set_write : set_read;
	n = atoi(argv[2]);
	iters = atol(argv[3]);
	ms = atoi(argv[4]);
	stop = argc == 6 ? argv[5] : NULL;
	if (n < 1 || n > 16)
		return 2;
	for (long i = 0; i < n; i++)
		pthread_create(&th[i], NULL, work, (void *)i);
	for (int i = 0; i < n; i++)
		pthread_join(th[i], NULL);
	printf("done ok=%ld failed=%ld max_ms=%.0f\n", ok, failed, max_ms);
	return 0;
}
