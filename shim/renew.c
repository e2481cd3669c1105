/* SPDX-License-Identifier: MIT */
/*
 * renew.c - the renewal thread: keeps every lease this process holds alive.
 *
 * DESIGN
 * One thread per process, started on the first acquire, with one mutex and
 * one condvar (CLOCK_MONOTONIC) over a list of leases (redis bio.c style).
 * The thread sleeps until the earliest due renewal, copies the due leases
 * out of the list, drops the mutex, renews them all in one pipelined round
 * trip on its own connection, then retakes the mutex and applies the replies
 * to the leases still tracked (matched by id, so a lease released meanwhile
 * is never touched). Owners only link and unlink under the mutex; nobody
 * holds it across network I/O. Linking or parking signals the thread only
 * when the lease is due before the thread's planned wake-up
 * (thread_wake_us), so a burst of guarded calls costs it one wake-up.
 *
 * Parked leases (lock.c: a call ended, its thread may take the lock back for
 * its next call) stay in the list and keep being renewed. At park_until the
 * thread marks one RELEASING, releases it on its own connection (all due
 * ones in one round trip) and unlinks it; an owner taking it back meanwhile
 * waits on the second condvar until that is done, so a lease is released by
 * exactly one thread, and its memory stays valid until its owner has seen it.
 *
 * Lease states: HELD -> LOST when Redis says the key is gone or someone
 * else's, or when Redis stayed unreachable for a whole lease since the last
 * confirmation; HELD -> OVERRUN when max_hold_ms passes (renewal stops).
 * Both apply the lock's policy once: log, kill (kill_signal, then SIGKILL
 * after kill_grace_ms) or abort; a parked lease has no call to protect, so
 * losing it is only logged. The thread blocks all signals and runs with
 * the guard set, so it never enters a wrapper. A fork child starts with an
 * empty list and no thread; at exit renew_drain hands the leases back.
 *
 * Tokens to forget (renew_forget: an acquire or release that Redis may have
 * run without answering) form a second list: the thread takes the due ones
 * out, sends each a leave on its own connection, and puts back those not
 * settled, retrying with a doubling delay.
 */
#include "renew.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "guard.h"
#include "log.h"
#include "util.h"

#define RENEW_BATCH 256
#define FORGET_RETRY_MIN_MS 50
#define FORGET_RETRY_MAX_MS 2000
#define FORGET_SETTLE_MS 1000 /* asked again this long after "not there" */

