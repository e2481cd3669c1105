/* SPDX-License-Identifier: MIT */
/*
 * owner.c - lock holder identity and liveness (see owner.h).
 *
 * The identity (boot id, pid namespace, start time from /proc, the host,
 * the program: log.c's or owner_set_program's) is read once per process,
 * again after fork, by the first thread that needs it, under a mutex, then
 * published with a release store: every later use is one acquire load. It
 * is trusted only when /proc is this pid namespace's. A holder is gone when
 * its boot id and namespace are ours and no process has its pid, or that
 * process is a zombie or started at another time (a reused pid). Anything
 * that does not parse, or another machine or namespace, counts as alive: a
 * live holder's lock is never broken, a dead one elsewhere expires with its
 * lease. Values are split from the tail: the host is the one field of
 * varying length before the numbers.
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

#include "log.h"

#define BOOT_ID_LEN 36
#define OWNER_FIELDS 7 /* after the host: pid tid boot ns start since program */

static struct {
	int pid;
	int trusted;    /* /proc shows our pid namespace */
	unsigned long long ns, start;
	char boot[BOOT_ID_LEN + 1]; /* "" when unknown */
	char host[256];             /* never empty, no ':' nor blank */
	char program[OWNER_PROGRAM_MAX + 1]; /* the same */
} me;                               /* written only by load(), before `ready` */
static atomic_int ready;            /* me holds this process's identity */
static pthread_mutex_t load_mu = PTHREAD_MUTEX_INITIALIZER;
static char program_set[OWNER_PROGRAM_MAX + 1]; /* owner_set_program's, or "" */

/* Copies name[0..len) into dst (cap bytes) as one field of a value: ':',
 * blanks, control and non-ASCII bytes as '-', "unknown" when empty. */
static void field_copy(char *dst, size_t cap, const char *name, size_t len)
{
	size_t i;

	for (i = 0; i < len && i < cap - 1; i++)
		dst[i] = name[i] == ':' || name[i] <= ' ' || name[i] > '~' ? '-' : name[i];
	dst[i] = 0;
	if (!i)
		snprintf(dst, cap, "unknown");
}

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
	if (gethostname(buf, sizeof(me.host) - 1) != 0)
		buf[0] = 0;
	buf[sizeof(me.host) - 1] = 0;
	field_copy(me.host, sizeof(me.host), buf, strlen(buf));
	if (program_set[0])
		memcpy(me.program, program_set, sizeof(me.program));
	else
		field_copy(me.program, sizeof(me.program), log_program(),
			   strlen(log_program()));
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

size_t owner_tail(char *buf, size_t cap, long long since_ms)
{
	char tmp[24 + 1 + OWNER_PROGRAM_MAX];
	char *p = tmp + 24, *d;
	size_t plen, n;
	unsigned long long v = since_ms < 0 ? 0 : (unsigned long long)since_ms;

	identity();
	plen = strlen(me.program);
	do
		*--p = (char)('0' + v % 10);
	while ((v /= 10) != 0);
	*--p = ':';
	d = tmp + 24;
	*d++ = ':';
	memcpy(d, me.program, plen);
	n = (size_t)(d + plen - p);
	if (!cap)
		return 0;
	n = n < cap - 1 ? n : cap - 1;
	memcpy(buf, p, n);
	buf[n] = 0;
	return n;
}

