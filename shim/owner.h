/* SPDX-License-Identifier: MIT */
/*
 * owner.h - who holds a lock, and whether that holder is gone.
 *
 * A lock value is "<token>:<host>:<pid>:<tid>:<boot id>:<pid ns>:<start>":
 * a 128-bit token in hex, then who took the lock: the host name (for
 * people reading the key; ':', blanks and non-ASCII bytes as '-', "unknown"
 * when unset), process and thread id, the kernel's boot id,
 * the inode of the pid namespace and the process's start time (clock ticks
 * after boot). A waiter of the same boot and pid namespace can look the
 * holder up in /proc.
 */
#ifndef LOCKSHIM_OWNER_H
#define LOCKSHIM_OWNER_H

#include <stddef.h>

/* Writes ":<host>:<pid>:<tid>:<boot id>:<pid ns>:<start>" for this process
 * and thread tid into buf (NUL-terminated, truncated to cap). Returns the
 * length written. Reads the process's identity on first use; safe from any
 * number of threads at once, and every field is whole. */
size_t owner_suffix(char *buf, size_t cap, int tid);

/*
 * Returns 1 when the holder named by the lock value val[0..len) is a
 * process of this boot and pid namespace that is gone, with its pid in
 * *pid; 0 when it is alive, elsewhere, or cannot be told. thorough = 0
 * asks kill(pid, 0) only (a process that no longer exists); thorough = 1
 * also reads /proc/<pid>/stat (a zombie, or another process under a
 * reused pid).
 */
int owner_gone(const char *val, size_t len, int thorough, int *pid);

/* Writes "host H, pid P" for the holder named by the lock value
 * val[0..len) into buf (NUL-terminated, truncated to cap; in H, a control
 * or non-ASCII byte as '-'), or "unknown" when the value does not have
 * the form above. Returns the length. */
size_t owner_describe(const char *val, size_t len, char *buf, size_t cap);

/* Fork child: the identity is read afresh on next use. */
void owner_atfork_child(void);

#endif
