/* SPDX-License-Identifier: MIT */
/*
 * lockview.c - reading and printing the locks a server holds, for
 * `lockshim status` and `lockshim unlock` (see lockview.h), and their
 * option parsing and config loading.
 *
 * The nodes are the backend's own: open()'s connection (one server,
 * Sentinel's primary), else node_open() for each (Cluster primaries,
 * Redlock masters), read with backend_redis_pipeline. Keys come from SCAN
 * MATCH "<ns>:<glob>" COUNT 1000 (never KEYS); auxiliary keys and values
 * that are not lock values are skipped. Each page is one round trip: GET,
 * PTTL, HMGET <key>:f n g k l m, ZRANGE <key>:q 0 -1 per key; a second one
 * (TIME, ZRANGE <key> 0 -1 WITHSCORES, HKEYS <key>:f) for keys whose GET
 * said WRONGTYPE: holder sets, values scored by expiry, limit and mode in l
 * and m, a kept holder's mark k:<token>, one lock per member the server's
 * clock has not expired (a mark whose token is no such member is ignored:
 * the next mark written prunes it). With Redlock a
 * holder is shown when a quorum holds its value: the largest fence, the
 * shortest lease. Another backend lists its holders itself (its .holders:
 * local's held lock files, etcd's keys), matched here with fnmatch(3).
 * Nothing is written.
 */
#include "lockview.h"

#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend_redis.h"
#include "conf.h"
#include "conf_field.h"
#include "log.h"

#define SCAN_COUNT "1000"
#define ARGS_PER_KEY 15 /* GET k, PTTL k, HMGET k:f n g k l m, ZRANGE k:q 0 -1 */
#define CMDS_PER_KEY 4
#define HASH_FIELDS 5   /* n g k l m */
#define ZRANGE_ARGS 5   /* a holder set's ZRANGE k 0 -1 WITHSCORES */
#define SET_ARGS 7      /* ZRANGE_ARGS, then HKEYS k:f */
#define MARK "k:"       /* a holder set's counter field naming a kept token */
#define MARK_LEN 2
#define TOKEN_LEN 32
#define LIMIT_MAX 10000 /* the `limit` setting's range */

int lockview_open(struct lockview *lv, const struct conf *cfg, char *err, size_t errlen)
{
	int sel;

	memset(lv, 0, sizeof(*lv));
	lv->cfg = cfg;
	if (backend_init(&lv->b, cfg, err, errlen) != 0)
		return -1;
	lv->redlock = strcmp(lv->b.ops->name, "redlock") == 0;
	if (lv->redlock)
		lv->quorum = lv->b.ops->node_count(lv->b.cfg) / 2 + 1;
	sel = conf_backend_group(cfg);
	lv->tagged = sel >= 0 && cfg->groups[sel]->hash_tag &&
		     cfg->groups[sel]->hash_tag(cfg->group_data[sel]);
	return 0;
}

void lockview_close(struct lockview *lv)
{
	backend_release(&lv->b);
}

void lv_lock_free(struct lv_lock *l)
{
	free(l->waiters);
	l->waiters = NULL;
	l->nwaiters = 0;
}

void lv_set_free(struct lv_set *s)
{
	for (int i = 0; i < s->n; i++)
		lv_lock_free(&s->v[i]);
	free(s->v);
	memset(s, 0, sizeof(*s));
}

/* Appends a zeroed lock to s; returns it, or NULL out of memory. */
static struct lv_lock *set_add(struct lv_set *s)
{
	if (s->n == s->cap) {
		int cap = s->cap ? 2 * s->cap : 16;
		struct lv_lock *v = realloc(s->v, (size_t)cap * sizeof(*v));

		if (!v)
			return NULL;
		s->v = v;
		s->cap = cap;
	}
	memset(&s->v[s->n], 0, sizeof(s->v[0]));
	return &s->v[s->n++];
}

size_t lockview_key(const struct lockview *lv, const char *key, char *buf)
{
	int n = snprintf(buf, KEY_BUF_SIZE, lv->tagged ? "%s:{%s%s}" : "%s:%s%s", lv->cfg->ns,
			 lv->tagged && (!*key || *key == '}') ? "~" : "", key);

	return n > 0 && n < KEY_BUF_SIZE ? (size_t)n : 0;
}

/* Returns 1 when key[0..n) (after the namespace) is a lock's auxiliary key. */
static int auxiliary(const char *k, size_t n)
{
	static const char *const tails[] = { ":q", ":qx", ":due", ":f" };

	for (size_t i = 0; i < sizeof(tails) / sizeof(*tails); i++) {
		size_t t = strlen(tails[i]);

		if (n >= t && memcmp(k + n - t, tails[i], t) == 0)
			return 1;
	}
	return memmem(k, n, ":w:", 3) != NULL;
}

/* Returns the integer in a string or integer reply, or dflt. */
static long long reply_num(const redisReply *r, long long dflt)
{
	char *end;
	long long v;

	if (r && r->type == REDIS_REPLY_INTEGER)
		return r->integer;
	if (!r || r->type != REDIS_REPLY_STRING || r->len == 0)
		return dflt;
	v = strtoll(r->str, &end, 10);
	return *end && *end != ':' ? dflt : v;
}

