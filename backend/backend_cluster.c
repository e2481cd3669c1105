/* SPDX-License-Identifier: MIT */
/*
 * backend_cluster.c - locks in a Redis Cluster (backend.h).
 *
 * The slot map (which primary serves each of the 16384 slots) is learnt
 * with CLUSTER SLOTS from a known node or a seed, once per process, and
 * kept in the settings shared by every thread; the nodes it names are kept
 * for good, so a node's index never changes. A connection is a set of
 * backend_redis connections, one per node, opened when a key first routes
 * there: only nodes serving the program's locks are connected. Every lock
 * is one hash slot (key.c writes "<namespace>:{<key>}" and backend_redis's
 * queue keys add suffixes after the brace), so each operation is
 * backend_redis's on one node, wrapped in on_slot: MOVED updates the slot,
 * ASK sends ASKING and asks the other node once (scripts as EVAL),
 * TRYAGAIN and CLUSTERDOWN are retried for up to command_timeout_ms (a
 * release or leave meeting TRYAGAIN, its keys split by a migration,
 * deletes the lock key alone instead, waking nobody). A transport error
 * relearns the map (a failover; nodes that failed last asked last) and is
 * returned, which drops the whole connection in lock.c or renew.c.
 * Renewals are batched per node; a batch whose node is gone is renewed
 * where the relearnt map says. Asynchronous releases that a node redirects
 * are sent again, as leaves, where the slot now lives, and kept until sent.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend_redis.h"
#include "log.h"
#include "util.h"

#define SLOTS 16384
#define NODES_MAX 64
#define HOPS_MAX 5
#define REDO_MAX 16

struct node {
	char host[256];
	int port;
	int down;  /* the last connection or command to it failed */
};

struct backend_config {
	const struct redis_spec *r;
	pthread_mutex_t mu;       /* guards what follows */
	int nnodes;               /* nodes ever named by the map */
	struct node nodes[NODES_MAX];
	short slot[SLOTS];        /* index of the slot's primary; -1 unknown */
	int mapped;               /* a map was learnt */
};

/* Items copied out of node connections, to be sent again or handed back. */
struct redos {
	int n;
	struct backend_copy r[REDO_MAX];
};

struct cluster_conn {
	struct backend_config *bc;
	struct backend_conn *node[NODES_MAX]; /* backend_redis connections */
	struct redos unsure;  /* unanswered commands of dropped node connections */
	struct redos moved;   /* asynchronous commands a node redirected */
	struct redos later;   /* send_moved's: those not sent again yet */
	char errstr[320];
};

#define CC(c) ((struct cluster_conn *)(void *)(c))

/* ---- the slot map ----------------------------------------------------- */

/* CRC16-CCITT (XMODEM), as Redis Cluster hashes keys. */
static unsigned crc16(const char *p, size_t n)
{
	unsigned crc = 0;

	for (size_t i = 0; i < n; i++) {
		crc ^= (unsigned)(unsigned char)p[i] << 8;
		for (int b = 0; b < 8; b++)
			crc = crc & 0x8000 ? (crc << 1) ^ 0x1021 : crc << 1;
	}
	return crc & 0xffff;
}

/* Returns the slot of key: what lies between its first '{' and the first
 * '}' after it, when that is not empty; else the whole key. */
static int key_slot(const char *key, size_t n)
{
	const char *open = memchr(key, '{', n), *close;

	if (open) {
		close = memchr(open + 1, '}', n - (size_t)(open + 1 - key));
		if (close && close > open + 1)
			return (int)(crc16(open + 1, (size_t)(close - open - 1)) % SLOTS);
	}
	return (int)(crc16(key, n) % SLOTS);
}

/* Returns the index of host:port in bc's nodes, adding it; -1 when full.
 * Called with bc->mu held. */
static int node_index(struct backend_config *bc, const char *host, int port)
{
	for (int i = 0; i < bc->nnodes; i++)
		if (bc->nodes[i].port == port && strcmp(bc->nodes[i].host, host) == 0)
			return i;
	if (bc->nnodes == NODES_MAX || strlen(host) >= sizeof(bc->nodes[0].host))
		return -1;
	snprintf(bc->nodes[bc->nnodes].host, sizeof(bc->nodes[0].host), "%s", host);
	bc->nodes[bc->nnodes].port = port;
	bc->nodes[bc->nnodes].down = 0;
	return bc->nnodes++;
}

