/* SPDX-License-Identifier: MIT */
/*
 * backend_sentinel.c - a primary managed by Redis Sentinel (backend.h).
 *
 * Finds the primary as the Sentinel client guidelines say: the sentinels in
 * turn (the one that answered last first), within the connect and command
 * timeouts, are asked `SENTINEL get-master-addr-by-name`; the address given
 * must answer `ROLE` with "master". The address found is kept for the next
 * connection, which checks ROLE again, and its replication offset: the same
 * server's only grows, so a server that answers there after a restart (the
 * old primary, empty, before the sentinels make it a replica) is not
 * trusted and the sentinels are asked. Everything else is backend_redis.c's:
 * any error, a READONLY reply from a demoted primary included, drops the
 * connection in lock.c or renew.c, and the next one is resolved again.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend_redis.h"
#include "log.h"

struct backend_config {
	const struct redis_spec *r;
	pthread_mutex_t mu;      /* guards what follows */
	char host[256];          /* the primary found last; "" none */
	int port;
	long long offset;        /* its replication offset, the highest seen */
	int next;                /* the sentinel to ask first */
};

static int sentinel_serves(const void *settings)
{
	const struct redis_spec *r = settings;

	return r->sentinels != NULL;
}

static struct backend_config *sentinel_config_new(const void *settings, char *err,
						  size_t errlen)
{
	const struct redis_spec *r = settings;
	struct backend_config *bc = backend_calloc(sizeof(*bc), err, errlen);

	if (!bc)
		return NULL;
	bc->r = r;
	pthread_mutex_init(&bc->mu, NULL);
	return bc;
}

static void sentinel_config_free(struct backend_config *bc)
{
	if (!bc)
		return;
	pthread_mutex_destroy(&bc->mu);
	free(bc);
}

/*
 * Asks sentinel i for the primary's address. Returns 0 with host and port
 * set, or -1 with the reason in why.
 */
static int ask(const struct redis_spec *r, int i, char *host, size_t len, int *port,
	       char *why, size_t whylen)
{
	const char *argv[] = { "SENTINEL", "get-master-addr-by-name", r->master_name };
	struct redis_endpoint ep = { .username = r->sentinel_username,
				     .password = r->sentinel_password };
	char shost[256], err[256];
	struct backend_conn *c;
	redisReply *rep;
	int rc = -1;

	if (backend_redis_split_addr(r->sentinels[i], shost, sizeof(shost), &ep.port) != 0) {
		snprintf(why, whylen, "not host:port");
		return -1;
	}
	ep.host = shost;
	c = backend_redis_connect(r, &ep, err, sizeof(err));
	if (!c) {
		if (strstr(err, "WRONGPASS"))
			snprintf(why, whylen, "WRONGPASS (sentinel_username, sentinel_password)");
		else if (strstr(err, "NOAUTH"))
			snprintf(why, whylen, "NOAUTH (set sentinel_password)");
		else
			snprintf(why, whylen, "%s", err);
		return -1;
	}
	rep = backend_redis_command(c, 3, argv);
	if (!rep)
		snprintf(why, whylen, "%s", backend_redis_errstr(c));
	else if (rep->type == REDIS_REPLY_NIL)
		snprintf(why, whylen, "does not know master \"%s\"", r->master_name);
	else if (rep->type != REDIS_REPLY_ARRAY || rep->elements != 2 ||
		 rep->element[0]->type != REDIS_REPLY_STRING ||
		 rep->element[1]->type != REDIS_REPLY_STRING)
		snprintf(why, whylen, "unexpected reply to SENTINEL get-master-addr-by-name%s%s",
			 rep->type == REDIS_REPLY_ERROR ? ": " : "",
			 rep->type == REDIS_REPLY_ERROR ? rep->str : "");
	else if (rep->element[0]->len >= len)
		snprintf(why, whylen, "host name too long");
	else {
		snprintf(host, len, "%s", rep->element[0]->str);
		*port = atoi(rep->element[1]->str);
		rc = 0;
	}
	if (rep)
		freeReplyObject(rep);
	backend_redis_close(c);
	return rc;
}

/*
 * Connects to host:port and checks with ROLE that it is a primary whose
 * replication offset is at least *offset (the one a server of that address
 * had: a lower one is another server, or the same restarted); sets *offset
 * to its offset. Returns the connection, or NULL with the reason in why.
 */
