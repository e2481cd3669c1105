/* SPDX-License-Identifier: MIT */
/*
 * postgres.c - the postgres backend, a module (liblockshim-postgres.so) on
 * libpq5: session advisory locks on hashtextextended(key, 0), one session
 * per thread, freed by the server when it ends; shared: the _shared
 * functions; limit N: permits (key, 1..N). Statements: postgres_sql.h. A
 * try takes the lock and the fence in one statement; a wait blocks in the
 * server; a release is async, pipelined. The lease is the session's
 * idle_session_timeout: pg_renew pings holders' sessions, none holding a
 * lock past max_hold_ms (hold_stale). A kept lock (linger_ms) is released
 * on its own session by another thread (release_foreign). Counts: an
 * upsert into lockshim_metrics; status: pg_locks with the names tables
 * (name_send). Commands are bounded by poll; one late closes the session.
 * Parameters are bound, never spliced. A fork child's sockets become
 * /dev/null. One export (postgres.map); of the core, only bind's warn.
 */
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <time.h>
#include <unistd.h>
#include <fcntl.h>

#include <libpq-fe.h>

#include "backend.h"
#include "backend_module.h"
#include "backend_postgres_conf.h"
#include "postgres_sql.h"
#include "util.h"

#define PG_TOKEN 32            /* the token prefix of a lock value (owner.h) */
#define PG_WAIT_MAX_MS 3600000 /* one blocking wait at most (then asked again) */
#define PG_KEYTEXT_MAX (2 * KEY_BUF_SIZE + 3)
#define PG_PENDING_MAX 8       /* async releases in flight on a connection */
#define PG_DEADLOCK_WARN_MS 10000 /* one deadlock line per process in this time */
#define PG_PERMIT_WAIT_MS 200  /* a permit's waiter blocks on one permit this
				* long at most, then tries them all again */

/* lockshim check's ping, and the renewal's outside pipeline mode
 * (keepalive_locked). */
static const char sql_ping[] = "SELECT 1";

struct backend_config {
	const struct postgres_spec *spec;
	char *password;   /* LOCKSHIM_POSTGRES_PASSWORD, else the spec's (not owned) */
	int env_password; /* password is a copy of the variable's (owned) */
	char app[64];     /* application_name: "lockshim:<program>" */
};

/* A key a session has named (name_send): its hash and when (now_ms). */
struct pg_seen {
	uint64_t h;
	long long at_ms;
};

/* A lock this session holds: its token and lease. */
struct pg_hold {
	long long lease_ms;
	long long renewed_ms; /* granted or last renewed (now_ms): hold_stale;
			       * written under conns.mu, read atomically */
	int slot;         /* the permit held (1..limit), 0 exclusive or shared */
	size_t tlen;
	char tok[PG_TOKEN];
};

/* A release of this session's lock that another thread asked for while
 * the owner was using the session (release_foreign): the owner sends it
 * at its next command (due_send). */
struct pg_due {
	struct pg_due *next;
	struct backend_copy c;
};

struct backend_conn {
	struct backend_conn *prev, *next; /* every open connection (conns) */
	/* Taken by every operation of the owning thread, and by the
	 * renewal's ping of this session (pg_renew, from another thread). */
	pthread_mutex_t mu;
	const struct backend_config *bc;
	PGconn *pg;
	pid_t pid;
	long long active_ms;     /* when the server last answered (now_ms): the
				  * session was not idle then (pg_renew) */
	int fenced;              /* the sequence is usable */
	int named;               /* the names tables are usable (status) */
	int prepared;            /* the statements are prepared (stmt_name) */
	int try_next;            /* a shared wait was refused (permit holders, or
				  * a race): the next acquire tries again */
	unsigned turn;           /* the permit a permit waiter blocks on next */
	int piped;               /* libpq pipeline mode: a query may be sent before
				  * the replies of earlier ones are read */
	int pending;             /* async releases whose replies are unread (at
				  * most PG_PENDING_MAX; 1 when not piped) ... */
	int phead;               /* ... the oldest's index in pkeys */
	struct {
		size_t klen;     /* ... and their keys, for the line if one was lost */
		char key[KEY_BUF_SIZE];
	} pkeys[PG_PENDING_MAX];
	struct pg_seen *seen;    /* the keys this session has named (name_send):
				  * open addressing on key_hash, 0 free;
				  * emptied at each connect */
	size_t nseen, capseen;   /* capseen: 0 or a power of 2 */
	int owner_sent;          /* this session's owner record is sent */
	struct pg_due *due;      /* releases for the owner to send (under conns.mu) ... */
	int ndue;                /* ... whether any (read atomically, no lock) */
	struct pg_hold *holds;   /* grows by doubling, never shrinks; changed
				  * under conns.mu too (pg_renew reads it) */
	size_t nholds, capholds;
	char keytext[PG_KEYTEXT_MAX];
	char err[256];
};

static const struct backend_module_host *host;
static atomic_int fence_warned, names_warned;

/* Every open connection of the process, for the fork child (pg_atfork_child),
 * and the registry of which session holds which lock (each one's holds:
 * pg_renew finds a lease's session there). */
static struct {
	pthread_mutex_t mu;
	struct backend_conn *head;
} conns = { .mu = PTHREAD_MUTEX_INITIALIZER };
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

static void pg_atfork_prepare(void)
{
	pthread_mutex_lock(&conns.mu);
}

static void pg_atfork_parent(void)
{
	pthread_mutex_unlock(&conns.mu);
}

/*
 * In a fork child: every inherited session socket (of every thread of the
 * parent) becomes /dev/null, so that the child neither keeps its parent's
 * sessions, and so their locks, alive after the parent's death, nor ever
 * writes into them (a later close's goodbye goes to /dev/null). Only
 * async-signal-safe calls (and each connection's mutex made anew: a
 * renewal's ping in the parent may have held it); the connections' memory
 * stays (the threads that owned them do not exist here; the forking
 * thread's is closed by lock.c).
 */
static void pg_atfork_child(void)
{
	int nul = open("/dev/null", O_RDWR | O_CLOEXEC);

	for (struct backend_conn *c = conns.head; c; c = c->next) {
		/* the parent's renewal thread may have been pinging it */
		pthread_mutex_init(&c->mu, NULL);
		if (nul >= 0 && c->pg && PQsocket(c->pg) >= 0)
			dup2(nul, PQsocket(c->pg));
	}
	if (nul >= 0)
		close(nul);
	pthread_mutex_unlock(&conns.mu);
}

static void atfork_register(void)
{
	pthread_atfork(pg_atfork_prepare, pg_atfork_parent, pg_atfork_child);
}

static void conns_add(struct backend_conn *c)
{
	pthread_mutex_lock(&conns.mu);
	c->next = conns.head;
	if (conns.head)
		conns.head->prev = c;
	conns.head = c;
	pthread_mutex_unlock(&conns.mu);
}

static void conns_remove(struct backend_conn *c)
{
	pthread_mutex_lock(&conns.mu);
	if (c->prev)
		c->prev->next = c->next;
	else if (conns.head == c)
		conns.head = c->next;
	if (c->next)
		c->next->prev = c->prev;
	pthread_mutex_unlock(&conns.mu);
}

static void pg_bind(const struct backend_module_host *h)
{
	host = h;
}

/* ---- time and errors ---------------------------------------------------- */

static long long now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Closes c's session without sending anything (its socket first becomes
 * /dev/null: PQfinish's goodbye must not reach a parent's server from a
 * fork child). The server frees the session's locks when it sees the
 * socket close. */
static void session_drop(struct backend_conn *c)
{
	int fd, nul;

	if (!c->pg)
		return;
	fd = PQsocket(c->pg);
	if (fd >= 0 && (nul = open("/dev/null", O_RDWR | O_CLOEXEC)) >= 0) {
		dup2(nul, fd);
		close(nul);
	}
	PQfinish(c->pg);
	c->pg = NULL;
	c->pending = 0;
	pthread_mutex_lock(&conns.mu);
	c->nholds = 0; /* the server frees them: a renewal finds them lost */
	pthread_mutex_unlock(&conns.mu);
}

/* Records "what: libpq's message" as c's error, drops the session.
 * Returns BACKEND_ERR. */
static int fail(struct backend_conn *c, const char *what, const char *msg)
{
	size_t n;

	snprintf(c->err, sizeof(c->err), "%s: %s", what, msg && *msg ? msg : "failed");
	n = strlen(c->err);
	while (n && (c->err[n - 1] == '\n' || c->err[n - 1] == ' '))
		c->err[--n] = 0;
	for (char *p = c->err; *p; p++) /* libpq's lines, as one */
		if (*p == '\n' || *p == '\t')
			*p = ' ';
	session_drop(c);
	return BACKEND_ERR;
}

/* Waits until c's socket is ready for events or deadline (monotonic ms).
 * Returns 1 ready, 0 timed out, -1 error. */
static int sock_wait(struct backend_conn *c, short events, long long deadline)
{
	struct pollfd p = { .fd = PQsocket(c->pg), .events = events };

	for (;;) {
		long long left = deadline - now_ms();
		int n;

		if (left <= 0)
			return 0;
		n = poll(&p, 1, left > INT_MAX ? INT_MAX : (int)left);
		if (n > 0)
			return 1;
		if (n < 0 && errno != EINTR)
			return -1;
	}
}

