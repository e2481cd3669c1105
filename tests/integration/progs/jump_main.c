/*
 * jump_main KIND: longjmp (KIND=longjmp) or siglongjmp (KIND=siglongjmp) out
 * of a guarded call through a callback, then report and wait for stdin.
 * Built with _FORTIFY_SOURCE too, where longjmp becomes __longjmp_chk.
 */
#include <setjmp.h>
#include <stdio.h>
#include <string.h>

int through(void (*cb)(void));
static jmp_buf env;
static sigjmp_buf senv;
static int use_sig;

static void noop(void)
{
}

static void cb(void)
{
	if (use_sig)
		siglongjmp(senv, 1);
	longjmp(env, 1);
}

int main(int argc, char **argv)
{
	char line[16];

	use_sig = argc > 1 && !strcmp(argv[1], "siglongjmp");
	if (use_sig ? sigsetjmp(senv, 1) == 0 : setjmp(env) == 0) {
		through(cb);
		puts("not jumped");
	} else {
		puts("jumped");
	}
	printf("again %d\n", through(noop));
	fflush(stdout);
	if (!fgets(line, sizeof(line), stdin))
		return 4;
	return 0;
}
