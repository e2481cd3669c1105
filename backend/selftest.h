/* SPDX-License-Identifier: MIT */
/*
 * selftest.h - `lockshim check`'s test of the lock server: the commands the
 * shim really sends, on a probe key of its own.
 */
#ifndef LOCKSHIM_SELFTEST_H
#define LOCKSHIM_SELFTEST_H

#include <stddef.h>

struct conf;

/*
 * Connects as the shim would (the backend that serves cfg) and runs, on
 * "<namespace>:{lockshim-check:<host>:<pid>}" (a node's hash tag first
 * inside the braces when each node of a cluster is probed), an acquire (the acquire script), a renewal, an acquire through
 * the queue script, a short wait for a wake-up (BLPOP), a release and a
 * leave. Returns 0 with what was done in msg, or -1 with the failed step,
 * Redis's words and the likely cause (an ACL user without EVAL, a Cluster
 * node, a read-only replica, a TLS-only port, ...) in msg.
 * BACKEND_INIT_MODULE: the backend's module cannot be loaded (msg says
 * what to install).
 */
int selftest_run(const struct conf *cfg, char *msg, size_t len);

#endif
