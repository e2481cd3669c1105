/* SPDX-License-Identifier: MIT */
/*
 * metrics.c - `lockshim metrics [-c FILE] [--listen HOST:PORT]`: every
 * host's counts and the locks held and waited for now, in the Prometheus
 * text format (common/metrics.h writes it). A scrape reads each node
 * (Cluster primaries, Redlock masters, else the server) with SCAN
 * "<namespace>:*" by type (never KEYS): hashes "<namespace>:metrics:{<host>}"
 * (HLEN, then HGETALL, or HSCAN pages past 4096 fields), strings (lock
 * keys; ":due" skipped) and sorted sets "<key>:q" (ZCARD: waiters). Rows
 * (lock, host) are summed through a hash table, sorted once at the end; a
 * key on several masters counts once; its lock name is the symbol of the
 * first lock whose key template, as a glob, matches, else the key without
 * the namespace. Another backend is read through its table (.count_read,
 * .holders). --listen serves GET /metrics (HTTP/1.0, a fresh scrape per
 * request) until SIGTERM or SIGINT. Exit: 0, 64, 69 unreachable, 78.
 */
#include <errno.h>
#include <fnmatch.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "backend.h"
#include "backend_redis.h"
#include "backend_redis_conf.h"
#include "cli.h"
#include "conf.h"
#include "key.h"
#include "log.h"
#include "metrics.h"
#include "util.h"

#define SCAN_COUNT "1000"
#define HGETALL_FIELDS_MAX 4096 /* half backend_redis.c's 16384 elements of a reply:
				 * room for fields added after HLEN */
#define HSCAN_COUNT "2048"      /* fields a page (a hint: a few more may come) */
#define REQUEST_MAX 8192

int cmd_metrics(int argc, char **argv);

/*
 * An index of an array's entries by their bytes (open addressing, linear
 * probing, at most half full): a slot holds an entry's hash and its index
 * + 1 (0: empty). The entries stay in the array; a lookup is O(1) expected
 * where a walk of the array was O(n) (20 000 locks took seconds).
 */
struct index_slot {
	uint64_t hash;
	size_t at;
};

struct index {
	struct index_slot *slot;
	size_t cap, n; /* cap: a power of two, or 0 */
};

/* What one scrape found. Strings are owned (malloc). */
struct scrape {
	struct metrics_row *rows;
	size_t nrows, rcap;
	struct index rindex; /* rows by (lock, host), until they are sorted */
	struct keyent *keys;
	size_t nkeys, kcap;
	char err[512];
};

/* A key of the namespace seen on a node: held (a lock key) or waited for. */
struct keyent {
	char *key;
	long long held, waiting;
};

/* Writes s into out with fnmatch's special characters escaped; returns
 * the end. out has room for 2 * strlen(s) + 1 bytes. */
static char *glob_escape(char *out, const char *s, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		if (strchr("*?[]\\", s[i]))
			*out++ = '\\';
		*out++ = s[i];
	}
	*out = 0;
	return out;
}

/* Returns key template t as a glob (malloc'd: literal text escaped, '*'
 * for a placeholder), or NULL. */
static char *tmpl_glob(const struct key_tmpl *t)
{
	size_t cap = 2 * t->prefix_len + 4;
	char *g, *p;

	for (int i = 0; i < t->nsegs; i++)
		cap += t->segs[i].kind == KEY_SEG_LIT || t->segs[i].kind == KEY_SEG_VAL ?
		       2 * t->segs[i].len + 1 : 1;
	if (!(g = malloc(cap)))
		return NULL;
	p = glob_escape(g, t->prefix, t->prefix_len);
	for (int i = 0; i < t->nsegs; i++) {
		const struct key_seg *sg = &t->segs[i];

		/* a value with a byte key.c encodes ({host}, {env:NAME}): any text */
		if (sg->kind == KEY_SEG_LIT || (sg->kind == KEY_SEG_VAL &&
						strcspn(sg->lit, "%:{}~") >= sg->len))
			p = glob_escape(p, sg->lit, sg->len);
		else if (p == g || p[-1] != '*')
			*p++ = '*';
	}
	if (t->tagged)
		*p++ = '}';
	*p = 0;
	return g;
}

/* Returns key's lock name (malloc'd): the symbol of the first lock one of
 * whose templates (globs[i * CONF_KEYS_MAX + j], j < its nkeys) matches it,
 * else the key without "<ns>:" and a Cluster's braces. */
