/* SPDX-License-Identifier: MIT */
/*
 * log.c - the shim's only output channel.
 *
 * A line (text, or JSON with log_format) is formatted into a stack buffer
 * and written with one write(2): lines of several threads never interleave,
 * no stdio lock is taken (unsafe after fork, maybe guarded). It names the
 * program (read once, log_init); in the log file it starts with the UTC
 * time, from clock_gettime when a line is written, without gmtime (no tz
 * lock). Control characters and bytes that are not well-formed UTF-8
 * are escaped (text from a server included): one event, one line, and
 * nothing a terminal would act on. The log
 * file's descriptor is the shim's own (fdown.h; reopened when the program
 * takes it), as is log_syslog's AF_UNIX socket: one sendto(2) per line to
 * /dev/log, RFC 3164 without the local-time stamp, not syslog(3) (its lock
 * is unsafe in a guarded call or fork child); a lagging daemon delays a
 * line 100 ms at most. The shim's write(2) goes through its own PLT, never
 * patched, so guarding `write` cannot loop back here.
 */
#include "log.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/auxv.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "fdown.h"

int log_threshold = LOG_WARN;
static struct fdown log_own = { .fd = -1 };
static char log_path[PATH_MAX];
static int reopening;
static int log_pid;
static char log_prog[256]; /* the executable's file name, escaped */
static char log_prog_json[256]; /* the same, JSON-escaped */
static int log_json; /* log_format = "json" */
static struct fdown log_sys = { .fd = -1 }; /* log_syslog's socket */
static struct sockaddr_un log_sys_addr;   /* sun_family 0: no syslog */
static int log_sys_reopening;
static int log_sys_lagging; /* a send timed out: do not wait until one goes */

#define LOG_SYSLOG_WAIT_MS 100 /* the longest a line waits for the daemon */

static const char *const level_names[] = { "error", "warn", "info", "debug" };

int log_level_parse(const char *s)
{
	for (int i = 0; i <= LOG_DEBUG; i++)
		if (strcasecmp(s, level_names[i]) == 0)
			return i;
	return -1;
}

/* Opens path for appending. In secure-execution mode (AT_SECURE), where
 * the shim first opened it below a root-only directory (conf_logging),
 * a symbolic link put there since is not followed. */
static int open_log(const char *path)
{
	return open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC |
		    (getauxval(AT_SECURE) ? O_NOFOLLOW : 0), 0644);
}

int log_check_file(const char *path)
{
	int fd = open_log(path);

	if (fd < 0)
		return -errno;
	close(fd);
	return 0;
}

int log_open_file(const char *path)
{
	int fd = open_log(path);

	return fd < 0 ? -errno : log_use_file(path, fd);
}

int log_use_file(const char *path, int fd)
{
	int rc;

	if (strlen(path) >= sizeof(log_path)) {
		close(fd);
		return -ENAMETOOLONG;
	}
	if ((rc = fdown_adopt(&log_own, fd)) < 0)
		return rc;
	memcpy(log_path, path, strlen(path) + 1);
	return 0;
}

void log_set_pid(int pid)
{
	log_pid = pid;
}

size_t log_self_exe(char *buf, size_t cap)
{
	static const char deleted[] = " (deleted)";
	ssize_t n = readlink("/proc/self/exe", buf, cap - 1);

	if (n <= 0) {
		buf[0] = 0;
		return 0;
	}
	buf[n] = 0;
	if ((size_t)n > sizeof(deleted) - 1 &&
	    strcmp(buf + n - (sizeof(deleted) - 1), deleted) == 0)
		n -= (ssize_t)(sizeof(deleted) - 1);
	buf[n] = 0;
	return (size_t)n;
}

void log_init(void)
{
	char exe[PATH_MAX];

	log_self_exe(exe, sizeof(exe));
	log_init_exe(exe);
}

void log_init_exe(const char *exe)
{
	const char *base = program_invocation_short_name;
	size_t len;

	log_pid = getpid();
	if (*exe)
		base = strrchr(exe, '/') ? strrchr(exe, '/') + 1 : exe;
	len = log_escape(log_prog, sizeof(log_prog) - 1, base, strlen(base));
	log_prog[len] = 0;
	len = log_json_escape(log_prog_json, sizeof(log_prog_json) - 1, base, strlen(base));
	log_prog_json[len] = 0;
}

void log_set_json(int json)
{
	log_json = json;
}

/* Puts a new AF_UNIX datagram socket owned by the shim in *o, whose sends
 * wait at most LOG_SYSLOG_WAIT_MS for room. Returns 0 or -errno. */
