/*
 * entry_once_main: exe_cb is called directly and from entry_once_lib.c
 * through its PLT; lib_twice through the PLT and through a pointer stored
 * in data before start-up. Prints the results; with ENTRY_MARK set, main
 * first creates that file. Built with -rdynamic (exe_cb is exported).
 */
#include <stdio.h>
#include <stdlib.h>

int lib_twice(int x);
int lib_calls_back(int x);
static int (*const stored)(int) = lib_twice;

__attribute__((noinline, noclone)) int exe_cb(int x)
{
	return x < 0 ? -x : x * 5;
}

int main(void)
{
	const char *mark = getenv("ENTRY_MARK");
	FILE *m = mark ? fopen(mark, "w") : NULL;
	int a, b, c, d;

	if (m)
		fclose(m);
	a = exe_cb(1);
	b = lib_calls_back(2);
	c = lib_twice(3);
	d = (*(int (*volatile const *)(int))&stored)(4);
	printf("once %d %d %d %d\n", a, b, c, d);
	return 0;
}
