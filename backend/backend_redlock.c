/* SPDX-License-Identifier: MIT */
/*
 * backend_redlock.c - Redlock: one lock over N independent masters (backend.h).
 *
 * DESIGN
 * A connection is one backend_redis connection per master (opened when
 * needed; backend_redis.c owns that struct, never dereferenced here). An
 * acquire writes the same command with the same token to every usable
 * master (the acquire script, or the queue script while waiting), then
 * reads every reply (backend_redis_acquire_send/recv): the lock is held when
 * a quorum (N/2+1) took it and the validity left, lease - elapsed - drift
 * (drift = lease/100 + 2 ms), is positive; otherwise it is released
 * wherever it was taken and the caller gets BACKEND_NO ("busy": lock.c
 * waits and retries). Each master keeps its own fencing counter; the fence
 * of a grant is the largest of the counters of the masters that granted it
 * (each just incremented), and is then written back (asynchronously, ahead
 * of the release on each connection) to those of the quorum whose counter
 * is lower: any later quorum shares one of them, so its fence is larger,
 * as long as no master lost its data (doc/topologies.md).
 * Renewals go to every master the same way; a lease confirmed by less than
 * a quorum is lost. Releases and leaves are written to every master without
 * waiting (backend_redis's asynchronous release).
 *
 * Waiting: every master orders its queue alike, by ticket: the wall-clock
 * time (µs) at which the call first queued (ties by token). A release with
 * waiters always hands the key to the head (no handoff_ms: "due" is each
 * master's own clock), so every master picks the same waiter and a caller
 * that releases and takes again cannot starve it. A grant is only a
 * wake-up: the head still takes the lock by a quorum (a key handed over
 * counts as taken and gets the whole lease). A waiter that took some
 * masters but no quorum gives them back at its ticket (the release script
 * queues it again first), so the key goes to whoever is first, maybe
 * itself, and tries again once after a short random delay, which finds the
 * grants of masters whose release was still on its way. Giving back its
 * home master's key signals itself there: wait() skips that signal, else
 * a waiter that always takes that master loops at once (about once per
 * retry_max_ms instead). A waiter blocks on
 * its signal list at the "home" master, the first one in config order that
 * is not quarantined; with none, it sleeps a capped backoff with jitter.
 *
 * A master that fails (transport error, timeout, error reply) is closed and
 * quarantined for the whole process (atomics in the config: threads share
 * it and a fork child needs no lock): not tried again for 100 ms doubling
 * up to 3 s, with jitter, and then by one connection at a time, so a frozen
 * master costs the command timeout once per period. What it may have run
 * without answering is kept for unconfirmed(); a key left on it whose
 * release failed simply expires with its lease. Operations fail
 * (BACKEND_ERR) only when fewer than a quorum of masters answered.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "backend_redis.h"
#include "log.h"
#include "util.h"

#define QUARANTINE_MIN_US (100 * 1000)
#define QUARANTINE_MAX_US (3000 * 1000)
#define WAIT_BACKOFF_MIN_MS 10  /* wait() with no home master: the first sleep */
#define WAIT_BACKOFF_MAX_MS 200
#define SPLIT_RETRY_MS 20       /* after a split vote: retry within this, at random */
#define ORPHANS_MAX 32
#define NAME_LEN 128
#define MASTERS_MAX 31          /* a quorum of 16 is plenty */

/* One master's health, shared by every connection of the process. */
struct health {
	int64_t until_us; /* quarantined (or being probed) until then; 0: healthy */
	int64_t step_us;  /* the next quarantine's length; 0: the shortest */
};

struct backend_config {
	const struct redis_spec *r;
	int n, quorum;
	struct health *health;
	char (*name)[NAME_LEN]; /* "HOST:PORT" or the socket path */
};

/* A release or leave (or an unanswered acquire) a failed master may have
 * run: handed back by unconfirmed(). */
