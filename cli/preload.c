/* SPDX-License-Identifier: MIT */
/*
 * preload.c - `lockshim enable [-c FILE]` and `lockshim disable`: the shim
 * in /etc/ld.so.preload, where the dynamic linker loads it into every
 * program of the machine (set-ID ones included).
 *
 * enable validates FILE (default CONF_DEFAULT_PATH, the file preloaded
 * programs read) as the shim's constructor does (cli_load, then the
 * backend's own checks), without contacting any server, so that it works
 * while the server is down; a config the shim could not use is refused
 * (78) before the preload file is touched. The line is the shim's absolute
 * path as cli_find_shim finds it, symbolic links resolved, alone on its
 * line: `make uninstall` and the package's scripts remove that same line.
 * The file is rewritten atomically: a temporary file in /etc with every
 * other line kept, the original's mode and owner, fsync, rename, fsync of
 * /etc. Both verbs are idempotent; disable removes the file when nothing
 * but blank lines would be left (the dynamic linker reads no file and an
 * empty one alike). Exit statuses: 0, 64 usage, 69 the shim not found,
 * 74 the preload file not read or written, 77 not root, 78 config.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend.h"
#include "cli.h"
#include "conf.h"
#include "log.h"

#define PRELOAD_FILE "/etc/ld.so.preload"
#define PRELOAD_DIR "/etc"

/* Returns 0 when running as root, else EX_NOPERM (said on stderr). */
static int need_root(const char *verb)
{
	if (geteuid() == 0)
		return 0;
	fprintf(stderr, "lockshim: %s writes " PRELOAD_FILE ", which only root may change; "
		"run it as root\n", verb);
	return EX_NOPERM;
}

/* Reads PRELOAD_FILE into a malloc'd string (the caller frees it) and its
 * status into *st; a missing file is "" with *exists 0. Returns NULL
 * (said on stderr) when it cannot be read. */
static char *read_preload(struct stat *st, int *exists)
{
	int fd = open(PRELOAD_FILE, O_RDONLY | O_CLOEXEC);
	char *buf = NULL;
	size_t len = 0, cap = 0;
	ssize_t n;

	*exists = fd >= 0;
	if (fd < 0 && errno == ENOENT)
		return strdup("");
	if (fd < 0 || fstat(fd, st) != 0)
		goto fail;
	do {
		if (len + 4096 + 1 > cap) {
			char *b = realloc(buf, cap = len + 4096 + 1 + cap);

			if (!b)
				goto fail;
			buf = b;
		}
		n = read(fd, buf + len, cap - len - 1);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			goto fail;
		len += (size_t)n;
	} while (n > 0);
	close(fd);
	buf[len] = 0;
	return buf;
fail:
	fprintf(stderr, "lockshim: cannot read " PRELOAD_FILE ": %s\n", strerror(errno));
	if (fd >= 0)
		close(fd);
	free(buf);
	return NULL;
}

/* Returns 1 when the line line[0..len) is path alone (blanks around it
 * ignored), else 0. */
static int is_line(const char *line, size_t len, const char *path)
{
	while (len && (*line == ' ' || *line == '\t'))
		line++, len--;
	while (len && (line[len - 1] == ' ' || line[len - 1] == '\t' || line[len - 1] == '\r'))
		len--;
	return len == strlen(path) && memcmp(line, path, len) == 0;
}

/* Returns 1 when path is one of the names in text (the dynamic linker
 * splits the file at blanks, newlines and colons), else 0. */
static int names(const char *text, const char *path)
{
	size_t plen = strlen(path);

	for (const char *p = text; *p;) {
		size_t n = strcspn(p, " \t\r\n:");

		if (n == plen && memcmp(p, path, n) == 0)
			return 1;
		p += n;
		p += strspn(p, " \t\r\n:");
	}
	return 0;
}

/*
 * Replaces PRELOAD_FILE by text (len bytes) atomically, with the mode and
 * owner of the old file (st, when exists) or 0644 root's; len 0 removes
 * the file. Returns 0, or EX_IOERR said on stderr.
 */
