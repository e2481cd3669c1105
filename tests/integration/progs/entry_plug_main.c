/*
 * entry_plug_main LIB: dlopens LIB (entry_plug.c) after start-up, calls its
 * plug_run(3) and prints the result. With ENTRY_MARK set, main first
 * creates that file.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
	const char *mark = getenv("ENTRY_MARK");
	FILE *m = mark ? fopen(mark, "w") : NULL;
	void *h;
	int (*run)(int);

	if (m)
		fclose(m);
	if (argc < 2)
		return 2;
	h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
	if (!h || !(run = (int (*)(int))dlsym(h, "plug_run"))) {
		fprintf(stderr, "dlopen/dlsym: %s\n", dlerror());
		return 3;
	}
	printf("plug_run %d\n", run(3));
	return 0;
}