static char *lock_name(const struct conf *cfg, char *const *globs, const char *key)
{
	size_t nl = strlen(cfg->ns), n;
	const char *k = key;

	for (int i = 0; i < cfg->nlocks; i++)
		for (int j = 0; j < cfg->locks[i].nkeys; j++)
			if (globs[i * CONF_KEYS_MAX + j] &&
			    fnmatch(globs[i * CONF_KEYS_MAX + j], key, 0) == 0)
				return strdup(cfg->locks[i].symbol);
	if (strncmp(k, cfg->ns, nl) == 0 && k[nl] == ':')
		k += nl + 1;
	n = strlen(k);
	if (n >= 2 && k[0] == '{' && k[n - 1] == '}')
		return strndup(k + 1, n - 2);
	return strdup(k);
}

/* Returns the slot of ix where hash h's entry is, as told by eq(ctx, its
 * array index), or the empty slot where it goes; NULL when ix has no room
 * for one more entry and cannot grow (out of memory). */
static struct index_slot *index_find(struct index *ix, uint64_t h,
				     int (*eq)(const void *ctx, size_t at), const void *ctx)
{
	size_t i;

	if (2 * (ix->n + 1) > ix->cap) { /* grown before the search: the slot stays good */
		size_t cap = ix->cap ? 2 * ix->cap : 64;
		struct index_slot *t = calloc(cap, sizeof(*t));

		if (!t)
			return NULL;
		for (size_t j = 0; j < ix->cap; j++) {
			if (!ix->slot[j].at)
				continue;
			for (i = ix->slot[j].hash & (cap - 1); t[i].at; i = (i + 1) & (cap - 1))
				;
			t[i] = ix->slot[j];
		}
		free(ix->slot);
		ix->slot = t;
		ix->cap = cap;
	}
	for (i = h & (ix->cap - 1); ix->slot[i].at; i = (i + 1) & (ix->cap - 1))
		if (ix->slot[i].hash == h && eq(ctx, ix->slot[i].at - 1))
			break;
	return &ix->slot[i];
}

/* Records array index at in the empty slot sl (index_find's) of hash h. */
static void index_put(struct index *ix, struct index_slot *sl, uint64_t h, size_t at)
{
	sl->hash = h;
	sl->at = at + 1;
	ix->n++;
}

static void index_free(struct index *ix)
{
	free(ix->slot);
	memset(ix, 0, sizeof(*ix));
}

/* The (lock, host) a row is looked up by. */
struct row_key {
	const struct scrape *s;
	const char *lock, *host;
	size_t llen;
};

static int row_eq(const void *ctx, size_t at)
{
	const struct row_key *k = ctx;
	const struct metrics_row *r = &k->s->rows[at];

	return strlen(r->lock) == k->llen && !memcmp(r->lock, k->lock, k->llen) &&
	       !strcmp(r->host, k->host);
}

/* Returns the row of (lock, host), added when new; NULL when out of memory. */
static struct metrics_row *row_get(struct scrape *s, const char *lock, size_t llen,
				   const char *host)
{
	struct row_key k = { s, lock, host, llen };
	uint64_t h = util_fnv1a64(util_fnv1a64(UTIL_FNV1A64_START, host, strlen(host) + 1), lock,
				  llen);
	struct index_slot *sl = index_find(&s->rindex, h, row_eq, &k);
	struct metrics_row *r;

	if (!sl)
		return NULL;
	if (sl->at)
		return &s->rows[sl->at - 1];
	if (s->nrows == s->rcap) {
		size_t cap = s->rcap ? 2 * s->rcap : 16;
		void *p = realloc(s->rows, cap * sizeof(*s->rows));

		if (!p)
			return NULL;
		s->rows = p;
		s->rcap = cap;
	}
	r = &s->rows[s->nrows];
	memset(r, 0, sizeof(*r));
	r->lock = strndup(lock, llen);
	r->host = strdup(host);
	if (!r->lock || !r->host) {
		free((char *)r->lock);
		free((char *)r->host);
		return NULL;
	}
	index_put(&s->rindex, sl, h, s->nrows++);
	return r;
}

/* Records key[0..len) as seen with held locks and waiting callers.
 * Returns 0 or -1 (out of memory). */
static int key_add(struct scrape *s, const char *key, size_t len, long long held,
		   long long waiting)
{
	if (s->nkeys == s->kcap) {
		size_t cap = s->kcap ? 2 * s->kcap : 64;
		void *p = realloc(s->keys, cap * sizeof(*s->keys));

		if (!p)
			return -1;
		s->keys = p;
		s->kcap = cap;
	}
	if (!(s->keys[s->nkeys].key = strndup(key, len)))
		return -1;
	s->keys[s->nkeys].held = held;
	s->keys[s->nkeys++].waiting = waiting;
	return 0;
}

