/* SPDX-License-Identifier: MIT */
/*
 * owner_tmp.c - TEMPORARY stand-in for engineer A's owner_parse and
 * owner_state (see owner_tmp.h), weak so that common/owner.c's win once it
 * is linked. Parses the value of the shared design from its tail,
 * "<token>:<host>:<pid>:<tid>:<boot id>:<pid ns>:<start>:<since_ms>:<program>",
 * and also the older 7-field value (no since_ms, program "unknown"). A holder
 * is here when its boot id and pid namespace are ours, and gone when no
 * process of its pid started at its start time (or it is a zombie).
 */
#include "owner_tmp.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FIELDS_MAX 9

struct parsed {
	struct owner_info info;
	char boot[64];
	unsigned long long ns, start;
};

/* Returns the number in s[0..n), all digits, or -1. */
static long long num(const char *s, size_t n)
{
	long long v = 0;

	if (n == 0 || n > 18)
		return -1;
	for (size_t i = 0; i < n; i++) {
		if (s[i] < '0' || s[i] > '9')
			return -1;
		v = v * 10 + (s[i] - '0');
	}
	return v;
}

/* Splits val at its last fields; returns 0 or -1. */
static int parse(const char *val, size_t len, struct parsed *p)
{
	const char *f[FIELDS_MAX];
	size_t fl[FIELDS_MAX], end = len;
	int n = 0, nf, tail;
	long long v[6];

	memset(p, 0, sizeof(*p));
	for (size_t i = 0; i < len; i++)
		n += val[i] == ':';
	nf = n >= 8 ? 9 : 7;
	tail = nf - 2; /* fields after the host */
	if (n < 6)
		return -1;
	for (int i = nf - 1; i >= 2; i--) {
		size_t s = end;

		while (s > 0 && val[s - 1] != ':')
			s--;
		f[i] = val + s;
		fl[i] = end - s;
		end = s - 1;
	}
	/* what is left is "<token>:<host>" */
	f[0] = val;
	fl[0] = 0;
	while (fl[0] < end && val[fl[0]] != ':')
		fl[0]++;
	if (fl[0] == end || fl[0] != 32)
		return -1;
	f[1] = val + fl[0] + 1;
	fl[1] = end - fl[0] - 1;
	if (fl[1] == 0 || fl[1] >= sizeof(p->info.host) || fl[4] >= sizeof(p->boot))
		return -1;
	v[0] = num(f[2], fl[2]);
	v[1] = num(f[3], fl[3]);
	v[2] = num(f[5], fl[5]);
	v[3] = num(f[6], fl[6]);
	v[4] = nf == 9 ? num(f[7], fl[7]) : 0;
	if (v[0] <= 0 || v[1] <= 0 || v[2] < 0 || v[3] < 0 || v[4] < 0 || v[0] > 0x7fffffff ||
	    v[1] > 0x7fffffff)
		return -1;
	memcpy(p->info.host, f[1], fl[1]);
	p->info.pid = (int)v[0];
	p->info.tid = (int)v[1];
	p->info.since_ms = v[4];
	memcpy(p->boot, f[4], fl[4]);
	p->ns = (unsigned long long)v[2];
	p->start = (unsigned long long)v[3];
	if (nf == 9 && fl[8] > 0 && fl[8] < sizeof(p->info.program))
		memcpy(p->info.program, f[8], fl[8]);
	else
		strcpy(p->info.program, "unknown");
	(void)tail;
	return 0;
}

/* Reads up to cap - 1 bytes of path into buf; returns the length or -1. */
static ssize_t slurp(const char *path, char *buf, size_t cap)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	ssize_t n;

	if (fd < 0)
		return -1;
	n = read(fd, buf, cap - 1);
	close(fd);
	if (n >= 0)
		buf[n] = 0;
	return n;
}

/* Returns 1 when p's holder has our boot id and pid namespace. */
static int here(const struct parsed *p)
{
	char boot[64], link[64];
	ssize_t n = slurp("/proc/sys/kernel/random/boot_id", boot, sizeof(boot)), k;

	if (n <= 0)
		return 0;
	boot[strcspn(boot, "\n")] = 0;
	k = readlink("/proc/self/ns/pid", link, sizeof(link) - 1);
	if (k <= 0)
		return 0;
	link[k] = 0;
	return strcmp(boot, p->boot) == 0 && strncmp(link, "pid:[", 5) == 0 &&
	       strtoull(link + 5, NULL, 10) == p->ns;
}

__attribute__((weak)) int owner_parse(const char *val, size_t len, struct owner_info *out)
{
	struct parsed p;

	if (parse(val, len, &p) != 0)
		return -1;
	*out = p.info;
	out->local = here(&p);
	return 0;
}

__attribute__((weak)) int owner_state(const char *val, size_t len)
{
	char path[64], stat[1024], *e;
	unsigned long long start = 0;
	struct parsed p;
	int field = 2;

	if (parse(val, len, &p) != 0 || !here(&p))
		return OWNER_ELSEWHERE;
	snprintf(path, sizeof(path), "/proc/%d/stat", p.info.pid);
	if (slurp(path, stat, sizeof(stat)) <= 0)
		return OWNER_GONE;
	if (!(e = strrchr(stat, ')')))
		return OWNER_ELSEWHERE;
	if (e[1] == ' ' && e[2] == 'Z')
		return OWNER_GONE;
	for (e++; *e && field < 22; e++)
		if (*e == ' ' && ++field == 22)
			start = strtoull(e + 1, NULL, 10);
	return start == p.start ? OWNER_ALIVE_HERE : OWNER_GONE;
}