/* Fills l's value val[0..vlen), its owner, since (a grant by the queue:
 * when field g of the counter hash, f, names this value's token) and kept
 * (field k names it). Returns 0, or -1 when val is no lock value. */
static int holder_info(struct lv_lock *l, const char *val, size_t vlen, const redisReply *f)
{
	const redisReply *g = NULL, *k = NULL;

	if (vlen > BACKEND_VAL_MAX || owner_parse(val, vlen, &l->owner) != 0)
		return -1;
	memcpy(l->val, val, vlen);
	l->vlen = vlen;
	l->since_ms = l->owner.since_ms;
	if (f->type == REDIS_REPLY_ARRAY && f->elements == HASH_FIELDS) {
		g = f->element[1];
		k = f->element[2];
	}
	/* g: "<token>:<ms>" of a hand-off; the grant time when it is this holder's */
	if (g && g->type == REDIS_REPLY_STRING && g->len > TOKEN_LEN + 1 &&
	    l->vlen > TOKEN_LEN && memcmp(g->str, l->val, TOKEN_LEN) == 0)
		l->since_ms = strtoll(g->str + TOKEN_LEN + 1, NULL, 10);
	l->kept = k && k->type == REDIS_REPLY_STRING && k->len == TOKEN_LEN &&
		  l->vlen > TOKEN_LEN && memcmp(k->str, l->val, TOKEN_LEN) == 0;
	return 0;
}

/* Fills l's waiters from the queue's members q (a holder set's waiter is
 * "+<value>"). Returns 0, or -1 out of memory. */
static int read_waiters(struct lv_lock *l, const redisReply *q)
{
	if (q->type != REDIS_REPLY_ARRAY || q->elements == 0)
		return 0;
	l->waiters = calloc(q->elements, sizeof(*l->waiters));
	if (!l->waiters)
		return -1;
	for (size_t i = 0; i < q->elements; i++) {
		const redisReply *w = q->element[i];
		size_t plus;

		if (w->type != REDIS_REPLY_STRING)
			continue;
		plus = w->len > 0 && w->str[0] == '+';
		if (owner_parse(w->str + plus, w->len - plus, &l->waiters[l->nwaiters]) == 0)
			l->nwaiters++;
	}
	return 0;
}

/* Fills the string lock l from the replies of its four commands (GET,
 * PTTL, HMGET, ZRANGE). Returns 1 when the key holds a lock value, 0 when
 * not, -1 out of memory. */
static int interpret(struct lv_lock *l, redisReply **r)
{
	const redisReply *f = r[2];

	if (r[0]->type != REDIS_REPLY_STRING || holder_info(l, r[0]->str, r[0]->len, f) != 0)
		return 0;
	l->lease_left_ms = r[1]->type == REDIS_REPLY_INTEGER && r[1]->integer >= 0 ?
		r[1]->integer : -1;
	l->fence = f->type == REDIS_REPLY_ARRAY && f->elements == HASH_FIELDS ?
		reply_num(f->element[0], -1) : -1;
	l->limit = 1;
	return read_waiters(l, r[3]) == 0 ? 1 : -1;
}

/* Returns 1 when GET's reply r says the key is of another type: a holder
 * set, if its members say so. */
static int wrong_type(const redisReply *r)
{
	return r->type == REDIS_REPLY_ERROR && !strncmp(r->str, "WRONGTYPE", 9);
}

/* Reads a holder set's limit and mode from its counter hash's fields l and
 * m (f: HMGET n g k l m). Returns 0, or -1 when they are not lockshim's. */
static int set_mode(const redisReply *f, int *limit, int *shared)
{
	const redisReply *m;
	long long n;

	if (f->type != REDIS_REPLY_ARRAY || f->elements != HASH_FIELDS)
		return -1;
	n = reply_num(f->element[3], 0);
	m = f->element[4];
	if (n < 1 || n > LIMIT_MAX || m->type != REDIS_REPLY_STRING || m->len != 1 ||
	    (m->str[0] != 's' && m->str[0] != 'x'))
		return -1;
	*limit = (int)n;
	*shared = m->str[0] == 's';
	return 0;
}

/* Returns TIME's reply t in ms, or -1. */
static long long time_ms(const redisReply *t)
{
	long long sec;

	if (t->type != REDIS_REPLY_ARRAY || t->elements != 2 ||
	    (sec = reply_num(t->element[0], -1)) < 0)
		return -1;
	return sec * 1000 + reply_num(t->element[1], 0) / 1000;
}

/* Returns a member's score (a decimal string) in whole ms, or -1. */
static long long score_ms(const redisReply *r)
{
	char *end;
	double v;

	if (r->type != REDIS_REPLY_STRING)
		return -1;
	v = strtod(r->str, &end);
	return end == r->str || *end || v < 0 || v > 9e15 ? -1 : (long long)v;
}

static int mark_cmp(const void *a, const void *b)
{
	return memcmp(*(const char *const *)a, *(const char *const *)b, TOKEN_LEN);
}

/*
 * Collects the tokens the counter hash's fields (HKEYS's reply h) mark
 * kept (k:<token>), sorted, in a new array (the caller frees it; its
 * strings are h's). Returns how many, or -1 out of memory.
 */
