/*
 * quit STEP...: ways for a process to end while it holds a lock
 * (test_stranded.py). Runs the steps in order and reports on stdout.
 *   call    rc = hold_call(0); prints "call rc=R errno=E"
 *   stdin   waits for one line on standard input
 *   _exit   _exit(0)
 *   _Exit   _Exit(0)
 *   abort   abort()
 *   segv    stores through a null pointer (SIGSEGV)
 *   fork    forks; the child calls hold_call 3 times, prints
 *           "child pid=P calls=N" and ends with _exit(0); the parent reaps
 *           it and prints "reaped pid=P status=S"
 *   vfork   vforks; the child calls _exit(0) at once; the parent reaps it
 *           and prints "vfork reaped pid=P status=S"
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

int hold_call(int ms);

static void reap(const char *what, pid_t pid)
{
	int st = -1;

	if (pid < 0 || waitpid(pid, &st, 0) != pid) {
		perror(what);
		exit(3);
	}
	printf("%s pid=%d status=%d\n", what, (int)pid, st);
	fflush(stdout);
}

int main(int argc, char **argv)
{
	char line[64];

	for (int i = 1; i < argc; i++) {
		const char *s = argv[i];

		if (!strcmp(s, "call")) {
			int rc;

			errno = 0;
			rc = hold_call(0);
			printf("call rc=%d errno=%d\n", rc, errno);
			fflush(stdout);
		} else if (!strcmp(s, "stdin")) {
			if (!fgets(line, sizeof(line), stdin))
				return 4;
		} else if (!strcmp(s, "_exit")) {
			_exit(0);
		} else if (!strcmp(s, "_Exit")) {
			_Exit(0);
		} else if (!strcmp(s, "abort")) {
			abort();
		} else if (!strcmp(s, "segv")) {
			*(volatile int *)(void *)0 = 1;
		} else if (!strcmp(s, "fork")) {
			pid_t p = fork();

			if (p == 0) {
				int ok = 0;

				for (int n = 0; n < 3; n++)
					ok += hold_call(0) == 42;
				printf("child pid=%d calls=%d\n", (int)getpid(), ok);
				fflush(stdout);
				_exit(0);
			}
			reap("reaped", p);
		} else if (!strcmp(s, "vfork")) {
			pid_t p = vfork();

			if (p == 0)
				_exit(0);
			reap("vfork reaped", p);
		} else {
			fprintf(stderr, "unknown step %s\n", s);
			return 2;
		}
	}
	return 0;
}
