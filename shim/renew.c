/* SPDX-License-Identifier: MIT */
/*
 * renew.c - the renewal thread: keeps every lease this process holds alive.
 *
 * DESIGN
 * One thread per process, started on the first acquire, with one mutex (mu)
 * and two condvars over a list of leases, its job records (redis bio.c
 * style): cv (CLOCK_MONOTONIC) wakes the thread, done_cv tells owners that
 * a parked lease's release finished, and renew_exit that the thread is gone.
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
 * its next call) stay in the list and keep being renewed; a renewal of one
 * parked KEPT_MARK_US or more also names it in the key's fencing counter
 * (field k; a holder set's k:<token>, one per holder: `lockshim status`
 * says "kept"), and the first renewal once it is in use again takes that
 * back (the release does too). At park_until the
 * thread marks one RELEASING, releases it on its own connection (all due
 * ones in one round trip) and unlinks it; an owner taking it back meanwhile
 * waits on the second condvar until that is done, so a lease is released by
 * exactly one thread, and its memory stays valid until its owner has seen it.
 *
 * A leaseless backend (backend.h: kernel locks) has nothing to renew: its
 * leases are listed only for the thread's other jobs, max_hold_ms and
 * linger_ms (leaseless_listed), or when its module reports lost leases
 * (zookeeper: a session's expiry loses them all, renew_lost_all), never
 * renewed, and the thread starts only for max_hold_ms and linger_ms, for
 * on_lost "kill"'s SIGKILL after kill_grace_ms, or to ship counts (unless
 * .count_inline: then a release ships them, ship_at_release). Its overrun
 * (overrun_release; also a backend's with .overrun_release) under
 * on_overrun "log" releases the lock at the deadline, as a Redis lock
 * whose renewal stops expires; under "kill" and "abort" the process's
 * death frees it.
 *
 * Lease states: HELD -> LOST when Redis says the key is gone or someone
 * else's, or when Redis stayed unreachable for a whole lease since the last
 * confirmation, or when a module reports its leases lost (renew_lost_all);
 * HELD -> OVERRUN when max_hold_ms passes (renewal stops).
 * Both apply the lock's policy once: log, kill (kill_signal, then SIGKILL
 * after kill_grace_ms) or abort (a program of its own, `lockshim lock`,
 * replaces on_lost with renew_on_lost); a parked lease has no call to
 * protect, so losing it is only logged. The thread blocks all signals and runs with
 * the guard set, so it never enters a wrapper. A fork child starts with an
 * empty list and no thread; at exit renew_exit takes every lease off the
 * list (drain) and releases it.
 *
 * Tokens to forget (renew_forget: an acquire or release that Redis may have
 * run without answering) form a second list: the thread takes the due ones
 * out, sends each a leave on its own connection, and puts back those not
 * settled, retrying with a doubling delay.
 *
 * mu guards: the lease list and the fields renew.h marks "mu" (links, id,
 * confirmed_us, next_renew_us, park_until_us, state, park, and acquired_us
 * once tracked), the forget list, running, stopping, kill_pending, kill_at,
 * thread_wake_us and next_id. conn is the thread's alone. All times are
 * monotonic µs.
 *
 * Every release goes through renew_release: a thread's own call ending
 * (lock.c), a parked lease due (this thread), exec and exit.
 *
 * Counts (count.h): the thread wakes at least once a second (the first
 * time a second after it starts) and ships what changed, after its
 * renewals, on its own connection; exec and exit
 * ship the rest on the caller's (one round trip; skipped at exit when the
 * last shipment failed, so a server that does not answer delays no exit).
 */
#include "renew.h"

#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "count.h"
#include "guard.h"
#include "log.h"
#include "util.h"

#define RENEW_BATCH 256
#define MS 1000 /* µs */
#define KEPT_MARK_US (100 * MS) /* a lease parked this long is marked kept */
#define FORGET_RETRY_MIN_US (50 * MS)
#define FORGET_RETRY_MAX_US (2000 * MS)
#define FORGET_SETTLE_US (1000 * MS) /* asked again this long after "not there" */
#define SHIP_PERIOD_US (1000 * MS)   /* counts are shipped at most this often */

