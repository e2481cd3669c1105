/* SPDX-License-Identifier: MIT */
/*
 * lock.c - acquiring and releasing locks for guarded calls (see lock.h).
 *
 * Hot path: expand the key into a stack buffer, look for a reentrant hold
 * (no round trip), else one acquire script (SET and the fencing counter's
 * increment; for a semaphore or a shared lock, an entry of the key's holder
 * set: the backend picks by the item's limit and mode) on the thread's own
 * connection; the
 * release is sent without waiting for its reply. A busy lock queues the
 * caller in Redis until a release wakes it or hands it the lock, up to
 * wait_ms (acquire_wait). No process-wide lock is taken while talking to
 * Redis; the renewal list's mutex is taken only to link, park or unlink a
 * lease. In default mode a hold whose call ended is kept ("parked") for the
 * thread's next call on the same key, which takes it back without a round
 * trip, for at most linger_ms and never past handoff_ms after it was taken;
 * renew.c releases it otherwise (lock caching); a thread about to wait for
 * a key gives up its kept holds first (give_up_kept). Every release goes
 * through renew_release.
 * Holds form a stack: a key's outermost call always ends after every hold
 * taken inside it, exceptions and longjmp included, so the innermost hold
 * is the one that ends.
 * A lock of several keys (`keys`) expands them all into the thread's
 * state, sorts them by bytes and takes each distinct one in that order
 * (take_key: reentrant, kept or from Redis), all against one deadline: two
 * calls never wait for each other's keys in opposite orders. Each key is a
 * hold of its own, so reentrancy, parking, renewal, fork and fences work
 * per key; the call record lists them, and lock_release leaves them all.
 * With a leaseless backend (backend_local.c: kernel file locks) the same
 * path runs: nothing is renewed, the renewal thread runs only for locks
 * with max_hold_ms or linger_ms (a kept lock lasts linger_ms from its
 * taking at most: reuse_us), a waiter waits for its wake-up as long as
 * wait_ms allows (wait_cap), and a refusal is not checked for a dead holder
 * (breaks_dead: the store frees a dead holder's lock itself).
 */
#include "lock.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"
#include "count.h"
#include "log.h"
#include "owner.h"
#include "renew.h"
#include "util.h"

#define LOCK_ERROR_LOG_MS 10000 /* while waiting, one Redis error line per 10 s */

struct lock_hold {
	struct lease lease;
	int64_t entered_us; /* its outermost call got the lock (hold_seconds) */
	int count;
	int parked;  /* no call runs; kept for the thread's next one (renew_park) */
	int foreign; /* inherited through fork: never renewed, never released */
};

struct lock_thread {
	struct backend_conn *conn;
	struct lock_call *top;
	uint64_t rng;
	uint64_t seed[2];   /* random, per thread: tokens derive from it */
	uint64_t tokens;    /* tokens made so far */
	size_t suffix_len;
	char suffix[BACKEND_VAL_MAX - 33 - 86]; /* owner.h: ":host:pid:tid:boot:ns:start" */
	int call_waited;    /* a key of the call being taken had to wait (acquired) */
	int nholds;
	struct lock_hold holds[LOCK_MAX_HOLDS];
	char keys[CONF_KEYS_MAX][KEY_BUF_SIZE]; /* the call being taken: its keys expanded */
};

/* The keys of one call: distinct, in byte order (sort_keys). */
struct call_keys {
	int n;
	const char *key[CONF_KEYS_MAX];
	size_t len[CONF_KEYS_MAX];
};

/* How a call got a key, cheapest first (the call counts as its costliest). */
enum got { GOT_REENTRANT, GOT_KEPT, GOT_REDIS };

static int lock_pid; /* the process this state belongs to (see own_process) */
static const struct backend *backend;
static pthread_key_t thread_key;
static __thread struct lock_thread *self __attribute__((tls_model("initial-exec")));

static void give_up(struct lock_thread *t, struct lock_hold *h);

/* Releases every hold t keeps parked (its thread is ending, or it is about
 * to wait for a key: give_up_kept). Holds of running calls stay. */
static void release_parked(struct lock_thread *t)
{
	for (int i = 0; i < t->nholds; i++)
		if (t->holds[i].parked)
			give_up(t, &t->holds[i]);
}

static void thread_free(void *arg)
{
	struct lock_thread *t = arg;

	release_parked(t);
	renew_flush(&t->conn, "thread exit");
	if (t->conn)
		backend->ops->close(t->conn);
	self = NULL;
	free(t);
}

int lock_setup(const struct backend *b)
{
	backend = b;
	lock_pid = getpid();
	renew_setup(b);
	return -pthread_key_create(&thread_key, thread_free);
}

/* Sets the holder identity that ends t's lock values (owner.c reads the
 * process's on first use: only a thread that makes a token pays for it). */
static void set_identity(struct lock_thread *t)
{
	t->suffix_len = owner_suffix(t->suffix, sizeof(t->suffix), (int)syscall(SYS_gettid));
}

/* Returns this thread's state, creating it on first use, or NULL. */
static struct lock_thread *thread_get(void)
{
	if (self)
		return self;
	self = calloc(1, sizeof(*self));
	if (!self)
		return NULL;
	if (getrandom(self->seed, sizeof(self->seed), GRND_NONBLOCK) != sizeof(self->seed)) {
		self->seed[0] = (uint64_t)util_now_ms() * 0x9e3779b97f4a7c15ULL;
		self->seed[1] = (uint64_t)(uintptr_t)self ^ (uint64_t)getpid() << 32;
	}
	self->rng = self->seed[0] ^ self->seed[1] ^ 0x2545f4914f6cdd1dULL;
	self->rng |= 1;
	pthread_setspecific(thread_key, self);
	return self;
}

