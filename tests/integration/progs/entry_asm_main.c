/*
 * Calls each function of entry_asm.S twice, directly (calls inside the
 * executable), in a fixed order, and prints the results. With ENTRY_MARK
 * set, first creates that file: proof that main ran.
 */
#include <stdio.h>
#include <stdlib.h>

int rip_first(int x);
int early_exit(int x);
int endbr_first(int x);
int tiny(int x);
int loop_back(int n, int s);
int loop_mid(int n);
int call_first(int x);
int jmp_first(int x);

int main(void)
{
	const char *mark = getenv("ENTRY_MARK");
	FILE *m = mark ? fopen(mark, "w") : NULL;
	int a, b;

	if (m)
		fclose(m);
	a = rip_first(3);
	b = rip_first(4);
	printf("rip_first %d %d\n", a, b);
	a = early_exit(0);
	b = early_exit(5);
	printf("early_exit %d %d\n", a, b);
	a = endbr_first(2);
	b = endbr_first(7);
	printf("endbr_first %d %d\n", a, b);
	a = tiny(9);
	b = tiny(11);
	printf("tiny %d %d\n", a, b);
	a = loop_back(4, 10);
	b = loop_back(1, 0);
	printf("loop_back %d %d\n", a, b);
	a = loop_mid(3);
	b = loop_mid(1);
	printf("loop_mid %d %d\n", a, b);
	a = call_first(5);
	b = call_first(-1);
	printf("call_first %d %d\n", a, b);
	a = jmp_first(4);
	b = jmp_first(0);
	printf("jmp_first %d %d\n", a, b);
	return 0;
}
