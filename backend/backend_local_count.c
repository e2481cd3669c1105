/* SPDX-License-Identifier: MIT */
/*
 * backend_local_count.c - the local backend's metrics (.count and
 * .count_read): a host's counts "<ns>:metrics:{<host>}" are the files
 * "<keyname of it>.<euid>.counts" of local.dir, one per user, added up by
 * the reader (no key names them: lock files end in ".lock"). A file is a
 * line "key <key>", then "<value> <field>" per field, bytes other than
 * '!'..'~' and '%' written %XX; the key line tells a name keyname.h
 * shortened (taken when it encodes to the file's name; else the name is
 * decoded: an older shipper's file). A shipment takes flock LOCK_EX for
 * LOCAL_COUNT_WAIT_MS at most (a frozen shipper delays counts, not calls),
 * adds its deltas to what it reads, writes "<name>.new" and renames it
 * over the file (a file renamed meanwhile: again); readers take no lock.
 * A new file gets local.file_mode. The size is bounded by one host's
 * fields, whatever the processes or shipments.
 */
#include "backend_local_count.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "keyname.h"

#define LOCAL_COUNT_SUFFIX ".counts"
#define LOCAL_COUNT_KEY "key " /* the key line's start: no value, old readers skip it */
#define LOCAL_COUNT_WAIT_MS 50
#define LOCAL_COUNT_MAX (4 << 20) /* a counts file larger than this is refused */

/* One field of a counts file: its encoded text and value. */
struct field {
	const char *enc;
	size_t len;
	long long value;
};

/* A counts file read into memory: its text, its key line's encoded key
 * (into text; NULL when it has none) and its fields (into text). */
struct counts {
	char *text;
	char *key;
	size_t klen;
	struct field *f;
	size_t n, cap;
};

/* Writes "<dir>/<keyname of key>.<euid>.counts" into path (cap bytes).
 * Returns 0, or -1 when it does not fit. */
static int count_path(char *path, size_t cap, const char *dir, const char *key, size_t klen)
{
	char name[KEYNAME_SIZE];

	keyname_encode(key, klen, name);
	return (size_t)snprintf(path, cap, "%s/%s.%u%s", dir, name, (unsigned)geteuid(),
				LOCAL_COUNT_SUFFIX) < cap ? 0 : -1;
}

/* Returns the length of the keyname of a counts file's name (n bytes:
 * "<keyname>.<digits>.counts"), or 0 when it is not one. */
static size_t count_name(const char *name, size_t n)
{
	size_t sl = sizeof(LOCAL_COUNT_SUFFIX) - 1, k;

	if (n <= sl || strcmp(name + n - sl, LOCAL_COUNT_SUFFIX) != 0)
		return 0;
	k = n - sl;
	while (k > 0 && name[k - 1] >= '0' && name[k - 1] <= '9')
		k--;
	return k > 1 && k < n - sl && name[k - 1] == '.' && k - 1 <= KEYNAME_MAX ? k - 1 : 0;
}

/* Writes field f (n bytes) encoded into out (3 * n + 1 bytes); returns its
 * length. */
static size_t field_encode(const char *f, size_t n, char *out)
{
	static const char hex[] = "0123456789ABCDEF";
	size_t k = 0;

	for (size_t i = 0; i < n; i++) {
		unsigned char ch = (unsigned char)f[i];

		if (ch > ' ' && ch < 0x7f && ch != '%') {
			out[k++] = (char)ch;
		} else {
			out[k++] = '%';
			out[k++] = hex[ch >> 4];
			out[k++] = hex[ch & 15];
		}
	}
	out[k] = 0;
	return k;
}

/* Reads fd (a counts file) into *cs. Returns 0, or -1 with errno (EFBIG:
 * larger than LOCAL_COUNT_MAX; ENOMEM). A line that is neither the key
 * line nor "<value> <field>" is skipped. */
