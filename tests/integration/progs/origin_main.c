/*
 * origin_main WHO NAME SYMBOL ARG [stdin]: dlopen(NAME, RTLD_NOW), dlsym
 * SYMBOL in it, call it as int SYMBOL(int ARG) and print "SYMBOL rc=R".
 * WHO says which object calls dlopen, so whose directory "$ORIGIN" in NAME
 * stands for: "exe" (this executable) or "lib" (liboriginload.so, this
 * file built with -DORIGIN_LOADER, through its origin_dlopen).
 * With "stdin" it then waits for one line on standard input before exiting.
 * Exits 2 printing "dlopen: <dlerror>" when the load fails, 3 when dlsym does.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void *origin_dlopen(const char *name);

#ifdef ORIGIN_LOADER

/* A library's own dlopen call: "$ORIGIN" is this library's directory.
 * (Not a tail call, which would make the executable the caller.) */
void *origin_dlopen(const char *name)
{
	void *volatile h = dlopen(name, RTLD_NOW);

	return h;
}

#else

int main(int argc, char **argv)
{
	char line[64];
	void *h;
	int (*fn)(int);

	if (argc < 5) {
		fprintf(stderr, "usage: origin_main exe|lib NAME SYMBOL ARG [stdin]\n");
		return 64;
	}
	h = !strcmp(argv[1], "lib") ? origin_dlopen(argv[2]) : dlopen(argv[2], RTLD_NOW);
	if (!h) {
		printf("dlopen: %s\n", dlerror());
		return 2;
	}
	*(void **)&fn = dlsym(h, argv[3]);
	if (!fn) {
		printf("dlsym: %s\n", dlerror());
		return 3;
	}
	printf("%s rc=%d\n", argv[3], fn(atoi(argv[4])));
	fflush(stdout);
	if (argc > 5 && !strcmp(argv[5], "stdin") && !fgets(line, sizeof(line), stdin))
		return 4;
	return 0;
}

#endif
