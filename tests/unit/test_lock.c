/* SPDX-License-Identifier: MIT */
/*
 * Unit tests for lock.c and renew.c against an in-memory fake backend:
 * values, reentrancy, non-reentrant self-exclusion, LIFO holds, timeouts and
 * errors, longjmp unwinding, fork-child ownership, renewal and lease loss,
 * locks kept between calls (linger_ms), and locks of several keys (taken in
 * byte order, once each, released again when one cannot be taken).
 */
#include <errno.h>
#include <signal.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"
#include "conf.h"
#include "lock.h"
#include "renew.h"
#include "log.h"
#include "owner.h"
#include "test.h"
#include "util.h"


/* ---- the fake store ---------------------------------------------------- */

#define SLOTS 16
static struct { char key[KEY_BUF_SIZE]; char val[BACKEND_VAL_MAX]; int used; } store[SLOTS];
static pthread_mutex_t store_mu = PTHREAD_MUTEX_INITIALIZER;
/* Read and written by the renewal thread and the test alike. */
static _Atomic int n_set, n_del, n_renew, n_wait, fail_all, renew_says_lost, grant_on_wait;
struct backend_conn { int dummy; };
static struct backend_conn the_conn;

static int slot_of(const struct backend_item *it)
{
	for (int i = 0; i < SLOTS; i++)
		if (store[i].used && strlen(store[i].key) == it->klen &&
		    memcmp(store[i].key, it->key, it->klen) == 0)
			return i;
	return -1;
}

static struct backend_conn *f_open(const struct backend_config *bc, char *err, size_t n)
{
	(void)bc;
	if (fail_all) {
		snprintf(err, n, "fake: down");
		return NULL;
	}
	return &the_conn;
}
static void f_close(struct backend_conn *c) { (void)c; }
static long long fence_n; /* the store's fencing counter (one for every key) */
static char granted[512]; /* the keys f_acquire set, in order, each followed by ' ' */

static int f_acquire(struct backend_conn *c, const struct backend_item *it, long long *wait,
		     char *holder, size_t *hlen, long long *fence)
{
	int rc = 0, i;

	(void)c;
	*wait = it->waiting ? 1 : -1; /* first: join the queue; then wait 1 ms */
	*hlen = 0;
	*fence = 0;
	if (fail_all)
		return BACKEND_ERR;
	pthread_mutex_lock(&store_mu);
	n_set++;
	if ((i = slot_of(it)) >= 0) {
		*hlen = strlen(store[i].val);
		memcpy(holder, store[i].val, *hlen);
	} else {
		for (int i = 0; i < SLOTS; i++)
			if (!store[i].used) {
				memcpy(store[i].key, it->key, it->klen);
				store[i].key[it->klen] = 0;
				memcpy(store[i].val, it->val, it->vlen);
				store[i].val[it->vlen] = 0;
				store[i].used = 1;
				*fence = ++fence_n;
				rc = BACKEND_OK;
				if (strlen(granted) + it->klen + 2 < sizeof(granted))
					snprintf(granted + strlen(granted), it->klen + 2, "%.*s ",
						 (int)it->klen, it->key);
				break;
			}
	}
	pthread_mutex_unlock(&store_mu);
	return rc;
}
static int f_release(struct backend_conn *c, const struct backend_item *it, int async)
{
	int i, rc = BACKEND_NO;

	(void)c;
	(void)async;
	pthread_mutex_lock(&store_mu);
	n_del++;
	i = slot_of(it);
	if (i >= 0 && strncmp(store[i].val, it->val, it->vlen) == 0) {
		store[i].used = 0;
		rc = BACKEND_OK;
	}
	pthread_mutex_unlock(&store_mu);
	return rc;
}
static int f_renew(struct backend_conn *c, int n, const struct backend_item *items, int *res)
{
	(void)c;
	pthread_mutex_lock(&store_mu);
	for (int k = 0; k < n; k++) {
		int i = slot_of(&items[k]);

		n_renew++;
		res[k] = !renew_says_lost && i >= 0 &&
			 strncmp(store[i].val, items[k].val, items[k].vlen) == 0
			 ? BACKEND_OK : BACKEND_NO;
	}
	pthread_mutex_unlock(&store_mu);
	return BACKEND_OK;
}
static int f_wait(struct backend_conn *c, const struct backend_item *it, long long ms,
		  long long *fence)
{
	int i;

	(void)c;
	n_wait++;
	*fence = 0;
	if (grant_on_wait) { /* a release handed the key over to this waiter */
		pthread_mutex_lock(&store_mu);
		if ((i = slot_of(it)) >= 0) {
			memcpy(store[i].val, it->val, it->vlen);
			store[i].val[it->vlen] = 0;
			*fence = ++fence_n;
		}
		pthread_mutex_unlock(&store_mu);
		return i >= 0 ? BACKEND_GRANTED : BACKEND_NO;
	}
	util_sleep_ms(ms);
	return BACKEND_NO;
}
static int f_leave(struct backend_conn *c, const struct backend_item *it, int async)
{
	(void)c;
	(void)it;
	(void)async;
	return BACKEND_NO;
}
static int f_flush(struct backend_conn *c) { (void)c; return BACKEND_OK; }
static void f_unconfirmed(struct backend_conn *c,
			  void (*fn)(void *arg, const struct backend_item *it), void *arg)
{
	(void)c;
	(void)fn;
	(void)arg;
}
static const char *f_errstr(const struct backend_conn *c) { (void)c; return "fake error"; }
static int f_ping(struct backend_conn *c) { (void)c; return BACKEND_OK; }