/* Frees what s owns and zeroes it. */
static void scrape_free(struct scrape *s)
{
	for (size_t i = 0; i < s->nrows; i++) {
		free((char *)s->rows[i].lock);
		free((char *)s->rows[i].host);
	}
	for (size_t i = 0; i < s->nkeys; i++)
		free(s->keys[i].key);
	free(s->rows);
	free(s->keys);
	index_free(&s->rindex);
	memset(s, 0, sizeof(*s));
}

/* Runs a command on c; returns its reply (the caller frees it) or NULL
 * with s->err set (an error reply too). */
static redisReply *command(struct backend_conn *c, struct scrape *s, const char *node,
			   int argc, const char *const *argv)
{
	redisReply *r = backend_redis_command(c, argc, argv);

	if (r && r->type != REDIS_REPLY_ERROR)
		return r;
	snprintf(s->err, sizeof(s->err), "%s: %s: %s", node, argv[0],
		 r ? r->str : backend_redis_errstr(c));
	if (r)
		freeReplyObject(r);
	return NULL;
}

/* Returns whether key (len bytes) is a host's counts, "<ns>:metrics:{<host>}",
 * with the host written into host (cap bytes). */
static int host_of(const char *ns, const char *key, size_t len, char *host, size_t cap)
{
	char mprefix[KEY_MAX_NAMESPACE + 16];
	size_t mlen = (size_t)snprintf(mprefix, sizeof(mprefix), "%s:metrics:{", ns);

	if (len <= mlen || memcmp(key, mprefix, mlen) != 0 || key[len - 1] != '}' ||
	    memchr(key + mlen, '}', len - mlen - 1) || len - mlen > cap)
		return 0;
	snprintf(host, cap, "%.*s", (int)(len - mlen - 1), key + mlen);
	return 1;
}

/* Adds value to the row of field (flen bytes) of host; a field of no known
 * value is skipped. Returns 0 or -1 (out of memory, in s->err). */
static int row_add(struct scrape *s, const char *host, const char *field, size_t flen,
		   unsigned long long value)
{
	struct metrics_row *row;
	size_t llen;
	int idx = metrics_parse_field(field, flen, &llen);

	if (idx < 0)
		return 0;
	if (!(row = row_get(s, field, llen, host))) {
		snprintf(s->err, sizeof(s->err), "out of memory");
		return -1;
	}
	row->v[idx] += value;
	return 0;
}

/* A field of a hash read by pages: its bytes (owned) and value. */
struct hfield {
	char *f;
	size_t len;
	unsigned long long v;
};

static int cmp_hfield(const void *a, const void *b)
{
	const struct hfield *x = a, *y = b;
	int d = memcmp(x->f, y->f, x->len < y->len ? x->len : y->len);

	return d ? d : (x->len > y->len) - (x->len < y->len);
}

/* Appends the fields of reply r (field, value, ...) to *fs (*n of *cap
 * used; each f owned). Returns 0, or -1 when out of memory (*n: those
 * appended). */
static int hfields_add(struct hfield **fs, size_t *n, size_t *cap, const redisReply *r)
{
	for (size_t i = 0; r->type == REDIS_REPLY_ARRAY && i + 1 < r->elements; i += 2) {
		const redisReply *f = r->element[i], *v = r->element[i + 1];
		struct hfield *h;

		if (f->type != REDIS_REPLY_STRING || v->type != REDIS_REPLY_STRING)
			continue;
		if (*n == *cap) {
			size_t c = *cap ? 2 * *cap : 1024;
			void *p = realloc(*fs, c * sizeof(**fs));

			if (!p)
				return -1;
			*fs = p;
			*cap = c;
		}
		h = &(*fs)[*n];
		if (!(h->f = malloc(f->len ? f->len : 1)))
			return -1;
		memcpy(h->f, f->str, f->len);
		h->len = f->len;
		h->v = strtoull(v->str, NULL, 10);
		(*n)++;
	}
	return 0;
}

/*
 * Adds the counts of hash key (of host) on c to s by HSCAN pages, a field
 * HSCAN returns twice (a rehash between pages) counted once: a hash too
 * large for one HGETALL reply (backend_redis.c takes 16384 elements in an
 * array). Returns 0 or -1.
 */
