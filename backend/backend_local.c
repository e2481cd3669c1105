/* SPDX-License-Identifier: MIT */
/*
 * backend_local.c - the local backend: one lock file per key under
 * local.dir, OFD byte-range locks (F_OFD_SETLK) on it, no server, no
 * thread, no lease: the kernel frees a dead holder's locks. Byte 0 is the
 * lock (F_WRLCK exclusive; F_RDLCK for each holder of a set: shared, or a
 * permit of a limit, each also on a slot byte of its own with its record;
 * the layout is at LOCAL_SLOTS). Holds are registered by token in a
 * process-wide table (a fork child closes its copies). A connection (one
 * per thread) is an inotify descriptor and one open, unlocked file: the key
 * being waited for (kept across tries: its close would wake the others) or
 * the last released (the next call opens nothing). A waiter watches the
 * file, read-locks the watch byte, then tries, then poll()s; a release
 * (F_UNLCK, then futimens when the watch byte is held, or close) or a
 * holder's death wakes it after the unlock (LOCAL_WATCH). fair: each
 * waiter holds a ticket byte, and only the earliest tries (LOCAL_TICKETS).
 */
#include "backend.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "backend_local_conf.h"
#include "backend_local_count.h"
#include "log.h"
#include "keyname.h"

#define LOCAL_NAME_MAX KEYNAME_MAX /* a file's name: keyname.h, then the suffix */
#define LOCAL_SUFFIX ".lock"
#define LOCAL_TOKEN 32       /* a lock value's token: its first bytes (owner.h) */
#define LOCAL_RECORD_MAX (24 + BACKEND_VAL_MAX)
#define LOCAL_POLL_MS 20     /* a waiter that cannot watch (inotify refused) tries this often */
/*
 * The bytes of a lock file. 0: the lock. 1..LOCAL_SLOTS: a set holder's slot
 * (F_WRLCK, the first free one of 1..limit; shared: of all), its record
 * "<fence>\n<value>\n" at slot * LOCAL_SLOT_SIZE. LOCAL_INTENT: F_WRLCK by
 * an exclusive waiter that found shared holders; every shared caller passes
 * it (F_RDLCK, briefly) first, so new ones queue behind that waiter.
 * LOCAL_FENCE: F_WRLCK for the microseconds in which a set holder checks
 * the set's header (at 0, "<fence>\n=s\n" or "<fence>\n=x <limit>\n": an
 * exclusive holder's record has its value there), takes its slot and
 * writes the next fence: a caller of another limit gets BACKEND_MISMATCH.
 */
#define LOCAL_SLOTS 10000    /* slot bytes 1..: a set holder's (at most limit's 10000) */
#define LOCAL_INTENT (LOCAL_SLOTS + 1) /* taken by an exclusive waiter behind shared holders */
#define LOCAL_FENCE (LOCAL_SLOTS + 2)  /* held while a set holder updates fence and header */
#define LOCAL_SLOT_SIZE 1024 /* slot i's record is at offset i * this */
#define LOCAL_FENCE_TRIES 600 /* fence_lock's tries: about 50 ms */
/*
 * fair = true: a waiter's ticket is the byte LOCAL_TICKETS + its arrival
 * (CLOCK_MONOTONIC ns; the next free byte on a tie), locked on its pending
 * descriptor while it waits (F_RDLCK for a shared caller, else F_WRLCK);
 * it tries the lock only when no earlier ticket conflicts with its own (a
 * reader passes readers), and a caller not waiting yet queues while any
 * does. The kernel frees a dead waiter's ticket with it.
 */
#define LOCAL_TICKETS ((off_t)1 << 32)
/*
 * A waiter read-locks LOCAL_WATCH on its pending descriptor once it
 * watches (inotify), before each waiting try, until it is woken, enters or
 * leaves; a release wakes the watchers (futimens) only when F_OFD_GETLK
 * finds one: the uncontended call makes no wake-up, and releases made
 * while the woken waiters are still on their way to their next try wake
 * nobody again (as the kernel's own lock queue does). No wake is lost: the
 * lock operations of one file are ordered, so a waiter that locks the byte
 * after the releaser's test tries after its unlock. (A fork child that
 * keeps a waiter's descriptor keeps its byte: releases then wake for
 * nothing, a cost only.)
 */
#define LOCAL_WATCH (LOCAL_TICKETS - 1)

struct backend_config {
	const struct local_spec *spec;
	int mode; /* file_mode's */
};

struct backend_conn {
	const struct backend_config *bc;
	int ino;   /* inotify descriptor, made on the first wait; -1 */
	int wd;    /* its watch, on the file of key wkey (kept while the key is
		    * taken, held and released again); -1 */
	int pend;  /* an open file of key pkey: the one being taken or the last
		    * released; locked only inside acquire, until the hold is
		    * registered; -1 */
	int pid;   /* the process that opened it */
	int intent; /* pend holds LOCAL_INTENT (an exclusive waiter behind shared holders) */
	off_t ticket; /* pend holds this ticket byte (a fair waiter); 0: none */
	int watching; /* pend holds LOCAL_WATCH (a waiter that watches) */
	size_t pklen, wklen;
	char pkey[KEY_BUF_SIZE];
	char wkey[KEY_BUF_SIZE];
	char err[256];
};

/* A held lock: its token, descriptor and fence. */
struct local_hold {
	size_t tlen;
	char tok[LOCAL_TOKEN];
	int fd;
	long long fence;
};

/* Every held lock of the process (the table's memory grows, never shrinks). */
static struct {
	pthread_mutex_t mu;
	struct local_hold *v;
	size_t n, cap;
} holds = { .mu = PTHREAD_MUTEX_INITIALIZER };

/* The descriptors that hold LOCAL_INTENT or a ticket now (exclusive
 * waiters'; one entry for each), under holds.mu: a fork child closes its
 * copies, as it does the holds', so that a child that lives on does not
 * keep shared callers or fair waiters out. A waiter past LOCAL_INTENTS of
 * them takes no intent, and a fair one gets an error. */
#define LOCAL_INTENTS 256
static int intents[LOCAL_INTENTS];
static size_t nintents;

