/* SPDX-License-Identifier: MIT */
/*
 * net.c - the shim's sockets to Redis (see net.h).
 *
 * A socket is created close-on-exec and non-blocking for connect(2) with a
 * poll(2) bound, then made blocking with SO_RCVTIMEO/SO_SNDTIMEO, as hiredis
 * does: a command costs one send(2) and one recv(2). A send sets the
 * deadline of the replies; a reply that needs more than one recv polls
 * for what is left of it (recv_flags). Every use first asks
 * fdown_check whether the descriptor is still ours; a send that meets a
 * descriptor that is no socket (or none) re-checks its identity, so an
 * error never leads to closing the program's file. With redis.tls, the
 * handshake follows the connect within the same deadline, and sends and
 * receives go through the session (net_tls.c) after the same checks.
 */
#include "net.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "backend_redis_conf.h"
#include "net_tls.h"
#include "util.h"

static const char not_ours[] = "socket closed or replaced by the program";

static void set_err(char *err, size_t errlen, const char *what, int e)
{
	snprintf(err, errlen, "%s", what ? what : strerror(e));
}

/* Waits for a non-blocking connect on o to finish by deadline (ms).
 * Returns 0 or an errno value. */
static int connect_wait(struct fdown *o, int64_t deadline)
{
	struct pollfd p = { .fd = o->fd, .events = POLLOUT };
	socklen_t len = sizeof(int);
	int e = 0, n;

	for (;;) {
		int64_t left = deadline - util_now_ms();

		if (left <= 0)
			return ETIMEDOUT;
		n = poll(&p, 1, (int)left);
		if (n > 0)
			break;
		if (n == 0)
			return ETIMEDOUT;
		if (errno != EINTR)
			return errno;
	}
	if (getsockopt(o->fd, SOL_SOCKET, SO_ERROR, &e, &len) != 0)
		return errno;
	return e;
}

/* Connects one socket to addr. Returns 0 or an errno value (s stays empty). */
static int connect_one(struct net_sock *s, int family, const struct sockaddr *addr,
		       socklen_t alen, int64_t deadline)
{
	int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0), e = 0, one = 1;

	if (fd < 0)
		return errno;
	if ((e = -fdown_adopt(&s->own, fd)) != 0)
		return e;
	if (connect(s->own.fd, addr, alen) != 0) {
		e = errno == EINPROGRESS ? connect_wait(&s->own, deadline) : errno;
		if (e) {
			fdown_close(&s->own);
			return e;
		}
	}
	if (fcntl(s->own.fd, F_SETFL, fcntl(s->own.fd, F_GETFL) & ~O_NONBLOCK) != 0) {
		e = errno;
		fdown_close(&s->own);
		return e;
	}
	if (family != AF_UNIX)
		setsockopt(s->own.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	return 0;
}

int net_connect(struct net_sock *s, const char *host, int port, const char *path,
		const struct backend_tls *tls, int64_t connect_ms, int64_t io_ms, char *err,
		size_t errlen)
{
	int64_t deadline = util_now_ms() + connect_ms;
	char where[300], why[256] = "", service[16];
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM }, *res = NULL, *ai;
	int e = 0, rc;

	fdown_init(&s->own);
	s->timeout_ms = 0;
	s->deadline = 0;
	s->fresh = 0;
	s->keep = 0;
	s->tls = NULL;
	if (path) {
		struct sockaddr_un un = { .sun_family = AF_UNIX };

		snprintf(where, sizeof(where), "%s", path);
		if (strlen(path) >= sizeof(un.sun_path)) {
			e = ENAMETOOLONG;
		} else {
			memcpy(un.sun_path, path, strlen(path) + 1);
			e = connect_one(s, AF_UNIX, (struct sockaddr *)&un, sizeof(un), deadline);
		}
	} else {
		snprintf(where, sizeof(where), "%s:%d", host, port);
		snprintf(service, sizeof(service), "%d", port);
		rc = getaddrinfo(host, service, &hints, &res);
		if (rc != 0) {
			snprintf(why, sizeof(why), "%s", gai_strerror(rc));
			e = -1;
		}
		for (ai = res; rc == 0 && ai; ai = ai->ai_next) {
			e = connect_one(s, ai->ai_family, ai->ai_addr, ai->ai_addrlen, deadline);
			if (e == 0 || e == ETIMEDOUT)
				break;
		}
		if (res)
			freeaddrinfo(res);
	}
	if (e == 0 && net_timeout(s, io_ms, why, sizeof(why)) != 0)
		e = -1;
	if (e == 0 && tls && tls->enabled &&
	    !(s->tls = net_tls_open(&s->own, tls, tls->server_name ? tls->server_name :
				    host ? host : path, deadline, why, sizeof(why))))
		e = -1;
	if (e != 0) {
		net_close(s);
		snprintf(err, errlen, "connect to %s: %s", where,
			 why[0] ? why : e == ETIMEDOUT ? "Connection timed out" : strerror(e));
		return -1;
	}
	return 0;
}