/* A token to delete wherever it still holds its lock (renew_forget). */
struct forget {
	struct forget *next;
	int64_t until_us;        /* its lease has passed by then: drop it */
	int64_t next_us;         /* next attempt */
	int64_t absent_since_us; /* Redis first said the lock did not hold it (0: not yet) */
	int64_t step_us;         /* the next retry delay after an error */
	struct backend_copy c;
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv;
static pthread_cond_t done_cv;
static struct lease head = { .next = &head, .prev = &head };
static int running, stopping, kill_pending;
static pthread_t thread; /* the renewal thread, while running */
static int64_t kill_at_us;
static int64_t thread_wake_us; /* when the sleeping thread wakes up anyway */
static uint64_t next_id;
static int64_t next_ship_us;
static int ship_failed; /* the last shipment of counts failed */
static const struct backend *backend;
static struct backend_conn *conn; /* the thread's own */
static struct forget *forgets;
static void (*lost_hook)(const struct lease *l, const char *why); /* renew_on_lost */

static void cv_init(void)
{
	pthread_condattr_t a;

	pthread_condattr_init(&a);
	pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
	pthread_cond_init(&cv, &a);
	pthread_cond_init(&done_cv, NULL);
	pthread_condattr_destroy(&a);
}

void renew_on_lost(void (*fn)(const struct lease *l, const char *why))
{
	lost_hook = fn;
}

void renew_setup(const struct backend *b)
{
	backend = b;
	cv_init();
}

struct backend_item renew_item(const struct lease *l)
{
	struct backend_item it = {
		.key = l->key, .klen = l->klen, .val = l->val, .vlen = l->vlen,
		.lease_ms = l->spec->lease_ms, .fair = l->spec->fair,
		.waiter_ttl_ms = l->spec->waiter_ttl_ms, .handoff_us = l->spec->handoff_us,
		.limit = l->spec->limit, .shared = l->spec->shared,
	};
	return it;
}

/* backend unconfirmed(): a command that Redis may have run. */
static void forget_cb(void *arg, const struct backend_item *it)
{
	(void)arg;
	renew_forget(it);
}

/* Opens *c when it is NULL. Returns whether it is open (err says why not). */
static int conn_up(struct backend_conn **c, char *err, size_t errlen)
{
	if (!*c)
		*c = backend_open(backend, err, errlen);
	return *c != NULL;
}

void renew_conn_failed(struct backend_conn **c, char *err, size_t errlen)
{
	if (!*c)
		return;
	if (err)
		snprintf(err, errlen, "%s", backend->ops->errstr(*c));
	backend->ops->unconfirmed(*c, forget_cb, NULL);
	backend->ops->close(*c);
	*c = NULL;
}

static void ship_counts(struct backend_conn **c, const char *when, int level);

/*
 * A leaseless backend whose .count is inline (local's files) starts no
 * thread for its counts: they go at a release SHIP_PERIOD_US after the
 * process's first (or its last shipment), on the releasing thread's
 * connection, besides exit and exec. One clock read per release; the
 * shipment about once a second at most.
 */
static void ship_at_release(struct backend_conn **c)
{
	static int64_t due_us; /* 0: this process has not released yet */
	int64_t now = util_now_us(), due = __atomic_load_n(&due_us, __ATOMIC_RELAXED);

	if ((due && now < due) ||
	    !__atomic_compare_exchange_n(&due_us, &due, now + SHIP_PERIOD_US, 0,
					 __ATOMIC_RELAXED, __ATOMIC_RELAXED) || !due)
		return;
	ship_counts(c, "metrics", LOG_DEBUG);
}

int renew_release(struct backend_conn **c, const struct lease *l, int idle, int more,
		  const char *when)
{
	struct backend_item it = renew_item(l);
	char err[192] = "";

	it.turn_done = idle || (l->spec->handoff_us > 0 && util_now_us() >= l->reuse_until_us);
	if (conn_up(c, err, sizeof(err)) &&
	    backend->ops->release(*c, &it, more ? BACKEND_ASYNC_MORE : 1) != BACKEND_ERR) {
		LOGK(LOG_DEBUG, l->spec->symbol, l->key, l->klen, "%s: released %.*s", when,
		     (int)l->klen, l->key);
		if (backend->ops->leaseless && backend->ops->count_inline && count_blocks)
			ship_at_release(c);
		return 0;
	}
	renew_conn_failed(c, err, sizeof(err));
	LOG(LOG_WARN, "%s: release of %.*s failed, retrying in the background: %s", when,
	    (int)l->klen, l->key, err);
	renew_forget(&it);
	return -1;
}

void renew_flush(struct backend_conn **c, const char *when)
{
	char err[192];

	if (!*c || backend->ops->flush(*c) != BACKEND_ERR)
		return;
	renew_conn_failed(c, err, sizeof(err));
	LOG(LOG_WARN, "%s: reading the replies of releases failed: %s", when, err);
}

/* The renewal rule, written once: a key whose TTL is ttl_ms is renewed
 * when a third of it has passed, so two renewals can fail before it ends. */
static int64_t renew_after_us(long long ttl_ms)
{
	return ttl_ms * MS / 3;
}

static int64_t period_us(const struct lease *l)
{
	return renew_after_us(l->spec->lease_ms);
}

/* Whether leaseless l has a job for the thread: a deadline (max_hold_ms),
 * a keep between calls (linger_ms, lock.c parks it), or the process's
 * counts to ship (a backend whose .count is not inline). */
static int leaseless_thread(const struct lease *l)
{
	return l->spec->max_hold_ms > 0 || l->spec->linger_ms > 0 ||
	       (count_blocks && backend->ops->count && !backend->ops->count_inline);
}

/* Whether leaseless l is listed: for the thread's jobs, or for its module
 * to report it lost (renew_lost_all). */
static int leaseless_listed(const struct lease *l)
{
	return backend->ops->reports_lost || leaseless_thread(l);
}

/* Returns when tracked l, whose key was given ttl_ms, is first renewed:
 * never for a leaseless backend. */
static int64_t first_renew_us(const struct lease *l, long long ttl_ms)
{
	return backend->ops->leaseless ? INT64_MAX : l->acquired_us + renew_after_us(ttl_ms);
}

/*
 * What "renewal stopped" means for l past max_hold_ms when its backend is
 * leaseless (a kernel lock has no lease to run out) or says .overrun_release
 * (postgres: a lease is a whole session's): under on_overrun "log" the lock
 * is released now, on the thread's connection, so others may enter while
 * the call runs on (as a Redis lock expires); under "kill" it is kept until
 * the process dies (kill_grace_ms at most), which frees it. The call's own
 * release later finds nothing to release. Holds mu: a kernel lock's release
 * is two system calls, postgres's one statement sent without waiting.
 */
static void overrun_release(struct lease *l)
{
	if ((backend->ops->leaseless || backend->ops->overrun_release) &&
	    l->spec->on_overrun == HOLD_LOG)
		renew_release(&conn, l, 1, 0, "max_hold_ms");
}

/* Applies policy p (enum hold_policy) to l once. Called with mu held. */
static void act(struct lease *l, int p, const char *why)
{
	const struct lock_spec *s = l->spec;

	LOGK(LOG_ERROR, s->symbol, l->key, l->klen, "%s: lease on %.*s %s; applying %s", s->symbol,
	     (int)l->klen, l->key, why, conf_hold_policy_name(p));
	if (p == HOLD_ABORT)
		abort();
	if (p == HOLD_KILL) {
		int64_t at = util_now_us() + s->kill_grace_ms * MS;

		kill(getpid(), s->kill_signal);
		if (!kill_pending || at < kill_at_us)
			kill_at_us = at;
		kill_pending = 1;
	}
}

/*
 * Copies due leases into batch and returns how many; lowers *wake to the
 * next time anything is due. Handles max_hold_ms and the SIGKILL deadline.
 * Holds mu.
 */
static int collect_due(int64_t now, struct lease *batch, int64_t *wake)
{
	struct lease *b;
	int n = 0;

	if (kill_pending) {
		if (now >= kill_at_us) {
			LOG(LOG_ERROR, "still alive %s after the kill signal; sending SIGKILL",
			    "kill_grace_ms");
			kill(getpid(), SIGKILL);
		}
		if (kill_at_us < *wake)
			*wake = kill_at_us;
	}
	for (struct lease *l = head.next; l != &head; l = l->next) {
		const struct lock_spec *s = l->spec;
		int64_t max_hold_end = l->acquired_us + s->max_hold_ms * MS;

		if (l->state != LEASE_HELD)
			continue;
		if (s->max_hold_ms && l->park == PARK_NONE && now >= max_hold_end) {
			l->state = LEASE_OVERRUN;
			count_add(s, MC_OVERRUNS);
			act(l, s->on_overrun, "exceeded max_hold_ms; renewal stopped");
			overrun_release(l);
			continue;
		}
		if (s->max_hold_ms && max_hold_end < *wake)
			*wake = max_hold_end;
		if (l->next_renew_us <= now && n < RENEW_BATCH) {
			b = &batch[n++];
			*b = *l;
			b->kept = 0;
			if (l->park == PARK_PARKED && now - l->parked_us >= KEPT_MARK_US)
				b->kept = l->kept = 1;
			else if (l->park == PARK_NONE && l->kept)
				b->kept = 2, l->kept = 0;
			l->next_renew_us = now + period_us(l);
		}
		if (l->next_renew_us < *wake)
			*wake = l->next_renew_us;
	}
	return n;
}

/* Marks l lost; applies on_lost (or the renew_on_lost hook) unless it is
 * parked (no call runs). Holds mu. */
static void lost(struct lease *l, const char *why)
{
	l->state = LEASE_LOST;
	count_add(l->spec, MC_LOST);
	if (l->park == PARK_NONE && lost_hook)
		lost_hook(l, why);
	else if (l->park == PARK_NONE)
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

/* Applies the replies for batch, sent at sent. rc: the round trip's
 * enum backend_result. Holds mu. */
static void apply(const struct lease *batch, const int *results, int n, int rc,
		  int64_t sent, const char *err)
{
	int64_t now = util_now_us();

	for (int i = 0; i < n; i++) {
		struct lease *l = find_id(batch[i].id);

		if (!l || l->state != LEASE_HELD)
			continue;
		if (rc == BACKEND_OK && results[i] == BACKEND_OK) {
			l->confirmed_us = sent;
		} else if (rc == BACKEND_OK) {
			lost(l, "was lost (key gone or owned by another)");
		} else if (now - l->confirmed_us >= l->spec->lease_ms * MS) {
			char why[64];

			snprintf(why, sizeof(why), "expired while %s was unreachable",
				 backend_store(backend->ops));
			lost(l, why);
		} else {
			int64_t retry = period_us(l) / 3;

			LOG(LOG_WARN, "%s: renewal of %.*s failed, retrying: %s",
			    l->spec->symbol, (int)l->klen, l->key, err);
			l->next_renew_us = now + (retry < 10 * MS ? 10 * MS : retry);
		}
	}
}

/* Renews batch in one round trip. Returns an enum backend_result; fills
 * err on failure. */
static int renew_batch(const struct lease *batch, int n, int *results, char *err,
		       size_t errlen)
{
	struct backend_item items[RENEW_BATCH];

	if (!conn_up(&conn, err, errlen))
		return BACKEND_ERR;
	for (int i = 0; i < n; i++) {
		items[i] = renew_item(&batch[i]);
		items[i].kept = batch[i].kept;
	}
	if (backend->ops->renew(conn, n, items, results) == BACKEND_OK)
		return BACKEND_OK;
	renew_conn_failed(&conn, err, errlen);
	return BACKEND_ERR;
}

/*
 * Copies up to max parked leases due by upto into out, marking them
 * RELEASING; lowers *next to the earliest parked deadline left. Returns how
 * many. Holds mu.
 */
static int take_parked(int64_t upto, struct lease *out, int max, int64_t *next)
{
	int n = 0;

	for (struct lease *l = head.next; l != &head; l = l->next) {
		if (l->park != PARK_PARKED)
			continue;
		if (l->park_until_us <= upto && n < max) {
			l->park = PARK_RELEASING;
			out[n++] = *l;
		} else if (l->park_until_us < *next) {
			*next = l->park_until_us;
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

/* Releases the n leases in rel (copies; their threads are idle) on *c and
 * reads the replies: one round trip for all. */
static void release_copies(struct backend_conn **c, const struct lease *rel, int n,
			   const char *when)
{
	for (int i = 0; i < n; i++)
		renew_release(c, &rel[i], 1, i + 1 < n, when);
	renew_flush(c, when);
}

/* Moves up to max forgets due by now into out; lowers *wake to the next
 * one left. Returns how many. Holds mu. */
static int take_forgets(int64_t now, struct forget **out, int max, int64_t *wake)
{
	struct forget **pp = &forgets;
	int n = 0;

	while (*pp) {
		struct forget *f = *pp;

		if (f->next_us <= now && n < max) {
			*pp = f->next;
			out[n++] = f;
			continue;
		}
		if (f->next_us < *wake)
			*wake = f->next_us;
		pp = &f->next;
	}
	return n;
}

/* Sends a leave for each of the n forgets in fs, on the thread's own
 * connection; frees those settled, leaves the others in fs with their next
 * attempt set. Returns how many are left (moved to the front). */
static int forget_batch(struct forget **fs, int n)
{
	int64_t now = util_now_us();
	int left = 0, down = 0;
	char err[192];

	for (int i = 0; i < n; i++) {
		struct forget *f = fs[i];
		struct backend_item it = backend_copy_item(&f->c);
		int rc = BACKEND_ERR;

		if (now >= f->until_us) {
			LOG(LOG_DEBUG, "%.*s: token expired before Redis confirmed it was gone",
			    (int)f->c.klen, f->c.key);
			free(f);
			continue;
		}
		if (!down && !conn_up(&conn, err, sizeof(err)))
			down = 1;
		if (!down)
			rc = backend->ops->leave(conn, &it, 0);
		if (rc == BACKEND_OK || (rc == BACKEND_NO && f->absent_since_us &&
					 now - f->absent_since_us >= FORGET_SETTLE_US)) {
			if (rc == BACKEND_OK)
				LOG(LOG_WARN, "%.*s: deleted the lock a command of this process took "
				    "without an answer", (int)f->c.klen, f->c.key);
			free(f);
			continue;
		}
		if (rc == BACKEND_NO) {
			if (!f->absent_since_us)
				f->absent_since_us = now;
			f->next_us = now + FORGET_SETTLE_US / 4;
		} else {
			if (!down) {
				renew_conn_failed(&conn, err, sizeof(err));
				down = 1;
			}
			f->next_us = now + f->step_us;
			f->step_us = f->step_us * 2 > FORGET_RETRY_MAX_US ? FORGET_RETRY_MAX_US
									 : f->step_us * 2;
		}
		fs[left++] = f;
	}
	return left;
}

/* Ships the counts on *c; a failure drops *c (they go with the next
 * shipment) and is logged at level (when: the occasion). */
static void ship_counts(struct backend_conn **c, const char *when, int level)
{
	char err[192] = "";
	int failed = count_ship(backend, c, err, sizeof(err)) != 0;

	__atomic_store_n(&ship_failed, failed, __ATOMIC_RELAXED);
	if (!failed)
		return;
	renew_conn_failed(c, NULL, 0);
	LOG(level, "%s: counts not sent (kept for the next shipment): %s", when, err);
}

/* Sleeps until wake (INT64_MAX: until signalled). Holds mu. */
static void sleep_until(int64_t wake)
{
	struct timespec ts = { wake / 1000000, (wake % 1000000) * 1000 };

	thread_wake_us = wake;
	if (wake == INT64_MAX)
		pthread_cond_wait(&cv, &mu);
	else
		pthread_cond_timedwait(&cv, &mu, &ts);
	thread_wake_us = 0; /* awake: it will look at the list again */
}

/*
 * Under AddressSanitizer, GCC 12's libasan (Debian 12's) does not take its
 * allocator's locks across fork: a child forked while this thread was inside
 * malloc or free waits forever at its own first allocation (seen: a fork
 * child's TLS handshake stuck in the allocator's FutexWait; LLVM added the
 * missing atfork handler in llvm-project#75290, after that libasan). ASan
 * builds therefore hold work_mu while the thread works without mu, and
 * fork takes it first: the thread is then asleep or waiting for a mutex,
 * never in the allocator; and start_thread returns only once the new
 * thread runs renew_main (work_started), past the runtime's own set-up of
 * the thread, which allocates too (a fork right after the first guarded
 * call hung there). The handlers are registered when the thread first
 * starts, after net_tls.c's (the caller's connection is open by then), so
 * fork takes work_mu before the TLS handshake mutex the thread may need.
 * Other builds: glibc's malloc is fork-safe; nothing is taken.
 */
#ifdef __SANITIZE_ADDRESS__
static pthread_mutex_t work_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t work_once = PTHREAD_ONCE_INIT;
static sem_t work_started;

static void work_begin(void)
{
	pthread_mutex_lock(&work_mu);
}

static void work_end(void)
{
	pthread_mutex_unlock(&work_mu);
}

static void work_register(void)
{
	sem_init(&work_started, 0, 0);
	pthread_atfork(work_begin, work_end, work_end);
}

static void work_setup(void)
{
	pthread_once(&work_once, work_register);
}

/* The new thread runs renew_main (post), or start_thread waits for it. */
static void work_running(void)
{
	sem_post(&work_started);
}

static void work_wait_running(void)
{
	while (sem_wait(&work_started) != 0 && errno == EINTR)
		;
}
#else
static void work_begin(void) {}
static void work_end(void) {}
static void work_setup(void) {}
static void work_running(void) {}
static void work_wait_running(void) {}
#endif

static void *renew_main(void *arg)
{
	static struct lease batch[RENEW_BATCH], rel[RENEW_BATCH];
	static struct forget *fs[RENEW_BATCH];
	static int results[RENEW_BATCH];
	char err[192];

	(void)arg;
	guard_enter();
	work_running();
	pthread_mutex_lock(&mu);
	while (!stopping) {
		int64_t now = util_now_us(), wake = INT64_MAX;
		int n = collect_due(now, batch, &wake), rc = BACKEND_OK;
		int np = take_parked(now, rel, RENEW_BATCH, &wake);
		int nf = take_forgets(now, fs, RENEW_BATCH, &wake);
		int ship = count_blocks && now >= next_ship_us;

		if (ship)
			next_ship_us = now + SHIP_PERIOD_US;
		if (count_blocks && next_ship_us < wake)
			wake = next_ship_us;
		if (n == 0 && np == 0 && nf == 0 && !ship) {
			sleep_until(wake);
			continue;
		}
		pthread_mutex_unlock(&mu);
		work_begin();
		err[0] = 0;
		if (np)
			release_copies(&conn, rel, np, "parked lock");
		if (n)
			rc = renew_batch(batch, n, results, err, sizeof(err));
		if (nf)
			nf = forget_batch(fs, nf);
		if (ship)
			ship_counts(&conn, "metrics", LOG_DEBUG);
		work_end();
		pthread_mutex_lock(&mu);
		parked_done(rel, np);
		apply(batch, results, n, rc, now, err);
		while (nf > 0) {
			fs[nf - 1]->next = forgets;
			forgets = fs[--nf];
		}
	}
	running = 0;
	pthread_cond_broadcast(&done_cv); /* drain waits for it */
	pthread_mutex_unlock(&mu);
	return NULL;
}

/* Starts the thread, with every signal blocked, unless it runs already or
 * the process is exiting. Holds mu. Returns 0 or -errno. */
static int start_thread(void)
{
	sigset_t all, old;
	pthread_attr_t a;
	pthread_t th;
	int rc;

	if (running || stopping)
		return 0;
	/* the first shipment a period after the start: a process of a few
	 * calls ships at exit, on a connection it has, and the thread opens
	 * none for it */
	next_ship_us = util_now_us() + SHIP_PERIOD_US;
	work_setup();
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	pthread_attr_init(&a);
	pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
	rc = pthread_create(&th, &a, renew_main, NULL);
	pthread_attr_destroy(&a);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (rc == 0) {
		thread = th;
		running = 1;
		work_wait_running();
	}
	return -rc;
}

/* Wakes the thread when `at` comes before its planned wake-up, so that a
 * burst of guarded calls costs it no context switch. Holds mu. */
static void wake_by(int64_t at)
{
	if (at < thread_wake_us)
		pthread_cond_signal(&cv);
}

int renew_track(struct lease *l, long long granted_ttl_ms)
{
	int rc;

	if (backend->ops->leaseless && !leaseless_listed(l)) { /* not listed, no thread */
		l->state = LEASE_HELD;
		l->park = PARK_NONE;
		return 0;
	}
	pthread_mutex_lock(&mu);
	l->id = ++next_id;
	l->state = LEASE_HELD;
	l->park = PARK_NONE;
	l->confirmed_us = l->acquired_us;
	l->next_renew_us = first_renew_us(l, granted_ttl_ms);
	l->next = &head;
	l->prev = head.prev;
	head.prev->next = l;
	head.prev = l;
	rc = backend->ops->leaseless && !leaseless_thread(l) ? 0 : start_thread();
	wake_by(l->next_renew_us);
	pthread_mutex_unlock(&mu);
	return rc;
}

int renew_start(void)
{
	int rc;

	if (backend->ops->leaseless)
		return 0;
	pthread_mutex_lock(&mu);
	rc = start_thread();
	pthread_mutex_unlock(&mu);
	return rc;
}

void renew_lost_all(const char *why)
{
	pthread_mutex_lock(&mu);
	for (struct lease *l = head.next; l != &head; l = l->next)
		if (l->state == LEASE_HELD)
			lost(l, why);
	if (kill_pending && start_thread() == 0)
		pthread_cond_signal(&cv);
	pthread_mutex_unlock(&mu);
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
		l->parked_us = util_now_us();
		wake_by(until_us);
		rc = 0;
	}
	pthread_mutex_unlock(&mu);
	return rc;
}

/* Waits until no parked lease (only: that one) is being released. Holds mu. */
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
		l->acquired_us = util_now_us(); /* max_hold_ms counts from this call */
		rc = 1;
	} else {
		unlink_lease(l);
	}
	l->park = PARK_NONE;
	pthread_mutex_unlock(&mu);
	return rc;
}

void renew_before_exec(struct backend_conn **c)
{
	struct lease *rel = malloc(sizeof(*rel) * RENEW_BATCH);
	int64_t next = INT64_MAX;
	int n;

	renew_flush(c, "exec");
	for (;;) {
		pthread_mutex_lock(&mu);
		/* a release the renewal thread has in flight ends first: the
		 * thread does not outlive the image */
		wait_releases(NULL);
		n = rel ? take_parked(INT64_MAX, rel, RENEW_BATCH, &next) : 0;
		pthread_mutex_unlock(&mu);
		if (n == 0)
			break;
		release_copies(c, rel, n, "exec");
		pthread_mutex_lock(&mu);
		parked_done(rel, n);
		pthread_mutex_unlock(&mu);
	}
	free(rel);
	ship_counts(c, "exec", LOG_INFO);
}

/* Untracks every lease (parked ones too, once no release of one is in
 * flight) and stops the thread, waiting until it is gone (it may be in the
 * middle of a round trip: at most one connect and one command timeout),
 * so that nothing of the backend is in use once renew_exit returns (the
 * CLI frees it then); returns copies of the leases in *copies (malloc'd;
 * the caller frees it) and their count. */
static int drain(struct lease **copies)
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
	while (running && !pthread_equal(pthread_self(), thread))
		pthread_cond_wait(&done_cv, &mu);
	pthread_mutex_unlock(&mu);
	return i;
}

void renew_exit(struct backend_conn **c)
{
	struct lease *copies = NULL;
	struct forget *list;
	int64_t now = util_now_us();
	int n;

	renew_flush(c, "exit");
	n = drain(&copies);
	if (n)
		release_copies(c, copies, n, "exit");
	free(copies);
	pthread_mutex_lock(&mu);
	list = forgets;
	forgets = NULL;
	pthread_mutex_unlock(&mu);
	while (list) {
		struct forget *f = list;
		struct backend_item it = backend_copy_item(&f->c);
		char err[192] = "";

		list = f->next;
		if (now < f->until_us) {
			if (!conn_up(c, err, sizeof(err)) ||
			    backend->ops->leave(*c, &it, 0) == BACKEND_ERR) {
				renew_conn_failed(c, err, sizeof(err));
				LOG(LOG_ERROR, "exit: %.*s may keep a token of this process until it "
				    "expires (within %lld ms): %s", (int)it.klen, it.key,
				    it.lease_ms, err);
			}
		}
		free(f);
	}
	if (!__atomic_load_n(&ship_failed, __ATOMIC_RELAXED))
		ship_counts(c, "exit", LOG_INFO);
}

void renew_forget(const struct backend_item *it)
{
	struct forget *f;
	int64_t now = util_now_us();

	if (backend->ops->leaseless) /* nothing is held without its holder knowing */
		return;
	f = calloc(1, sizeof(*f));
	if (!f || backend_copy_set(&f->c, it) != 0) {
		LOG(LOG_ERROR, "%.*s: cannot keep track of an unconfirmed token (it expires "
		    "within %lld ms)", (int)it->klen, it->key, it->lease_ms);
		free(f);
		return;
	}
	f->until_us = now + it->lease_ms * MS;
	f->next_us = now;
	f->step_us = FORGET_RETRY_MIN_US;
	pthread_mutex_lock(&mu);
	f->next = forgets;
	forgets = f;
	if (!stopping) { /* else renew_exit tries it once */
		start_thread();
		wake_by(now);
	}
	pthread_mutex_unlock(&mu);
}

void renew_atfork_prepare(void)
{
	pthread_mutex_lock(&mu);
}

void renew_atfork_parent(void)
{
	pthread_mutex_unlock(&mu);
}

/* Fork child: an empty list, no thread; the parent's leases and tokens are
 * the parent's business. */
void renew_atfork_child(void)
{
	pthread_mutex_init(&mu, NULL);
	cv_init();
	for (struct lease *l = head.next, *next; l != &head; l = next) {
		next = l->next;
		l->next = l->prev = NULL;
	}
	head.next = head.prev = &head;
	while (forgets) {
		struct forget *f = forgets;

		forgets = f->next;
		free(f);
	}
	running = kill_pending = 0;
	thread_wake_us = next_ship_us = 0;
	count_atfork_child();
	if (conn) {
		backend->ops->close(conn);
		conn = NULL;
	}
}