struct orphan {
	int64_t until_us; /* its lease has passed by then */
	struct backend_copy c;
};

struct redlock_conn {
	const struct backend_config *bc;
	uint64_t rng;
	long long ticket;      /* the waiting call's place in every queue, */
	size_t ticket_vlen;    /* and its token (ticket_val[0..ticket_vlen)) */
	char ticket_val[BACKEND_VAL_MAX];
	int64_t wait_step_ms;  /* wait()'s backoff without a home master */
	int partial;           /* the last busy acquire took some masters */
	unsigned char gave[MASTERS_MAX]; /* and gave master i back at its ticket */
	int norphans;
	struct orphan orphans[ORPHANS_MAX];
	size_t failed_len;     /* the failures of the current operation, */
	char failed[384];      /* "; HOST:PORT: reason" each */
	char errstr[512];
	struct backend_conn *m[]; /* one per master (backend_redis's); NULL: closed */
};

/* The connection of backend.h's operations is a struct redlock_conn. */
#define RC(c) ((struct redlock_conn *)(void *)(c))

static int redlock_serves(const void *settings)
{
	const struct redis_spec *r = settings;

	return r->masters != NULL;
}

static struct backend_config *redlock_config_new(const void *settings, char *err,
						 size_t errlen)
{
	const struct redis_spec *r = settings;
	struct backend_config *bc;

	if (r->nmasters > MASTERS_MAX) {
		snprintf(err, errlen, "redis.masters: %d masters, at most %d are supported",
			 r->nmasters, MASTERS_MAX);
		return NULL;
	}
	bc = calloc(1, sizeof(*bc));
	if (bc) {
		bc->r = r;
		bc->n = r->nmasters;
		bc->quorum = r->nmasters / 2 + 1;
		bc->health = calloc((size_t)r->nmasters, sizeof(*bc->health));
		bc->name = calloc((size_t)r->nmasters, sizeof(*bc->name));
	}
	if (!bc || !bc->health || !bc->name) {
		snprintf(err, errlen, "out of memory");
		if (bc) {
			free(bc->health);
			free(bc->name);
		}
		free(bc);
		return NULL;
	}
	for (int i = 0; i < bc->n; i++) {
		const struct redis_spec *m = &r->masters[i];

		if (m->socket)
			snprintf(bc->name[i], NAME_LEN, "%s", m->socket);
		else
			snprintf(bc->name[i], NAME_LEN, "%s:%d", m->host, m->port);
	}
	return bc;
}

static void redlock_config_free(struct backend_config *bc)
{
	if (!bc)
		return;
	free(bc->health);
	free(bc->name);
	free(bc);
}

static uint64_t rng_next(struct redlock_conn *c)
{
	c->rng ^= c->rng << 13;
	c->rng ^= c->rng >> 7;
	c->rng ^= c->rng << 17;
	return c->rng;
}

/* Returns base plus up to half of it, at random. */
static int64_t jitter(struct redlock_conn *c, int64_t base)
{
	return base + (int64_t)(rng_next(c) % (uint64_t)(base / 2 + 1));
}

/*
 * Whether master i may be used now: 1 when healthy; 2 when its quarantine
 * is over and this caller is the one to probe it (the others keep skipping
 * it for a connect and a command timeout); 0 when quarantined.
 */
static int health_usable(const struct backend_config *bc, int i)
{
	struct health *h = &bc->health[i];
	int64_t until = __atomic_load_n(&h->until_us, __ATOMIC_ACQUIRE), now;
	const struct redis_spec *m = &bc->r->masters[i];

	if (!until)
		return 1;
	now = util_now_us();
	if (now < until)
		return 0;
	return __atomic_compare_exchange_n(&h->until_us, &until,
		now + (m->connect_timeout_ms + m->command_timeout_ms) * 1000LL + QUARANTINE_MIN_US,
		0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE) ? 2 : 0;
}