/* ---- commands ----------------------------------------------------------- */

/*
 * Reads the result of the oldest query sent on c whose result is unread
 * (piped: up to its sync point; a bare sync's result is its own), within
 * deadline. Returns its last result (the caller PQclears it), or NULL with the session dropped and c->err
 * set (timeout, connection lost).
 */
static PGresult *result_read(struct backend_conn *c, long long deadline, const char *what)
{
	PGresult *r, *last = NULL;

	for (;;) {
		int rc;

		while ((rc = PQflush(c->pg)) == 1)
			if (sock_wait(c, POLLOUT | POLLIN, deadline) <= 0)
				goto timeout;
		if (rc < 0)
			goto broken;
		while (PQisBusy(c->pg)) {
			rc = sock_wait(c, POLLIN, deadline);
			if (rc == 0)
				goto timeout;
			if (rc < 0 || !PQconsumeInput(c->pg))
				goto broken;
		}
		r = PQgetResult(c->pg);
		if (!r && !c->piped)
			break;
		if (!r) /* piped: the end of the query's results; its sync follows */
			continue;
		if (PQresultStatus(r) == PGRES_PIPELINE_SYNC) {
			if (!last) { /* a bare sync (keepalive_locked): its own result */
				last = r;
				break;
			}
			PQclear(r);
			break;
		}
		PQclear(last);
		last = r;
	}
	if (!last)
		goto broken;
	c->active_ms = now_ms();
	return last;
timeout:
	PQclear(last);
	fail(c, what, "no reply within the time allowed (postgres.command_timeout_ms)");
	return NULL;
broken:
	PQclear(last);
	fail(c, what, PQerrorMessage(c->pg));
	return NULL;
}

/* Reads the replies of the async releases still unread (the oldest
 * first); one that found its lock not held by this session (lost while
 * held) is one warn line. Returns BACKEND_OK or BACKEND_ERR. */
static int drain(struct backend_conn *c)
{
	char msg[KEY_BUF_SIZE + 200];
	PGresult *r;

	while (c->pending > 0) {
		int i = c->phead;

		c->pending--;
		c->phead = (c->phead + 1) % PG_PENDING_MAX;
		r = result_read(c, now_ms() + c->bc->spec->command_timeout_ms, "release");
		if (!r)
			return BACKEND_ERR;
		if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1 &&
		    PQgetvalue(r, 0, 0)[0] == 'f' && host && host->warn) {
			snprintf(msg, sizeof(msg), "postgres: %.*s was not held any more at its "
				 "release: it was lost while held (its session was ended, or "
				 "unlocked by another)", (int)c->pkeys[i].klen, c->pkeys[i].key);
			host->warn(msg);
		}
		PQclear(r);
	}
	return BACKEND_OK;
}

/* Returns the name of sql's prepared statement on c (the session prepared
 * the variants its fence state chose: prepare_statements), or NULL. */
static const char *stmt_name(const struct backend_conn *c, const char *sql)
{
	if (!c->prepared)
		return NULL;
	for (size_t i = 0; i < PG_NSTMTS; i++)
		if (sql == pg_stmts[i].sql || sql == pg_stmts[i].sql_fenced)
			return pg_stmts[i].name;
	return NULL;
}

/* Returns the text of statement kind (PG_S_TRY...) for it's mode on c
 * (the fenced variant when c's sequence is usable); static. */
static const char *stmt_sql(const struct backend_conn *c, int kind,
			    const struct backend_item *it)
{
	const struct pg_stmt *s = &pg_stmts[kind + (it->limit > 1 ? 2 * PG_S_KINDS :
						      it->shared ? PG_S_KINDS : 0)];

	return c->fenced ? s->sql_fenced : s->sql;
}

/* Sends sql with params (text) on c: piped, behind the unread replies of
 * async releases (with its sync point); else once they are read. Returns
 * BACKEND_OK, or BACKEND_ERR with the session dropped. */
static int send_query(struct backend_conn *c, const char *sql, int n, const char *const *v,
		      const char *what)
{
	const char *name = stmt_name(c, sql);

	if (!c->pg) {
		snprintf(c->err, sizeof(c->err), "%s: not connected", what);
		return BACKEND_ERR;
	}
	if (!c->piped && drain(c) != BACKEND_OK)
		return BACKEND_ERR;
	if (!(name ? PQsendQueryPrepared(c->pg, name, n, v, NULL, NULL, 0) :
	      PQsendQueryParams(c->pg, sql, n, NULL, v, NULL, NULL, 0)) ||
	    (c->piped && !PQpipelineSync(c->pg)))
		return fail(c, what, PQerrorMessage(c->pg));
	return BACKEND_OK;
}

/*
 * Runs sql with params on c, bounded by timeout_ms. Returns the result
 * (the caller PQclears it; its status may be an error: the session is
 * kept), or NULL with the session dropped.
 */
static PGresult *run(struct backend_conn *c, const char *sql, int n, const char *const *v,
		     long long timeout_ms, const char *what)
{
	if (send_query(c, sql, n, v, what) != BACKEND_OK || drain(c) != BACKEND_OK)
		return NULL;
	return result_read(c, now_ms() + timeout_ms, what);
}

/* Sends sql with params on c without reading its reply (read with the
 * next command, or by drain: a release's that found its lock gone is one
 * warn line naming it's key). Returns BACKEND_OK, or BACKEND_ERR with the
 * session dropped. */
static int send_async(struct backend_conn *c, const char *sql, int n, const char *const *v,
		      const struct backend_item *it, const char *what)
{
	int k;

	if (c->pending == PG_PENDING_MAX && drain(c) != BACKEND_OK)
		return BACKEND_ERR;
	if (send_query(c, sql, n, v, what) != BACKEND_OK)
		return BACKEND_ERR;
	k = (c->phead + c->pending++) % PG_PENDING_MAX;
	c->pkeys[k].klen = it->klen < KEY_BUF_SIZE ? it->klen : KEY_BUF_SIZE;
	memcpy(c->pkeys[k].key, it->key, c->pkeys[k].klen);
	return BACKEND_OK;
}

/* Returns 1 when r is a row result, else sets c->err from it (0). */
static int rows_ok(struct backend_conn *c, PGresult *r, const char *what)
{
	if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1)
		return 1;
	snprintf(c->err, sizeof(c->err), "%s: %s", what, PQresultErrorMessage(r));
	c->err[strcspn(c->err, "\n")] = 0;
	return 0;
}

/* Writes it's key as the text the server hashes into c->keytext: the key
 * itself when it is UTF-8 without NUL, else "\x" and its bytes in hex
 * (a key's id is then that text's). Returns c->keytext. */
static const char *key_text(struct backend_conn *c, const struct backend_item *it)
{
	const unsigned char *k = (const unsigned char *)it->key;
	size_t i = 0, n = it->klen;
	int ok = n < KEY_BUF_SIZE;

	while (ok && i < n) {
		size_t len = k[i] < 0x80 ? 1 : (k[i] & 0xe0) == 0xc0 ? 2 : (k[i] & 0xf0) == 0xe0 ?
			     3 : (k[i] & 0xf8) == 0xf0 ? 4 : 0;

		if (!len || k[i] == 0 || i + len > n || (len == 2 && k[i] < 0xc2)) {
			ok = 0;
			break;
		}
		for (size_t j = 1; j < len; j++)
			ok &= (k[i + j] & 0xc0) == 0x80;
		/* overlong forms, surrogates, beyond U+10FFFF: refused by the server */
		if (len > 2 && ((k[i] == 0xe0 && k[i + 1] < 0xa0) || (k[i] == 0xed && k[i + 1] >= 0xa0) ||
				(k[i] == 0xf0 && k[i + 1] < 0x90) || (k[i] == 0xf4 && k[i + 1] >= 0x90) ||
				k[i] > 0xf4))
			ok = 0;
		i += len;
	}
	if (ok) {
		memcpy(c->keytext, it->key, n);
		c->keytext[n] = 0;
	} else {
		static const char hex[] = "0123456789abcdef";
		size_t o = 2;

		memcpy(c->keytext, "\\x", 2);
		for (i = 0; i < n && o + 3 < sizeof(c->keytext); i++) {
			c->keytext[o++] = hex[k[i] >> 4];
			c->keytext[o++] = hex[k[i] & 15];
		}
		c->keytext[o] = 0;
	}
	return c->keytext;
}

/* ---- names, for status --------------------------------------------------- */

/* Returns the FNV-1a hash of the n bytes of k: its entry in a seen set
 * (never 0, which marks a free slot). */
static uint64_t key_hash(const char *k, size_t n)
{
	uint64_t h = util_fnv1a64(UTIL_FNV1A64_START, k, n);

	return h ? h : 1;
}

/* Puts e in the free slot its probe finds in v (cap slots, a power of 2). */
static void seen_put(struct pg_seen *v, size_t cap, struct pg_seen e)
{
	size_t i = e.h & (cap - 1);

	while (v[i].h)
		i = (i + 1) & (cap - 1);
	v[i] = e;
}

/* Returns 1 when h is in c's seen set, named less than PG_NAME_AGAIN_MS
 * ago (no allocation: the hot path); else records it as named now (the
 * set doubled when half full) and returns 0, or 1 when out of memory (the
 * key stays unnamed). */
