/* SPDX-License-Identifier: MIT */
/*
 * libsibling_slow.so, preloaded after the shim: rename and renameat2 that
 * take a while and say so. Each outermost call appends "E <pid>" to the
 * journal $SIB_JOURNAL (one write, O_APPEND: the file's order is the order
 * of the calls), runs the real function, waits SIB_HOLD_MS (default 10),
 * and appends "L <pid>"; two processes inside at once show as interleaved
 * lines. rename calls renameat2 through its own PLT slot, which the shim
 * catches too (one lock of both: a reentrant entry). With $SIB_MEET (a
 * directory), the first call also waits, up to SIB_MEET_MS, inside, for
 * another process to enter: without a lock both are inside together.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static __thread int depth;
static int met;

static void note(char what)
{
	const char *path = getenv("SIB_JOURNAL");
	char line[64];
	int fd, n;

	if (!path || (fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644)) < 0)
		return;
	n = snprintf(line, sizeof(line), "%c %d\n", what, (int)getpid());
	if (write(fd, line, (size_t)n) != n)
		abort();
	close(fd);
}

static void pause_ms(long ms)
{
	struct timespec t = { ms / 1000, (ms % 1000) * 1000000L };

	while (nanosleep(&t, &t) != 0)
		;
}

/* The files in dir, "." and ".." aside. */
static int entries(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	int n = 0;

	while (d && (e = readdir(d)))
		n += e->d_name[0] != '.';
	if (d)
		closedir(d);
	return n;
}

/* First call with $SIB_MEET: marks this process inside, and waits (up to
 * SIB_MEET_MS, default 3000) for another one to be inside too. */
static void meet(void)
{
	const char *dir = getenv("SIB_MEET"), *ms = getenv("SIB_MEET_MS");
	char mark[4096];
	long left = ms ? atol(ms) : 3000;
	int fd;

	if (!dir || met++)
		return;
	snprintf(mark, sizeof(mark), "%s/%d", dir, (int)getpid());
	if ((fd = open(mark, O_WRONLY | O_CREAT | O_CLOEXEC, 0644)) >= 0)
		close(fd);
	for (; left > 0 && entries(dir) < 2; left -= 5)
		pause_ms(5);
}

static void enter(void)
{
	if (depth++ == 0) {
		note('E');
		meet();
	}
}

static void leave(void)
{
	const char *hold = getenv("SIB_HOLD_MS");

	if (--depth == 0) {
		pause_ms(hold ? atol(hold) : 10);
		note('L');
	}
}

int renameat2(int ofd, const char *from, int nfd, const char *to, unsigned flags)
{
	int (*real)(int, const char *, int, const char *, unsigned) =
		(int (*)(int, const char *, int, const char *, unsigned))dlsym(RTLD_NEXT,
									       "renameat2");
	int rc;

	enter();
	rc = real(ofd, from, nfd, to, flags);
	leave();
	return rc;
}

int rename(const char *from, const char *to)
{
	int rc;

	enter();
	rc = renameat2(AT_FDCWD, from, AT_FDCWD, to, 0); /* through the PLT */
	leave();
	return rc;
}