/* Master i answered: it is healthy again. */
static void health_ok(const struct backend_config *bc, int i)
{
	struct health *h = &bc->health[i];

	if (__atomic_load_n(&h->until_us, __ATOMIC_RELAXED)) {
		__atomic_store_n(&h->step_us, 0, __ATOMIC_RELAXED);
		__atomic_store_n(&h->until_us, 0, __ATOMIC_RELEASE);
		LOG(LOG_INFO, "redlock master %s answers again", bc->name[i]);
	}
}

/* Master i failed: quarantines it for its next step, with jitter, and
 * doubles the step. Returns the quarantine's length (µs). */
static int64_t health_failed(struct redlock_conn *c, int i)
{
	struct health *h = &c->bc->health[i];
	int64_t step = __atomic_load_n(&h->step_us, __ATOMIC_RELAXED), q;

	if (step < QUARANTINE_MIN_US)
		step = QUARANTINE_MIN_US;
	q = jitter(c, step);
	__atomic_store_n(&h->step_us, step * 2 > QUARANTINE_MAX_US ? QUARANTINE_MAX_US : step * 2,
			 __ATOMIC_RELAXED);
	__atomic_store_n(&h->until_us, util_now_us() + q, __ATOMIC_RELEASE);
	return q;
}

/* Keeps key+token of it for unconfirmed(), once (the oldest goes when full). */
static void orphan_add(struct redlock_conn *c, const struct backend_item *it)
{
	struct orphan *o;

	if (it->klen > sizeof(o->c.key) || it->vlen > sizeof(o->c.val))
		return;
	for (int i = 0; i < c->norphans; i++) {
		o = &c->orphans[i];
		if (o->c.klen == it->klen && o->c.vlen == it->vlen &&
		    memcmp(o->c.key, it->key, it->klen) == 0 &&
		    memcmp(o->c.val, it->val, it->vlen) == 0)
			return;
	}
	if (c->norphans == ORPHANS_MAX)
		memmove(c->orphans, c->orphans + 1, sizeof(c->orphans[0]) * --c->norphans);
	o = &c->orphans[c->norphans++];
	o->until_us = util_now_us() + it->lease_ms * 1000;
	backend_copy_set(&o->c, it);
}

static void orphan_cb(void *arg, const struct backend_item *it)
{
	orphan_add(arg, it);
}

/* Starts an operation: no failure noted yet. */
static void op_start(struct redlock_conn *c)
{
	c->failed_len = 0;
	c->failed[0] = 0;
}

/* Notes that master i did not answer this operation, and why. */
static void note(struct redlock_conn *c, int i, const char *why)
{
	if (c->failed_len < sizeof(c->failed))
		c->failed_len += (size_t)snprintf(c->failed + c->failed_len,
						  sizeof(c->failed) - c->failed_len, "; %s: %s",
						  c->bc->name[i], why);
}

/* Closes master i's connection; what it may have run unanswered is kept
 * for unconfirmed(). */
static void drop(struct redlock_conn *c, int i)
{
	if (!c->m[i])
		return;
	backend_redis_unconfirmed(c->m[i], orphan_cb, c);
	backend_redis_close(c->m[i]);
	c->m[i] = NULL;
}

/*
 * Master i failed with why: notes it, keeps unsure (a command it may have
 * run: NULL for none) and its connection's unanswered commands for
 * unconfirmed(), closes it and quarantines it.
 */
static void fail(struct redlock_conn *c, int i, const char *why,
		 const struct backend_item *unsure)
{
	int64_t q;

	note(c, i, why);
	if (unsure)
		orphan_add(c, unsure);
	drop(c, i);
	q = health_failed(c, i);
	LOG(LOG_WARN, "redlock master %s failed, not used for %lld ms: %s", c->bc->name[i],
	    (long long)(q / 1000), why);
}

/* Fails master i with its connection's error text. */
static void fail_conn(struct redlock_conn *c, int i, const struct backend_item *unsure)
{
	char why[192];

	snprintf(why, sizeof(why), "%s", backend_redis_errstr(c->m[i]));
	fail(c, i, why, unsure);
}

