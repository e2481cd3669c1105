/* SPDX-License-Identifier: MIT */
/*
 * net_tls.h - TLS under net.c's sockets (redis.tls), with mbedTLS.
 *
 * net.c connects and owns the descriptor; this file runs TLS on it: the
 * handshake within the connect deadline (the socket polled, never blocked
 * on), then records through mbedtls_ssl_write/read on the blocking socket
 * with net.c's send/receive timeouts, sent with MSG_NOSIGNAL. Every call
 * happens after net.c's fdown_check, so a descriptor the program took back
 * is never touched. Failures are one line, "TLS: <cause>" (unknown CA,
 * name mismatch, expired, a plain-text server, a client certificate the
 * server wants or refused), or an errno for net.c to report as its own.
 */
#ifndef LOCKSHIM_NET_TLS_H
#define LOCKSHIM_NET_TLS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct fdown;
struct backend_tls; /* backend_tls_conf.h */
struct net_tls;   /* one TLS session */

/*
 * Runs the TLS handshake on own's connected socket, verifying the server
 * as cfg says against name (redis.tls.server_name, else the host), by
 * deadline (util_now_ms). Returns the session, or NULL with the cause in
 * why. own must stay where it is while the session lives. The files cfg
 * names are loaded at the first successful call of the process and kept:
 * one redis.tls per process (the config is frozen).
 */
struct net_tls *net_tls_open(struct fdown *own, const struct backend_tls *cfg, const char *name,
			     int64_t deadline, char *why, size_t whylen);

/*
 * Sends all of buf, or receives up to len bytes (> 0 returned), each
 * socket read with the recv(2) flags that flags(arg) returns (net.c's
 * deadline: a record dripped byte by byte ends there too; -1 fails the
 * read with errno). On failure
 * -1, with *e the errno of the socket call that failed (EAGAIN: the
 * timeout) or 0 and the cause in why. A session that failed stays failed.
 */
int net_tls_send(struct net_tls *t, const void *buf, size_t len, int *e, char *why,
		 size_t whylen);
ssize_t net_tls_recv(struct net_tls *t, void *buf, size_t len, int (*flags)(void *arg),
		     void *arg, int *e, char *why, size_t whylen);

/*
 * Returns 0 when the server has closed the session (end of stream, or an
 * alert such as close_notify next in line) or the session failed, else 1,
 * without blocking or consuming anything (net_alive over TLS). The caller
 * has checked that the descriptor is still its own.
 */
int net_tls_alive(struct net_tls *t);

/* Frees the session without any I/O (no close_notify); NULL is ignored. */
void net_tls_free(struct net_tls *t);

#endif