static int read_hash_paged(struct backend_conn *c, struct scrape *s, const char *node,
			   const char *key, const char *host)
{
	char cursor[32] = "0";
	struct hfield *fs = NULL;
	size_t n = 0, cap = 0;
	int rc = 0;

	do {
		const char *argv[] = { "HSCAN", key, cursor, "COUNT", HSCAN_COUNT };
		redisReply *r = command(c, s, node, 5, argv);

		if (!r) {
			rc = -1;
			break;
		}
		if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
		    r->element[0]->type != REDIS_REPLY_STRING) {
			snprintf(s->err, sizeof(s->err), "%s: HSCAN: unexpected reply", node);
			rc = -1;
		} else {
			snprintf(cursor, sizeof(cursor), "%s", r->element[0]->str);
			if (hfields_add(&fs, &n, &cap, r->element[1]) != 0) {
				snprintf(s->err, sizeof(s->err), "out of memory");
				rc = -1;
			}
		}
		freeReplyObject(r);
	} while (rc == 0 && strcmp(cursor, "0") != 0);
	if (rc == 0)
		qsort(fs, n, sizeof(*fs), cmp_hfield);
	for (size_t i = 0; i < n && rc == 0; i++)
		if (i == 0 || cmp_hfield(&fs[i - 1], &fs[i]) != 0)
			rc = row_add(s, host, fs[i].f, fs[i].len, fs[i].v);
	for (size_t i = 0; i < n; i++)
		free(fs[i].f);
	free(fs);
	return rc;
}

/* Adds the counts of hash key (of host) on c to s: HGETALL, or by pages
 * when it has more fields than one reply may hold. Returns 0 or -1. */
static int read_hash(struct backend_conn *c, struct scrape *s, const char *node,
		     const char *key, const char *host)
{
	const char *argv[] = { "HGETALL", key }, *hlen[] = { "HLEN", key };
	redisReply *r = command(c, s, node, 2, hlen);
	long long fields;

	if (!r)
		return -1;
	fields = r->type == REDIS_REPLY_INTEGER ? r->integer : 0;
	freeReplyObject(r);
	if (fields > HGETALL_FIELDS_MAX)
		return read_hash_paged(c, s, node, key, host);
	if (!(r = command(c, s, node, 2, argv)))
		return -1;
	for (size_t i = 0; r->type == REDIS_REPLY_ARRAY && i + 1 < r->elements; i += 2) {
		const redisReply *f = r->element[i], *v = r->element[i + 1];

		if (f->type != REDIS_REPLY_STRING || v->type != REDIS_REPLY_STRING)
			continue;
		if (row_add(s, host, f->str, f->len, strtoull(v->str, NULL, 10)) != 0) {
			freeReplyObject(r);
			return -1;
		}
	}
	freeReplyObject(r);
	return 0;
}

/* Returns whether key (len bytes) is "<ns>:" + at least one byte + suffix:
 * an auxiliary key of a lock key (key.c never lets a lock key's own text
 * end so; "<ns>:q" alone is the lock key "q"). */
static int aux_of_lock(const char *key, size_t len, size_t nslen, const char *suffix)
{
	size_t n = strlen(suffix);

	return len > nslen + 1 + n && !memcmp(key + len - n, suffix, n);
}

/* Handles one key of type type ("string", "zset" or "hash") found by SCAN
 * on node c. Returns 0 or -1. */
static int one_key(struct backend_conn *c, struct scrape *s, const char *node,
		   const char *ns, const char *type, const char *key, size_t len)
{
	size_t nslen = strlen(ns);

	if (type[0] == 'h') { /* a host's counts; a fence hash is not a host's */
		char host[256];

		if (!host_of(ns, key, len, host, sizeof(host)))
			return 0;
		return read_hash(c, s, node, key, host);
	}
	if (type[0] == 'z') { /* a lock's queue of waiters, or a holder set */
		const char *argv[] = { "ZCARD", key };
		int queue = aux_of_lock(key, len, nslen, ":q");
		long long n;
		redisReply *r;

		if (!queue && aux_of_lock(key, len, nslen, ":qx"))
			return 0;
		if (!(r = command(c, s, node, 2, argv)))
			return -1;
		n = r->type == REDIS_REPLY_INTEGER ? r->integer : 0;
		freeReplyObject(r);
		return queue ? key_add(s, key, len - 2, 0, n) : key_add(s, key, len, n, 0);
	}
	if (aux_of_lock(key, len, nslen, ":due"))
		return 0;
	return key_add(s, key, len, 1, 0); /* a lock key: a string */
}

/* SCANs node c for the keys "<ns>:*" of type type and reads what it finds
 * into s. Returns 0 or -1. */
