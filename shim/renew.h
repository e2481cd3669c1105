/* SPDX-License-Identifier: MIT */
/*
 * renew.h - the background renewal thread and the lease records it owns
 * (see renew.c's DESIGN comment).
 *
 * lock.c makes a lease when it takes a lock, hands it to renew_track, and
 * gives it back with renew_untrack or renew_release; everything that
 * releases or forgets a token goes through here, so there is one release
 * path. renew.c speaks to the store only through backend.h.
 */
#ifndef LOCKSHIM_RENEW_H
#define LOCKSHIM_RENEW_H

#include <stdint.h>

#include "backend.h"
#include "conf.h"

enum lease_state { LEASE_HELD, LEASE_LOST, LEASE_OVERRUN };

/* A lease whose call ended but which its thread keeps for its next call
 * (lock.c decides; the renewal thread releases it unless taken back). */
enum park_state { PARK_NONE, PARK_PARKED, PARK_RELEASING };

/*
 * One Redis lock this process holds: the renewal thread's job record. Its
 * owner fills spec, acquired_us, reuse_until_us, key and val before
 * renew_track, and keeps the memory until renew_untrack, renew_unpark
 * returning 0, or renew_release. The fields marked "mu" belong to renew.c
 * and change only under its mutex. Times are monotonic µs.
 */
struct lease {
	struct lease *next, *prev; /* mu: the list of tracked leases */
	uint64_t id;               /* mu: matches replies to leases */
	int64_t confirmed_us;      /* mu: when Redis last confirmed ownership */
	int64_t next_renew_us;     /* mu */
	int64_t park_until_us;     /* mu: parked: when the thread releases it */
	int state;                 /* mu: enum lease_state */
	int park;                  /* mu: enum park_state */
	int64_t parked_us;         /* mu: parked: since when */
	int kept;                  /* mu: the counter's k names it (a renewal
				    * said so); in a renewal batch: backend_item's */
	const struct lock_spec *spec;
	int64_t acquired_us;       /* the acquire was sent (mu once tracked:
				    * max_hold_ms counts from here) */
	int64_t reuse_until_us;    /* its thread may take it back until then */
	long long fence;           /* the fencing token of this acquisition */
	size_t klen, vlen;
	char key[KEY_BUF_SIZE];
	char val[BACKEND_VAL_MAX];
};

/*
 * Replaces the on_lost policy of every lock with fn (NULL: the policies
 * again): called once for each lease lost while its call runs, with why
 * ("was lost (...)", "expired while ..."), on the renewal thread with its
 * mutex held, so fn must be quick and must not call into renew.c. For a
 * program that owns what the lock protects (`lockshim lock` stops its
 * command); set it before the first lease.
 */
void renew_on_lost(void (*fn)(const struct lease *l, const char *why));

/* Sets the backend the thread connects to. Call once, before any lease. */
void renew_setup(const struct backend *b);

/* The lost-lease path a backend's module calls (host->lost_all,
 * backend_module.h; lent by backend_on_lost_all): every held lease of the process is
 * lost (why, after "lease on KEY": "was lost (its ZooKeeper session
 * expired)"), each through the renewal path's lost(): on_lost (or the
 * renew_on_lost hook) applied once, a parked one only logged, counted.
 * Starts the thread when a kill needs its SIGKILL after kill_grace_ms.
 * Takes the list's mutex; calls no backend. Any thread. */
void renew_lost_all(const char *why);

/* Returns the backend's view of l (key, value, lease, waiting settings, and
 * its limit and mode, so that every operation on it, a forget too, treats
 * it as the permit or shared entry it is); the strings stay owned by l. */
struct backend_item renew_item(const struct lease *l);

/* Starts renewing l, whose key was given granted_ttl_ms at l->acquired_us
 * (the lease, or a hand-over's shorter TTL): renew.c alone decides when
 * that is renewed (a third of it), starting the thread on first need.
 * A leaseless backend's lease is never renewed: it is only marked held
 * (not listed, no thread, never parked) unless its lock has max_hold_ms or
 * linger_ms, the thread's other jobs. Returns 0 or -errno. */
int renew_track(struct lease *l, long long granted_ttl_ms);

/* Starts the thread if it is not running yet, so that a caller about to
 * wait for a lock does not pay for it once it holds one (never for a
 * leaseless backend). Returns 0 or -errno. */
int renew_start(void);

/* Stops renewing l. Returns its final enum lease_state. */
int renew_untrack(struct lease *l);

/*
 * Parks tracked l: its call ended and its thread may take it back; unless
 * renew_unpark comes first, the thread releases it at until_us and
 * untracks it. Returns 0, or -1 when l is no longer held (lost, overrun, or
 * exiting): the caller releases it as usual.
 */
int renew_park(struct lease *l, int64_t until_us);

/*
 * Takes parked l back, waiting while the thread releases it. Returns 1 when
 * it is still ours and tracked, 0 when it was released or lost (untracked:
 * its memory is free for reuse).
 */
int renew_unpark(struct lease *l);

/*
 * The release path: sends the compare-and-delete of untracked l on *c
 * (opened when NULL) without waiting for the reply, which is read before
 * the connection's next command or by renew_flush. idle: its thread is
 * not about to call again, so a queued waiter gets the lock at once (also
 * when l's reuse window has closed). more: another release follows at
 * once on *c, which may write both together (BACKEND_ASYNC_MORE); the last
 * of a run passes 0. A release that cannot be sent is logged (prefixed by
 * when) and retried in the background (renew_forget). Returns 0 or -1.
 */
int renew_release(struct backend_conn **c, const struct lease *l, int idle, int more,
		  const char *when);

/* Reads the replies of *c's asynchronous commands; a failure is logged
 * (prefixed by when) and handled as by renew_conn_failed. */
void renew_flush(struct backend_conn **c, const char *when);

/*
 * After an operation on *c failed: copies the reason into err (unless
 * NULL), hands the
 * commands Redis may have run without answering to renew_forget, and
 * closes *c (set to NULL: the next operation reconnects).
 */
void renew_conn_failed(struct backend_conn **c, char *err, size_t errlen);

/*
 * Deletes token it->val from key it->key wherever it still holds the lock
 * (backend leave), in the background: for an acquire or release whose
 * reply never came. Retried after reconnecting until Redis has answered,
 * and once more a while after it said the token was not there (a command
 * still on its way may run later); dropped once the token's lease (it->
 * lease_ms) has passed. Copies what it needs. Nothing for a leaseless
 * backend, whose holds are all known to their holder (backend.h).
 */
void renew_forget(const struct backend_item *it);

/* Before exec (the thread dies with the image): waits for the releases
 * the renewal thread has in flight, then releases every parked lease of
 * the process on *c and reads the replies. */
void renew_before_exec(struct backend_conn **c);

/*
 * At exit: stops the thread, releases on *c every lease still tracked
 * (parked ones too, once no release of one is in flight), then tries once
 * to forget each token not forgotten yet, logging those it could not.
 */
void renew_exit(struct backend_conn **c);

void renew_atfork_prepare(void);
void renew_atfork_parent(void);
void renew_atfork_child(void);

#endif