/* Records whether node i (of bc's nodes; -1: none) just failed (down) or
 * answered: a map is asked of the nodes not down first. */
static void node_mark(struct backend_config *bc, int i, int down)
{
	if (i < 0)
		return;
	pthread_mutex_lock(&bc->mu);
	if (i < bc->nnodes)
		bc->nodes[i].down = down;
	pthread_mutex_unlock(&bc->mu);
}

/*
 * Asks host:port for CLUSTER SLOTS and writes the map into slot[] (node
 * indices of bc, added as needed). Returns 0, or -1 with the reason in why.
 */
static int ask_slots(struct backend_config *bc, const char *host, int port, short *slot,
		     char *why, size_t whylen)
{
	const struct redis_spec *r = bc->r;
	const char *argv[] = { "CLUSTER", "SLOTS" };
	struct redis_endpoint ep = { host, port, NULL, r->username, r->password, 0, 0 };
	struct backend_conn *c = backend_redis_connect(r, &ep, why, whylen);
	redisReply *rep;
	int rc = -1;

	if (!c)
		return -1;
	rep = backend_redis_command(c, 2, argv);
	if (!rep || rep->type != REDIS_REPLY_ARRAY) {
		snprintf(why, whylen, "CLUSTER SLOTS: %s", !rep ? backend_redis_errstr(c) :
			 rep->type == REDIS_REPLY_ERROR ? rep->str : "unexpected reply");
		goto out;
	}
	for (int s = 0; s < SLOTS; s++)
		slot[s] = -1;
	pthread_mutex_lock(&bc->mu);
	for (size_t i = 0; i < rep->elements; i++) {
		const redisReply *e = rep->element[i], *n;
		int idx;

		if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 ||
		    (n = e->element[2])->type != REDIS_REPLY_ARRAY || n->elements < 2 ||
		    n->element[0]->type != REDIS_REPLY_STRING)
			continue;
		/* an empty or "?" host: the node's address is the one asked */
		idx = node_index(bc, n->element[0]->len && strcmp(n->element[0]->str, "?") ?
				 n->element[0]->str : host, (int)n->element[1]->integer);
		for (long long s = e->element[0]->integer; idx >= 0 && s <= e->element[1]->integer &&
		     s < SLOTS; s++)
			slot[s] = (short)idx;
	}
	pthread_mutex_unlock(&bc->mu);
	rc = 0;
	if (rep->elements == 0) {
		snprintf(why, whylen, "CLUSTER SLOTS: no slot is served");
		rc = -1;
	}
out:
	if (rep)
		freeReplyObject(rep);
	backend_redis_close(c);
	return rc;
}

/*
 * Learns the map again, from the first node that answers CLUSTER SLOTS:
 * the nodes known and then the seeds, those that failed last (a primary
 * just killed) after all the others, so that a dead node costs one
 * attempt at most and only when no live node answers. Returns 0, or -1
 * with every node's reason in err.
 */