static int syslog_socket(struct fdown *o)
{
	struct timeval tv = { 0, LOG_SYSLOG_WAIT_MS * 1000 };
	int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);

	if (fd < 0)
		return -errno;
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	return fdown_adopt(o, fd);
}

int log_open_syslog(const char *path)
{
	int rc;

	if (strlen(path) >= sizeof(log_sys_addr.sun_path))
		return -ENAMETOOLONG;
	if (log_sys.fd < 0 && (rc = syslog_socket(&log_sys)) < 0)
		return rc;
	memcpy(log_sys_addr.sun_path, path, strlen(path) + 1);
	__atomic_store_n(&log_sys_addr.sun_family, AF_UNIX, __ATOMIC_RELEASE);
	return 0;
}

/* Writes the datagram "<PRI>lockshim[pid]: program: level: msg" for
 * msg[0..m) at level (facility LOG_DAEMON) to dg (cap bytes). Returns its
 * length. */
static int syslog_datagram(char *dg, size_t cap, int level, const char *msg, int m)
{
	static const int severity[] = { 3, 4, 6, 7 }; /* err, warning, info, debug */
	int n = snprintf(dg, cap, "<%d>lockshim[%d]: %s: %s: ", 3 * 8 + severity[level],
			 log_pid, log_prog, level_names[level]);

	return n + (int)log_escape(dg + n, cap - (size_t)n, msg, (size_t)m);
}

/* Sends msg[0..m) at level to syslog as one datagram (syslog_datagram).
 * While the daemon's queue is full the send waits LOG_SYSLOG_WAIT_MS at
 * most; after a line was dropped so, later ones do not wait at all until
 * one goes through again. A line nothing listens to is dropped. */
static void syslog_send(int level, const char *msg, int m)
{
	int flags = MSG_NOSIGNAL |
		    (__atomic_load_n(&log_sys_lagging, __ATOMIC_RELAXED) ? MSG_DONTWAIT : 0);
	char dg[2048];
	ssize_t sent;
	int n, fd;

	if (!fdown_check(&log_sys)) {
		if (__atomic_exchange_n(&log_sys_reopening, 1, __ATOMIC_ACQUIRE))
			return;
		if (log_sys.fd < 0)
			syslog_socket(&log_sys);
		__atomic_store_n(&log_sys_reopening, 0, __ATOMIC_RELEASE);
	}
	if ((fd = log_sys.fd) < 0)
		return;
	n = syslog_datagram(dg, sizeof(dg), level, msg, m);
	while ((sent = sendto(fd, dg, (size_t)n, flags, (const struct sockaddr *)&log_sys_addr,
			      sizeof(log_sys_addr))) < 0 && errno == EINTR)
		;
	if (sent >= 0 || errno == EAGAIN || errno == EWOULDBLOCK)
		__atomic_store_n(&log_sys_lagging, sent < 0, __ATOMIC_RELAXED);
}

void log_syslog_once(const char *path, int level, const char *msg)
{
	struct sockaddr_un addr = { .sun_family = AF_UNIX };
	struct timeval tv = { 0, LOG_SYSLOG_WAIT_MS * 1000 };
	char dg[2048];
	int fd, n;

	if (strlen(path) >= sizeof(addr.sun_path))
		return;
	memcpy(addr.sun_path, path, strlen(path) + 1);
	if (!log_pid)
		log_init();
	if ((fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0)) < 0)
		return;
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	n = syslog_datagram(dg, sizeof(dg), level, msg, (int)strlen(msg));
	while (sendto(fd, dg, (size_t)n, MSG_NOSIGNAL, (const struct sockaddr *)&addr,
		      sizeof(addr)) < 0 && errno == EINTR)
		;
	close(fd);
}

/* Returns the length of the well-formed UTF-8 sequence (not overlong, no
 * surrogate, at most U+10FFFF) at s[0..len) that starts with a byte
 * >= 0x80, or 0. */
static size_t utf8_len(const unsigned char *s, size_t len)
{
	unsigned char c = s[0];
	size_t n = c >= 0xf5 ? 0 : c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc2 ? 2 : 0;

	if (!n || n > len)
		return 0;
	for (size_t i = 1; i < n; i++)
		if ((s[i] & 0xc0) != 0x80)
			return 0;
	if ((c == 0xe0 && s[1] < 0xa0) || (c == 0xed && s[1] >= 0xa0) ||
	    (c == 0xf0 && s[1] < 0x90) || (c == 0xf4 && s[1] >= 0x90))
		return 0;
	return n;
}

/* Nonzero when s[0..len) starts with the UTF-8 form of a C1 control
 * (U+0080..U+009F; U+009B is a terminal's CSI). */
static int is_c1(const unsigned char *s, size_t len)
{
	return len >= 2 && s[0] == 0xc2 && s[1] < 0xa0;
}