static int scan_type(struct backend_conn *c, struct scrape *s, const char *node,
		     const char *ns, const char *type)
{
	char cursor[32] = "0", match[2 * KEY_MAX_NAMESPACE + 4];

	strcpy(glob_escape(match, ns, strlen(ns)), ":*");
	do {
		const char *argv[] = { "SCAN", cursor, "MATCH", match, "COUNT", SCAN_COUNT,
				       "TYPE", type };
		redisReply *r = command(c, s, node, 8, argv);
		const redisReply *keys;

		if (!r)
			return -1;
		if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
		    r->element[0]->type != REDIS_REPLY_STRING ||
		    r->element[1]->type != REDIS_REPLY_ARRAY) {
			snprintf(s->err, sizeof(s->err), "%s: SCAN: unexpected reply", node);
			freeReplyObject(r);
			return -1;
		}
		snprintf(cursor, sizeof(cursor), "%s", r->element[0]->str);
		keys = r->element[1];
		for (size_t i = 0; i < keys->elements; i++) {
			const redisReply *k = keys->element[i];

			if (k->type == REDIS_REPLY_STRING &&
			    one_key(c, s, node, ns, type, k->str, k->len) != 0) {
				freeReplyObject(r);
				return -1;
			}
		}
		freeReplyObject(r);
	} while (strcmp(cursor, "0") != 0);
	return 0;
}

/* Reads node c: the hosts' counts (hashes), the lock keys (strings) and
 * their queues (sorted sets). Returns 0 or -1. */
static int read_node(struct backend_conn *c, struct scrape *s, const char *node,
		     const char *ns)
{
	static const char *const types[] = { "hash", "string", "zset" };

	for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++)
		if (scan_type(c, s, node, ns, types[i]) != 0)
			return -1;
	return 0;
}

/* ---- a backend that is not Redis's: its .count_read and .holders ------- */

/* What the store callbacks fill: the scrape, the namespace, a failure. */
struct store_read {
	struct scrape *s;
	const char *ns;
	int failed;
};

static void store_value(void *arg, const char *key, size_t klen, const char *field,
			size_t flen, long long value)
{
	struct store_read *r = arg;
	char host[256];

	if (!r->failed && value > 0 && host_of(r->ns, key, klen, host, sizeof(host)) &&
	    row_add(r->s, host, field, flen, (unsigned long long)value) != 0)
		r->failed = 1;
}

/* One key per holder, in key order: a set's holders add up on its entry. */
static void store_holder(void *arg, const struct backend_holder *h)
{
	struct store_read *r = arg;
	struct keyent *last = r->s->nkeys ? &r->s->keys[r->s->nkeys - 1] : NULL;

	if (r->failed)
		return;
	if (last && strlen(last->key) == h->klen && !memcmp(last->key, h->key, h->klen)) {
		last->held++;
		last->waiting = h->nwaiters > last->waiting ? h->nwaiters : last->waiting;
	} else if (key_add(r->s, h->key, h->klen, 1, h->nwaiters) != 0) {
		snprintf(r->s->err, sizeof(r->s->err), "out of memory");
		r->failed = 1;
	}
}

/* Reads b's store into s: the hosts' counts (.count_read), and the locks
 * held and waited for (.holders, where the backend lists them). Returns 0
 * or -1 (s->err). */
static int read_store(const struct backend *b, const struct conf *cfg, struct scrape *s)
{
	struct backend_conn *c = backend_open(b, s->err, sizeof(s->err));
	struct store_read r = { s, cfg->ns, 0 };

	if (!c)
		return -1;
	if (b->ops->count_read(c, cfg->ns, store_value, &r) != BACKEND_OK ||
	    (!r.failed && b->ops->holders &&
	     b->ops->holders(c, store_holder, &r) != BACKEND_OK)) {
		if (!r.failed)
			snprintf(s->err, sizeof(s->err), "%s", b->ops->errstr(c));
		r.failed = 1;
	}
	b->ops->close(c);
	return r.failed ? -1 : 0;
}

/*
 * Reads every node of b into s. Redlock: a master that does not answer is
 * left out (said on stderr) while one does; elsewhere every node must.
 * Returns 0 or -1 (s->err).
 */
