/* A legacy library whose functions the tests guard. */
#include <errno.h>
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
