/* SPDX-License-Identifier: MIT */
/*
 * dispatch.c - what happens around one guarded call.
 *
 * tramp_entry calls dispatch_call with the saved caller state. The lock is
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
#include <stdlib.h>

#include "guard.h"
#include "hook.h"
#include "lock.h"
#include "log.h"
#include "shim.h"
#include "tramp.h"

static __thread uintptr_t stack_hi __attribute__((tls_model("initial-exec")));

extern void *__libc_stack_end; /* ld.so: the initial thread's stack pointer at entry */

/*
 * Returns the top of this thread's stack, or UINTPTR_MAX when unknown. For
 * the initial thread, where glibc would parse /proc/self/maps (~0.1 ms), the
 * stack pointer at process entry: only argv, the environment and the aux
 * vector lie above it, never a caller's arguments.
 */
static uintptr_t thread_stack_top(void)
{
	pthread_attr_t a;
	void *addr;
	size_t size;
	uintptr_t top = UINTPTR_MAX;

	if (pthread_equal(pthread_self(), shim_initial_thread) && __libc_stack_end)
		return (uintptr_t)__libc_stack_end;
	if (pthread_getattr_np(pthread_self(), &a) == 0) {
		if (pthread_attr_getstack(&a, &addr, &size) == 0)
			top = (uintptr_t)addr + size;
		pthread_attr_destroy(&a);
	}
	return top;
}

/* Returns how many bytes of stack arguments to copy: want, clamped so the
 * copy never reads past the top of the thread's stack. */
static size_t arg_window(const struct tramp_frame *f, size_t want)
{
	uintptr_t from = tramp_stack_args(f);

	if (!stack_hi) {
		int saved_errno = errno;

		guard_enter();
		stack_hi = thread_stack_top();
		guard_leave();
		errno = saved_errno;
	}
	if (from < stack_hi && stack_hi - from < want)
		return (stack_hi - from) & ~(uintptr_t)15;
	return want;
}

static void dispatch_leave(struct lock_call *call)
{
	int saved_errno;

	if (!call->hold)
		return;
	saved_errno = errno;
	guard_enter();
	lock_release(call);
	guard_leave();
	errno = saved_errno;
}

/* Logs the outcome of a failed acquire and returns the policy to apply. */
static int policy_for(const struct lock_spec *s, int outcome)
{
	int p = outcome == LOCK_TIMEOUT ? s->on_timeout : s->on_error;
	const char *why = outcome == LOCK_TIMEOUT ? "lock wait timed out" : "Redis unavailable";

	if (p == POLICY_PROCEED)
		LOG(LOG_WARN, "%s: %s; running the call unguarded (proceed)", s->symbol, why);
	else if (p == POLICY_EXIT)
		LOG(LOG_ERROR, "%s: %s; exiting with status %d", s->symbol, why, s->exit_code);
	else if (p == POLICY_ABORT)
		LOG(LOG_ERROR, "%s: %s; aborting", s->symbol, why);
	else
		LOG(LOG_INFO, "%s: %s; call skipped", s->symbol, why);
	return p;
}

__attribute__((visibility("hidden"))) void dispatch_call(struct tramp_frame *f,
							 const struct hook *h);

void dispatch_call(struct tramp_frame *f, const struct hook *h)
{
	const struct lock_spec *s = h->spec;
	struct lock_call call __attribute__((cleanup(dispatch_leave))) = { NULL, NULL };
	size_t window = arg_window(f, (size_t)s->stack_args_bytes);
	int saved_errno, rc;

	if (guard_active() || !shim_active()) {
		tramp_invoke(f, h->real, window);
		return;
	}
	saved_errno = errno;
	guard_enter();
	rc = lock_acquire(s, tramp_int_args(f), &call);
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
			tramp_set_return(f, s->ret, s->ret_double);
			errno = s->err;
			return;
		}
	}
	errno = saved_errno;
	tramp_invoke(f, h->real, window);
}
