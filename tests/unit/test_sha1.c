/* SPDX-License-Identifier: MIT */
/*
 * test_sha1.c - SHA-1 against the FIPS 180 examples and padding edges
 * (Redis names scripts by it: a wrong digest would turn every EVALSHA into
 * a NOSCRIPT round trip).
 */
#include <string.h>

#include "sha1.h"
#include "test.h"

static int digest_is(const char *msg, size_t len, const char *want)
{
	char hex[41];

	sha1_hex(msg, len, hex);
	return strcmp(hex, want) == 0;
}

int main(void)
{
	static char million[1000000];
	static const char two_blocks[] =
		"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";

	test("empty");
	test_cond(digest_is("", 0, "da39a3ee5e6b4b0d3255bfef95601890afd80709"));
	test("abc");
	test_cond(digest_is("abc", 3, "a9993e364706816aba3e25717850c26c9cd0d89d"));
	test("448 bits: the length spills into a second padding block");
	test_cond(digest_is(two_blocks, 56, "84983e441c3bd26ebaae4aa1f95129e5e54670f1"));
	test("one million 'a'");
	memset(million, 'a', sizeof(million));
	test_cond(digest_is(million, sizeof(million), "34aa973cd4c4daa4f61eeb2bdbad27316534016f"));
	test("55 and 64 bytes: the last single-block and the first whole-block tails");
	test_cond(digest_is(million, 55, "c1c8bbdc22796e28c0e15163d20899b65621d65a"));
	test_cond(digest_is(million, 64, "0098ba824b5c16427bd7a1122a5a442a25ec644d"));
	return test_report("sha1");
}
