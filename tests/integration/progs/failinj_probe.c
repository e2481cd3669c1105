/*
 * failinj_probe: the control for failinj.c. Starts a thread and allocates
 * 100 bytes, once, and prints "thread rc=R alloc=ok|null errno=E" with
 * write(2) (stdio could need the allocator that is failing).
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static void *nothing(void *arg)
{
	return arg;
}

int main(void)
{
	pthread_t th;
	char line[96];
	int rc = pthread_create(&th, NULL, nothing, NULL), n, err;
	void *p;

	if (rc == 0)
		pthread_join(th, NULL);
	errno = 0;
	p = malloc(100);
	err = errno;
	n = snprintf(line, sizeof(line), "thread rc=%d alloc=%s errno=%d\n", rc,
		     p ? "ok" : "null", p ? 0 : err);
	free(p);
	return write(1, line, (size_t)n) == n ? 0 : 1;
}
