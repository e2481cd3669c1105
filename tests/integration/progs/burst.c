/*
 * burst THREADS PATH: THREADS threads wait at a barrier, then all call
 * ledger_update(PATH) once at the same moment (each thread's first guarded
 * call: the moment the shim builds its holder identity). Prints "done" and
 * exits after a line on stdin, so that the test can read /proc/<pid> first.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

int ledger_update(const char *path);

static pthread_barrier_t go;
static const char *path;

static void *worker(void *arg)
{
	(void)arg;
	pthread_barrier_wait(&go);
	if (ledger_update(path) < 0)
		abort();
	return NULL;
}

int main(int argc, char **argv)
{
	pthread_t th[64];
	char line[16];
	int n = argc > 2 ? atoi(argv[1]) : 0;

	if (n < 1 || n > 64)
		return 2;
	path = argv[2];
	pthread_barrier_init(&go, NULL, (unsigned)n);
	for (int i = 0; i < n; i++)
		if (pthread_create(&th[i], NULL, worker, NULL) != 0)
			return 3;
	for (int i = 0; i < n; i++)
		pthread_join(th[i], NULL);
	printf("done\n");
	fflush(stdout);
	return fgets(line, sizeof(line), stdin) ? 0 : 4;
}
