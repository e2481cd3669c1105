/* A legacy library whose functions the tests guard. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

/* Announces itself on stdout, then works for ms milliseconds. */
int hold_call(int ms)
{
	printf("enter %d\n", ms);
	fflush(stdout);
	if (ms)
		usleep((useconds_t)ms * 1000);
	errno = 0;
	return 42;
}

int other_call(int x)
{
	return x + 1;
}

/* Forks while guarded; the parent waits for the child before returning. */
int fork_call(void)
{
	pid_t p = fork();
	int st;

	if (p > 0)
		waitpid(p, &st, 0);
	return p;
}

/* Ends the process from inside a guarded call. */
int exit_call(int code)
{
	exit(code);
}

/* Appends "<pid>\n" to path: the order in which callers entered. */
int log_call(const char *path)
{
	char line[32];
	int fd = open(path, O_WRONLY | O_APPEND | O_CREAT, 0644);
	int n = snprintf(line, sizeof(line), "%d\n", (int)getpid());

	if (fd < 0 || write(fd, line, (size_t)n) != n)
		return -1;
	close(fd);
	return 1;
}

int nest(int depth, int ms);
/* A data relocation, so every level goes through the shim. */
static int (*volatile nest_ptr)(int, int) = nest;

/* Recurses depth times through nest_ptr, then works ms at the bottom: with
 * key "{arg0}" each level holds a different lock. */
int nest(int depth, int ms)
{
	if (depth == 0) {
		printf("bottom\n");
		fflush(stdout);
		usleep((useconds_t)ms * 1000);
		return 0;
	}
	return nest_ptr(depth - 1, ms) + 1;
}
