/* SPDX-License-Identifier: MIT */
/*
 * lock.h - lock state: per-thread holds, reentrancy, acquire and release.
 *
 * Ownership is per thread: each thread has its own backend connection and a
 * stack of holds (one per distinct key it holds, counted for reentrant
 * entries) and a stack of active guarded calls. A call record lives in the
 * dispatcher's frame, so a longjmp can release exactly the calls whose frames
 * it discards. lock.c knows nothing of policies; it reports outcomes.
 */
#ifndef LOCKSHIM_LOCK_H
#define LOCKSHIM_LOCK_H

#include <stdint.h>

#include "backend.h"
#include "config.h"

#define LOCK_VAL_SIZE BACKEND_VAL_MAX
#define LOCK_MAX_HOLDS 64

enum lease_state { LEASE_HELD, LEASE_LOST, LEASE_OVERRUN };

/* A lease whose call ended but which its thread keeps for its next call
 * (lock.c decides, renew.c releases it when it is not taken back). */
enum park_state { PARK_NONE, PARK_PARKED, PARK_RELEASING };

/* One Redis lock this process holds; tracked by the renewal thread. */
struct lease {
	struct lease *next, *prev; /* renew.c's list, under its mutex */
	uint64_t id;               /* renew.c: matches replies to leases */
	const struct lock_spec *spec;
	int64_t acquired_at;       /* monotonic ms when the SET was sent */
	int64_t confirmed_at;      /* last time Redis confirmed ownership */
	int64_t next_renew_at;
	int state;                 /* enum lease_state, under renew.c's mutex */
	int park;                  /* enum park_state, under renew.c's mutex */
	int64_t park_until_us;     /* parked: when the renewal thread releases it */
	int64_t reuse_until_us;    /* the thread may take it back until then */
	size_t klen, vlen;
	char key[KEY_BUF_SIZE];
	char val[LOCK_VAL_SIZE];
};

struct lock_hold;

/* One active guarded call; lives in the dispatcher's stack frame. */
struct lock_call {
	struct lock_call *up;
	struct lock_hold *hold; /* NULL when the call holds nothing */
};

enum lock_outcome { LOCK_OK, LOCK_TIMEOUT, LOCK_ERROR };

/* Sets the backend and Redis endpoint. Call once, before any acquire. */
int lock_setup(const struct backend_ops *ops, const struct redis_spec *redis);

/*
 * Takes spec's lock for a call with integer arguments args, waiting up to
 * spec->wait_ms. On LOCK_OK, call is pushed on the thread's call stack and
 * must be passed to lock_release. Otherwise call->hold stays NULL.
 */
int lock_acquire(const struct lock_spec *spec, const uint64_t args[6],
		 struct lock_call *call);

/* Leaves call (the innermost active one); releases the key on its last hold. */
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

/* Returns the backend's view of l (key, value, lease and waiting settings);
 * the strings stay owned by l. */
struct backend_item lock_lease_item(const struct lease *l);

/* Returns the number of holds of the calling thread (for tests). */
int lock_thread_holds(void);

/* Exposed for unit tests: the process-wide pid and host used in values. */
extern int lock_pid;

#endif