static int read_all(const struct backend *b, const struct conf *cfg, struct scrape *s)
{
	struct backend_conn *top = backend_open(b, s->err, sizeof(s->err));
	int n, answered = 0, rc = 0, tolerant = !strcmp(b->ops->name, "redlock");

	if (!top)
		return -1;
	if (!b->ops->node_count || !b->ops->node_open) {
		rc = read_node(top, s, "redis", cfg->ns);
		b->ops->close(top);
		return rc;
	}
	n = b->ops->node_count(b->cfg);
	for (int i = 0; i < n && rc == 0; i++) {
		char name[256], tag[32], err[256];
		struct backend_conn *c = b->ops->node_open(b->cfg, i, name, sizeof(name), tag,
							   sizeof(tag), err, sizeof(err));

		if (!c)
			snprintf(s->err, sizeof(s->err), "node %d: %s", i, err);
		else if (read_node(c, s, name, cfg->ns) == 0)
			answered++;
		if (c)
			backend_redis.close(c);
		if (answered < i + 1 && !tolerant)
			rc = -1;
		else if (answered < i + 1)
			log_stderr("metrics: %s; left out", s->err);
	}
	b->ops->close(top);
	return rc == 0 && answered > 0 ? 0 : -1;
}

/* qsort orders: keys, rows by (lock, host), gauges by lock. */
static int cmp_key(const void *a, const void *b)
{
	return strcmp(((const struct keyent *)a)->key, ((const struct keyent *)b)->key);
}

static int cmp_row(const void *a, const void *b)
{
	const struct metrics_row *x = a, *y = b;
	int d = strcmp(x->lock, y->lock);

	return d ? d : strcmp(x->host, y->host);
}

static int cmp_gauge(const void *a, const void *b)
{
	return strcmp(((const struct metrics_gauge *)a)->lock,
		      ((const struct metrics_gauge *)b)->lock);
}

/* The lock name a gauge is looked up by. */
struct gauge_key {
	const struct metrics_gauge *g;
	const char *name;
};

static int gauge_eq(const void *ctx, size_t at)
{
	const struct gauge_key *k = ctx;

	return !strcmp(k->g[at].lock, k->name);
}

/*
 * Turns s's keys into gauges per lock name (a key seen on several nodes,
 * Redlock's masters, counted once: the largest). Returns them (the caller
 * frees each lock and the array) and their count in *n, or NULL when out
 * of memory with *n 0 (also when there is none).
 */
static struct metrics_gauge *gauges(const struct conf *cfg, struct scrape *s, size_t *n)
{
	char **globs = calloc(((size_t)cfg->nlocks + 1) * CONF_KEYS_MAX, sizeof(*globs));
	struct metrics_gauge *g = calloc(s->nkeys + 1, sizeof(*g));
	struct index byname = { 0 }; /* g by lock name */
	size_t ng = 0;

	*n = 0;
	if (!globs || !g) {
		free(globs);
		free(g);
		return NULL;
	}
	for (int i = 0; i < cfg->nlocks; i++)
		for (int j = 0; j < cfg->locks[i].nkeys; j++)
			globs[i * CONF_KEYS_MAX + j] = tmpl_glob(conf_key(&cfg->locks[i], j));
	qsort(s->keys, s->nkeys, sizeof(*s->keys), cmp_key);
	for (size_t i = 0; i < s->nkeys;) {
		long long held = 0, waiting = 0;
		size_t j = i;
		char *name;

		for (; j < s->nkeys && !strcmp(s->keys[j].key, s->keys[i].key); j++) {
			held = s->keys[j].held > held ? s->keys[j].held : held;
			waiting = s->keys[j].waiting > waiting ? s->keys[j].waiting : waiting;
		}
		if ((name = lock_name(cfg, globs, s->keys[i].key)) != NULL) {
			struct gauge_key gk = { g, name };
			uint64_t h = util_fnv1a64(UTIL_FNV1A64_START, name, strlen(name));
			struct index_slot *sl = index_find(&byname, h, gauge_eq, &gk);
			size_t k = sl && sl->at ? sl->at - 1 : ng;

			if (!sl) {
				free(name); /* out of memory: left out, as lock_name's NULL */
				i = j;
				continue;
			}
			if (k == ng) {
				index_put(&byname, sl, h, ng);
				g[ng++].lock = name;
			} else {
				free(name);
			}
			g[k].held += held;
			g[k].waiting += waiting;
		}
		i = j;
	}
	for (int i = 0; i < cfg->nlocks * CONF_KEYS_MAX; i++)
		free(globs[i]);
	free(globs);
	index_free(&byname);
	qsort(g, ng, sizeof(*g), cmp_gauge);
	*n = ng;
	return g;
}

/* Scrapes every node and writes the text to f. Returns 0, or -1 with the
 * reason in err. */
