/* SPDX-License-Identifier: MIT */
/*
 * util.h - monotonic time and sleeping, shared by the lock and renewal code.
 */
#ifndef LOCKSHIM_UTIL_H
#define LOCKSHIM_UTIL_H

#include <errno.h>
#include <stdint.h>
#include <time.h>

/* Returns CLOCK_MONOTONIC in milliseconds. */
static inline int64_t util_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Sleeps ms milliseconds, resuming after signal handlers. */
static inline void util_sleep_ms(int64_t ms)
{
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000000 };

	while (clock_nanosleep(CLOCK_MONOTONIC, 0, &ts, &ts) == EINTR)
		;
}

#endif
