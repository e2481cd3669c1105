/* SPDX-License-Identifier: MIT */
/*
 * libsection.so - the benchmark's "legacy" library.
 *
 * section(path): the critical section: read "count pid" from a counter file,
 * add one, write it back with our pid. It records when it was entered and
 * counts hand-offs (the previous section ran in another process).
 * bench_noop(x): a trivial function, for the per-call overhead rows.
 * bench_noop_wide(x): as trivial, but longer than the 5-byte jump of entry
 * patching (bench_noop's `lea; ret` is 4 bytes, which entry patching
 * refuses), for the entry-versus-relocation rows; worker.c's bench_noop_exe
 * has the same body.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

long long section_entered_ns;
long section_handoffs;

static long long now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

long section(const char *path)
{
	char buf[64];
	long count = 0, pid = 0;
	int fd, n;

	section_entered_ns = now_ns();
	fd = open(path, O_RDWR);
	if (fd < 0)
		return -1;
	n = (int)read(fd, buf, sizeof(buf) - 1);
	buf[n > 0 ? n : 0] = 0;
	sscanf(buf, "%ld %ld", &count, &pid);
	if (pid != getpid())
		section_handoffs++;
	n = snprintf(buf, sizeof(buf), "%ld %d\n", count + 1, (int)getpid());
	if (pwrite(fd, buf, (size_t)n, 0) != n)
		count = -2;
	close(fd);
	return count + 1;
}

int bench_noop(int x)
{
	return x + 1;
}

int bench_noop_wide(int x)
{
	return x * 7 + 13;
}