void owner_set_program(const char *name)
{
	const char *base = name ? strrchr(name, '/') : NULL;

	name = base ? base + 1 : name ? name : "";
	field_copy(program_set, sizeof(program_set), name, strlen(name));
	if (atomic_load_explicit(&ready, memory_order_acquire))
		memcpy(me.program, program_set, sizeof(me.program));
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

/* The fields of a value, split from its tail. */
enum { F_PROGRAM, F_SINCE, F_START, F_NS, F_BOOT, F_TID, F_PID };
struct fields {
	const char *f[OWNER_FIELDS][2];
	const char *host;
	size_t hlen;
	unsigned long long pid, tid, start, ns, since;
};

/* Splits val[0..len) into *v. Returns 0, or -1 when it is not a value of
 * the form of owner.h (a non-empty host, every number decimal). */
static int fields_split(const char *val, size_t len, struct fields *v)
{
	if (len < 33 || val[32] != ':' || split_tail(val, len, OWNER_FIELDS, v->f) != 0)
		return -1;
	v->host = val + 33;
	if (v->f[F_PID][0] - 1 <= v->host)
		return -1;
	v->hlen = (size_t)(v->f[F_PID][0] - 1 - v->host);
	if (num(v->f[F_PID][0], v->f[F_PID][1], &v->pid) ||
	    num(v->f[F_TID][0], v->f[F_TID][1], &v->tid) ||
	    num(v->f[F_NS][0], v->f[F_NS][1], &v->ns) ||
	    num(v->f[F_START][0], v->f[F_START][1], &v->start) ||
	    num(v->f[F_SINCE][0], v->f[F_SINCE][1], &v->since) ||
	    v->pid > 0x7fffffff || v->tid > 0x7fffffff || v->since > (1ULL << 62))
		return -1;
	return 0;
}

/* Whether the value's boot id and pid namespace are this process's (and
 * /proc can tell about them). Call after identity(). */
static int is_local(const struct fields *v)
{
	return me.trusted && v->ns == me.ns &&
	       v->f[F_BOOT][1] - v->f[F_BOOT][0] == BOOT_ID_LEN &&
	       memcmp(v->f[F_BOOT][0], me.boot, BOOT_ID_LEN) == 0;
}

/* Copies a field for people to read: control and non-ASCII bytes as '-'. */
static void shown_copy(char *dst, size_t cap, const char *src, size_t len)
{
	size_t i;

	for (i = 0; i < len && i < cap - 1; i++)
		dst[i] = src[i] > 0x20 && src[i] < 0x7f ? src[i] : '-';
	dst[i] = 0;
}

int owner_parse(const char *val, size_t len, struct owner_info *out)
{
	struct fields v;

	memset(out, 0, sizeof(*out));
	if (fields_split(val, len, &v) != 0) {
		strcpy(out->host, "unknown");
		strcpy(out->program, "unknown");
		return -1;
	}
	shown_copy(out->host, sizeof(out->host), v.host, v.hlen);
	shown_copy(out->program, sizeof(out->program), v.f[F_PROGRAM][0],
		   (size_t)(v.f[F_PROGRAM][1] - v.f[F_PROGRAM][0]));
	if (!out->program[0])
		strcpy(out->program, "unknown");
	out->pid = (int)v.pid;
	out->tid = (int)v.tid;
	out->since_ms = (long long)v.since;
	identity();
	out->local = is_local(&v);
	return 0;
}

/* Whether pid, a process of this boot and namespace, is gone: no such
 * process; thorough: also a zombie, or another process under the pid
 * (its start time is not start). */
static int pid_gone(unsigned long long p, unsigned long long start, int thorough)
{
	char path[64], buf[1024], state;
	unsigned long long seen_start;
	ssize_t n;

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

int owner_gone(const char *val, size_t len, int thorough, int *pid)
{
	struct fields v;

	identity();
	if (fields_split(val, len, &v) != 0 || v.pid == 0 || !is_local(&v) ||
	    (int)v.pid == me.pid)
		return 0;
	*pid = (int)v.pid;
	return pid_gone(v.pid, v.start, thorough);
}

int owner_state(const char *val, size_t len)
{
	struct fields v;

	identity();
	if (fields_split(val, len, &v) != 0 || v.pid == 0 || !is_local(&v))
		return OWNER_ELSEWHERE;
	if ((int)v.pid == me.pid)
		return OWNER_ALIVE_HERE;
	return pid_gone(v.pid, v.start, 1) ? OWNER_GONE : OWNER_ALIVE_HERE;
}

size_t owner_describe(const char *val, size_t len, char *buf, size_t cap)
{
	struct owner_info o;
	int n;

	if (owner_parse(val, len, &o) != 0)
		n = snprintf(buf, cap, "unknown");
	else
		n = snprintf(buf, cap, "host %s, pid %d, program %s", o.host, o.pid, o.program);
	return n < 0 ? 0 : (size_t)n >= cap ? cap - 1 : (size_t)n;
}
