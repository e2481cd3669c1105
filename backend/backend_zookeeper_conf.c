/* SPDX-License-Identifier: MIT */
/*
 * backend_zookeeper_conf.c - the `zookeeper` group of the file (hosts,
 * root, session_timeout_ms, connect_timeout_ms, command_timeout_ms), its
 * check, and the lock settings the zookeeper backend refuses. The lease
 * of a ZooKeeper lock is its process's session (heartbeats by the client
 * library, session_timeout_ms), not a per-lock lease: the settings that
 * tune a lease (lease_ms, retry_max_ms, break_dead_holders, handoff_ms)
 * are refused when the file sets them, in a lock or in `defaults`;
 * on_lost is accepted (a session's expiry loses every lock of the
 * process, each reported through on_lost), and so are linger_ms,
 * max_hold_ms and on_overrun (the shim's renewal thread keeps and
 * releases a leaseless lock, as for the local backend), and so are
 * limit and mode (holder sets, in the module). fair is
 * honoured: the recipe is FIFO by creation. method = "entry" is refused
 * where it may patch a C library function (zk_check_lock). linger_ms's
 * built-in value is 0 here (conf_no_linger). This file is in the core: backend.c
 * registers it.
 */
#include "backend_zookeeper_conf.h"

#include <stdio.h>
#include <string.h>

#include "conf.h"
#include "conf_field.h"

#define ZK_FIELD(n, k, lo, hi, ...) FIELD(struct zookeeper_spec, #n, n, k, lo, hi, __VA_ARGS__)
static const struct conf_field zk_fields[] = {
	ZK_FIELD(hosts, F_STR, 1, 4096, .def_str = "127.0.0.1:2181"),
	ZK_FIELD(root, F_STR, 2, 512, .def_str = "/lockshim"),
	ZK_FIELD(session_timeout_ms, F_INT, 1000, 600000, .def = 10000),
	ZK_FIELD(connect_timeout_ms, F_INT, 1, 600000, .def = 5000),
	ZK_FIELD(command_timeout_ms, F_INT, 1, 600000, .def = 5000),
	{ .name = NULL }
};

/* The group's check: root is an absolute znode path ("/a/b", no trailing
 * "/", no empty, "." or ".." component). Returns 0, or -1 said with
 * conf_fail. */
static int zk_check(struct conf_err *e, const config_setting_t *g, void *data)
{
	const struct zookeeper_spec *z = data;
	const char *p = z->root;

	if (p[0] != '/' || p[strlen(p) - 1] == '/')
		goto bad;
	while (*p) {
		size_t n = strcspn(++p, "/");

		if (n == 0 || (n == 1 && p[0] == '.') || (n == 2 && p[0] == '.' && p[1] == '.'))
			goto bad;
		p += n;
	}
	return 0;
bad:
	return conf_fail(e, config_setting_get_member(g, "root"), "zookeeper.root",
			 "\"%s\" is not an absolute znode path (\"/lockshim\", \"/a/b\")", z->root);
}

/* The settings a session-bound lock cannot honour, refused when the file
 * sets them. */
static const struct conf_refusal unavailable[] = {
	{ "lease_ms", "the lease is the process's ZooKeeper session (zookeeper."
	  "session_timeout_ms)" },
	{ "retry_max_ms", "a waiter is woken by the watch on its predecessor's znode" },
	{ "break_dead_holders", "a dead holder's znode vanishes with its session" },
	{ "handoff_ms", "the lowest znode holds: nothing is handed over" },
	{ NULL, NULL }
};

/* The values not built yet for this backend, refused when a lock asks:
 * none since step 5 (limit and mode). */
static const struct conf_refusal unbuilt[] = {
	{ NULL, NULL }
};

/* Returns 1 when object names the C library (libc.so.6, libpthread...,
 * by file name or path), else 0. */
static int object_is_libc(const char *object)
{
	const char *base = strrchr(object, '/');

	base = base ? base + 1 : object;
	return !strncmp(base, "libc.", 5) || !strcmp(base, "libc") ||
	       !strncmp(base, "libpthread", 10);
}

/*
 * Refuses `method = "entry"` on a function that may be libc's (no object,
 * or libc named): an entry patch catches every caller,
 * libzookeeper's own I/O and completion threads included, which run
 * outside the shim's guard: their poll or send would wait for a lock only
 * they can take. Returns 0, or -1 said with conf_fail.
 */
static int zk_check_lock(struct conf_err *e, const config_setting_t *lg, const char *where,
			 const struct lock_spec *l, const struct conf *cfg, const void *data)
{
	char what[64];

	(void)cfg;
	(void)data;
	if (l->method == METHOD_ENTRY && (!l->object || object_is_libc(l->object))) {
		const config_setting_t *s = lg ? config_setting_get_member(lg, "method") : NULL;

		snprintf(what, sizeof(what), "%s.method", where);
		return conf_fail(e, s ? s : lg, what, "method = \"entry\" %s is not available with "
				 "backend \"zookeeper\": the entry of a C library function would catch "
				 "libzookeeper's own threads too (outside the shim's guard); name the "
				 "function's object (\"main\" or its library) or use \"reloc\"",
				 l->object ? "on a C library function" : "without object");
	}
	return 0;
}

/* The longest request: a command (a wait adds its own time). */
static long long zk_request_ms(const void *data)
{
	return ((const struct zookeeper_spec *)data)->command_timeout_ms;
}

const struct conf_group backend_zookeeper_settings = {
	.name = "zookeeper",
	.fields = zk_fields,
	.size = sizeof(struct zookeeper_spec),
	.check = zk_check,
	.check_lock = zk_check_lock,
	.check_defaults = zk_check_lock,
	.unavailable = unavailable,
	.unbuilt = unbuilt,
	.lock_defaults = conf_no_linger,
	.request_ms = zk_request_ms,
};
