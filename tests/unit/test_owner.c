/* SPDX-License-Identifier: MIT */
/*
 * test_owner.c - lock values (owner.c): the tail a value ends with
 * (since_ms, program), owner_parse of values of every shape, the program's
 * name sanitised, and owner_state/owner_gone of this process, of a child
 * that exited, and of another boot.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "owner.h"
#include "test.h"

#define TOKEN "0123456789abcdef0123456789abcdef"

/* Writes a whole value of this process, thread tid, pid replaced by pid
 * when nonzero, into buf. Returns its length. */
static size_t value_of(char *buf, size_t cap, int pid, long long since)
{
	char suffix[512], tail[128];
	size_t n;

	owner_suffix(suffix, sizeof(suffix), 77);
	owner_tail(tail, sizeof(tail), since);
	if (pid) { /* ":<host>:<pid>:..." with another pid */
		char *p = strchr(suffix + 1, ':'), rest[512];

		snprintf(rest, sizeof(rest), "%s", strchr(p + 1, ':'));
		snprintf(p, sizeof(suffix) - (size_t)(p - suffix), ":%d%s", pid, rest);
	}
	n = (size_t)snprintf(buf, cap, "%s%s%s", TOKEN, suffix, tail);
	return n;
}

static int parses(const char *v, const char *host, int pid, int tid, long long since,
		  const char *prog)
{
	struct owner_info o;

	if (owner_parse(v, strlen(v), &o) != 0) {
		fprintf(stderr, "  \"%s\" does not parse\n", v);
		return 0;
	}
	if (strcmp(o.host, host) || o.pid != pid || o.tid != tid || o.since_ms != since ||
	    strcmp(o.program, prog)) {
		fprintf(stderr, "  \"%s\": host %s pid %d tid %d since %lld program %s\n", v, o.host,
			o.pid, o.tid, o.since_ms, o.program);
		return 0;
	}
	return 1;
}

static int refused(const char *v)
{
	struct owner_info o;

	return owner_parse(v, strlen(v), &o) == -1 && !strcmp(o.host, "unknown") &&
	       !strcmp(o.program, "unknown") && o.pid == 0;
}

int main(void)
{
	char v[512], tail[128];
	struct owner_info o;
	int pid, status;
	size_t n;

	test("owner_tail: \":<since_ms>:<program>\", the program the executable's name");
	test_cond(owner_tail(tail, sizeof(tail), 1764000000123LL) == strlen(":1764000000123:test_owner") &&
		  strcmp(tail, ":1764000000123:test_owner") == 0);
	test_cond(owner_tail(tail, 6, 1764000000123LL) == 5 && strcmp(tail, ":1764") == 0);
	test_cond(owner_tail(tail, sizeof(tail), 0) == 13 && strcmp(tail, ":0:test_owner") == 0);

	test("owner_parse: the fields, from the tail");
	test_cond(parses(TOKEN ":db2:4242:4243:b00t:4026531836:57750:1764000000123:batch", "db2",
			 4242, 4243, 1764000000123LL, "batch"));
	test_cond(parses(TOKEN ":d\x1b\xff b:7:8:-:0:0:1:p\x01q", "d---b", 7, 8, 1, "p-q"));
	test_cond(parses(TOKEN ":h:7:8:-:0:0:1:", "h", 7, 8, 1, "unknown"));
	test("owner_parse: anything else is refused, \"unknown\"");
	test_cond(refused(TOKEN "::7:8:-:0:0:1:p"));                 /* no host */
	test_cond(refused(TOKEN ":h:x7:8:-:0:0:1:p"));               /* pid */
	test_cond(refused(TOKEN ":h:7:8:-:0:0:-1:p"));               /* since_ms */
	test_cond(refused(TOKEN ":h:7:8:-:0:0:99999999999999999999999:p"));
	test_cond(refused(TOKEN ":db2:4242:4243:-:0:0"));            /* the 7 fields of old */
	test_cond(refused("short:h:7:8:-:0:0:1:p"));
	test_cond(refused(""));

	test("a value of this process parses back, local, alive here");
	n = value_of(v, sizeof(v), 0, 1764000000999LL);
	test_cond(owner_parse(v, n, &o) == 0 && o.pid == getpid() && o.tid == 77 &&
		  o.since_ms == 1764000000999LL && !strcmp(o.program, "test_owner") && o.local);
	test_cond(owner_state(v, n) == OWNER_ALIVE_HERE);
	test_cond(!owner_gone(v, n, 1, &pid));

	test("owner_set_program: the file name, sanitised, at most 64 bytes");
	owner_set_program("/usr/bin/my prog:v2");
	test_cond(owner_tail(tail, sizeof(tail), 5) && strcmp(tail, ":5:my-prog-v2") == 0);
	owner_set_program("");
	test_cond(owner_tail(tail, sizeof(tail), 5) && strcmp(tail, ":5:unknown") == 0);
	memset(v, 'x', 100);
	v[100] = 0;
	owner_set_program(v);
	test_cond(owner_tail(tail, sizeof(tail), 5) == 3 + OWNER_PROGRAM_MAX);
	owner_set_program("test_owner");

	test("a child that exited: gone, and owner_gone names its pid");
	if ((pid = fork()) == 0)
		_exit(0);
	waitpid(pid, &status, 0);
	n = value_of(v, sizeof(v), pid, 1);
	{
		int seen = 0;

		test_cond(owner_state(v, n) == OWNER_GONE);
		test_cond(owner_gone(v, n, 0, &seen) == 1 && seen == pid);
	}

	test("another boot: elsewhere, never gone");
	n = value_of(v, sizeof(v), pid, 1);
	{
		char *boot = strchr(v + 33, ':');          /* ":<pid>" */
		int seen = 0;

		boot = strchr(strchr(boot + 1, ':') + 1, ':') + 1; /* after ":<tid>:" */
		*boot = *boot == '0' ? '1' : '0';
		test_cond(owner_state(v, n) == OWNER_ELSEWHERE);
		test_cond(!owner_gone(v, n, 1, &seen));
		test_cond(owner_parse(v, n, &o) == 0 && !o.local);
	}
	test_cond(owner_state("garbage", 7) == OWNER_ELSEWHERE);
	return test_report("owner");
}
