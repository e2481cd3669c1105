/*
 * A program whose own function is neither exported (built without
 * -rdynamic) nor called through a relocation: main calls internal_step
 * directly, so no call of it can be caught. Prints "internal 42".
 */
#include <stdio.h>

__attribute__((noinline, noipa)) int internal_step(int x)
{
	return x * 3;
}

int main(void)
{
	printf("internal %d\n", internal_step(14));
	return 0;
}
