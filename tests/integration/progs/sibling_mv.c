/* SPDX-License-Identifier: MIT */
/*
 * sibling_mv DIR N: renames DIR/a.PID to DIR/b.PID and back, N times each
 * way, with rename(2) or, built with -DCALL_RENAMEAT2, with renameat2(2)
 * only: one program per sibling, as mv (renameat2) and older tools
 * (rename) are (test_siblings.py). Built with -DCALL_FDATASYNC, it also
 * syncs the file with fdatasync(2) first. Prints "done N" and exits 0, or
 * names the failed call and exits 1.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int move(const char *from, const char *to)
{
#ifdef CALL_RENAMEAT2
	return renameat2(AT_FDCWD, from, AT_FDCWD, to, 0);
#else
	return rename(from, to);
#endif
}

int main(int argc, char **argv)
{
	char a[4096], b[4096];
	long n;
	int fd;

	if (argc != 3)
		return 2;
	n = atol(argv[2]);
	snprintf(a, sizeof(a), "%s/a.%d", argv[1], (int)getpid());
	snprintf(b, sizeof(b), "%s/b.%d", argv[1], (int)getpid());
	if ((fd = open(a, O_WRONLY | O_CREAT, 0644)) < 0)
		return 1;
#ifdef CALL_FDATASYNC
	if (fdatasync(fd) != 0)
		return 1;
#endif
	close(fd);
	for (long i = 0; i < n; i++) {
		if (move(a, b) != 0 || move(b, a) != 0) {
			printf("failed %ld: %s\n", i, strerror(errno));
			return 1;
		}
	}
	unlink(a);
	printf("done %ld\n", n);
	return 0;
}
