/*
 * Interprocedural register allocation (-fipa-ra, on at -O2): gcc knows
 * that the leaf mix() (static) and gmix() (global, but not interposable in
 * an executable) clobber only a few registers, so their callers keep
 * values in other call-clobbered registers across the calls. A wrapper
 * reached through a patched entry must leave them as the function would.
 * Prints the sums; with ENTRY_MARK set, main first creates that file.
 */
#include <stdio.h>
#include <stdlib.h>

static __attribute__((noinline, noclone)) int mix(int x)
{
	return x * x + 2;
}

__attribute__((noinline, noclone)) int gmix(int x)
{
	return x * x + 3;
}

__attribute__((noinline, noclone)) long sum_mix(int a, int b, int c)
{
	long s = 0;

	s += (long)mix(a) * b + c;
	s += (long)mix(b) * c + a;
	s += (long)mix(c) * a + b;
	return s;
}

__attribute__((noinline, noclone)) long sum_gmix(int a, int b, int c)
{
	long s = 0;

	s += (long)gmix(a) * b + c;
	s += (long)gmix(b) * c + a;
	s += (long)gmix(c) * a + b;
	return s;
}

int main(int argc, char **argv)
{
	const char *mark = getenv("ENTRY_MARK");
	FILE *m = mark ? fopen(mark, "w") : NULL;

	(void)argv;
	if (m)
		fclose(m);
	printf("sum_mix %ld %ld\n", sum_mix(argc + 2, argc + 4, argc + 6),
	       sum_mix(argc * 10, argc * 20, argc * 30));
	printf("sum_gmix %ld %ld\n", sum_gmix(argc + 2, argc + 4, argc + 6),
	       sum_gmix(argc * 10, argc * 20, argc * 30));
	return 0;
}