static int refresh(struct backend_config *bc, char *err, size_t errlen)
{
	const struct redis_spec *r = bc->r;
	short *slot = malloc(sizeof(short) * SLOTS);
	int nseeds = 0, n = 0, known = 0, rc = -1;
	struct node *cand = NULL;
	size_t used;

	while (r->cluster[nseeds])
		nseeds++;
	if (!slot || !(cand = calloc((size_t)(NODES_MAX + nseeds), sizeof(*cand)))) {
		snprintf(err, errlen, "out of memory");
		goto out;
	}
	pthread_mutex_lock(&bc->mu);
	memcpy(cand, bc->nodes, sizeof(*cand) * (size_t)bc->nnodes);
	n = known = bc->nnodes; /* cand[i] is bc->nodes[i] for i < known */
	pthread_mutex_unlock(&bc->mu);
	for (int i = 0; i < nseeds; i++) {
		struct node sd = { .down = 0 };
		int k = 0;

		if (backend_redis_split_addr(r->cluster[i], sd.host, sizeof(sd.host), &sd.port) != 0)
			continue;
		while (k < n && !(cand[k].port == sd.port && strcmp(cand[k].host, sd.host) == 0))
			k++;
		if (k == n)
			cand[n++] = sd;
	}
	used = (size_t)snprintf(err, errlen, "no slot map from the cluster:");
	for (int pass = 0; pass < 2; pass++) {
		for (int i = 0; i < n; i++) {
			char why[256];

			if (cand[i].down != pass)
				continue;
			if (ask_slots(bc, cand[i].host, cand[i].port, slot, why, sizeof(why)) == 0) {
				node_mark(bc, i < known ? i : -1, 0);
				pthread_mutex_lock(&bc->mu);
				memcpy(bc->slot, slot, sizeof(short) * SLOTS);
				bc->mapped = 1;
				pthread_mutex_unlock(&bc->mu);
				LOG(LOG_DEBUG, "cluster: slot map from %s:%d", cand[i].host,
				    cand[i].port);
				rc = 0;
				goto out;
			}
			node_mark(bc, i < known ? i : -1, 1);
			if (used < errlen)
				used += (size_t)snprintf(err + used, errlen - used, " %s:%d: %s;",
							 cand[i].host, cand[i].port, why);
		}
	}
	if (used >= errlen)
		used = errlen - 1;
	if (used && err[used - 1] == ';')
		err[used - 1] = 0;
out:
	free(slot);
	free(cand);
	return rc;
}

/* Returns the node serving key (refreshing an empty map), or -1 with err. */
static int route(struct cluster_conn *cc, const char *key, size_t klen)
{
	struct backend_config *bc = cc->bc;
	int s = key_slot(key, klen), idx;

	pthread_mutex_lock(&bc->mu);
	idx = bc->slot[s];
	pthread_mutex_unlock(&bc->mu);
	if (idx >= 0 || refresh(bc, cc->errstr, sizeof(cc->errstr)) != 0)
		return idx;
	pthread_mutex_lock(&bc->mu);
	idx = bc->slot[s];
	pthread_mutex_unlock(&bc->mu);
	if (idx < 0)
		snprintf(cc->errstr, sizeof(cc->errstr), "slot %d is served by no node", s);
	return idx;
}

/* ---- node connections ------------------------------------------------- */

/* Copies it into the list arg (struct redos). */
static void keep(void *arg, const struct backend_item *it)
{
	struct redos *l = arg;

	if (l->n == REDO_MAX || backend_copy_set(&l->r[l->n], it) != 0) {
		LOG(LOG_ERROR, "release of %.*s not sent again (too many); it expires with its "
		    "lease", (int)it->klen, it->key);
		return;
	}
	l->n++;
}

/* Closes node i's connection after a failure, keeping its unanswered
 * commands for unconfirmed(). */
static void node_drop(struct cluster_conn *cc, int i)
{
	if (!cc->node[i])
		return;
	node_mark(cc->bc, i, 1);
	backend_redis_unconfirmed(cc->node[i], keep, &cc->unsure);
	backend_redis_close(cc->node[i]);
	cc->node[i] = NULL;
}

/* Returns node i's connection, opened when needed; NULL with errstr. */
static struct backend_conn *node_conn(struct cluster_conn *cc, int i)
{
	const struct redis_spec *r = cc->bc->r;
	struct redis_endpoint ep = { NULL, 0, NULL, r->username, r->password, 0,
				     r->wait_replicas };
	struct node n;
	char err[256];

	if (cc->node[i])
		return cc->node[i];
	pthread_mutex_lock(&cc->bc->mu);
	n = cc->bc->nodes[i];
	pthread_mutex_unlock(&cc->bc->mu);
	ep.host = n.host;
	ep.port = n.port;
	cc->node[i] = backend_redis_connect(r, &ep, err, sizeof(err));
	if (!cc->node[i])
		snprintf(cc->errstr, sizeof(cc->errstr), "node %.64s:%d: %.240s", n.host, n.port,
			 err);
	node_mark(cc->bc, i, !cc->node[i]);
	return cc->node[i];
}

/* ---- one operation on the slot's node --------------------------------- */

/* An operation of backend_redis on one node connection, and its arguments. */
struct op {
	int (*run)(struct backend_conn *nc, struct op *o);
	const struct backend_item *it;
	long long wait_ms;    /* acquire: out; wait: the timeout */
	long long fence;      /* acquire, wait: out */
	char *holder;         /* acquire */
	size_t *holder_len;
	int async;            /* release, leave */
	int result;           /* renew */
	/* release, leave: run instead on TRYAGAIN (the lock's keys split by a
	 * migration), so that a lock is not left held until its lease ends */
	int (*fallback)(struct backend_conn *nc, struct op *o);
	const struct count_args *count; /* count */
};