static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

/* ---- the table of holds ------------------------------------------------- */

/* Returns how many bytes of it's value name its hold: the token, or the
 * whole value when shorter (a probe's). */
static size_t token_len(const struct backend_item *it)
{
	return it->vlen < LOCAL_TOKEN ? it->vlen : LOCAL_TOKEN;
}

/* Returns the index of it's token in the table, or -1. Holds holds.mu. */
static long holds_index(const struct backend_item *it)
{
	size_t tlen = token_len(it);

	for (size_t i = holds.n; i-- > 0;)
		if (holds.v[i].tlen == tlen && memcmp(holds.v[i].tok, it->val, tlen) == 0)
			return (long)i;
	return -1;
}

/* Returns 1 when it's token is held (its fence in *fence), else 0. */
static int holds_find(const struct backend_item *it, long long *fence)
{
	long i;

	pthread_mutex_lock(&holds.mu);
	if ((i = holds_index(it)) >= 0)
		*fence = holds.v[i].fence;
	pthread_mutex_unlock(&holds.mu);
	return i >= 0;
}

/* Adds it's token with fd and fence. Returns 0, or -1 out of memory. */
static int holds_add(const struct backend_item *it, int fd, long long fence)
{
	int rc = 0;

	pthread_mutex_lock(&holds.mu);
	if (holds.n == holds.cap) {
		size_t cap = holds.cap ? 2 * holds.cap : 64;
		struct local_hold *v = realloc(holds.v, cap * sizeof(*v));

		if (v) {
			holds.v = v;
			holds.cap = cap;
		}
	}
	if (holds.n < holds.cap) {
		struct local_hold *h = &holds.v[holds.n++];

		h->tlen = token_len(it);
		memcpy(h->tok, it->val, h->tlen);
		h->fd = fd;
		h->fence = fence;
	} else {
		rc = -1;
	}
	pthread_mutex_unlock(&holds.mu);
	return rc;
}

/* Removes it's token. Returns its descriptor, or -1 when not held. */
static int holds_take(const struct backend_item *it)
{
	int fd = -1;
	long i;

	pthread_mutex_lock(&holds.mu);
	if ((i = holds_index(it)) >= 0) {
		fd = holds.v[i].fd;
		holds.v[i] = holds.v[--holds.n];
	}
	pthread_mutex_unlock(&holds.mu);
	return fd;
}

/* fork: the table does not change while the child is made. */
static void local_atfork_prepare(void)
{
	pthread_mutex_lock(&holds.mu);
}

static void local_atfork_parent(void)
{
	pthread_mutex_unlock(&holds.mu);
}

/* The child's copies of the parent's lock descriptors: closed (the parent's
 * locks stay the parent's; closing a copy does not release them). */
static void local_atfork_child(void)
{
	for (size_t i = 0; i < holds.n; i++)
		close(holds.v[i].fd);
	holds.n = 0;
	for (size_t i = 0; i < nintents; i++)
		close(intents[i]);
	nintents = 0;
	pthread_mutex_init(&holds.mu, NULL);
}

static void atfork_register(void)
{
	pthread_atfork(local_atfork_prepare, local_atfork_parent, local_atfork_child);
}

/* ---- files -------------------------------------------------------------- */

/*
 * Writes the path of key's lock file into buf (PATH_MAX): dir, "/", the
 * key's name (keyname.h: [A-Za-z0-9_-] kept, other bytes %XX, so no "/",
 * no leading ".", no ".."; past KEYNAME_MAX bytes shortened with the
 * SHA-1 of the whole key), then ".lock".
 */
static void lock_path(const struct backend_config *bc, const char *key, size_t klen, char *buf)
{
	size_t n = (size_t)snprintf(buf, PATH_MAX, "%s/", bc->spec->dir);

	n += keyname_encode(key, klen, buf + n);
	memcpy(buf + n, LOCAL_SUFFIX, sizeof(LOCAL_SUFFIX));
}

/* Sets c's error to "<what>: <errno text>". Returns BACKEND_ERR. */
static int fail(struct backend_conn *c, const char *what)
{
	snprintf(c->err, sizeof(c->err), "%s: %s", what, strerror(errno));
	return BACKEND_ERR;
}

/* Reads the pending events of c's inotify descriptor (none is kept; a
 * full buffer is read again). */
static void drain(struct backend_conn *c)
{
	char buf[4096] __attribute__((aligned(__alignof__(struct inotify_event))));

	while (c->ino >= 0 && read(c->ino, buf, sizeof(buf)) == (ssize_t)sizeof(buf))
		;
}

/* Removes c's watch, if any, and the events it left (its IN_IGNORED). In
 * a fork child the inotify instance is the parent's too: left alone. */
static void unwatch(struct backend_conn *c)
{
	if (c->wd >= 0 && c->pid == getpid()) {
		inotify_rm_watch(c->ino, c->wd);
		drain(c);
	}
	c->wd = -1;
}

/* Sets (cmd F_OFD_SETLK or F_OFD_SETLKW, type F_RDLCK or F_WRLCK) or
 * clears (F_UNLCK) fd's lock on bytes start..start+len-1 (len 0: to the
 * end). Returns 0, or -1 with errno set (EAGAIN: another holds it). */
static int byte_lock(int fd, int cmd, short type, off_t start, off_t len)
{
	struct flock fl = { .l_type = type, .l_whence = SEEK_SET, .l_start = start, .l_len = len };

	return fcntl(fd, cmd, &fl);
}

/* A waiter that watches read-locks LOCAL_WATCH on c's pending descriptor,
 * once per wait, before its first try. Returns BACKEND_OK or BACKEND_ERR. */
static int watch_byte(struct backend_conn *c)
{
	if (c->watching)
		return BACKEND_OK;
	if (byte_lock(c->pend, F_OFD_SETLK, F_RDLCK, LOCAL_WATCH, 1) != 0)
		return fail(c, "fcntl F_OFD_SETLK of the watch byte");
	c->watching = 1;
	return BACKEND_OK;
}

