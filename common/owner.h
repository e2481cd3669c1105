/* SPDX-License-Identifier: MIT */
/*
 * owner.h - who holds a lock, since when, and whether that holder is gone.
 *
 * A lock value (also each waiter's member in the queue) is
 * "<token>:<host>:<pid>:<tid>:<boot id>:<pid ns>:<start>:<since_ms>:<program>":
 * a 128-bit token in hex, then who took the lock: the host name (for
 * people reading the key), process and thread id, the kernel's boot id,
 * the inode of the pid namespace, the process's start time (clock ticks
 * after boot), when the value was made (CLOCK_REALTIME ms: for a waiter,
 * when it began to wait) and the program (the executable's file name, at
 * most 64 bytes). Host and program have ':', blanks and non-ASCII bytes as
 * '-' and read "unknown" when empty. Values are parsed from the tail. A
 * waiter of the same boot and pid namespace can look the holder up in /proc.
 */
#ifndef LOCKSHIM_OWNER_H
#define LOCKSHIM_OWNER_H

#include <stddef.h>

#define OWNER_PROGRAM_MAX 64

/* A holder as its value names it (owner_parse). */
struct owner_info {
	char host[256];
	int pid;
	int tid;
	long long since_ms;
	char program[OWNER_PROGRAM_MAX + 1];
	int local; /* same boot id and pid namespace as this process */
};

/* owner_state's answers. */
enum { OWNER_GONE = 1, OWNER_ALIVE_HERE = 2, OWNER_ELSEWHERE = 3 };

/* Writes ":<host>:<pid>:<tid>:<boot id>:<pid ns>:<start>" for this process
 * and thread tid into buf (NUL-terminated, truncated to cap). Returns the
 * length written. Reads the process's identity on first use; safe from any
 * number of threads at once, and every field is whole. */
size_t owner_suffix(char *buf, size_t cap, int tid);

/* Writes ":<since_ms>:<program>" (the value's last two fields) into buf
 * (NUL-terminated, truncated to cap). Returns the length. No system call. */
size_t owner_tail(char *buf, size_t cap, long long since_ms);

/* Sets the program named by values made from now on (sanitised as above);
 * call before the first value is made. Default: log.c's program name (the
 * executable's file name). */
void owner_set_program(const char *name);

/*
 * Fills *out from the lock value val[0..len) (host and program with any
 * control or non-ASCII byte as '-'). Returns 0, or -1 when val does not
 * have the form above (*out is then zeroed, host and program "unknown").
 */
int owner_parse(const char *val, size_t len, struct owner_info *out);

/*
 * Returns 1 when the holder named by the lock value val[0..len) is a
 * process of this boot and pid namespace that is gone, with its pid in
 * *pid; 0 when it is alive, elsewhere, or cannot be told. thorough = 0
 * asks kill(pid, 0) only (a process that no longer exists); thorough = 1
 * also reads /proc/<pid>/stat (a zombie, or another process under a
 * reused pid).
 */
int owner_gone(const char *val, size_t len, int thorough, int *pid);

/* Returns OWNER_GONE (owner_gone, thorough), OWNER_ALIVE_HERE (a live
 * process of this boot and pid namespace, this one included), or
 * OWNER_ELSEWHERE (another machine or namespace, or it cannot be told). */
int owner_state(const char *val, size_t len);

/* Writes "host H, pid P, program R" for the holder named by the lock value
 * val[0..len) into buf (NUL-terminated, truncated to cap; control or
 * non-ASCII bytes as '-'), or "unknown" when the value does not have the
 * form above. Returns the length. */
size_t owner_describe(const char *val, size_t len, char *buf, size_t cap);

/* Fork child: the identity is read afresh on next use. */
void owner_atfork_child(void);

#endif