static int seen_add(struct backend_conn *c, uint64_t h)
{
	long long now = now_ms();

	for (size_t i = c->capseen ? h & (c->capseen - 1) : 0; c->capseen && c->seen[i].h;
	     i = (i + 1) & (c->capseen - 1)) {
		if (c->seen[i].h != h)
			continue;
		if (now - c->seen[i].at_ms < PG_NAME_AGAIN_MS)
			return 1;
		c->seen[i].at_ms = now;
		return 0;
	}
	if (2 * (c->nseen + 1) > c->capseen) {
		size_t cap = c->capseen ? 2 * c->capseen : 64;
		struct pg_seen *v = calloc(cap, sizeof(*v));

		if (!v)
			return 1;
		for (size_t i = 0; i < c->capseen; i++)
			if (c->seen[i].h)
				seen_put(v, cap, c->seen[i]);
		free(c->seen);
		c->seen = v;
		c->capseen = cap;
	}
	seen_put(c->seen, c->capseen, (struct pg_seen){ h, now });
	c->nseen++;
	return 0;
}

/*
 * Names it's key for status, once per session and PG_NAME_AGAIN_MS
 * (c->seen): the row of its id and text (sql_name_key, which also
 * deletes stale rows) and, with the session's first, the
 * session's owner record (it's value: sql_name_session); async, ahead of
 * the statement that follows (no round trip of their own: their replies
 * are read before its). Nothing when the tables cannot be used. Holds
 * c->mu. Returns BACKEND_OK, or BACKEND_ERR (the session dropped).
 */
static int name_send(struct backend_conn *c, const struct backend_item *it)
{
	char owner[BACKEND_VAL_MAX + 1];
	const char *v[1] = { owner };

	if (!c->named || seen_add(c, key_hash(it->key, it->klen)))
		return BACKEND_OK;
	if (!c->owner_sent && it->vlen <= BACKEND_VAL_MAX && !memchr(it->val, 0, it->vlen)) {
		memcpy(owner, it->val, it->vlen);
		owner[it->vlen] = 0;
		if (send_async(c, sql_name_session, 1, v, it, "acquire") != BACKEND_OK)
			return BACKEND_ERR;
		c->owner_sent = 1;
	}
	v[0] = key_text(c, it);
	return send_async(c, sql_name_key, 1, v, it, "acquire");
}

/* ---- the holds of a session --------------------------------------------- */

static size_t token_len(const struct backend_item *it)
{
	return it->vlen < PG_TOKEN ? it->vlen : PG_TOKEN;
}

/* Returns the index of it's token among c's holds, or -1. */
static long hold_index(const struct backend_conn *c, const struct backend_item *it)
{
	size_t tlen = token_len(it);

	for (size_t i = c->nholds; i-- > 0;)
		if (c->holds[i].tlen == tlen && memcmp(c->holds[i].tok, it->val, tlen) == 0)
			return (long)i;
	return -1;
}

/* Records it as held by c's session (under conns.mu: the registry).
 * Returns 0, or -1 out of memory. */
static int hold_add(struct backend_conn *c, const struct backend_item *it, int slot)
{
	int rc = 0;

	pthread_mutex_lock(&conns.mu);
	if (c->nholds == c->capholds) {
		size_t cap = c->capholds ? 2 * c->capholds : 8;
		struct pg_hold *v = realloc(c->holds, cap * sizeof(*v));

		if (!v) {
			rc = -1;
			goto out;
		}
		c->holds = v;
		c->capholds = cap;
	}
	c->holds[c->nholds].lease_ms = it->lease_ms;
	c->holds[c->nholds].renewed_ms = now_ms();
	c->holds[c->nholds].slot = slot;
	c->holds[c->nholds].tlen = token_len(it);
	memcpy(c->holds[c->nholds].tok, it->val, token_len(it));
	c->nholds++;
out:
	pthread_mutex_unlock(&conns.mu);
	return rc;
}

/* Forgets c's i-th hold (under conns.mu: the registry). */
static void hold_remove(struct backend_conn *c, size_t i)
{
	pthread_mutex_lock(&conns.mu);
	c->holds[i] = c->holds[--c->nholds];
	pthread_mutex_unlock(&conns.mu);
}

/*
 * Whether h was not renewed for a whole lease: renew.c stopped renewing it
 * (max_hold_ms passed, or it was lost), as a Redis key of that lease would
 * have expired. A session holding one is pinged no more (pg_renew), so the
 * server ends it after its idle_session_timeout and frees its locks.
 */
static int hold_stale(const struct pg_hold *h, long long now)
{
	return now - __atomic_load_n(&h->renewed_ms, __ATOMIC_RELAXED) >= h->lease_ms;
}

/* Whether one of c's holds is stale (hold_stale). Holds c->mu. */
static int session_stale(const struct backend_conn *c, long long now)
{
	for (size_t i = 0; i < c->nholds; i++)
		if (hold_stale(&c->holds[i], now))
			return 1;
	return 0;
}

/* Whether the server has closed c's session (its end of the socket shut:
 * an idle_session_timeout, a termination), without reading or waiting. */