/* count's arguments (backend.h). */
struct count_args {
	const char *key;
	size_t klen;
	int n;
	const char *const *fields;
	const size_t *flens;
	const long long *deltas;
};

static int run_acquire(struct backend_conn *nc, struct op *o)
{
	return backend_redis_acquire(nc, o->it, &o->wait_ms, o->holder, o->holder_len, &o->fence);
}

static int run_release(struct backend_conn *nc, struct op *o)
{
	return backend_redis_release(nc, o->it, o->async);
}

static int run_leave(struct backend_conn *nc, struct op *o)
{
	return backend_redis_leave(nc, o->it, o->async);
}

static int run_wait(struct backend_conn *nc, struct op *o)
{
	return backend_redis_wait(nc, o->it, o->wait_ms, &o->fence);
}

static int run_unlock(struct backend_conn *nc, struct op *o)
{
	return backend_redis_unlock(nc, o->it);
}

static int run_count(struct backend_conn *nc, struct op *o)
{
	const struct count_args *a = o->count;

	return backend_redis_count(nc, a->key, a->klen, a->n, a->fields, a->flens, a->deltas);
}

static int run_renew(struct backend_conn *nc, struct op *o)
{
	return backend_redis_renew(nc, 1, o->it, &o->result);
}

/*
 * Reads a node's error text (backend_redis's "what: REPLY"). Returns the
 * node a MOVED or ASK reply names (*ask set for ASK; MOVED also updates
 * the slot in the map), -2 for TRYAGAIN and CLUSTERDOWN (retry), -1 for
 * anything else.
 */
static int redirected(struct cluster_conn *cc, const char *err, int *ask)
{
	const char *p = strstr(err, ": ");
	char addr[300], host[256];
	int slot, port, idx;

	while (p && !backend_redis_is_redirect(p + 2))
		p = strstr(p + 2, ": ");
	if (!p)
		return -1;
	p += 2;
	if (strncmp(p, "TRYAGAIN", 8) == 0 || strncmp(p, "CLUSTERDOWN", 11) == 0)
		return -2;
	*ask = p[0] == 'A';
	if (sscanf(strchr(p, ' '), " %d %299s", &slot, addr) != 2 || slot < 0 ||
	    slot >= SLOTS || backend_redis_split_addr(addr, host, sizeof(host), &port) != 0)
		return -1;
	LOG(LOG_DEBUG, "cluster: %s %d %s:%d", *ask ? "ASK" : "MOVED", slot, host, port);
	pthread_mutex_lock(&cc->bc->mu);
	idx = node_index(cc->bc, host, port);
	if (!*ask && idx >= 0)
		cc->bc->slot[slot] = (short)idx;
	pthread_mutex_unlock(&cc->bc->mu);
	return idx;
}

/*
 * Runs o on the node serving key: follows MOVED and ASK (after HOPS_MAX
 * hops, with a growing pause, until command_timeout_ms has passed; scripts
 * after ASK go as EVAL: backend_redis_asked), retries TRYAGAIN and
 * CLUSTERDOWN for up to command_timeout_ms.
 * Returns o's result, or BACKEND_ERR with errstr set; after an error other
 * than a retry running out, the map is learnt again (a failover, a node
 * gone).
 */