/* c's pending descriptor no longer shows a watching waiter: unlocked when
 * unlock (it stays open), else left to the unlock or close that follows. */
static void watch_byte_drop(struct backend_conn *c, int unlock)
{
	if (c->watching && unlock)
		byte_lock(c->pend, F_OFD_SETLK, F_UNLCK, LOCAL_WATCH, 1);
	c->watching = 0;
}

/* Takes LOCAL_INTENT on c's pending descriptor, registered in intents.
 * Returns 1 when taken, else 0 (another waiter has it, or the list is full). */
static int intent_take(struct backend_conn *c)
{
	struct flock fl = { .l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = LOCAL_INTENT,
			    .l_len = 1 };
	int taken = 0;

	pthread_mutex_lock(&holds.mu);
	if (nintents < LOCAL_INTENTS && fcntl(c->pend, F_OFD_SETLK, &fl) == 0) {
		intents[nintents++] = c->pend;
		taken = 1;
	}
	pthread_mutex_unlock(&holds.mu);
	return taken;
}

/* Removes one entry of fd from intents. */
static void intents_drop(int fd)
{
	pthread_mutex_lock(&holds.mu);
	for (size_t i = 0; i < nintents; i++)
		if (intents[i] == fd) {
			intents[i] = intents[--nintents];
			break;
		}
	pthread_mutex_unlock(&holds.mu);
}

/* c's pending descriptor no longer holds the intent (unlocked, closed, or
 * now a hold's): removed from intents. */
static void intent_forget(struct backend_conn *c)
{
	if (!c->intent)
		return;
	intents_drop(c->pend);
	c->intent = 0;
}

/* Takes a fair waiter's ticket of type (F_RDLCK: shared, F_WRLCK) on c's
 * pending descriptor, registered in intents. Returns BACKEND_OK, or
 * BACKEND_ERR (c->err says why). */
static int ticket_take(struct backend_conn *c, short type)
{
	struct flock fl = { .l_type = type, .l_whence = SEEK_SET, .l_len = 1 };
	struct timespec ts;
	int rc = BACKEND_ERR;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	fl.l_start = LOCAL_TICKETS + (off_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
	pthread_mutex_lock(&holds.mu);
	if (nintents == LOCAL_INTENTS) {
		snprintf(c->err, sizeof(c->err), "more than %d waiters of this process hold an "
			 "intent or a ticket", LOCAL_INTENTS);
	} else {
		int r;

		while ((r = fcntl(c->pend, F_OFD_SETLK, &fl)) != 0 &&
		       (errno == EAGAIN || errno == EACCES))
			fl.l_start++; /* another waiter's, of the same nanosecond */
		if (r == 0) {
			intents[nintents++] = c->pend;
			c->ticket = fl.l_start;
			rc = BACKEND_OK;
		} else {
			fail(c, "fcntl F_OFD_SETLK of a ticket");
		}
	}
	pthread_mutex_unlock(&holds.mu);
	return rc;
}

/* c's ticket, on fd (its pending descriptor, or the hold it became), is
 * given up: unlocked, removed from intents. */
static void ticket_forget(struct backend_conn *c, int fd)
{
	struct flock fl = { .l_type = F_UNLCK, .l_whence = SEEK_SET, .l_start = c->ticket,
			    .l_len = 1 };

	if (!c->ticket)
		return;
	fcntl(fd, F_OFD_SETLK, &fl);
	intents_drop(fd);
	c->ticket = 0;
}

/* Closes c's pending descriptor and its watch. */
static void pend_drop(struct backend_conn *c)
{
	unwatch(c);
	intent_forget(c);
	if (c->ticket) { /* freed by the close */
		intents_drop(c->pend);
		c->ticket = 0;
	}
	if (c->pend >= 0)
		close(c->pend);
	c->pend = -1;
	c->pklen = 0;
	watch_byte_drop(c, 0); /* freed by the close */
}

/* Opens the lock file path (or, when missing, creates it with the mode
 * file_mode says: fchmod, so the umask does not narrow it). Returns the
 * descriptor, or -1 with errno set. */
static int file_open(const struct backend_config *bc, const char *path)
{
	const int flags = O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NOCTTY | O_NONBLOCK;

	for (int tries = 0; tries < 3; tries++) {
		int fd = open(path, flags);

		if (fd >= 0 || errno != ENOENT)
			return fd;
		fd = open(path, flags | O_CREAT | O_EXCL, bc->mode);
		if (fd >= 0) {
			if (fchmod(fd, (mode_t)bc->mode) != 0) {
				int e = errno;

				close(fd);
				errno = e;
				return -1;
			}
			return fd;
		}
		if (errno != EEXIST)
			return -1;
	}
	errno = EAGAIN;
	return -1;
}

/* Refuses the opened lock file fd at path unless it is a regular file of
 * one link (a FIFO, a device or a hard link planted in a shared dir would
 * make the lock write elsewhere). Returns BACKEND_OK or BACKEND_ERR. */
static int file_safe(struct backend_conn *c, int fd, const char *path)
{
	struct stat st;

	if (fstat(fd, &st) != 0)
		return fail(c, "fstat of the lock file");
	if (S_ISREG(st.st_mode) && st.st_nlink == 1)
		return BACKEND_OK;
	if (!S_ISREG(st.st_mode))
		snprintf(c->err, sizeof(c->err), "lock file \"%.180s\" refused: not a regular "
			 "file", path);
	else
		snprintf(c->err, sizeof(c->err), "lock file \"%.180s\" refused: it has %lu hard "
			 "links (another name of it was made)", path, (unsigned long)st.st_nlink);
	return BACKEND_ERR;
}

/* Makes c->pend the open file of it's key. Returns BACKEND_OK or BACKEND_ERR. */
static int pend_open(struct backend_conn *c, const struct backend_item *it)
{
	char path[PATH_MAX];

	if (c->pend >= 0 && c->pklen == it->klen && memcmp(c->pkey, it->key, it->klen) == 0)
		return BACKEND_OK;
	pend_drop(c);
	if (it->klen > sizeof(c->pkey)) {
		snprintf(c->err, sizeof(c->err), "key too long");
		return BACKEND_ERR;
	}
	lock_path(c->bc, it->key, it->klen, path);
	c->pend = file_open(c->bc, path);
	if (c->pend < 0)
		return fail(c, "open of the lock file");
	if (file_safe(c, c->pend, path) != BACKEND_OK) {
		close(c->pend);
		c->pend = -1;
		return BACKEND_ERR;
	}
	memcpy(c->pkey, it->key, it->klen);
	c->pklen = it->klen;
	return BACKEND_OK;
}

/* Watches the file of it's key (a waiter, before it tries the lock): the
 * watch c has when it is that file's, else a new one. Returns BACKEND_OK
 * or BACKEND_ERR. */
static int watch(struct backend_conn *c, const struct backend_item *it)
{
	char path[PATH_MAX];

	if (c->wd >= 0 && c->wklen == it->klen && memcmp(c->wkey, it->key, it->klen) == 0)
		return BACKEND_OK;
	unwatch(c);
	if (c->ino < 0 && (c->ino = inotify_init1(IN_CLOEXEC | IN_NONBLOCK)) < 0)
		return fail(c, "inotify_init1");
	lock_path(c->bc, it->key, it->klen, path);
	c->wd = inotify_add_watch(c->ino, path, IN_CLOSE_WRITE | IN_ATTRIB);
	if (c->wd < 0)
		return fail(c, "inotify_add_watch");
	memcpy(c->wkey, it->key, it->klen); /* pend_open checked the length */
	c->wklen = it->klen;
	return BACKEND_OK;
}

/* After watch failed (c->err says why: inotify's limits, most likely):
 * says once per process that waiters poll instead. */
static void unwatched(struct backend_conn *c)
{
	static int said;

	if (!__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED))
		LOG(LOG_WARN, "local: a waiter cannot watch its lock file (%s): waiters without a "
		    "watch try every %d ms instead (see fs.inotify.max_user_instances and "
		    "max_user_watches)", c->err, LOCAL_POLL_MS);
}

