/* SPDX-License-Identifier: MIT */
/*
 * zookeeper.c - the zookeeper backend, a module (liblockshim-zookeeper.so)
 * on libzookeeper-mt2: ZooKeeper's lock recipe without herd. A lock is an
 * EPHEMERAL|SEQUENCE znode <root>/<key's name>/lock-<mark>-N (keyname.h;
 * the mark is its create's own, so a create whose reply was lost is found
 * and deleted) holding the lock value; the lowest holds, a waiter watches
 * only its predecessor (FIFO). Holder sets (set_look): the mark ends with
 * the mode; a reader waits only for writers below it, a permit for fewer
 * than limit below it. The fence is the czxid. One session per process
 * is the lease, one handle at a time (the library's handles share static
 * buffers); its expiry loses every lock, reported at once (lost_all), and
 * so does a disconnection that outlasts it (cut_timer, log_break).
 * Requests are asynchronous, each bounded by command_timeout_ms. Metrics:
 * a persistent znode per host under <root>/.metrics (count_once).
 */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <zookeeper.h>

#include "backend.h"
#include "backend_module.h"
#include "backend_zookeeper_conf.h"
#include "keyname.h"

#define ZK_TOKEN 32          /* the token prefix of a lock value (owner.h) */
#define ZK_PATH_MAX 800      /* root (512), "/", KEYNAME_SIZE, "/", ZK_NAME_MAX */
#define ZK_PREFIX "lock-"
/* a lock znode's name: "lock-", its mark (token "x" attempt, then "r" for a
 * shared holder or "p<limit>" for a permit: set_mark), "-", 10 digits */
#define ZK_MARK_MAX (ZK_TOKEN + 1 + 8 + 6)
#define ZK_NAME_MAX (sizeof(ZK_PREFIX) + ZK_MARK_MAX + 1 + 10 + 1)

struct backend_config {
	const struct zookeeper_spec *spec;
};

/* The completions of one request, or of two sent at once (a create and
 * the listing of its siblings), waited for by its connection's thread. A
 * request given up at its deadline leaves its slot to its completions,
 * the last of which frees it (abandoned). */
struct zk_call {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int left;                 /* completions still to come */
	int done, abandoned, rc;  /* rc: the last completion's */
	int crc;                  /* create: its result */
	zhandle_t *zh;            /* create: its session (to undo it if given up), */
	char dir[ZK_PATH_MAX];    /* ... its parent ... */
	char mark[ZK_MARK_MAX + 1]; /* ... and its name's mark, its alone */
	long long czxid;          /* create: the new znode's */
	char path[ZK_PATH_MAX];   /* create: the new znode's path */
	long long seq;            /* children: ours (in) ... */
	int mine, lower, higher;  /* ... present; how many sequences are below it,
				   * and above it */
	char pred[ZK_NAME_MAX];   /* ... and the highest of them (the predecessor) */
	char *data;               /* get: the znode's data (malloc'd, the slot's) ... */
	int dlen, version;        /* ... its length and the znode's version */
	char first[ZK_NAME_MAX];  /* ... the lowest of them (the key's first holder) */
	long long firstseq;       /* ... its sequence (-1: none below ours) */
	int set;                  /* a holder set's listing: set_tally counts too */
	int lowerx;               /* ... the exclusive znodes below ours (not shared) */
	char predx[ZK_NAME_MAX];  /* ... and the highest of them */
};

/* A znode this process made: queued, or holding when lowest; in
 * sess.holds (by token and key) until its delete is answered, then in
 * sess.spare for reuse (never freed: a completion may still point at it).
 * Its fields are set before it is linked; releasing and retried change
 * under sess.mu. */
struct zk_hold {
	struct zk_hold *next;
	size_t tlen;
	char tok[ZK_TOKEN];
	unsigned gen;             /* the session it was made in (sess.gen) */
	zhandle_t *zh;            /* ... that session's handle */
	int releasing;            /* its delete sent: no longer found */
	int retried;              /* its delete sent again after a connection loss */
	long long until;          /* its waiter's deadline (monotonic ms; 0: none) */
	long long seq, czxid;
	char path[ZK_PATH_MAX];
};

struct backend_conn {
	const struct backend_config *bc;
	struct zk_call *call;
	char dir[ZK_PATH_MAX];    /* the last key's parent znode */
	char watched[ZK_PATH_MAX + ZK_NAME_MAX]; /* the predecessor zk_look watches */
	char err[256];
};

static const struct backend_module_host *host;

/* The last watch events, by number: a waiter looks again only when one of
 * them is its predecessor's or the session's (path ""). */
#define ZK_FIRED 16

/* The process's session, and the wake-ups of its watches: every watch
 * event (a predecessor deleted, a session state change) bumps wake, is
 * kept in fired[wake % ZK_FIRED] and broadcasts cv; waiters compare. */
static struct {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	zhandle_t *zh;
	pid_t pid;
	unsigned gen;             /* bumped at every new session */
	unsigned long wake;
	char fired[ZK_FIRED][ZK_PATH_MAX + ZK_NAME_MAX];
	int expired;
	int losing;               /* lost_all running for the ended session */
	int busy;                 /* a thread makes or closes the handle: others wait */
	int up;                   /* connected (ZOO_CONNECTED_STATE seen) */
	int cut;                  /* disconnected after being up: cut_timer runs ... */
	long long cut_until;      /* ... until this moment (monotonic ms) ... */
	int cut_ms;               /* ... the negotiated timeout it counts */
	int timer;                /* cut_timer's thread is alive */
	int pending;              /* asynchronous deletes not answered yet */
	struct zk_hold *holds;    /* the process's znodes: a thread's connection */
	struct zk_hold *spare;    /* ... can be closed (an error) while they live */
} sess = { .mu = PTHREAD_MUTEX_INITIALIZER };
static pthread_once_t sess_once = PTHREAD_ONCE_INIT;

static void zk_bind(const struct backend_module_host *h)
{
	host = h;
}