static int kept_tokens(const redisReply *h, const char ***out)
{
	int n = 0;

	*out = NULL;
	if (h->type != REDIS_REPLY_ARRAY || h->elements == 0)
		return 0;
	if (!(*out = calloc(h->elements, sizeof(**out))))
		return -1;
	for (size_t i = 0; i < h->elements; i++) {
		const redisReply *f = h->element[i];

		if (f->type == REDIS_REPLY_STRING && f->len == MARK_LEN + TOKEN_LEN &&
		    !memcmp(f->str, MARK, MARK_LEN))
			(*out)[n++] = f->str + MARK_LEN;
	}
	qsort(*out, (size_t)n, sizeof(**out), mark_cmp);
	return n;
}

/*
 * Appends to out a lock per live member of the holder set key[0..klen)
 * (ZRANGE WITHSCORES: member, expiry in ms), now_ms being the server's
 * time, kept when the counter's fields h (HKEYS) mark its token; r are the
 * key's replies of the first round (the counter hash, the queue). Returns
 * 0, or -1 out of memory.
 */
static int add_holders(const struct lockview *lv, const char *key, size_t klen,
		       const redisReply *z, const redisReply *h, long long now_ms,
		       redisReply **r, struct lv_set *out)
{
	const char **kept;
	int limit, shared, nkept;

	if (z->type != REDIS_REPLY_ARRAY || set_mode(r[2], &limit, &shared) != 0)
		return 0;
	if ((nkept = kept_tokens(h, &kept)) < 0)
		return -1;
	for (size_t i = 0; i + 1 < z->elements; i += 2) {
		const redisReply *m = z->element[i];
		long long expiry = score_ms(z->element[i + 1]);
		struct lv_lock *l;

		if (m->type != REDIS_REPLY_STRING || expiry < now_ms)
			continue; /* expired: no holder any more */
		if (!(l = set_add(out))) {
			free(kept);
			return -1;
		}
		l->klen = klen;
		memcpy(l->key, key, klen);
		l->masters = lv->redlock;
		if (holder_info(l, m->str, m->len, r[2]) != 0) {
			out->n--;
			continue;
		}
		l->lease_left_ms = expiry - now_ms;
		l->fence = -1; /* the counter counts every grant: whose is unknown */
		l->limit = limit;
		l->shared = shared;
		l->in_set = 1;
		if (nkept && l->vlen > TOKEN_LEN) {
			const char *tok = l->val;

			l->kept |= bsearch(&tok, kept, (size_t)nkept, sizeof(*kept),
					   mark_cmp) != NULL;
		}
		if (read_waiters(l, r[3]) != 0) {
			free(kept);
			return -1;
		}
	}
	free(kept);
	return 0;
}

/*
 * The second round trip of a page, for the n keys (of keys, at the indexes
 * sets) whose GET answered WRONGTYPE: TIME, then ZRANGE key 0 -1 WITHSCORES
 * and HKEYS key:f each, their holders appended to out. rep are the page's
 * first replies. Returns 0, or -1 with err set.
 */
static int read_sets(const struct lockview *lv, struct backend_conn *c,
		     const char *const *keys, const size_t *klens, const int *sets, int n,
		     redisReply **rep, struct lv_set *out, char *err, size_t errlen)
{
	const char **argv = calloc((size_t)n * SET_ARGS + 1, sizeof(*argv));
	size_t *argvlen = calloc((size_t)n * SET_ARGS + 1, sizeof(*argvlen));
	int *argc = calloc((size_t)n * 2 + 1, sizeof(*argc));
	redisReply **z = calloc((size_t)n * 2 + 1, sizeof(*z));
	char *fkeys = malloc((size_t)n * (KEY_BUF_SIZE + 2));
	long long now;
	int rc = -1;

	if (!argv || !argvlen || !argc || !z || !fkeys) {
		snprintf(err, errlen, "out of memory");
		goto out;
	}
	argv[0] = "TIME";
	argvlen[0] = 4;
	argc[0] = 1;
	for (int i = 0; i < n; i++) {
		size_t kl = klens[sets[i]] > KEY_BUF_SIZE ? KEY_BUF_SIZE : klens[sets[i]];
		char *f = fkeys + (size_t)i * (KEY_BUF_SIZE + 2);
		const char *words[SET_ARGS] = { "ZRANGE", keys[sets[i]], "0", "-1",
						"WITHSCORES", "HKEYS", f };
		const char **a = argv + 1 + i * SET_ARGS;
		size_t *al = argvlen + 1 + i * SET_ARGS;

		memcpy(f, keys[sets[i]], kl);
		memcpy(f + kl, ":f", 2);
		for (int j = 0; j < SET_ARGS; j++) {
			a[j] = words[j];
			al[j] = j == 1 ? klens[sets[i]] : j == 6 ? kl + 2 : strlen(words[j]);
		}
		argc[1 + 2 * i] = ZRANGE_ARGS;
		argc[2 + 2 * i] = SET_ARGS - ZRANGE_ARGS;
	}
	if (backend_redis_pipeline(c, 2 * n + 1, argc, argv, argvlen, z) != 0) {
		snprintf(err, errlen, "%s", backend_redis_errstr(c));
		goto out;
	}
	if ((now = time_ms(z[0])) < 0) {
		snprintf(err, errlen, "TIME: %s", z[0]->type == REDIS_REPLY_ERROR ? z[0]->str :
			 "unexpected reply");
		goto out;
	}
	rc = 0;
	for (int i = 0; i < n && rc == 0; i++)
		if (add_holders(lv, keys[sets[i]], klens[sets[i]], z[1 + 2 * i], z[2 + 2 * i],
				now, rep + sets[i] * CMDS_PER_KEY, out) != 0) {
			snprintf(err, errlen, "out of memory");
			rc = -1;
		}
out:
	for (int i = 0; z && i <= 2 * n; i++)
		if (z[i])
			freeReplyObject(z[i]);
	free(argv);
	free(argvlen);
	free(argc);
	free(z);
	free(fkeys);
	return rc;
}