/*
 * Returns 1 when master i's connection is open and may be used (opened now
 * if needed), else 0 (noted). A master whose quarantine is over must answer
 * a PING first, so that a master still frozen costs its timeout here,
 * before anything is taken, and not while a lock is held elsewhere.
 */
static int master_up(struct redlock_conn *c, int i)
{
	const struct redis_spec *m = &c->bc->r->masters[i];
	struct redis_endpoint ep = { m->host, m->port, m->socket, m->username, m->password,
				     m->db, m->wait_replicas };
	int usable = health_usable(c->bc, i);
	char err[192];

	if (!usable) {
		drop(c, i); /* another connection found it failing */
		note(c, i, "quarantined after a recent failure");
		return 0;
	}
	if (!c->m[i]) {
		if (!(c->m[i] = backend_redis_connect(m, &ep, err, sizeof(err)))) {
			fail(c, i, err, NULL);
			return 0;
		}
		backend_redis_one_of_many(c->m[i]);
	}
	if (usable == 2) {
		if (backend_redis_ping(c->m[i]) != BACKEND_OK) {
			fail_conn(c, i, NULL);
			return 0;
		}
		health_ok(c->bc, i);
	}
	return 1;
}

/* Ends an operation that answered masters took part in. Returns
 * BACKEND_OK when they are a quorum, else BACKEND_ERR with errstr naming
 * the masters that failed. */
static int op_end(struct redlock_conn *c, int answered, const char *what)
{
	if (answered >= c->bc->quorum)
		return BACKEND_OK;
	snprintf(c->errstr, sizeof(c->errstr), "%s: %d of %d masters answered, %d needed%s",
		 what, answered, c->bc->n, c->bc->quorum, c->failed);
	return BACKEND_ERR;
}

/*
 * Returns it as sent to every master: never fair; a waiter queues at its
 * call's ticket, the wall-clock time at which the call (its token) first
 * queued on this connection.
 */
static struct backend_item item_for(struct redlock_conn *c, const struct backend_item *it)
{
	struct backend_item o = *it;

	o.fair = 0;
	if (!it->waiting)
		return o;
	if (c->ticket_vlen != it->vlen || memcmp(c->ticket_val, it->val, it->vlen) != 0) {
		struct timespec ts;

		clock_gettime(CLOCK_REALTIME, &ts);
		c->ticket = ts.tv_sec * 1000000LL + ts.tv_nsec / 1000;
		memcpy(c->ticket_val, it->val, it->vlen);
		c->ticket_vlen = it->vlen;
	}
	o.ticket = c->ticket;
	return o;
}

/*
 * Returns it as released (or left) on every master: never fair; with
 * waiters the key always goes to the queue head, since "due" is each
 * master's own clock and the masters must agree; no ticket (a holder's
 * release does not queue it again).
 */
static struct backend_item release_item(const struct backend_item *it)
{
	struct backend_item o = *it;

	o.fair = 0;
	o.turn_done = 1;
	o.ticket = 0;
	return o;
}

static void redlock_close(struct backend_conn *conn)
{
	struct redlock_conn *c = RC(conn);
	if (!c)
		return;
	for (int i = 0; i < c->bc->n; i++)
		backend_redis_close(c->m[i]);
	free(c);
}

static struct backend_conn *redlock_open(const struct backend_config *bc, char *err,
					 size_t errlen)
{
	struct redlock_conn *c = backend_calloc(sizeof(*c) + sizeof(c->m[0]) * (size_t)bc->n,
						err, errlen);
	int up = 0;

	if (!c)
		return NULL;
	c->bc = bc;
	if (getrandom(&c->rng, sizeof(c->rng), GRND_NONBLOCK) != sizeof(c->rng))
		c->rng = util_mix64((uint64_t)util_now_us() ^ (uint64_t)(uintptr_t)c);
	c->rng |= 1;
	op_start(c);
	for (int i = 0; i < bc->n; i++)
		up += master_up(c, i);
	if (op_end(c, up, "connect") != BACKEND_OK) {
		snprintf(err, errlen, "%s", c->errstr);
		redlock_close((struct backend_conn *)(void *)c);
		return NULL;
	}
	return (struct backend_conn *)(void *)c;
}

