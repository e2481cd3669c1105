/* SPDX-License-Identifier: MIT */
/*
 * hostile STEP...: a program that does to its process what real programs do
 * (daemonise, replace descriptors, run coroutines and signal stacks), around
 * calls of libhostile.so's functions. Runs the steps in order, reports on
 * stdout.
 *   block        rc = block_call() (prints "inside", waits for a line on
 *                stdin); prints "block rc=R"
 *   quick:X      prints "quick rc=R" for quick_call(X)
 *   sigpipe      prints "sigpipe handler=default|ignored|other blocked=yes|no"
 *   closeall     close(fd) for fd 3..1023 (the classic daemonise loop)
 *   closerange   close_range(3, ~0U, 0)
 *   closeall-raw syscall(SYS_close, fd) for fd 3..1023 (no libc wrapper)
 *   open:PATH    opens the data file PATH (O_WRONLY|O_CREAT|O_TRUNC);
 *                prints "data fd=N"
 *   replace      dup2(data, n) onto every socket descriptor n (the program
 *                makes none of its own); prints "replaced K"
 *   replace-raw  the same with syscall(SYS_dup2) (no libc wrapper)
 *   record       writes "record PID\n" through the data fd, closes it;
 *                prints "record written"
 *   still-open   prints "still-open S of K": how many of the replaced
 *                numbers are still open
 *   coro         calls many_args(1..10) from the entry function of a
 *                makecontext() coroutine whose stack top is followed by a
 *                PROT_NONE page; prints "many=V"
 *   coro-hole    the same, the page above the stack top unmapped; prints
 *                "many=V hole=unmapped|mapped" (the hole checked after the call)
 *   altstack     the same call from a SIGUSR1 handler running on a
 *                sigaltstack whose top is followed by a PROT_NONE page
 *   direct       the same call on the ordinary stack
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

int block_call(void);
int quick_call(int x);
long many_args(long a, long b, long c, long d, long e, long f, long g, long h,
	       long i, long j);

#define STACK_SIZE (1024 * 1024)
#define HOLE_PAGES 16
#define STACK_HINT 0x40000000UL
#define MAX_REPLACED 64

static int data_fd = -1;
static int replaced[MAX_REPLACED], nreplaced;
static volatile long result;
static ucontext_t main_uc, coro_uc;

static void die(const char *what)
{
	fprintf(stderr, "hostile: %s: %s\n", what, strerror(errno));
	exit(3);
}

static void sigpipe_state(void)
{
	struct sigaction sa;
	sigset_t mask;

	if (sigaction(SIGPIPE, NULL, &sa) != 0 || sigprocmask(SIG_BLOCK, NULL, &mask) != 0)
		die("sigaction/sigprocmask");
	printf("sigpipe handler=%s blocked=%s\n",
	       sa.sa_handler == SIG_DFL ? "default" : sa.sa_handler == SIG_IGN ? "ignored" : "other",
	       sigismember(&mask, SIGPIPE) ? "yes" : "no");
}

static void close_all(int raw)
{
	for (int fd = 3; fd < 1024; fd++) {
		if (raw)
			syscall(SYS_close, fd);
		else
			close(fd);
	}
}

/* Collects every descriptor that is a socket: the program opened none. */
static int find_sockets(int *out, int max)
{
	int fds[1024], n = 0, k = 0;
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	char path[64], target[128];

	if (!d)
		die("opendir /proc/self/fd");
	while ((e = readdir(d)) != NULL && n < 1024)
		if (e->d_name[0] != '.')
			fds[n++] = atoi(e->d_name);
	closedir(d);
	for (int i = 0; i < n && k < max; i++) {
		ssize_t len;

		snprintf(path, sizeof(path), "/proc/self/fd/%d", fds[i]);
		len = readlink(path, target, sizeof(target) - 1);
		if (len > 0 && (target[len] = 0, !strncmp(target, "socket:", 7)))
			out[k++] = fds[i];
	}
	return k;
}

static void replace_sockets(int raw)
{
	nreplaced = find_sockets(replaced, MAX_REPLACED);
	for (int i = 0; i < nreplaced; i++) {
		long rc = raw ? syscall(SYS_dup2, data_fd, replaced[i])
			      : dup2(data_fd, replaced[i]);

		if (rc != replaced[i])
			die("dup2");
	}
	printf("replaced %d\n", nreplaced);
}

static void write_record(void)
{
	char line[64];
	int n = snprintf(line, sizeof(line), "record %d\n", (int)getpid());

	if (write(data_fd, line, (size_t)n) != n)
		die("write record");
	if (close(data_fd) != 0)
		die("close data");
	data_fd = -1;
	printf("record written\n");
}

