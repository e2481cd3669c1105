/*
 * A library whose constructor starts a thread (it blocks in pause() until
 * the process ends): when the shim's constructor runs, the process has two
 * threads, so entries cannot be patched safely (test_entry.py).
 */
#include <pthread.h>
#include <unistd.h>

static void *idle(void *arg)
{
	(void)arg;
	for (;;)
		pause();
	return NULL;
}

__attribute__((constructor)) static void start_a_thread(void)
{
	pthread_t t;

	if (pthread_create(&t, NULL, idle, NULL) == 0)
		pthread_detach(t);
}