static const struct backend_ops fake = {
	.name = "fake", .open = f_open, .close = f_close, .acquire = f_acquire, .release = f_release,
	.wait = f_wait, .leave = f_leave, .flush = f_flush, .unconfirmed = f_unconfirmed,
	.renew = f_renew, .errstr = f_errstr, .ping = f_ping,
};

/* Returns the signal number sigtimedwait() takes from set within ms (sent
 * by this process itself), or -1 when none comes. */
static int sig_within(const sigset_t *set, long ms)
{
	struct timespec ts = { ms / 1000, ms % 1000 * 1000000 };
	siginfo_t si;
	int sig;

	while ((sig = sigtimedwait(set, &si, &ts)) < 0 && errno == EINTR)
		;
	return sig > 0 && si.si_pid == getpid() ? sig : -1;
}

static int stored(const char *key)
{
	struct backend_item it = { .key = key, .klen = strlen(key), .val = "" };
	int i;

	pthread_mutex_lock(&store_mu);
	i = slot_of(&it);
	pthread_mutex_unlock(&store_mu);
	return i;
}

/* ---- helpers ----------------------------------------------------------- */

static struct lock_spec spec(const char *key, int reentrant, long long wait_ms)
{
	struct lock_spec s;
	char err[128];

	memset(&s, 0, sizeof(s));
	s.symbol = (char *)"f";
	s.lease_ms = 30000;
	s.wait_ms = wait_ms;
	s.retry_max_ms = 5;
	s.waiter_ttl_ms = conf_waiter_ttl_ms(&s, 0);
	s.fair = 0;
	s.reentrant = reentrant;
	s.on_lost = HOLD_LOG;
	s.on_overrun = HOLD_LOG;
	if (key_compile(&s.key, "t", key, "f", "h", 0, err, sizeof(err)))
		abort();
	return s;
}

static uint64_t args[ARCH_INT_ARGS] = { 1, 2, 3, 4, 5, 6 };

static void *other_thread_acquire(void *arg)
{
	struct lock_call c;
	long rc = lock_acquire(arg, args, &c);

	if (rc == LOCK_OK)
		lock_release(&c);
	return (void *)rc;
}

/* Waits up to ~2 s for key's presence to become want. */
static int wait_stored(const char *key, int want)
{
	for (int i = 0; i < 400; i++) {
		if ((stored(key) >= 0) == want)
			return 1;
		util_sleep_ms(5);
	}
	return 0;
}

