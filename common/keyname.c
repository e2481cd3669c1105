/* SPDX-License-Identifier: MIT */
/*
 * keyname.c - a stored key as one safe name (keyname.h): percent-encoded
 * byte by byte until the encoding passes KEYNAME_MAX, then shortened to
 * its first KEYNAME_KEEP bytes, "~" and the SHA-1 of the whole key.
 */
#include "keyname.h"

#include "sha1.h"

size_t keyname_encode(const void *key, size_t klen, char *buf)
{
	static const char hex[] = "0123456789ABCDEF";
	const unsigned char *k = key;
	size_t n = 0;

	for (size_t i = 0; i < klen && n <= KEYNAME_MAX; i++) {
		unsigned char ch = k[i];

		if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
		    (ch >= '0' && ch <= '9') || ch == '_' || ch == '-') {
			buf[n++] = (char)ch;
		} else {
			buf[n++] = '%';
			buf[n++] = hex[ch >> 4];
			buf[n++] = hex[ch & 15];
		}
	}
	if (n > KEYNAME_MAX) {
		n = KEYNAME_KEEP;
		buf[n++] = '~';
		sha1_hex(key, klen, buf + n);
		n += 40;
	}
	buf[n] = 0;
	return n;
}