static int counts_read(int fd, struct counts *cs)
{
	struct stat st;
	size_t got = 0;
	char *p, *end;

	memset(cs, 0, sizeof(*cs));
	if (fstat(fd, &st) != 0)
		return -1;
	if (st.st_size > LOCAL_COUNT_MAX) {
		errno = EFBIG;
		return -1;
	}
	if (!(cs->text = malloc((size_t)st.st_size + 1)))
		return -1;
	while (got < (size_t)st.st_size) {
		ssize_t k = pread(fd, cs->text + got, (size_t)st.st_size - got, (off_t)got);

		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			break;
		got += (size_t)k;
	}
	cs->text[got] = 0;
	for (p = cs->text, end = cs->text + got; p < end;) {
		char *nl = memchr(p, '\n', (size_t)(end - p)), *sp, *num_end;
		long long v;

		if (!nl)
			break;
		*nl = 0;
		if (!strncmp(p, LOCAL_COUNT_KEY, sizeof(LOCAL_COUNT_KEY) - 1)) {
			cs->key = p + sizeof(LOCAL_COUNT_KEY) - 1;
			cs->klen = (size_t)(nl - cs->key);
			p = nl + 1;
			continue;
		}
		errno = 0;
		v = strtoll(p, &num_end, 10);
		sp = num_end;
		if (num_end != p && *sp == ' ' && sp + 1 < nl && !errno && v >= 0) {
			if (cs->n == cs->cap) {
				size_t cap = cs->cap ? 2 * cs->cap : 64;
				void *q = realloc(cs->f, cap * sizeof(*cs->f));

				if (!q)
					return -1;
				cs->f = q;
				cs->cap = cap;
			}
			cs->f[cs->n++] = (struct field){ sp + 1, (size_t)(nl - sp - 1), v };
		}
		p = nl + 1;
	}
	return 0;
}

static void counts_free(struct counts *cs)
{
	free(cs->text);
	free(cs->f);
}

/* Opens (or makes, with mode) the counts file path, locked LOCK_EX and
 * still the file of that name. Returns the descriptor, or -1 with a reason
 * in err. */
static int open_locked(const char *path, int mode, char *err, size_t errlen)
{
	struct timespec pause = { 0, 2000000 };
	int waited_ms = 0;

	for (;;) {
		int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NOCTTY, mode);
		struct stat a, b;

		if (fd < 0) {
			snprintf(err, errlen, "counts file \"%.200s\": %s", path, strerror(errno));
			return -1;
		}
		if (flock(fd, LOCK_EX | LOCK_NB) == 0) {
			if (fstat(fd, &a) == 0 && stat(path, &b) == 0 && a.st_ino == b.st_ino &&
			    a.st_dev == b.st_dev) {
				if (S_ISREG(a.st_mode) && a.st_nlink == 1)
					return fd;
				snprintf(err, errlen, "counts file \"%.200s\" refused: not a regular "
					 "file of one link", path);
				close(fd);
				return -1;
			}
			close(fd); /* renamed over while we waited: the new one */
			continue;
		}
		close(fd);
		if (errno != EWOULDBLOCK || waited_ms >= LOCAL_COUNT_WAIT_MS) {
			snprintf(err, errlen, "counts file \"%.200s\": %s", path,
				 errno == EWOULDBLOCK ? "locked by another shipment for 50 ms" :
				 strerror(errno));
			return -1;
		}
		nanosleep(&pause, NULL);
		waited_ms += 2;
	}
}

/* Writes the key line of ekey (the key encoded), cs's fields and the n
 * new ones (enc[i], elen[i], with value add[i]; those already in cs were
 * added to it) to path's "<path>.new", made with mode, and renames it over
 * path. Returns 0, or -1 with err. */
static int counts_replace(const char *path, int mode, const char *ekey,
			  const struct counts *cs, int n, char *const *enc, const size_t *elen,
			  const long long *add, char *err, size_t errlen)
{
	char tmp[PATH_MAX + 8];
	FILE *f;
	int fd, bad;

	snprintf(tmp, sizeof(tmp), "%s.new", path);
	unlink(tmp); /* a dead shipper's: the flock is ours now */
	fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW | O_NOCTTY, mode);
	if (fd < 0 || fchmod(fd, (mode_t)mode) != 0 || !(f = fdopen(fd, "w"))) {
		snprintf(err, errlen, "counts file \"%.200s\": %s", tmp, strerror(errno));
		if (fd >= 0)
			close(fd);
		unlink(tmp);
		return -1;
	}
	fprintf(f, "%s%s\n", LOCAL_COUNT_KEY, ekey);
	for (size_t i = 0; i < cs->n; i++)
		fprintf(f, "%lld %.*s\n", cs->f[i].value, (int)cs->f[i].len, cs->f[i].enc);
	for (int i = 0; i < n; i++)
		if (enc[i])
			fprintf(f, "%lld %.*s\n", add[i], (int)elen[i], enc[i]);
	bad = ferror(f);
	if (fclose(f) != 0 || bad || rename(tmp, path) != 0) {
		snprintf(err, errlen, "counts file \"%.200s\": %s", path, strerror(errno));
		unlink(tmp);
		return -1;
	}
	return 0;
}