static int on_slot(struct cluster_conn *cc, const char *key, size_t klen, struct op *o)
{
	int64_t deadline = util_now_ms() + cc->bc->r->command_timeout_ms, step = 5;
	int idx = route(cc, key, klen), ask = 0, hops = 0, rc;
	char err[256];

	while (idx >= 0) {
		struct backend_conn *nc = node_conn(cc, idx);
		const char *asking[] = { "ASKING" };
		redisReply *rep = NULL;
		int cur = idx;

		if (!nc)
			break;
		if (ask && !(rep = backend_redis_command(nc, 1, asking))) {
			snprintf(cc->errstr, sizeof(cc->errstr), "%s", backend_redis_errstr(nc));
			node_drop(cc, cur);
			break;
		}
		if (rep)
			freeReplyObject(rep);
		if (ask)
			backend_redis_asked(nc, 1);
		rc = o->run(nc, o);
		if (ask)
			backend_redis_asked(nc, 0);
		backend_redis_redirected(nc, keep, &cc->moved);
		if (rc == BACKEND_MISMATCH)
			snprintf(cc->errstr, sizeof(cc->errstr), "%s", backend_redis_errstr(nc));
		if (rc != BACKEND_ERR)
			return rc;
		snprintf(cc->errstr, sizeof(cc->errstr), "%s", backend_redis_errstr(nc));
		idx = redirected(cc, cc->errstr, &ask);
		if (idx == -2) { /* from the slot's owner again, after a pause */
			idx = route(cc, key, klen);
			ask = hops = 0;
			if (o->fallback && strstr(cc->errstr, "TRYAGAIN")) {
				o->run = o->fallback;
				o->fallback = NULL;
				continue;
			}
			if (util_now_ms() >= deadline)
				return BACKEND_ERR;
			util_sleep_ms(step);
			step = step < 80 ? step * 2 : step;
			continue;
		}
		if (idx == -1) {
			node_drop(cc, cur);
			break;
		}
		/* a slot moving again and again: followed, with a pause after
		 * HOPS_MAX hops, until command_timeout_ms has passed */
		if (++hops > HOPS_MAX) {
			if (util_now_ms() >= deadline) {
				snprintf(cc->errstr, sizeof(cc->errstr), "still redirected after %d "
					 "redirections for %.*s", hops - 1, (int)klen, key);
				return BACKEND_ERR;
			}
			util_sleep_ms(step);
			step = step < 80 ? step * 2 : step;
		}
	}
	if (refresh(cc->bc, err, sizeof(err)) != 0)
		LOG(LOG_DEBUG, "cluster: %s", err);
	return BACKEND_ERR;
}

/*
 * Sends again, as leaves where their slots now live, the asynchronous
 * releases and leaves that nodes redirected (the token is forgotten: the
 * key deleted if it still holds it, the next waiter woken). Those that
 * fail again are kept, to be sent at the connection's next operation or
 * flush, or handed to the caller by unconfirmed() when it drops the
 * connection (lock.c and renew.c then retry them until their lease ends):
 * none is abandoned. Returns BACKEND_OK, or BACKEND_ERR when some are kept
 * (errstr says why).
 */
static int send_moved(struct cluster_conn *cc)
{
	char why[sizeof(cc->errstr)] = "";

	while (cc->moved.n > 0) {
		struct backend_copy u = cc->moved.r[--cc->moved.n];
		struct backend_item it = backend_copy_item(&u);
		struct op o = { .run = run_leave, .it = &it, .fallback = run_unlock };

		if (on_slot(cc, it.key, it.klen, &o) != BACKEND_ERR)
			continue;
		snprintf(why, sizeof(why), "%s", cc->errstr);
		LOG(LOG_DEBUG, "cluster: release of %.*s not sent again yet: %s", (int)it.klen,
		    it.key, why);
		if (cc->later.n < REDO_MAX)
			cc->later.r[cc->later.n++] = u;
		else
			LOG(LOG_ERROR, "release of %.*s could not be sent again: %s; it expires "
			    "with its lease", (int)it.klen, it.key, why);
	}
	memcpy(cc->moved.r, cc->later.r, sizeof(cc->later.r[0]) * (size_t)cc->later.n);
	cc->moved.n = cc->later.n;
	cc->later.n = 0;
	if (!cc->moved.n)
		return BACKEND_OK;
	snprintf(cc->errstr, sizeof(cc->errstr), "%s", why);
	return BACKEND_ERR;
}

/* Runs o on key's node, then sends the redirected commands again. */
static int slot_op(struct backend_conn *c, const char *key, size_t klen, struct op *o)
{
	struct cluster_conn *cc = CC(c);
	int rc = on_slot(cc, key, klen, o);

	send_moved(cc);
	return rc;
}

/* ---- the operations (backend.h) --------------------------------------- */

static int cluster_serves(const void *settings)
{
	const struct redis_spec *r = settings;

	return r->cluster != NULL;
}

