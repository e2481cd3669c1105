/* SPDX-License-Identifier: MIT */
/*
 * net.h - the shim's sockets to Redis.
 *
 * Connects within a timeout, sends with MSG_NOSIGNAL (a connection that
 * Redis closed never raises SIGPIPE in the program, and no signal mask or
 * disposition is touched), receives by a deadline set at the last send
 * (the timeout bounds all the replies, not each recv), and never reads,
 * writes or closes a descriptor that the program closed or replaced
 * (fdown.h). With redis.tls, the same calls run TLS over the socket
 * (net_tls.h). One socket is used by one thread at a time. Errors are one
 * line in the caller's buffer.
 */
#ifndef LOCKSHIM_NET_H
#define LOCKSHIM_NET_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "fdown.h"

struct net_tls; /* net_tls.h */

struct net_sock {
	struct fdown own;
	int64_t timeout_ms;  /* send/receive timeout currently set */
	int64_t deadline;    /* util_now_ms() at the last send + timeout_ms, or 0 */
	int fresh;           /* no recv since that send */
	int keep;            /* the next send keeps the deadline, while it lasts */
	struct net_tls *tls; /* the TLS session (redis.tls), or NULL */
};

struct backend_tls; /* backend_tls_conf.h */

/*
 * Connects to the unix socket path, or else to host:port, within
 * connect_ms, and sets the send and receive timeout to io_ms. With tls (not
 * NULL and enabled), the TLS handshake completes within connect_ms too.
 * Returns 0, or -1 with "connect to WHERE: REASON" in err (s is then empty).
 */
int net_connect(struct net_sock *s, const char *host, int port, const char *path,
		const struct backend_tls *tls, int64_t connect_ms, int64_t io_ms, char *err,
		size_t errlen);

/* Sets the send/receive timeout (no system call when unchanged). Returns 0 or -1. */
int net_timeout(struct net_sock *s, int64_t ms, char *err, size_t errlen);

/* Sends all of buf, and sets the deadline of the replies: now + the
 * timeout (when keep is set and the deadline not past, the one set already:
 * a new connection's set-up and first command share one). Returns 0, or
 * -1 with the reason in err. */
int net_send(struct net_sock *s, const void *buf, size_t len, char *err, size_t errlen);

/* Receives up to len bytes by the deadline of the last send: however the
 * server drips its bytes, every recv after the first one since that send
 * waits only for what is left of it. Returns how many (> 0), or -1 with
 * the reason in err (closed by the server, timed out, ...). */
ssize_t net_recv(struct net_sock *s, void *buf, size_t len, char *err, size_t errlen);

/* Closes the socket if it is still ours; s is empty afterwards. */
void net_close(struct net_sock *s);

/*
 * Returns 0 when the server has closed the connection (or it is no longer
 * the shim's), else 1, without blocking or reading anything: one
 * recv(MSG_PEEK | MSG_DONTWAIT). A command written to a closed connection
 * is lost without an error (the first write succeeds locally), and one
 * whose reply nobody waits for (an asynchronous release) would be lost in
 * silence. Over TLS, an alert next in line (close_notify) counts as closed.
 */
int net_alive(struct net_sock *s);

#endif
