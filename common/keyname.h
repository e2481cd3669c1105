/* SPDX-License-Identifier: MIT */
/*
 * keyname.h - a stored key (any bytes, any length) as one safe name: a
 * file name of backend_local.c's directory, a znode name of the zookeeper
 * module. Bytes other than [A-Za-z0-9_-] are written %XX (so no "/", no
 * leading ".", no ".."); an encoding longer than KEYNAME_MAX bytes keeps
 * its first KEYNAME_KEEP, "~" and the SHA-1 (hex) of the whole key, so
 * distinct keys stay distinct. No allocation, no state: a module may link
 * it (with sha1.c).
 */
#ifndef LOCKSHIM_KEYNAME_H
#define LOCKSHIM_KEYNAME_H

#include <stddef.h>

#define KEYNAME_MAX 200   /* longer encodings are shortened with a hash */
#define KEYNAME_KEEP 150  /* ... to this many encoded bytes, "~" and the SHA-1 */
/* keyname_encode's room: an escape written past KEYNAME_MAX, and the NUL */
#define KEYNAME_SIZE (KEYNAME_MAX + 4)

/* Writes key[0..klen)'s name and a NUL into buf (KEYNAME_SIZE bytes).
 * Returns its length (at most KEYNAME_MAX). */
size_t keyname_encode(const void *key, size_t klen, char *buf);

/* Writes the key of name[0..n) into key (n bytes at most): %XX back to its
 * byte; a shortened name's "~" and hash, and a cut escape, stay as they
 * are. Returns the key's length. */
size_t keyname_decode(const char *name, size_t n, char *key);

#endif