static int scrape_write(const struct backend *b, const struct conf *cfg, FILE *f, char *err,
			size_t errlen)
{
	struct scrape s = { 0 };
	struct metrics_gauge *g;
	size_t ng;

	if ((b->ops->count_read ? read_store(b, cfg, &s) : read_all(b, cfg, &s)) != 0) {
		snprintf(err, errlen, "%s", s.err);
		scrape_free(&s);
		return -1;
	}
	qsort(s.rows, s.nrows, sizeof(*s.rows), cmp_row);
	g = gauges(cfg, &s, &ng);
	metrics_write(f, s.rows, s.nrows, g, ng);
	for (size_t i = 0; i < ng; i++)
		free((char *)g[i].lock);
	free(g);
	scrape_free(&s);
	return 0;
}

/* ---- --listen ------------------------------------------------------------ */

static volatile sig_atomic_t stopping;

static void on_stop(int sig)
{
	(void)sig;
	stopping = 1;
}

/* Sends n bytes of p on fd, giving up on an error (the client left). */
static void send_all(int fd, const char *p, size_t n)
{
	while (n > 0) {
		ssize_t k = send(fd, p, n, MSG_NOSIGNAL);

		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			return;
		p += k;
		n -= (size_t)k;
	}
}

/* Sends an HTTP/1.0 response: status, type and the body p[0..n). */
static void respond(int fd, const char *status, const char *type, const char *body, size_t n)
{
	char head[256];
	int h = snprintf(head, sizeof(head), "HTTP/1.0 %s\r\nContent-Type: %s\r\n"
			 "Content-Length: %zu\r\nConnection: close\r\n\r\n", status, type, n);

	send_all(fd, head, (size_t)h);
	send_all(fd, body, n);
}

/* Answers one request on fd: GET /metrics (a fresh scrape), else 404. */
static void serve_one(int fd, const struct backend *b, const struct conf *cfg)
{
	char req[REQUEST_MAX + 1], err[512], *body = NULL;
	struct timeval tv = { 5, 0 };
	size_t n = 0, blen = 0;
	FILE *f;

	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	while (n < REQUEST_MAX) {
		ssize_t k = recv(fd, req + n, REQUEST_MAX - n, 0);

		if (k < 0 && errno == EINTR && !stopping)
			continue;
		if (k <= 0)
			break;
		n += (size_t)k;
		req[n] = 0;
		if (strstr(req, "\r\n\r\n") || strstr(req, "\n\n"))
			break;
	}
	req[n] = 0;
	if (strncmp(req, "GET /metrics", 12) != 0 || !strchr(" ?\r\n", req[12]) || !req[12]) {
		static const char nf[] = "not found: try GET /metrics\n";

		respond(fd, "404 Not Found", "text/plain", nf, sizeof(nf) - 1);
		return;
	}
	if (!(f = open_memstream(&body, &blen))) {
		respond(fd, "500 Internal Server Error", "text/plain", "out of memory\n", 14);
		return;
	}
	if (scrape_write(b, cfg, f, err, sizeof(err)) != 0) {
		char line[sizeof(err) + 1];
		int k = snprintf(line, sizeof(line), "%s\n", err);

		fclose(f);
		respond(fd, "503 Service Unavailable", "text/plain", line, (size_t)k);
		log_stderr("metrics: %s", err);
	} else {
		fclose(f);
		respond(fd, "200 OK", "text/plain; version=0.0.4", body, blen);
	}
	free(body);
}

/* Binds addr ("HOST:PORT"). Returns the socket, or -1 (said on stderr);
 * *usage set when addr is not HOST:PORT. */
static int listen_on(const char *addr, int *usage)
{
	char host[256], port[16], shown[NI_MAXHOST + 16];
	const char *colon = strrchr(addr, ':');
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
				  .ai_flags = AI_PASSIVE | AI_NUMERICSERV };
	struct addrinfo *ai = NULL;
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);
	char h[NI_MAXHOST], p[NI_MAXSERV];
	int fd = -1, one = 1, rc;
	size_t hl;

	*usage = 0;
	if (!colon || colon == addr || !colon[1] || strlen(colon + 1) >= sizeof(port) ||
	    strspn(colon + 1, "0123456789") != strlen(colon + 1) ||
	    (hl = (size_t)(colon - addr)) >= sizeof(host)) {
		*usage = 1;
		return -1;
	}
	memcpy(host, addr, hl);
	host[hl] = 0;
	if (hl > 2 && host[0] == '[' && host[hl - 1] == ']') {
		memmove(host, host + 1, hl - 2);
		host[hl - 2] = 0;
	}
	strcpy(port, colon + 1);
	if ((rc = getaddrinfo(host, port, &hints, &ai)) != 0) {
		fprintf(stderr, "lockshim: metrics: --listen %s: %s\n", addr, gai_strerror(rc));
		return -1;
	}
	if ((fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, 0)) < 0 ||
	    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
	    bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 16) != 0 ||
	    getsockname(fd, (struct sockaddr *)&ss, &sl) != 0 ||
	    getnameinfo((struct sockaddr *)&ss, sl, h, sizeof(h), p, sizeof(p),
			NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
		fprintf(stderr, "lockshim: metrics: --listen %s: %s\n", addr, strerror(errno));
		if (fd >= 0)
			close(fd);
		freeaddrinfo(ai);
		return -1;
	}
	freeaddrinfo(ai);
	snprintf(shown, sizeof(shown), strchr(h, ':') ? "[%s]:%s" : "%s:%s", h, p);
	printf("listening on %s\n", shown);
	fflush(stdout);
	return fd;
}

