/*
 * vfork_main N [MODE]: calls libtarget's other_call (guarded by the tests,
 * its lock kept between calls), then N times: vfork()s a child that closes
 * every descriptor from 3 up (as Python's subprocess and posix_spawn users
 * do) and execve()s /bin/true, waits for it, and calls other_call again.
 * MODE says how the child closes them: "close_range" (the libc function,
 * the default), "syscall" (the raw system call, unseen by any wrapper) or
 * "none". After each call it prints
 *   iter I rc=R errno=E us=T fds=F
 * (I from 0; T the call's duration in microseconds; F the number of open
 * descriptors, counted in /proc/self/fd). Exits 3 if a child fails.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int other_call(int x);

extern char **environ;

static int count_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	int n = 0;

	if (!d)
		return -1;
	while (readdir(d))
		n++;
	closedir(d);
	return n - 3; /* ".", ".." and the directory's own descriptor */
}

static long long now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000000LL + ts.tv_nsec / 1000;
}

static void guarded_call(int i)
{
	long long t0;
	int rc, e;

	errno = 0;
	t0 = now_us();
	rc = other_call(i);
	e = errno;
	printf("iter %d rc=%d errno=%d us=%lld fds=%d\n", i, rc, e, now_us() - t0, count_fds());
	fflush(stdout);
}

static int spawn_true(const char *mode)
{
	char *argv[] = { "/bin/true", NULL };
	pid_t pid = vfork();
	int st;

	if (pid == 0) {
		if (!strcmp(mode, "close_range"))
			close_range(3, ~0U, 0);
		else if (!strcmp(mode, "syscall"))
			syscall(SYS_close_range, 3, ~0U, 0);
		execve(argv[0], argv, environ);
		_exit(127);
	}
	if (pid < 0 || waitpid(pid, &st, 0) != pid)
		return -1;
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

int main(int argc, char **argv)
{
	int n = argc > 1 ? atoi(argv[1]) : 4;
	const char *mode = argc > 2 ? argv[2] : "close_range";

	guarded_call(0);
	for (int i = 1; i <= n; i++) {
		if (spawn_true(mode) != 0)
			return 3;
		guarded_call(i);
	}
	return 0;
}
