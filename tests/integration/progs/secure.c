/*
 * The program test_secure.py installs set-user-ID root: secure_work, the
 * function the configs guard, says how many threads the process has (the
 * shim's renewal thread is one) and its effective uid, then waits for a
 * line on stdin, so the test can look at Redis while the call runs.
 */
#include <stdio.h>
#include <unistd.h>

__attribute__((noinline)) int secure_work(int x)
{
	char line[128];
	FILE *f = fopen("/proc/self/status", "r");
	int threads = 0;

	while (f && fgets(line, sizeof(line), f))
		if (sscanf(line, "Threads: %d", &threads) == 1)
			break;
	if (f)
		fclose(f);
	printf("enter threads=%d euid=%d\n", threads, (int)geteuid());
	fflush(stdout);
	if (!fgets(line, sizeof(line), stdin))
		line[0] = 0;
	return x + 1;
}

int main(void)
{
	int r = secure_work(41);

	printf("leave %d\n", r);
	return r == 42 ? 0 : 1;
}
