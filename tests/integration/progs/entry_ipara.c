/*
 * Interprocedural register allocation (-fipa-ra, on at -O2): gcc knows
 * that the static leaf mix() clobbers only a few registers, so its caller
 * sum_mix keeps values in other call-clobbered registers across the calls.
 * A wrapper reached through mix's patched entry must leave them as mix
 * would. Prints the sums; with ENTRY_MARK set, main first creates that file.
 */
#include <stdio.h>
#include <stdlib.h>

static __attribute__((noinline, noclone)) int mix(int x)
{
	return x * x + 2;
}

__attribute__((noinline, noclone)) long sum_mix(int a, int b, int c)
{
	long s = 0;

	s += (long)mix(a) * b + c;
	s += (long)mix(b) * c + a;
	s += (long)mix(c) * a + b;
	return s;
}

int main(int argc, char **argv)
{
	const char *mark = getenv("ENTRY_MARK");
	FILE *m = mark ? fopen(mark, "w") : NULL;

	(void)argv;
	if (m)
		fclose(m);
	printf("sum_mix %ld\n", sum_mix(argc + 2, argc + 4, argc + 6));
	printf("sum_mix %ld\n", sum_mix(argc * 10, argc * 20, argc * 30));
	return 0;
}
