/* SPDX-License-Identifier: MIT */
/*
 * hook.h - hook instances: one per (lock, real function) pair.
 *
 * A hook owns a small executable stub that enters the trampoline with the
 * hook as context; redirected slots point at the stub. Hooks are created at
 * init or after dlopen and never freed, so a stub stays valid for as long as
 * any slot or saved pointer may reach it.
 */
#ifndef LOCKSHIM_HOOK_H
#define LOCKSHIM_HOOK_H

#include "config.h"

struct hook {
	const struct lock_spec *spec;
	void *real;
	unsigned char *stub;
};

/* Returns the hook for (spec, real), creating it, or NULL (logged). */
struct hook *hook_get(const struct lock_spec *spec, void *real);

/* Returns the hook whose stub is addr, or NULL. */
const struct hook *hook_by_stub(const void *addr);

#endif
