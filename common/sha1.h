/* SPDX-License-Identifier: MIT */
/*
 * sha1.h - SHA-1 (FIPS 180-4), for naming Lua scripts the way Redis does.
 *
 * Redis caches a script under the SHA-1 of its text; computing it here lets a
 * connection send EVALSHA without a SCRIPT LOAD round trip first. Not used
 * for anything that needs collision resistance.
 */
#ifndef LOCKSHIM_SHA1_H
#define LOCKSHIM_SHA1_H

#include <stddef.h>

/* Writes the SHA-1 of data[0..len) to hex as 40 lowercase digits and a NUL. */
void sha1_hex(const void *data, size_t len, char hex[41]);

#endif
