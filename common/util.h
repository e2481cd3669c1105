/* SPDX-License-Identifier: MIT */
/*
 * util.h - monotonic time, sleeping, a 64-bit mixer and FNV-1a, shared by
 * the lock, renewal and key code, the CLI and the modules (all inline).
 */
#ifndef LOCKSHIM_UTIL_H
#define LOCKSHIM_UTIL_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

/* Returns CLOCK_MONOTONIC in milliseconds. */
static inline int64_t util_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Returns CLOCK_MONOTONIC in microseconds. */
static inline int64_t util_now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* A bijective 64-bit mixer (the splitmix64 finaliser): hashing, tokens. */
static inline uint64_t util_mix64(uint64_t x)
{
	x ^= x >> 30;
	x *= 0xbf58476d1ce4e5b9ULL;
	x ^= x >> 27;
	x *= 0x94d049bb133111ebULL;
	return x ^ (x >> 31);
}

#define UTIL_FNV1A64_START 0xcbf29ce484222325ULL

/* Returns FNV-1a (64 bits) of p[0..n) continued from h (the first bytes:
 * from UTIL_FNV1A64_START): hash tables' slots, ids derived from bytes. */
static inline uint64_t util_fnv1a64(uint64_t h, const void *p, size_t n)
{
	const unsigned char *b = p;

	for (size_t i = 0; i < n; i++)
		h = (h ^ b[i]) * 0x100000001b3ULL;
	return h;
}

/* Sleeps ms milliseconds, resuming after signal handlers. */
static inline void util_sleep_ms(int64_t ms)
{
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000000 };

	while (clock_nanosleep(CLOCK_MONOTONIC, 0, &ts, &ts) == EINTR)
		;
}

#endif
