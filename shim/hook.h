/* SPDX-License-Identifier: MIT */
/*
 * hook.h - hook instances: one per (lock, guarded function) pair.
 *
 * A hook owns a small executable stub that enters the trampoline with the
 * hook as context; redirected slots point at the stub. Hooks are created at
 * init or after dlopen and never freed, so a stub stays valid for as long as
 * any slot or saved pointer may reach it.
 *
 * A hook keeps apart what it guards and what it runs. target is the
 * function's identity, its address as relocation slots and dlsym results
 * hold it: hooks are found by (spec, target), so every method and every
 * slot that names one function shares one stub. call is the code
 * dispatch_call invokes to run that function: target itself, the shim's
 * own wrapper when it has one for the name (interpose.c; the wrapper then
 * runs inside the lock), or, for a method that patches the function's
 * entry, a relocated copy of its prologue (calling target would enter the
 * patch again).
 */
#ifndef LOCKSHIM_HOOK_H
#define LOCKSHIM_HOOK_H

#include "conf.h"

struct hook {
	const struct lock_spec *spec;
	void *target;         /* identity: the guarded function's address */
	void *call;           /* what dispatch_call runs for it */
	unsigned char *stub;
	int entry;            /* target's entry is patched to reach a stub of this
			       * hook: slots and lookups keep target (atomic) */
};

/*
 * Returns the hook for (spec, target), creating it with call, or NULL
 * (logged). A hook that exists keeps the call it was created with: a
 * method whose call differs from target must create its hooks before a
 * method that passes target (methods run in redirect.c's order).
 */
struct hook *hook_get(const struct lock_spec *spec, void *target, void *call);

/* Returns the hook whose stub is addr, or NULL. */
const struct hook *hook_by_stub(const void *addr);

#endif