int local_count_add(const char *dir, int mode, const char *key, size_t klen, int n,
		    const char *const *fields, const size_t *flens, const long long *deltas,
		    char *err, size_t errlen)
{
	char path[PATH_MAX];
	char **enc = calloc((size_t)n, sizeof(*enc));
	size_t *elen = calloc((size_t)n, sizeof(*elen));
	char *ekey = malloc(3 * klen + 1);
	struct counts cs;
	int fd = -1, rc = -1;

	if (count_path(path, sizeof(path) - 8, dir, key, klen) != 0) {
		snprintf(err, errlen, "counts file name too long");
		goto out;
	}
	if (!enc || !elen || !ekey) {
		snprintf(err, errlen, "out of memory");
		goto out;
	}
	field_encode(key, klen, ekey);
	for (int i = 0; i < n; i++) {
		if (!(enc[i] = malloc(3 * flens[i] + 1))) {
			snprintf(err, errlen, "out of memory");
			goto out;
		}
		elen[i] = field_encode(fields[i], flens[i], enc[i]);
	}
	if ((fd = open_locked(path, mode, err, errlen)) < 0)
		goto out;
	if (counts_read(fd, &cs) != 0) {
		snprintf(err, errlen, "counts file \"%.200s\": %s", path, strerror(errno));
		counts_free(&cs);
		goto out;
	}
	for (size_t j = 0; j < cs.n; j++)
		for (int i = 0; i < n; i++)
			if (enc[i] && cs.f[j].len == elen[i] &&
			    !memcmp(cs.f[j].enc, enc[i], elen[i])) {
				cs.f[j].value += deltas[i];
				free(enc[i]);
				enc[i] = NULL;
			}
	rc = counts_replace(path, mode, ekey, &cs, n, enc, elen, deltas, err, errlen);
	counts_free(&cs);
out:
	if (fd >= 0)
		close(fd); /* after the rename: the next shipper finds the new file */
	for (int i = 0; enc && i < n; i++)
		free(enc[i]);
	free(enc);
	free(elen);
	free(ekey);
	return rc;
}

/* Returns the key of the counts file named name (its keyname: n bytes) read
 * into cs, with its length in *klen: the key line's (decoded in place)
 * when it encodes to that name, else the name decoded into named
 * (KEYNAME_SIZE bytes; a shortened name's key stays shortened). */
static const char *counts_key(struct counts *cs, const char *name, size_t n, char *named,
			      size_t *klen)
{
	if (cs->key) {
		char again[KEYNAME_SIZE];

		*klen = keyname_decode(cs->key, cs->klen, cs->key);
		if (keyname_encode(cs->key, *klen, again) == n && !memcmp(again, name, n))
			return cs->key;
	}
	*klen = keyname_decode(name, n, named);
	return named;
}

/* Whether key[0..klen) is one of namespace ns's (nsl bytes): "<ns>:...". */
static int in_ns(const char *key, size_t klen, const char *ns, size_t nsl)
{
	return klen > nsl && !memcmp(key, ns, nsl) && key[nsl] == ':';
}

int local_count_read(const char *dir, const char *ns,
		     void (*fn)(void *arg, const char *key, size_t klen, const char *field,
				size_t flen, long long value),
		     void *arg, char *err, size_t errlen)
{
	size_t nsl = strlen(ns);
	DIR *d = opendir(dir);
	struct dirent *e;

	if (!d) {
		snprintf(err, errlen, "\"%s\": %s", dir, strerror(errno));
		return -1;
	}
	while ((e = readdir(d)) != NULL) {
		size_t n = count_name(e->d_name, strlen(e->d_name)), klen;
		char named[KEYNAME_SIZE];
		const char *key;
		struct counts cs;
		int fd;

		if (!n)
			continue;
		/* a name keyname.h did not shorten (no "~") is its key: the files
		 * of other namespaces are not read */
		if (!memchr(e->d_name, '~', n) &&
		    !in_ns(named, keyname_decode(e->d_name, n, named), ns, nsl))
			continue;
		fd = openat(dirfd(d), e->d_name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK |
			    O_NOCTTY);
		if (fd < 0)
			continue;
		key = counts_read(fd, &cs) == 0 ? counts_key(&cs, e->d_name, n, named, &klen) : NULL;
		if (key && in_ns(key, klen, ns, nsl))
			for (size_t i = 0; i < cs.n; i++) {
				/* decoding shortens in place: %XX to one byte */
				size_t fl = keyname_decode(cs.f[i].enc, cs.f[i].len,
							   (char *)cs.f[i].enc);

				fn(arg, key, klen, cs.f[i].enc, fl, cs.f[i].value);
			}
		counts_free(&cs);
		close(fd);
	}
	closedir(d);
	return 0;
}
