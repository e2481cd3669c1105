/* SPDX-License-Identifier: MIT */
/*
 * renew.h - the background renewal thread (see renew.c's DESIGN comment).
 */
#ifndef LOCKSHIM_RENEW_H
#define LOCKSHIM_RENEW_H

#include "lock.h"

struct backend_ops;

void renew_setup(const struct backend_ops *ops, const struct redis_spec *redis);

/* Starts renewing l, first after first_ms (starting the thread on first
 * need). Returns 0 or -errno. */
int renew_track(struct lease *l, int64_t first_ms);

/* Starts the thread if it is not running yet, so that a caller about to
 * wait for a lock does not pay for it once it holds one. Returns 0 or -errno. */
int renew_start(void);

/* Stops renewing l. Returns its final enum lease_state. */
int renew_untrack(struct lease *l);

/*
 * Parks tracked l: its call ended and its thread may take it back; unless
 * renew_unpark comes first, the thread releases it at until_us (monotonic
 * µs) and untracks it. Returns 0, or -1 when l is no longer held (lost,
 * overrun, or exiting): the caller releases it as usual.
 */
int renew_park(struct lease *l, int64_t until_us);

/*
 * Takes parked l back, waiting while the thread releases it. Returns 1 when
 * it is still ours and tracked, 0 when it was released or lost (untracked:
 * its memory is free for reuse).
 */
int renew_unpark(struct lease *l);

/*
 * Marks every parked lease of the process as being released and copies up to
 * max of them into out; returns how many. The caller releases them and then
 * calls renew_parked_done (before exec: the thread dies with the image).
 */
int renew_take_parked(struct lease *out, int max);
void renew_parked_done(const struct lease *done, int n);

/*
 * Untracks every lease (parked ones too, once no release of one is in
 * flight) and returns copies of them in *copies (malloc'd; the
 * caller frees it). Returns the count, 0 when none. Used once, at exit.
 */
int renew_drain(struct lease **copies);

/*
 * Deletes token it->val from key it->key wherever it still holds the lock
 * (backend leave), in the background: for an acquire or release whose
 * reply never came. Retried after reconnecting until Redis has answered,
 * and once more a while after it said the token was not there (a command
 * still on its way may run later); dropped once the token's lease (it->
 * lease_ms) has passed. Copies what it needs.
 */
void renew_forget(const struct backend_item *it);

/* At exit: passes every token not forgotten yet to fn once, and drops them. */
void renew_forget_drain(void (*fn)(void *arg, const struct backend_item *it), void *arg);

void renew_atfork_prepare(void);
void renew_atfork_parent(void);
void renew_atfork_child(void);

#endif