/* Per master, during an acquire. */
enum { M_SKIP, M_SENT, M_TAKEN, M_REFUSED };

/*
 * After an acquire that did not get the lock: how long a wait for a signal
 * may take (acquire's *wait_ms). A quorum refused it and it took nothing,
 * or it took something last time too: the home master's hint (the first
 * that refused), which a release there cuts short. Else (a split vote, a
 * release still on its way to some masters, or one handing it the key
 * there, masters down): a short random delay, so that contenders do not
 * collide again and a grant it was not told of is found at once.
 */
static long long busy_hint(struct redlock_conn *c, const int *st, const long long *hint,
			   int taken, int refused)
{
	int partial = c->partial;

	c->partial = taken > 0;
	if (refused >= c->bc->quorum && (!taken || partial))
		for (int i = 0; i < c->bc->n; i++)
			if (st[i] == M_REFUSED && hint[i] > 0)
				return hint[i];
	return 1 + (long long)(rng_next(c) % SPLIT_RETRY_MS);
}

static int redlock_acquire(struct backend_conn *conn, const struct backend_item *it0,
			   long long *wait_ms, char *holder, size_t *holder_len, long long *fence)
{
	struct redlock_conn *c = RC(conn);
	const struct backend_config *bc = c->bc;
	struct backend_item it = item_for(c, it0), back;
	int st[MASTERS_MAX], taken = 0, refused = 0, mism = 0;
	long long hint[MASTERS_MAX], fences[MASTERS_MAX];
	int64_t t0, left;

	*holder_len = 0;
	*wait_ms = BACKEND_NOT_QUEUED;
	*fence = 0;
	memset(c->gave, 0, sizeof(c->gave));
	op_start(c);
	for (int i = 0; i < bc->n; i++)
		st[i] = master_up(c, i) ? M_SENT : M_SKIP;
	t0 = util_now_us(); /* the validity counts from the first write */
	for (int i = 0; i < bc->n; i++) {
		if (st[i] == M_SKIP)
			continue;
		if (backend_redis_acquire_send(c->m[i], &it) != BACKEND_OK) {
			st[i] = M_SKIP;
			fail_conn(c, i, &it);
		}
	}
	for (int i = 0; i < bc->n; i++) {
		char h[BACKEND_VAL_MAX];
		size_t hl = 0;
		int rc;

		if (st[i] != M_SENT)
			continue;
		hint[i] = 0;
		fences[i] = 0;
		rc = backend_redis_acquire_recv(c->m[i], &it, &hint[i], h, &hl, &fences[i]);
		if (rc == BACKEND_ERR) {
			st[i] = M_SKIP;
			fail_conn(c, i, &it);
			continue;
		}
		health_ok(bc, i);
		if (rc == BACKEND_MISMATCH) { /* holders of another limit: refused */
			snprintf(c->errstr, sizeof(c->errstr), "%s", backend_redis_errstr(c->m[i]));
			mism = 1;
			rc = BACKEND_NO;
		}
		st[i] = rc == BACKEND_OK ? M_TAKEN : M_REFUSED;
		taken += rc == BACKEND_OK;
		refused += rc == BACKEND_NO;
		if (rc == BACKEND_OK && fences[i] > *fence)
			*fence = fences[i];
		if (rc == BACKEND_NO && hl && !*holder_len) {
			memcpy(holder, h, hl);
			*holder_len = hl;
		}
	}
	left = it.lease_ms * 1000 - (util_now_us() - t0) - (it.lease_ms * 10 + 2000);
	if (taken >= bc->quorum && left > 0) {
		/* the queues where it waited in vain: leave them */
		for (int i = 0; it.waiting && i < bc->n; i++)
			if (st[i] == M_REFUSED && backend_redis_leave(c->m[i], &it, 1) == BACKEND_ERR)
				fail_conn(c, i, NULL);
		/* the fence on every master of the quorum, so that any later
		 * quorum, which shares one of them, counts past it */
		for (int i = 0; i < bc->n; i++)
			if (st[i] == M_TAKEN && fences[i] < *fence &&
			    backend_redis_fence_send(c->m[i], &it, *fence) == BACKEND_ERR)
				fail_conn(c, i, NULL);
		return BACKEND_OK;
	}
	*fence = 0;
	if (taken >= bc->quorum)
		LOG(LOG_WARN, "%.*s: taken on %d masters but only after %lld ms of a %lld ms "
		    "lease; released", (int)it.klen, it.key, taken,
		    (long long)(util_now_us() - t0) / 1000, it.lease_ms);
	back = release_item(&it);
	back.ticket = it.ticket; /* a waiter gives back and stays queued */
	for (int i = 0; i < bc->n; i++) {
		if (st[i] != M_TAKEN)
			continue;
		if (backend_redis_release(c->m[i], &back, 1) == BACKEND_ERR)
			fail_conn(c, i, &back);
		else
			c->gave[i] = it.waiting; /* it may have signalled ourselves */
	}
	if (op_end(c, taken + refused, "acquire") != BACKEND_OK)
		return BACKEND_ERR;
	if (mism)
		return BACKEND_MISMATCH;
	if (it.waiting)
		*wait_ms = busy_hint(c, st, hint, taken, refused);
	return BACKEND_NO;
}

