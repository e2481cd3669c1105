/*
 * ledger_main MODE PATH N [THREADS]: calls ledger_update(PATH) N times in
 * each of THREADS threads. MODE: direct (PLT or GOT call), fnptr (through a
 * pointer stored in data), dlsym (dlopen("libledger.so") + dlsym), plugin
 * (dlopen("libplugin.so"), found only through this program's RUNPATH).
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int ledger_update(const char *path);
static int (*const stored_ptr)(const char *) = ledger_update;
static int (*fn)(const char *);
static const char *path;
static int n;

static void *worker(void *arg)
{
	(void)arg;
	for (int i = 0; i < n; i++)
		if ((fn ? fn(path) : ledger_update(path)) < 0) /* direct: a PLT call */
			abort();
	return NULL;
}

int main(int argc, char **argv)
{
	int threads = argc > 4 ? atoi(argv[4]) : 1;
	pthread_t th[64];

	if (argc < 4)
		return 2;
	path = argv[2];
	n = atoi(argv[3]);
	if (!strcmp(argv[1], "direct")) {
		fn = NULL;
	} else if (!strcmp(argv[1], "fnptr")) {
		fn = *(int (*volatile const *)(const char *))&stored_ptr;
	} else {
		const char *lib = strcmp(argv[1], "plugin") ? "libledger.so" : "libplugin.so";
		void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);

		if (!h || !(fn = (int (*)(const char *))dlsym(h, "ledger_update"))) {
			fprintf(stderr, "dlopen/dlsym: %s\n", dlerror());
			return 3;
		}
	}
	for (int i = 0; i < threads; i++)
		pthread_create(&th[i], NULL, worker, NULL);
	for (int i = 0; i < threads; i++)
		pthread_join(th[i], NULL);
	return 0;
}