/*
 * Reads the n keys on c in one round trip (two when some are holder sets),
 * appending the locks found to out, a holder set's holders each (masters =
 * 1 each with Redlock). Returns 0, or -1 with err set.
 */
static int read_keys(const struct lockview *lv, struct backend_conn *c, const char *const *keys,
		     const size_t *klens, int n, struct lv_set *out, char *err, size_t errlen)
{
	const char **argv = calloc((size_t)n * ARGS_PER_KEY, sizeof(*argv));
	size_t *argvlen = calloc((size_t)n * ARGS_PER_KEY, sizeof(*argvlen));
	int *argc = calloc((size_t)n * CMDS_PER_KEY, sizeof(*argc));
	redisReply **rep = calloc((size_t)n * CMDS_PER_KEY, sizeof(*rep));
	char *aux = malloc((size_t)n * 2 * (KEY_BUF_SIZE + 4));
	int *sets = calloc((size_t)n, sizeof(*sets));
	int rc = -1, nsets = 0;

	if (!argv || !argvlen || !argc || !rep || !aux || !sets) {
		snprintf(err, errlen, "out of memory");
		goto out;
	}
	for (int i = 0; i < n; i++) {
		const char **a = argv + i * ARGS_PER_KEY;
		size_t *al = argvlen + i * ARGS_PER_KEY, kl = klens[i];
		char *f = aux + (size_t)i * 2 * (KEY_BUF_SIZE + 4), *q = f + KEY_BUF_SIZE + 4;
		const char *words[ARGS_PER_KEY] = { "GET", NULL, "PTTL", NULL, "HMGET", f, "n",
						    "g", "k", "l", "m", "ZRANGE", q, "0", "-1" };

		if (kl > KEY_BUF_SIZE)
			kl = KEY_BUF_SIZE;
		memcpy(f, keys[i], kl);
		memcpy(f + kl, ":f", 2);
		memcpy(q, keys[i], kl);
		memcpy(q + kl, ":q", 2);
		for (int j = 0; j < ARGS_PER_KEY; j++) {
			a[j] = words[j] ? words[j] : keys[i];
			al[j] = j == 5 || j == 12 ? kl + 2 : words[j] ? strlen(words[j]) : kl;
		}
		argc[i * CMDS_PER_KEY] = 2;
		argc[i * CMDS_PER_KEY + 1] = 2;
		argc[i * CMDS_PER_KEY + 2] = 2 + HASH_FIELDS;
		argc[i * CMDS_PER_KEY + 3] = 4;
	}
	if (backend_redis_pipeline(c, n * CMDS_PER_KEY, argc, argv, argvlen, rep) != 0) {
		snprintf(err, errlen, "%s", backend_redis_errstr(c));
		goto out;
	}
	rc = 0;
	for (int i = 0; i < n && rc == 0; i++) {
		struct lv_lock *l = set_add(out);
		int got;

		if (!l) {
			snprintf(err, errlen, "out of memory");
			rc = -1;
			break;
		}
		l->klen = klens[i] > KEY_BUF_SIZE ? KEY_BUF_SIZE : klens[i];
		memcpy(l->key, keys[i], l->klen);
		l->masters = lv->redlock;
		got = interpret(l, rep + i * CMDS_PER_KEY);
		if (got == 0 && wrong_type(rep[i * CMDS_PER_KEY]))
			sets[nsets++] = i;
		if (got <= 0) {
			lv_lock_free(l);
			out->n--;
		}
		if (got < 0) {
			snprintf(err, errlen, "out of memory");
			rc = -1;
		}
	}
	if (rc == 0 && nsets)
		rc = read_sets(lv, c, keys, klens, sets, nsets, rep, out, err, errlen);
out:
	for (int i = 0; rep && i < n * CMDS_PER_KEY; i++)
		if (rep[i])
			freeReplyObject(rep[i]);
	free(argv);
	free(argvlen);
	free(argc);
	free(rep);
	free(aux);
	free(sets);
	return rc;
}

/* Writes pattern into buf with Redis glob's special characters escaped. */
static void glob_escape(char *buf, size_t len, const char *s)
{
	size_t k = 0;

	for (; *s && k + 2 < len; s++) {
		if (strchr("*?[]\\", *s))
			buf[k++] = '\\';
		buf[k++] = *s;
	}
	buf[k] = 0;
}