/*
 * Runs release or leave (op) on every usable master. async: written without
 * waiting; BACKEND_OK once a quorum has it. Else each reply is read in turn
 * (the rare paths: a dead holder's lock broken, the forget list, `lockshim
 * check`): BACKEND_OK when some master held the token, BACKEND_NO when none.
 */
static int on_all(struct redlock_conn *c, const struct backend_item *it0, int async,
		  int (*op)(struct backend_conn *, const struct backend_item *, int),
		  const char *what)
{
	struct backend_item it = release_item(it0);
	int answered = 0, held = 0;

	op_start(c);
	for (int i = 0; i < c->bc->n; i++) {
		int rc;

		if (!master_up(c, i))
			continue;
		rc = op(c->m[i], &it, async);
		if (rc == BACKEND_ERR) {
			fail_conn(c, i, &it);
			continue;
		}
		if (!async)
			health_ok(c->bc, i);
		answered++;
		held |= rc == BACKEND_OK;
	}
	if (op_end(c, answered, what) != BACKEND_OK)
		return BACKEND_ERR;
	return async || held ? BACKEND_OK : BACKEND_NO;
}

static int redlock_release(struct backend_conn *conn, const struct backend_item *it, int async)
{
	struct redlock_conn *c = RC(conn);
	return on_all(c, it, async, backend_redis_release, "release");
}

static int redlock_leave(struct backend_conn *conn, const struct backend_item *it, int async)
{
	struct redlock_conn *c = RC(conn);
	return on_all(c, it, async, backend_redis_leave, "leave");
}

/*
 * Blocks on its signal list at the home master (the first usable one),
 * where a release wakes the head of the queue. Without one, or when it
 * fails, sleeps a capped backoff with jitter within timeout_ms and returns
 * BACKEND_OK: try again.
 */