static int write_preload(const char *text, size_t len, const struct stat *st, int exists)
{
	char tmp[] = PRELOAD_DIR "/.ld.so.preload.XXXXXX";
	int fd, dfd, e;
	size_t off = 0;

	if (len == 0) {
		if (unlink(PRELOAD_FILE) != 0 && errno != ENOENT)
			goto fail_errno;
		goto sync_dir;
	}
	if ((fd = mkostemp(tmp, O_CLOEXEC)) < 0)
		goto fail_errno;
	if (fchmod(fd, exists ? st->st_mode & 07777 : 0644) != 0 ||
	    (exists && fchown(fd, st->st_uid, st->st_gid) != 0))
		goto fail_tmp;
	while (off < len) {
		ssize_t n = write(fd, text + off, len - off);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			goto fail_tmp;
		off += (size_t)n;
	}
	if (fsync(fd) != 0 || close(fd) != 0) {
		fd = -1;
		goto fail_tmp;
	}
	fd = -1;
	if (rename(tmp, PRELOAD_FILE) != 0)
		goto fail_tmp;
sync_dir:
	if ((dfd = open(PRELOAD_DIR, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) >= 0) {
		fsync(dfd);
		close(dfd);
	}
	return 0;
fail_tmp:
	e = errno;
	if (fd >= 0)
		close(fd);
	unlink(tmp);
	errno = e;
fail_errno:
	fprintf(stderr, "lockshim: cannot write " PRELOAD_FILE ": %s; it is unchanged\n",
		strerror(errno));
	return EX_IOERR;
}

/* Validates path as the shim's constructor would, without a server.
 * Returns 0, or CONF_EXIT_CODE said on stderr. */
static int validate(const char *path)
{
	struct conf cfg;
	struct backend b;
	char err[1024];
	int rc = 0;

	if (cli_load(&cfg, path) != 0) {
		conf_release(&cfg);
		return CONF_EXIT_CODE;
	}
	if (backend_init(&b, &cfg, err, sizeof(err)) != 0) {
		log_stderr("config error: %s: %s", path, err);
		rc = CONF_EXIT_CODE;
	} else {
		backend_release(&b);
	}
	conf_release(&cfg);
	return rc;
}

int cmd_enable(int argc, char **argv)
{
	const char *config = CONF_DEFAULT_PATH;
	char *shim = NULL, *text = NULL, *out = NULL;
	struct stat st = { 0 };
	int rc, exists, i;
	size_t len;

	for (i = 2; i < argc; i++) {
		if ((!strcmp(argv[i], "-c") || !strcmp(argv[i], "--config")) && i + 1 < argc)
			config = argv[++i];
		else if (!strncmp(argv[i], "--config=", 9))
			config = argv[i] + 9;
		else if (!strcmp(argv[i], "-c") || !strcmp(argv[i], "--config"))
			return cli_usage_error("%s needs a file", argv[i]);
		else
			return cli_usage_error("enable: unexpected %s", argv[i]);
	}
	if ((rc = need_root("enable")) != 0 || (rc = validate(config)) != 0)
		return rc;
	if (!(shim = cli_find_shim())) {
		fprintf(stderr, "lockshim: cannot find liblockshim.so next to this program or in "
			"its install prefix; " PRELOAD_FILE " is unchanged\n");
		return EX_UNAVAILABLE;
	}
	if (!(text = read_preload(&st, &exists))) {
		rc = EX_IOERR;
		goto out;
	}
	if (names(text, shim)) {
		printf("lockshim: %s is already in " PRELOAD_FILE "; nothing changed\n", shim);
		goto out;
	}
	len = strlen(text);
	if (asprintf(&out, "%s%s%s\n", text, len && text[len - 1] != '\n' ? "\n" : "",
		     shim) < 0) {
		out = NULL;
		rc = EX_IOERR;
		fprintf(stderr, "lockshim: out of memory\n");
		goto out;
	}
	if ((rc = write_preload(out, strlen(out), &st, exists)) == 0)
		printf("lockshim: added %s to " PRELOAD_FILE "; every program started from now "
		       "on loads it and reads " CONF_DEFAULT_PATH " (%s is valid)\n", shim, config);
out:
	free(out);
	free(text);
	free(shim);
	return rc;
}

int cmd_disable(int argc, char **argv)
{
	char *shim, *text = NULL, *out = NULL, *q;
	struct stat st = { 0 };
	int rc, exists, removed = 0, blank = 1;

	if (argc > 2)
		return cli_usage_error("disable: unexpected %s", argv[2]);
	if ((rc = need_root("disable")) != 0)
		return rc;
	/* the line enable wrote; with the shim gone, the installed path */
	if (!(shim = cli_find_shim()) && !(shim = strdup(LOCKSHIM_LIBDIR "/liblockshim.so")))
		return EX_IOERR;
	if (!(text = read_preload(&st, &exists))) {
		rc = EX_IOERR;
		goto out;
	}
	if (!(out = q = malloc(strlen(text) + 1))) {
		rc = EX_IOERR;
		goto out;
	}
	for (const char *p = text; *p;) {
		size_t n = strcspn(p, "\n"), k = n + (p[n] == '\n');

		if (is_line(p, n, shim)) {
			removed++;
		} else {
			memcpy(q, p, k);
			q += k;
			if (strspn(p, " \t\r") < n)
				blank = 0;
		}
		p += k;
	}
	*q = 0;
	if (!removed) {
		printf("lockshim: %s is not a line of " PRELOAD_FILE "; nothing changed\n", shim);
		goto out;
	}
	if ((rc = write_preload(out, blank ? 0 : strlen(out), &st, exists)) == 0)
		printf("lockshim: removed %s from " PRELOAD_FILE "%s\n", shim,
		       blank ? " (now empty: the file is removed)" : "");
out:
	free(out);
	free(text);
	free(shim);
	return rc;
}