struct scan_job {
	const char *match;
	size_t prefix_len; /* of "<ns>:" */
	int tagged;
	struct lv_set *out;
};

/* SCANs c for the job's keys, reading each page's locks. Returns 0 or -1. */
static int scan_node(const struct lockview *lv, struct backend_conn *c, struct scan_job *job,
		     char *err, size_t errlen)
{
	char cursor[32] = "0";

	do {
		const char *argv[6] = { "SCAN", cursor, "MATCH", job->match, "COUNT", SCAN_COUNT };
		size_t argvlen[6];
		int argc = 6, n = 0, rc;
		redisReply *r;
		const char **keys;
		size_t *klens;

		for (int i = 0; i < 6; i++)
			argvlen[i] = strlen(argv[i]);
		if (backend_redis_pipeline(c, 1, &argc, argv, argvlen, &r) != 0) {
			snprintf(err, errlen, "SCAN: %s", backend_redis_errstr(c));
			return -1;
		}
		if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
		    r->element[0]->type != REDIS_REPLY_STRING ||
		    r->element[1]->type != REDIS_REPLY_ARRAY) {
			snprintf(err, errlen, "SCAN: %s", r->type == REDIS_REPLY_ERROR ? r->str :
				 "unexpected reply");
			freeReplyObject(r);
			return -1;
		}
		snprintf(cursor, sizeof(cursor), "%s", r->element[0]->str);
		keys = calloc(r->element[1]->elements + 1, sizeof(*keys));
		klens = calloc(r->element[1]->elements + 1, sizeof(*klens));
		if (!keys || !klens) {
			free(keys);
			free(klens);
			freeReplyObject(r);
			snprintf(err, errlen, "out of memory");
			return -1;
		}
		for (size_t i = 0; i < r->element[1]->elements; i++) {
			const redisReply *k = r->element[1]->element[i];
			const char *name;
			size_t nl;

			if (k->type != REDIS_REPLY_STRING || k->len <= job->prefix_len ||
			    k->len > KEY_BUF_SIZE)
				continue;
			name = k->str + job->prefix_len;
			nl = k->len - job->prefix_len;
			if (auxiliary(name, nl))
				continue;
			if (job->tagged && (name[0] != '{' || name[nl - 1] != '}'))
				continue;
			keys[n] = k->str;
			klens[n++] = k->len;
		}
		rc = n ? read_keys(lv, c, keys, klens, n, job->out, err, errlen) : 0;
		free(keys);
		free(klens);
		freeReplyObject(r);
		if (rc != 0)
			return -1;
	} while (strcmp(cursor, "0") != 0);
	return 0;
}

/* What to do on each node: scan it, or read one key. */
struct node_job {
	struct scan_job *scan;
	const char *key;
	size_t klen;
	struct lv_set *out;
};

/*
 * Runs job on every node of lv's topology. Returns 0, or -1 with err set
 * when a node could not be read (with Redlock: more than n - quorum).
 */
static int each_node(const struct lockview *lv, struct node_job *job, char *err, size_t errlen)
{
	const struct backend_ops *ops = lv->b.ops;
	char e[512] = "", name[160], tag[16];
	struct backend_conn *c;
	int n = 1, failed = 0;

	/* the topology's own open: the primary, or the cluster's slot map */
	c = ops->open(lv->b.cfg, e, sizeof(e));
	if (!c && !lv->redlock) {
		snprintf(err, errlen, "%s", e);
		return -1;
	}
	if (ops->node_count) {
		if (c)
			ops->close(c);
		n = ops->node_count(lv->b.cfg);
	}
	for (int i = 0; i < n; i++) {
		int rc;

		name[0] = 0;
		if (ops->node_count) {
			c = ops->node_open(lv->b.cfg, i, name, sizeof(name), tag, sizeof(tag), e,
					   sizeof(e));
			if (!c) {
				snprintf(err, errlen, "%s: %s", name, e);
				failed++;
				continue;
			}
		}
		rc = job->scan ? scan_node(lv, c, job->scan, e, sizeof(e)) :
			read_keys(lv, c, &job->key, &job->klen, 1, job->out, e, sizeof(e));
		backend_redis_close(c);
		if (rc != 0) {
			snprintf(err, errlen, "%s%s%s", ops->node_count ? name : "",
				 ops->node_count ? ": " : "", e);
			failed++;
		}
	}
	if (lv->redlock && failed && failed <= n - lv->quorum) {
		log_stderr("warning: %d of %d masters not read: %s", failed, n, err);
		return 0;
	}
	return failed ? -1 : 0;
}

static int by_key_val(const void *a, const void *b)
{
	const struct lv_lock *x = a, *y = b;
	size_t n = x->klen < y->klen ? x->klen : y->klen;
	int c = memcmp(x->key, y->key, n);

	if (c || x->klen != y->klen)
		return c ? c : (x->klen < y->klen ? -1 : 1);
	n = x->vlen < y->vlen ? x->vlen : y->vlen;
	c = memcmp(x->val, y->val, n);
	return c ? c : (x->vlen > y->vlen) - (x->vlen < y->vlen);
}

