/* SPDX-License-Identifier: MIT */
/*
 * fdown.h - descriptors the shim owns, kept out of the program's way.
 *
 * The program may close any descriptor (a daemon's close(3..1023) loop,
 * close_range) and reuse its number for its own files; the shim must then
 * never read, write or close it again. The shim's descriptors are moved
 * above the low numbers, close-on-exec, and marked in a bitmap; the close
 * and dup wrappers (interpose.c) bump an epoch when the program closes or
 * replaces a marked number. Each owner remembers the epoch at which its
 * descriptor was last known to be its own and the file's identity (device,
 * inode): the common path compares two integers, and only after a bump does
 * one fstat(2) tell whether the descriptor is still the same open file.
 */
#ifndef LOCKSHIM_FDOWN_H
#define LOCKSHIM_FDOWN_H

#include <sys/types.h>

struct fdown {
	int fd;          /* -1: none */
	unsigned epoch;  /* fdown_epoch when fd was last known to be ours */
	dev_t dev;
	ino_t ino;
};

extern unsigned fdown_epoch;

/* Makes o empty (fd -1). */
void fdown_init(struct fdown *o);

/*
 * Takes fd over: moves it above the low numbers (close-on-exec), records
 * its identity and marks it. Returns 0, or -errno (fd is closed then).
 */
int fdown_adopt(struct fdown *o, int fd);

/* The slow half of fdown_check, after the epoch moved: fstat(2) compares
 * the identity. Returns 1 (still ours, epoch updated) or 0 (o emptied). */
int fdown_verify(struct fdown *o);

/* Returns 1 while o->fd is the descriptor adopted, else 0; then o->fd is
 * -1 and the number, now the program's, is never touched again. */
static inline int fdown_check(struct fdown *o)
{
	if (o->fd < 0)
		return 0;
	if (__atomic_load_n(&fdown_epoch, __ATOMIC_ACQUIRE) == o->epoch)
		return 1;
	return fdown_verify(o);
}

/* Closes o->fd if it is still ours; o is empty afterwards. */
void fdown_close(struct fdown *o);

/* The program closed, or made another file of, descriptor fd (note) or
 * possibly many (note_all: close_range, closefrom). Async-signal-safe. */
void fdown_note(int fd);
void fdown_note_all(void);

#endif