/* linger_ms: a thread keeps a released lock for its next call. */
static void test_parking(void)
{
	struct lock_spec p = spec("p", 1, 0), q = spec("q:{arg1}", 1, 0);
	struct lock_call c1;
	pthread_t th;
	void *rc;

	p.handoff_us = 10000000; /* 10 s: the reuse window */
	p.linger_ms = 10000;
	q.handoff_us = 10000000;
	q.linger_ms = 40;

	test("linger: a released lock stays ours; the next call takes no round trip");
	n_set = n_del = 0;
	test_cond(lock_acquire(&p, args, &c1) == LOCK_OK);
	lock_release(&c1);
	test_cond(stored("t:p") >= 0 && n_del == 0 && lock_thread_holds() == 1);
	test_cond(lock_acquire(&p, args, &c1) == LOCK_OK);
	test_cond(n_set == 1);
	lock_release(&c1);

	test("linger: another thread of the process does not get the kept lock");
	test_cond(pthread_create(&th, NULL, other_thread_acquire, &p) == 0);
	pthread_join(th, &rc);
	test_cond((long)rc == LOCK_TIMEOUT && stored("t:p") >= 0);

	test("linger: exec releases every kept lock first");
	test_cond(stored("t:p") >= 0);
	lock_before_exec();
	test_cond(stored("t:p") < 0);
	n_set = 0;
	test_cond(lock_acquire(&p, args, &c1) == LOCK_OK && n_set == 1); /* taken afresh */
	lock_release(&c1);
	lock_before_exec();
	test_cond(stored("t:p") < 0 && lock_thread_holds() <= 1);

	test("linger: a call that ends after the reuse window releases at once");
	n_del = 0;
	q.handoff_us = 20000; /* 20 ms */
	q.linger_ms = 10000;
	test_cond(lock_acquire(&q, args, &c1) == LOCK_OK);
	util_sleep_ms(30);
	lock_release(&c1);
	test_cond(stored("t:q:2") < 0 && n_del == 1);

	test("linger: the renewal thread releases a lock not called again");
	q.handoff_us = 10000000;
	q.linger_ms = 40;
	test_cond(lock_acquire(&q, args, &c1) == LOCK_OK);
	lock_release(&c1);
	test_cond(stored("t:q:2") >= 0);
	test_cond(wait_stored("t:q:2", 0));
	test_cond(lock_acquire(&q, args, &c1) == LOCK_OK); /* the slot is free again */
	lock_release(&c1);
	test_cond(wait_stored("t:q:2", 0));

	test("linger: fair locks and linger_ms = 0 release at once");
	p.handoff_us = 10000000;
	p.fair = 1;
	test_cond(lock_acquire(&p, args, &c1) == LOCK_OK);
	lock_release(&c1);
	test_cond(stored("t:p") < 0);
	p.fair = 0;
	p.linger_ms = 0;
	test_cond(lock_acquire(&p, args, &c1) == LOCK_OK);
	lock_release(&c1);
	test_cond(stored("t:p") < 0);
	key_tmpl_release(&p.key);
	key_tmpl_release(&q.key);
}

/* renew_on_lost's hook for the test: counts, and keeps the key and why. */
static _Atomic int n_hook;
static char hook_key[64], hook_why[128];

static void on_lost_hook(const struct lease *l, const char *why)
{
	snprintf(hook_key, sizeof(hook_key), "%.*s", (int)l->klen, l->key);
	snprintf(hook_why, sizeof(hook_why), "%s", why);
	n_hook++;
}

