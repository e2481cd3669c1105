/* SPDX-License-Identifier: MIT */
/*
 * dispatch.c - what happens around one guarded call.
 *
 * arch_tramp_entry calls dispatch_call with the saved caller state. The lock is
 * held in a variable with a cleanup attribute; this file is built with
 * -fexceptions, so the release runs on a normal return and while a C++
 * exception (or a forced unwind: pthread_cancel, pthread_exit) passes
 * through. longjmp is handled by interpose.c. The wrapper is invisible: the
 * callee's return registers and errno reach the caller unchanged, and the
 * shim's own errno changes are undone. The lock policies (skip, exit, abort,
 * proceed) are applied here, from the frozen lock spec.
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/uio.h>
#include <unistd.h>

#include "count.h"
#include "guard.h"
#include "hook.h"
#include "lock.h"
#include "log.h"
#include "shim.h"
#include "arch.h"

/* This thread's stack, [stack_lo, stack_hi); stack_hi 0: not known yet. */
static __thread uintptr_t stack_lo __attribute__((tls_model("initial-exec")));
static __thread uintptr_t stack_hi __attribute__((tls_model("initial-exec")));

extern void *__libc_stack_end; /* ld.so: the initial thread's stack pointer at entry */

#define MAIN_STACK_MAX (1UL << 30)

/*
 * Sets this thread's stack bounds. For the initial thread, where glibc
 * would parse /proc/self/maps (~0.1 ms): from the stack pointer at process
 * entry (only argv, the environment and the aux vector lie above it, never
 * a caller's arguments) down by RLIMIT_STACK, at most 1 GiB. For other
 * threads, what pthread knows. Unknown: an empty range.
 */
static void stack_bounds(void)
{
	pthread_attr_t a;
	struct rlimit rl;
	void *addr;
	size_t size;

	stack_lo = stack_hi = 1;
	if (pthread_equal(pthread_self(), shim_initial_thread) && __libc_stack_end) {
		stack_hi = (uintptr_t)__libc_stack_end;
		size = getrlimit(RLIMIT_STACK, &rl) == 0 && rl.rlim_cur < MAIN_STACK_MAX ?
		       (size_t)rl.rlim_cur : MAIN_STACK_MAX;
		stack_lo = stack_hi > size ? stack_hi - size : 0;
		return;
	}
	if (pthread_getattr_np(pthread_self(), &a) == 0) {
		if (pthread_attr_getstack(&a, &addr, &size) == 0) {
			stack_lo = (uintptr_t)addr;
			stack_hi = (uintptr_t)addr + size;
		}
		pthread_attr_destroy(&a);
	}
}

/*
 * Returns how many bytes from `from` on, up to want, lie in readable pages,
 * on a stack the shim does not know (a coroutine's, sigaltstack): one
 * process_vm_readv(2) reads a byte of each page of the window and stops
 * at the first one that cannot be read, without a fault. Where that call
 * is refused (seccomp), mincore(2) finds the unmapped pages instead.
 */
static size_t readable(uintptr_t from, size_t want)
{
	struct iovec local[STACK_ARGS_MAX / 4096 + 2], remote[STACK_ARGS_MAX / 4096 + 2];
	char sink[STACK_ARGS_MAX / 4096 + 2];
	uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE), end = from + want, page;
	int n = 0;
	ssize_t got;
	unsigned char in;

	for (page = from & ~(pg - 1); page < end && n < (int)sizeof(sink); page += pg, n++) {
		local[n].iov_base = &sink[n];
		local[n].iov_len = 1;
		remote[n].iov_base = (void *)(page < from ? from : page);
		remote[n].iov_len = 1;
	}
	got = process_vm_readv(getpid(), local, (unsigned long)n, remote, (unsigned long)n, 0);
	if (got < 0 && errno != EFAULT) {
		for (got = 0; got < n; got++)
			if (mincore((void *)((from & ~(pg - 1)) + (uintptr_t)got * pg), pg, &in) != 0)
				break;
	}
	if (got <= 0)
		return 0;
	page = (from & ~(pg - 1)) + (uintptr_t)got * pg;
	return page >= end ? want : page - from;
}