static uint64_t rng_next(struct lock_thread *t)
{
	t->rng ^= t->rng << 13;
	t->rng ^= t->rng >> 7;
	t->rng ^= t->rng << 17;
	return t->rng;
}

/*
 * Writes "<128-bit token in hex>", the holder identity, the time (wall
 * clock, ms: when this acquisition, or wait, began) and the program into
 * l->val (owner.h). The token mixes the thread's random seed with a
 * counter: unpredictable without the seed, never repeated by the thread,
 * and made without a system call (the clock is the vDSO's).
 */
static void make_value(struct lock_thread *t, struct lease *l)
{
	struct timespec ts;
	static const char hex[] = "0123456789abcdef";
	uint64_t n = ++t->tokens;
	uint64_t r[2] = { util_mix64(t->seed[0] + n * 0x9e3779b97f4a7c15ULL),
			  util_mix64(t->seed[1] ^ util_mix64(n)) };

	for (int i = 0; i < 32; i++)
		l->val[i] = hex[(r[i / 16] >> (60 - 4 * (i % 16))) & 15];
	if (!t->suffix_len)
		set_identity(t);
	memcpy(l->val + 32, t->suffix, t->suffix_len);
	l->vlen = 32 + t->suffix_len;
	clock_gettime(CLOCK_REALTIME, &ts);
	l->vlen += owner_tail(l->val + l->vlen, sizeof(l->val) - l->vlen,
			      (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000);
}

/* Opens the thread's connection if needed. Returns 0 or -1 (err filled). */
static int conn_get(struct lock_thread *t, char *err, size_t errlen)
{
	if (!t->conn)
		t->conn = backend_open(backend, err, errlen);
	return t->conn ? 0 : -1;
}

/* After an operation returned rc (enum backend_result): on error, keeps the
 * reason and drops the connection (renew_conn_failed; the next operation
 * reconnects). Returns rc. */
static int conn_check(struct lock_thread *t, int rc, char *err, size_t errlen)
{
	if (rc == BACKEND_ERR)
		renew_conn_failed(&t->conn, err, errlen);
	return rc;
}

/* Returns the next sleep: full jitter over a doubling step capped at max. */
static int64_t backoff_next(struct lock_thread *t, int64_t *step, int64_t max)
{
	int64_t s = *step;

	*step = s * 2 > max ? max : s * 2;
	return s / 2 + (int64_t)(rng_next(t) % (uint64_t)(s / 2 + 1));
}

static int64_t min64(int64_t a, int64_t b)
{
	return a < b ? a : b;
}

/* Returns how long after taking spec's lock its thread may still keep it
 * between calls (µs): handoff_ms; with a leaseless backend, which hands
 * nothing over (handoff_ms refused), linger_ms: a thread that calls
 * without pause still lets the lock go that often. */
static int64_t reuse_us(const struct lock_spec *s)
{
	return backend->ops->leaseless ? s->linger_ms * 1000LL : s->handoff_us;
}

/* Whether spec's lock may stay with its thread between calls. */
static int lingers(const struct lock_spec *s)
{
	return !s->fair && reuse_us(s) > 0 && s->linger_ms > 0;
}

/* Records that l is ours since `since` (µs) with fencing token fence,
 * asked for at asked_us, and counts and logs it (a lock of several keys
 * notes a wait for lock_acquire, which counts the call once). */
static int acquired(struct lease *l, int64_t since, int64_t asked_us, long long fence,
		    int tries, const char *how)
{
	int64_t now = util_now_us();

	l->acquired_us = since;
	l->reuse_until_us = now + reuse_us(l->spec);
	l->fence = fence;
	if (l->spec->nkeys > 1)
		self->call_waited |= tries > 1;
	else
		count_observe(l->spec, tries > 1 ? MC_ACQ_WAITED : MC_ACQ_FAST, MH_WAIT,
			      now - asked_us);
	LOGK(LOG_DEBUG, l->spec->symbol, l->key, l->klen, "acquired %.*s for %s (%d tries%s), "
	     "fence %lld", (int)l->klen, l->key, l->spec->symbol, tries, how, fence);
	return LOCK_OK;
}

/*
 * Logs one warn line when the call about to enter l waited longer than its
 * warn_wait_ms (0: never) since start_ms: the key, the wait and the last
 * holder it saw (holder[0..hlen), a lock value; hlen 0: none seen).
 */
static void slow_wait(const struct lease *l, int64_t start_ms, const char *holder, size_t hlen)
{
	const struct lock_spec *s = l->spec;
	long long waited;
	char who[BACKEND_VAL_MAX];

	if (s->warn_wait_ms <= 0 || LOG_WARN > log_threshold ||
	    (waited = (long long)(util_now_ms() - start_ms)) <= s->warn_wait_ms)
		return;
	owner_describe(holder, hlen, who, sizeof(who));
	LOGK(LOG_WARN, s->symbol, l->key, l->klen, "%s: lock %.*s taken after waiting %lld ms "
	     "(holder: %s)", s->symbol, (int)l->klen, l->key, waited, who);
}

/*
 * After a refusal by holder[0..hlen): when that holder is a process of this
 * machine that is gone (owner.c; a full check when the same holder refused
 * the previous attempt too, or this is the last one), deletes the lock if
 * it still holds that exact value and says so; in a holder set (a permit,
 * a shared entry: the backend reports one holder per attempt, in turn)
 * only that holder's entry goes. Returns 1 when it did: try again now.
 */
static int break_dead(struct lock_thread *t, const struct backend_item *it,
		      const char *holder, size_t hlen, int thorough, char *err, size_t errlen)
{
	struct backend_item dead = *it;
	int pid = 0, rc;

	if (!owner_gone(holder, hlen, thorough, &pid))
		return 0;
	dead.val = holder;
	dead.vlen = hlen;
	dead.turn_done = 1; /* a queued waiter may have it at once */
	rc = conn_check(t, backend->ops->release(t->conn, &dead, 0), err, errlen);
	if (rc == BACKEND_NO && !backend_item_set(it)) {
		/* a dead shared holder keeping out this exclusive caller: its
		 * entry of the holder set, removed by the set's release */
		dead.shared = 1;
		rc = conn_check(t, backend->ops->release(t->conn, &dead, 0), err, errlen);
	}
	if (rc != BACKEND_OK)
		return 0;
	LOGK(LOG_WARN, NULL, it->key, it->klen, "%.*s was held by process %d of this machine, "
	     "which is gone; lock broken", (int)it->klen, it->key, pid);
	return 1;
}

/* Whether a refusal is checked for a holder gone (break_dead): not with a
 * leaseless backend (local, zookeeper), whose store frees a dead holder's
 * lock itself (the kernel at once, the server when the session ends) and
 * whose release takes only the process's own holds, so that break_dead
 * could never break one: its liveness check (kill, then /proc) at every
 * refusal is skipped. */
static int breaks_dead(const struct lock_spec *s)
{
	return s->break_dead && !backend->ops->leaseless;
}

const char *lock_store_name(void)
{
	return backend_store(backend->ops);
}

/* Returns how long one wait for a signal may take: the backend's hint,
 * capped by retry_max_ms, when the waiter must ask again that often to stay
 * queued (not with a leaseless or watched backend, whose wake-up is the
 * release's). */
static int64_t wait_cap(const struct lock_spec *s, long long hint)
{
	return backend->ops->leaseless || backend->ops->watched ? hint :
		min64(hint, s->retry_max_ms);
}

/*
 * Before t waits for a key (after its first refusal; never on the
 * uncontended path), it gives up the locks it keeps only for linger_ms:
 * no call uses them, and kept through a wait they would make two threads
 * that take keys in opposite orders wait for each other. With postgres
 * that lasts until wait_ms, or until the server's deadlock detector fails
 * a wait (only the holder's session can unlock, and it is busy waiting);
 * elsewhere the renewal thread frees a kept lock at linger_ms's end over
 * its own connection, a delay instead. Every backend does it (no flag):
 * Redis and postgres send the releases without waiting for their replies,
 * ahead of the wait's first command (no round trip of their own), and a
 * thread that waited would rarely still find its kept locks in their reuse
 * window. The holds of calls still running (an outer call's lock) stay.
 */
static void give_up_kept(struct lock_thread *t)
{
	release_parked(t);
}

/*
 * The wait path. The first attempt is the plain acquire script; when the
 * lock is busy the thread gives up its kept locks (give_up_kept) and joins
 * the queue in Redis (one script, which also says how long a signal may
 * take at most: the holder's remaining lease, or the queue head's expiry)
 * and blocks on its signal list for at most that, retry_max_ms and the
 * time left. A release either hands the lock over ("g": ours now,
 * no further round trip, with a short TTL until the first renewal) or wakes
 * the waiter to try again. A missed signal costs at most the lease's
 * remaining TTL; a holder that died on this machine, nothing (break_dead).
 * Redis errors back off with jitter; a call that gives up after an error,
 * when Redis may have run its command without answering, hands its token
 * to the renewal thread to be deleted (renew_forget). Sets *granted_ttl_ms
 * to the TTL the key was given (the lease, or the shorter waiter TTL of a
 * hand-over), from which renew_track plans the first renewal. A waiter
 * starts the renewal thread before it queues; when that fails it gives up
 * at once (LOCK_NOLEASE), since a lock it took could not be kept. A caller
 * whose limit differs from the key's holders' (BACKEND_MISMATCH) logs one
 * error line naming both and gets LOCK_REFUSED at once. deadline: when to
 * give up (monotonic ms; INT64_MAX: never). Returns an enum
 * lock_outcome.
 */
static int acquire_loop(struct lock_thread *t, struct lease *l, struct backend_item *it,
			int64_t deadline, long long *granted_ttl_ms)
{
	const struct lock_spec *s = l->spec;
	int64_t now = util_now_ms(), start = now, step = 2, asked_us = 0;
	int64_t logged = now - LOCK_ERROR_LOG_MS;
	int busy = 0, tries = 0, unsure = 0, start_rc = 0, mism = 0, queued, rc;
	char err[192] = "", holder[BACKEND_VAL_MAX], seen[BACKEND_VAL_MAX];
	size_t hlen, seen_len = 0;

	*granted_ttl_ms = s->lease_ms;
	for (;;) {
		int64_t sent = util_now_us();
		long long hint = 0, fence = 0;

		if (!asked_us)
			asked_us = sent;
		hlen = 0;
		it->pick = tries; /* a holder set's holders reported in turn */
		rc = conn_get(t, err, sizeof(err));
		if (rc == 0) {
			rc = conn_check(t, backend->ops->acquire(t->conn, it, &hint, holder, &hlen,
								  &fence),
					err, sizeof(err));
			unsure |= rc == BACKEND_ERR; /* sent, maybe run, unanswered */
		}
		tries++;
		if (rc == BACKEND_MISMATCH) {
			snprintf(err, sizeof(err), "%s", backend->ops->errstr(t->conn));
			mism = 1;
			break;
		}
		if (rc == BACKEND_OK) {
			if (tries > 1)
				slow_wait(l, start, seen, seen_len);
			return acquired(l, sent, asked_us, fence, tries, "");
		}
		busy |= rc == BACKEND_NO;
		now = util_now_ms();
		if (rc == BACKEND_NO && hlen) {
			int again = hlen == seen_len && memcmp(holder, seen, hlen) == 0;

			memcpy(seen, holder, hlen);
			seen_len = hlen;
			if (breaks_dead(s)) {
				if (break_dead(t, it, holder, hlen, again || now >= deadline,
					       err, sizeof(err))) {
					count_add(s, MC_DEAD_BROKEN);
					continue;
				}
				if (!t->conn) /* its release failed: an error, no wait */
					rc = BACKEND_ERR;
			}
		}
		if (now >= deadline)
			break;
		if (rc == BACKEND_NO) {
			/* while waiting, not while holding; without the thread a
			 * lock taken could not be kept: give up now (not queued) */
			if (!it->waiting && (start_rc = renew_start()) != 0)
				break;
			if (!it->waiting)
				give_up_kept(t);
			it->waiting = 1; /* queued from now on (joins at once if not yet) */
			if (hint == BACKEND_NOT_QUEUED)
				continue;
			rc = conn_check(t, backend->ops->wait(t->conn, it,
					min64(wait_cap(s, hint), deadline - now), &fence),
					err, sizeof(err));
			unsure |= rc == BACKEND_ERR;
			if (rc == BACKEND_GRANTED) {
				if (it->waiter_ttl_ms < *granted_ttl_ms)
					*granted_ttl_ms = it->waiter_ttl_ms;
				slow_wait(l, start, seen, seen_len);
				return acquired(l, now * 1000, asked_us, fence, tries, ", handed over");
			}
			if (rc != BACKEND_ERR)
				continue;
		}
		now = util_now_ms();
		if (now - logged >= LOCK_ERROR_LOG_MS) {
			LOG(LOG_WARN, "%s: %s error, retrying: %s", s->symbol, lock_store_name(), err);
			logged = now;
		}
		if (now < deadline)
			util_sleep_ms(min64(backoff_next(t, &step, s->retry_max_ms), deadline - now));
	}
	/* a watched backend's first refusal queued the caller already */
	queued = it->waiting || (busy && backend->ops->watched);
	if (unsure || (queued && !t->conn)) {
		renew_forget(it);
	} else if (queued && backend->ops->leave(t->conn, it, 1) == BACKEND_ERR) {
		conn_check(t, -1, err, sizeof(err));
		renew_forget(it);
	}
	if (mism) {
		LOGK(LOG_ERROR, s->symbol, l->key, l->klen, "%s: lock %.*s not taken: %s (all "
		     "holders of a key must agree on limit)", s->symbol, (int)l->klen, l->key, err);
		return LOCK_REFUSED;
	}
	if (start_rc) {
		LOG(LOG_ERROR, "%s: lock %.*s not taken: its lease could not be kept "
		    "(cannot start the renewal thread: %s)", s->symbol, (int)l->klen, l->key,
		    strerror(-start_rc));
		return LOCK_NOLEASE;
	}
	if (!busy) {
		LOGK(LOG_ERROR, s->symbol, l->key, l->klen,
		     "%s: %s unavailable for %lld ms, lock %.*s not taken: %s",
		     s->symbol, lock_store_name(), s->wait_ms, (int)l->klen, l->key, err);
		return LOCK_ERROR;
	}
	if (LOG_WARN <= log_threshold) {
		owner_describe(seen, seen_len, holder, sizeof(holder));
		LOGK(LOG_WARN, s->symbol, l->key, l->klen,
		     "%s: lock %.*s still held by another owner after %lld ms "
		     "(holder: %s)", s->symbol, (int)l->klen, l->key, s->wait_ms, holder);
	}
	return LOCK_TIMEOUT;
}

/* The state a cancelled waiter leaves behind (wait_cancelled). */
struct waiter {
	struct lock_thread *t;
	const struct backend_item *it;
};

/* pthread_cancel of a thread waiting in acquire_loop (BLPOP, connect and
 * the backoff sleep are cancellation points): its connection may be in the
 * middle of a command and its token queued or even granted, so the
 * connection is dropped and the token forgotten (renew_forget), else a
 * release could hand the lock to a thread that no longer exists. */
static void wait_cancelled(void *arg)
{
	struct waiter *w = arg;

	/* no stack buffer here: ASan has not unpoisoned the frames the
	 * cancellation unwound when this runs */
	renew_conn_failed(&w->t->conn, NULL, 0);
	renew_forget(w->it);
}

/* acquire_loop, with wait_cancelled armed for a cancellation inside it;
 * *deadline (monotonic ms) is set from wait_ms when still 0: a call's keys
 * share the first one's. */
static int acquire_wait(struct lock_thread *t, struct lease *l, int64_t *deadline,
			long long *granted_ttl_ms)
{
	struct backend_item it = renew_item(l);
	struct waiter w = { t, &it };
	int rc;

	if (!*deadline)
		*deadline = l->spec->wait_ms < 0 ? INT64_MAX : util_now_ms() + l->spec->wait_ms;
	pthread_cleanup_push(wait_cancelled, &w);
	rc = acquire_loop(t, l, &it, *deadline, granted_ttl_ms);
	pthread_cleanup_pop(0);
	return rc;
}

/* Whether holds of a and b are the same kind: a string lock, shared
 * entries, or permits of one limit. */
static int same_mode(const struct lock_spec *a, const struct lock_spec *b)
{
	return a->shared == b->shared && a->limit == b->limit;
}

/*
 * Returns t's hold of key that is active (parked = 0: entered, not inherited
 * through fork) or kept for the next call (parked = 1), or NULL. A parked
 * hold serves only a call of spec's mode (a shared entry is no exclusive
 * lock): one of another mode is given up here, so that the call does not
 * wait for its own thread's entry.
 */
static struct lock_hold *find_hold(struct lock_thread *t, const struct lock_spec *spec,
				   const char *key, size_t klen, int parked)
{
	for (int i = t->nholds - 1; i >= 0; i--) {
		struct lock_hold *h = &t->holds[i];
		int match = parked ? h->parked : h->count > 0 && !h->foreign;

		if (!match || h->lease.klen != klen || memcmp(h->lease.key, key, klen) != 0)
			continue;
		if (parked && !same_mode(h->lease.spec, spec)) {
			give_up(t, h);
			continue;
		}
		return h;
	}
	return NULL;
}

/*
 * Whether spec's call may not enter h, the thread's active hold of the same
 * key: an exclusive call inside a shared hold, or a plain lock (limit 1)
 * inside a permit, would be an upgrade, which deadlocks as soon as two
 * threads holding it shared both try. Logs one error line then. Returns 1
 * (the caller gets LOCK_REFUSED: on_error) or 0 (a reentrant entry: an
 * exclusive hold admits a shared call, since nobody else holds the key).
 */
static int upgrade_refused(const struct lock_spec *spec, const struct lock_hold *h)
{
	const struct lock_spec *held = h->lease.spec;

	if (spec->shared || (!held->shared && (held->limit <= 1 || spec->limit > 1)))
		return 0;
	LOGK(LOG_ERROR, spec->symbol, h->lease.key, h->lease.klen, "%s: lock %.*s not taken: "
	     "this thread holds it %s, and an exclusive call inside would be an upgrade "
	     "(two such holders would wait for each other forever)", spec->symbol,
	     (int)h->lease.klen, h->lease.key, held->shared ? "shared" : "as a permit");
	return 1;
}

static void push_call(struct lock_thread *t, struct lock_call *call)
{
	call->up = t->top;
	t->top = call;
}

static void release_hold(struct lock_thread *t, struct lock_hold *h, int idle);

/*
 * Takes parked hold h back. Returns 1 when it is ours for a new call (no
 * round trip); 0 when its slot is free again: the renewal thread released
 * it, it was lost, or its reuse window closed (then it is released here).
 */
static int take_back(struct lock_thread *t, struct lock_hold *h)
{
	int64_t now;

	h->parked = 0;
	if (!renew_unpark(&h->lease))
		return 0;
	now = util_now_us();
	if (now < h->lease.reuse_until_us) {
		h->entered_us = now;
		return 1;
	}
	release_hold(t, h, 0);
	return 0;
}

/* Releases parked hold h unless the renewal thread already did; its slot
 * is free afterwards. */
static void give_up(struct lock_thread *t, struct lock_hold *h)
{
	if (take_back(t, h))
		release_hold(t, h, 1);
}

/*
 * Returns a free hold slot (a parked hold is given up when all are taken),
 * or NULL. A slot at nholds is not counted until the caller fills it.
 */
static struct lock_hold *slot_get(struct lock_thread *t)
{
	for (int i = 0; i < t->nholds; i++)
		if (!t->holds[i].count && !t->holds[i].parked)
			return &t->holds[i];
	if (t->nholds < LOCK_MAX_HOLDS)
		return &t->holds[t->nholds];
	for (int i = 0; i < t->nholds; i++) {
		struct lock_hold *h = &t->holds[i];

		if (h->parked) {
			give_up(t, h);
			return h;
		}
	}
	return NULL;
}

/*
 * The lock of h (taken, tracked, not yet counted in t's holds) cannot be
 * kept: renew_track could not start the renewal thread (-errno rc). No
 * call may run on a lease nobody renews, so it is released at once through
 * the release path (the key is deleted, or handed to a waiter, if it is
 * still ours) and h's slot stays free. Returns LOCK_NOLEASE.
 */
static int unkept(struct lock_thread *t, struct lock_hold *h, int rc)
{
	const struct lease *l = &h->lease;

	LOG(LOG_ERROR, "%s: lock %.*s released at once: its lease could not be kept "
	    "(cannot start the renewal thread: %s)", l->spec->symbol, (int)l->klen, l->key,
	    strerror(-rc));
	release_hold(t, h, 1);
	return LOCK_NOLEASE;
}

/*
 * Takes key[0..klen) from Redis for spec into a free slot (waiting until
 * *deadline, acquire_wait) and tracks its lease. Returns LOCK_OK with the
 * hold in *hp (count 1, counted in t's holds), or another enum lock_outcome
 * with nothing held.
 */
static int take_fresh(struct lock_thread *t, const struct lock_spec *spec, const char *key,
		      size_t klen, int64_t *deadline, struct lock_hold **hp)
{
	struct lock_hold *h = slot_get(t);
	long long granted_ttl_ms;
	int rc;

	if (!h) {
		LOG(LOG_ERROR, "%s: more than %d locks held by one thread", spec->symbol,
		    LOCK_MAX_HOLDS);
		return LOCK_REFUSED;
	}
	memset(h, 0, offsetof(struct lock_hold, lease.key));
	h->lease.spec = spec;
	h->lease.klen = klen;
	memcpy(h->lease.key, key, klen);
	make_value(t, &h->lease);
	rc = acquire_wait(t, &h->lease, deadline, &granted_ttl_ms);
	if (rc != LOCK_OK)
		return rc;
	h->entered_us = h->lease.reuse_until_us - reuse_us(spec); /* acquired()'s now */
	h->foreign = 0; /* a slot a fork child inherited is ours now: unkept releases it */
	if ((rc = renew_track(&h->lease, granted_ttl_ms)) != 0)
		return unkept(t, h, rc);
	h->count = 1;
	if (h == &t->holds[t->nholds])
		t->nholds++;
	*hp = h;
	return LOCK_OK;
}

/* Gives up t's parked holds of keys k->key[from..n): a call about to wait
 * for an earlier key must not sit on later ones meanwhile. */
static void drop_parked(struct lock_thread *t, const struct lock_spec *spec,
			const struct call_keys *k, int from)
{
	for (int i = from; i < k->n; i++) {
		struct lock_hold *h = find_hold(t, spec, k->key[i], k->len[i], 1);

		if (h)
			give_up(t, h);
	}
}

/*
 * Takes the key k->key[i] for spec: entered again when t holds it already
 * (reentrant), taken back when parked, else from Redis (after giving up
 * the parked holds of the keys after it). Returns LOCK_OK with the hold in
 * *hp (its count raised) and how in *got, or another enum lock_outcome.
 */
static int take_key(struct lock_thread *t, const struct lock_spec *spec,
		    const struct call_keys *k, int i, int64_t *deadline, struct lock_hold **hp,
		    int *got)
{
	struct lock_hold *h;

	if (spec->reentrant && (h = find_hold(t, spec, k->key[i], k->len[i], 0)) != NULL) {
		if (upgrade_refused(spec, h))
			return LOCK_REFUSED;
		h->count++;
		*got = GOT_REENTRANT;
	} else if ((h = find_hold(t, spec, k->key[i], k->len[i], 1)) != NULL &&
		   take_back(t, h)) {
		h->count = 1;
		*got = GOT_KEPT;
	} else {
		*got = GOT_REDIS;
		drop_parked(t, spec, k, i + 1);
		return take_fresh(t, spec, k->key[i], k->len[i], deadline, hp);
	}
	*hp = h;
	return LOCK_OK;
}

/* Returns <0, 0 or >0 as key a sorts before, with or after b: by bytes,
 * then the shorter first. */
static int key_cmp(const char *a, size_t alen, const char *b, size_t blen)
{
	int c = memcmp(a, b, alen < blen ? alen : blen);

	return c ? c : (alen > blen) - (alen < blen);
}

/* Expands spec's keys for args into t->keys and lists them in k: in byte
 * order, each distinct key once. */
static void sort_keys(struct lock_thread *t, const struct lock_spec *spec,
		      const uint64_t args[ARCH_INT_ARGS], struct call_keys *k)
{
	k->n = 0;
	for (int i = 0; i < spec->nkeys; i++) {
		size_t len = key_expand(conf_key(spec, i), args, lock_pid, t->keys[i]);
		int j = k->n, c = 1;

		while (j > 0 && (c = key_cmp(k->key[j - 1], k->len[j - 1], t->keys[i], len)) > 0)
			j--;
		if (j > 0 && c == 0)
			continue; /* named twice: taken once */
		memmove(&k->key[j + 1], &k->key[j], sizeof(k->key[0]) * (size_t)(k->n - j));
		memmove(&k->len[j + 1], &k->len[j], sizeof(k->len[0]) * (size_t)(k->n - j));
		k->key[j] = t->keys[i];
		k->len[j] = len;
		k->n++;
	}
}

static void leave_holds(struct lock_thread *t, struct lock_call *call, int failed);

/* Drops t's unused hold slots at the top of its stack. */
static void trim_holds(struct lock_thread *t)
{
	while (t->nholds > 0 && t->holds[t->nholds - 1].count == 0 &&
	       !t->holds[t->nholds - 1].parked)
		t->nholds--;
}

/* Reserves n fresh hold slots for spec's keys k->key[0..n) in hs (count 1,
 * not taken yet), each with its own value. Returns 0, or -1 when the slots
 * run out (none reserved then). */
static int reserve_holds(struct lock_thread *t, const struct lock_spec *spec,
			 const struct call_keys *k, int n, struct lock_hold **hs)
{
	for (int i = 0; i < n; i++) {
		struct lock_hold *h = slot_get(t);

		if (!h) {
			while (i-- > 0)
				hs[i]->count = 0;
			trim_holds(t);
			return -1;
		}
		memset(h, 0, offsetof(struct lock_hold, lease.key));
		h->lease.spec = spec;
		h->lease.klen = k->len[i];
		memcpy(h->lease.key, k->key[i], k->len[i]);
		make_value(t, &h->lease);
		h->count = 1;
		h->foreign = 0; /* a slot a fork child inherited is ours now */
		if (h == &t->holds[t->nholds])
			t->nholds++;
		hs[i] = h;
	}
	return 0;
}

/* What a batch (take_batch) cancelled in its round trip leaves behind. */
struct batch_wait {
	struct lock_thread *t;
	const struct backend_item *items;
	int n;
};

/* pthread_cancel of a thread in take_batch's round trip: as wait_cancelled,
 * for each of its tokens (Redis may have granted any of them). */
static void batch_cancelled(void *arg)
{
	struct batch_wait *b = arg;

	renew_conn_failed(&b->t->conn, NULL, 0);
	for (int i = 0; i < b->n; i++)
		renew_forget(&b->items[i]);
}

/* The backend's acquire_batch of items on t's connection, with
 * batch_cancelled armed. Returns its enum backend_result. */
static int batch_send(struct lock_thread *t, int n, const struct backend_item *items,
		      int *results, long long *fences)
{
	struct batch_wait b = { t, items, n };
	int rc;

	pthread_cleanup_push(batch_cancelled, &b);
	rc = backend->ops->acquire_batch(t->conn, n, items, results, fences);
	pthread_cleanup_pop(0);
	return rc;
}

/*
 * The first attempt at every key of k in one round trip (the backend's
 * acquire_batch), when the backend can batch them and t holds and keeps
 * none of them (the uncontended case). The keys taken before the first
 * one refused become call's holds; those taken after it are released again
 * at once (sent without waiting), so that the caller waits for the refused
 * key in order. After an error nothing is held (the tokens are forgotten,
 * renew_forget) and the caller takes every key one by one. Returns an enum
 * lock_outcome: LOCK_OK (call->n keys held; the others are the caller's)
 * or LOCK_NOLEASE (a lease could not be kept: nothing held).
 */
static int take_batch(struct lock_thread *t, const struct lock_spec *spec,
		      const struct call_keys *k, struct lock_call *call, int64_t asked_us)
{
	struct backend_item items[CONF_KEYS_MAX];
	struct lock_hold *hs[CONF_KEYS_MAX];
	long long fences[CONF_KEYS_MAX];
	int results[CONF_KEYS_MAX], rc, nolease = 0;
	char err[192];
	int64_t sent;

	if (!backend->ops->acquire_batch || spec->fair)
		return LOCK_OK;
	for (int i = 0; i < k->n; i++)
		if (find_hold(t, spec, k->key[i], k->len[i], 0) ||
		    find_hold(t, spec, k->key[i], k->len[i], 1))
			return LOCK_OK;
	if (reserve_holds(t, spec, k, k->n, hs) != 0)
		return LOCK_OK;
	for (int i = 0; i < k->n; i++)
		items[i] = renew_item(&hs[i]->lease);
	sent = util_now_us();
	rc = BACKEND_NO; /* not connected: nothing sent, the caller tries one by one */
	if (conn_get(t, err, sizeof(err)) == 0)
		rc = conn_check(t, batch_send(t, k->n, items, results, fences), err, sizeof(err));
	for (int i = 0; i < k->n; i++) {
		struct lock_hold *h = hs[i];
		int ok = rc == BACKEND_OK && results[i] == BACKEND_OK;

		if (rc == BACKEND_ERR)
			renew_forget(&items[i]);
		h->count = 0;
		if (ok && call->n == i && !nolease) {
			acquired(&h->lease, sent, asked_us, fences[i], 1, "");
			h->entered_us = h->lease.reuse_until_us - reuse_us(spec);
			if ((nolease = renew_track(&h->lease, spec->lease_ms)) != 0) {
				unkept(t, h, nolease);
				continue;
			}
			h->count = 1;
			call->hold[call->n++] = h;
		} else if (ok) {
			release_hold(t, h, 1); /* after a refused key, or no lease kept */
		}
	}
	trim_holds(t);
	if (!nolease)
		return LOCK_OK;
	leave_holds(t, call, 1);
	return LOCK_NOLEASE;
}

/*
 * Takes every key of k for spec in order into call's holds, against one
 * deadline (after one batched first attempt at all of them, take_batch);
 * when one cannot be taken, leaves those taken (released at once, never
 * kept) and returns its outcome. Counts the call's acquisition once, as
 * its costliest key got it (a key taken from Redis counts as waited when
 * any of them waited). Returns an enum lock_outcome.
 */
static int take_keys(struct lock_thread *t, const struct lock_spec *spec,
		     const struct call_keys *k, struct lock_call *call)
{
	int64_t deadline = 0, asked_us = util_now_us();
	int rc, got, most = GOT_REENTRANT;

	t->call_waited = 0;
	rc = take_batch(t, spec, k, call, asked_us);
	if (call->n)
		most = GOT_REDIS;
	for (int i = call->n; i < k->n && rc == LOCK_OK; i++) {
		rc = take_key(t, spec, k, i, &deadline, &call->hold[call->n], &got);
		if (rc == LOCK_OK)
			call->n++;
		most = got > most ? got : most;
	}
	if (rc != LOCK_OK) {
		leave_holds(t, call, 1);
		return rc;
	}
	if (most == GOT_REDIS)
		count_observe(spec, t->call_waited ? MC_ACQ_WAITED : MC_ACQ_FAST, MH_WAIT,
			      util_now_us() - asked_us);
	else
		count_add(spec, most == GOT_KEPT ? MC_ACQ_KEPT : MC_ACQ_REENTRANT);
	return LOCK_OK;
}

/* lock_acquire without the thread's state (no memory for it): says so,
 * naming the first key. Returns LOCK_NOLEASE. */
static int __attribute__((noinline)) no_state(const struct lock_spec *spec,
					      const uint64_t args[ARCH_INT_ARGS])
{
	char key[KEY_BUF_SIZE];
	size_t klen = key_expand(&spec->key, args, lock_pid, key);

	LOG(LOG_ERROR, "%s: lock %.*s not taken: its lease could not be kept (out "
	    "of memory for the thread's lock state)", spec->symbol, (int)klen, key);
	return LOCK_NOLEASE;
}

int lock_acquire(const struct lock_spec *spec, const uint64_t args[ARCH_INT_ARGS],
		 struct lock_call *call)
{
	struct lock_thread *t = thread_get();
	int64_t deadline = 0;
	int rc, got;

	call->n = 0;
	if (!t)
		return no_state(spec, args);
	if (spec->nkeys > 1) {
		struct call_keys k;

		sort_keys(t, spec, args, &k);
		rc = take_keys(t, spec, &k, call);
	} else {
		struct call_keys k;

		k.n = 1;
		k.key[0] = t->keys[0];
		k.len[0] = key_expand(&spec->key, args, lock_pid, t->keys[0]);
		rc = take_key(t, spec, &k, 0, &deadline, &call->hold[0], &got);
		if (rc == LOCK_OK && got != GOT_REDIS) /* acquired() counted a fresh one */
			count_add(spec, got == GOT_KEPT ? MC_ACQ_KEPT : MC_ACQ_REENTRANT);
		call->n = rc == LOCK_OK;
	}
	if (rc == LOCK_OK)
		push_call(t, call);
	return rc;
}

/*
 * Keeps h, whose last call just ended, for the thread's next call when its
 * lock lingers and its reuse window is open: the renewal thread releases it
 * linger_ms from now or when the window closes, unless the thread takes it
 * back first; now: the current time (µs). Returns 1 when parked.
 */
static int park_hold(struct lock_hold *h, int64_t now)
{
	struct lease *l = &h->lease;

	if (h->foreign || !lingers(l->spec))
		return 0;
	if (now >= l->reuse_until_us ||
	    renew_park(l, min64(now + l->spec->linger_ms * 1000, l->reuse_until_us)) != 0)
		return 0;
	h->parked = 1;
	LOG(LOG_DEBUG, "kept %.*s for the next call", (int)l->klen, l->key);
	return 1;
}

/*
 * Stops renewing h and releases it on the thread's connection
 * (renew_release; idle: the thread is not about to call again; more:
 * another release follows at once, written with it). Never sent for a
 * hold inherited through fork.
 */
static void release_hold_more(struct lock_thread *t, struct lock_hold *h, int idle, int more)
{
	renew_untrack(&h->lease);
	if (!h->foreign)
		renew_release(&t->conn, &h->lease, idle, more, h->lease.spec->symbol);
}

static void release_hold(struct lock_thread *t, struct lock_hold *h, int idle)
{
	release_hold_more(t, h, idle, 0);
}

/*
 * Leaves each hold of call (the last first): one whose count drops to 0 is
 * parked for the thread's next call, or released; failed: the call never
 * ran (a key of a lock of several could not be taken), so nothing is kept
 * and a queued waiter gets each key at once. The releases go out in one
 * write. Observes the call's hold time once (from its earliest key).
 * Empties call.
 */
static void leave_holds(struct lock_thread *t, struct lock_call *call, int failed)
{
	struct lock_hold *ended = NULL, *out[CONF_KEYS_MAX];
	int64_t now = 0;
	int nout = 0;

	for (int i = call->n - 1; i >= 0; i--) {
		struct lock_hold *h = call->hold[i];

		if (--h->count > 0)
			continue;
		if (!now)
			now = util_now_us();
		if (!ended || h->entered_us < ended->entered_us)
			ended = h;
		if (failed || !park_hold(h, now))
			out[nout++] = h;
	}
	for (int i = 0; i < nout; i++)
		release_hold_more(t, out[i], failed, i + 1 < nout);
	call->n = 0;
	if (ended && !failed)
		count_observe(ended->lease.spec, -1, MH_HOLD, now - ended->entered_us);
	trim_holds(t);
}

void lock_release(struct lock_call *call)
{
	struct lock_thread *t = self;

	if (!t || !call->n)
		return;
	t->top = call->up;
	leave_holds(t, call, 0);
}

void lock_unwind_to(uintptr_t sp)
{
	struct lock_thread *t = self;

	while (t && t->top && (uintptr_t)t->top < sp)
		lock_release(t->top);
}

void lock_atfork_child(void)
{
	struct lock_thread *t = self;

	lock_pid = getpid();
	owner_atfork_child();
	if (!t)
		return;
	t->suffix_len = 0; /* the child's identity, made on its first token */
	t->seed[0] = util_mix64(t->seed[0] ^ (uint64_t)lock_pid); /* the child's own tokens */
	for (int i = 0; i < t->nholds; i++) {
		t->holds[i].foreign = 1;
		t->holds[i].parked = 0; /* the parent's; its renewal thread releases it */
	}
	while (t->nholds > 0 && t->holds[t->nholds - 1].count == 0)
		t->nholds--;
	if (t->conn) {
		backend->ops->close(t->conn);
		t->conn = NULL;
	}
}

void lock_flush(void)
{
	struct lock_thread *t = self;

	if (t)
		renew_flush(&t->conn, "flush");
}

/* Whether the caller is the process this state belongs to, not a child
 * sharing its memory (vfork, clone with CLONE_VM) that must not touch it. */
static int own_process(void)
{
	return getpid() == lock_pid;
}

/* Runs fn on the calling thread's connection (a short-lived one when the
 * thread's state cannot be made). */
static void with_thread_conn(void (*fn)(struct backend_conn **c))
{
	struct lock_thread *t = thread_get();
	struct backend_conn *tmp = NULL;

	fn(t ? &t->conn : &tmp);
	if (tmp)
		backend->ops->close(tmp);
}

void lock_before_exec(void)
{
	if (own_process())
		with_thread_conn(renew_before_exec);
}

void lock_release_all(void)
{
	if (own_process())
		with_thread_conn(renew_exit);
}

long long lock_fence(const struct lock_call *call)
{
	long long fence = 0;

	for (int i = 0; i < call->n; i++)
		if (call->hold[i]->lease.fence > fence)
			fence = call->hold[i]->lease.fence;
	return fence;
}

int lock_thread_holds(void)
{
	return self ? self->nholds : 0;
}
