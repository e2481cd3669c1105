/* SPDX-License-Identifier: MIT */
/* Unit tests for key.c: placeholders, formats, long-key hashing, errors. */
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
	args[3] = (uint64_t)(uintptr_t)"}x";
	test_cond(strcmp(expand_tagged("{arg3:str}", args), "ns:{~}x}") == 0);
	args[0] = (uint64_t)-42;

	test("long keys keep a prefix and a hash, and stay distinct");
	memset(longstr, 'a', sizeof(longstr) - 1);
	longstr[sizeof(longstr) - 1] = 0;
	memcpy(longstr2, longstr, sizeof(longstr));
	longstr2[900] = 'b';
	args[4] = (uint64_t)(uintptr_t)longstr;
	k = expand("{arg4:str}", args, 1);
	test_cond(strlen(k) == 3 + KEY_MAX_EXPANDED);
	test_cond(k[3 + KEY_MAX_EXPANDED - 33] == '#');
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
		test_cond(strlen(k) == 3 + KEY_MAX_EXPANDED + 3 && k[4] == '~' &&
			  k[strlen(k) - 1] == '}');
	}
	test("exactly 256 bytes is kept verbatim");
	longstr[256] = 0;
	test_cond(strcmp(expand("{arg4:str}", args, 1) + 3, longstr) == 0);

	test("the last integer argument register is {arg<ARCH_INT_ARGS - 1>}");
	args[ARCH_INT_ARGS - 1] = 31;
	snprintf(last, sizeof(last), "{arg%d}", ARCH_INT_ARGS - 1);
	test_cond(strcmp(expand(last, args, 1), "ns:31") == 0);

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
	return test_report("key");
}