/* Returns the length of the UTF-8 sequence at s[0..len) that starts with
 * a byte >= 0x80 and is kept as it is (well-formed, not a C1 control),
 * or 0: it is escaped byte by byte. */
static size_t utf8_kept(const unsigned char *s, size_t len)
{
	return is_c1(s, len) ? 0 : utf8_len(s, len);
}

size_t log_json_escape(char *dst, size_t cap, const char *src, size_t len)
{
	static const char hex[] = "0123456789abcdef";
	const unsigned char *u = (const unsigned char *)src;
	size_t n = 0, k;

	for (size_t i = 0; i < len; i += k) {
		unsigned char c = u[i];

		k = 1;
		if (c >= 0x20 && c < 0x80 && c != '"' && c != '\\') {
			if (n + 1 > cap)
				break;
			dst[n++] = (char)c;
		} else if (c == '"' || c == '\\') {
			if (n + 2 > cap)
				break;
			dst[n++] = '\\';
			dst[n++] = (char)c;
		} else if (c >= 0x80 && (k = utf8_kept(u + i, len - i)) > 0) {
			if (n + k > cap)
				break;
			memcpy(dst + n, src + i, k);
			n += k;
		} else {
			k = is_c1(u + i, len - i) ? 2 : 1;
			c = u[i + k - 1]; /* a C1 control's code point, or the byte */
			if (n + 6 > cap)
				break;
			memcpy(dst + n, "\\u00", 4);
			dst[n + 4] = hex[c >> 4];
			dst[n + 5] = hex[c & 15];
			n += 6;
		}
	}
	return n;
}

/* Days since 1970-01-01 to a civil date (H. Hinnant's days_from_civil
 * inverse; proleptic Gregorian, any year). */
static void civil_from_days(long long z, long long *y, int *m, int *d)
{
	long long era, doe, yoe, doy, mp;

	z += 719468;
	era = (z >= 0 ? z : z - 146096) / 146097;
	doe = z - era * 146097;
	yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
	doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
	mp = (5 * doy + 2) / 153;
	*d = (int)(doy - (153 * mp + 2) / 5 + 1);
	*m = (int)(mp < 10 ? mp + 3 : mp - 9);
	*y = yoe + era * 400 + (*m <= 2);
}

size_t log_format_time(char *buf, size_t cap, long long sec, long nsec)
{
	long long days = sec / 86400, rem = sec % 86400, y;
	int m, d, n;

	if (rem < 0) {
		rem += 86400;
		days--;
	}
	civil_from_days(days, &y, &m, &d);
	n = snprintf(buf, cap, "%04lld-%02d-%02dT%02d:%02d:%02d.%03dZ", y, m, d,
		     (int)(rem / 3600), (int)(rem / 60 % 60), (int)(rem % 60),
		     (int)(nsec / 1000000));
	return n < 0 ? 0 : (size_t)n >= cap ? cap - 1 : (size_t)n;
}

const char *log_program(void)
{
	if (!log_pid)
		log_init(); /* a program that never called it (a unit test) */
	return log_prog;
}

size_t log_prefix(char *buf, size_t cap)
{
	int n;

	if (!log_pid)
		log_init(); /* a program that never called it (a unit test) */
	n = snprintf(buf, cap, "lockshim[%d] %s: ", log_pid, log_prog);
	return n < 0 ? 0 : (size_t)n >= cap ? cap - 1 : (size_t)n;
}

size_t log_escape(char *dst, size_t cap, const char *src, size_t len)
{
	static const char hex[] = "0123456789abcdef";
	const unsigned char *u = (const unsigned char *)src;
	size_t n = 0, k;

	for (size_t i = 0; i < len; i += k) {
		unsigned char c = u[i];
		char esc = c == '\n' ? 'n' : c == '\r' ? 'r' : c == '\t' ? 't' : 0;

		k = 1;
		if (c >= 0x20 && c < 0x7f) {
			if (n + 1 > cap)
				break;
			dst[n++] = (char)c;
		} else if (c >= 0x80 && (k = utf8_kept(u + i, len - i)) > 0) {
			if (n + k > cap)
				break;
			memcpy(dst + n, src + i, k);
			n += k;
		} else if (esc) {
			if (n + 2 > cap)
				break;
			dst[n++] = '\\';
			dst[n++] = esc;
		} else {
			k = 1;
			if (n + 4 > cap)
				break;
			dst[n++] = '\\';
			dst[n++] = 'x';
			dst[n++] = hex[c >> 4];
			dst[n++] = hex[c & 15];
		}
	}
	return n;
}

/* Returns the descriptor lines go to: the log file's (opened again when the
 * program took its descriptor), or standard error. */