/* A token to delete wherever it still holds its lock (renew_forget). */
struct forget {
	struct forget *next;
	int64_t until;         /* its lease has passed by then: drop it (ms) */
	int64_t next_at;       /* next attempt (ms) */
	int64_t absent_since;  /* Redis first said the lock did not hold it (0: not yet) */
	int64_t step;          /* the next retry delay after an error */
	long long lease_ms;
	size_t klen, vlen;
	char key[KEY_BUF_SIZE];
	char val[LOCK_VAL_SIZE];
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv;
static pthread_cond_t done_cv; /* a parked lease's release finished */
static struct lease head = { .next = &head, .prev = &head };
static int running, stopping, kill_pending;
static int64_t kill_at;
static int64_t thread_wake_us; /* when the sleeping thread wakes up anyway */
static uint64_t next_id;
static const struct backend_ops *backend;
static const struct redis_spec *redis;
static struct backend_conn *conn; /* the thread's own */
static struct forget *forgets;    /* under mu */

/* backend unconfirmed(): a command of the thread's that Redis may have run. */
static void forget_cb(void *arg, const struct backend_item *it)
{
	(void)arg;
	renew_forget(it);
}

static void cv_init(void)
{
	pthread_condattr_t a;

	pthread_condattr_init(&a);
	pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
	pthread_cond_init(&cv, &a);
	pthread_cond_init(&done_cv, NULL);
	pthread_condattr_destroy(&a);
}

void renew_setup(const struct backend_ops *ops, const struct redis_spec *r)
{
	backend = ops;
	redis = r;
	cv_init();
}

static int64_t period(const struct lease *l)
{
	return l->spec->lease_ms / 3;
}

/* Applies policy p (enum hold_policy) to l once. Called with mu held. */
static void act(struct lease *l, int p, const char *why)
{
	const struct lock_spec *s = l->spec;

	LOG(LOG_ERROR, "%s: lease on %.*s %s; applying %s", s->symbol, (int)l->klen,
	    l->key, why, config_hold_policy_name(p));
	if (p == HOLD_ABORT)
		abort();
	if (p == HOLD_KILL) {
		kill(getpid(), s->kill_signal);
		if (!kill_pending || util_now_ms() + s->kill_grace_ms < kill_at)
			kill_at = util_now_ms() + s->kill_grace_ms;
		kill_pending = 1;
	}
}

/*
 * Copies due leases into batch and returns how many; sets *wake to the next
 * time anything is due. Handles max_hold_ms and the SIGKILL deadline.
 */
static int collect_due(int64_t now, struct lease *batch, int64_t *wake)
{
	int n = 0;

	*wake = INT64_MAX;
	if (kill_pending) {
		if (now >= kill_at) {
			LOG(LOG_ERROR, "still alive %s after the kill signal; sending SIGKILL",
			    "kill_grace_ms");
			kill(getpid(), SIGKILL);
		}
		*wake = kill_at;
	}
	for (struct lease *l = head.next; l != &head; l = l->next) {
		const struct lock_spec *s = l->spec;

		if (l->state != LEASE_HELD)
			continue;
		if (s->max_hold_ms && l->park == PARK_NONE &&
		    now - l->acquired_at >= s->max_hold_ms) {
			l->state = LEASE_OVERRUN;
			act(l, s->on_overrun, "exceeded max_hold_ms; renewal stopped");
			continue;
		}
		if (s->max_hold_ms && l->acquired_at + s->max_hold_ms < *wake)
			*wake = l->acquired_at + s->max_hold_ms;
		if (l->next_renew_at <= now && n < RENEW_BATCH) {
			batch[n++] = *l;
			l->next_renew_at = now + period(l);
		}
		if (l->next_renew_at < *wake)
			*wake = l->next_renew_at;
	}
	return n;
}

/* Marks l lost; applies on_lost unless it is parked (no call runs). */
static void lost(struct lease *l, const char *why)
{
	l->state = LEASE_LOST;
	if (l->park == PARK_NONE)
		act(l, l->spec->on_lost, why);
	else
		LOG(LOG_WARN, "%s: parked lease on %.*s %s", l->spec->symbol, (int)l->klen,
		    l->key, why);
}

static struct lease *find_id(uint64_t id)
{
	for (struct lease *l = head.next; l != &head; l = l->next)
		if (l->id == id)
			return l;
	return NULL;
}

/* Applies the replies for batch. rc < 0: the round trip failed. Holds mu. */
static void apply(const struct lease *batch, const int *results, int n, int rc,
		  int64_t sent, const char *err)
{
	int64_t now = util_now_ms();

	for (int i = 0; i < n; i++) {
		struct lease *l = find_id(batch[i].id);

		if (!l || l->state != LEASE_HELD)
			continue;
		if (rc == 0 && results[i] == 1) {
			l->confirmed_at = sent;
		} else if (rc == 0 && results[i] == 0) {
			lost(l, "was lost (key gone or owned by another)");
		} else if (now - l->confirmed_at >= l->spec->lease_ms) {
			lost(l, "expired while Redis was unreachable");
		} else {
			int64_t retry = period(l) / 3;

			LOG(LOG_WARN, "%s: renewal of %.*s failed, retrying: %s",
			    l->spec->symbol, (int)l->klen, l->key, err);
			l->next_renew_at = now + (retry < 10 ? 10 : retry);
		}
	}
}

/* Renews batch in one round trip. Returns 0 or -1; fills err on failure. */
static int renew_batch(const struct lease *batch, int n, int *results, char *err,
		       size_t errlen)
{
	struct backend_item items[RENEW_BATCH];

	if (!conn && !(conn = backend->open(redis, err, errlen)))
		return -1;
	for (int i = 0; i < n; i++) {
		items[i] = lock_lease_item(&batch[i]);
	}
	if (backend->renew(conn, n, items, results) == 0)
		return 0;
	snprintf(err, errlen, "%s", backend->errstr(conn));
	backend->unconfirmed(conn, forget_cb, NULL);
	backend->close(conn);
	conn = NULL;
	return -1;
}

/*
 * Copies up to max parked leases due by upto_us into out, marking them
 * RELEASING; sets *next_us to the earliest parked deadline left (or leaves
 * it). Returns how many. Called with mu held.
 */
static int take_parked(int64_t upto_us, struct lease *out, int max, int64_t *next_us)
{
	int n = 0;

	for (struct lease *l = head.next; l != &head; l = l->next) {
		if (l->park != PARK_PARKED)
			continue;
		if (l->park_until_us <= upto_us && n < max) {
			l->park = PARK_RELEASING;
			out[n++] = *l;
		} else if (l->park_until_us < *next_us) {
			*next_us = l->park_until_us;
		}
	}
	return n;
}

static void unlink_lease(struct lease *l)
{
	if (l->next) {
		l->prev->next = l->next;
		l->next->prev = l->prev;
		l->next = l->prev = NULL;
	}
}

/* Unlinks the released leases in done and wakes owners waiting for them.
 * Holds mu. */
static void parked_done(const struct lease *done, int n)
{
	for (int i = 0; i < n; i++) {
		struct lease *l = find_id(done[i].id);

		if (l) {
			unlink_lease(l);
			l->park = PARK_NONE;
		}
	}
	if (n)
		pthread_cond_broadcast(&done_cv);
}

/* Releases the parked leases in rel on the thread's connection, one round
 * trip for all; what fails is retried (renew_forget). */
static void release_parked(const struct lease *rel, int n)
{
	char err[192];
	int up = conn || (conn = backend->open(redis, err, sizeof(err)));

	if (!up)
		LOG(LOG_WARN, "release of %d parked lock(s) failed, retrying: %s", n, err);
	for (int i = 0; i < n; i++) {
		struct backend_item it = lock_lease_item(&rel[i]);

		it.turn_done = 1; /* its thread is idle: a waiter may have it now */
		if (!up || backend->release(conn, &it, 1) < 0)
			renew_forget(&it);
	}
	if (up && backend->flush(conn) != 0) {
		LOG(LOG_WARN, "release of parked lock(s) failed, retrying: %s", backend->errstr(conn));
		backend->unconfirmed(conn, forget_cb, NULL);
		backend->close(conn);
		conn = NULL;
	}
}

/* Moves up to max forgets due by now into out; lowers *wake to the next
 * one left. Returns how many. Holds mu. */
static int take_forgets(int64_t now, struct forget **out, int max, int64_t *wake)
{
	struct forget **pp = &forgets;
	int n = 0;

	while (*pp) {
		struct forget *f = *pp;

		if (f->next_at <= now && n < max) {
			*pp = f->next;
			out[n++] = f;
			continue;
		}
		if (f->next_at < *wake)
			*wake = f->next_at;
		pp = &f->next;
	}
	return n;
}

static void forget_item(const struct forget *f, struct backend_item *it)
{
	memset(it, 0, sizeof(*it));
	it->key = f->key;
	it->klen = f->klen;
	it->val = f->val;
	it->vlen = f->vlen;
	it->lease_ms = f->lease_ms;
}

/* Sends a leave for each of the n forgets in fs, on the thread's own
 * connection; frees those settled, leaves the others in fs with their next
 * attempt set. Returns how many are left (moved to the front). */
static int forget_batch(struct forget **fs, int n)
{
	int64_t now = util_now_ms();
	int left = 0, down = 0;
	char err[192];

	for (int i = 0; i < n; i++) {
		struct forget *f = fs[i];
		struct backend_item it;
		int rc = -1;

		forget_item(f, &it);
		if (now >= f->until) {
			LOG(LOG_DEBUG, "%.*s: token expired before Redis confirmed it was gone",
			    (int)f->klen, f->key);
			free(f);
			continue;
		}
		if (!down && !conn && !(conn = backend->open(redis, err, sizeof(err))))
			down = 1;
		if (!down)
			rc = backend->leave(conn, &it, 0);
		if (rc == 1 || (rc == 0 && f->absent_since && now - f->absent_since >= FORGET_SETTLE_MS)) {
			if (rc == 1)
				LOG(LOG_WARN, "%.*s: deleted the lock a command of this process took "
				    "without an answer", (int)f->klen, f->key);
			free(f);
			continue;
		}
		if (rc == 0) {
			if (!f->absent_since)
				f->absent_since = now;
			f->next_at = now + FORGET_SETTLE_MS / 4;
		} else {
			if (!down) {
				backend->unconfirmed(conn, forget_cb, NULL);
				backend->close(conn);
				conn = NULL;
				down = 1;
			}
			f->next_at = now + f->step;
			f->step = f->step * 2 > FORGET_RETRY_MAX_MS ? FORGET_RETRY_MAX_MS : f->step * 2;
		}
		fs[left++] = f;
	}
	return left;
}

/* Sleeps until wake_us (monotonic µs; INT64_MAX: until signalled). Holds mu. */
static void sleep_until(int64_t wake_us)
{
	struct timespec ts = { wake_us / 1000000, (wake_us % 1000000) * 1000 };

	thread_wake_us = wake_us;
	if (wake_us == INT64_MAX)
		pthread_cond_wait(&cv, &mu);
	else
		pthread_cond_timedwait(&cv, &mu, &ts);
	thread_wake_us = 0; /* awake: it will look at the list again */
}

static void *renew_main(void *arg)
{
	static struct lease batch[RENEW_BATCH], rel[RENEW_BATCH];
	static struct forget *fs[RENEW_BATCH];
	static int results[RENEW_BATCH];
	char err[192];

	(void)arg;
	guard_enter();
	pthread_mutex_lock(&mu);
	while (!stopping) {
		int64_t now_us = util_now_us(), now = now_us / 1000, wake, wake_us = INT64_MAX;
		int n = collect_due(now, batch, &wake), rc = 0;
		int np = take_parked(now_us, rel, RENEW_BATCH, &wake_us);
		int nf = take_forgets(now, fs, RENEW_BATCH, &wake);

		if (n == 0 && np == 0 && nf == 0) {
			sleep_until(wake == INT64_MAX || wake * 1000 > wake_us ? wake_us
									       : wake * 1000);
			continue;
		}
		pthread_mutex_unlock(&mu);
		err[0] = 0;
		if (np)
			release_parked(rel, np);
		if (n)
			rc = renew_batch(batch, n, results, err, sizeof(err));
		if (nf)
			nf = forget_batch(fs, nf);
		pthread_mutex_lock(&mu);
		parked_done(rel, np);
		apply(batch, results, n, rc, now, err);
		while (nf > 0) {
			fs[nf - 1]->next = forgets;
			forgets = fs[--nf];
		}
	}
	running = 0;
	pthread_mutex_unlock(&mu);
	return NULL;
}

/* Starts the thread, with every signal blocked, unless it runs already or
 * the process is exiting. Called with mu held. Returns 0 or -errno. */
static int start_thread(void)
{
	sigset_t all, old;
	pthread_attr_t a;
	pthread_t th;
	int rc;

	if (running || stopping)
		return 0;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	pthread_attr_init(&a);
	pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
	rc = pthread_create(&th, &a, renew_main, NULL);
	pthread_attr_destroy(&a);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (rc == 0)
		running = 1;
	return -rc;
}

int renew_track(struct lease *l, int64_t first_ms)
{
	int rc;

	pthread_mutex_lock(&mu);
	l->id = ++next_id;
	l->state = LEASE_HELD;
	l->park = PARK_NONE;
	l->next_renew_at = l->acquired_at + first_ms;
	l->next = &head;
	l->prev = head.prev;
	head.prev->next = l;
	head.prev = l;
	rc = start_thread();
	/* Only a lease due before the thread's planned wake-up needs a signal:
	 * a guarded call costs no context switch in the common case. */
	if (l->next_renew_at * 1000 < thread_wake_us)
		pthread_cond_signal(&cv);
	pthread_mutex_unlock(&mu);
	return rc;
}

int renew_start(void)
{
	int rc;

	pthread_mutex_lock(&mu);
	rc = start_thread();
	pthread_mutex_unlock(&mu);
	return rc;
}

int renew_untrack(struct lease *l)
{
	int state;

	pthread_mutex_lock(&mu);
	state = l->state;
	unlink_lease(l);
	pthread_mutex_unlock(&mu);
	return state;
}

int renew_park(struct lease *l, int64_t until_us)
{
	int rc = -1;

	pthread_mutex_lock(&mu);
	if (l->next && l->state == LEASE_HELD && !stopping) {
		l->park = PARK_PARKED;
		l->park_until_us = until_us;
		if (until_us < thread_wake_us)
			pthread_cond_signal(&cv);
		rc = 0;
	}
	pthread_mutex_unlock(&mu);
	return rc;
}

/* Waits until no parked lease is being released. Holds mu. */
static void wait_releases(struct lease *only)
{
	for (;;) {
		struct lease *l = head.next;

		while (l != &head && !(l->park == PARK_RELEASING && (!only || l == only)))
			l = l->next;
		if (l == &head)
			return;
		pthread_cond_wait(&done_cv, &mu);
	}
}

int renew_unpark(struct lease *l)
{
	int rc = 0;

	pthread_mutex_lock(&mu);
	wait_releases(l);
	if (l->park == PARK_PARKED && l->state == LEASE_HELD && l->next) {
		l->acquired_at = util_now_ms(); /* max_hold_ms counts from this call */
		rc = 1;
	} else {
		unlink_lease(l);
	}
	l->park = PARK_NONE;
	pthread_mutex_unlock(&mu);
	return rc;
}

int renew_take_parked(struct lease *out, int max)
{
	int64_t next = INT64_MAX;
	int n;

	pthread_mutex_lock(&mu);
	n = take_parked(INT64_MAX, out, max, &next);
	pthread_mutex_unlock(&mu);
	return n;
}

void renew_parked_done(const struct lease *done, int n)
{
	pthread_mutex_lock(&mu);
	parked_done(done, n);
	pthread_mutex_unlock(&mu);
}

int renew_drain(struct lease **copies)
{
	int n = 0, i = 0;

	*copies = NULL;
	pthread_mutex_lock(&mu);
	stopping = 1;
	wait_releases(NULL);
	for (struct lease *l = head.next; l != &head; l = l->next)
		n++;
	if (n && (*copies = malloc(sizeof(**copies) * (size_t)n)) == NULL)
		n = 0;
	while (head.next != &head) {
		struct lease *l = head.next;

		if (i < n)
			(*copies)[i++] = *l;
		head.next = l->next;
		l->next = l->prev = NULL;
	}
	head.prev = &head;
	pthread_cond_signal(&cv);
	pthread_mutex_unlock(&mu);
	return i;
}

void renew_forget(const struct backend_item *it)
{
	struct forget *f = calloc(1, sizeof(*f));
	int64_t now = util_now_ms();

	if (!f || it->klen > sizeof(f->key) || it->vlen > sizeof(f->val)) {
		LOG(LOG_ERROR, "%.*s: cannot keep track of an unconfirmed token (it expires "
		    "within %lld ms)", (int)it->klen, it->key, it->lease_ms);
		free(f);
		return;
	}
	memcpy(f->key, it->key, it->klen);
	f->klen = it->klen;
	memcpy(f->val, it->val, it->vlen);
	f->vlen = it->vlen;
	f->lease_ms = it->lease_ms;
	f->until = now + it->lease_ms;
	f->next_at = now;
	f->step = FORGET_RETRY_MIN_MS;
	pthread_mutex_lock(&mu);
	if (stopping) {
		pthread_mutex_unlock(&mu);
		free(f);
		return;
	}
	f->next = forgets;
	forgets = f;
	start_thread();
	if (now * 1000 < thread_wake_us)
		pthread_cond_signal(&cv);
	pthread_mutex_unlock(&mu);
}

void renew_forget_drain(void (*fn)(void *arg, const struct backend_item *it), void *arg)
{
	struct forget *list;
	int64_t now = util_now_ms();

	pthread_mutex_lock(&mu);
	list = forgets;
	forgets = NULL;
	pthread_mutex_unlock(&mu);
	while (list) {
		struct forget *f = list;
		struct backend_item it;

		list = f->next;
		forget_item(f, &it);
		if (now < f->until)
			fn(arg, &it);
		free(f);
	}
}

/* Fork child: the parent's tokens are its own business. */
static void forgets_drop(void)
{
	while (forgets) {
		struct forget *f = forgets;

		forgets = f->next;
		free(f);
	}
}

void renew_atfork_prepare(void)
{
	pthread_mutex_lock(&mu);
}

void renew_atfork_parent(void)
{
	pthread_mutex_unlock(&mu);
}

void renew_atfork_child(void)
{
	pthread_mutex_init(&mu, NULL);
	cv_init();
	for (struct lease *l = head.next, *next; l != &head; l = next) {
		next = l->next;
		l->next = l->prev = NULL;
	}
	head.next = head.prev = &head;
	forgets_drop();
	running = kill_pending = 0;
	thread_wake_us = 0;
	if (conn) {
		backend->close(conn);
		conn = NULL;
	}
}