static int session_closed(const struct backend_conn *c)
{
	struct pollfd p = { .fd = PQsocket(c->pg), .events = POLLRDHUP };

	return p.fd >= 0 && poll(&p, 1, 0) == 1 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

/* Writes into buf (24 bytes) the session's idle_session_timeout once it
 * holds its locks and also one of lease_ms (0: none more): the shortest
 * lease, or "0" (none) when it holds nothing. Returns buf. */
static const char *idle_text(const struct backend_conn *c, long long lease_ms, char *buf)
{
	long long ms = lease_ms;

	for (size_t i = 0; i < c->nholds; i++)
		if (c->holds[i].lease_ms > 0 && (ms <= 0 || c->holds[i].lease_ms < ms))
			ms = c->holds[i].lease_ms;
	if (ms > INT_MAX)
		ms = INT_MAX;
	snprintf(buf, 24, "%lld", ms > 0 ? ms : 0);
	return buf;
}

/* Records a grant of it (slot: its permit, 0 none); on no room the
 * session is dropped (the lock is freed with it). Returns BACKEND_OK or
 * BACKEND_ERR. */
static int granted(struct backend_conn *c, const struct backend_item *it, int slot)
{
	if (hold_add(c, it, slot) == 0)
		return BACKEND_OK;
	return fail(c, "acquire", "out of memory for the session's holds");
}

/* ---- set-up ------------------------------------------------------------- */

static int pg_serves(const void *settings)
{
	(void)settings;
	return 1;
}

/*
 * In secure-execution mode (a set-ID program): libpq reads its PG*
 * variables with getenv, so a user could point a root program's
 * connection at their CA (PGSSLROOTCERT), their service file, a weaker
 * sslmode... Returns the first such variable that is set (none may be, as
 * no LOCKSHIM_* variable is read there), or NULL; always NULL outside
 * secure mode.
 */
static const char *secure_env_set(void)
{
	static const char *const extra[] = { "PGSERVICEFILE", "PGSYSCONFDIR", "PGLOCALEDIR" };
	static char found[64];
	PQconninfoOption *opts;
	const char *name = NULL;

	if (!getauxval(AT_SECURE))
		return NULL;
	for (size_t i = 0; i < sizeof(extra) / sizeof(extra[0]) && !name; i++)
		if (getenv(extra[i]))
			name = extra[i];
	if (!name && (opts = PQconndefaults())) {
		for (PQconninfoOption *o = opts; o->keyword && !name; o++)
			if (o->envvar && getenv(o->envvar))
				name = o->envvar;
		if (name)
			snprintf(found, sizeof(found), "%s", name);
		PQconninfoFree(opts);
		return name ? found : NULL;
	}
	return name;
}

static struct backend_config *pg_config_new(const void *settings, char *err, size_t errlen)
{
	const struct postgres_spec *ps = settings;
	const char *env = secure_getenv("LOCKSHIM_POSTGRES_PASSWORD");
	const char *unsafe = secure_env_set();
	struct backend_config *bc;

	if (unsafe) {
		snprintf(err, errlen, "backend postgres: %s is set in a set-ID program (secure-"
			 "execution mode), where libpq would obey it: unset it", unsafe);
		return NULL;
	}
	if (!(bc = calloc(1, sizeof(*bc)))) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	bc->spec = ps;
	bc->password = ps->password;
	if (env && *env) {
		if (!(bc->password = strdup(env))) {
			free(bc);
			snprintf(err, errlen, "out of memory");
			return NULL;
		}
		bc->env_password = 1;
	}
	snprintf(bc->app, sizeof(bc->app), "lockshim:%s", program_invocation_short_name);
	pthread_once(&atfork_once, atfork_register);
	return bc;
}

static void pg_config_free(struct backend_config *bc)
{
	if (bc && bc->env_password)
		free(bc->password);
	free(bc);
}

/* Warns once per process that fencing tokens are 0. */
static void fence_warn(const char *why)
{
	char msg[600];

	if (atomic_exchange(&fence_warned, 1) || !host || !host->warn)
		return;
	snprintf(msg, sizeof(msg), "postgres: fencing tokens are 0: the sequence lockshim_fence "
		 "cannot be used (%s); create it, or grant USAGE on it", why);
	host->warn(msg);
}

/* Warns once per process that status cannot name this process's locks. */
static void names_warn(const char *why)
{
	char msg[600];

	if (atomic_exchange(&names_warned, 1) || !host || !host->warn)
		return;
	snprintf(msg, sizeof(msg), "postgres: lockshim status cannot list this program's locks: "
		 "the tables lockshim_keys and lockshim_sessions cannot be used (%s); create them, "
		 "or grant SELECT, INSERT, UPDATE, DELETE on lockshim_keys and SELECT, INSERT, "
		 "UPDATE on lockshim_sessions",
		 why);
	host->warn(msg);
}

/* Reads the state of each object (sql_setup_state) into state[]. Returns
 * BACKEND_OK, or BACKEND_ERR (the session dropped). */
static int setup_state(struct backend_conn *c, int *state)
{
	PGresult *r = run(c, sql_setup_state, 0, NULL, c->bc->spec->command_timeout_ms,
			  "connect (the lockshim tables)");
	int ok;

	if (!r)
		return BACKEND_ERR;
	ok = rows_ok(c, r, "connect");
	for (int i = 0; i < PG_NOBJS; i++)
		state[i] = ok ? atoi(PQgetvalue(r, 0, i)) : 2;
	PQclear(r);
	return BACKEND_OK;
}

/*
 * Makes the sequence lockshim_fence and the tables usable if it can (each
 * absent one created, then the states read again: a concurrent creator
 * may have won): sets c->fenced and c->named; warns once when either
 * cannot be. The counts table's errors are .count's. Returns BACKEND_OK,
 * or BACKEND_ERR (the session dropped).
 */
static int objects_setup(struct backend_conn *c)
{
	long long t = c->bc->spec->command_timeout_ms;
	char why[PG_NOBJS][sizeof(c->err)] = { { 0 } };
	int state[PG_NOBJS], absent = 0;
	PGresult *r;

	if (setup_state(c, state) != BACKEND_OK)
		return BACKEND_ERR;
	for (int i = 0; i < PG_NOBJS; i++) {
		for (int j = 0; j < PG_CREATES_MAX && state[i] == 0 && sql_setup_create[i][j]; j++) {
			absent = 1;
			if (!(r = run(c, sql_setup_create[i][j], 0, NULL, t, "connect (CREATE)")))
				return BACKEND_ERR;
			if (PQresultStatus(r) != PGRES_COMMAND_OK && !why[i][0]) {
				snprintf(why[i], sizeof(why[i]), "%s", PQresultErrorMessage(r));
				why[i][strcspn(why[i], "\n")] = 0;
			}
			PQclear(r);
		}
	}
	if (absent && setup_state(c, state) != BACKEND_OK)
		return BACKEND_ERR;
	c->fenced = state[PG_OBJ_FENCE] == 1;
	c->named = state[PG_OBJ_NAMES] == 1;
	if (!c->fenced)
		fence_warn(state[PG_OBJ_FENCE] == 2 && !why[PG_OBJ_FENCE][0] ?
			   "no USAGE privilege on it" : why[PG_OBJ_FENCE]);
	if (!c->named)
		names_warn(state[PG_OBJ_NAMES] == 2 && !why[PG_OBJ_NAMES][0] ?
			   "no privilege on them" : why[PG_OBJ_NAMES]);
	return BACKEND_OK;
}

/*
 * Prepares the session's statements, exclusive and shared (pg_stmts: the
 * fenced variants when the sequence is usable), in one round trip, so that each call's statement is
 * not parsed and planned again. Sets c->prepared; a failure only leaves
 * the statements unprepared. Returns BACKEND_OK, or BACKEND_ERR (the
 * session dropped).
 */
static int prepare_statements(struct backend_conn *c)
{
	size_t n = 0, size = 1;
	char *sql;
	PGresult *r;
	int sent;

	for (size_t i = 0; i < PG_NSTMTS; i++)
		size += 64 + strlen(pg_stmts[i].sql_fenced) + strlen(pg_stmts[i].sql);
	if (!(sql = malloc(size)))
		return fail(c, "connect (PREPARE)", "out of memory");
	for (size_t i = 0; i < PG_NSTMTS; i++)
		n += (size_t)snprintf(sql + n, size - n, "%sPREPARE %s(%s) AS %s",
				      i ? "; " : "", pg_stmts[i].name, pg_stmts[i].types,
				      c->fenced ? pg_stmts[i].sql_fenced : pg_stmts[i].sql);
	sent = PQsendQuery(c->pg, sql);
	free(sql);
	if (!sent)
		return fail(c, "connect (PREPARE)", PQerrorMessage(c->pg));
	if (!(r = result_read(c, now_ms() + c->bc->spec->command_timeout_ms,
			      "connect (PREPARE)")))
		return BACKEND_ERR;
	c->prepared = PQresultStatus(r) == PGRES_COMMAND_OK;
	PQclear(r);
	return BACKEND_OK;
}

/* Ignores the server's notices (libpq would print them on stderr). */
static void notice_none(void *arg, const char *msg)
{
	(void)arg;
	(void)msg;
}

/*
 * Opens c's session (c->pg is NULL): connect within connect_timeout_ms,
 * the version, the fence sequence, the prepared statements, pipeline
 * mode. Returns 0, or -1 with one line in err (never c->err) and c->pg
 * NULL.
 */
static int session_connect(struct backend_conn *c, char *err, size_t errlen)
{
	const struct backend_config *bc = c->bc;
	const char *keys[5] = { "dbname", "application_name", NULL, NULL, NULL };
	const char *vals[5] = { bc->spec->conninfo, bc->app, NULL, NULL, NULL };
	long long deadline = now_ms() + bc->spec->connect_timeout_ms;
	PostgresPollingStatusType st = PGRES_POLLING_WRITING;
	int k = 2;

	c->fenced = c->prepared = c->piped = c->pending = c->phead = c->owner_sent = 0;
	c->nseen = 0;
	if (c->seen)
		memset(c->seen, 0, c->capseen * sizeof(*c->seen));
	c->err[0] = 0;
	if (bc->password) {
		keys[k] = "password";
		vals[k++] = bc->password;
	}
	if (!(c->pg = PQconnectStartParams(keys, vals, 1)) || PQstatus(c->pg) == CONNECTION_BAD) {
		snprintf(err, errlen, "connect: %s", c->pg ? PQerrorMessage(c->pg) : "out of memory");
		goto out;
	}
	while (st != PGRES_POLLING_OK && st != PGRES_POLLING_FAILED) {
		int rc = sock_wait(c, st == PGRES_POLLING_READING ? POLLIN : POLLOUT, deadline);

		if (rc == 0) {
			snprintf(err, errlen, "connect: no connection within "
				 "postgres.connect_timeout_ms (%d ms)", bc->spec->connect_timeout_ms);
			goto out;
		}
		st = PQconnectPoll(c->pg);
	}
	if (st == PGRES_POLLING_FAILED) {
		snprintf(err, errlen, "connect: %s", PQerrorMessage(c->pg));
		goto out;
	}
	if (PQserverVersion(c->pg) < 140000) {
		snprintf(err, errlen, "connect: PostgreSQL 14 or later is needed (a lock's lease "
			 "is its session's idle_session_timeout); this server is %d",
			 PQserverVersion(c->pg));
		goto out;
	}
	PQsetNoticeProcessor(c->pg, notice_none, NULL);
	if (PQsetnonblocking(c->pg, 1) != 0 || objects_setup(c) != BACKEND_OK ||
	    prepare_statements(c) != BACKEND_OK) {
		snprintf(err, errlen, "%s", c->err[0] ? c->err : "connect: set-up failed");
		goto out;
	}
	c->piped = PQenterPipelineMode(c->pg) == 1;
	return 0;
out:
	err[strcspn(err, "\n")] = 0;
	session_drop(c);
	return -1;
}

static struct backend_conn *pg_open(const struct backend_config *bc, char *err, size_t errlen)
{
	struct backend_conn *c = calloc(1, sizeof(*c));

	if (!c) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	pthread_mutex_init(&c->mu, NULL);
	c->bc = bc;
	c->pid = getpid();
	if (session_connect(c, err, errlen) != 0) {
		pthread_mutex_destroy(&c->mu);
		free(c);
		return NULL;
	}
	conns_add(c);
	return c;
}

/* Opens c's session again when it was dropped (a renewal's ping found it
 * gone, a command timed out): the call after a lost lock does not fail.
 * Returns BACKEND_OK, or BACKEND_ERR with c->err set. Holds c->mu. */
static int session_up(struct backend_conn *c)
{
	char err[sizeof(c->err)];

	if (c->pg)
		return BACKEND_OK;
	if (session_connect(c, err, sizeof(err)) == 0)
		return BACKEND_OK;
	snprintf(c->err, sizeof(c->err), "%s", err);
	return BACKEND_ERR;
}

/* Writes "PostgreSQL HOST:PORT database DB (session advisory locks)", each
 * from the conninfo or libpq's defaults when the conninfo does not say. */
static void pg_describe(const struct backend_config *bc, char *buf, size_t len)
{
	const char *host = NULL, *port = NULL, *db = NULL;
	PQconninfoOption *opts = PQconninfoParse(bc->spec->conninfo, NULL);

	for (PQconninfoOption *o = opts; o && o->keyword; o++) {
		if (!strcmp(o->keyword, "host") || (!strcmp(o->keyword, "hostaddr") && !host))
			host = o->val ? o->val : host;
		else if (!strcmp(o->keyword, "port"))
			port = o->val;
		else if (!strcmp(o->keyword, "dbname"))
			db = o->val;
	}
	snprintf(buf, len, "PostgreSQL %s:%s database %s (session advisory locks)",
		 host ? host : "(libpq's default host)", port ? port : "(default port)",
		 db ? db : "(default)");
	PQconninfoFree(opts);
}

/* In a fork child too: the socket may be the parent's, but the child's
 * handler made it /dev/null (and the forking thread's is closed first
 * here by lock.c after that handler). */
static void pg_close(struct backend_conn *c)
{
	conns_remove(c);
	pthread_mutex_lock(&c->mu); /* a renewal's ping in flight ends first */
	pthread_mutex_unlock(&c->mu);
	pthread_mutex_destroy(&c->mu);
	session_drop(c);
	while (c->due) {
		struct pg_due *d = c->due;

		c->due = d->next;
		free(d);
	}
	free(c->holds);
	free(c->seen);
	free(c);
}

/* ---- locking ------------------------------------------------------------ */

static void due_send(struct backend_conn *c);

/* Asks why a try was refused by a check (postgres_sql.h's why statement:
 * pg_locks). Returns BACKEND_MISMATCH (c->err names both limits) when the
 * key's holders have another limit, BACKEND_NO when none is there (busy),
 * BACKEND_ERR. */
static int refused_why(struct backend_conn *c, const struct backend_item *it)
{
	char lim[16];
	const char *v[2] = { key_text(c, it), lim };
	PGresult *r;
	int rc = BACKEND_NO;

	snprintf(lim, sizeof(lim), "%d", it->limit);
	if (!(r = run(c, stmt_sql(c, PG_S_WHY, it), it->limit > 1 ? 2 : 1, v,
		      c->bc->spec->command_timeout_ms, "acquire")))
		return BACKEND_ERR;
	if (!rows_ok(c, r, "acquire"))
		rc = BACKEND_ERR;
	else if (!PQgetisnull(r, 0, 0)) {
		snprintf(c->err, sizeof(c->err), "limit %d here, %s for the key's holders",
			 it->limit > 1 ? it->limit : 1, PQgetvalue(r, 0, 0));
		rc = BACKEND_MISMATCH;
	}
	PQclear(r);
	return rc;
}

/*
 * The first try (postgres_sql.h): the key's lock, exclusive or shared, or
 * the first free permit, and the fence when granted. A waiter does not
 * try here (its wait blocks in the server): BACKEND_NO with a wait as
 * long as it likes; a permit's waiter does (it waits on one permit only),
 * and so does a shared one whose wait was refused. Its token held
 * already: taken. BACKEND_MISMATCH: holders of another limit (c->err;
 * asked in a second statement after a refusal by a check, or the first
 * refusal of a call with no permit free).
 */
static int pg_acquire_locked(struct backend_conn *c, const struct backend_item *it,
			     long long *wait_ms, long long *fence)
{
	char idle[24], lim[16];
	const char *v[3];
	PGresult *r;
	long long code, f;
	int permit = it->limit > 1, rc;

	*fence = 0;
	if (hold_index(c, it) >= 0)
		return BACKEND_OK;
	if (it->waiting && !permit && !c->try_next) {
		*wait_ms = LLONG_MAX / 4;
		return BACKEND_NO;
	}
	c->try_next = 0;
	if (session_up(c) != BACKEND_OK || name_send(c, it) != BACKEND_OK)
		return BACKEND_ERR;
	snprintf(lim, sizeof(lim), "%d", it->limit);
	v[0] = key_text(c, it);
	v[1] = idle_text(c, it->lease_ms, idle);
	v[2] = lim;
	if (!(r = run(c, stmt_sql(c, PG_S_TRY, it), permit ? 3 : 2, v,
		      c->bc->spec->command_timeout_ms, "acquire")))
		return BACKEND_ERR;
	if (!rows_ok(c, r, "acquire")) {
		PQclear(r);
		return BACKEND_ERR;
	}
	code = atoll(PQgetvalue(r, 0, 0));
	f = permit ? atoll(PQgetvalue(r, 0, 1)) : code;
	PQclear(r);
	/* another kind's holders, or no permit free at a call's first try */
	if ((code == -2 || (code == -3 && !it->waiting)) &&
	    (rc = refused_why(c, it)) != BACKEND_NO)
		return rc;
	if (code < 0 || (permit && code == 0)) {
		/* a permit's waiter blocks on one permit (pg_wait) */
		*wait_ms = permit ? LLONG_MAX / 4 : BACKEND_NOT_QUEUED;
		return BACKEND_NO;
	}
	*fence = f;
	return granted(c, it, permit ? (int)code : 0);
}

static int pg_acquire(struct backend_conn *c, const struct backend_item *it, long long *wait_ms,
		      char *holder, size_t *holder_len, long long *fence)
{
	int rc;

	(void)holder;
	*holder_len = 0;
	pthread_mutex_lock(&c->mu);
	due_send(c);
	rc = pg_acquire_locked(c, it, wait_ms, fence);
	pthread_mutex_unlock(&c->mu);
	return rc;
}

/* Sends pg_advisory_unlock of it's key (and the session's idle timeout
 * for the locks it still holds); async: its reply is read with the next
 * command (or flush). BACKEND_NO, nothing sent, when this session does
 * not hold it, or when the renewal had stopped (max_hold_ms passed) and
 * the server has closed the session since (the lock was freed then: the
 * session is dropped, quietly). Holds c->mu. */
static int pg_release_locked(struct backend_conn *c, const struct backend_item *it, int async)
{
	long i = hold_index(c, it);
	char idle[24], slot[16], lim[16];
	const char *v[4];
	int n = it->limit > 1 ? 4 : 2;
	PGresult *r;
	int ok;

	if (i < 0)
		return BACKEND_NO;
	if (hold_stale(&c->holds[i], now_ms()) && session_closed(c)) {
		session_drop(c);
		return BACKEND_NO;
	}
	snprintf(slot, sizeof(slot), "%d", c->holds[i].slot);
	snprintf(lim, sizeof(lim), "%d", it->limit);
	hold_remove(c, (size_t)i);
	v[0] = key_text(c, it);
	v[1] = idle_text(c, 0, idle);
	v[2] = slot;
	v[3] = lim;
	if (async) {
		if (send_async(c, stmt_sql(c, PG_S_UNLOCK, it), n, v, it, "release") != BACKEND_OK)
			return BACKEND_ERR;
		/* the query goes out now (else with the next command) */
		if (PQflush(c->pg) < 0)
			return fail(c, "release", PQerrorMessage(c->pg));
		return BACKEND_OK;
	}
	if (!(r = run(c, stmt_sql(c, PG_S_UNLOCK, it), n, v, c->bc->spec->command_timeout_ms,
		      "release")))
		return BACKEND_ERR;
	ok = rows_ok(c, r, "release") && PQgetvalue(r, 0, 0)[0] == 't';
	PQclear(r);
	return ok ? BACKEND_OK : BACKEND_NO;
}

/* Sends the releases other threads left for c's owner (release_foreign),
 * async; a failure drops the session (its locks freed with it). Holds
 * c->mu; one atomic load when there are none. */
static void due_send(struct backend_conn *c)
{
	struct pg_due *d;

	if (!__atomic_load_n(&c->ndue, __ATOMIC_RELAXED))
		return;
	pthread_mutex_lock(&conns.mu);
	d = c->due;
	c->due = NULL;
	__atomic_store_n(&c->ndue, 0, __ATOMIC_RELAXED);
	pthread_mutex_unlock(&conns.mu);
	while (d) {
		struct pg_due *next = d->next;
		struct backend_item it = backend_copy_item(&d->c);

		if (c->pg)
			pg_release_locked(c, &it, 1);
		free(d);
		d = next;
	}
}

/*
 * Releases it where it is held, on another thread's session (a session
 * lock can be given back only by its session): renew.c's release of a
 * kept lock at linger_ms's end, on the renewal thread, or exit's. Sent
 * async at once when that session's owner is not using it; else left for
 * the owner's next command (due_send: the end of its wait, say). Returns
 * BACKEND_OK (sent, left, or the session dropped on a failure: its locks
 * freed), BACKEND_NO when no session holds it, BACKEND_ERR out of memory.
 */
static int release_foreign(const struct backend_item *it)
{
	struct backend_conn *found = NULL;
	struct pg_due *d;
	int busy = 0;

	pthread_mutex_lock(&conns.mu);
	for (struct backend_conn *c = conns.head; c && !found; c = c->next)
		if (hold_index(c, it) >= 0)
			found = c;
	/* trylock: the owner takes its mu then conns.mu */
	if (found && pthread_mutex_trylock(&found->mu) != 0) {
		busy = -1;
		if ((d = malloc(sizeof(*d))) && backend_copy_set(&d->c, it) == 0) {
			d->next = found->due;
			found->due = d;
			__atomic_store_n(&found->ndue, 1, __ATOMIC_RELAXED);
			busy = 1;
		} else {
			free(d);
		}
	}
	pthread_mutex_unlock(&conns.mu);
	if (!found)
		return BACKEND_NO;
	if (busy)
		return busy > 0 ? BACKEND_OK : BACKEND_ERR;
	pg_release_locked(found, it, 1);
	pthread_mutex_unlock(&found->mu);
	return BACKEND_OK;
}

/* Waits for a renewal's ping in flight on c (pg_renew), then releases;
 * a lock c's session does not hold, where another session holds it
 * (release_foreign). */
static int pg_release(struct backend_conn *c, const struct backend_item *it, int async)
{
	int rc, own;

	pthread_mutex_lock(&c->mu);
	due_send(c);
	own = hold_index(c, it) >= 0;
	rc = own ? pg_release_locked(c, it, async) : BACKEND_NO;
	pthread_mutex_unlock(&c->mu);
	return own ? rc : release_foreign(it);
}

/*
 * Warns, at most once in PG_DEADLOCK_WARN_MS per process, that the server
 * failed a wait on it's key as a deadlock: the session holds a key that
 * the key's holder waits for (nested calls taking keys in opposite
 * orders). The wait is refused, not an error: the session, and the locks
 * of the calls running on it, stay; the waiter waits on until wait_ms.
 */
static void deadlock_warn(const struct backend_item *it)
{
	static _Atomic long long warned_ms;
	long long now = now_ms(), last = atomic_load(&warned_ms);
	char msg[600];

	if ((last && now - last < PG_DEADLOCK_WARN_MS) ||
	    !atomic_compare_exchange_strong(&warned_ms, &last, now) || !host || !host->warn)
		return;
	snprintf(msg, sizeof(msg), "postgres: the server found a deadlock waiting for %.*s: "
		 "this session holds a key its holder waits for (calls nested in opposite "
		 "orders); waiting on until wait_ms", (int)it->klen, it->key);
	host->warn(msg);
}

/*
 * Blocks in the server on the lock of it's key for at most timeout_ms
 * (lock_timeout, set in the same statement), a permit's waiter on one
 * permit (in turn) for at most PG_PERMIT_WAIT_MS: GRANTED with the fence
 * when the release (or the holder's death) hands it over, NO at the
 * timeout, when the server failed it as a deadlock (deadlock_warn), or
 * when the checks after it refused (postgres_sql.h: given back; the next
 * acquire tries and says why).
 */
static int pg_wait_locked(struct backend_conn *c, const struct backend_item *it,
			  long long timeout_ms, long long *fence)
{
	char lt[24], idle[24], lim[16], slot[16];
	const char *v[5];
	int permit = it->limit > 1;
	PGresult *r;
	const char *state;
	long long code;

	*fence = 0;
	if (hold_index(c, it) >= 0)
		return BACKEND_GRANTED;
	if (timeout_ms <= 0)
		return BACKEND_NO;
	if (timeout_ms > (permit ? PG_PERMIT_WAIT_MS : PG_WAIT_MAX_MS))
		timeout_ms = permit ? PG_PERMIT_WAIT_MS : PG_WAIT_MAX_MS;
	if (session_up(c) != BACKEND_OK || name_send(c, it) != BACKEND_OK)
		return BACKEND_ERR;
	snprintf(lt, sizeof(lt), "%lld", timeout_ms);
	snprintf(lim, sizeof(lim), "%d", it->limit);
	snprintf(slot, sizeof(slot), "%u", permit ? 1 + c->turn++ % (unsigned)it->limit : 0);
	v[0] = key_text(c, it);
	v[1] = lt;
	v[2] = idle_text(c, it->lease_ms, idle);
	v[3] = lim;
	v[4] = slot;
	if (!(r = run(c, stmt_sql(c, PG_S_WAIT, it), permit ? 5 : 3, v,
		      timeout_ms + c->bc->spec->command_timeout_ms, "wait")))
		return BACKEND_ERR;
	if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1) {
		code = atoll(PQgetvalue(r, 0, permit ? 0 : 2));
		*fence = permit ? atoll(PQgetvalue(r, 0, 1)) : code;
		PQclear(r);
		if (code < 0 || (permit && code <= 0)) {
			c->try_next = 1;
			return BACKEND_NO;
		}
		return granted(c, it, permit ? (int)code : 0) == BACKEND_OK ? BACKEND_GRANTED :
			BACKEND_ERR;
	}
	state = PQresultErrorField(r, PG_DIAG_SQLSTATE);
	if (state && strcmp(state, "55P03") == 0) { /* lock_not_available */
		PQclear(r);
		return BACKEND_NO;
	}
	if (state && strcmp(state, "40P01") == 0) { /* deadlock_detected */
		PQclear(r);
		deadlock_warn(it);
		return BACKEND_NO;
	}
	rows_ok(c, r, "wait");
	PQclear(r);
	return BACKEND_ERR;
}

