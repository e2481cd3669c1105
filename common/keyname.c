/* SPDX-License-Identifier: MIT */
/*
 * keyname.c - a stored key as one safe name (keyname.h): percent-encoded
 * byte by byte until the encoding passes KEYNAME_MAX, then shortened to
 * its first KEYNAME_KEEP bytes, "~" and the SHA-1 of the whole key; and
 * back (keyname_decode, for status: a shortened name stays shortened).
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

/* Returns the value of an upper-case hex digit (keyname_encode's), or -1. */
static int hex_digit(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

size_t keyname_decode(const char *name, size_t n, char *key)
{
	size_t k = 0;

	for (size_t i = 0; i < n; i++) {
		int hi = i + 2 < n ? hex_digit(name[i + 1]) : -1;
		int lo = i + 2 < n ? hex_digit(name[i + 2]) : -1;

		if (name[i] == '%' && hi >= 0 && lo >= 0) {
			key[k++] = (char)(hi * 16 + lo);
			i += 2;
		} else {
			key[k++] = name[i];
		}
	}
	return k;
}
