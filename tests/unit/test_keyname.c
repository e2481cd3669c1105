/* SPDX-License-Identifier: MIT */
/*
 * test_keyname.c - keys as safe names (keyname.h), the rule of the local
 * backend's file names and the zookeeper backend's znode names: what is
 * kept, what is escaped, where a long key is cut, and that two long keys
 * with one start stay apart; and names decoded back.
 */
#include <string.h>

#include "keyname.h"
#include "sha1.h"
#include "test.h"

static int name_is(const char *key, size_t len, const char *want)
{
	char buf[KEYNAME_SIZE];
	size_t n = keyname_encode(key, len, buf);

	return n == strlen(want) && strcmp(buf, want) == 0;
}

int main(void)
{
	static char big[400];
	char a[KEYNAME_SIZE], b[KEYNAME_SIZE], want[KEYNAME_SIZE], hex[41];
	size_t na, nb;

	test("letters, digits, _ and - are kept");
	test_cond(name_is("Ab_9-z", 6, "Ab_9-z"));
	test("/, ., :, space, NUL and high bytes are %XX");
	test_cond(name_is("a/b", 3, "a%2Fb"));
	test_cond(name_is("..", 2, "%2E%2E"));
	test_cond(name_is("ns:k y", 6, "ns%3Ak%20y"));
	test_cond(name_is("\0\xff", 2, "%00%FF"));
	test("200 bytes are kept; 201 are cut to 150, ~ and the SHA-1");
	memset(big, 'k', sizeof(big));
	test_cond(keyname_encode(big, 200, a) == 200);
	na = keyname_encode(big, 201, a);
	sha1_hex(big, 201, hex);
	memset(want, 'k', 150);
	want[150] = '~';
	memcpy(want + 151, hex, 41);
	test_cond(na == 191 && strcmp(a, want) == 0);
	test("an escape past the limit: the buffer holds it, the name is cut");
	big[199] = '/';
	test_cond(keyname_encode(big, 300, a) == 191 && a[150] == '~');
	test("two long keys that differ at their end stay apart");
	big[399] = 'x';
	na = keyname_encode(big, 400, a);
	big[399] = 'y';
	nb = keyname_encode(big, 400, b);
	test_cond(na == nb && memcmp(a, b, 150) == 0 && strcmp(a, b) != 0);
	test("a name decodes back to its key; a shortened one keeps its hash");
	na = keyname_encode("ns:k y\0\xff/%", 11, a);
	test_cond(keyname_decode(a, na, b) == 11 && memcmp(b, "ns:k y\0\xff/%", 11) == 0);
	test_cond(keyname_decode("a%2", 3, b) == 3 && memcmp(b, "a%2", 3) == 0);
	na = keyname_encode(big, 400, a);
	test_cond(keyname_decode(a, na, b) == 191 && memcmp(b, a, 191) == 0);
	return test_report("keyname");
}
