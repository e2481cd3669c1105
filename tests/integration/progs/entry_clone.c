/*
 * A function gcc clones: built with -O2 -fipa-cp-clone, main's calls of
 * weigh with the constant step 4 go to weigh.constprop.0 (a copy in
 * .symtab that entry patching of weigh does not reach), the call with a
 * step known only at run time to weigh itself. Prints the results.
 */
#include <stdio.h>
#include <stdlib.h>

__attribute__((noinline)) long weigh(const int *v, int n, int step)
{
	long s = 0;

	if (n > 1000) {
		fprintf(stderr, "weigh: %d values is too many\n", n);
		exit(3);
	}
	for (int i = 0; i < n; i += step)
		s += (long)v[i] * (i + 1);
	return s;
}

int main(int argc, char **argv)
{
	int v[64];

	(void)argv;
	for (int i = 0; i < 64; i++)
		v[i] = i * argc;
	for (int k = 0; k < 3; k++)
		printf("weigh %ld\n", weigh(v, 64 - 5 * k, 4));
	printf("weigh %ld\n", weigh(v, 64, argc + 1));
	return 0;
}
