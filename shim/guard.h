/* SPDX-License-Identifier: MIT */
/*
 * guard.h - the per-thread "inside the shim" flag.
 *
 * While it is set, every redirected call passes straight through to the real
 * function: the shim's own work (and hiredis's) never re-enters a wrapper.
 * Initial-exec TLS, so reading it never calls into the dynamic linker.
 * GUARD_VFORK is set by the vfork wrapper in the child, which shares its
 * parent's memory (this variable included) until it execs or exits, and
 * cleared in the parent when it resumes: nothing the child calls touches
 * the parent's lock state.
 */
#ifndef LOCKSHIM_GUARD_H
#define LOCKSHIM_GUARD_H

#define GUARD_VFORK 0x40000000

#ifndef __ASSEMBLER__
extern __thread int guard_depth __attribute__((tls_model("initial-exec")));

static inline int guard_active(void) { return guard_depth != 0; }
static inline void guard_enter(void) { guard_depth++; }
static inline void guard_leave(void) { guard_depth--; }
#endif

#endif