/* Reads fd's record at offset at into rec (NUL-terminated). Returns its
 * length (as read: up to the buffer's size), or -1. */
static ssize_t record_read_at(int fd, char *rec, size_t cap, off_t at)
{
	ssize_t n = pread(fd, rec, cap - 1, at);

	rec[n > 0 ? n : 0] = 0;
	return n;
}

/* Reads fd's owner record (at 0) into rec, as record_read_at. */
static ssize_t record_read(int fd, char *rec, size_t cap)
{
	ssize_t n = pread(fd, rec, cap - 1, 0);

	rec[n > 0 ? n : 0] = 0;
	return n;
}

/* Returns the fence of a record ("<fence>\n..."); 0 when missing or garbled. */
static long long record_fence(const char *rec)
{
	long long f = 0;
	const char *p = rec;

	for (; *p >= '0' && *p <= '9' && f < LLONG_MAX / 10 - 10; p++)
		f = f * 10 + (*p - '0');
	return *p == '\n' && p > rec ? f : 0;
}

/* Copies the lock value of a record into holder (BACKEND_VAL_MAX bytes);
 * sets *hlen (0 when there is none). */
static void record_holder(const char *rec, char *holder, size_t *hlen)
{
	const char *v = strchr(rec, '\n'), *end;

	*hlen = 0;
	if (!v || !(end = strchr(++v, '\n')) || (size_t)(end - v) > BACKEND_VAL_MAX)
		return;
	*hlen = (size_t)(end - v);
	memcpy(holder, v, *hlen);
}

/* Returns 1 when another open file description holds a lock on one of the
 * bytes from..to (the lowest such byte in *at; at NULL: any, one call), 0
 * when none, -1 on error. */
static int byte_held(int fd, off_t from, off_t to, off_t *at)
{
	int found = 0;

	while (from <= to && !(found && !at)) { /* F_OFD_GETLK names any conflicting lock: descend */
		struct flock fl = { .l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = from,
				    .l_len = to - from + 1 };

		if (fcntl(fd, F_OFD_GETLK, &fl) != 0)
			return -1;
		if (fl.l_type == F_UNLCK)
			break;
		found = 1;
		if (at) {
			*at = fl.l_start > from ? fl.l_start : from;
			to = *at - 1;
		}
	}
	return found;
}

/* Returns the limit that record rec's header names when it is a holder
 * set's ("=s": shared, 1 with *shared 1; "=x <limit>": permits), else 0
 * (an exclusive holder's value, or nothing). */
static int record_set(const char *rec, int *shared)
{
	const char *v = strchr(rec, '\n');
	long limit;
	char *end;

	*shared = 0;
	if (!v || v[1] != '=')
		return 0;
	if (v[2] == 's' && v[3] == '\n') {
		*shared = 1;
		return 1;
	}
	if (v[2] != 'x' || v[3] != ' ')
		return 0;
	limit = strtol(v + 4, &end, 10);
	return *end == '\n' && limit > 1 && limit <= LOCAL_SLOTS ? (int)limit : 0;
}

/* The slots a set of limit (shared: 1) may use. */
static int set_slots(int limit, int shared)
{
	return shared ? LOCAL_SLOTS : limit;
}

/* Into holder: the value of the lowest held slot of fd's set of up to
 * slots slots (length 0 when none or unreadable). Returns 1 when a slot is
 * held, else 0. */
static int set_holder(int fd, int slots, char *holder, size_t *hlen)
{
	char rec[LOCAL_RECORD_MAX];
	off_t at;

	*hlen = 0;
	if (byte_held(fd, 1, slots, &at) != 1)
		return 0;
	if (record_read_at(fd, rec, sizeof(rec), at * LOCAL_SLOT_SIZE) > 0)
		record_holder(rec, holder, hlen);
	return 1;
}

/* Into holder: the holder that record rec (at 0 of fd) names: its value,
 * or, a set's header, a held slot's value. Returns the set's limit when
 * one of its slots is held, else 0. */