static int same(const struct lv_lock *x, const struct lv_lock *y)
{
	return x->klen == y->klen && x->vlen == y->vlen && !memcmp(x->key, y->key, x->klen) &&
	       !memcmp(x->val, y->val, x->vlen);
}

/*
 * Sorts s by key; with Redlock, merges the masters' copies of one (key,
 * value) into one lock (masters: how many; fence: the largest; lease: the
 * shortest) and keeps those on at least min_masters.
 */
static void settle_set(const struct lockview *lv, struct lv_set *s, int min_masters)
{
	int out = 0;

	qsort(s->v, (size_t)s->n, sizeof(*s->v), by_key_val);
	if (!lv->redlock)
		return;
	for (int i = 0; i < s->n;) {
		struct lv_lock *first = &s->v[i];
		int j = i + 1;

		for (; j < s->n && same(first, &s->v[j]); j++) {
			struct lv_lock *o = &s->v[j];

			first->masters++;
			if (o->fence > first->fence)
				first->fence = o->fence;
			if (o->lease_left_ms >= 0 && (first->lease_left_ms < 0 ||
						      o->lease_left_ms < first->lease_left_ms))
				first->lease_left_ms = o->lease_left_ms;
			first->kept |= o->kept;
			lv_lock_free(o);
		}
		if (first->masters >= min_masters)
			s->v[out++] = *first;
		else
			lv_lock_free(first);
		i = j;
	}
	s->n = out;
}

/* What holders_scan's callback needs: the holders it keeps are those of
 * key (klen bytes, as stored) when set, else those whose key matches
 * pattern (NULL: all) in the namespace. */
struct holders_job {
	const struct lockview *lv;
	const char *pattern;
	const char *key;
	size_t klen;
	struct lv_set *out;
	int nomem;
};

/* Returns 1 when h's key is one the job keeps, else 0. */
static int holder_wanted(const struct holders_job *j, const struct backend_holder *h)
{
	size_t ns = strlen(j->lv->cfg->ns);
	char rest[KEY_BUF_SIZE + 64];

	if (j->key)
		return h->klen == j->klen && memcmp(h->key, j->key, h->klen) == 0;
	if (h->klen <= ns || h->klen >= KEY_BUF_SIZE || h->key[ns] != ':' ||
	    memcmp(h->key, j->lv->cfg->ns, ns) != 0)
		return 0;
	snprintf(rest, sizeof(rest), "%.*s", (int)(h->klen - ns - 1), h->key + ns + 1);
	return !j->pattern || fnmatch(j->pattern, rest, 0) == 0;
}

/* Adds holder h (a backend's .holders report) to the job's set when the
 * job wants its key and its value is an owner record; its waiters whose
 * values are. */
static void holder_found(void *arg, const struct backend_holder *h)
{
	struct holders_job *j = arg;
	struct lv_lock *l, tmp = { 0 };

	if (h->klen >= sizeof(tmp.key) || !holder_wanted(j, h) || h->vlen > BACKEND_VAL_MAX ||
	    owner_parse(h->val, h->vlen, &tmp.owner) != 0)
		return;
	if (h->nwaiters && !(tmp.waiters = calloc((size_t)h->nwaiters, sizeof(*tmp.waiters)))) {
		j->nomem = 1;
		return;
	}
	for (int i = 0; i < h->nwaiters; i++)
		if (owner_parse(h->wval[i], h->wlen[i], &tmp.waiters[tmp.nwaiters]) == 0)
			tmp.nwaiters++;
	if (!(l = set_add(j->out))) {
		free(tmp.waiters);
		j->nomem = 1;
		return;
	}
	*l = tmp;
	memcpy(l->key, h->key, h->klen);
	l->klen = h->klen;
	memcpy(l->val, h->val, h->vlen);
	l->vlen = h->vlen;
	l->since_ms = h->since_ms;
	l->lease_left_ms = h->lease_left_ms;
	l->fence = h->fence;
	l->limit = h->limit;
	l->shared = h->shared;
	l->in_set = h->in_set;
}

/* lockview_scan (key NULL) and lockview_read (key: klen bytes, as
 * stored) of a backend with .holders (not Redis's). */
static int holders_scan(struct lockview *lv, const char *pattern, const char *key, size_t klen,
			struct lv_set *out, char *err, size_t errlen)
{
	struct holders_job j = { lv, pattern, key, klen, out, 0 };
	struct backend_conn *c = backend_open(&lv->b, err, errlen);
	int rc;

	if (!c)
		return -1;
	rc = lv->b.ops->holders(c, holder_found, &j);
	if (rc != BACKEND_OK)
		snprintf(err, errlen, "%s", lv->b.ops->errstr(c));
	lv->b.ops->close(c);
	qsort(out->v, (size_t)out->n, sizeof(*out->v), by_key_val);
	if (rc == BACKEND_OK && j.nomem) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	return rc == BACKEND_OK ? 0 : -1;
}