static struct backend_conn *primary(const struct redis_spec *r, const char *host, int port,
				    long long *offset, char *why, size_t whylen)
{
	const char *argv[] = { "ROLE" };
	struct redis_endpoint ep = { host, port, NULL, r->username, r->password, r->db,
				     r->wait_replicas };
	char err[256];
	struct backend_conn *c = backend_redis_connect(r, &ep, err, sizeof(err));
	redisReply *rep;
	int ok;

	if (!c) {
		snprintf(why, whylen, "%s", err);
		return NULL;
	}
	rep = backend_redis_command(c, 1, argv);
	ok = rep && rep->type == REDIS_REPLY_ARRAY && rep->elements > 1 &&
	     rep->element[0]->type == REDIS_REPLY_STRING &&
	     strcmp(rep->element[0]->str, "master") == 0 &&
	     rep->element[1]->type == REDIS_REPLY_INTEGER;
	if (ok && rep->element[1]->integer < *offset) {
		snprintf(why, whylen, "%s:%d is a primary whose replication offset went back "
			 "from %lld to %lld (restarted?)", host, port, *offset,
			 rep->element[1]->integer);
		ok = 0;
	} else if (ok) {
		*offset = rep->element[1]->integer;
	} else {
		snprintf(why, whylen, "%s:%d is not a primary (ROLE: %s)", host, port,
			 !rep ? backend_redis_errstr(c) :
			 rep->type == REDIS_REPLY_ARRAY && rep->elements > 0 &&
			 rep->element[0]->type == REDIS_REPLY_STRING ? rep->element[0]->str :
			 rep->type == REDIS_REPLY_ERROR ? rep->str : "unexpected reply");
	}
	if (rep)
		freeReplyObject(rep);
	if (!ok) {
		backend_redis_close(c);
		return NULL;
	}
	return c;
}

static struct backend_conn *sentinel_open(const struct backend_config *cbc, char *err,
					  size_t errlen)
{
	struct backend_config *bc = (struct backend_config *)cbc;
	const struct redis_spec *r = bc->r;
	char host[256], why[320] = "";
	struct backend_conn *c;
	int port, n = 0, first;
	long long offset;
	size_t used = 0;

	pthread_mutex_lock(&bc->mu);
	snprintf(host, sizeof(host), "%s", bc->host);
	port = bc->port;
	offset = bc->offset;
	first = bc->next;
	pthread_mutex_unlock(&bc->mu);
	if (host[0] && (c = primary(r, host, port, &offset, why, sizeof(why)))) {
		pthread_mutex_lock(&bc->mu);
		if (strcmp(bc->host, host) == 0 && bc->port == port && offset > bc->offset)
			bc->offset = offset;
		pthread_mutex_unlock(&bc->mu);
		return c;
	}
	if (host[0] && strstr(why, "went back"))
		LOG(LOG_INFO, "sentinel: %s; asking the sentinels", why);
	while (r->sentinels[n])
		n++;
	used = (size_t)snprintf(err, errlen, "no primary for \"%s\" through the sentinels:",
				r->master_name);
	for (int k = 0; k < n; k++) {
		int i = (first + k) % n;
		/* every sentinel is named, its reason cut to share err */
		int room = (int)(errlen / (size_t)n) - (int)strlen(r->sentinels[i]) - 6;

		if (ask(r, i, host, sizeof(host), &port, why, sizeof(why)) != 0) {
			if (used < errlen)
				used += (size_t)snprintf(err + used, errlen - used, " %s: %.*s;",
							 r->sentinels[i], room > 8 ? room : 8, why);
			continue;
		}
		offset = 0; /* the sentinels' answer: any offset */
		if ((c = primary(r, host, port, &offset, why, sizeof(why)))) {
			pthread_mutex_lock(&bc->mu);
			if (strcmp(bc->host, host) != 0 || bc->port != port)
				LOG(LOG_INFO, "sentinel %s: the primary of \"%s\" is %s:%d",
				    r->sentinels[i], r->master_name, host, port);
			snprintf(bc->host, sizeof(bc->host), "%s", host);
			bc->port = port;
			bc->offset = offset;
			bc->next = i;
			pthread_mutex_unlock(&bc->mu);
			return c;
		}
		if (used < errlen)
			used += (size_t)snprintf(err + used, errlen - used, " %s gave %s:%d: %.*s;",
						 r->sentinels[i], host, port, room > 8 ? room : 8, why);
	}
	pthread_mutex_lock(&bc->mu);
	bc->host[0] = 0;
	pthread_mutex_unlock(&bc->mu);
	if (used >= errlen)
		used = errlen - 1;
	if (used && err[used - 1] == ';')
		err[used - 1] = 0;
	return NULL;
}

/* Writes the primary found last ("HOST:PORT via the sentinels") into buf. */
static void sentinel_describe(const struct backend_config *cbc, char *buf, size_t len)
{
	struct backend_config *bc = (struct backend_config *)cbc;

	pthread_mutex_lock(&bc->mu);
	snprintf(buf, len, "primary %s:%d of \"%s\", found through sentinel %s", bc->host,
		 bc->port, bc->r->master_name, bc->r->sentinels[bc->next]);
	pthread_mutex_unlock(&bc->mu);
}

const struct backend_ops backend_sentinel = {
	.name = "sentinel",
	.settings = &backend_redis_settings,
	.serves = sentinel_serves,
	.config_new = sentinel_config_new,
	.config_free = sentinel_config_free,
	.open = sentinel_open,
	.describe = sentinel_describe,
	REDIS_CONN_OPS,
};
