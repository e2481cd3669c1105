/*
 * canonical: a non-PIE executable (gcc -no-pie -fno-pie) that takes the
 * address of libcanonical.so's canon_add, so its own PLT entry for canon_add
 * is the function's canonical address (what dlsym(RTLD_DEFAULT) returns and
 * what other objects' GOT slots hold). It calls canon_add once in each way
 * and prints one line per call, "<how> <result>":
 *   direct   canon_add(1) through the executable's PLT
 *   pointer  through a pointer the executable stored (the canonical address)
 *   lib-plt  lib_call_plt(3): the library calls it through its PLT
 *   lib-got  lib_call_got(4): the library calls it through its GOT
 *   dlsym    through dlsym(RTLD_DEFAULT, "canon_add")
 * Each line is printed after its call returns: every call is guarded once.
 */
#include <dlfcn.h>
#include <stdio.h>

int canon_add(int x);
int lib_call_plt(int x);
int lib_call_got(int x);

/* Set in main: non-PIE code takes the address as an absolute immediate,
 * which makes the linker turn the executable's PLT entry for canon_add into
 * its canonical address (the symbol's value in .dynsym). */
int (*volatile exe_ptr)(int);

static void report(const char *how, int rc)
{
	printf("%s %d\n", how, rc);
	fflush(stdout);
}

int main(void)
{
	int (*sym)(int);

	exe_ptr = canon_add;
	report("direct", canon_add(1));
	report("pointer", exe_ptr(2));
	report("lib-plt", lib_call_plt(3));
	report("lib-got", lib_call_got(4));
	*(void **)&sym = dlsym(RTLD_DEFAULT, "canon_add");
	if (!sym) {
		fprintf(stderr, "dlsym: %s\n", dlerror());
		return 3;
	}
	report("dlsym", sym(5));
	return 0;
}
