/* A program that calls its own exported function (built with -rdynamic). */
#include <stdio.h>

int local_step(int x)
{
	return x * 2;
}

int main(void)
{
	printf("local %d\n", local_step(21));
	return 0;
}