int lockview_scan(struct lockview *lv, const char *pattern, struct lv_set *out, char *err,
		  size_t errlen)
{
	char ns[2 * KEY_MAX_NAMESPACE + 1], match[2 * KEY_MAX_NAMESPACE + 16 + 4096];
	struct scan_job sj = { match, strlen(lv->cfg->ns) + 1, lv->tagged, out };
	struct node_job job = { .scan = &sj };
	int rc;

	if (lv->b.ops->holders)
		return holders_scan(lv, pattern, NULL, 0, out, err, errlen);
	glob_escape(ns, sizeof(ns), lv->cfg->ns);
	if (snprintf(match, sizeof(match), lv->tagged ? "%s:{%s}" : "%s:%s", ns,
		     pattern ? pattern : "*") >= (int)sizeof(match)) {
		snprintf(err, errlen, "pattern too long");
		return -1;
	}
	rc = each_node(lv, &job, err, errlen);
	settle_set(lv, out, lv->quorum);
	return rc;
}

int lockview_read(struct lockview *lv, const char *key, struct lv_set *out, char *err,
		  size_t errlen)
{
	char full[KEY_BUF_SIZE];
	struct node_job job = { .out = out, .key = full };
	int best = -1, n = 0;

	if (!(job.klen = lockview_key(lv, key, full))) {
		snprintf(err, errlen, "key too long");
		return -1;
	}
	if (lv->b.ops->holders) {
		if (holders_scan(lv, NULL, full, job.klen, out, err, errlen) != 0) {
			lv_set_free(out);
			return -1;
		}
		return out->n;
	}
	if (each_node(lv, &job, err, errlen) != 0) {
		lv_set_free(out);
		return -1;
	}
	/* a Cluster's other primaries answered MOVED: not a lock value */
	settle_set(lv, out, 1);
	for (int i = 0; i < out->n; i++)
		if (!out->v[i].in_set && (best < 0 || out->v[i].masters > out->v[best].masters))
			best = i;
	/* a string lock has one holder: other values are a minority's leftovers */
	for (int i = 0; i < out->n; i++) {
		if (out->v[i].in_set || i == best)
			out->v[n++] = out->v[i];
		else
			lv_lock_free(&out->v[i]);
	}
	out->n = n;
	return n;
}

/* Writes ms (CLOCK_REALTIME) as RFC 3339 UTC with milliseconds. */
static void rfc3339(char *buf, size_t len, long long ms)
{
	time_t t = (time_t)(ms / 1000);
	struct tm tm;

	gmtime_r(&t, &tm);
	snprintf(buf, len, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
		 tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, (int)(ms % 1000));
}

/* Writes s as a JSON string (quoted, escaped) on f. */
static void json_str(FILE *f, const char *s, size_t n)
{
	fputc('"', f);
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s[i];

		if (c == '"' || c == '\\')
			fprintf(f, "\\%c", c);
		else if (c < 0x20 || c >= 0x7f)
			fprintf(f, "\\u%04x", c);
		else
			fputc(c, f);
	}
	fputc('"', f);
}

/* Writes s with control characters escaped on f. */
static void text_str(FILE *f, const char *s, size_t n)
{
	char buf[4 * KEY_BUF_SIZE + 16];

	fwrite(buf, 1, log_escape(buf, sizeof(buf), s, n), f);
}

/* Returns the KEY of l as the config names it: without the namespace, and
 * without a Cluster's braces; its length in *n. */
static const char *short_key(const struct lockview *lv, const struct lv_lock *l, size_t *n)
{
	size_t p = strlen(lv->cfg->ns) + 1;
	const char *k = l->key + p;

	*n = l->klen - p;
	if (lv->tagged && *n >= 2 && k[0] == '{' && k[*n - 1] == '}') {
		k++;
		*n -= 2;
	}
	return k;
}

static void print_json(const struct lockview *lv, const struct lv_lock *l, long long now_ms)
{
	const struct owner_info *o = &l->owner;
	char since[80];
	size_t kn;
	const char *k = short_key(lv, l, &kn);

	fputs("{\"key\":", stdout);
	json_str(stdout, k, kn);
	fputs(",\"host\":", stdout);
	json_str(stdout, o->host, strlen(o->host));
	printf(",\"pid\":%d,\"tid\":%d,\"program\":", o->pid, o->tid);
	json_str(stdout, o->program, strlen(o->program));
	if (l->since_ms > 0) {
		rfc3339(since, sizeof(since), l->since_ms);
		printf(",\"since\":\"%s\",\"held_ms\":%lld", since,
		       now_ms > l->since_ms ? now_ms - l->since_ms : 0);
	} else {
		fputs(",\"since\":null,\"held_ms\":null", stdout);
	}
	if (l->lease_left_ms >= 0)
		printf(",\"lease_left_ms\":%lld", l->lease_left_ms);
	else
		fputs(",\"lease_left_ms\":null", stdout);
	if (l->fence >= 0)
		printf(",\"fence\":%lld", l->fence);
	else
		fputs(",\"fence\":null", stdout);
	printf(",\"limit\":%d,\"mode\":\"%s\"", l->limit, l->shared ? "shared" : "exclusive");
	printf(",\"kept\":%s,\"waiters\":[", l->kept ? "true" : "false");
	for (int i = 0; i < l->nwaiters; i++) {
		const struct owner_info *w = &l->waiters[i];

		fputs(i ? ",{\"host\":" : "{\"host\":", stdout);
		json_str(stdout, w->host, strlen(w->host));
		printf(",\"pid\":%d,\"program\":", w->pid);
		json_str(stdout, w->program, strlen(w->program));
		if (w->since_ms > 0)
			printf(",\"waited_ms\":%lld}",
			       now_ms > w->since_ms ? now_ms - w->since_ms : 0);
		else
			fputs(",\"waited_ms\":null}", stdout);
	}
	fputc(']', stdout);
	if (lv->redlock)
		printf(",\"masters\":%d", l->masters);
	fputs("}\n", stdout);
}

