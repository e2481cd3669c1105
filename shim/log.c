/* SPDX-License-Identifier: MIT */
/*
 * log.c - the shim's only output channel.
 *
 * Everything is formatted with vsnprintf into a stack buffer and emitted with
 * one write(2), so lines from several threads never interleave and no stdio
 * lock is ever taken (stdio is unsafe after fork and may be guarded itself).
 * The shim's own write(2) calls go through its own PLT, which the redirector
 * never patches, so a config that guards `write` cannot loop back here.
 */
#include "log.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int log_threshold = LOG_WARN;
static int log_fd = 2;
static int log_pid;

static const char *const level_names[] = { "error", "warn", "info", "debug" };

int log_level_parse(const char *s)
{
	for (int i = 0; i <= LOG_DEBUG; i++)
		if (strcmp(s, level_names[i]) == 0)
			return i;
	return -1;
}

int log_open_file(const char *path)
{
	int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);

	if (fd < 0)
		return -errno;
	log_fd = fd;
	return 0;
}

void log_set_pid(int pid)
{
	log_pid = pid;
}

void log_write(int level, const char *fmt, ...)
{
	char buf[1024];
	int saved_errno = errno;
	int n = snprintf(buf, sizeof(buf), "lockshim[%d]: %s: ", log_pid,
			 level_names[level]);
	va_list ap;

	va_start(ap, fmt);
	n += vsnprintf(buf + n, sizeof(buf) - (size_t)n, fmt, ap);
	va_end(ap);
	if (n > (int)sizeof(buf) - 2)
		n = (int)sizeof(buf) - 2;
	buf[n++] = '\n';
	while (write(log_fd, buf, (size_t)n) < 0 && errno == EINTR)
		;
	errno = saved_errno;
}
