/* SPDX-License-Identifier: MIT */
/*
 * lock.h - lock state: per-thread holds, reentrancy, acquire and release.
 *
 * Ownership is per thread: each thread has its own backend connection and a
 * stack of holds (one per distinct key it holds, counted for reentrant
 * entries) and a stack of active guarded calls. A call record lives in the
 * dispatcher's frame, so a longjmp can release exactly the calls whose frames
 * it discards. lock.c knows nothing of policies; it reports outcomes. It
 * takes locks through backend.h and hands what it holds to renew.h, which
 * owns the lease records and every release.
 */
#ifndef LOCKSHIM_LOCK_H
#define LOCKSHIM_LOCK_H

#include <stdint.h>

#include "backend.h"
#include "conf.h"
#include "arch.h"

#define LOCK_MAX_HOLDS 64

struct lock_hold;

/* One active guarded call; lives in the dispatcher's stack frame. A lock of
 * several keys (`keys`) holds one per distinct key, in the keys' byte order. */
struct lock_call {
	struct lock_call *up;
	int n;                                 /* holds in hold[]; 0: the call holds nothing */
	struct lock_hold *hold[CONF_KEYS_MAX];
};

/* LOCK_NOLEASE: the lock was taken but what keeps its lease could not be
 * set up (the renewal thread, memory); it was released again, and the call
 * gets on_error as for LOCK_ERROR. LOCK_REFUSED: the lock cannot be taken
 * as this call asks, whatever the wait (the key's holders took it with
 * another limit, an upgrade of the thread's own shared hold, no hold slot
 * left); lock.c logged why, and the call gets on_error. */
enum lock_outcome { LOCK_OK, LOCK_TIMEOUT, LOCK_ERROR, LOCK_NOLEASE, LOCK_REFUSED };

/* Sets the backend (and the renewal thread's). Call once, before any
 * acquire. Returns 0 or -errno. */
int lock_setup(const struct backend *b);

/* Returns what log lines call the lock store (backend_store of the
 * backend lock_setup set: "Redis", "etcd"...). */
const char *lock_store_name(void);

/*
 * Takes spec's lock for a call with integer argument registers args, waiting up to
 * spec->wait_ms. A lock of several keys takes each distinct expanded key in
 * byte order (memcmp, then the shorter first), each its own hold with its
 * own lease, all within that one wait; when one cannot be taken, those
 * already taken are released again. On LOCK_OK, call is pushed on the
 * thread's call stack and must be passed to lock_release, and the leases
 * are renewed while the call runs. Otherwise call->n is 0 and nothing is
 * held (a lock whose lease could not be kept is released before this
 * returns: LOCK_NOLEASE).
 */
int lock_acquire(const struct lock_spec *spec, const uint64_t args[ARCH_INT_ARGS],
		 struct lock_call *call);

/* Leaves call (the innermost active one); releases each of its keys on its
 * last hold. */
void lock_release(struct lock_call *call);

/* Releases every active call of this thread whose record lies below sp. */
void lock_unwind_to(uintptr_t sp);

/* Fork child: forget the parent's holds and connection (never sent to). */
void lock_atfork_child(void);

/* Reads the replies of this thread's asynchronous releases, logging any
 * failure (before exec and fork; lock_release_all does it at exit). */
void lock_flush(void);

/* Releases every parked lease of the process and reads the replies of this
 * thread's asynchronous releases (before exec: the renewal thread dies).
 * Does nothing in a child that shares the process's memory (vfork). */
void lock_before_exec(void);

/* Releases every lease the process still holds (at exit, _exit, _Exit).
 * Does nothing in a child that shares the process's memory (vfork). */
void lock_release_all(void);

/* Returns the fencing token of call's hold (the key's counter when this
 * thread acquired it; a reentrant or kept call shares it), 0 when it holds
 * nothing. A call holding several keys: the largest of their tokens (each
 * key counts its own grants). */
long long lock_fence(const struct lock_call *call);

/* Returns the number of hold slots the calling thread uses (kept, active or
 * inherited); for tests. */
int lock_thread_holds(void);

#endif