static int log_fd(void)
{
	int fd;

	if (!log_path[0] || fdown_check(&log_own))
		return log_path[0] ? log_own.fd : 2;
	if (__atomic_exchange_n(&reopening, 1, __ATOMIC_ACQUIRE))
		return 2; /* another thread is at it: this line goes to stderr */
	fd = open_log(log_path);
	if (fd >= 0)
		fdown_adopt(&log_own, fd);
	__atomic_store_n(&reopening, 0, __ATOMIC_RELEASE);
	return log_own.fd >= 0 ? log_own.fd : 2;
}

/* Writes one JSON object (ts, level, pid, program, [lock, key,] msg) for
 * msg[0..m) to line (cap bytes, room kept for the closing "}\n"). Returns
 * its length, newline included. */
static int json_line(char *line, size_t cap, int level, const char *lock, const char *key,
		     size_t klen, const char *msg, int m)
{
	static const char tail[] = "\"}\n";
	struct timespec ts;
	char when[64];
	int n;

	clock_gettime(CLOCK_REALTIME, &ts);
	log_format_time(when, sizeof(when), ts.tv_sec, ts.tv_nsec);
	n = snprintf(line, cap, "{\"ts\":\"%s\",\"level\":\"%s\",\"pid\":%d,\"program\":\"%s\",",
		     when, level_names[level], log_pid, log_prog_json);
	if (n < 0 || (size_t)n + sizeof(tail) + 64 > cap)
		return 0;
	if (lock) {
		memcpy(line + n, "\"lock\":\"", 8);
		n += 8;
		n += (int)log_json_escape(line + n, cap / 4, lock, strlen(lock));
		memcpy(line + n, "\",", 2);
		n += 2;
	}
	if (key) {
		memcpy(line + n, "\"key\":\"", 7);
		n += 7;
		n += (int)log_json_escape(line + n, cap / 4, key, klen);
		memcpy(line + n, "\",", 2);
		n += 2;
	}
	memcpy(line + n, "\"msg\":\"", 7);
	n += 7;
	n += (int)log_json_escape(line + n, cap - (size_t)n - sizeof(tail), msg, (size_t)m);
	memcpy(line + n, tail, sizeof(tail) - 1);
	return n + (int)sizeof(tail) - 1;
}

/* log_write and log_write_key: formats fmt/ap and writes the line. */
static void log_vwrite(int level, const char *lock, const char *key, size_t klen,
		       const char *fmt, va_list ap)
{
	char msg[1024], line[2048];
	int saved_errno = errno, fd = log_fd();
	int n = 0, m;

	m = vsnprintf(msg, sizeof(msg), fmt, ap);
	if (m < 0)
		m = 0;
	if (m >= (int)sizeof(msg))
		m = (int)sizeof(msg) - 1;
	if (!log_pid)
		log_init(); /* a program that never called it (a unit test) */
	if (log_json) {
		n = json_line(line, sizeof(line), level, lock, key, klen, msg, m);
	} else {
		if (fd != 2) {
			struct timespec ts;

			clock_gettime(CLOCK_REALTIME, &ts);
			n = (int)log_format_time(line, sizeof(line), ts.tv_sec, ts.tv_nsec);
			line[n++] = ' ';
		}
		n += (int)log_prefix(line + n, sizeof(line) - (size_t)n);
		n += snprintf(line + n, sizeof(line) - (size_t)n, "%s: ", level_names[level]);
		n += (int)log_escape(line + n, sizeof(line) - (size_t)n - 1, msg, (size_t)m);
		line[n++] = '\n';
	}
	while (n > 0 && write(fd, line, (size_t)n) < 0 && errno == EINTR)
		;
	if (__atomic_load_n(&log_sys_addr.sun_family, __ATOMIC_ACQUIRE) == AF_UNIX)
		syslog_send(level, msg, m);
	errno = saved_errno;
}

void log_stderr(const char *fmt, ...)
{
	char msg[1024], line[4 * sizeof(msg) + 16] = "lockshim: ";
	size_t n = strlen(line);
	va_list ap;
	int m;

	va_start(ap, fmt);
	m = vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (m < 0)
		m = 0;
	if (m >= (int)sizeof(msg))
		m = (int)sizeof(msg) - 1;
	n += log_escape(line + n, sizeof(line) - n - 1, msg, (size_t)m);
	line[n++] = '\n';
	while (write(2, line, n) < 0 && errno == EINTR)
		;
}

void log_write(int level, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	log_vwrite(level, NULL, NULL, 0, fmt, ap);
	va_end(ap);
}

void log_write_key(int level, const char *lock, const char *key, size_t klen,
		   const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	log_vwrite(level, lock, key, klen, fmt, ap);
	va_end(ap);
}
