/*
 * Calls lib_outer (entry_sym.c) twice and prints the results; lib_outer
 * calls lib_inner twice each time. With ENTRY_MARK set, main first creates
 * that file.
 */
#include <stdio.h>
#include <stdlib.h>

int lib_outer(int x);

int main(void)
{
	const char *mark = getenv("ENTRY_MARK");
	FILE *m = mark ? fopen(mark, "w") : NULL;
	int a, b;

	if (m)
		fclose(m);
	a = lib_outer(1);
	b = lib_outer(10);
	printf("lib_outer %d %d\n", a, b);
	return 0;
}
