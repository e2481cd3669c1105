/* SPDX-License-Identifier: MIT */
/* libcancel.so: the functions test_interposition.py's cancellation test guards. */
#include <stdio.h>
#include <unistd.h>

/* Prints "inside", then blocks in read(2), a cancellation point, until fd
 * has data or reaches end of file. */
int block_read(int fd)
{
	char c;

	printf("inside\n");
	fflush(stdout);
	return (int)read(fd, &c, 1);
}

int quick_call(int x)
{
	return 2 * x + 1;
}