/* A renewal's ping does not wait behind a blocked wait (pg_renew). */
static int pg_wait(struct backend_conn *c, const struct backend_item *it,
		   long long timeout_ms, long long *fence)
{
	int rc;

	pthread_mutex_lock(&c->mu);
	due_send(c);
	rc = pg_wait_locked(c, it, timeout_ms, fence);
	due_send(c); /* left while it blocked */
	pthread_mutex_unlock(&c->mu);
	return rc;
}

/* Gives up it: released when this session holds it. */
static int pg_leave(struct backend_conn *c, const struct backend_item *it, int async)
{
	return pg_release(c, it, async) == BACKEND_OK ? BACKEND_OK : BACKEND_NO;
}

static int pg_flush(struct backend_conn *c)
{
	int rc;

	pthread_mutex_lock(&c->mu);
	due_send(c);
	rc = drain(c);
	pthread_mutex_unlock(&c->mu);
	return rc;
}

/* An unread release's session is dropped with it: the server frees the
 * lock then, so nothing is left to forget. */
static void pg_unconfirmed(struct backend_conn *c,
			   void (*fn)(void *arg, const struct backend_item *it), void *arg)
{
	(void)fn;
	(void)arg;
	pthread_mutex_lock(&c->mu);
	c->pending = 0;
	pthread_mutex_unlock(&c->mu);
}