static void call_many(void)
{
	result = many_args(1, 2, 3, 4, 5, 6, 7, 8, 9, 10);
}

static void coro_entry(void)
{
	call_many();
}

static void on_usr1(int sig)
{
	(void)sig;
	call_many();
}

/* A stack of STACK_SIZE bytes followed by a PROT_NONE page (hole = 0), or
 * by HOLE_PAGES unmapped pages and then a PROT_NONE page (hole = 1). Placed,
 * where the kernel agrees, at STACK_HINT: far below the addresses the
 * kernel hands to mmap calls without an address (top-down from below the
 * main stack) and below AddressSanitizer's shadow memory, so that no
 * allocation of the program, the shim or ASan fills the hole. */
static char *guarded_stack(int hole)
{
	long pg = sysconf(_SC_PAGESIZE);
	size_t above = (size_t)pg * (hole ? HOLE_PAGES + 1 : 1);
	char *p = mmap((void *)STACK_HINT, STACK_SIZE + above, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (p == MAP_FAILED)
		die("mmap");
	if (mprotect(p + STACK_SIZE + above - pg, (size_t)pg, PROT_NONE) != 0)
		die("mprotect");
	if (hole && munmap(p + STACK_SIZE, above - (size_t)pg) != 0)
		die("munmap");
	return p;
}

static int unmapped(void *page)
{
	return msync(page, (size_t)sysconf(_SC_PAGESIZE), MS_ASYNC) != 0 && errno == ENOMEM;
}

static void on_coroutine(int hole)
{
	char *stack = guarded_stack(hole);

	if (getcontext(&coro_uc) != 0)
		die("getcontext");
	coro_uc.uc_stack.ss_sp = stack;
	coro_uc.uc_stack.ss_size = STACK_SIZE;
	coro_uc.uc_link = &main_uc;
	makecontext(&coro_uc, coro_entry, 0);
	if (swapcontext(&main_uc, &coro_uc) != 0)
		die("swapcontext");
	if (hole)
		printf("many=%ld hole=%s\n", result,
		       unmapped(stack + STACK_SIZE) ? "unmapped" : "mapped");
	else
		printf("many=%ld\n", result);
}

static void on_altstack(void)
{
	stack_t ss = { .ss_sp = guarded_stack(0), .ss_size = STACK_SIZE }, old;
	struct sigaction sa = { .sa_handler = on_usr1, .sa_flags = SA_ONSTACK };

	sigemptyset(&sa.sa_mask);
	if (sigaltstack(&ss, &old) != 0 || sigaction(SIGUSR1, &sa, NULL) != 0)
		die("sigaltstack/sigaction");
	raise(SIGUSR1);
	printf("many=%ld\n", result);
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	for (int i = 1; i < argc; i++) {
		const char *s = argv[i];

		if (!strcmp(s, "block")) {
			printf("block rc=%d\n", block_call());
		} else if (!strncmp(s, "quick:", 6)) {
			printf("quick rc=%d\n", quick_call(atoi(s + 6)));
		} else if (!strcmp(s, "sigpipe")) {
			sigpipe_state();
		} else if (!strcmp(s, "closeall")) {
			close_all(0);
		} else if (!strcmp(s, "closeall-raw")) {
			close_all(1);
		} else if (!strcmp(s, "closerange")) {
			if (close_range(3, ~0U, 0) != 0)
				die("close_range");
		} else if (!strncmp(s, "open:", 5)) {
			data_fd = open(s + 5, O_WRONLY | O_CREAT | O_TRUNC, 0644);
			if (data_fd < 0)
				die("open data file");
			printf("data fd=%d\n", data_fd);
		} else if (!strcmp(s, "replace")) {
			replace_sockets(0);
		} else if (!strcmp(s, "replace-raw")) {
			replace_sockets(1);
		} else if (!strcmp(s, "record")) {
			write_record();
		} else if (!strcmp(s, "still-open")) {
			int open_now = 0;

			for (int k = 0; k < nreplaced; k++)
				open_now += fcntl(replaced[k], F_GETFD) != -1;
			printf("still-open %d of %d\n", open_now, nreplaced);
		} else if (!strcmp(s, "coro")) {
			on_coroutine(0);
		} else if (!strcmp(s, "coro-hole")) {
			on_coroutine(1);
		} else if (!strcmp(s, "altstack")) {
			on_altstack();
		} else if (!strcmp(s, "direct")) {
			call_many();
			printf("many=%ld\n", result);
		} else {
			fprintf(stderr, "unknown step %s\n", s);
			return 2;
		}
	}
	return 0;
}
