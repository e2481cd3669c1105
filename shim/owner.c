/* SPDX-License-Identifier: MIT */
/*
 * owner.c - lock holder identity and liveness (see owner.h).
 *
 * The identity is read once per process (after fork, again): the boot id
 * from /proc/sys/kernel/random/boot_id, the pid namespace from the link
 * /proc/self/ns/pid, the start time from /proc/self/stat. The first thread
 * that needs it reads it under a mutex into `me` and then publishes it
 * (release store); every later use is one acquire load, and no thread ever
 * sees a half-written identity. It is trusted
 * only when /proc is this pid namespace's (the link /proc/self names our
 * own pid); otherwise no holder is ever judged gone. A holder is gone when
 * its boot id and namespace are ours and no process has its pid, or that
 * process is a zombie, or it started at another time (the pid was reused).
 * Anything that does not parse, or another machine or namespace, counts as
 * alive: a live holder's lock is never broken, a dead one on another
 * machine expires with its lease.
 */
#include "owner.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BOOT_ID_LEN 36

static struct {
	int pid;
	int trusted;    /* /proc shows our pid namespace */
	unsigned long long ns, start;
	char boot[BOOT_ID_LEN + 1]; /* "" when unknown */
	char host[256];             /* never empty, no ':' nor blank */
} me;                               /* written only by load(), before `ready` */
static atomic_int ready;            /* me holds this process's identity */
static pthread_mutex_t load_mu = PTHREAD_MUTEX_INITIALIZER;

/* Reads up to cap - 1 bytes of path into buf. Returns the length or -errno. */
static ssize_t read_file(const char *path, char *buf, size_t cap)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	ssize_t n;

	if (fd < 0)
		return -errno;
	n = read(fd, buf, cap - 1);
	if (n < 0)
		n = -errno;
	close(fd);
	if (n >= 0)
		buf[n] = 0;
	return n;
}

/* Returns the inode in a namespace link "pid:[4026531836]", or 0. */
static unsigned long long ns_inode(const char *link)
{
	char buf[64];
	ssize_t n = readlink(link, buf, sizeof(buf) - 1);

	if (n <= 0)
		return 0;
	buf[n] = 0;
	return strncmp(buf, "pid:[", 5) == 0 ? strtoull(buf + 5, NULL, 10) : 0;
}

/*
 * Parses /proc/<pid>/stat text: the state letter and the start time (field
 * 22, counted after the command name, which may hold spaces and ")").
 * Returns 0 or -1.
 */
static int parse_stat(const char *text, char *state, unsigned long long *start)
{
	const char *p = strrchr(text, ')');

	if (!p || p[1] != ' ' || !p[2])
		return -1;
	*state = p[2];
	p += 3;
	for (int field = 3; field < 22; field++) {
		p = strchr(p, ' ');
		if (!p)
			return -1;
		p++;
	}
	*start = strtoull(p, NULL, 10);
	return 0;
}

/* Reads this process's identity into me. Called with load_mu held. */
static void load(void)
{
	char buf[1024], self[32];
	ssize_t n;
	char state;
	int pid = getpid();

	memset(&me, 0, sizeof(me));
	if (gethostname(me.host, sizeof(me.host) - 1) != 0 || !me.host[0])
		strcpy(me.host, "unknown");
	for (char *p = me.host; *p; p++) /* one field of the value, printable */
		if (*p == ':' || *p <= ' ' || *p > '~')
			*p = '-';
	me.ns = ns_inode("/proc/self/ns/pid");
	n = readlink("/proc/self", self, sizeof(self) - 1);
	if (n > 0)
		self[n] = 0;
	me.trusted = n > 0 && atoi(self) == pid && me.ns != 0;
	if (read_file("/proc/sys/kernel/random/boot_id", buf, sizeof(buf)) >= BOOT_ID_LEN)
		memcpy(me.boot, buf, BOOT_ID_LEN);
	else
		me.trusted = 0;
	if (read_file("/proc/self/stat", buf, sizeof(buf)) <= 0 ||
	    parse_stat(buf, &state, &me.start) != 0)
		me.trusted = 0;
	for (char *p = me.boot; *p; p++)
		if (*p == ':')
			*p = '-';
	me.pid = pid;
}

/* Reads the identity on first use in this process. Returns with me
 * complete and visible to the calling thread. */
