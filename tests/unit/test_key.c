/* SPDX-License-Identifier: MIT */
/* Unit tests for key.c: placeholders, formats, long-key hashing, the
 * encoding of values (no value reaches another lock's keys), errors. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "key.h"
#include "test.h"

/* Expands src under namespace "ns"; tagged: in the cluster layout. */
static const char *expand_as(const char *src, const uint64_t args[ARCH_INT_ARGS], int pid,
			     int tagged)
{
	static char out[KEY_BUF_SIZE + 1];
	struct key_tmpl t;
	char err[256];
	size_t n;

	if (key_compile(&t, "ns", src, "transfer", "hostA", tagged, err, sizeof(err)) != 0)
		return NULL;
	n = key_expand(&t, args, pid, out);
	out[n] = 0;
	key_tmpl_release(&t);
	return out;
}

static const char *expand(const char *src, const uint64_t args[ARCH_INT_ARGS], int pid)
{
	return expand_as(src, args, pid, 0);
}

/* Expands src for a Redis Cluster ("ns:{<key>}"). */
static const char *expand_tagged(const char *src, const uint64_t args[ARCH_INT_ARGS])
{
	return expand_as(src, args, 1, 1);
}

static int compile_error(const char *src, const char *needle)
{
	struct key_tmpl t;
	char err[256] = "";

	if (key_compile(&t, "ns", src, "sym", "h", 0, err, sizeof(err)) == 0) {
		key_tmpl_release(&t);
		return 0;
	}
	return strstr(err, needle) != NULL;
}

/* Decodes "%XX" in s (in place); returns s. */
static char *unpercent(char *s)
{
	char *o = s;

	for (const char *p = s; *p; o++) {
		if (p[0] == '%' && p[1] && p[2]) {
			char h[3] = { p[1], p[2], 0 };

			*o = (char)strtol(h, NULL, 16);
			p += 3;
		} else {
			*o = *p++;
		}
	}
	*o = 0;
	return s;
}

/* Values that look like the layout, or like an encoding of another. */
static const char *const tricky[] = {
	"", "%", "%%", "%25", "%3A", "%3a", ":", "::", "{", "}", "{}", "}{", "~", "~~",
	"%7E", "a~", "q", "qx", "qq", "d", "du", "due", "duet", "w", "w:", "wx", ":q",
	":qx", ":due", ":w:", "a:q", "a%3Aq", "v", "v:q", "\x80", "\xff\xfe", "\xc3\xa9:q",
	"(null)", "%00", " ", "#", "a#0123456789abcdef", "f", "ff", ":f", "a:f",
};
#define NTRICKY (sizeof(tricky) / sizeof(tricky[0]))

