/*
 * entry_ledger MODE PATH N [THREADS] [DEPTH]: post_ledger, a function of this
 * executable (not exported: built without -rdynamic), does a
 * read-modify-write of the counter file PATH with a 1 ms window; before
 * that it calls itself for DEPTH - 1 (recursion, not a tail call). Each of
 * THREADS threads makes N calls. MODE:
 *   direct  called directly from inside the executable
 *   fnptr   through a pointer stored in static data before start-up
 * Built -O0, -O2, -fcf-protection, -pg -mfentry, PIE and -no-pie by
 * test_entry.py. With ENTRY_MARK set, main first creates that file.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

__attribute__((noinline, noclone)) int post_ledger(const char *path, int depth)
{
	long v = 0;
	FILE *f;

	if (depth > 1 && post_ledger(path, depth - 1) < 0)
		return -1;
	f = fopen(path, "r");
	if (f) {
		if (fscanf(f, "%ld", &v) != 1)
			v = 0;
		fclose(f);
	}
	usleep(1000);
	f = fopen(path, "w");
	if (!f)
		return -1;
	fprintf(f, "%ld\n", v + 1);
	fclose(f);
	return (int)(v + 1);
}

static int (*const stored_ptr)(const char *, int) = post_ledger;
static int use_ptr;
static const char *path;
static int n, depth = 1;

static void *worker(void *arg)
{
	(void)arg;
	for (int i = 0; i < n; i++) {
		int rc = use_ptr ? (*(int (*volatile const *)(const char *, int))&stored_ptr)(path, depth)
				 : post_ledger(path, depth);

		if (rc < 0)
			abort();
	}
	return NULL;
}

int main(int argc, char **argv)
{
	const char *mark = getenv("ENTRY_MARK");
	FILE *m = mark ? fopen(mark, "w") : NULL;
	int threads = argc > 4 ? atoi(argv[4]) : 1;
	pthread_t th[64];

	if (m)
		fclose(m);
	if (argc < 4 || threads < 1 || threads > 64)
		return 2;
	use_ptr = !strcmp(argv[1], "fnptr");
	path = argv[2];
	n = atoi(argv[3]);
	if (argc > 5)
		depth = atoi(argv[5]);
	for (int i = 0; i < threads; i++)
		pthread_create(&th[i], NULL, worker, NULL);
	for (int i = 0; i < threads; i++)
		pthread_join(th[i], NULL);
	return 0;
}