int main(void)
{
	struct backend be = { &fake, NULL };
	struct lock_spec a = spec("a", 1, 0), nr = spec("nr", 0, 0), b = spec("b:{arg1}", 1, 0);
	struct lock_call c1, c2, c3;
	char host[256] = "";

	log_threshold = getenv("TL") ? 3 : -1; /* the events below are expected; keep the output clean */
	lock_setup(&be);
	gethostname(host, sizeof(host) - 1);

	test("acquire stores a token with host, pid and tid; release deletes it");
	test_cond(lock_acquire(&a, args, &c1) == LOCK_OK);
	test_cond(stored("t:a") >= 0);
	{
		char want[300];
		const char *v = store[stored("t:a")].val;

		struct owner_info o;
		struct timespec ts;

		snprintf(want, sizeof(want), ":%s:%d:", host, getpid());
		test_cond(strlen(v) > 32 && strstr(v, want) == v + 32);
		clock_gettime(CLOCK_REALTIME, &ts);
		test("the value ends with since_ms (now) and the program (owner_parse)");
		test_cond(owner_parse(v, strlen(v), &o) == 0 && o.pid == getpid() &&
			  strcmp(o.program, "test_lock") == 0 && o.local &&
			  o.since_ms <= ts.tv_sec * 1000LL + ts.tv_nsec / 1000000 &&
			  o.since_ms > ts.tv_sec * 1000LL - 10000);
		test("lock_fence: the fence the backend gave the acquisition");
		test_cond(lock_fence(&c1) == fence_n && fence_n > 0);
	}
	lock_release(&c1);
	test_cond(stored("t:a") < 0 && lock_thread_holds() == 0);
	test_cond(lock_fence(&c1) == 0);

	test("reentrant: one SET, count kept locally, outermost release deletes");
	n_set = n_del = 0;
	test_cond(lock_acquire(&a, args, &c1) == LOCK_OK);
	test_cond(lock_acquire(&a, args, &c2) == LOCK_OK);
	test_cond(n_set == 1 && lock_thread_holds() == 1);
	test_cond(lock_fence(&c2) == lock_fence(&c1) && lock_fence(&c1) == fence_n);
	lock_release(&c2);
	test_cond(stored("t:a") >= 0 && n_del == 0);
	lock_release(&c1);
	test_cond(stored("t:a") < 0 && n_del == 1);

	test("non-reentrant: the same thread is excluded too");
	test_cond(lock_acquire(&nr, args, &c1) == LOCK_OK);
	test_cond(lock_acquire(&nr, args, &c2) == LOCK_TIMEOUT);
	test_cond(c2.n == 0);
	lock_release(&c1);
	test_cond(stored("t:nr") < 0);

	test("keys from arguments; nested holds released innermost first");
	test_cond(lock_acquire(&a, args, &c1) == LOCK_OK);
	test_cond(lock_acquire(&b, args, &c2) == LOCK_OK);
	test_cond(stored("t:b:2") >= 0 && lock_thread_holds() == 2);
	lock_release(&c2);
	test_cond(stored("t:b:2") < 0 && lock_thread_holds() == 1);
	lock_release(&c1);
	test_cond(lock_thread_holds() == 0);

	test("keys: taken in byte order, a key named twice once, each its own hold");
	{
		struct lock_spec m = spec("m:{arg1}", 1, 40);
		struct key_tmpl more[3];
		char err[128];
		uint64_t rev[ARCH_INT_ARGS] = { 1, 9, 10, 9 };
		const char *src[3] = { "m:{arg2}", "m:{arg1}", "m:{arg3}" };

		for (int i = 0; i < 3; i++)
			if (key_compile(&more[i], "t", src[i], "f", "h", 0, err, sizeof(err)))
				abort();
		m.more_keys = more;
		m.nkeys = 4; /* m:9, m:10, m:9, m:9: two distinct keys */
		granted[0] = 0;
		test_cond(lock_acquire(&m, rev, &c1) == LOCK_OK);
		test_cond(!strcmp(granted, "t:m:10 t:m:9 ") && c1.n == 2 &&
			  lock_thread_holds() == 2);
		test_cond(lock_fence(&c1) == fence_n); /* the larger of the two */
		test("keys: a key held already is entered again, the others taken");
		test_cond(lock_acquire(&b, (uint64_t[ARCH_INT_ARGS]){ 0, 5 }, &c2) == LOCK_OK);
		test_cond(lock_thread_holds() == 3);
		lock_release(&c2);
		lock_release(&c1);
		test_cond(stored("t:m:9") < 0 && stored("t:m:10") < 0 && lock_thread_holds() == 0);
		test("keys: one held elsewhere: timeout, the keys taken before it released");
		{
			struct backend_item other = { .key = "t:m:9", .klen = 5, .val = "else",
						      .vlen = 4, .lease_ms = 1000 };
			long long hint;
			char holder[BACKEND_VAL_MAX];
			size_t hlen;
			int64_t t0 = util_now_ms();

			f_acquire(&the_conn, &other, &hint, holder, &hlen, &hint);
			test_cond(lock_acquire(&m, rev, &c1) == LOCK_TIMEOUT && c1.n == 0);
			test_cond(util_now_ms() - t0 >= 40 && util_now_ms() - t0 < 2000);
			test_cond(stored("t:m:10") < 0 && lock_thread_holds() == 0);
			f_release(&the_conn, &other, 0);
		}
		for (int i = 0; i < 3; i++)
			key_tmpl_release(&more[i]);
		key_tmpl_release(&m.key);
	}

	test("held by another owner: timeout after wait_ms");
	{
		struct lock_spec w = spec("a", 1, 60);
		struct backend_item other = { .key = "t:a", .klen = 3, .val = "someone-else",
					      .vlen = 12, .lease_ms = 1000 };
		int64_t t0 = util_now_ms();

		long long hint;
		char holder[BACKEND_VAL_MAX];
		size_t hlen;

		f_acquire(&the_conn, &other, &hint, holder, &hlen, &hint);
		test_cond(lock_acquire(&w, args, &c1) == LOCK_TIMEOUT);
		test_cond(util_now_ms() - t0 >= 60);
		test_cond(n_set > 3 && n_wait > 3); /* waited for wake-ups between tries */
		f_release(&the_conn, &other, 0);
		key_tmpl_release(&w.key);
	}

	test("backend down for the whole wait: error, not timeout");
	fail_all = 1;
	{
		struct lock_spec w = spec("a", 1, 30);

		test_cond(lock_acquire(&w, args, &c1) == LOCK_ERROR);
		key_tmpl_release(&w.key);
	}
	fail_all = 0;

	test("longjmp: calls whose frames lie below the target are released");
	{
		struct lock_call frames[3];

		test_cond(lock_acquire(&a, args, &frames[2]) == LOCK_OK);
		test_cond(lock_acquire(&b, args, &frames[1]) == LOCK_OK);
		test_cond(lock_acquire(&a, args, &frames[0]) == LOCK_OK);
		/* frames[0] and [1] lie below frames[2] in memory: unwind to [2]. */
		lock_unwind_to((uintptr_t)&frames[2]);
		test_cond(stored("t:b:2") < 0 && stored("t:a") >= 0);
		test_cond(lock_thread_holds() == 1);
		lock_release(&frames[2]);
		test_cond(stored("t:a") < 0 && lock_thread_holds() == 0);
	}

	test("fork child: inherited holds are neither reused nor released");
	test_cond(lock_acquire(&a, args, &c1) == LOCK_OK);
	lock_atfork_child(); /* as if this were the child */
	test_cond(lock_acquire(&a, args, &c2) == LOCK_TIMEOUT); /* not reentered */
	lock_release(&c1);
	test_cond(stored("t:a") >= 0); /* the "parent's" key survives */
	store[stored("t:a")].used = 0;
	test_cond(lock_thread_holds() == 0);

	test("renewal: every lease/3, and loss is detected");
	{
		struct lock_spec r = spec("r", 1, 0);
		sigset_t usr1, old;

		/*
		 * on_lost = kill sends kill_signal to the process. The test
		 * blocks it and takes it with sigtimedwait(): a handler would
		 * run only when the kernel (or, under ThreadSanitizer, which
		 * defers signals to the thread's next intercepted call) gets
		 * to it, and a polling loop cannot tell when that is. The
		 * renewal thread blocks every signal, so it stays pending.
		 */
		r.lease_ms = 30;
		r.on_lost = HOLD_KILL; /* observable: on_lost sends kill_signal */
		r.kill_signal = SIGUSR1;
		r.kill_grace_ms = 3600000;
		sigemptyset(&usr1);
		sigaddset(&usr1, SIGUSR1);
		pthread_sigmask(SIG_BLOCK, &usr1, &old);
		n_renew = 0;
		test_cond(lock_acquire(&r, args, &c3) == LOCK_OK);
		for (int i = 0; i < 200 && n_renew < 3; i++)
			util_sleep_ms(5);
		test_cond(n_renew >= 3);
		test_cond(sig_within(&usr1, 0) < 0); /* renewed: nothing sent */
		renew_says_lost = 1;
		test_cond(sig_within(&usr1, 2000) == SIGUSR1); /* the next renewal saw the loss */
		test_cond(sig_within(&usr1, 200) < 0); /* once (20 renewal periods) */
		lock_release(&c3); /* the key is deleted only if still ours */
		renew_says_lost = 0;
		test_cond(stored("t:r") < 0);
		pthread_sigmask(SIG_SETMASK, &old, NULL);
		key_tmpl_release(&r.key);
	}
	test("renew_on_lost: the hook replaces on_lost, once per lost lease");
	{
		struct lock_spec r = spec("o", 1, 0);
		sigset_t usr1, old;

		r.lease_ms = 30;
		r.on_lost = HOLD_KILL; /* would send SIGUSR1 without the hook */
		r.kill_signal = SIGUSR1;
		r.kill_grace_ms = 3600000;
		sigemptyset(&usr1);
		sigaddset(&usr1, SIGUSR1);
		pthread_sigmask(SIG_BLOCK, &usr1, &old);
		renew_on_lost(on_lost_hook);
		n_hook = 0;
		test_cond(lock_acquire(&r, args, &c3) == LOCK_OK);
		renew_says_lost = 1;
		for (int i = 0; i < 400 && !n_hook; i++)
			util_sleep_ms(5);
		test_cond(n_hook == 1 && strcmp(hook_key, "t:o") == 0 &&
			  strstr(hook_why, "lost"));
		test_cond(sig_within(&usr1, 200) < 0 && n_hook == 1); /* no policy, once */
		lock_release(&c3);
		renew_says_lost = 0;
		renew_on_lost(NULL);
		pthread_sigmask(SIG_SETMASK, &old, NULL);
		key_tmpl_release(&r.key);
	}
	test("renewal: a hand-over's short TTL is renewed at a third of it, not of the lease");
	{
		struct lock_spec h = spec("h", 1, 5000);
		struct backend_item other = { .key = "t:h", .klen = 3, .val = "someone-else",
					      .vlen = 12, .lease_ms = 1000 };
		long long hint;
		char holder[BACKEND_VAL_MAX];
		size_t hlen;

		h.lease_ms = 60000; /* a third of the lease: 20 s, past the wait below */
		h.waiter_ttl_ms = 60;
		f_acquire(&the_conn, &other, &hint, holder, &hlen, &hint);
		grant_on_wait = 1;
		n_renew = 0;
		test_cond(lock_acquire(&h, args, &c3) == LOCK_OK);
		test_cond(lock_fence(&c3) == fence_n); /* the hand-over's */
		grant_on_wait = 0;
		for (int i = 0; i < 400 && n_renew < 1; i++)
			util_sleep_ms(5);
		test_cond(n_renew >= 1);
		lock_release(&c3);
		test_cond(stored("t:h") < 0);
		key_tmpl_release(&h.key);
	}
	test_parking();
	key_tmpl_release(&a.key);
	key_tmpl_release(&b.key);
	key_tmpl_release(&nr.key);
	return test_report("lock");
}
