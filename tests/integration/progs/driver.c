/*
 * driver STEP...: runs steps in order and reports on stdout.
 *   call:MS    rc = hold_call(MS); prints "rc=R errno=E"
 *   other:X    rc = other_call(X); prints "rc=R errno=E"
 *   exit:N     exit_call(N): exits with status N from inside the call
 *   log:PATH   log_call(PATH): appends this pid to PATH
 *   nest:N:MS  nest(N, MS): N nested guarded calls, MS at the bottom
 *   stdin      waits for one line on standard input
 *   write      write(2)s "written" to stdout directly
 *   exec:STEP  execs this program again with the single step STEP (execl)
 *   execle:STEP the same through execle, passing the environment
 *   atexit     registers a handler that calls other_call(5) at exit
 *   ignore-term ignores SIGTERM from now on
 *   fork       fork_call(); the child probes other_call and hold_call
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int hold_call(int ms);
int other_call(int x);
int fork_call(void);
int exit_call(int code);
int log_call(const char *path);
int nest(int depth, int ms);

static void at_exit(void)
{
	printf("atexit other rc=%d\n", other_call(5));
	fflush(stdout);
}

static void report(const char *what, int rc)
{
	printf("%s rc=%d errno=%d\n", what, rc, errno);
	fflush(stdout);
}

extern char **environ;

int main(int argc, char **argv)
{
	char line[64];

	for (int i = 1; i < argc; i++) {
		/* Each step reports the errno its own call left: C starts a
		 * program with errno 0, a sanitizer's start-up may not. */
		errno = 0;
		if (!strncmp(argv[i], "call:", 5)) {
			errno = 0;
			report("call", hold_call(atoi(argv[i] + 5)));
		} else if (!strncmp(argv[i], "other:", 6)) {
			errno = 0;
			report("other", other_call(atoi(argv[i] + 6)));
		} else if (!strncmp(argv[i], "exit:", 5)) {
			exit_call(atoi(argv[i] + 5));
		} else if (!strncmp(argv[i], "log:", 4)) {
			report("log", log_call(argv[i] + 4));
		} else if (!strncmp(argv[i], "nest:", 5)) {
			int depth = atoi(argv[i] + 5);
			const char *ms = strchr(argv[i] + 5, ':');

			report("nest", nest(depth, ms ? atoi(ms + 1) : 0));
		} else if (!strcmp(argv[i], "stdin")) {
			if (!fgets(line, sizeof(line), stdin))
				return 4;
		} else if (!strcmp(argv[i], "write")) {
			if (write(1, "written\n", 8) != 8)
				return 5;
		} else if (!strncmp(argv[i], "exec:", 5)) {
			execl("/proc/self/exe", argv[0], argv[i] + 5, (char *)NULL);
			return 6;
		} else if (!strncmp(argv[i], "execle:", 7)) {
			execle("/proc/self/exe", argv[0], argv[i] + 7, (char *)NULL, environ);
			return 6;
		} else if (!strcmp(argv[i], "atexit")) {
			atexit(at_exit);
		} else if (!strcmp(argv[i], "ignore-term")) {
			signal(SIGTERM, SIG_IGN);
		} else if (!strcmp(argv[i], "fork")) {
			int p = fork_call();

			if (p == 0) {
				errno = 0;
				report("child-other", other_call(1));
				errno = 0;
				report("child-own", hold_call(0));
				fflush(stdout);
				exit(0);
			}
			report("parent-fork", p > 0);
		} else {
			fprintf(stderr, "unknown step %s\n", argv[i]);
			return 2;
		}
	}
	return 0;
}