static void print_text(const struct lockview *lv, const struct lv_lock *l, long long now_ms)
{
	const struct owner_info *o = &l->owner;
	size_t kn;
	const char *k = short_key(lv, l, &kn);
	char since[80];

	text_str(stdout, k, kn);
	fputs("  held by ", stdout);
	text_str(stdout, o->host, strlen(o->host));
	printf(" pid %d tid %d (", o->pid, o->tid);
	text_str(stdout, o->program, strlen(o->program));
	if (l->since_ms > 0) {
		rfc3339(since, sizeof(since), l->since_ms);
		printf(") since %s (%.1f s)", since,
		       (double)(now_ms > l->since_ms ? now_ms - l->since_ms : 0) / 1000);
	} else {
		fputs(") since unknown", stdout);
	}
	if (l->lease_left_ms >= 0)
		printf(", lease %.1f s left", (double)l->lease_left_ms / 1000);
	else
		fputs(", no lease", stdout);
	if (l->fence >= 0)
		printf(", fence %lld", l->fence);
	if (l->shared)
		fputs(", shared", stdout);
	if (l->limit != 1)
		printf(", limit %d", l->limit);
	if (l->kept)
		fputs(", kept", stdout);
	if (lv->redlock)
		printf(", on %d masters", l->masters);
	if (l->nwaiters) {
		const struct owner_info *w = &l->waiters[0];

		printf(", %d waiting, oldest ", l->nwaiters);
		text_str(stdout, w->host, strlen(w->host));
		printf(" pid %d (", w->pid);
		text_str(stdout, w->program, strlen(w->program));
		if (w->since_ms > 0)
			printf(") %.1f s",
			       (double)(now_ms > w->since_ms ? now_ms - w->since_ms : 0) / 1000);
		else
			fputc(')', stdout);
	}
	fputc('\n', stdout);
}

void lockview_print(const struct lockview *lv, const struct lv_lock *l, int json,
		    long long now_ms)
{
	if (json)
		print_json(lv, l, now_ms);
	else
		print_text(lv, l, now_ms);
}

int lockview_args(int argc, char **argv, int allow_force, const char *usage,
		  struct lv_args *a)
{
	const char *env = getenv("LOCKSHIM_CONFIG");
	int i = 2;

	memset(a, 0, sizeof(*a));
	a->config = env && *env ? env : CONF_DEFAULT_PATH;
	for (; i < argc; i++) {
		const char *s = argv[i];

		if (!strcmp(s, "--")) {
			i++;
			break;
		}
		if (!strcmp(s, "-c") || !strcmp(s, "--config")) {
			if (++i == argc)
				goto bad;
			a->config = argv[i];
		} else if (!strncmp(s, "--config=", 9)) {
			a->config = s + 9;
		} else if (!strcmp(s, "--json")) {
			a->json = 1;
		} else if (allow_force && !strcmp(s, "--force")) {
			a->force = 1;
		} else if (s[0] == '-' && s[1]) {
			fprintf(stderr, "lockshim: unknown option %s\n", s);
			goto usage;
		} else {
			break;
		}
	}
	if (i < argc)
		a->operand = argv[i++];
	if (i < argc) {
		fprintf(stderr, "lockshim: %s takes one operand\n", argv[1]);
		goto usage;
	}
	return 0;
bad:
	fprintf(stderr, "lockshim: %s needs a file\n", argv[i - 1]);
usage:
	fprintf(stderr, "usage: lockshim %s %s\n", argv[1], usage);
	return 64;
}

int lockview_start(struct lockview *lv, struct conf *cfg, const struct lv_args *a,
		   enum lv_verb verb)
{
	const char *why;
	char err[1024];

	if (lockview_load(cfg, a) != 0) {
		conf_release(cfg);
		return CONF_EXIT_CODE;
	}
	if (lockview_open(lv, cfg, err, sizeof(err)) != 0) {
		log_stderr("%s", err);
		conf_release(cfg);
		return CONF_EXIT_CODE;
	}
	why = verb == LV_UNLOCK ? lv->b.ops->unlock_why : lv->b.ops->status_why;
	if (why) {
		fprintf(stderr, "lockshim: %s\n", why);
		lockview_close(lv);
		conf_release(cfg);
		return 1;
	}
	return 0;
}

long long lockview_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int lockview_load(struct conf *cfg, const struct lv_args *a)
{
	const struct conf_group *groups[CONF_GROUPS_MAX + 1];
	char err[1024];

	backend_conf_groups(groups, sizeof(groups) / sizeof(*groups));
	if (conf_load(cfg, a->config, groups, err, sizeof(err)) == 0 &&
	    conf_logging(cfg, 0, err, sizeof(err)) == 0)
		return 0;
	log_stderr("config error: %s", err);
	return -1;
}