static const char *pg_errstr(const struct backend_conn *c)
{
	return c->err;
}

/* Sends SELECT 1 on c. Returns BACKEND_OK or BACKEND_ERR. Holds c->mu. */
static int ping_locked(struct backend_conn *c)
{
	PGresult *r = run(c, sql_ping, 0, NULL, c->bc->spec->command_timeout_ms, "ping");
	int ok;

	if (!r)
		return BACKEND_ERR;
	ok = rows_ok(c, r, "ping");
	PQclear(r);
	return ok ? BACKEND_OK : BACKEND_ERR;
}

/*
 * The renewal's ping of a holder's session c: in pipeline mode a bare Sync
 * message, which the server answers with ReadyForQuery (no statement: its
 * idle_session_timeout starts again, and pg_stat_activity's query_start,
 * status's held time, stays the lock statement's); else SELECT 1.
 * Returns BACKEND_OK, or BACKEND_ERR (the session dropped). Holds c->mu.
 */
static int keepalive_locked(struct backend_conn *c)
{
	PGresult *r;
	int ok;

	if (!c->pg || !c->piped)
		return ping_locked(c);
	if (drain(c) != BACKEND_OK)
		return BACKEND_ERR;
	if (!PQpipelineSync(c->pg))
		return fail(c, "ping", PQerrorMessage(c->pg));
	if (!(r = result_read(c, now_ms() + c->bc->spec->command_timeout_ms, "ping")))
		return BACKEND_ERR;
	ok = PQresultStatus(r) == PGRES_PIPELINE_SYNC;
	PQclear(r);
	if (!ok)
		return fail(c, "ping", "not the answer to a sync");
	return BACKEND_OK;
}

static int pg_ping(struct backend_conn *c)
{
	int rc;

	pthread_mutex_lock(&c->mu);
	rc = ping_locked(c);
	pthread_mutex_unlock(&c->mu);
	return rc;
}

/* ---- renewal ------------------------------------------------------------ */

/*
 * Returns the session (in the registry: every connection's holds) that
 * holds it's token, with its mutex taken (the caller unlocks it), or NULL
 * with *busy 1 when that session's owner is using it (a command in
 * flight: the session is not idle), 0 when no session holds it. The hold
 * is marked renewed now (hold_stale), busy or not.
 */
static struct backend_conn *holder_session(const struct backend_item *it, int *busy)
{
	struct backend_conn *found = NULL;
	long k;

	*busy = 0;
	pthread_mutex_lock(&conns.mu);
	for (struct backend_conn *c = conns.head; c && !found; c = c->next)
		if ((k = hold_index(c, it)) >= 0) {
			found = c;
			__atomic_store_n(&c->holds[k].renewed_ms, now_ms(), __ATOMIC_RELAXED);
		}
	/* trylock: the owner takes c->mu then conns.mu (hold_add) */
	if (found && pthread_mutex_trylock(&found->mu) != 0) {
		*busy = 1;
		found = NULL;
	}
	pthread_mutex_unlock(&conns.mu);
	return found;
}

/*
 * Keeps h, which holds it (the item renew.c renews), alive: a ping, or
 * none when the server answered on h less than a sixth of the lease ago
 * (another lock's renewal, the owner's own command); none either while h
 * holds a lock renew.c renews no more (session_stale: max_hold_ms
 * passed), only a look at whether the server has closed h since (then h
 * is dropped). Returns BACKEND_OK, or BACKEND_NO when h holds it no more
 * (the session gone: the server freed its locks; the next command
 * reconnects). Holds h->mu.
 */