static void identity(void)
{
	if (atomic_load_explicit(&ready, memory_order_acquire))
		return;
	pthread_mutex_lock(&load_mu);
	if (!atomic_load_explicit(&ready, memory_order_relaxed)) {
		load();
		atomic_store_explicit(&ready, 1, memory_order_release);
	}
	pthread_mutex_unlock(&load_mu);
}

size_t owner_suffix(char *buf, size_t cap, int tid)
{
	int n;

	identity();
	n = snprintf(buf, cap, ":%.255s:%d:%d:%s:%llu:%llu", me.host, me.pid, tid,
		     me.boot[0] ? me.boot : "-", me.ns, me.start);
	return n < 0 ? 0 : (size_t)n >= cap ? cap - 1 : (size_t)n;
}

void owner_atfork_child(void)
{
	/* The only thread of the child; a parent thread may have held load_mu
	 * when fork copied it. */
	pthread_mutex_init(&load_mu, NULL);
	atomic_store_explicit(&ready, 0, memory_order_relaxed);
}

/* Parses a decimal field [p, end) into *v. Returns 0 or -1. */
static int num(const char *p, const char *end, unsigned long long *v)
{
	*v = 0;
	if (p >= end || end - p > 20)
		return -1;
	for (; p < end; p++) {
		if (*p < '0' || *p > '9')
			return -1;
		*v = *v * 10 + (unsigned long long)(*p - '0');
	}
	return 0;
}

/* Splits the last n ':'-separated fields of val[0..len) off into f[0..n)
 * (f[0] the last one), each as [start, end). Returns 0 or -1. */
static int split_tail(const char *val, size_t len, int n, const char *f[][2])
{
	const char *end = val + len;

	for (int i = 0; i < n; i++) {
		const char *p = end;

		while (p > val && p[-1] != ':')
			p--;
		if (p == val)
			return -1;
		f[i][0] = p;
		f[i][1] = end;
		end = p - 1;
	}
	return 0;
}

int owner_gone(const char *val, size_t len, int thorough, int *pid)
{
	const char *f[5][2]; /* start, ns, boot, tid, pid */
	unsigned long long start, ns, p, seen_start;
	char path[64], buf[1024], state;
	ssize_t n;

	identity();
	if (!me.trusted || len < 33 || val[32] != ':' || split_tail(val, len, 5, f) != 0 ||
	    num(f[0][0], f[0][1], &start) || num(f[1][0], f[1][1], &ns) ||
	    num(f[4][0], f[4][1], &p) || p == 0 || p > 0x7fffffff)
		return 0;
	if (ns != me.ns || f[2][1] - f[2][0] != BOOT_ID_LEN ||
	    memcmp(f[2][0], me.boot, BOOT_ID_LEN) != 0 || (int)p == me.pid)
		return 0;
	*pid = (int)p;
	if (kill((pid_t)p, 0) != 0 && errno == ESRCH)
		return 1;
	if (!thorough)
		return 0;
	snprintf(path, sizeof(path), "/proc/%llu/stat", p);
	n = read_file(path, buf, sizeof(buf));
	if (n == -ENOENT || n == -ESRCH)
		return 1;
	if (n <= 0 || parse_stat(buf, &state, &seen_start) != 0)
		return 0;
	return state == 'Z' || state == 'X' || seen_start != start;
}

size_t owner_describe(const char *val, size_t len, char *buf, size_t cap)
{
	const char *f[5][2]; /* start, ns, boot, tid, pid */
	const char *host = val + 33;
	unsigned long long pid;
	int n;

	char name[256];
	size_t hlen;

	if (len < 33 || val[32] != ':' || split_tail(val, len, 5, f) != 0 ||
	    f[4][0] - 1 <= host || num(f[4][0], f[4][1], &pid)) {
		n = snprintf(buf, cap, "unknown");
	} else {
		/* as the shim writes it: a value written by anything else (or
		 * mangled) shows no control or non-ASCII byte either */
		hlen = (size_t)(f[4][0] - 1 - host);
		hlen = hlen < sizeof(name) ? hlen : sizeof(name) - 1;
		for (size_t i = 0; i < hlen; i++)
			name[i] = host[i] > 0x20 && host[i] < 0x7f ? host[i] : '-';
		n = snprintf(buf, cap, "host %.*s, pid %llu", (int)hlen, name, pid);
	}
	return n < 0 ? 0 : (size_t)n >= cap ? cap - 1 : (size_t)n;
}
