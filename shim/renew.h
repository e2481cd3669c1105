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

/* Stops renewing l. Returns its final enum lease_state. */
int renew_untrack(struct lease *l);

/*
 * Untracks every lease and returns copies of them in *copies (malloc'd; the
 * caller frees it). Returns the count, 0 when none. Used once, at exit.
 */
int renew_drain(struct lease **copies);

void renew_atfork_prepare(void);
void renew_atfork_parent(void);
void renew_atfork_child(void);

#endif