static int any_holder(int fd, const char *rec, char *holder, size_t *hlen, int *shared)
{
	int theirs = record_set(rec, shared);

	if (!theirs) {
		record_holder(rec, holder, hlen);
		return 0;
	}
	return set_holder(fd, set_slots(theirs, *shared), holder, hlen) ? theirs : 0;
}

/* Writes the record "<fence>\n<val>\n" into rec (LOCAL_RECORD_MAX bytes;
 * val cut at BACKEND_VAL_MAX) without printf (2-4 % of the uncontended
 * call, spent inside the lock). Returns its length. */
static int record_format(char *rec, long long fence, const char *val, size_t vlen)
{
	char digits[24], *d = digits + sizeof(digits);
	unsigned long long f = fence < 0 ? 0 : (unsigned long long)fence;
	size_t n;

	do
		*--d = (char)('0' + f % 10);
	while ((f /= 10) != 0);
	n = (size_t)(digits + sizeof(digits) - d);
	memcpy(rec, d, n);
	rec[n++] = '\n';
	vlen = vlen < BACKEND_VAL_MAX ? vlen : BACKEND_VAL_MAX;
	memcpy(rec + n, val, vlen);
	n += vlen;
	rec[n++] = '\n';
	return (int)n;
}

/*
 * After the lock on fd was taken for it: writes the owner record with the
 * next fence (into *fence). Returns BACKEND_OK or BACKEND_ERR.
 */
static int record_write(struct backend_conn *c, int fd, const struct backend_item *it,
			long long *fence)
{
	char rec[LOCAL_RECORD_MAX];
	ssize_t old = record_read(fd, rec, sizeof(rec));
	int n;

	*fence = record_fence(rec) + 1;
	n = record_format(rec, *fence, it->val, it->vlen);
	if (pwrite(fd, rec, (size_t)n, 0) != n)
		return fail(c, "write of the owner record");
	if ((old < 0 || old > n) && ftruncate(fd, n) != 0)
		return fail(c, "truncate of the owner record");
	return BACKEND_OK;
}

/* ---- operations --------------------------------------------------------- */

static int local_serves(const void *settings)
{
	(void)settings;
	return 1;
}

static struct backend_config *local_config_new(const void *settings, char *err, size_t errlen)
{
	const struct local_spec *ls = settings;
	struct backend_config *bc;

	if (local_dir_check(ls->dir, 1, err, errlen))
		return NULL;
	if (!(bc = backend_calloc(sizeof(*bc), err, errlen)))
		return NULL;
	bc->spec = ls;
	if ((bc->mode = local_file_mode(ls->file_mode, err, errlen)) < 0) {
		free(bc);
		return NULL;
	}
	pthread_once(&atfork_once, atfork_register);
	return bc;
}

static void local_config_free(struct backend_config *bc)
{
	free(bc);
}

static struct backend_conn *local_open(const struct backend_config *bc, char *err,
				       size_t errlen)
{
	struct backend_conn *c = backend_calloc(sizeof(*c), err, errlen);

	if (!c)
		return NULL;
	c->bc = bc;
	c->ino = c->wd = c->pend = -1;
	c->pid = getpid();
	return c;
}

static void local_close(struct backend_conn *c)
{
	pend_drop(c);
	if (c->ino >= 0)
		close(c->ino);
	free(c);
}

/* The key's holders took it with limit theirs, it with another: says both
 * in c's error. Returns BACKEND_MISMATCH. */
static int mismatch(struct backend_conn *c, const struct backend_item *it, int theirs)
{
	snprintf(c->err, sizeof(c->err), "limit %d here, %d for the key's holders",
		 it->limit > 1 ? it->limit : 1, theirs);
	return BACKEND_MISMATCH;
}

/* it's try found the lock busy: *wait_ms says wait (not waiting yet:
 * BACKEND_NOT_QUEUED). Returns BACKEND_NO. */
static int busy(const struct backend_conn *c, const struct backend_item *it, long long *wait_ms)
{
	if (!it->waiting)
		*wait_ms = BACKEND_NOT_QUEUED;
	else
		*wait_ms = c->wd >= 0 ? LLONG_MAX / 4 : LOCAL_POLL_MS;
	return BACKEND_NO;
}

/* Moves c's pending descriptor, now locked for it, into the table of holds
 * with fence. Returns BACKEND_OK, or BACKEND_ERR (the lock freed). */
static int hold(struct backend_conn *c, const struct backend_item *it, long long fence)
{
	intent_forget(c); /* the intent stays locked until the release: a hold's now */
	/* a set's other holders release meanwhile; an exclusive hold's byte
	 * goes with its release's unlock */
	watch_byte_drop(c, backend_item_set(it));
	if (holds_add(it, c->pend, fence) != 0) {
		snprintf(c->err, sizeof(c->err), "out of memory for the table of holds");
		pend_drop(c);
		return BACKEND_ERR;
	}
	c->pend = -1;
	c->pklen = 0;
	return BACKEND_OK;
}

/*
 * Exclusive, limit 1: F_WRLCK on byte 0 of the pending descriptor. Taken:
 * the owner record written, the hold registered. Refused: the holder from
 * the record (or, holders of a set, one of their slots'); permits of
 * another limit: BACKEND_MISMATCH; shared holders make a waiter take
 * LOCAL_INTENT, so that no new shared caller passes it.
 */
static int excl_acquire(struct backend_conn *c, const struct backend_item *it,
			long long *wait_ms, char *holder, size_t *holder_len, long long *fence)
{
	char rec[LOCAL_RECORD_MAX];
	int theirs, shared;

	if (byte_lock(c->pend, F_OFD_SETLK, F_WRLCK, 0, 1) == 0) {
		/* the descriptor stays c's until registered: a cancellation in
		 * between (pwrite is a cancellation point) closes it with c,
		 * freeing the lock; the watch stays for the key's next wait (its
		 * events meanwhile cost that wait one early try at most) */
		if (record_write(c, c->pend, it, fence) != BACKEND_OK) {
			pend_drop(c); /* frees the lock */
			return BACKEND_ERR;
		}
		return hold(c, it, *fence);
	}
	if (errno != EAGAIN && errno != EACCES)
		return fail(c, "fcntl F_OFD_SETLK");
	record_read(c->pend, rec, sizeof(rec));
	/* a set's header is current only while one of its slots is held */
	theirs = any_holder(c->pend, rec, holder, holder_len, &shared);
	if (theirs && !shared)
		return mismatch(c, it, theirs);
	if (theirs && it->waiting && !c->intent)
		c->intent = intent_take(c);
	return busy(c, it, wait_ms);
}

