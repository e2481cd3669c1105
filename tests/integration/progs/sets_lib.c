/*
 * The observed calls of test_sets.py: set_read and set_write (one lock
 * each, possibly on one key) append "r+"/"w+" to $SETS_LOG when they start
 * and "r-"/"w-" when they end (O_APPEND: the lines of every process and
 * thread are in one order), and sleep ms in between. Replaying the file
 * counts who was inside at once: an overlap in the file was a real one.
 * Each returns 1. set_read_then and set_write_then (the same two locks)
 * call inner(ms) inside instead of sleeping, and return what it returned:
 * a call of one kind nested in the other.
 */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Appends the two-byte mark and a newline to $SETS_LOG. */
static void mark(char kind, char how)
{
	const char *path = getenv("SETS_LOG");
	char line[3] = { kind, how, '\n' };
	int fd;

	if (!path || (fd = open(path, O_WRONLY | O_APPEND | O_CREAT, 0644)) < 0)
		return;
	if (write(fd, line, sizeof(line)) != (ssize_t)sizeof(line))
		abort();
	close(fd);
}

static int visit(char kind, int ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };

	mark(kind, '+');
	while (nanosleep(&ts, &ts) != 0)
		;
	mark(kind, '-');
	return 1;
}

int set_read(int ms)
{
	return visit('r', ms);
}

int set_write(int ms)
{
	return visit('w', ms);
}

int set_read_then(int (*inner)(int), int ms)
{
	int rc;

	mark('r', '+');
	rc = inner(ms);
	mark('r', '-');
	return rc;
}

int set_write_then(int (*inner)(int), int ms)
{
	int rc;

	mark('w', '+');
	rc = inner(ms);
	mark('w', '-');
	return rc;
}
