/* SPDX-License-Identifier: MIT */
/*
 * owner_tmp.h - TEMPORARY stand-in for engineer A's owner API (common/owner.h
 * after the move: struct owner_info, owner_parse, owner_state), declared
 * exactly as the shared design fixes it, so that `status` and `unlock` build
 * and run before that branch is merged. Its definitions (owner_tmp.c) are
 * weak: once common/owner.c is linked into the command, its own win. The
 * merge should delete owner_tmp.[ch] and include "owner.h" instead.
 */
#ifndef LOCKSHIM_OWNER_TMP_H
#define LOCKSHIM_OWNER_TMP_H

#include <stddef.h>

struct owner_info {
	char host[256];
	int pid;
	int tid;
	long long since_ms;
	char program[65];
	int local; /* same boot id and pid ns */
};

/* Fills out from the lock value val[0..len). Returns 0, or -1 when it is
 * not a lock value. */
int owner_parse(const char *val, size_t len, struct owner_info *out);

enum { OWNER_GONE = 1, OWNER_ALIVE_HERE = 2, OWNER_ELSEWHERE = 3 };

/* Returns the holder's liveness, thoroughly (/proc): OWNER_ELSEWHERE also
 * when it cannot be told. */
int owner_state(const char *val, size_t len);

#endif