/* Frees the locks of the pending descriptor (its byte 0, slot, intent),
 * but not its watch byte or ticket: a waiter keeps its watch and place. */
static void pend_unlock(struct backend_conn *c)
{
	intent_forget(c);
	byte_lock(c->pend, F_OFD_SETLK, F_UNLCK, 0, LOCAL_WATCH);
}

/* Takes LOCAL_FENCE on fd, which others hold for microseconds: tries
 * again (yielding, then sleeping 100 us) for about 50 ms, never blocking
 * in the kernel (a holder stopped inside its update must not hold a caller
 * past wait_ms: the error is retried by lock.c until then). Returns 0, or
 * -1 with errno set (EAGAIN: still held). */
static int fence_lock(int fd)
{
	for (int i = 0; i < LOCAL_FENCE_TRIES; i++) {
		struct timespec ts = { 0, 100000 };

		if (byte_lock(fd, F_OFD_SETLK, F_WRLCK, LOCAL_FENCE, 1) == 0)
			return 0;
		if (errno != EAGAIN && errno != EACCES)
			return -1;
		if (i < 100)
			sched_yield();
		else
			nanosleep(&ts, NULL);
	}
	errno = EAGAIN;
	return -1;
}

/*
 * Under LOCAL_FENCE, with byte 0 read-locked: checks the set's header
 * against it (BACKEND_MISMATCH), takes the first free slot of its limit
 * (BACKEND_NO when none: holder is a slot's), writes the next fence and
 * header at 0 and its record in the slot (BACKEND_OK, *fence).
 */
static int set_enter(struct backend_conn *c, const struct backend_item *it, char *holder,
		     size_t *holder_len, long long *fence)
{
	int mine = it->limit > 1 ? it->limit : 1, slots = set_slots(mine, it->shared);
	int theirs, shared, n, slot = 0;
	char rec[LOCAL_RECORD_MAX];

	record_read(c->pend, rec, sizeof(rec));
	theirs = record_set(rec, &shared);
	n = byte_held(c->pend, 1, LOCAL_SLOTS, NULL);
	if (n < 0)
		return fail(c, "fcntl F_OFD_GETLK");
	if (n && theirs && (theirs != mine || shared != it->shared))
		return mismatch(c, it, theirs);
	for (int i = 1; i <= slots && !slot; i++) {
		if (byte_lock(c->pend, F_OFD_SETLK, F_WRLCK, i, 1) == 0)
			slot = i;
		else if (errno != EAGAIN && errno != EACCES)
			return fail(c, "fcntl F_OFD_SETLK");
	}
	if (!slot) {
		set_holder(c->pend, slots, holder, holder_len);
		return BACKEND_NO;
	}
	*fence = record_fence(rec) + 1;
	n = it->shared ? snprintf(rec, sizeof(rec), "%lld\n=s\n", *fence)
		       : snprintf(rec, sizeof(rec), "%lld\n=x %d\n", *fence, mine);
	if (pwrite(c->pend, rec, (size_t)n, 0) != n)
		return fail(c, "write of the set's header");
	n = snprintf(rec, sizeof(rec), "%lld\n%.*s\n", *fence, (int)it->vlen, it->val);
	if (pwrite(c->pend, rec, (size_t)n, (off_t)slot * LOCAL_SLOT_SIZE) != n)
		return fail(c, "write of the owner record");
	return BACKEND_OK;
}

/*
 * A holder set's entry (a shared holder, or a permit of a limit): a
 * shared caller passes LOCAL_INTENT first (an exclusive waiter holding it
 * makes it wait); F_RDLCK on byte 0 (an exclusive holder makes a shared
 * caller wait, and is a mismatch for a permit: limit 1); then set_enter
 * under LOCAL_FENCE. Returns as local_acquire.
 */
static int set_acquire(struct backend_conn *c, const struct backend_item *it,
		       long long *wait_ms, char *holder, size_t *holder_len, long long *fence)
{
	char rec[LOCAL_RECORD_MAX];
	int rc, shared;

	if ((it->shared && byte_lock(c->pend, F_OFD_SETLK, F_RDLCK, LOCAL_INTENT, 1) != 0) ||
	    byte_lock(c->pend, F_OFD_SETLK, F_RDLCK, 0, 1) != 0) {
		if (errno != EAGAIN && errno != EACCES)
			return fail(c, "fcntl F_OFD_SETLK");
		pend_unlock(c);
		record_read(c->pend, rec, sizeof(rec));
		any_holder(c->pend, rec, holder, holder_len, &shared);
		/* byte 0 refused to a permit: an exclusive holder (limit 1) */
		return it->shared ? busy(c, it, wait_ms) : mismatch(c, it, 1);
	}
	if ((it->shared && byte_lock(c->pend, F_OFD_SETLK, F_UNLCK, LOCAL_INTENT, 1) != 0) ||
	    fence_lock(c->pend) != 0) {
		rc = fail(c, "lock of the set's fence byte");
		pend_unlock(c);
		return rc;
	}
	rc = set_enter(c, it, holder, holder_len, fence);
	byte_lock(c->pend, F_OFD_SETLK, F_UNLCK, LOCAL_FENCE, 1);
	if (rc == BACKEND_OK)
		return hold(c, it, *fence);
	pend_unlock(c);
	return rc == BACKEND_NO ? busy(c, it, wait_ms) : rc;
}

/* Returns 1 when another open file description than fd's holds a ticket
 * before `before` (0: any ticket) that conflicts with type (F_RDLCK: only
 * write tickets do), 0 when none, -1 on error. */
