/* SPDX-License-Identifier: MIT */
/*
 * shim.h - the shim's life cycle state, owned by init.c.
 *
 * Wrappers pass calls straight through unless the state is SHIM_ON: before
 * the constructor finished, and after the destructor started. The
 * constructor also notes the initial thread (whose stack is the process's).
 */
#ifndef LOCKSHIM_SHIM_H
#define LOCKSHIM_SHIM_H

#include <pthread.h>

enum shim_state { SHIM_OFF, SHIM_ON, SHIM_DOWN };

extern int shim_state;
extern pthread_t shim_initial_thread;

static inline int shim_active(void)
{
	return __atomic_load_n(&shim_state, __ATOMIC_ACQUIRE) == SHIM_ON;
}

#endif