static struct backend_config *cluster_config_new(const void *settings, char *err,
						 size_t errlen)
{
	const struct redis_spec *r = settings;
	struct backend_config *bc = backend_calloc(sizeof(*bc), err, errlen);

	if (!bc)
		return NULL;
	bc->r = r;
	pthread_mutex_init(&bc->mu, NULL);
	for (int s = 0; s < SLOTS; s++)
		bc->slot[s] = -1;
	return bc;
}

static void cluster_config_free(struct backend_config *bc)
{
	if (!bc)
		return;
	pthread_mutex_destroy(&bc->mu);
	free(bc);
}

/* Returns a connection to the cluster, with no node connected yet; the
 * map is learnt first when the process has none. */
static struct backend_conn *cluster_open(const struct backend_config *cbc, char *err,
					 size_t errlen)
{
	struct backend_config *bc = (struct backend_config *)cbc;
	struct cluster_conn *cc;
	int mapped;

	pthread_mutex_lock(&bc->mu);
	mapped = bc->mapped;
	pthread_mutex_unlock(&bc->mu);
	if (!mapped && refresh(bc, err, errlen) != 0)
		return NULL;
	if ((cc = backend_calloc(sizeof(*cc), err, errlen)) == NULL)
		return NULL;
	cc->bc = bc;
	return (struct backend_conn *)(void *)cc;
}

static void cluster_close(struct backend_conn *c)
{
	struct cluster_conn *cc = CC(c);

	if (!cc)
		return;
	for (int i = 0; i < NODES_MAX; i++)
		backend_redis_close(cc->node[i]);
	free(cc);
}

static int cluster_acquire(struct backend_conn *c, const struct backend_item *it,
			   long long *wait_ms, char *holder, size_t *holder_len, long long *fence)
{
	struct op o = { .run = run_acquire, .it = it, .holder = holder,
			.holder_len = holder_len };
	int rc = slot_op(c, it->key, it->klen, &o);

	*wait_ms = o.wait_ms;
	*fence = o.fence;
	return rc;
}

/* async is 0 or 1 on a node: the next release may go to another node. */
static int cluster_release(struct backend_conn *c, const struct backend_item *it, int async)
{
	struct op o = { .run = run_release, .it = it, .async = !!async, .fallback = run_unlock };

	return slot_op(c, it->key, it->klen, &o);
}

static int cluster_leave(struct backend_conn *c, const struct backend_item *it, int async)
{
	struct op o = { .run = run_leave, .it = it, .async = async, .fallback = run_unlock };

	return slot_op(c, it->key, it->klen, &o);
}

static int cluster_wait(struct backend_conn *c, const struct backend_item *it,
			long long timeout_ms, long long *fence)
{
	struct op o = { .run = run_wait, .it = it, .wait_ms = timeout_ms };
	int rc = slot_op(c, it->key, it->klen, &o);

	*fence = o.fence;
	/* the slot moved while we waited: the caller asks again there */
	return rc == BACKEND_ERR && strstr(CC(c)->errstr, "MOVED") ? BACKEND_OK : rc;
}

/* The metrics' hash (one hash tag: one slot) on the node serving it. */
static int cluster_count(struct backend_conn *c, const char *key, size_t klen, int n,
			 const char *const *fields, const size_t *flens, const long long *deltas)
{
	struct count_args a = { key, klen, n, fields, flens, deltas };
	struct op o = { .run = run_count, .count = &a };

	return slot_op(c, key, klen, &o);
}

/* Reads every node's asynchronous replies. */
static int cluster_flush(struct backend_conn *c)
{
	struct cluster_conn *cc = CC(c);
	int rc = BACKEND_OK;

	for (int i = 0; i < NODES_MAX; i++) {
		if (!cc->node[i])
			continue;
		if (backend_redis_flush(cc->node[i]) != BACKEND_OK) {
			snprintf(cc->errstr, sizeof(cc->errstr), "%s", backend_redis_errstr(cc->node[i]));
			node_drop(cc, i);
			rc = BACKEND_ERR;
			continue;
		}
		backend_redis_redirected(cc->node[i], keep, &cc->moved);
	}
	if (send_moved(cc) != BACKEND_OK)
		rc = BACKEND_ERR;
	return rc;
}