/* Serves GET /metrics on ls until SIGTERM or SIGINT. Returns 0. */
static int serve(int ls, const struct backend *b, const struct conf *cfg)
{
	struct sigaction sa = { .sa_handler = on_stop };
	sigset_t block, old;

	sigemptyset(&block);
	sigaddset(&block, SIGTERM);
	sigaddset(&block, SIGINT);
	sigprocmask(SIG_BLOCK, &block, &old);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);
	while (!stopping) {
		struct pollfd pfd = { ls, POLLIN, 0 };
		int fd;

		/* the signals are let in only while waiting: none is missed */
		if (ppoll(&pfd, 1, NULL, &old) <= 0)
			continue;
		if ((fd = accept4(ls, NULL, NULL, SOCK_CLOEXEC)) < 0)
			continue;
		serve_one(fd, b, cfg);
		close(fd);
	}
	close(ls);
	return 0;
}

/* ---- the verb ------------------------------------------------------------ */

/* Prints the usage error fmt (with arg) and the verb's usage; returns 64. */
static int usage(const char *fmt, const char *arg)
{
	fputs("lockshim: ", stderr);
	fprintf(stderr, fmt, arg);
	fputs("\nusage: lockshim metrics [-c FILE] [--listen HOST:PORT]\n", stderr);
	return EX_USAGE;
}

int cmd_metrics(int argc, char **argv)
{
	const struct conf_group *groups[CONF_GROUPS_MAX + 1];
	const char *config = getenv("LOCKSHIM_CONFIG"), *listen_addr = NULL;
	struct conf cfg = { 0 };
	struct backend b = { 0 };
	char err[1024];
	int rc = 0, ls = -1, bad;

	for (int i = 2; i < argc; i++) {
		if ((!strcmp(argv[i], "-c") || !strcmp(argv[i], "--config") ||
		     !strcmp(argv[i], "--listen")) && i + 1 == argc)
			return usage("%s needs a value", argv[i]);
		if (!strcmp(argv[i], "-c") || !strcmp(argv[i], "--config"))
			config = argv[++i];
		else if (!strncmp(argv[i], "--config=", 9))
			config = argv[i] + 9;
		else if (!strcmp(argv[i], "--listen"))
			listen_addr = argv[++i];
		else if (!strncmp(argv[i], "--listen=", 9))
			listen_addr = argv[i] + 9;
		else if (argv[i][0] == '-')
			return usage("unknown option %s", argv[i]);
		else
			return usage("metrics takes no operand (%s)", argv[i]);
	}
	if (!config || !*config)
		config = CONF_DEFAULT_PATH;
	backend_conf_groups(groups, sizeof(groups) / sizeof(*groups));
	if (conf_load(&cfg, config, groups, err, sizeof(err)) != 0 ||
	    backend_init(&b, &cfg, err, sizeof(err)) != 0) {
		log_stderr("config error: %s", err);
		conf_release(&cfg);
		return CONF_EXIT_CODE;
	}
	/* counts, and a way to read them: Redis's own scan, else .count_read */
	if (!b.ops->count || (!b.ops->count_read && b.ops->settings != &backend_redis_settings)) {
		fprintf(stderr, "lockshim: metrics is not built yet for backend \"%s\"\n",
			b.ops->name);
		rc = 1;
	} else if (listen_addr) {
		ls = listen_on(listen_addr, &bad);
		if (ls < 0)
			rc = bad ? usage("--listen wants HOST:PORT, not %s", listen_addr) :
			     EX_UNAVAILABLE;
		else
			rc = serve(ls, &b, &cfg);
	} else if (scrape_write(&b, &cfg, stdout, err, sizeof(err)) != 0) {
		log_stderr("metrics: %s", err);
		rc = EX_UNAVAILABLE;
	}
	backend_release(&b);
	conf_release(&cfg);
	return rc;
}