static int redlock_wait(struct backend_conn *conn, const struct backend_item *it0,
			long long timeout_ms, long long *fence)
{
	struct redlock_conn *c = RC(conn);
	struct backend_item it = item_for(c, it0);
	int64_t t0 = util_now_ms();
	long long sleep_ms, f;

	*fence = 0; /* never granted: the caller takes it by a quorum */
	op_start(c);
	for (int i = 0; i < c->bc->n; i++) {
		int own = c->gave[i], rc;

		if (!master_up(c, i))
			continue;
		memset(c->gave, 0, sizeof(c->gave));
		rc = backend_redis_wait(c->m[i], &it, timeout_ms, &f);
		if (rc != BACKEND_ERR && rc != BACKEND_NO && own) {
			/* the signal of our own give-back, most likely: the
			 * key there is ours again; wait for another one */
			long long left = timeout_ms - (util_now_ms() - t0);

			if (left <= 0)
				return BACKEND_OK;
			rc = backend_redis_wait(c->m[i], &it, left, &f);
		}
		if (rc != BACKEND_ERR) {
			health_ok(c->bc, i);
			c->wait_step_ms = 0;
			return rc == BACKEND_NO ? BACKEND_NO : BACKEND_OK; /* never granted */
		}
		fail_conn(c, i, NULL);
		break;
	}
	c->wait_step_ms = c->wait_step_ms < WAIT_BACKOFF_MIN_MS ? WAIT_BACKOFF_MIN_MS :
			  c->wait_step_ms * 2 > WAIT_BACKOFF_MAX_MS ? WAIT_BACKOFF_MAX_MS :
			  c->wait_step_ms * 2;
	sleep_ms = jitter(c, c->wait_step_ms / 2 + 1);
	if (sleep_ms > timeout_ms - (util_now_ms() - t0))
		sleep_ms = timeout_ms - (util_now_ms() - t0);
	if (sleep_ms > 0)
		util_sleep_ms(sleep_ms);
	return BACKEND_OK;
}

static int redlock_flush(struct backend_conn *conn)
{
	struct redlock_conn *c = RC(conn);
	int failed = 0;

	op_start(c);
	for (int i = 0; i < c->bc->n; i++) {
		if (c->m[i] && backend_redis_flush(c->m[i]) == BACKEND_ERR) {
			fail_conn(c, i, NULL);
			failed++;
		}
	}
	return op_end(c, c->bc->n - failed, "flush");
}

static void redlock_unconfirmed(struct backend_conn *conn,
				void (*fn)(void *arg, const struct backend_item *it), void *arg)
{
	struct redlock_conn *c = RC(conn);
	int64_t now = util_now_us();

	for (int i = 0; i < c->bc->n; i++)
		if (c->m[i])
			backend_redis_unconfirmed(c->m[i], orphan_cb, c);
	for (int i = 0; i < c->norphans; i++) {
		const struct orphan *o = &c->orphans[i];
		struct backend_item it = backend_copy_item(&o->c);

		if (now < o->until_us)
			fn(arg, &it);
	}
	c->norphans = 0;
}

/* Renews on every usable master; a lease counts as renewed when a quorum
 * confirmed it. */
static int redlock_renew(struct backend_conn *conn, int n, const struct backend_item *items,
			 int *results)
{
	struct redlock_conn *c = RC(conn);
	const struct backend_config *bc = c->bc;
	int sent[MASTERS_MAX], answered = 0, rc;
	int *res = calloc((size_t)n + 1, sizeof(*res)), *count = calloc((size_t)n + 1, sizeof(*count));

	op_start(c);
	if (!res || !count) {
		free(res);
		free(count);
		snprintf(c->errstr, sizeof(c->errstr), "renew: out of memory");
		return BACKEND_ERR;
	}
	for (int i = 0; i < bc->n; i++) {
		sent[i] = master_up(c, i) && backend_redis_renew_send(c->m[i], n, items) == BACKEND_OK;
		if (!sent[i] && c->m[i])
			fail_conn(c, i, NULL);
	}
	for (int i = 0; i < bc->n; i++) {
		if (!sent[i])
			continue;
		if (backend_redis_renew_recv(c->m[i], n, items, res) != BACKEND_OK) {
			fail_conn(c, i, NULL);
			continue;
		}
		health_ok(bc, i);
		answered++;
		for (int k = 0; k < n; k++)
			count[k] += res[k] == BACKEND_OK;
	}
	rc = op_end(c, answered, "renew");
	for (int k = 0; k < n && rc == BACKEND_OK; k++)
		results[k] = count[k] >= bc->quorum ? BACKEND_OK : BACKEND_NO;
	free(res);
	free(count);
	return rc;
}

