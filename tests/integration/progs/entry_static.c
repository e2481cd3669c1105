/*
 * A `static` function of the executable, in .symtab only: scale(x) is
 * called directly from main three times and the results printed. The
 * stripped copies of this program (debug file found by build-id or by
 * .gnu_debuglink, or the function named by offset) are built from it by
 * test_entry.py. With ENTRY_MARK set, main first creates that file.
 */
#include <stdio.h>
#include <stdlib.h>

static __attribute__((noinline, noclone)) int scale(int x)
{
	int r = x * 3;

	if (r > 100)
		r -= 100;
	return r;
}

int main(int argc, char **argv)
{
	const char *mark = getenv("ENTRY_MARK");
	FILE *m = mark ? fopen(mark, "w") : NULL;

	(void)argv;
	if (m)
		fclose(m);
	printf("scale %d\n", scale(argc + 13));
	printf("scale %d\n", scale(argc + 40));
	printf("scale %d\n", scale(argc));
	return 0;
}
