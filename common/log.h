/* SPDX-License-Identifier: MIT */
/*
 * log.h - one line per event, without stdio.
 *
 * LOG(level, fmt, ...) tests the level before evaluating its arguments
 * (redis serverLog style). Lines are formatted into a stack buffer and
 * written with a single write(2) to stderr or the configured log file,
 * prefixed "lockshim[pid] program: level: " (the log file's lines first
 * with the UTC time, RFC 3339 with milliseconds), or as JSON objects; and
 * to syslog too with log_syslog. Safe from any thread and after fork.
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

/* LOG for an event of one lock: with log_format = "json" the line also
 * has "lock" (its name, the symbol; NULL: none) and "key" (key[0..klen);
 * NULL: none). Text lines are as LOG's (the message names them). */
#define LOGK(level, lock, key, klen, ...)                                      \
	do {                                                                   \
		if ((level) <= log_threshold)                                  \
			log_write_key((level), (lock), (key), (klen), __VA_ARGS__); \
	} while (0)

void log_write_key(int level, const char *lock, const char *key, size_t klen,
		   const char *fmt, ...) __attribute__((format(printf, 5, 6)));

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
 * as \n, \r, \t or \xNN, and each byte that is not part of well-formed
 * UTF-8, or is part of a C1 control (U+0080..U+009F), as \xNN: one message
 * stays one line, valid UTF-8, with nothing a terminal would act on. Returns
 * the bytes written; an escape that does not fit is dropped whole.
 */
size_t log_escape(char *dst, size_t cap, const char *src, size_t len);

/*
 * Copies src[0..len) to dst (at most cap bytes) as the inside of a JSON
 * string: '"' and '\\' escaped, control characters (C1 too) and bytes
 * that are not part of well-formed UTF-8 as \u00XX (the byte's Latin-1
 * reading), other UTF-8 kept. Returns the bytes written; an escape that does not fit is dropped
 * whole, and so is everything after it.
 */
size_t log_json_escape(char *dst, size_t cap, const char *src, size_t len);

/* Writes "lockshim: <message>" and a newline to standard error with one
 * write(2), the message escaped as log_escape does: the command's
 * messages that carry a server's text, a key or a holder's record. */
void log_stderr(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Nonzero: later lines are JSON objects (log_format = "json"):
 * {"ts":..,"level":..,"pid":..,"program":..,"msg":..}, to stderr too. */
void log_set_json(int json);

/* Sends every later line to syslog too (log_syslog): as one datagram on a
 * socket of the shim's own to the AF_UNIX datagram socket at path
 * (normally /dev/log), ident "lockshim", facility LOG_DAEMON, the level
 * mapped to err, warning, info or debug. Returns 0 or -errno. */
int log_open_syslog(const char *path);

/* Sends one line, msg at level, to the syslog socket at path as
 * log_open_syslog's lines go, on a socket opened for it and closed before
 * returning (nothing stays open; the send waits 100 ms at most). For the
 * shim's one line about an unusable implicit config (init.c). */
void log_syslog_once(const char *path, int level, const char *msg);

/* Sets the pid printed in the prefix; called in a fork child. */
void log_set_pid(int pid);

/* Reads the pid and the program's name (the file name of /proc/self/exe,
 * else program_invocation_short_name) printed in the prefix; called once,
 * at start-up, by the CLI (log_init) or by the shim's constructor, which
 * has read the executable's path already (log_init_exe: exe, or "" when
 * it could not be read). */
void log_init(void);
void log_init_exe(const char *exe);

/* Writes the executable's path (/proc/self/exe, " (deleted)" taken off) to
 * buf (cap bytes, NUL-terminated); returns its length, 0 when unreadable. */
size_t log_self_exe(char *buf, size_t cap);

/* Returns the program's name as the prefix prints it (log_init's; read
 * on first use when log_init was never called). Static storage. */
const char *log_program(void);

/* Writes "lockshim[pid] program: " to buf (at most cap bytes, NUL
 * included). Returns its length. */
size_t log_prefix(char *buf, size_t cap);

/* Writes sec.nsec since the epoch as UTC, RFC 3339 with milliseconds
 * ("2026-11-25T11:43:25.123Z", 24 bytes for years 0-9999; milliseconds
 * truncated, never rounded up to the next second) to buf (at most cap
 * bytes, NUL included). Returns its length. Takes no lock, allocates
 * nothing. */
size_t log_format_time(char *buf, size_t cap, long long sec, long nsec);

#endif