int net_timeout(struct net_sock *s, int64_t ms, char *err, size_t errlen)
{
	struct timeval tv = { (time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000 };

	if (ms == s->timeout_ms)
		return 0;
	if (!fdown_check(&s->own)) {
		set_err(err, errlen, not_ours, 0);
		return -1;
	}
	if (setsockopt(s->own.fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) != 0 ||
	    setsockopt(s->own.fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) != 0) {
		set_err(err, errlen, NULL, errno);
		return -1;
	}
	s->timeout_ms = ms;
	return 0;
}

/* After a failed call with errno e: a descriptor that is no socket, or
 * none, is re-checked, so that it is never closed if it is not ours. */
static void failed(struct net_sock *s, int e, char *err, size_t errlen)
{
	if ((e == ENOTSOCK || e == EBADF) && !fdown_verify(&s->own)) {
		set_err(err, errlen, not_ours, 0);
		return;
	}
	if (e == EAGAIN || e == EWOULDBLOCK)
		snprintf(err, errlen, "timed out after %lld ms", (long long)s->timeout_ms);
	else
		set_err(err, errlen, NULL, e);
}

int net_send(struct net_sock *s, const void *buf, size_t len, char *err, size_t errlen)
{
	const char *p = buf;
	int64_t now;

	if (!fdown_check(&s->own)) {
		set_err(err, errlen, not_ours, 0);
		return -1;
	}
	now = util_now_ms();
	if (!s->keep || s->deadline <= now) {
		s->deadline = now + s->timeout_ms;
		s->fresh = 1;
	} else {
		s->fresh = 0; /* the first recv polls too: the socket's timeout is longer */
	}
	s->keep = 0;
	if (s->tls) {
		int e = 0;

		if (net_tls_send(s->tls, buf, len, &e, err, errlen) == 0)
			return 0;
		if (e)
			failed(s, e, err, errlen);
		return -1;
	}
	while (len > 0) {
		ssize_t n = send(s->own.fd, p, len, MSG_NOSIGNAL);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			failed(s, errno, err, errlen);
			return -1;
		}
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

/*
 * The flags of the next recv(2) on s, to obey its deadline. The first recv
 * since the send (s->fresh, then cleared) blocks as it is: the socket's
 * timeout, set when the deadline was, ends it by then, at no extra system
 * call. A later one first polls for what is left; past the deadline it
 * only takes what is there. Returns 0 or MSG_DONTWAIT (a recv that would
 * wait then fails with EAGAIN, the timeout), or -1 with errno set.
 */
static int recv_flags(struct net_sock *s)
{
	struct pollfd p = { .fd = s->own.fd, .events = POLLIN };
	int64_t left;
	int n;

	if (!s->deadline || s->fresh) {
		s->fresh = 0;
		return 0;
	}
	do {
		left = s->deadline - util_now_ms();
		if (left <= 0)
			return MSG_DONTWAIT;
		n = poll(&p, 1, left > INT_MAX ? INT_MAX : (int)left);
	} while (n < 0 && errno == EINTR);
	return n < 0 ? -1 : n == 0 ? MSG_DONTWAIT : 0;
}

/* recv_flags for net_tls.c's reads (arg: the net_sock). */
static int tls_recv_flags(void *arg)
{
	return recv_flags(arg);
}

ssize_t net_recv(struct net_sock *s, void *buf, size_t len, char *err, size_t errlen)
{
	if (!fdown_check(&s->own)) {
		set_err(err, errlen, not_ours, 0);
		return -1;
	}
	if (s->tls) {
		int e = 0;
		ssize_t n = net_tls_recv(s->tls, buf, len, tls_recv_flags, s, &e, err, errlen);

		if (n < 0 && e)
			failed(s, e, err, errlen);
		return n;
	}
	for (;;) {
		int flags = recv_flags(s);
		ssize_t n = flags < 0 ? -1 : recv(s->own.fd, buf, len, flags);

		if (n > 0)
			return n;
		if (n == 0) {
			set_err(err, errlen, "Server closed the connection", 0);
			return -1;
		}
		if (errno != EINTR) {
			failed(s, errno, err, errlen);
			return -1;
		}
	}
}

void net_close(struct net_sock *s)
{
	net_tls_free(s->tls);
	s->tls = NULL;
	fdown_close(&s->own);
	s->timeout_ms = 0;
	s->deadline = 0;
	s->fresh = 0;
	s->keep = 0;
}

int net_alive(struct net_sock *s)
{
	char c;
	ssize_t n;

	if (!fdown_check(&s->own))
		return 0;
	if (s->tls)
		return net_tls_alive(s->tls);
	do
		n = recv(s->own.fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
	while (n < 0 && errno == EINTR);
	return n > 0 || (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK));
}