/*
 * The metrics' increments go to one master: the first usable one in config
 * order (each count lives on exactly one master; `lockshim metrics` sums
 * every master's). A master that fails after the commands were sent is
 * not replaced by the next one (it may have run them): the caller sends
 * them again later.
 */
static int redlock_count(struct backend_conn *conn, const char *key, size_t klen, int n,
			 const char *const *fields, const size_t *flens, const long long *deltas)
{
	struct redlock_conn *c = RC(conn);

	op_start(c);
	for (int i = 0; i < c->bc->n; i++) {
		if (!master_up(c, i))
			continue;
		if (backend_redis_count(c->m[i], key, klen, n, fields, flens, deltas) == BACKEND_OK) {
			health_ok(c->bc, i);
			return BACKEND_OK;
		}
		fail_conn(c, i, NULL);
		break;
	}
	return op_end(c, 0, "count");
}

static const char *redlock_errstr(const struct backend_conn *conn)
{
	const struct redlock_conn *c = (const struct redlock_conn *)(const void *)conn;

	return c->errstr;
}

static int redlock_ping(struct backend_conn *conn)
{
	struct redlock_conn *c = RC(conn);
	int answered = 0;

	op_start(c);
	for (int i = 0; i < c->bc->n; i++) {
		if (!master_up(c, i))
			continue;
		if (backend_redis_ping(c->m[i]) == BACKEND_OK) {
			health_ok(c->bc, i);
			answered++;
		} else {
			fail_conn(c, i, NULL);
		}
	}
	return op_end(c, answered, "PING");
}

/* Writes "N masters (quorum Q): HOST:PORT, ..." into buf. */
static void redlock_describe(const struct backend_config *bc, char *buf, size_t len)
{
	size_t k = (size_t)snprintf(buf, len, "%d masters (quorum %d):", bc->n, bc->quorum);

	for (int i = 0; i < bc->n && k < len; i++)
		k += (size_t)snprintf(buf + k, len - k, "%s %s", i ? "," : "", bc->name[i]);
}

static int redlock_node_count(const struct backend_config *bc)
{
	return bc->n;
}

static struct backend_conn *redlock_node_open(const struct backend_config *bc, int i,
					      char *name, size_t namelen, char *tag,
					      size_t taglen, char *err, size_t errlen)
{
	const struct redis_spec *m = &bc->r->masters[i];
	struct redis_endpoint ep = { m->host, m->port, m->socket, m->username, m->password,
				     m->db, m->wait_replicas };

	snprintf(name, namelen, "%s", bc->name[i]);
	if (taglen)
		tag[0] = 0;
	return backend_redis_connect(m, &ep, err, errlen);
}

const struct backend_ops backend_redlock = {
	.name = "redlock",
	.settings = &backend_redis_settings,
	.serves = redlock_serves,
	.config_new = redlock_config_new,
	.config_free = redlock_config_free,
	.open = redlock_open,
	.describe = redlock_describe,
	.close = redlock_close,
	.acquire = redlock_acquire,
	.release = redlock_release,
	.wait = redlock_wait,
	.leave = redlock_leave,
	.flush = redlock_flush,
	.unconfirmed = redlock_unconfirmed,
	.renew = redlock_renew,
	.errstr = redlock_errstr,
	.ping = redlock_ping,
	.count = redlock_count,
	.node_count = redlock_node_count,
	.node_open = redlock_node_open,
};