/* Formats one warn line into the core's log. */
static void warn(const char *fmt, ...)
{
	char buf[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	if (host && host->warn)
		host->warn(buf);
}

/* Returns the monotonic clock in ms. */
static long long now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void cond_init_mono(pthread_cond_t *cv)
{
	pthread_condattr_t a;

	pthread_condattr_init(&a);
	pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
	pthread_cond_init(cv, &a);
	pthread_condattr_destroy(&a);
}

/* Waits on cv (mu held) until deadline (monotonic ms). Returns
 * ETIMEDOUT when it passed, else 0. */
static int cond_wait_until(pthread_cond_t *cv, pthread_mutex_t *mu, long long deadline)
{
	struct timespec ts = { deadline / 1000, (deadline % 1000) * 1000000 };

	return pthread_cond_timedwait(cv, mu, &ts);
}

/* How the live connection broke, by the library's last ERROR line before
 * its disconnection (log_break): its give-up for silence, or another
 * error (a refusal, a reset, an end of stream); 0: no line (logging off).
 * Atomic, not under sess.mu: zookeeper_init2, called under it, may log. */
enum { ZK_BREAK_SILENT = 1, ZK_BREAK_ERROR };
static atomic_int zk_break;

/* The library's log lines go nowhere (they would be the program's
 * stderr); an ERROR line ("...:ZOO_ERROR@function@line: text") is kept
 * as the cause of a break (zk_break): "timed out (exceeded timeout by"
 * is the give-up after 2/3 of the timeout without a reply, anything else
 * an error, kept only when no silence was: the lines of the reconnection
 * that follows at once (a refusal) do not hide the break's silence.
 * Runs in the library's I/O thread. */
static void log_break(const char *msg)
{
	int none = 0;

	if (!strstr(msg, ":ZOO_ERROR@"))
		return;
	if (strstr(msg, " timed out (exceeded timeout by "))
		atomic_store(&zk_break, ZK_BREAK_SILENT);
	else
		atomic_compare_exchange_strong(&zk_break, &none, ZK_BREAK_ERROR);
}

/* ---- the session ---------------------------------------------------------- */

/* In a fork child: the parent's session is not ours (its threads are not
 * here, and closing it would end the parent's): forget it unclosed; the
 * next open makes the child's own. The mutex is made anew rather than
 * held across the fork: the shim's own fork handler, which runs after a
 * prepare handler of ours would, flushes (zk_flush takes it). */
static void sess_child(void)
{
	struct zk_hold **pp = &sess.holds;

	pthread_mutex_init(&sess.mu, NULL);
	cond_init_mono(&sess.cv);
	sess.zh = NULL;
	sess.pending = 0;
	sess.losing = 0;
	sess.busy = 0; /* the parent's thread making or closing is not here */
	sess.up = sess.cut = sess.timer = 0; /* the parent's timer is not here */
	sess.gen++;
	while (*pp) { /* the parent's deletes in flight: not the child's to answer */
		struct zk_hold *h = *pp;

		if (!h->releasing) {
			pp = &h->next; /* its thread finds it stale (gen) */
			continue;
		}
		*pp = h->next;
		h->next = sess.spare;
		sess.spare = h;
	}
}

static void sess_setup(void)
{
	cond_init_mono(&sess.cv);
	pthread_atfork(NULL, NULL, sess_child);
}

/* The lost-lease line's reason, the same for an expiry the server told
 * and one presumed (cut_timer): the warn line before it says which. */
#define ZK_LOST_WHY "was lost (its ZooKeeper session expired)"

/*
 * Reports every lock of the process lost (host->lost_all: on_lost), with
 * every signal blocked in this thread: on_lost "kill" signals the process,
 * and a handler run here could call a guarded function. Called without
 * sess.mu but with sess.losing set: sess_get makes no new session (nor a
 * lock in it) before every lock of the ended one is marked. Not under
 * sess.mu, because renew.c's thread calls zk_release under its own mutex
 * (max_hold_ms's overrun, on_overrun "log"), which takes sess.mu.
 */
static void sess_lost(void)
{
	sigset_t all, old;

	if (!host || !host->lost_all)
		return;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	host->lost_all(ZK_LOST_WHY);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
}

/* Reports the ended session's locks lost (sess_lost), then lets sess_get
 * make a new session (sess.losing cleared). */
static void sess_lost_all(void)
{
	sess_lost();
	pthread_mutex_lock(&sess.mu);
	sess.losing = 0;
	pthread_cond_broadcast(&sess.cv);
	pthread_mutex_unlock(&sess.mu);
}

/* Marks the session ended, its loss to be reported (sess_lost_all).
 * Holds sess.mu. */
static void sess_end_locked(void)
{
	sess.expired = 1;
	sess.losing = 1;
	sess.cut = 0;
}

/*
 * The thread of a disconnection (started by cut_start, detached): sleeps
 * until sess.cut_until unless the session reconnects or ends first (a
 * watch event wakes it); at that moment the ensemble may have expired the
 * session without a word to us, so it is taken as expired: every lock
 * reported lost at once, the session ended (a release sends nothing, the
 * next call makes a new one). It serves whichever session is the
 * process's (cut is cleared by every new one), and clears sess.timer as
 * it leaves, under sess.mu, so a later disconnection starts another.
 */
static void *cut_timer(void *arg)
{
	int fire = 0, ms = 0;

	(void)arg;
	pthread_mutex_lock(&sess.mu);
	while (sess.cut && !sess.expired && sess.pid == getpid()) {
		if (now_ms() >= sess.cut_until) {
			ms = sess.cut_ms;
			sess_end_locked();
			sess.wake++; /* a session event: every waiter looks again */
			sess.fired[sess.wake % ZK_FIRED][0] = '\0';
			pthread_cond_broadcast(&sess.cv);
			fire = 1;
			break;
		}
		cond_wait_until(&sess.cv, &sess.mu, sess.cut_until);
	}
	sess.timer = 0;
	pthread_mutex_unlock(&sess.mu);
	if (fire) {
		warn("ZooKeeper session presumed expired: no member answered for %d ms (its "
		     "negotiated timeout): every lock of this process is lost (a new session is "
		     "made at the next call)", ms);
		sess_lost_all();
	}
	return NULL;
}

/*
 * At a disconnection of the live session zh (ZOO_CONNECTING_STATE after
 * ZOO_CONNECTED_STATE): arms the deadline of its presumed expiry, its
 * negotiated timeout T after its last reply, the earliest moment the
 * ensemble may expire it (it counts T from when it last heard from us).
 * That reply's time is the library's (private), so it is bounded by what
 * broke the connection (zk_break): given up for silence, the library's
 * 2/3 T without a reply, it came 2/3 T ago (deadline now + T/3); broken
 * by an error (a member killed: a reset, a refusal), it came at most
 * T/3 before (the library pings after T/3 without sending, answered at
 * once), so the deadline is now + 2/3 T. A cause not told (the library's
 * logging turned off) counts as silence: early rather than late. Starts
 * cut_timer when it is not running, with every signal blocked. Holds
 * sess.mu. Returns 0, or -1 when no thread could be made.
 */
static int cut_start(zhandle_t *zh)
{
	int t = zoo_recv_timeout(zh), rc = 0;
	sigset_t all, old;
	pthread_attr_t a;
	pthread_t tid;

	sess.cut = 1;
	sess.cut_ms = t;
	sess.cut_until = now_ms() + t - (atomic_exchange(&zk_break, 0) == ZK_BREAK_ERROR ?
					 t / 3 : t * 2 / 3);
	if (sess.timer)
		return 0; /* still alive: it reads the new deadline */
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	pthread_attr_init(&a);
	pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
	if (pthread_create(&tid, &a, cut_timer, NULL) == 0)
		sess.timer = 1;
	else
		rc = -1;
	pthread_attr_destroy(&a);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	return rc;
}

/* The session's watcher and every path watch: wakes every waiter; an
 * expiry is said once, and its locks reported lost (sess_lost); a
 * disconnection of the live session arms its presumed expiry (cut_start),
 * a reconnection disarms it. Runs in the library's completion thread. */
static void sess_watch(zhandle_t *zh, int type, int state, const char *path, void *ctx)
{
	int said = 0, nothread = 0;

	(void)ctx;
	pthread_mutex_lock(&sess.mu);
	if (zh == sess.zh && state == ZOO_EXPIRED_SESSION_STATE && !sess.expired) {
		sess_end_locked();
		said = 1;
	}
	if (zh == sess.zh && type == ZOO_SESSION_EVENT && !sess.expired) {
		if (state == ZOO_CONNECTED_STATE) {
			sess.up = 1;
			sess.cut = 0;
			atomic_store(&zk_break, 0); /* a line of the connecting is no break's */
		} else if (state == ZOO_CONNECTING_STATE && sess.up) {
			sess.up = 0;
			nothread = cut_start(zh) < 0;
		}
	}
	sess.wake++;
	snprintf(sess.fired[sess.wake % ZK_FIRED], sizeof(sess.fired[0]), "%s",
		 type == ZOO_SESSION_EVENT || !path ? "" : path);
	pthread_cond_broadcast(&sess.cv);
	pthread_mutex_unlock(&sess.mu);
	if (nothread)
		warn("ZooKeeper session disconnected, and no thread to time it: its locks are "
		     "reported lost only if a member says it expired");
	if (said) {
		sess_lost_all();
		warn("ZooKeeper session expired: every lock of this process is lost "
		     "(a new session is made at the next call)");
	}
}

/* Returns 1 when a watch event after seen (up to sess.wake) may concern
 * the waiter watching watched: its path, the session's, or too many to
 * tell; else 0. Holds sess.mu. */
static int fired_for(unsigned long seen, const char *watched)
{
	if (sess.wake - seen >= ZK_FIRED)
		return 1;
	for (unsigned long n = seen + 1; n - seen <= sess.wake - seen; n++) {
		const char *p = sess.fired[n % ZK_FIRED];

		if (!p[0] || !strcmp(p, watched))
			return 1;
	}
	return 0;
}

/* Whether a completion's rc leaves its request's outcome unknown: the
 * library failed it with its connection (lost, timed out, or closed on a
 * reply out of order: ZRUNTIMEINCONSISTENCY), not the server answering.
 * Every system error (ZSYSTEMERROR down to ZAPIERROR) comes so. */
static int outcome_unknown(int rc)
{
	return rc < ZOK && rc > ZAPIERROR;
}

/*
 * Closes zh, the process's handle (sess.zh, forgotten here) or the one
 * sess_get could not connect, with sess.busy set: no thread makes another
 * before it is completely closed, because libzookeeper-mt formats its
 * endpoint text in a static buffer (format_endpoint_info) that two
 * handles' I/O threads would race on. Called and returns with sess.mu
 * held, which it releases across zookeeper_close: that joins the
 * library's threads, whose watcher (sess_watch) and completions take it.
 */
static void sess_close_locked(zhandle_t *zh)
{
	if (sess.zh == zh)
		sess.zh = NULL;
	sess.busy = 1;
	pthread_mutex_unlock(&sess.mu);
	zookeeper_close(zh);
	pthread_mutex_lock(&sess.mu);
	sess.busy = 0;
	pthread_cond_broadcast(&sess.cv);
}

/*
 * Returns the process's session, made (or made again after an expiry or a
 * fork) and connected within connect_timeout_ms; with its generation in
 * *gen. NULL with c->err set. An ended session's handle is closed before
 * the next is made (sess_close_locked); while one thread makes or closes
 * (sess.busy), or reports an end (sess.losing), the others wait.
 */
static zhandle_t *sess_get(struct backend_conn *c, unsigned *gen)
{
	const struct zookeeper_spec *z = c->bc->spec;
	long long deadline;
	zhandle_t *zh;

	pthread_once(&sess_once, sess_setup);
	pthread_mutex_lock(&sess.mu);
	for (;;) {
		int ours = sess.pid == getpid();

		if (ours && sess.zh && !sess.expired) {
			zh = sess.zh;
			*gen = sess.gen;
			pthread_mutex_unlock(&sess.mu);
			return zh;
		}
		if (ours && (sess.losing || sess.busy))
			pthread_cond_wait(&sess.cv, &sess.mu);
		else if (ours && sess.zh)
			sess_close_locked(sess.zh);
		else
			break;
	}
	sess.expired = 0;
	sess.up = sess.cut = 0; /* a live cut_timer leaves (it serves the new one) */
	sess.busy = 1;
	zh = zookeeper_init2(z->hosts, sess_watch, z->session_timeout_ms, NULL, NULL,
			     ZOO_NO_LOG_CLIENTENV, log_break);
	if (!zh) {
		sess.busy = 0;
		pthread_cond_broadcast(&sess.cv);
		pthread_mutex_unlock(&sess.mu);
		snprintf(c->err, sizeof(c->err), "cannot start a ZooKeeper session with %s: %s",
			 z->hosts, strerror(errno));
		return NULL;
	}
	/* the library would resolve hosts at every turn of its I/O loop (a
	 * getaddrinfo each time: CPU, and a fork child could inherit glibc's
	 * resolver lock held): only at a connection loss */
	zoo_set_servers_resolution_delay(zh, -1);
	sess.zh = zh;
	sess.pid = getpid();
	sess.gen++;
	deadline = now_ms() + z->connect_timeout_ms;
	while (zoo_state(zh) != ZOO_CONNECTED_STATE && !sess.expired &&
	       cond_wait_until(&sess.cv, &sess.mu, deadline) != ETIMEDOUT)
		;
	sess.busy = 0;
	if (zoo_state(zh) != ZOO_CONNECTED_STATE) {
		sess_close_locked(zh);
		pthread_mutex_unlock(&sess.mu);
		snprintf(c->err, sizeof(c->err), "no ZooKeeper session with %s within %d ms "
			 "(zookeeper.connect_timeout_ms)", z->hosts, z->connect_timeout_ms);
		return NULL;
	}
	*gen = sess.gen;
	pthread_cond_broadcast(&sess.cv);
	pthread_mutex_unlock(&sess.mu);
	return zh;
}

/* ---- requests ------------------------------------------------------------- */

static struct zk_call *call_new(void)
{
	struct zk_call *k = calloc(1, sizeof(*k));

	if (k) {
		pthread_mutex_init(&k->mu, NULL);
		cond_init_mono(&k->cv);
	}
	return k;
}

static void call_free(struct zk_call *k)
{
	free(k->data);
	pthread_mutex_destroy(&k->mu);
	pthread_cond_destroy(&k->cv);
	free(k);
}

/* Returns c's call slot reset for want completions (a new one after a
 * request was given up), or NULL with c->err. */
static struct zk_call *call_begin_n(struct backend_conn *c, int want)
{
	struct zk_call *k = c->call;

	if (!k && !(k = c->call = call_new())) {
		snprintf(c->err, sizeof(c->err), "out of memory");
		return NULL;
	}
	k->left = want;
	k->done = 0;
	k->rc = ZOK;
	k->crc = ZOK;
	k->mine = 0;
	k->lower = 0;
	k->higher = 0;
	k->pred[0] = 0;
	free(k->data);
	k->data = NULL;
	k->dlen = 0;
	k->version = -1;
	k->firstseq = -1;
	k->set = 0;
	k->lowerx = 0;
	k->predx[0] = 0;
	return k;
}

static struct zk_call *call_begin(struct backend_conn *c)
{
	return call_begin_n(c, 1);
}

/* Gives k up to its completions (less gone: those that will never come),
 * the last of which frees it; c gets a new slot at its next request. */
static void call_abandon(struct backend_conn *c, struct zk_call *k, int gone)
{
	int free_now;

	pthread_mutex_lock(&k->mu);
	k->left -= gone;
	k->abandoned = 1;
	free_now = k->left == 0;
	pthread_mutex_unlock(&k->mu);
	c->call = NULL;
	if (free_now)
		call_free(k);
}

/* Ends a request in a completion: 1 when its waiter is still there (fill
 * k, then call_done), 0 when it was given up (k is freed here). */
static int call_take(struct zk_call *k)
{
	pthread_mutex_lock(&k->mu);
	k->left--;
	if (k->abandoned) {
		int last = k->left == 0;

		pthread_mutex_unlock(&k->mu);
		if (last)
			call_free(k);
		return 0;
	}
	return 1;
}

/* Records one completion's result; the last wakes the waiter. */
static void call_done(struct zk_call *k, int rc)
{
	k->rc = rc;
	if (k->left == 0) {
		k->done = 1;
		pthread_cond_signal(&k->cv);
	}
	pthread_mutex_unlock(&k->mu);
}

/*
 * Waits for the request issued on k (issued: the library's return value)
 * until deadline. Returns the request's ZooKeeper result (ZOK...), or
 * ZOPERATIONTIMEOUT with the slot left to the completion (c->call
 * cleared), with c->err said for what.
 */
static int call_wait(struct backend_conn *c, struct zk_call *k, int issued, long long deadline,
		     const char *what)
{
	int rc;

	if (issued != ZOK) {
		snprintf(c->err, sizeof(c->err), "%s: %s", what, zerror(issued));
		return issued;
	}
	pthread_mutex_lock(&k->mu);
	while (!k->done && cond_wait_until(&k->cv, &k->mu, deadline) != ETIMEDOUT)
		;
	if (!k->done) {
		pthread_mutex_unlock(&k->mu);
		call_abandon(c, k, 0);
		snprintf(c->err, sizeof(c->err), "%s: no reply from ZooKeeper within %d ms "
			 "(zookeeper.command_timeout_ms)", what, c->bc->spec->command_timeout_ms);
		return ZOPERATIONTIMEOUT;
	}
	rc = k->rc;
	pthread_mutex_unlock(&k->mu);
	if (rc != ZOK)
		snprintf(c->err, sizeof(c->err), "%s: %s", what, zerror(rc));
	return rc;
}

static long long deadline_of(const struct backend_conn *c)
{
	return now_ms() + c->bc->spec->command_timeout_ms;
}

/* A reply that carries nothing but its result. */
static void done_void(int rc, const void *data)
{
	struct zk_call *k = (struct zk_call *)data;

	if (call_take(k))
		call_done(k, rc);
}

static void done_stat(int rc, const struct Stat *st, const void *data)
{
	struct zk_call *k = (struct zk_call *)data;

	if (!call_take(k))
		return;
	if (rc == ZOK)
		k->version = st ? st->version : -1;
	call_done(k, rc);
}

/* Returns the sequence of a child's name "lock-<mark>-NNNNNNNNNN", or -1. */
static long long child_seq(const char *name)
{
	const char *d = strrchr(name, '-');
	char *end;
	long long v;

	if (!d || strncmp(name, ZK_PREFIX, sizeof(ZK_PREFIX) - 1) != 0)
		return -1;
	v = strtoll(d + 1, &end, 10);
	return *end || end == d + 1 ? -1 : v;
}

static void hold_drop_locked(struct zk_hold *h);

/*
 * An asynchronous release's reply (data: the hold, or NULL for a create
 * given up): one fewer pending (zk_flush waits for none), the hold
 * forgotten; said when the znode was gone. A delete lost with its
 * connection (a leader's death, say) is sent again, once the library has
 * reconnected, for as long as the session lives: otherwise the live
 * session would keep the znode, and the key, for the process's life.
 */
static void done_release(int rc, const void *data)
{
	struct zk_hold *h = (struct zk_hold *)data;
	int gone;

	if (h && outcome_unknown(rc)) {
		pthread_mutex_lock(&sess.mu);
		h->retried = 1;
		pthread_mutex_unlock(&sess.mu);
		if (zoo_adelete(h->zh, h->path, -1, done_release, h) == ZOK)
			return;
	}
	pthread_mutex_lock(&sess.mu);
	gone = rc == ZNONODE && !(h && h->retried); /* a retry's: maybe its first did */
	if (h)
		hold_drop_locked(h);
	sess.pending--;
	pthread_cond_broadcast(&sess.cv);
	pthread_mutex_unlock(&sess.mu);
	if (gone)
		warn("a lock's znode was gone at its release (its session expired: the lock "
		     "was lost while held)");
}

/* A sweep for the znode of a create whose outcome is unknown (its
 * connection was lost before the reply): its parent and its token. */
struct zk_sweep {
	zhandle_t *zh;
	char dir[ZK_PATH_MAX];
	char mark[ZK_MARK_MAX + 3]; /* "-<mark>-", found only in that znode's name */
};

static void sweep_listed(int rc, const struct String_vector *v, const void *data);

/* A sweep's delete: one fewer pending (gone already is fine); lost with
 * its connection, the sweep lists again. Frees w at the end. */
static void done_swept(int rc, const void *data)
{
	struct zk_sweep *w = (struct zk_sweep *)data;

	if (outcome_unknown(rc) &&
	    zoo_aget_children(w->zh, w->dir, 0, sweep_listed, w) == ZOK)
		w = NULL;
	free(w);
	pthread_mutex_lock(&sess.mu);
	sess.pending--;
	pthread_cond_broadcast(&sess.cv);
	pthread_mutex_unlock(&sess.mu);
}

/*
 * The sweep's listing: deletes the child whose name has the mark (counted
 * as a release; w goes with it), else frees w; a listing lost with the
 * connection is sent again (the library sends it once reconnected; a
 * session that ended refuses it, and its znodes went with it).
 */
static void sweep_listed(int rc, const struct String_vector *v, const void *data)
{
	struct zk_sweep *w = (struct zk_sweep *)data;
	char path[ZK_PATH_MAX + 64];

	if (outcome_unknown(rc) &&
	    zoo_aget_children(w->zh, w->dir, 0, sweep_listed, w) == ZOK)
		return;
	for (int i = 0; rc == ZOK && v && i < v->count; i++) {
		if (!strstr(v->data[i], w->mark))
			continue;
		snprintf(path, sizeof(path), "%s/%s", w->dir, v->data[i]);
		pthread_mutex_lock(&sess.mu);
		sess.pending++;
		pthread_mutex_unlock(&sess.mu);
		if (zoo_adelete(w->zh, path, -1, done_swept, w) != ZOK)
			done_swept(ZOK, w);
		return; /* the mark is one znode's */
	}
	free(w);
}

/* Starts a sweep of dir for the znode named with mark (ZooKeeper may
 * have made it: a connection lost after a create was sent). Without it
 * the live session would keep that znode, and the key, forever. */
static void sweep_start(zhandle_t *zh, const char *dir, const char *mark)
{
	struct zk_sweep *w = malloc(sizeof(*w));

	if (!w)
		return;
	w->zh = zh;
	snprintf(w->dir, sizeof(w->dir), "%s", dir);
	snprintf(w->mark, sizeof(w->mark), "-%s-", mark);
	if (zoo_aget_children(zh, w->dir, 0, sweep_listed, w) != ZOK)
		free(w);
}

/* A parent's create: its result only. */
static void done_parent(int rc, const char *path, const struct Stat *st, const void *data)
{
	(void)path;
	(void)st;
	done_void(rc, data);
}

/*
 * A lock znode's create: its path, czxid and sequence (read by the
 * listing sent with it, whose reply comes next). Given up by its waiter
 * (command_timeout_ms) but made: nobody would ever delete it, and the
 * session, alive, would keep it (and the key) forever: it is deleted
 * here, counted as a release.
 */
static void done_create(int rc, const char *path, const struct Stat *st, const void *data)
{
	struct zk_call *k = (struct zk_call *)data;

	pthread_mutex_lock(&k->mu);
	if (k->abandoned) {
		zhandle_t *zh = k->zh;
		int last = --k->left == 0;

		pthread_mutex_unlock(&k->mu);
		if (rc == ZOK && path) {
			pthread_mutex_lock(&sess.mu);
			sess.pending++;
			pthread_mutex_unlock(&sess.mu);
			if (zoo_adelete(zh, path, -1, done_release, NULL) != ZOK)
				done_release(ZOK, NULL);
		} else if (outcome_unknown(rc)) {
			sweep_start(zh, k->dir, k->mark);
		}
		if (last)
			call_free(k);
		return;
	}
	k->left--;
	k->crc = rc;
	if (rc == ZOK && path) {
		snprintf(k->path, sizeof(k->path), "%s", path);
		k->czxid = st ? st->czxid : 0;
		k->seq = child_seq(strrchr(k->path, '/') + 1);
	}
	call_done(k, rc);
}

/* The mode of a lock znode's name (its mark's end, set_mark): *limit (1
 * for an exclusive or a shared holder) and *shared. */
static void name_mode(const char *name, int *limit, int *shared)
{
	const char *d = strrchr(name, '-'), *p = d;

	*limit = 1;
	*shared = 0;
	if (!d || d == name)
		return;
	while (p > name && isdigit((unsigned char)p[-1]))
		p--;
	if (p < d && p > name && p[-1] == 'p') {
		*limit = 0;
		for (; p < d && *limit < 100000; p++)
			*limit = *limit * 10 + (*p - '0');
		*limit = *limit < 1 ? 1 : *limit;
	} else if (d[-1] == 'r') {
		*shared = 1;
	}
}

/* Counts child name (sequence s, below ours) into k: the lowest (the
 * key's first holder, for the limit's check), and for a holder set's
 * listing the exclusive ones and the highest of them (what a shared
 * caller waits for). In the completion thread, k->mu held. */
static void set_tally(struct zk_call *k, const char *name, long long s)
{
	int limit, shared;

	if (k->firstseq < 0 || s < k->firstseq) {
		k->firstseq = s;
		snprintf(k->first, sizeof(k->first), "%s", name);
	}
	if (!k->set)
		return;
	name_mode(name, &limit, &shared);
	if (shared)
		return;
	if (k->lowerx++ == 0 || s > child_seq(k->predx))
		snprintf(k->predx, sizeof(k->predx), "%s", name);
}

/* The children of a lock's parent: is ours there, how many are ahead of
 * it, and which is right ahead. */
static void done_children(int rc, const struct String_vector *v, const void *data)
{
	struct zk_call *k = (struct zk_call *)data;
	long long best = -1;

	if (!call_take(k))
		return;
	for (int i = 0; rc == ZOK && v && i < v->count; i++) {
		long long s = child_seq(v->data[i]);

		if (s == k->seq)
			k->mine = 1;
		else if (s > k->seq)
			k->higher++;
		else if (s >= 0) {
			k->lower++;
			set_tally(k, v->data[i], s);
			if (s > best) {
				best = s;
				snprintf(k->pred, sizeof(k->pred), "%s", v->data[i]);
			}
		}
	}
	call_done(k, rc);
}

/* ---- keys and holds ------------------------------------------------------- */

/* Writes <root>/<name> into c->dir, name being the key's (keyname.h,
 * the rule of backend_local.c's file names). */
static void key_dir(struct backend_conn *c, const struct backend_item *it)
{
	size_t n = (size_t)snprintf(c->dir, sizeof(c->dir), "%s/", c->bc->spec->root);

	keyname_encode(it->key, it->klen, c->dir + n);
}

static size_t token_len(const struct backend_item *it)
{
	return it->vlen < ZK_TOKEN ? it->vlen : ZK_TOKEN;
}

/* Returns the process's hold of it (its token, under its key: c->dir
 * is set to the key's parent) whose delete is not sent, or NULL. Any
 * connection finds it: lock.c closes a thread's connection at an error,
 * and a waiter's znode must not be forgotten with it. */
static struct zk_hold *hold_find(struct backend_conn *c, const struct backend_item *it)
{
	size_t tl = token_len(it), dl;
	struct zk_hold *h;

	key_dir(c, it);
	dl = strlen(c->dir);
	pthread_mutex_lock(&sess.mu);
	for (h = sess.holds; h; h = h->next)
		if (!h->releasing && h->tlen == tl && memcmp(h->tok, it->val, tl) == 0 &&
		    strncmp(h->path, c->dir, dl) == 0 && h->path[dl] == '/')
			break;
	pthread_mutex_unlock(&sess.mu);
	return h;
}

/* Unlinks h from sess.holds into sess.spare. Holds sess.mu. */
static void hold_drop_locked(struct zk_hold *h)
{
	struct zk_hold **pp = &sess.holds;

	while (*pp && *pp != h)
		pp = &(*pp)->next;
	if (*pp)
		*pp = h->next;
	h->next = sess.spare;
	sess.spare = h;
}

static void hold_drop(struct zk_hold *h)
{
	pthread_mutex_lock(&sess.mu);
	hold_drop_locked(h);
	pthread_mutex_unlock(&sess.mu);
}

/* Returns a new hold of it's token for the znode k made (path, czxid,
 * sequence) in session zh (generation gen), linked once filled; a spare
 * one when there is (no allocation once the process has had as many at
 * once), else NULL with c->err. */
static struct zk_hold *hold_add(struct backend_conn *c, const struct backend_item *it,
				const struct zk_call *k, zhandle_t *zh, unsigned gen)
{
	struct zk_hold *h;

	pthread_mutex_lock(&sess.mu);
	if ((h = sess.spare))
		sess.spare = h->next;
	pthread_mutex_unlock(&sess.mu);
	if (!h && !(h = malloc(sizeof(*h)))) {
		snprintf(c->err, sizeof(c->err), "out of memory");
		return NULL;
	}
	h->tlen = token_len(it);
	memcpy(h->tok, it->val, h->tlen);
	snprintf(h->path, sizeof(h->path), "%s", k->path);
	h->gen = gen;
	h->zh = zh;
	h->czxid = k->czxid;
	h->seq = k->seq;
	h->releasing = 0;
	h->retried = 0;
	h->until = 0;
	pthread_mutex_lock(&sess.mu);
	h->next = sess.holds;
	sess.holds = h;
	pthread_mutex_unlock(&sess.mu);
	return h;
}

/* ---- the recipe ----------------------------------------------------------- */

/* Creates the persistent znodes of c->dir's path (each component; one
 * that exists is fine). Returns ZOK or the failure. */
static int make_parents(struct backend_conn *c, zhandle_t *zh)
{
	char path[ZK_PATH_MAX];
	size_t len = strlen(c->dir);

	for (size_t i = 1; i <= len; i++) {
		struct zk_call *k;
		int rc;

		if (i < len && c->dir[i] != '/')
			continue;
		memcpy(path, c->dir, i);
		path[i] = 0;
		if (!(k = call_begin(c)))
			return ZSYSTEMERROR;
		rc = call_wait(c, k, zoo_acreate2(zh, path, NULL, -1, &ZOO_OPEN_ACL_UNSAFE,
						  ZOO_PERSISTENT, done_parent, k),
			       deadline_of(c), "create parent");
		if (rc != ZOK && rc != ZNODEEXISTS)
			return rc;
	}
	return ZOK;
}

/* Appends it's mode to a mark: "r" shared, "p<limit>" a permit; nothing
 * for an exclusive lock of limit 1 (its names are those of step 1). */
static void set_mark(char *mark, const struct backend_item *it)
{
	size_t n = strlen(mark);

	if (it->shared)
		snprintf(mark + n, ZK_MARK_MAX + 1 - n, "r");
	else if (it->limit > 1)
		snprintf(mark + n, ZK_MARK_MAX + 1 - n, "p%d", it->limit);
}

/*
 * Sends the create of <dir>/lock-<mark>-NNNNNNNNNN (EPHEMERAL|SEQUENCE,
 * data: the lock value) and the listing of dir together, on k (2 replies):
 * a session's requests are run and answered in order, so the listing sees
 * the new znode, and the call costs one round trip, not two. Returns the
 * create's result (ZOK: the listing's in k->rc), or the library's refusal.
 */
static int create_and_list(struct backend_conn *c, zhandle_t *zh, struct zk_call *k,
			   const struct backend_item *it)
{
	static atomic_uint attempts;
	char path[ZK_PATH_MAX + ZK_MARK_MAX + 8];
	size_t tl = token_len(it);
	int rc;

	/* a mark in the name, this create's alone (the token and the
	 * process's attempt number): a create whose reply is lost can be
	 * found, and a later create of the same token is never mistaken
	 * for it */
	for (size_t i = 0; i < tl; i++)
		k->mark[i] = isxdigit((unsigned char)it->val[i]) ? it->val[i] : 'x';
	snprintf(k->mark + tl, sizeof(k->mark) - tl, "x%08x", atomic_fetch_add(&attempts, 1));
	set_mark(k->mark, it);
	k->set = backend_item_set(it);
	snprintf(k->dir, sizeof(k->dir), "%s", c->dir);
	snprintf(path, sizeof(path), "%s/" ZK_PREFIX "%s-", c->dir, k->mark);
	k->zh = zh;
	rc = zoo_acreate2(zh, path, it->val, (int)it->vlen, &ZOO_OPEN_ACL_UNSAFE,
			  ZOO_EPHEMERAL_SEQUENTIAL, done_create, k);
	if (rc != ZOK) {
		snprintf(c->err, sizeof(c->err), "create: %s", zerror(rc));
		return rc;
	}
	rc = zoo_aget_children(zh, c->dir, 0, done_children, k);
	if (rc != ZOK) { /* the create's reply may still come: it frees k */
		call_abandon(c, k, 1);
		snprintf(c->err, sizeof(c->err), "children: %s", zerror(rc));
		return rc;
	}
	rc = call_wait(c, k, ZOK, deadline_of(c), "create");
	if (rc == ZOPERATIONTIMEOUT)
		return rc;
	if (outcome_unknown(k->crc))
		sweep_start(zh, k->dir, k->mark);
	if (k->crc != ZOK)
		snprintf(c->err, sizeof(c->err), "create: %s", zerror(k->crc));
	return k->crc;
}

/*
 * Creates it's znode, its parents first when missing, and lists its
 * siblings with it (c->call: k->rc the listing's result, k->mine, k->lower,
 * k->pred). The fencing token is its czxid, not its sequence: a zxid grows
 * across every key and every leader change, while a sequence restarts
 * when an operator deletes a key's parent znode. Returns the new hold, or
 * NULL with c->err.
 */
static struct zk_hold *zk_create(struct backend_conn *c, zhandle_t *zh, unsigned gen,
				 const struct backend_item *it)
{
	struct zk_hold *h;
	struct zk_call *k;
	int rc = ZNONODE;

	for (int tries = 0; rc == ZNONODE && tries < 2; tries++) {
		if (tries && make_parents(c, zh) != ZOK)
			return NULL;
		if (!(k = call_begin_n(c, 2)))
			return NULL;
		k->seq = -1;
		rc = create_and_list(c, zh, k, it);
	}
	if (rc != ZOK)
		return NULL;
	if (!(h = hold_add(c, it, k, zh, gen))) { /* made, but nobody would delete it */
		pthread_mutex_lock(&sess.mu);
		sess.pending++;
		pthread_mutex_unlock(&sess.mu);
		if (zoo_adelete(zh, k->path, -1, done_release, NULL) != ZOK)
			done_release(ZOK, NULL);
	}
	return h;
}

/* Lists h's siblings into c->call: ZOK with k->mine, k->lower and k->pred. */
static int zk_siblings(struct backend_conn *c, zhandle_t *zh, struct zk_hold *h)
{
	struct zk_call *k = call_begin(c);
	char dir[ZK_PATH_MAX];

	if (!k)
		return ZSYSTEMERROR;
	snprintf(dir, sizeof(dir), "%.*s", (int)(strrchr(h->path, '/') - h->path), h->path);
	k->seq = h->seq;
	return call_wait(c, k, zoo_aget_children(zh, dir, 0, done_children, k), deadline_of(c),
			 "children");
}

/* Sets a watch on h's sibling name (into c->watched). Returns ZOK (it
 * existed when set), ZNONODE (gone meanwhile: look again), or another
 * failure, said in c->err. */
static int watch_sibling(struct backend_conn *c, zhandle_t *zh, const struct zk_hold *h,
			 const char *name)
{
	snprintf(c->watched, sizeof(c->watched), "%.*s/%s",
		 (int)(strrchr(h->path, '/') - h->path), h->path, name);
	if (!call_begin(c))
		return ZSYSTEMERROR;
	return call_wait(c, c->call, zoo_awexists(zh, c->watched, sess_watch, NULL, done_stat,
						  c->call),
			 deadline_of(c), "watch");
}

/*
 * One look at h's place (listed: its siblings are in c->call already,
 * from zk_create): 1 when it is the lowest (it holds), 0 when a
 * watch is now set on its predecessor (which existed when set), -1 on
 * error (c->err; a znode of ours gone: its session's end).
 */
static int zk_look(struct backend_conn *c, zhandle_t *zh, struct zk_hold *h, int listed)
{
	int rc;

	for (int tries = 0;; listed = 0) {
		if (listed && c->call->rc != ZOK) {
			snprintf(c->err, sizeof(c->err), "children: %s", zerror(c->call->rc));
			return -1;
		}
		if (!listed && zk_siblings(c, zh, h) != ZOK)
			return -1;
		if (!c->call->mine) {
			snprintf(c->err, sizeof(c->err), "the lock's znode %.160s is gone (its "
				 "session ended)", h->path);
			return -1;
		}
		if (c->call->lower == 0)
			return 1;
		if ((rc = watch_sibling(c, zh, h, c->call->pred)) != ZNONODE)
			return rc == ZOK ? 0 : -1;
		if (++tries == 100) /* gone meanwhile: look again */
			return -1;
	}
}

/* ---- holder sets: permits (limit > 1) and shared holders ---------------- */

static int hold_release(struct backend_conn *c, struct zk_hold *h, int async);

/* Lists h's siblings into c->call as a holder set's listing (set_tally),
 * with a watch on the key's children when watch is set (a permit's
 * wait: any create or delete under the key fires it). Returns the
 * listing's result. */
static int set_siblings(struct backend_conn *c, zhandle_t *zh, struct zk_hold *h, int watch)
{
	struct zk_call *k = call_begin(c);
	char dir[ZK_PATH_MAX];
	int issued;

	if (!k)
		return ZSYSTEMERROR;
	snprintf(dir, sizeof(dir), "%.*s", (int)(strrchr(h->path, '/') - h->path), h->path);
	k->seq = h->seq;
	k->set = 1;
	issued = watch ? zoo_awget_children(zh, dir, sess_watch, NULL, done_children, k) :
			 zoo_aget_children(zh, dir, 0, done_children, k);
	return call_wait(c, k, issued, deadline_of(c), "children");
}

/*
 * One look at the place of h, a holder set's znode (listed: its siblings
 * are in c->call already, from zk_create). A shared holder holds when no
 * exclusive znode is below its own (a reader never passes an earlier
 * writer), and otherwise watches the highest of them. A permit of limit
 * N holds when fewer than N znodes are below its own; the first waiter
 * (exactly N below) watches the key's children, its permit coming from
 * any holder's delete; a later waiter watches the waiter right before it
 * (exists: its delete, or its grant, which set_granted writes as a new
 * version of its data; one already granted, version > 0, is looked at
 * again), so a change wakes one waiter, not all. Returns as zk_look.
 */
static int set_look(struct backend_conn *c, zhandle_t *zh, struct zk_hold *h, int listed,
		    const struct backend_item *it)
{
	int limit = it->limit > 1 ? it->limit : 1, watch = 0, rc;

	for (int tries = 0;; listed = 0) {
		if (listed && c->call->rc != ZOK) {
			snprintf(c->err, sizeof(c->err), "children: %s", zerror(c->call->rc));
			return -1;
		}
		if (!listed && set_siblings(c, zh, h, watch) != ZOK)
			return -1;
		if (!c->call->mine) {
			snprintf(c->err, sizeof(c->err), "the lock's znode %.160s is gone (its "
				 "session ended)", h->path);
			return -1;
		}
		if (it->shared ? c->call->lowerx == 0 : c->call->lower < limit)
			return 1;
		if (!it->shared && c->call->lower == limit) {
			if (!watch) { /* the key's children watched by this listing */
				watch = 1;
				continue;
			}
			snprintf(c->watched, sizeof(c->watched), "%.*s",
				 (int)(strrchr(h->path, '/') - h->path), h->path);
			return 0;
		}
		watch = 0;
		rc = watch_sibling(c, zh, h, it->shared ? c->call->predx : c->call->pred);
		if (rc == ZOK && !it->shared && c->call->version > 0)
			rc = ZNONODE; /* granted already: look again */
		if (rc != ZNONODE)
			return rc == ZOK ? 0 : -1;
		if (++tries == 100) /* gone meanwhile: look again */
			return -1;
	}
}

/*
 * At a permit's grant after a wait, or at its first look when a znode
 * above it was listed: writes h's znode's data again (its lock value: a
 * new version), which wakes the waiter right after it, if any, watching
 * it (set_look; a waiter that listed before a holder's delete let h in at
 * h's first look would sleep on it otherwise). Never on the uncontended
 * path. Its failure is not the grant's (a connection lost wakes every
 * waiter anyway).
 */
static void set_granted(struct backend_conn *c, zhandle_t *zh, const struct zk_hold *h,
			const struct backend_item *it)
{
	struct zk_call *k;

	if (!backend_item_set(it) || it->shared || !(k = call_begin(c)))
		return;
	call_wait(c, k, zoo_aset(zh, h->path, it->val, (int)it->vlen, -1, done_stat, k),
		  deadline_of(c), "set");
}

/* One look at h's place (zk_look, or set_look for a holder set). */
static int look(struct backend_conn *c, zhandle_t *zh, struct zk_hold *h, int listed,
		const struct backend_item *it)
{
	return backend_item_set(it) ? set_look(c, zh, h, listed, it) : zk_look(c, zh, h, listed);
}

/*
 * Whether it's limit differs from the key's first holder's (the lowest
 * znode in the listing zk_create made, c->call; a shared or exclusive
 * holder counts as limit 1): BACKEND_MISMATCH with c->err naming both,
 * h's znode deleted (nothing changed); else BACKEND_OK.
 */
static int set_mismatch(struct backend_conn *c, struct zk_hold *h, const struct backend_item *it)
{
	int limit = it->shared || it->limit < 1 ? 1 : it->limit, theirs, shared;

	if (c->call->rc != ZOK || c->call->firstseq < 0)
		return BACKEND_OK;
	name_mode(c->call->first, &theirs, &shared);
	if (theirs == limit)
		return BACKEND_OK;
	hold_release(c, h, 1);
	snprintf(c->err, sizeof(c->err), "limit %d here, %d for the key's holders", limit, theirs);
	return BACKEND_MISMATCH;
}

/* Sends h's delete (any version), answered by done_release, which
 * forgets h. Returns the library's result. */
static int delete_send(struct zk_hold *h)
{
	int rc;

	pthread_mutex_lock(&sess.mu);
	h->releasing = 1;
	sess.pending++;
	pthread_mutex_unlock(&sess.mu);
	rc = zoo_adelete(h->zh, h->path, -1, done_release, h);
	if (rc != ZOK) {
		pthread_mutex_lock(&sess.mu);
		sess.pending--;
		hold_drop_locked(h);
		pthread_mutex_unlock(&sess.mu);
	}
	return rc;
}

/* Deletes the znode of a first try whose look failed (a connection lost
 * with the listing): lock.c gives up after an error without leaving, and
 * the live session would keep it, and the key; forgets h. Its session
 * ended: forgotten only (its znode went with it). */
static void hold_abandon(struct zk_hold *h)
{
	int live;

	pthread_mutex_lock(&sess.mu);
	live = h->zh == sess.zh && h->gen == sess.gen && !sess.expired;
	pthread_mutex_unlock(&sess.mu);
	if (!live)
		hold_drop(h);
	else
		delete_send(h);
}

static int delete_live(struct backend_conn *c, struct zk_hold *h, zhandle_t *zh, int async);

/* Forgets h, made in a session that ended (its znode went with it): said
 * here only when the core could not report it at the expiry. Returns
 * BACKEND_NO. */
static int hold_gone(struct zk_hold *h)
{
	hold_drop(h);
	if (!host || !host->lost_all)
		warn("lock znode %.400s was gone at its release: its session "
		     "expired while it was held (lost)", h->path);
	return BACKEND_NO;
}

/* Deletes h's znode (any version) and forgets h (delete_live), in the
 * process's session (made again if it ended). Returns BACKEND_OK,
 * BACKEND_NO (gone: lost) or BACKEND_ERR. */
static int zk_delete(struct backend_conn *c, struct zk_hold *h, int async)
{
	unsigned gen;
	zhandle_t *zh;

	zh = sess_get(c, &gen);
	if (!zh) {
		hold_drop(h);
		return BACKEND_ERR;
	}
	if (h->gen != gen)
		return hold_gone(h);
	return delete_live(c, h, zh, async);
}

/*
 * Releases h without making a session (renew.c's thread calls it under
 * its own mutex, at max_hold_ms's overrun: sess_get could wait there for
 * a session's end to be reported, which takes that mutex): deleted when
 * its session is the live one, else forgotten (hold_gone). Returns as
 * zk_delete.
 */
static int hold_release(struct backend_conn *c, struct zk_hold *h, int async)
{
	zhandle_t *zh;

	pthread_mutex_lock(&sess.mu);
	zh = h->zh == sess.zh && h->gen == sess.gen && !sess.expired &&
	     sess.pid == getpid() ? h->zh : NULL;
	pthread_mutex_unlock(&sess.mu);
	return zh ? delete_live(c, h, zh, async) : hold_gone(h);
}

/* Deletes h's znode (any version) in live session zh and forgets h;
 * async: the reply is only logged when the znode was gone, and a delete
 * lost with its connection is sent again (done_release). Synchronous: a
 * delete lost so is handed to that asynchronous path (BACKEND_OK: it is
 * the process's to finish). Returns BACKEND_OK, BACKEND_NO (gone: lost)
 * or BACKEND_ERR. */
static int delete_live(struct backend_conn *c, struct zk_hold *h, zhandle_t *zh, int async)
{
	struct zk_call *k;
	int rc;

	if (!async) {
		if (!(k = call_begin(c)))
			return BACKEND_ERR;
		rc = call_wait(c, k, zoo_adelete(zh, h->path, -1, done_void, k), deadline_of(c),
			       "delete");
		if (!outcome_unknown(rc)) {
			hold_drop(h);
			return rc == ZOK ? BACKEND_OK : rc == ZNONODE ? BACKEND_NO : BACKEND_ERR;
		}
		h->retried = 1;
	}
	rc = delete_send(h);
	if (rc != ZOK) {
		snprintf(c->err, sizeof(c->err), "delete: %s", zerror(rc));
		return BACKEND_ERR;
	}
	return BACKEND_OK;
}

/* ---- the operations ------------------------------------------------------- */

static int zk_serves(const void *settings)
{
	(void)settings;
	return 1;
}

static struct backend_config *zk_config_new(const void *settings, char *err, size_t errlen)
{
	struct backend_config *bc = calloc(1, sizeof(*bc));

	if (!bc)
		snprintf(err, errlen, "out of memory");
	else
		bc->spec = settings;
	return bc;
}

static void zk_config_free(struct backend_config *bc)
{
	free(bc);
}

/* Whether the process has a session (live or ended; an acquire makes
 * an ended one again). */
static int sess_made(void)
{
	int made;

	pthread_once(&sess_once, sess_setup);
	pthread_mutex_lock(&sess.mu);
	made = sess.zh && sess.pid == getpid();
	pthread_mutex_unlock(&sess.mu);
	return made;
}

/* A connection is this thread's call slot; the session is the
 * process's, made here the first time (not again after its end: renew.c's
 * thread opens its connection under its own mutex, see hold_release). */
static struct backend_conn *zk_open(const struct backend_config *bc, char *err, size_t errlen)
{
	struct backend_conn *c = calloc(1, sizeof(*c));
	unsigned gen;

	if (!c) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	c->bc = bc;
	if (!sess_made() && !sess_get(c, &gen)) {
		snprintf(err, errlen, "%s", c->err);
		free(c);
		return NULL;
	}
	return c;
}

/* Writes the server the session reached (the library's static text,
 * copied at once), the timeout it negotiated and the root. */
static void zk_describe(const struct backend_config *bc, char *buf, size_t len)
{
	pthread_mutex_lock(&sess.mu);
	if (sess.zh)
		snprintf(buf, len, "%s, session timeout %d ms, root %s",
			 zoo_get_current_server(sess.zh), zoo_recv_timeout(sess.zh),
			 bc->spec->root);
	else
		snprintf(buf, len, "%s, no session", bc->spec->hosts);
	pthread_mutex_unlock(&sess.mu);
}

/* Frees c; its znodes stay, and so do their holds (sess.holds): the
 * thread's next connection finds them. */
static void zk_close(struct backend_conn *c)
{
	if (c->call)
		call_free(c->call);
	free(c);
}

/* Whether h's waiter is past the deadline its last wait was given: lock.c
 * gives up after this try, and after an error on the way (a connection
 * lost) it forgets rather than leaves, which does nothing for a leaseless
 * backend: the znode would stay with the live session, and the key. */
static int wait_over(const struct zk_hold *h)
{
	return h->until && now_ms() >= h->until;
}

/*
 * Takes the lock: creates its znode (or uses the one this token has) and
 * looks at its place. Lowest: BACKEND_OK with the czxid as fence. Not:
 * a first try (not waiting) deletes its znode again and says
 * BACKEND_NOT_QUEUED; a waiter keeps it, with a watch on its predecessor,
 * and waits in zk_wait, unless its deadline has passed (wait_over: the
 * znode is deleted). The holder's value is not fetched (length 0).
 */
static int zk_acquire(struct backend_conn *c, const struct backend_item *it, long long *wait_ms,
		      char *holder, size_t *holder_len, long long *fence)
{
	struct zk_hold *h;
	unsigned gen;
	zhandle_t *zh;
	int r, listed = 0;

	*fence = 0;
	*holder_len = 0;
	(void)holder;
	if (!(zh = sess_get(c, &gen)))
		return BACKEND_ERR;
	if ((h = hold_find(c, it)) && h->gen != gen) {
		hold_drop(h);
		h = NULL;
	}
	if (!h) {
		if (!(h = zk_create(c, zh, gen, it)))
			return BACKEND_ERR;
		listed = 1;
		if ((r = set_mismatch(c, h, it)) != BACKEND_OK)
			return r;
	}
	if ((r = look(c, zh, h, listed, it)) < 0) {
		if (!it->waiting || wait_over(h))
			hold_abandon(h);
		return BACKEND_ERR;
	}
	if (r == 1) {
		/* a waiter's earlier znode; or one created before another's that
		 * may watch it already, seen by this first listing */
		if (!listed || c->call->higher)
			set_granted(c, zh, h, it);
		*fence = h->czxid;
		return BACKEND_OK;
	}
	if (!it->waiting) {
		*wait_ms = BACKEND_NOT_QUEUED;
		return zk_delete(c, h, 1) == BACKEND_ERR ? BACKEND_ERR : BACKEND_NO;
	}
	*wait_ms = LLONG_MAX / 4;
	if (wait_over(h))
		hold_abandon(h);
	return BACKEND_NO;
}

/* Deletes it's znode: BACKEND_OK, or BACKEND_NO when this connection has
 * none for it or it was gone (lost with its session). */
static int zk_release(struct backend_conn *c, const struct backend_item *it, int async)
{
	struct zk_hold *h = hold_find(c, it);

	return h ? hold_release(c, h, async) : BACKEND_NO;
}

/*
 * Sleeps until a watch fires (the predecessor's deletion, a session
 * event) or timeout_ms passes, and looks again at each wake-up: GRANTED
 * with the fence when its znode is the lowest, NO at the timeout.
 */
static int zk_wait(struct backend_conn *c, const struct backend_item *it,
		   long long timeout_ms, long long *fence)
{
	long long deadline = now_ms() + (timeout_ms > 0 ? timeout_ms : 0);
	struct zk_hold *h = hold_find(c, it);
	unsigned long seen;
	unsigned gen;
	zhandle_t *zh;
	int r;

	*fence = 0;
	if (!h)
		return BACKEND_OK;
	/* lock.c's deadline (timeout_ms: the wait left, for a leaseless
	 * backend), a little early: its last try then deletes the znode */
	h->until = timeout_ms > 0 ? deadline - 2 : 0;
	for (;;) {
		if (!(zh = sess_get(c, &gen)))
			return BACKEND_ERR;
		if (h->gen != gen) {
			hold_drop(h);
			return BACKEND_OK; /* its znode went with the session: again */
		}
		pthread_mutex_lock(&sess.mu);
		seen = sess.wake;
		pthread_mutex_unlock(&sess.mu);
		if ((r = look(c, zh, h, 0, it)) < 0)
			return BACKEND_ERR;
		if (r == 1) {
			set_granted(c, zh, h, it);
			*fence = h->czxid;
			return BACKEND_GRANTED;
		}
		/* asleep until its predecessor's (or the session's) event */
		pthread_mutex_lock(&sess.mu);
		while (!fired_for(seen, c->watched)) {
			seen = sess.wake;
			if (cond_wait_until(&sess.cv, &sess.mu, deadline) == ETIMEDOUT &&
			    !fired_for(seen, c->watched))
				break;
		}
		r = !fired_for(seen, c->watched);
		pthread_mutex_unlock(&sess.mu);
		if (r)
			return BACKEND_NO;
	}
}

/* Leaves the queue: deletes its znode (a grant not used included). */
static int zk_leave(struct backend_conn *c, const struct backend_item *it, int async)
{
	return zk_release(c, it, async) == BACKEND_OK ? BACKEND_OK : BACKEND_NO;
}

/*
 * Closes the handle of a session that ended (its expiry reported), which
 * sess_get would close only when it makes the next session: a release no
 * longer makes one (hold_release), so without this the ended session's
 * threads would outlive it until the next acquire, or the exit. Not under
 * renew.c's mutex: lock.c and renew.c flush outside it.
 */
static void sess_close_ended(void)
{
	pthread_mutex_lock(&sess.mu);
	if (sess.zh && sess.expired && !sess.losing && !sess.busy && sess.pid == getpid())
		sess_close_locked(sess.zh);
	pthread_mutex_unlock(&sess.mu);
}

/*
 * Waits (at most command_timeout_ms) until every asynchronous delete of
 * the process is answered: lock.c flushes at a thread's exit, the
 * process's and an exec, where a delete still queued in the library would
 * be lost and its znode kept until the session expires. Returns
 * BACKEND_OK, or BACKEND_ERR when some are still unanswered.
 */
static int zk_flush(struct backend_conn *c)
{
	long long deadline = deadline_of(c);
	int left;

	sess_close_ended();
	pthread_mutex_lock(&sess.mu);
	while (sess.pending > 0 && cond_wait_until(&sess.cv, &sess.mu, deadline) != ETIMEDOUT)
		;
	left = sess.pending;
	pthread_mutex_unlock(&sess.mu);
	if (left > 0) {
		snprintf(c->err, sizeof(c->err), "%d release(s) not answered within %d ms "
			 "(zookeeper.command_timeout_ms)", left, c->bc->spec->command_timeout_ms);
		return BACKEND_ERR;
	}
	return BACKEND_OK;
}

/* Nothing is left unconfirmed: a delete not answered is the session's. */
static void zk_unconfirmed(struct backend_conn *c,
			   void (*fn)(void *arg, const struct backend_item *it), void *arg)
{
	(void)c;
	(void)fn;
	(void)arg;
}

static const char *zk_errstr(const struct backend_conn *c)
{
	return c->err;
}

/* One round trip: exists of the root. */
static int zk_ping(struct backend_conn *c)
{
	struct zk_call *k;
	unsigned gen;
	zhandle_t *zh;
	int rc;

	if (!(zh = sess_get(c, &gen)) || !(k = call_begin(c)))
		return BACKEND_ERR;
	rc = call_wait(c, k, zoo_aexists(zh, c->bc->spec->root, 0, done_stat, k), deadline_of(c),
		       "ping");
	return rc == ZOK || rc == ZNONODE ? BACKEND_OK : BACKEND_ERR;
}

/* ---- holders, for `lockshim status` --------------------------------------- */

/* One lock znode of a key, as zk_holders reads it. */
struct zk_entry {
	long long seq, czxid;
	int limit, shared;        /* its name's mode (name_mode) */
	int vlen;
	char val[BACKEND_VAL_MAX];
};

static int by_name(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static int by_seq(const void *a, const void *b)
{
	const struct zk_entry *x = a, *y = b;

	return (x->seq > y->seq) - (x->seq < y->seq);
}

/* How many of e[0..n) (sorted by sequence) hold: the first and the shared
 * ones right after a shared first, or the first `limit` of a permit's
 * set (the rule of set_look). */
static int entries_holding(const struct zk_entry *e, int n)
{
	int nh = 1;

	if (e->shared)
		while (nh < n && e[nh].shared)
			nh++;
	else
		nh = e->limit < n ? e->limit : n;
	return nh;
}

/* Reports each holder of e[0..n) (sorted) to fn through h (its key
 * set): the rest are the waiters (in wval, wlen: room for n), given with
 * the first. */
static void entries_report(const struct zk_entry *e, int n, struct backend_holder *h,
			   const char **wval, size_t *wlen,
			   void (*fn)(void *arg, const struct backend_holder *h), void *arg)
{
	int nh = entries_holding(e, n);

	h->wval = wval;
	h->wlen = wlen;
	for (int i = nh; i < n; i++) {
		wval[i - nh] = e[i].val;
		wlen[i - nh] = (size_t)e[i].vlen;
	}
	for (int i = 0; i < nh; i++) {
		h->val = e[i].val;
		h->vlen = (size_t)e[i].vlen;
		h->fence = e[i].czxid;
		h->limit = e[i].limit;
		h->shared = e[i].shared;
		h->in_set = e[i].shared || e[i].limit > 1;
		h->nwaiters = i ? 0 : n - nh;
		fn(arg, h);
	}
}

/* Reports the lock of the key znode dir (its name: the key's) to fn: its
 * lock- children read with their data, the lowest holding, the rest its
 * waiters. Returns ZOK (also when it has none, or they went meanwhile),
 * or the error of a read, said in c->err. */
static int key_holders(struct backend_conn *c, zhandle_t *zh, const char *dir, const char *name,
		       void (*fn)(void *arg, const struct backend_holder *h), void *arg)
{
	struct String_vector kids = { 0, NULL };
	struct backend_holder h = { .fence = -1, .lease_left_ms = -1, .limit = 1 };
	struct zk_entry *e = NULL;
	const char **wval = NULL;
	size_t *wlen = NULL;
	char key[KEYNAME_SIZE], path[ZK_PATH_MAX + ZK_NAME_MAX + 1];
	int rc = zoo_get_children(zh, dir, 0, &kids), n = 0;

	if (rc == ZNONODE || (rc == ZOK && kids.count == 0))
		goto out;
	if (rc != ZOK)
		goto fail;
	e = calloc((size_t)kids.count, sizeof(*e));
	wval = calloc((size_t)kids.count, sizeof(*wval));
	wlen = calloc((size_t)kids.count, sizeof(*wlen));
	if (!e || !wval || !wlen) {
		rc = ZSYSTEMERROR;
		snprintf(c->err, sizeof(c->err), "status: out of memory");
		goto out;
	}
	for (int i = 0; i < kids.count; i++) {
		struct Stat st;

		if (strlen(kids.data[i]) >= ZK_NAME_MAX || (e[n].seq = child_seq(kids.data[i])) < 0)
			continue; /* not a lock znode of ours */
		snprintf(path, sizeof(path), "%.*s/%s", ZK_PATH_MAX - 1, dir, kids.data[i]);
		e[n].vlen = sizeof(e[n].val);
		rc = zoo_get(zh, path, 0, e[n].val, &e[n].vlen, &st);
		if (rc == ZNONODE)
			continue; /* released meanwhile */
		if (rc != ZOK)
			goto fail;
		e[n].czxid = st.czxid;
		name_mode(kids.data[i], &e[n].limit, &e[n].shared);
		e[n].vlen = e[n].vlen < 0 ? 0 : e[n].vlen;
		n++;
	}
	rc = ZOK;
	if (!n)
		goto out;
	qsort(e, (size_t)n, sizeof(*e), by_seq);
	h.key = key;
	h.klen = keyname_decode(name, strlen(name), key);
	entries_report(e, n, &h, wval, wlen, fn, arg);
	goto out;
fail:
	snprintf(c->err, sizeof(c->err), "status: %.200s: %s", dir, zerror(rc));
out:
	free(e);
	free(wval);
	free(wlen);
	deallocate_String_vector(&kids);
	return rc;
}

/* .holders: each key znode under root (in name order) and its lock znodes,
 * read with the library's synchronous calls (bounded by the session's
 * own timeout). Read-only. */
static int zk_holders(struct backend_conn *c,
		      void (*fn)(void *arg, const struct backend_holder *h), void *arg)
{
	const char *root = c->bc->spec->root;
	struct String_vector keys = { 0, NULL };
	char dir[ZK_PATH_MAX];
	unsigned gen;
	zhandle_t *zh = sess_get(c, &gen);
	int rc;

	if (!zh)
		return BACKEND_ERR;
	rc = zoo_get_children(zh, root, 0, &keys);
	if (rc == ZNONODE)
		return BACKEND_OK;
	if (rc != ZOK) {
		snprintf(c->err, sizeof(c->err), "status: %.200s: %s", root, zerror(rc));
		return BACKEND_ERR;
	}
	if (keys.count > 1)
		qsort(keys.data, (size_t)keys.count, sizeof(*keys.data), by_name);
	for (int i = 0; rc == ZOK && i < keys.count; i++) {
		if (strlen(keys.data[i]) >= KEYNAME_SIZE || keys.data[i][0] == '.')
			continue; /* not a key's name (".metrics": the counts) */
		snprintf(dir, sizeof(dir), "%s/%s", root, keys.data[i]);
		rc = key_holders(c, zh, dir, keys.data[i], fn, arg);
	}
	deallocate_String_vector(&keys);
	return rc == ZOK ? BACKEND_OK : BACKEND_ERR;
}

/* ---- metrics: one persistent znode per host, <root>/.metrics/<name> -------- */

#define ZK_METRICS "/.metrics"        /* no key's name starts with "." (keyname.h) */
#define ZK_METRICS_MAGIC "lockshim-metrics 1\n"
/* The most a metrics znode holds: ZooKeeper drops the connection of a
 * request past its jute.maxbuffer (1 MB less a byte by default), so a
 * shipment that would grow the data past this is refused here, with the
 * room left for the request's path and header. */
#define ZK_METRICS_MAX 1000000

/* One field of a metrics znode and its value; name points into the
 * znode's data or into .count's fields. */
struct zk_field {
	const char *name;
	size_t len;
	long long value;
};

/* A metrics znode's data, parsed: its key and its fields (f malloc'd). */
struct zk_counts {
	const char *key;
	size_t klen;
	struct zk_field *f;
	int n, cap;
};

/* Appends a field; returns 0, or -1 out of memory. */
static int counts_add(struct zk_counts *m, const char *name, size_t len, long long value)
{
	if (m->n == m->cap) {
		int cap = m->cap ? m->cap * 2 : 32;
		struct zk_field *f = realloc(m->f, (size_t)cap * sizeof(*f));

		if (!f)
			return -1;
		m->f = f;
		m->cap = cap;
	}
	m->f[m->n++] = (struct zk_field){ name, len, value };
	return 0;
}

/* Reads a decimal number (a '-' first allowed when sign) ended by stop at
 * *p, below end, moving *p past stop. Returns 0, or -1 when malformed. */
static int read_num(const char **p, const char *end, int sign, char stop, long long *v)
{
	const char *s = *p;
	int neg = sign && s < end && *s == '-';
	unsigned long long u = 0;

	s += neg;
	if (s == end || !isdigit((unsigned char)*s))
		return -1;
	while (s < end && isdigit((unsigned char)*s)) {
		if (u > (unsigned long long)LLONG_MAX / 10)
			return -1;
		u = u * 10 + (unsigned long long)(*s++ - '0');
	}
	if (s == end || *s != stop || u > (unsigned long long)LLONG_MAX)
		return -1;
	*v = neg ? -(long long)u : (long long)u;
	*p = s + 1;
	return 0;
}

/*
 * Parses a metrics znode's data d[0..n) into m (its strings point into
 * d; m->f is the caller's to free, also on failure). The format:
 * "lockshim-metrics 1\n", the key as "<klen>\n<key>\n", then one
 * "<flen> <value>\n<field>\n" per field. Returns 0, or -1 when d is not
 * that (or out of memory).
 */
static int counts_parse(const char *d, size_t n, struct zk_counts *m)
{
	const char *p = d, *end = d + n;
	long long len, v;

	if (n < sizeof(ZK_METRICS_MAGIC) - 1 ||
	    memcmp(d, ZK_METRICS_MAGIC, sizeof(ZK_METRICS_MAGIC) - 1) != 0)
		return -1;
	p += sizeof(ZK_METRICS_MAGIC) - 1;
	if (read_num(&p, end, 0, '\n', &len) || len >= end - p || p[len] != '\n')
		return -1;
	m->key = p;
	m->klen = (size_t)len;
	p += len + 1;
	while (p < end) {
		if (read_num(&p, end, 0, ' ', &len) || read_num(&p, end, 1, '\n', &v) ||
		    len >= end - p || p[len] != '\n' || counts_add(m, p, (size_t)len, v))
			return -1;
		p += len + 1;
	}
	return 0;
}

/* Adds deltas[i] to fields[i] of m (a field not there yet is added at
 * 0). Returns 0, or -1 out of memory. */
static int counts_merge(struct zk_counts *m, int n, const char *const *fields,
			const size_t *flens, const long long *deltas)
{
	for (int i = 0; i < n; i++) {
		int j = 0;

		while (j < m->n && !(m->f[j].len == flens[i] &&
				     memcmp(m->f[j].name, fields[i], flens[i]) == 0))
			j++;
		if (j < m->n)
			m->f[j].value += deltas[i];
		else if (counts_add(m, fields[i], flens[i], deltas[i]))
			return -1;
	}
	return 0;
}

/* Writes m in counts_parse's format into a malloc'd *out (the caller
 * frees it). Returns its length, or 0 out of memory. */
static size_t counts_write(const struct zk_counts *m, char **out)
{
	size_t cap = sizeof(ZK_METRICS_MAGIC) + 24 + m->klen, off;

	for (int i = 0; i < m->n; i++)
		cap += m->f[i].len + 48;
	if (!(*out = malloc(cap)))
		return 0;
	off = (size_t)snprintf(*out, cap, ZK_METRICS_MAGIC "%zu\n", m->klen);
	memcpy(*out + off, m->key, m->klen);
	off += m->klen;
	(*out)[off++] = '\n';
	for (int i = 0; i < m->n; i++) {
		off += (size_t)snprintf(*out + off, cap - off, "%zu %lld\n", m->f[i].len,
					m->f[i].value);
		memcpy(*out + off, m->f[i].name, m->f[i].len);
		off += m->f[i].len;
		(*out)[off++] = '\n';
	}
	return off;
}

/* A get's reply: the data copied into the slot (k->data, freed with it
 * or at its next request) and the znode's version. */
static void done_data(int rc, const char *value, int vlen, const struct Stat *st,
		      const void *data)
{
	struct zk_call *k = (struct zk_call *)data;

	if (!call_take(k))
		return;
	if (rc == ZOK) {
		k->version = st ? st->version : -1;
		if (vlen > 0 && value && !(k->data = malloc((size_t)vlen)))
			rc = ZSYSTEMERROR;
		else if (vlen > 0 && value) {
			memcpy(k->data, value, (size_t)vlen);
			k->dlen = vlen;
		}
	}
	call_done(k, rc);
}

/* Gets path's data into c->call (data, dlen, version). Returns the
 * ZooKeeper result (ZNONODE: no such znode), c->err said on failure. */
static int get_data(struct backend_conn *c, zhandle_t *zh, const char *path)
{
	struct zk_call *k = call_begin(c);

	if (!k)
		return ZSYSTEMERROR;
	return call_wait(c, k, zoo_aget(zh, path, 0, done_data, k), deadline_of(c), "get");
}

/* Writes <root>/.metrics into c->dir and <root>/.metrics/<key's name>
 * into path (ZK_PATH_MAX bytes). */
static void metrics_path(struct backend_conn *c, const char *key, size_t klen, char *path)
{
	size_t n = (size_t)snprintf(c->dir, sizeof(c->dir), "%s" ZK_METRICS,
				    c->bc->spec->root);

	memcpy(path, c->dir, n);
	path[n++] = '/';
	keyname_encode(key, klen, path + n);
}

/*
 * One read-modify-write of the metrics znode path: read (with its
 * version), the deltas added, written back at that version (or created
 * when missing). Returns ZOK; ZBADVERSION when another process wrote it
 * meanwhile (or made or deleted it: read again); ZNONODE when its parent
 * is missing; else the failure, said in c->err (ZBADARGUMENTS: data that
 * is not lockshim's counts, or a znode past ZK_METRICS_MAX: left as is).
 */
static int count_once(struct backend_conn *c, zhandle_t *zh, const char *path, const char *key,
		      size_t klen, int n, const char *const *fields, const size_t *flens,
		      const long long *deltas)
{
	struct zk_counts m = { .key = key, .klen = klen };
	struct zk_call *k;
	char *out = NULL;
	size_t len = 0;
	int rc = get_data(c, zh, path), version;

	if (rc != ZOK && rc != ZNONODE)
		return rc;
	/* m's strings point into the get's data, freed by the next request
	 * on the slot: out is written before it */
	version = c->call->version;
	if (rc == ZOK && (counts_parse(c->call->data, (size_t)c->call->dlen, &m) ||
			  m.klen != klen || memcmp(m.key, key, klen) != 0)) {
		snprintf(c->err, sizeof(c->err), "metrics znode %.120s holds no counts of "
			 "lockshim's (left as it is)", path);
		rc = ZBADARGUMENTS;
	} else if (counts_merge(&m, n, fields, flens, deltas) || !(len = counts_write(&m, &out))) {
		snprintf(c->err, sizeof(c->err), "out of memory");
		rc = ZSYSTEMERROR;
	} else if (len > ZK_METRICS_MAX) {
		snprintf(c->err, sizeof(c->err), "metrics znode %.100s would hold %zu bytes, past "
			 "the %d a znode may hold (jute.maxbuffer): counts not kept", path, len,
			 ZK_METRICS_MAX);
		rc = ZBADARGUMENTS;
	} else if (!(k = call_begin(c))) {
		rc = ZSYSTEMERROR;
	} else if (rc == ZNONODE) {
		rc = call_wait(c, k, zoo_acreate2(zh, path, out, (int)len, &ZOO_OPEN_ACL_UNSAFE,
						  ZOO_PERSISTENT, done_parent, k),
			       deadline_of(c), "create metrics");
		rc = rc == ZNODEEXISTS ? ZBADVERSION : rc;
	} else {
		rc = call_wait(c, k, zoo_aset(zh, path, out, (int)len, version, done_stat, k),
			       deadline_of(c), "set metrics");
		rc = rc == ZNONODE ? ZBADVERSION : rc;
	}
	free(m.f);
	free(out);
	return rc;
}

/*
 * .count: adds the deltas to the host's metrics znode (key's), read and
 * written back at the version read, again while another process of the
 * host (same key) wrote it meanwhile, for at most command_timeout_ms:
 * no increment is lost. The parents are made when missing. Returns
 * BACKEND_OK, or BACKEND_ERR with c->err (a write whose reply was lost
 * may have been made: the shim's next shipment then counts it twice).
 */
static int zk_count(struct backend_conn *c, const char *key, size_t klen, int n,
		    const char *const *fields, const size_t *flens, const long long *deltas)
{
	long long deadline = deadline_of(c);
	char path[ZK_PATH_MAX];
	zhandle_t *zh;
	unsigned gen;
	int rc, made = 0;

	if (!(zh = sess_get(c, &gen)))
		return BACKEND_ERR;
	metrics_path(c, key, klen, path);
	for (;;) {
		rc = count_once(c, zh, path, key, klen, n, fields, flens, deltas);
		if (rc == ZOK)
			return BACKEND_OK;
		if (rc == ZNONODE && !made++) {
			if ((rc = make_parents(c, zh)) != ZOK)
				return BACKEND_ERR;
			continue;
		}
		if (rc != ZBADVERSION)
			return BACKEND_ERR;
		if (now_ms() >= deadline) {
			snprintf(c->err, sizeof(c->err), "metrics znode %.120s: still written by "
				 "others after %d ms (zookeeper.command_timeout_ms)", path,
				 c->bc->spec->command_timeout_ms);
			return BACKEND_ERR;
		}
	}
}

/* Whether key (klen bytes) is "<ns>:metrics:{<host>}". */
static int metrics_key_of(const char *ns, const char *key, size_t klen)
{
	static const char mid[] = ":metrics:{";
	size_t nl = strlen(ns);

	return klen > nl + sizeof(mid) && memcmp(key, ns, nl) == 0 &&
	       memcmp(key + nl, mid, sizeof(mid) - 1) == 0 && key[klen - 1] == '}';
}

/* .count_read: every metrics znode under <root>/.metrics (in name order),
 * each field of those of namespace ns to fn. The listing is the library's
 * synchronous call (bounded by the session's own timeout), each znode's
 * data a get. Read-only. */
static int zk_count_read(struct backend_conn *c, const char *ns,
			 void (*fn)(void *arg, const char *key, size_t klen, const char *field,
				    size_t flen, long long value),
			 void *arg)
{
	struct String_vector kids = { 0, NULL };
	char path[ZK_PATH_MAX + KEYNAME_SIZE];
	unsigned gen;
	zhandle_t *zh = sess_get(c, &gen);
	int rc;

	if (!zh)
		return BACKEND_ERR;
	snprintf(c->dir, sizeof(c->dir), "%s" ZK_METRICS, c->bc->spec->root);
	rc = zoo_get_children(zh, c->dir, 0, &kids);
	if (rc == ZNONODE)
		return BACKEND_OK;
	if (rc != ZOK)
		snprintf(c->err, sizeof(c->err), "metrics: %.120s: %s", c->dir, zerror(rc));
	if (kids.count > 1)
		qsort(kids.data, (size_t)kids.count, sizeof(*kids.data), by_name);
	for (int i = 0; rc == ZOK && i < kids.count; i++) {
		struct zk_counts m = { 0 };

		snprintf(path, sizeof(path), "%s/%s", c->dir, kids.data[i]);
		if ((rc = get_data(c, zh, path)) == ZNONODE) {
			rc = ZOK; /* deleted meanwhile */
			continue;
		}
		if (rc == ZOK && counts_parse(c->call->data, (size_t)c->call->dlen, &m)) {
			snprintf(c->err, sizeof(c->err), "metrics znode %.120s holds no counts of "
				 "lockshim's", path);
			rc = ZBADARGUMENTS;
		}
		for (int j = 0; rc == ZOK && j < m.n && metrics_key_of(ns, m.key, m.klen); j++)
			fn(arg, m.key, m.klen, m.f[j].name, m.f[j].len, m.f[j].value);
		free(m.f);
	}
	deallocate_String_vector(&kids);
	return rc == ZOK ? BACKEND_OK : BACKEND_ERR;
}

static const struct backend_ops zk_ops = {
	.name = "zookeeper",
	.leaseless = 1,
	.reports_lost = 1,
	.store = "ZooKeeper",
	.unlock_why = "unlock: not with backend \"zookeeper\": a lock is an ephemeral znode of "
		      "its holder's session, which ZooKeeper deletes when the session ends (a dead "
		      "holder's at its session timeout); stop its holder",
	/* .settings: the core's group (backend_init sets it in its copy) */
	.serves = zk_serves,
	.config_new = zk_config_new,
	.config_free = zk_config_free,
	.open = zk_open,
	.describe = zk_describe,
	.close = zk_close,
	.acquire = zk_acquire,
	.release = zk_release,
	.wait = zk_wait,
	.leave = zk_leave,
	.flush = zk_flush,
	.unconfirmed = zk_unconfirmed,
	.errstr = zk_errstr,
	.ping = zk_ping,
	.holders = zk_holders,
	.count = zk_count,
	.count_read = zk_count_read,
};

__attribute__((visibility("default")))
const struct backend_module lockshim_backend_zookeeper = {
	.abi = BACKEND_MODULE_ABI,
	.ops = &zk_ops,
	.bind = zk_bind,
};