/* Returns how many bytes of stack arguments to copy: want, cut so that the
 * copy never reads past the top of the thread's stack, nor, on any other
 * stack, into a page that cannot be read. */
static size_t arg_window(const struct arch_frame *f, size_t want)
{
	uintptr_t from = arch_stack_args(f);
	size_t n;
	int saved_errno;

	if (from >= stack_lo && from < stack_hi) /* the common case */
		return (stack_hi - from < want ? stack_hi - from : want) & ~(size_t)15;
	if (!want)
		return 0;
	saved_errno = errno;
	guard_enter();
	if (!stack_hi)
		stack_bounds();
	if (from >= stack_lo && from < stack_hi)
		n = stack_hi - from < want ? stack_hi - from : want;
	else
		n = readable(from, want);
	guard_leave();
	errno = saved_errno;
	return n & ~(size_t)15;
}

static void dispatch_leave(struct lock_call *call)
{
	int saved_errno;

	if (!call->n)
		return;
	saved_errno = errno;
	guard_enter();
	lock_release(call);
	guard_leave();
	errno = saved_errno;
}

/* Counts and logs the outcome of a failed acquire and returns the policy
 * to apply (a skip counts as one more: skipped_total). */
static int policy_for(const struct lock_spec *s, int outcome)
{
	int p = outcome == LOCK_TIMEOUT ? s->on_timeout : s->on_error;
	const char *why = outcome == LOCK_TIMEOUT ? "lock wait timed out" :
			  outcome == LOCK_NOLEASE ? "lease cannot be kept" :
			  outcome == LOCK_REFUSED ? "lock refused" : NULL;
	char unavailable[48];

	if (!why) { /* LOCK_ERROR: "Redis unavailable", "etcd unavailable"... */
		snprintf(unavailable, sizeof(unavailable), "%s unavailable", lock_store_name());
		why = unavailable;
	}
	count_add(s, outcome == LOCK_TIMEOUT ? MC_TIMEOUTS : MC_ERRORS);
	if (p == POLICY_SKIP)
		count_add(s, MC_SKIPPED);

	if (p == POLICY_PROCEED)
		LOGK(LOG_WARN, s->symbol, NULL, 0, "%s: %s; running the call unguarded (proceed)",
		     s->symbol, why);
	else if (p == POLICY_EXIT)
		LOGK(LOG_ERROR, s->symbol, NULL, 0, "%s: %s; exiting with status %d", s->symbol, why,
		     s->exit_code);
	else if (p == POLICY_ABORT)
		LOGK(LOG_ERROR, s->symbol, NULL, 0, "%s: %s; aborting", s->symbol, why);
	else
		LOGK(LOG_INFO, s->symbol, NULL, 0, "%s: %s; call skipped", s->symbol, why);
	return p;
}

__attribute__((visibility("hidden"))) void dispatch_call(struct arch_frame *f,
							 const struct hook *h);

void dispatch_call(struct arch_frame *f, const struct hook *h)
{
	const struct lock_spec *s = h->spec;
	struct lock_call call __attribute__((cleanup(dispatch_leave)));
	size_t window = arg_window(f, (size_t)s->stack_args_bytes);
	int saved_errno, rc;

	call.n = 0; /* its holds are written as they are taken */

	if (guard_active() || !shim_active()) {
		arch_invoke(f, h->call, window);
		return;
	}
	saved_errno = errno;
	guard_enter();
	rc = lock_acquire(s, arch_int_args(f), &call);
	guard_leave();
	if (rc != LOCK_OK) {
		guard_enter();
		rc = policy_for(s, rc);
		guard_leave();
		/* Outside the guard: the program's atexit handlers stay guarded. */
		if (rc == POLICY_EXIT)
			exit(s->exit_code);
		if (rc == POLICY_ABORT)
			abort();
		if (rc == POLICY_SKIP) {
			arch_set_return(f, s->ret, s->ret_double);
			errno = s->err;
			return;
		}
	}
	errno = saved_errno;
	arch_invoke(f, h->call, window);
}