static int renew_session(struct backend_conn *h, const struct backend_item *it)
{
	long long now = now_ms();

	if (session_stale(h, now)) {
		if (session_closed(h))
			session_drop(h);
	} else if (now - h->active_ms >= it->lease_ms / 6 && keepalive_locked(h) != BACKEND_OK) {
		return BACKEND_NO;
	}
	return hold_index(h, it) >= 0 ? BACKEND_OK : BACKEND_NO;
}

/*
 * The lease of a session advisory lock is its session's
 * idle_session_timeout (set by the statements that take and release
 * locks): renewing is keeping the holder's session from being idle, one
 * ping on it under its mutex (renew_session; keepalive_locked: a bare
 * Sync). Each lock is due every third of its lease (renew.c), so a
 * session holding one lock is pinged three times a lease, one holding
 * many at most six times, and none is idle for more than half a lease. A
 * session holding a lock renew.c renews no more (max_hold_ms passed:
 * hold_stale) is not pinged: the server ends it within its lease, and the
 * lock with it; the session's other locks are lost with it, and their
 * renewals say so. c (the renewal thread's own connection) is not used.
 * results[i]: BACKEND_OK (kept, or its owner is using it), BACKEND_NO (no
 * session holds it any more, or the ping failed: the session, and so the
 * lock, is gone). Returns BACKEND_OK.
 */
static int pg_renew(struct backend_conn *c, int n, const struct backend_item *items,
		    int *results)
{
	(void)c;
	for (int i = 0; i < n; i++) {
		int busy;
		struct backend_conn *h = holder_session(&items[i], &busy);

		if (!h) {
			results[i] = busy ? BACKEND_OK : BACKEND_NO;
			continue;
		}
		results[i] = renew_session(h, &items[i]);
		pthread_mutex_unlock(&h->mu);
	}
	return BACKEND_OK;
}

/* ---- counts (metrics) -------------------------------------------------- */

/* Writes the n bytes of p as hex at out (2n bytes, no NUL). Returns out + 2n. */
static char *hex_put(char *out, const char *p, size_t n)
{
	static const char hex[] = "0123456789abcdef";

	for (size_t i = 0; i < n; i++) {
		*out++ = hex[(unsigned char)p[i] >> 4];
		*out++ = hex[(unsigned char)p[i] & 15];
	}
	return out;
}

/* Decodes the hex text s into out (strlen(s) / 2 bytes). Returns their
 * number. */
static size_t hex_get(const char *s, char *out)
{
	size_t n = 0;

	for (; s[0] && s[1]; s += 2) {
		int hi = s[0] <= '9' ? s[0] - '0' : (s[0] | 0x20) - 'a' + 10;
		int lo = s[1] <= '9' ? s[1] - '0' : (s[1] | 0x20) - 'a' + 10;

		out[n++] = (char)(hi << 4 | lo);
	}
	return n;
}

/*
 * .count: adds deltas[i] to the row (key, fields[i]) of lockshim_metrics
 * (made at 0), all n in one statement (sql_count: one transaction, so two
 * processes' shipments into one key lose nothing). A statement the server
 * ran whose answer was lost is sent again by the shim: it then counts
 * twice. Returns BACKEND_OK, or BACKEND_ERR with c->err.
 */
static int pg_count(struct backend_conn *c, const char *key, size_t klen, int n,
		    const char *const *fields, const size_t *flens, const long long *deltas)
{
	size_t flen = 3, dlen = 3 + 22 * (size_t)n;
	char *k, *f, *d, *p;
	const char *v[3];
	PGresult *r = NULL;
	int rc = BACKEND_ERR;

	for (int i = 0; i < n; i++)
		flen += 2 * flens[i] + 1;
	k = malloc(2 * klen + 1);
	f = malloc(flen);
	d = malloc(dlen);
	pthread_mutex_lock(&c->mu);
	if (!k || !f || !d) {
		snprintf(c->err, sizeof(c->err), "count: out of memory");
		goto out;
	}
	*hex_put(k, key, klen) = 0;
	p = f;
	*p++ = '{';
	for (int i = 0; i < n; i++) {
		if (i)
			*p++ = ',';
		p = hex_put(p, fields[i], flens[i]);
	}
	strcpy(p, "}");
	p = d;
	*p++ = '{';
	for (int i = 0; i < n; i++)
		p += snprintf(p, 22, "%s%lld", i ? "," : "", deltas[i]);
	strcpy(p, "}");
	v[0] = k;
	v[1] = n ? f : "{}";
	v[2] = n ? d : "{}";
	if (session_up(c) != BACKEND_OK ||
	    !(r = run(c, sql_count, 3, v, c->bc->spec->command_timeout_ms, "count")))
		goto out;
	if (PQresultStatus(r) == PGRES_COMMAND_OK) {
		rc = BACKEND_OK;
	} else {
		snprintf(c->err, sizeof(c->err), "count: %s", PQresultErrorMessage(r));
		c->err[strcspn(c->err, "\n")] = 0;
	}
out:
	PQclear(r);
	pthread_mutex_unlock(&c->mu);
	free(k);
	free(f);
	free(d);
	return rc;
}

/* .count_read: every row of lockshim_metrics whose key is a metrics key
 * of namespace ns ("<ns>:metrics:{<host>}"), to fn. Read-only. Returns
 * BACKEND_OK, or BACKEND_ERR with c->err. */
static int pg_count_read(struct backend_conn *c, const char *ns,
			 void (*fn)(void *arg, const char *key, size_t klen, const char *field,
				    size_t flen, long long value),
			 void *arg)
{
	char prefix[2 * (KEY_BUF_SIZE + 16) + 1], *buf = NULL;
	size_t plen = strlen(ns) + sizeof(":metrics:{") - 1, cap = 0;
	const char *v[1] = { prefix };
	PGresult *r = NULL;
	int rc = BACKEND_ERR;

	pthread_mutex_lock(&c->mu);
	if (plen > KEY_BUF_SIZE) {
		snprintf(c->err, sizeof(c->err), "metrics: namespace too long");
		goto out;
	}
	*hex_put(hex_put(prefix, ns, strlen(ns)), ":metrics:{", plen - strlen(ns)) = 0;
	if (session_up(c) != BACKEND_OK ||
	    !(r = run(c, sql_count_read, 1, v, c->bc->spec->command_timeout_ms, "metrics")))
		goto out;
	if (PQresultStatus(r) != PGRES_TUPLES_OK) {
		snprintf(c->err, sizeof(c->err), "metrics: %s", PQresultErrorMessage(r));
		c->err[strcspn(c->err, "\n")] = 0;
		goto out;
	}
	for (int i = 0; i < PQntuples(r); i++)
		if ((size_t)PQgetlength(r, i, 0) + PQgetlength(r, i, 1) > cap)
			cap = (size_t)PQgetlength(r, i, 0) + PQgetlength(r, i, 1);
	if (!(buf = malloc(cap / 2 + 1))) {
		snprintf(c->err, sizeof(c->err), "metrics: out of memory");
		goto out;
	}
	for (int i = 0; i < PQntuples(r); i++) {
		size_t kn = hex_get(PQgetvalue(r, i, 0), buf);
		size_t fn_len = hex_get(PQgetvalue(r, i, 1), buf + kn);

		if (kn > plen && buf[kn - 1] == '}')
			fn(arg, buf, kn, buf + kn, fn_len, atoll(PQgetvalue(r, i, 2)));
	}
	rc = BACKEND_OK;
out:
	PQclear(r);
	pthread_mutex_unlock(&c->mu);
	free(buf);
	return rc;
}

/* ---- holders, for `lockshim status` -------------------------------------- */

#define PG_OWNER_MAX (BACKEND_VAL_MAX + 24)

/* Writes into out (PG_OWNER_MAX bytes) row i's owner record with its
 * since_ms (the second field from the end) made the row's since when it
 * has one. Returns its length: 0 when the row has none. */
static size_t owner_of(const PGresult *r, int i, char *out)
{
	const char *rec = PQgetvalue(r, i, PG_H_OWNER), *prog, *since;
	size_t n = (size_t)PQgetlength(r, i, PG_H_OWNER);

	if (PQgetisnull(r, i, PG_H_OWNER) || n > BACKEND_VAL_MAX)
		return 0;
	prog = memrchr(rec, ':', n);
	since = prog && prog > rec ? memrchr(rec, ':', (size_t)(prog - rec)) : NULL;
	if (!since || PQgetisnull(r, i, PG_H_SINCE)) {
		memcpy(out, rec, n);
		return n;
	}
	return (size_t)snprintf(out, PG_OWNER_MAX, "%.*s:%s%.*s", (int)(since - rec), rec,
				PQgetvalue(r, i, PG_H_SINCE), (int)(n - (size_t)(prog - rec)), prog);
}

/* Reports the holders of rows [i, j) of r (one key) to fn: each granted
 * row, the first with the waiters (the other rows, their records in
 * vals[i..j), wval, wlen). */
