/* SPDX-License-Identifier: MIT */
/*
 * scope.c - the programs the shim acts in (see scope.h).
 *
 * The exempt table names the programs never in scope. The lock servers:
 * under a system-wide preload a `rename` lock would otherwise be taken by
 * the very server that must grant it (redis-server's SAVE renames its
 * dump), a self-deadlock. Debian's /usr/bin/redis-server is a link to
 * redis-check-rdb, so the table is matched on the resolved file name. And
 * lockshim's own command.
 * Everything here runs in the constructor of every program the shim is
 * preloaded into, so it is a readlink(2) and a few fnmatch(3) calls: no
 * allocation, no file opened.
 */
#include "scope.h"

#include <fnmatch.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "log.h"

/* The programs never in scope (the executable's file name), and why: the
 * lock servers' own (a further backend's server programs go here too), and
 * lockshim's command, which must be able to undo a system-wide preload
 * (`lockshim disable` renames /etc/ld.so.preload) while the server is down. */
static const struct {
	const char *pattern, *what;
} exempt[] = {
	{ "redis-server", "a lock server's own program" },
	{ "redis-sentinel", "a lock server's own program" },
	{ "redis-check-*", "a lock server's own program" },
	{ "valkey-*", "a lock server's own program" },
	{ "keydb-server", "a lock server's own program" },
	{ "lockshim", "lockshim's own command" },
	{ NULL, NULL }
};

int scope_self(struct scope_exe *x)
{
	const char *slash;

	if (!log_self_exe(x->path, sizeof(x->path))) {
		x->name = x->path;
		return -1;
	}
	slash = strrchr(x->path, '/');
	x->name = slash ? slash + 1 : x->path;
	return 0;
}

/* Returns the index in exempt[] of x's file name, or -1. */
static int exempt_index(const struct scope_exe *x)
{
	for (int i = 0; exempt[i].pattern; i++)
		if (fnmatch(exempt[i].pattern, x->name, 0) == 0)
			return i;
	return -1;
}

const char *scope_exempt(const struct scope_exe *x)
{
	int i = exempt_index(x);

	return i < 0 ? NULL : exempt[i].pattern;
}

int scope_match(char *const *pats, const struct scope_exe *x)
{
	if (!pats)
		return 1;
	for (int i = 0; pats[i]; i++)
		if (fnmatch(pats[i], x->path, 0) == 0 || fnmatch(pats[i], x->name, 0) == 0)
			return 1;
	return 0;
}

/* Writes s to fd with control characters escaped, as one line. */
static void report_line(int fd, const char *s)
{
	char line[4 * PATH_MAX];
	size_t n = log_escape(line, sizeof(line) - 1, s, strlen(s));

	line[n++] = '\n';
	if (write(fd, line, n) < 0) {
		/* `lockshim check` is gone: nothing to tell */
	}
}

/* Writes "pattern", "pattern" ... of pats to buf (cap bytes). */
static void list_patterns(char *buf, size_t cap, char *const *pats)
{
	size_t n = 0;

	buf[0] = 0;
	for (int i = 0; pats && pats[i] && n < cap; i++)
		n += (size_t)snprintf(buf + n, cap - n, "%s\"%s\"", i ? ", " : "", pats[i]);
}

struct keep_arg {
	const struct scope_exe *x;
	int report;
};

static int keep_lock(const struct lock_spec *l, void *arg)
{
	const struct keep_arg *k = arg;
	char pats[1024], line[2 * PATH_MAX + 2048];

	if (scope_match(l->programs, k->x))
		return 1;
	if (k->report >= 0) {
		list_patterns(pats, sizeof(pats), l->programs);
		snprintf(line, sizeof(line), "%s: out of scope (locks[%d].programs %s match "
			 "neither %s nor %s)", l->symbol, l->index, pats, k->x->path, k->x->name);
		report_line(k->report, line);
	}
	return 0;
}

int scope_keep(struct conf *cfg, const struct scope_exe *x, int report)
{
	struct keep_arg k = { x, report };

	return conf_keep_locks(cfg, keep_lock, &k);
}

void scope_report_program(int fd, const struct scope_exe *x, char *const *pats)
{
	char why[2 * PATH_MAX + 1200], line[3 * PATH_MAX + 1300];

	if (pats) {
		char list[1024];

		list_patterns(list, sizeof(list), pats);
		snprintf(why, sizeof(why), "programs %s match neither %s nor %s", list, x->path,
			 x->name);
	} else {
		int i = exempt_index(x);

		snprintf(why, sizeof(why), "%s (%s) is never in scope",
			 i < 0 ? "a program" : exempt[i].what, i < 0 ? x->name : exempt[i].pattern);
	}
	snprintf(line, sizeof(line), "%s: out of scope (%s); nothing is guarded in this program",
		 x->path[0] ? x->path : "the program", why);
	report_line(fd, line);
}
