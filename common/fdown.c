/* SPDX-License-Identifier: MIT */
/*
 * fdown.c - the shim's descriptors and the program's closes (see fdown.h).
 *
 * The bitmap has one bit per descriptor number below FDOWN_BITS; a number
 * above it counts as marked (a close there always bumps the epoch: cheap,
 * and never wrong). Adopted descriptors go to the lowest free number at or
 * above half the soft RLIMIT_NOFILE, at most 512: out of the range where
 * programs keep fixed descriptors and where open(2) hands out new ones,
 * without growing the kernel's descriptor table much.
 */
#include "fdown.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#define FDOWN_BITS 65536
#define FDOWN_FLOOR_MAX 512

unsigned fdown_epoch;
static unsigned long marks[FDOWN_BITS / (8 * sizeof(unsigned long))];
static int floor_fd;

#define WORD(fd) (marks[(unsigned)(fd) / (8 * sizeof(unsigned long))])
#define BIT(fd) (1UL << ((unsigned)(fd) % (8 * sizeof(unsigned long))))

static void mark(int fd, int on)
{
	if (fd < 0 || fd >= FDOWN_BITS)
		return;
	if (on)
		__atomic_fetch_or(&WORD(fd), BIT(fd), __ATOMIC_RELEASE);
	else
		__atomic_fetch_and(&WORD(fd), ~BIT(fd), __ATOMIC_RELEASE);
}

static int marked(int fd)
{
	return fd >= FDOWN_BITS || (__atomic_load_n(&WORD(fd), __ATOMIC_ACQUIRE) & BIT(fd));
}

/* Returns the lowest number the shim's descriptors are moved to. */
static int floor_get(void)
{
	struct rlimit rl;
	rlim_t half;
	int f = __atomic_load_n(&floor_fd, __ATOMIC_RELAXED);

	if (f)
		return f;
	f = 3;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
		half = rl.rlim_cur == RLIM_INFINITY ? FDOWN_FLOOR_MAX : rl.rlim_cur / 2;
		f = half > FDOWN_FLOOR_MAX ? FDOWN_FLOOR_MAX : half < 3 ? 3 : (int)half;
	}
	__atomic_store_n(&floor_fd, f, __ATOMIC_RELAXED);
	return f;
}

void fdown_init(struct fdown *o)
{
	o->fd = -1;
	o->epoch = 0;
	o->dev = 0;
	o->ino = 0;
}

int fdown_adopt(struct fdown *o, int fd)
{
	struct stat st;
	int high = fd < floor_get() ? fcntl(fd, F_DUPFD_CLOEXEC, floor_get()) : -1;

	if (high >= 0) {
		close(fd);
		fd = high;
	} else {
		fcntl(fd, F_SETFD, FD_CLOEXEC);
	}
	mark(fd, 1);
	o->epoch = __atomic_load_n(&fdown_epoch, __ATOMIC_ACQUIRE);
	if (fstat(fd, &st) != 0) {
		int e = errno;

		mark(fd, 0);
		close(fd);
		fdown_init(o);
		return -e;
	}
	o->fd = fd;
	o->dev = st.st_dev;
	o->ino = st.st_ino;
	return 0;
}

int fdown_verify(struct fdown *o)
{
	unsigned now = __atomic_load_n(&fdown_epoch, __ATOMIC_ACQUIRE);
	struct stat st;

	if (o->fd < 0)
		return 0;
	if (fstat(o->fd, &st) == 0 && st.st_dev == o->dev && st.st_ino == o->ino) {
		o->epoch = now;
		return 1;
	}
	mark(o->fd, 0); /* the number is the program's now */
	fdown_init(o);
	return 0;
}

void fdown_close(struct fdown *o)
{
	if (fdown_check(o)) {
		mark(o->fd, 0);
		close(o->fd);
	}
	fdown_init(o);
}

void fdown_note(int fd)
{
	if (fd >= 0 && marked(fd))
		__atomic_add_fetch(&fdown_epoch, 1, __ATOMIC_RELEASE);
}

void fdown_note_all(void)
{
	__atomic_add_fetch(&fdown_epoch, 1, __ATOMIC_RELEASE);
}