static void key_report(const PGresult *r, int i, int j, char *vals, const char **wval,
		       size_t *wlen, void (*fn)(void *arg, const struct backend_holder *h),
		       void *arg)
{
	struct backend_holder h = { .key = PQgetvalue(r, i, PG_H_KEY), .fence = -1,
				    .lease_left_ms = -1, .wval = wval, .wlen = wlen };
	int nw = 0, first = 1;

	h.klen = (size_t)PQgetlength(r, i, PG_H_KEY);
	for (int k = i; k < j; k++)
		if (PQgetvalue(r, k, PG_H_GRANTED)[0] != 't') {
			wval[nw] = vals + (size_t)k * PG_OWNER_MAX;
			wlen[nw++] = owner_of(r, k, vals + (size_t)k * PG_OWNER_MAX);
		}
	for (int k = i; k < j; k++) {
		int lim = atoi(PQgetvalue(r, k, PG_H_LIMIT)), excl;

		if (PQgetvalue(r, k, PG_H_GRANTED)[0] != 't')
			continue;
		excl = strcmp(PQgetvalue(r, k, PG_H_MODE), "ExclusiveLock") == 0;
		h.val = vals + (size_t)k * PG_OWNER_MAX;
		h.vlen = owner_of(r, k, vals + (size_t)k * PG_OWNER_MAX);
		h.since_ms = PQgetisnull(r, k, PG_H_SINCE) ? 0 : atoll(PQgetvalue(r, k, PG_H_SINCE));
		h.limit = lim > 1 ? lim : 1;
		h.shared = !excl && lim < 2;
		h.in_set = !excl;
		h.nwaiters = first ? nw : 0;
		first = 0;
		fn(arg, &h);
	}
}

/*
 * .holders: the advisory locks of this database whose ids are named keys
 * (sql_holders: lockshim_keys joined with pg_locks), each holder in key
 * order with the key's waiters given with its first (a permit's waiter
 * while it blocks on a permit); the value is the session's owner record with since
 * (empty when the session wrote none: status skips it, metrics counts
 * it); no fence and no lease known (-1). Read-only. Returns BACKEND_OK,
 * or BACKEND_ERR with c->err.
 */
static int pg_holders(struct backend_conn *c,
		      void (*fn)(void *arg, const struct backend_holder *h), void *arg)
{
	PGresult *r = NULL;
	char *vals = NULL;
	const char **wval = NULL;
	size_t *wlen = NULL;
	int rc = BACKEND_ERR, n;

	pthread_mutex_lock(&c->mu);
	if (session_up(c) != BACKEND_OK ||
	    !(r = run(c, sql_holders, 0, NULL, c->bc->spec->command_timeout_ms, "status")))
		goto out;
	if (PQresultStatus(r) != PGRES_TUPLES_OK) {
		snprintf(c->err, sizeof(c->err), "status: %s", PQresultErrorMessage(r));
		c->err[strcspn(c->err, "\n")] = 0;
		goto out;
	}
	n = PQntuples(r);
	vals = malloc((size_t)n * PG_OWNER_MAX + 1);
	wval = calloc((size_t)n + 1, sizeof(*wval));
	wlen = calloc((size_t)n + 1, sizeof(*wlen));
	if (!vals || !wval || !wlen) {
		snprintf(c->err, sizeof(c->err), "status: out of memory");
		goto out;
	}
	for (int i = 0, j; i < n; i = j) {
		for (j = i + 1; j < n && !strcmp(PQgetvalue(r, j, PG_H_KEY),
						 PQgetvalue(r, i, PG_H_KEY)); j++)
			;
		key_report(r, i, j, vals, wval, wlen, fn, arg);
	}
	rc = BACKEND_OK;
out:
	PQclear(r);
	pthread_mutex_unlock(&c->mu);
	free(vals);
	free(wval);
	free(wlen);
	return rc;
}

/* Returns the length of the owner record rec[0..n) without its since
 * field (owner_of puts the session's last statement's start there), its
 * program part moved up in place. */
static size_t owner_no_since(char *rec, size_t n)
{
	char *prog = memrchr(rec, ':', n), *since;

	since = prog && prog > rec ? memrchr(rec, ':', (size_t)(prog - rec)) : NULL;
	if (!since)
		return n;
	memmove(since, prog, n - (size_t)(prog - rec));
	return n - (size_t)(prog - since);
}

/* Returns the server pid of the session holding it's key with it's value
 * (as pg_holders reports them; the since field, which moves with the
 * session's statements, aside), 0 when none does, -1 with c->err. Holds
 * c->mu. */
static int holder_pid(struct backend_conn *c, const struct backend_item *it)
{
	char val[PG_OWNER_MAX + 1], want[BACKEND_VAL_MAX + 1];
	size_t wlen = it->vlen < sizeof(want) ? it->vlen : sizeof(want) - 1;
	PGresult *r;
	int pid = 0;

	memcpy(want, it->val, wlen);
	wlen = owner_no_since(want, wlen);
	if (session_up(c) != BACKEND_OK ||
	    !(r = run(c, sql_holders, 0, NULL, c->bc->spec->command_timeout_ms, "unlock")))
		return -1;
	if (PQresultStatus(r) != PGRES_TUPLES_OK) {
		snprintf(c->err, sizeof(c->err), "unlock: %s", PQresultErrorMessage(r));
		c->err[strcspn(c->err, "\n")] = 0;
		PQclear(r);
		return -1;
	}
	for (int i = 0; i < PQntuples(r) && !pid; i++)
		if ((size_t)PQgetlength(r, i, PG_H_KEY) == it->klen &&
		    !memcmp(PQgetvalue(r, i, PG_H_KEY), it->key, it->klen) &&
		    PQgetvalue(r, i, PG_H_GRANTED)[0] == 't' &&
		    owner_no_since(val, owner_of(r, i, val)) == wlen && !memcmp(val, want, wlen))
			pid = atoi(PQgetvalue(r, i, PG_H_PID));
	PQclear(r);
	return pid;
}

/*
 * .remove (lockshim unlock): an advisory lock can be given back only by
 * its session, so the session holding it's key with it's value is ended
 * (pg_terminate_backend, waited for up to command_timeout_ms): every lock
 * it holds goes, their keys written to also. Its holder finds the session
 * gone at its next renewal (on_lost). Returns BACKEND_OK, BACKEND_NO (no
 * such holder any more) or BACKEND_ERR with c->err (a role that may not
 * end the session: the server's words).
 */
static int pg_remove(struct backend_conn *c, const struct backend_item *it, char *also,
		     size_t alen)
{
	char pid[16], wait[24];
	const char *v[3];
	PGresult *r;
	int rc = BACKEND_ERR, p;

	also[0] = 0;
	pthread_mutex_lock(&c->mu);
	if ((p = holder_pid(c, it)) <= 0) {
		pthread_mutex_unlock(&c->mu);
		return p ? BACKEND_ERR : BACKEND_NO;
	}
	snprintf(pid, sizeof(pid), "%d", p);
	snprintf(wait, sizeof(wait), "%d", c->bc->spec->command_timeout_ms);
	v[0] = pid;
	v[1] = key_text(c, it);
	v[2] = wait;
	if (!(r = run(c, sql_remove_also, 2, v, c->bc->spec->command_timeout_ms, "unlock")))
		goto out;
	if (rows_ok(c, r, "unlock") && !PQgetisnull(r, 0, 0))
		snprintf(also, alen, "%s", PQgetvalue(r, 0, 0));
	PQclear(r);
	if (!(r = run(c, sql_remove, 3, v, 2LL * c->bc->spec->command_timeout_ms, "unlock")))
		goto out;
	if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 0)
		rc = BACKEND_NO;
	else if (rows_ok(c, r, "unlock: pg_terminate_backend"))
		rc = PQgetvalue(r, 0, 0)[0] == 't' ? BACKEND_OK : BACKEND_ERR;
	if (rc == BACKEND_ERR && PQresultStatus(r) == PGRES_TUPLES_OK)
		snprintf(c->err, sizeof(c->err), "unlock: the session of server pid %d did not "
			 "end within %d ms", p, c->bc->spec->command_timeout_ms);
	PQclear(r);
out:
	pthread_mutex_unlock(&c->mu);
	return rc;
}

static const struct backend_ops pg_ops = {
	.name = "postgres",
	/* a waiter's one blocking pg_advisory_lock ends at the release: it is
	 * not sent again every retry_max_ms (and keeps its place in the
	 * server's queue); a caller refused once leaves nothing queued */
	.watched = 1,
	/* an overrun lock goes at once, on its session; its other locks stay */
	.overrun_release = 1,
	.store = "PostgreSQL",
	/* .settings: the core's group (backend_init sets it in its copy) */
	.serves = pg_serves,
	.config_new = pg_config_new,
	.config_free = pg_config_free,
	.open = pg_open,
	.describe = pg_describe,
	.close = pg_close,
	.acquire = pg_acquire,
	.release = pg_release,
	.wait = pg_wait,
	.leave = pg_leave,
	.flush = pg_flush,
	.unconfirmed = pg_unconfirmed,
	.renew = pg_renew,
	.count = pg_count,
	.count_read = pg_count_read,
	.errstr = pg_errstr,
	.ping = pg_ping,
	.holders = pg_holders,
	.remove = pg_remove,
};

__attribute__((visibility("default")))
const struct backend_module lockshim_backend_postgres = {
	.abi = BACKEND_MODULE_ABI,
	.ops = &pg_ops,
	.bind = pg_bind,
};