/* Passes the items of lst to fn and empties it. */
static void hand_over(struct redos *lst, void (*fn)(void *arg, const struct backend_item *it),
		      void *arg)
{
	for (int i = 0; i < lst->n; i++) {
		struct backend_item it = backend_copy_item(&lst->r[i]);

		fn(arg, &it);
	}
	lst->n = 0;
}

static void cluster_unconfirmed(struct backend_conn *c,
				void (*fn)(void *arg, const struct backend_item *it), void *arg)
{
	struct cluster_conn *cc = CC(c);

	for (int i = 0; i < NODES_MAX; i++)
		if (cc->node[i])
			backend_redis_unconfirmed(cc->node[i], fn, arg);
	hand_over(&cc->unsure, fn, arg);
	hand_over(&cc->moved, fn, arg);
}

/*
 * Renews n leases, one batch (one round trip) per node. Items a node
 * redirected are renewed one by one where they now live. When a node
 * cannot be reached (a primary killed), the map is learnt again from a
 * live node (once per call), and that node's items whose slots now live
 * elsewhere (its promoted replica) are renewed there: the renewal thread,
 * which may be all that runs in a process holding a lock, reaches a
 * promoted primary by itself. Returns BACKEND_OK, or BACKEND_ERR when a
 * node could not answer (the other nodes' batches are still sent).
 */
static int cluster_renew(struct backend_conn *c, int n, const struct backend_item *items,
			 int *results)
{
	struct cluster_conn *cc = CC(c);
	struct backend_item *batch = malloc(sizeof(*batch) * (size_t)(n ? n : 1));
	int *where = malloc(sizeof(int) * (size_t)(n ? n : 1) * 2), *res, rc = BACKEND_OK;
	int refreshed = 0;
	enum { DONE = -2 }; /* where[]: renewed with its node's batch */

	if (!batch || !where) {
		free(batch);
		free(where);
		snprintf(cc->errstr, sizeof(cc->errstr), "out of memory");
		return BACKEND_ERR;
	}
	res = where + n;
	for (int i = 0; i < n; i++)
		where[i] = route(cc, items[i].key, items[i].klen);
	for (int i = 0; i < n; i++) {
		int node = where[i], m = 0, brc = BACKEND_ERR, redir = 0, ask, gone;
		struct backend_conn *nc;

		if (node == DONE)
			continue;
		for (int k = i; k < n; k++)
			if (where[k] == node) {
				batch[m] = items[k];
				res[m++] = BACKEND_ERR;
			}
		nc = node >= 0 ? node_conn(cc, node) : NULL;
		if (nc) {
			brc = backend_redis_renew(nc, m, batch, res);
			backend_redis_redirected(nc, keep, &cc->moved);
		}
		if (nc && brc == BACKEND_ERR) {
			snprintf(cc->errstr, sizeof(cc->errstr), "%s", backend_redis_errstr(nc));
			redir = redirected(cc, cc->errstr, &ask) != -1;
			if (!redir)
				node_drop(cc, node);
		}
		/* unreachable: where do its slots live now? */
		gone = brc == BACKEND_ERR && !redir;
		if (gone && !refreshed) {
			char err[256];

			refreshed = 1;
			if (refresh(cc->bc, err, sizeof(err)) != 0)
				LOG(LOG_DEBUG, "cluster: %s", err);
		}
		for (int k = i, j = 0; k < n; k++) {
			struct op o = { .run = run_renew, .it = &items[k] };

			if (where[k] != node)
				continue;
			where[k] = DONE;
			results[k] = res[j++];
			if (results[k] == BACKEND_ERR &&
			    (redir || (gone && route(cc, items[k].key, items[k].klen) != node)))
				results[k] = on_slot(cc, items[k].key, items[k].klen, &o) ==
					     BACKEND_ERR ? BACKEND_ERR : o.result;
			if (results[k] == BACKEND_ERR)
				rc = BACKEND_ERR;
		}
	}
	free(batch);
	free(where);
	send_moved(cc);
	return rc;
}

static const char *cluster_errstr(const struct backend_conn *c)
{
	return CC((struct backend_conn *)c)->errstr;
}

/* Fills idx[] with the primaries that serve a slot, in slot order;
 * returns how many. */