static void encoding_tests(void)
{
	uint64_t a[ARCH_INT_ARGS] = { 0 };
	static char seen[NTRICKY][KEY_BUF_SIZE + 1];
	char host[32], buf[KEY_BUF_SIZE + 1];
	struct key_tmpl t;
	char err[256];
	size_t n;

	test("a value's % : { } are percent-encoded, other bytes kept");
	a[0] = (uint64_t)(uintptr_t)"a:b%c{d}e f\x80\xff";
	test_cond(strcmp(expand("k:{arg0:str}", a, 1), "ns:k:a%3Ab%25c%7Bd%7De f\x80\xff") == 0);
	test_cond(strcmp(expand_tagged("k:{arg0:str}", a), "ns:{k:a%3Ab%25c%7Bd%7De f\x80\xff}") == 0);

	test("a ~ is encoded only where it would begin the key");
	a[0] = (uint64_t)(uintptr_t)"~x~";
	test_cond(strcmp(expand("{arg0:str}", a, 1), "ns:%7Ex~") == 0);
	test_cond(strcmp(expand("k{arg0:str}", a, 1), "ns:k~x~") == 0);
	test_cond(strcmp(expand("~{arg0:str}", a, 1), "ns:~~x~") == 0);

	test("a value that would spell q, qx, due or w after a colon");
	a[0] = (uint64_t)(uintptr_t)"q";
	test_cond(strcmp(expand("kc:{arg0:str}", a, 1), "ns:kc:%71") == 0);
	test_cond(strcmp(expand("{arg0:str}", a, 1), "ns:q") == 0); /* no colon of its key */
	a[0] = (uint64_t)(uintptr_t)"qx";
	test_cond(strcmp(expand("kc:{arg0:str}", a, 1), "ns:kc:%71x") == 0);
	a[0] = (uint64_t)(uintptr_t)"due";
	test_cond(strcmp(expand("kc:{arg0:str}", a, 1), "ns:kc:%64ue") == 0);
	a[0] = (uint64_t)(uintptr_t)"d"; /* a prefix: the text after it may finish it */
	test_cond(strcmp(expand("kc:{arg0:str}ue", a, 1), "ns:kc:%64ue") == 0);
	a[0] = (uint64_t)(uintptr_t)"w";
	test_cond(strcmp(expand("a:{arg0:str}:b", a, 1), "ns:a:%77:b") == 0);
	a[0] = (uint64_t)(uintptr_t)"ue";
	test_cond(strcmp(expand("a:d{arg0:str}", a, 1), "ns:a:d%75e") == 0);
	a[0] = (uint64_t)(uintptr_t)"";
	a[1] = (uint64_t)(uintptr_t)"q";
	test_cond(strcmp(expand("a:{arg0:str}{arg1:str}", a, 1), "ns:a:%71") == 0);
	for (int i = 0; i < 4; i++) {
		static const char *const plain[] = { "data", "quit", "wx", "dux" };

		a[0] = (uint64_t)(uintptr_t)plain[i];
		snprintf(buf, sizeof(buf), "ns:kc:%s", plain[i]);
		test_cond(strcmp(expand("kc:{arg0:str}", a, 1), buf) == 0);
	}
	a[0] = 13; /* hex spells "d" */
	test_cond(strcmp(expand("kc:{arg0:x}ue", a, 1), "ns:kc:%64ue") == 0);
	a[0] = 0xd0;
	test_cond(strcmp(expand("kc:{arg0:x}", a, 1), "ns:kc:d0") == 0);

	test("{env:NAME} and {host} are values too");
	setenv("LOCKSHIM_T_ENV", "a:q}", 1);
	test_cond(strcmp(expand("e:{env:LOCKSHIM_T_ENV}", a, 1), "ns:e:a%3Aq%7D") == 0);
	setenv("LOCKSHIM_T_ENV", "q", 1);
	test_cond(strcmp(expand("e:{env:LOCKSHIM_T_ENV}", a, 1), "ns:e:%71") == 0);
	snprintf(host, sizeof(host), "h:{1}");
	test_cond(key_compile(&t, "ns", "{host}", "s", host, 1, err, sizeof(err)) == 0);
	n = key_expand(&t, a, 1, buf);
	buf[n] = 0;
	test_cond(strcmp(buf, "ns:{h%3A%7B1%7D}") == 0);
	key_tmpl_release(&t);

	test("injective: every tricky value decodes back, no two share a key");
	for (size_t i = 0; i < NTRICKY; i++) {
		a[0] = (uint64_t)(uintptr_t)tricky[i];
		strcpy(seen[i], expand("kc:{arg0:str}", a, 1));
		strcpy(buf, seen[i] + 6);
		test_cond(strcmp(unpercent(buf), tricky[i]) == 0);
		test_cond(strchr(seen[i] + 3, ':') == seen[i] + 5 && !strpbrk(seen[i], "{}"));
		for (size_t j = 0; j < i; j++)
			test_cond(strcmp(seen[i], seen[j]) != 0);
	}
	for (size_t i = 0; i < NTRICKY; i++) { /* the cluster layout: the tag is the key */
		a[0] = (uint64_t)(uintptr_t)tricky[i];
		strcpy(seen[i], expand_tagged("{arg0:str}", a));
		test_cond(strchr(seen[i], '}') == seen[i] + strlen(seen[i]) - 1);
		for (size_t j = 0; j < i; j++)
			test_cond(strcmp(seen[i], seen[j]) != 0);
	}
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/*
 * Templates that share a namespace, values from tricky[] in each placeholder:
 * no key of one lock (a distinct lock key) is a key of another. The lock
 * keys are sorted and made unique, then every lock's keys (as
 * backend_redis.c names them) sorted: two equal neighbours are a collision.
 */
static void layout_tests(void)
{
	static const char *const tmpl[] = {
		"kc:{arg0:str}", "kc", "{arg0:str}", "kc:{arg0:str}:{arg1:str}",
		"kc:{arg0:str}{arg1:str}", "kc:du{arg0:str}", "kc:d{arg0:str}", "kc:{arg0:str}ue",
		"{arg0:str}:w", "kc:{arg0:str}:w", "kc:{arg0:x}", "kc:v",
	};
	static const char *const sfx[] = { "", ":q", ":qx", ":due", ":f",
					   ":w:0123456789abcdef0123456789abcdef:h:1:1:-:0:1" };
	enum { NT = sizeof(tmpl) / sizeof(tmpl[0]), MAXK = NT * NTRICKY * NTRICKY };
	static char *locks[MAXK], *all[MAXK * 6];
	uint64_t a[ARCH_INT_ARGS] = { 0 };

	test("layout: no lock's key, queue, due, fencing counter or waiter list is another lock's key");
	for (int tagged = 0; tagged < 2; tagged++) {
		size_t nl = 0, nu = 0, na = 0;
		int bad = 0;

		for (size_t t = 0; t < NT; t++)
			for (size_t i = 0; i < NTRICKY; i++)
				for (size_t j = 0; j < (strstr(tmpl[t], "arg1") ? NTRICKY : 1); j++) {
					a[0] = strstr(tmpl[t], ":x}") ? i : (uint64_t)(uintptr_t)tricky[i];
					a[1] = (uint64_t)(uintptr_t)tricky[j];
					locks[nl++] = strdup(expand_as(tmpl[t], a, 1, tagged));
				}
		qsort(locks, nl, sizeof(*locks), cmp_str);
		for (size_t m = 0; m < nl; m++)
			if (nu == 0 || strcmp(locks[nu - 1], locks[m]) != 0)
				locks[nu++] = locks[m];
			else
				free(locks[m]);
		for (size_t m = 0; m < nu; m++)
			for (int u = 0; u < 6; u++) {
				all[na] = malloc(strlen(locks[m]) + strlen(sfx[u]) + 1);
				strcat(strcpy(all[na++], locks[m]), sfx[u]);
			}
		qsort(all, na, sizeof(*all), cmp_str);
		for (size_t m = 1; m < na; m++)
			if (strcmp(all[m - 1], all[m]) == 0 && bad++ < 5)
				fprintf(stderr, "collision: %s\n", all[m]);
		test_cond(bad == 0);
		test_cond(nu > 1000);
		for (size_t m = 0; m < nu; m++)
			free(locks[m]);
		for (size_t m = 0; m < na; m++)
			free(all[m]);
	}
}

int main(void)
{
	char longstr[1000], longstr2[1000];
	uint64_t args[ARCH_INT_ARGS] = { (uint64_t)-42, 255, 0, 0, 0, 0 };
	char last[32];
	const char *k;

	test("defaults and literals");
	test_cond(strcmp(expand("{symbol}", args, 1), "ns:transfer") == 0);
	test_cond(strcmp(expand("a:{host}:{pid}", args, 77), "ns:a:hostA:77") == 0);

	test("argument formats");
	test_cond(strcmp(expand("{arg0}", args, 1), "ns:-42") == 0);
	test_cond(strcmp(expand("{arg0:u}", args, 1), "ns:18446744073709551574") == 0);
	test_cond(strcmp(expand("{arg1:x}", args, 1), "ns:ff") == 0);
	args[2] = (uint64_t)(uintptr_t)"acct-7";
	test_cond(strcmp(expand("acct:{arg2:str}", args, 1), "ns:acct:acct-7") == 0);
	args[3] = 0;
	test_cond(strcmp(expand("{arg3:str}", args, 1), "ns:%00") == 0);
	args[3] = (uint64_t)(uintptr_t)"(null)";
	test_cond(strcmp(expand("{arg3:str}", args, 1), "ns:(null)") == 0);

	test("environment");
	setenv("LOCKSHIM_T_ENV", "blue", 1);
	test_cond(strcmp(expand("{env:LOCKSHIM_T_ENV}-x", args, 1), "ns:blue-x") == 0);
	test_cond(strcmp(expand("{env:LOCKSHIM_T_UNSET}x", args, 1), "ns:x") == 0);

	test("binary-safe: bytes after a brace-free literal are kept");
	test_cond(strcmp(expand("a b\tc}", args, 1), "ns:a b\tc}") == 0);

	test("{{ and }} are literal braces: a Redis hash tag");
	args[0] = 7;
	test_cond(strcmp(expand("{{ledger}}:{arg0}", args, 1), "ns:{ledger}:7") == 0);
	test_cond(strcmp(expand("{{{arg0}}}", args, 1), "ns:{7}") == 0);
	test_cond(strcmp(expand("a}b", args, 1), "ns:a}b") == 0);

	test("cluster layout: the key inside the hash tag, never an empty tag");
	test_cond(strcmp(expand_tagged("{symbol}:{arg0}", args), "ns:{transfer:7}") == 0);
	test_cond(strcmp(expand_tagged("{{ledger}}:{arg0}", args), "ns:{{ledger}:7}") == 0);
	args[3] = (uint64_t)(uintptr_t)"";
	test_cond(strcmp(expand_tagged("{arg3:str}", args), "ns:{~}") == 0);
	args[3] = (uint64_t)(uintptr_t)"~";
	test_cond(strcmp(expand_tagged("{arg3:str}", args), "ns:{%7E}") == 0);
	args[3] = (uint64_t)(uintptr_t)"}x";
	test_cond(strcmp(expand_tagged("{arg3:str}", args), "ns:{%7Dx}") == 0);
	test_cond(strcmp(expand_tagged("}}{arg3:str}", args), "ns:{~}%7Dx}") == 0);
	args[0] = (uint64_t)-42;

	test("long keys keep a prefix and a hash, and stay distinct");
	memset(longstr, 'a', sizeof(longstr) - 1);
	longstr[sizeof(longstr) - 1] = 0;
	memcpy(longstr2, longstr, sizeof(longstr));
	longstr2[900] = 'b';
	args[4] = (uint64_t)(uintptr_t)longstr;
	k = expand("{arg4:str}", args, 1);
	test_cond(strlen(k) == 3 + KEY_MAX_EXPANDED + 1);
	test_cond(k[3 + KEY_MAX_EXPANDED - 32] == '#' && !strchr(k + 3, '%'));
	{
		char first[KEY_BUF_SIZE + 1];

		strcpy(first, k);
		args[4] = (uint64_t)(uintptr_t)longstr2;
		k = expand("{arg4:str}", args, 1);
		test_cond(strlen(k) == strlen(first));
		test_cond(strcmp(k, first) != 0);
		args[4] = (uint64_t)(uintptr_t)longstr;
		test_cond(strcmp(expand("{arg4:str}", args, 1), first) == 0);
		k = expand_tagged("}{arg4:str}", args);
		test_cond(strlen(k) == 3 + KEY_MAX_EXPANDED + 4 && k[4] == '~' &&
			  k[strlen(k) - 1] == '}');
		/* the longest: a namespace of KEY_MAX_NAMESPACE bytes, "~", "}" */
		{
			char ns[KEY_MAX_NAMESPACE + 1], out[KEY_BUF_SIZE + 16];
			struct key_tmpl t;
			char err[256];

			memset(ns, 'n', KEY_MAX_NAMESPACE);
			ns[KEY_MAX_NAMESPACE] = 0;
			memset(out, 'Z', sizeof(out));
			test_cond(key_compile(&t, ns, "}{arg4:str}", "s", "h", 1, err,
					      sizeof(err)) == 0);
			test_cond(key_expand(&t, args, 1, out) == KEY_BUF_SIZE);
			test_cond(out[KEY_BUF_SIZE - 1] == '}' && out[KEY_BUF_SIZE] == 'Z');
			key_tmpl_release(&t);
		}
		/* a value shaped like a long key's form is not that key */
		k = expand("{arg4:str}", args, 1);
		strcpy(first, k + 3);
		args[4] = (uint64_t)(uintptr_t)first;
		test_cond(strcmp(expand("{arg4:str}", args, 1) + 3, first) != 0);
		first[KEY_MAX_EXPANDED] = 0; /* a verbatim key is one byte shorter */
		test_cond(strcmp(expand("{arg4:str}", args, 1) + 3, first) == 0);
		args[4] = (uint64_t)(uintptr_t)longstr;
	}
	test("exactly 256 bytes is kept verbatim, after encoding");
	longstr[256] = 0;
	test_cond(strcmp(expand("{arg4:str}", args, 1) + 3, longstr) == 0);
	memset(longstr, ':', 85);
	longstr[85] = 'a';
	longstr[86] = 0; /* 85 * 3 + 1 = 256 bytes encoded */
	k = expand("{arg4:str}", args, 1);
	test_cond(strlen(k) == 3 + 256 && strncmp(k + 3, "%3A%3A", 6) == 0 && k[258] == 'a');
	longstr[85] = ':'; /* 258 bytes encoded: hashed, unlike the 256 above */
	k = expand("{arg4:str}", args, 1);
	test_cond(strlen(k) == 3 + 257 && k[3 + 224] == '#');

	test("an {argN:str} is read up to KEY_STR_SCAN_MAX bytes without a NUL");
	{
		static char big[KEY_STR_SCAN_MAX + 2], big2[KEY_STR_SCAN_MAX + 2];
		char first[KEY_BUF_SIZE + 1];

		memset(big, 'b', KEY_STR_SCAN_MAX + 1); /* NUL only after the limit */
		memcpy(big2, big, sizeof(big));
		big2[KEY_STR_SCAN_MAX] = 'c'; /* past the limit: not read */
		args[4] = (uint64_t)(uintptr_t)big;
		strcpy(first, expand("{arg4:str}", args, 1));
		args[4] = (uint64_t)(uintptr_t)big2;
		test_cond(strcmp(expand("{arg4:str}", args, 1), first) == 0);
		big2[KEY_STR_SCAN_MAX - 1] = 'c'; /* the last byte read */
		test_cond(strcmp(expand("{arg4:str}", args, 1), first) != 0);
	}

	test("the last integer argument register is {arg<ARCH_INT_ARGS - 1>}");
	args[ARCH_INT_ARGS - 1] = 31;
	snprintf(last, sizeof(last), "{arg%d}", ARCH_INT_ARGS - 1);
	test_cond(strcmp(expand(last, args, 1), "ns:31") == 0);

	encoding_tests();
	layout_tests();

	test("errors");
	snprintf(last, sizeof(last), "{arg%d}", ARCH_INT_ARGS);
	test_cond(compile_error(last, "out of range"));
	test_cond(compile_error("{arg6}", "out of range")); /* x86-64: 6 registers */
	test_cond(compile_error("{arg12}", "out of range"));
	test_cond(compile_error("{arg05}", "out of range"));
	test_cond(compile_error("{arg99999999999}", "out of range"));
	test_cond(compile_error("{arg}", "unknown placeholder"));
	test_cond(compile_error("{arg1y}", "unknown placeholder"));
	test_cond(compile_error("{arg0:q}", "unknown placeholder"));
	test_cond(compile_error("{nope}", "unknown placeholder"));
	test_cond(compile_error("x{arg0", "unterminated"));
	test_cond(compile_error("{{a}{b", "unterminated"));
	test_cond(compile_error("", "empty"));
	test("errors: the template's text spelling a queue key");
	test_cond(compile_error("x:q", "ends in \":q\""));
	test_cond(compile_error("x:qx", "ends in \":qx\""));
	test_cond(compile_error("{arg0}:due", "ends in \":due\""));
	test_cond(compile_error("x:f", "ends in \":f\""));
	test_cond(compile_error("x:{arg0:str}f", "fencing counter")); /* an empty value */
	test_cond(compile_error("x:{arg0:str}q", "ends in \":q\"")); /* an empty value */
	test_cond(compile_error("a:w:{arg0}", "contains \":w:\""));
	test_cond(compile_error("a:w{env:LOCKSHIM_T_UNSET}:b", "contains \":w:\""));
	test_cond(!compile_error("x:qq", "") && !compile_error("x:w", "") &&
		  !compile_error("q", "") && !compile_error("due:{arg0}", "") &&
		  !compile_error("x:{arg0:str}:q:{arg1}", "") && !compile_error("aw:b", "") &&
		  !compile_error("x:ff", "") && !compile_error("f:{arg0}", ""));
	return test_report("key");
}
