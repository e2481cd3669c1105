/* SPDX-License-Identifier: MIT */
/*
 * log.h - one line per event, without stdio.
 *
 * LOG(level, fmt, ...) tests the level before evaluating its arguments
 * (redis serverLog style). Lines are formatted into a stack buffer and
 * written with a single write(2) to stderr or the configured log file,
 * prefixed "lockshim[pid]: ". Safe to call from any thread and after fork.
 */
#ifndef LOCKSHIM_LOG_H
#define LOCKSHIM_LOG_H

#include <stddef.h>

enum log_level { LOG_ERROR = 0, LOG_WARN, LOG_INFO, LOG_DEBUG };

extern int log_threshold;

#define LOG(level, ...)                                                        \
	do {                                                                   \
		if ((level) <= log_threshold)                                  \
			log_write((level), __VA_ARGS__);                       \
	} while (0)

void log_write(int level, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

/* Returns the level named by s ("error", "warn", "info", "debug", in any
 * case) or -1. */
int log_level_parse(const char *s);

/* Sends later lines to path (opened O_APPEND|O_CLOEXEC). Returns 0 or -errno. */
int log_open_file(const char *path);

/* Sends later lines to fd, already opened on path for appending (the shim
 * owns it now: fdown.h), and to path opened again when the program takes
 * the descriptor. Returns 0, or -errno with fd closed. */
int log_use_file(const char *path, int fd);

/* Opens path as log_open_file would, and closes it. Returns 0 or -errno. */
int log_check_file(const char *path);

/*
 * Copies src[0..len) to dst (at most cap bytes), writing control characters
 * as \n, \r, \t or \xNN, so that one message stays one line. Returns the
 * bytes written; an escape that does not fit is dropped whole.
 */
size_t log_escape(char *dst, size_t cap, const char *src, size_t len);

/* Sets the pid printed in the prefix; called at init and in a fork child. */
void log_set_pid(int pid);

#endif