static int tickets_ahead(int fd, off_t before, short type)
{
	struct flock fl = { .l_type = type, .l_whence = SEEK_SET, .l_start = LOCAL_TICKETS,
			    .l_len = before ? before - LOCAL_TICKETS : 0 };

	if (fcntl(fd, F_OFD_GETLK, &fl) != 0)
		return -1;
	return fl.l_type != F_UNLCK;
}

/*
 * A fair caller's turn: one not waiting yet queues while any ticket
 * conflicting with its kind is held; a waiter takes its ticket once and
 * tries the lock only when no earlier one conflicts (the waiters ahead of
 * it; a shared caller passes shared ones). Returns BACKEND_OK (try the
 * lock now), BACKEND_NO (busy: *wait_ms, holder as the record names it)
 * or BACKEND_ERR.
 */
static int fair_turn(struct backend_conn *c, const struct backend_item *it, long long *wait_ms,
		     char *holder, size_t *holder_len)
{
	short type = it->shared ? F_RDLCK : F_WRLCK;
	char rec[LOCAL_RECORD_MAX];
	int ahead, shared;

	if (it->waiting && !c->ticket && ticket_take(c, type) != BACKEND_OK)
		return BACKEND_ERR;
	ahead = tickets_ahead(c->pend, it->waiting ? c->ticket : 0, type);
	if (ahead < 0)
		return fail(c, "fcntl F_OFD_GETLK of the tickets");
	if (!ahead)
		return BACKEND_OK;
	record_read(c->pend, rec, sizeof(rec));
	any_holder(c->pend, rec, holder, holder_len, &shared);
	return busy(c, it, wait_ms);
}

/* After a fair waiter's entry on fd (the hold's descriptor now): its ticket
 * goes, and when it entered a holder set, where room may be left, the next
 * waiters are woken (futimens) to look, since an unlock wakes nobody. */
static void fair_entered(struct backend_conn *c, const struct backend_item *it, int fd)
{
	if (!c->ticket)
		return;
	ticket_forget(c, fd);
	if (backend_item_set(it))
		futimens(fd, NULL);
}

/*
 * Tries the lock of it's key on the pending descriptor (a waiter watches
 * the file first; a fair one waits for its turn, fair_turn); a waiter's
 * token held already counts as taken. Taken:
 * the descriptor becomes the hold's, the owner record is written, *fence
 * is its fence. Busy: *wait_ms says wait (or, not waiting yet,
 * BACKEND_NOT_QUEUED: call again waiting), holder is the record's value.
 * Holders of another limit: BACKEND_MISMATCH.
 */
static int local_acquire(struct backend_conn *c, const struct backend_item *it,
			 long long *wait_ms, char *holder, size_t *holder_len, long long *fence)
{
	int fd, rc;

	*fence = 0;
	*holder_len = 0;
	if (it->waiting && holds_find(it, fence)) { /* ours already (the plain try: never) */
		ticket_forget(c, c->pend);
		watch_byte_drop(c, 1);
		return BACKEND_OK;
	}
	if (pend_open(c, it) != BACKEND_OK)
		return BACKEND_ERR;
	if (it->waiting && watch(c, it) != BACKEND_OK)
		unwatched(c);
	else if (it->waiting && watch_byte(c) != BACKEND_OK)
		return BACKEND_ERR;
	if (it->fair && (rc = fair_turn(c, it, wait_ms, holder, holder_len)) != BACKEND_OK)
		return rc;
	fd = c->pend;
	if (backend_item_set(it))
		rc = set_acquire(c, it, wait_ms, holder, holder_len, fence);
	else
		rc = excl_acquire(c, it, wait_ms, holder, holder_len, fence);
	if (rc == BACKEND_OK)
		fair_entered(c, it, fd); /* fd is the hold's now */
	return rc;
}

/* Returns 1 when another open file description holds LOCAL_WATCH (a
 * waiter watches the file), or the test failed; else 0. */
static int watched(int fd)
{
	struct flock fl = { .l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = LOCAL_WATCH,
			    .l_len = 1 };

	return fcntl(fd, F_OFD_GETLK, &fl) != 0 || fl.l_type != F_UNLCK;
}

/*
 * Unlocks the held descriptor fd of it's key. Then, when c has no pending
 * descriptor, fd stays open as c's (the thread's next call of the key
 * opens nothing) and, when a waiter watches, futimens wakes the waiters
 * (IN_ATTRIB); else it is closed (IN_CLOSE_WRITE). Either event comes
 * after the unlock.
 */
static void unlock_fd(struct backend_conn *c, const struct backend_item *it, int fd)
{
	byte_lock(fd, F_OFD_SETLK, F_UNLCK, 0, 0); /* byte 0, a slot, an intent, a watch */
	if (c->pend >= 0 || it->klen > sizeof(c->pkey) ||
	    (watched(fd) && futimens(fd, NULL) != 0)) {
		close(fd);
		return;
	}
	c->pend = fd;
	memcpy(c->pkey, it->key, it->klen);
	c->pklen = it->klen;
}

static int local_release(struct backend_conn *c, const struct backend_item *it, int async)
{
	int fd = holds_take(it);

	(void)async;
	if (fd < 0)
		return BACKEND_NO;
	unlock_fd(c, it, fd);
	return BACKEND_OK;
}

/* Waits for an event on the watched file (a release, a holder's death) for
 * at most timeout_ms; a woken waiter gives up its watch byte until its next
 * try. */
static int local_wait(struct backend_conn *c, const struct backend_item *it,
		      long long timeout_ms, long long *fence)
{
	struct pollfd p = { .fd = c->ino, .events = POLLIN };
	int n;

	(void)it;
	*fence = 0;
	if (c->ino < 0 || c->wd < 0) { /* not watching (unwatched): try again soon */
		poll(NULL, 0, timeout_ms < LOCAL_POLL_MS ? (int)timeout_ms : LOCAL_POLL_MS);
		return BACKEND_OK;
	}
	n = poll(&p, 1, timeout_ms > INT_MAX ? INT_MAX : (int)timeout_ms);
	if (n < 0 && errno != EINTR)
		return fail(c, "poll");
	if (n == 0)
		return BACKEND_NO;
	watch_byte_drop(c, 1);
	drain(c);
	return BACKEND_OK;
}