static int primaries(struct backend_config *bc, int *idx)
{
	int n = 0;

	pthread_mutex_lock(&bc->mu);
	for (int s = 0; s < SLOTS; s++) {
		int k = 0;

		if (bc->slot[s] < 0)
			continue;
		while (k < n && idx[k] != bc->slot[s])
			k++;
		if (k == n)
			idx[n++] = bc->slot[s];
	}
	pthread_mutex_unlock(&bc->mu);
	return n;
}

/* PINGs every primary. */
static int cluster_ping(struct backend_conn *c)
{
	struct cluster_conn *cc = CC(c);
	int idx[NODES_MAX], n = primaries(cc->bc, idx);

	for (int i = 0; i < n; i++) {
		struct backend_conn *nc = node_conn(cc, idx[i]);

		if (!nc)
			return BACKEND_ERR;
		if (backend_redis_ping(nc) != BACKEND_OK) {
			snprintf(cc->errstr, sizeof(cc->errstr), "%s", backend_redis_errstr(nc));
			node_drop(cc, idx[i]);
			return BACKEND_ERR;
		}
	}
	return BACKEND_OK;
}

static int cluster_node_count(const struct backend_config *bc)
{
	int idx[NODES_MAX];

	return primaries((struct backend_config *)bc, idx);
}

/* Writes node's slot ranges ("0-5460 10923") into buf. */
static void slot_ranges(struct backend_config *bc, int node, char *buf, size_t len)
{
	size_t k = 0;

	buf[0] = 0;
	pthread_mutex_lock(&bc->mu);
	for (int s = 0; s < SLOTS && k < len; s++) {
		int e = s;

		if (bc->slot[s] != node)
			continue;
		while (e + 1 < SLOTS && bc->slot[e + 1] == node)
			e++;
		k += (size_t)(e > s ? snprintf(buf + k, len - k, "%s%d-%d", k ? " " : "", s, e) :
			      snprintf(buf + k, len - k, "%s%d", k ? " " : "", s));
		s = e;
	}
	pthread_mutex_unlock(&bc->mu);
}

static struct backend_conn *cluster_node_open(const struct backend_config *cbc, int i,
					      char *name, size_t namelen, char *tag,
					      size_t taglen, char *err, size_t errlen)
{
	struct backend_config *bc = (struct backend_config *)cbc;
	const struct redis_spec *r = bc->r;
	int idx[NODES_MAX], n = primaries(bc, idx), found = 0;
	struct redis_endpoint ep = { NULL, 0, NULL, r->username, r->password, 0,
				     r->wait_replicas };
	char ranges[128];
	struct node nd;

	if (i < 0 || i >= n) {
		snprintf(err, errlen, "no node %d", i);
		return NULL;
	}
	pthread_mutex_lock(&bc->mu);
	nd = bc->nodes[idx[i]];
	/* a hash tag whose slot this node serves */
	for (int k = 0; k < 100000 && !found; k++) {
		snprintf(tag, taglen, "%d", k);
		found = bc->slot[crc16(tag, strlen(tag)) % SLOTS] == idx[i];
	}
	pthread_mutex_unlock(&bc->mu);
	slot_ranges(bc, idx[i], ranges, sizeof(ranges));
	snprintf(name, namelen, "%s:%d (slots %s)", nd.host, nd.port, ranges);
	ep.host = nd.host;
	ep.port = nd.port;
	return backend_redis_connect(r, &ep, err, errlen);
}

/* Writes "a cluster of N primaries" into buf. */
static void cluster_describe(const struct backend_config *bc, char *buf, size_t len)
{
	int n = cluster_node_count(bc);

	snprintf(buf, len, "a cluster of %d primar%s", n, n == 1 ? "y" : "ies");
}

const struct backend_ops backend_cluster = {
	.name = "cluster",
	.settings = &backend_redis_settings,
	.serves = cluster_serves,
	.config_new = cluster_config_new,
	.config_free = cluster_config_free,
	.open = cluster_open,
	.describe = cluster_describe,
	.close = cluster_close,
	.acquire = cluster_acquire,
	.release = cluster_release,
	.wait = cluster_wait,
	.leave = cluster_leave,
	.flush = cluster_flush,
	.unconfirmed = cluster_unconfirmed,
	.renew = cluster_renew,
	.errstr = cluster_errstr,
	.ping = cluster_ping,
	.count = cluster_count,
	.node_count = cluster_node_count,
	.node_open = cluster_node_open,
};