/* Gives up it: released when it is held, else the pending file dropped. */
static int local_leave(struct backend_conn *c, const struct backend_item *it, int async)
{
	if (local_release(c, it, async) == BACKEND_OK)
		return BACKEND_OK;
	if (c->pklen == it->klen && memcmp(c->pkey, it->key, it->klen) == 0)
		pend_drop(c);
	return BACKEND_NO;
}

static int local_flush(struct backend_conn *c)
{
	(void)c;
	return BACKEND_OK;
}

static void local_unconfirmed(struct backend_conn *c,
			      void (*fn)(void *arg, const struct backend_item *it), void *arg)
{
	(void)c;
	(void)fn;
	(void)arg;
}

static const char *local_errstr(const struct backend_conn *c)
{
	return c->err;
}

/* The directory can still take new files. */
static int local_ping(struct backend_conn *c)
{
	const char *dir = c->bc->spec->dir;

	if (access(dir, W_OK | X_OK) != 0) {
		snprintf(c->err, sizeof(c->err), "\"%s\": %s", dir, strerror(errno));
		return BACKEND_ERR;
	}
	return BACKEND_OK;
}

static void local_describe(const struct backend_config *bc, char *buf, size_t len)
{
	snprintf(buf, len, "local lock files in %s", bc->spec->dir);
}

/* ---- holders, for `lockshim status` ------------------------------------ */

/* Reports each held slot of fd's set (limit, shared) as h to fn. */
static void set_holders(int fd, struct backend_holder *h, int limit, int shared,
			void (*fn)(void *arg, const struct backend_holder *h), void *arg)
{
	char rec[LOCAL_RECORD_MAX], *val = (char *)h->val;
	off_t at;

	h->limit = limit;
	h->shared = shared;
	h->in_set = 1;
	for (off_t from = 1; byte_held(fd, from, set_slots(limit, shared), &at) == 1;
	     from = at + 1) {
		record_read_at(fd, rec, sizeof(rec), at * LOCAL_SLOT_SIZE);
		record_holder(rec, val, &h->vlen);
		h->fence = record_fence(rec);
		if (h->vlen)
			fn(arg, h);
	}
}

/* Reports the holders of the lock file name of dirfd to fn. */
static void holder_of(int dirfd, const char *name,
		      void (*fn)(void *arg, const struct backend_holder *h), void *arg)
{
	struct flock fl = { .l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 1 };
	char rec[LOCAL_RECORD_MAX], key[LOCAL_NAME_MAX + 64], val[BACKEND_VAL_MAX];
	size_t n = strlen(name), sl = sizeof(LOCAL_SUFFIX) - 1;
	struct backend_holder h = { .key = key, .val = val, .limit = 1, .lease_left_ms = -1 };
	struct stat st;
	int fd, limit, shared;

	if (n <= sl || n - sl > LOCAL_NAME_MAX + 41 || strcmp(name + n - sl, LOCAL_SUFFIX))
		return;
	fd = openat(dirfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY);
	if (fd < 0)
		return;
	if (fcntl(fd, F_OFD_GETLK, &fl) == 0 && fl.l_type != F_UNLCK &&
	    fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
		record_read(fd, rec, sizeof(rec));
		h.klen = keyname_decode(name, n - sl, key);
		h.since_ms = (long long)st.st_mtim.tv_sec * 1000 + st.st_mtim.tv_nsec / 1000000;
		if ((limit = record_set(rec, &shared)) != 0) {
			set_holders(fd, &h, limit, shared, fn, arg);
		} else {
			record_holder(rec, val, &h.vlen);
			h.fence = record_fence(rec);
			fn(arg, &h);
		}
	}
	close(fd);
}

/* .holders: each lock file of the dir that a process holds now (opened
 * for reading and tested with F_OFD_GETLK, never locked): the exclusive
 * holder, or each holder of a set from its slot's record. */
static int local_holders(struct backend_conn *c,
			 void (*fn)(void *arg, const struct backend_holder *h), void *arg)
{
	DIR *d = opendir(c->bc->spec->dir);
	struct dirent *e;

	if (!d) {
		snprintf(c->err, sizeof(c->err), "\"%s\": %s", c->bc->spec->dir, strerror(errno));
		return BACKEND_ERR;
	}
	while ((e = readdir(d)) != NULL)
		holder_of(dirfd(d), e->d_name, fn, arg);
	closedir(d);
	return BACKEND_OK;
}

/* .count and .count_read: backend_local_count.c's files of the dir. */
static int local_count(struct backend_conn *c, const char *key, size_t klen, int n,
		       const char *const *fields, const size_t *flens, const long long *deltas)
{
	return local_count_add(c->bc->spec->dir, c->bc->mode, key, klen, n, fields, flens, deltas,
			       c->err, sizeof(c->err)) == 0 ? BACKEND_OK : BACKEND_ERR;
}

static int local_count_values(struct backend_conn *c, const char *ns,
			      void (*fn)(void *arg, const char *key, size_t klen,
					 const char *field, size_t flen, long long value),
			      void *arg)
{
	return local_count_read(c->bc->spec->dir, ns, fn, arg, c->err, sizeof(c->err)) == 0 ?
	       BACKEND_OK : BACKEND_ERR;
}

const struct backend_ops backend_local = {
	.name = "local",
	.settings = &backend_local_settings,
	.leaseless = 1,
	.unlock_why = "unlock: not with backend \"local\": a kernel lock cannot be taken from "
		      "another process; stop its holder (the kernel frees its locks when it exits)",
	.serves = local_serves,
	.config_new = local_config_new,
	.config_free = local_config_free,
	.open = local_open,
	.describe = local_describe,
	.close = local_close,
	.acquire = local_acquire,
	.release = local_release,
	.wait = local_wait,
	.leave = local_leave,
	.flush = local_flush,
	.unconfirmed = local_unconfirmed,
	.errstr = local_errstr,
	.ping = local_ping,
	.holders = local_holders,
	.count = local_count,
	.count_read = local_count_values,
	.count_inline = 1,
};
