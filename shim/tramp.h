/* SPDX-License-Identifier: MIT */
/*
 * tramp.h - what the generic code needs from an architecture.
 *
 * Each architecture provides arch_<name>.c and tramp_<name>.S implementing
 * this header: the entry that every redirected slot reaches (through a small
 * per-hook stub that loads the hook pointer), the helper that calls the real
 * function from a normal frame with the caller's registers and a window of
 * its stack arguments, and the few facts the redirector and the longjmp
 * wrappers need (relocation types, the stack pointer inside a jmp_buf).
 */
#ifndef LOCKSHIM_TRAMP_H
#define LOCKSHIM_TRAMP_H

#include <stddef.h>
#include <stdint.h>

#include "tramp_x86_64.h"

struct tramp_frame; /* saved caller state; layout is per architecture */

enum reloc_kind { RELOC_OTHER, RELOC_JUMP_SLOT, RELOC_GLOB_DAT, RELOC_ABS64 };

/* Detects CPU features (vector state size). Returns 0 or -1. */
int arch_init(void);

/* Bytes one stub takes; stubs are written by arch_write_stub. */
size_t arch_stub_size(void);

/* Writes a stub at `at` that enters the trampoline with ctx as its hook. */
void arch_write_stub(unsigned char *at, const void *ctx);

/* Classifies an ELF relocation type of this architecture. */
int arch_reloc_kind(unsigned type);

/* Returns the stack pointer a longjmp to env will restore. */
uintptr_t arch_jmpbuf_sp(const void *env);

/* The six integer argument registers, for key expansion. */
const uint64_t *tramp_int_args(const struct tramp_frame *f);

/* Address of the caller's first stack argument. */
uintptr_t tramp_stack_args(const struct tramp_frame *f);

/* Makes the call return v (integer registers) and d (first FP register). */
void tramp_set_return(struct tramp_frame *f, long long v, double d);

/*
 * vfork(2) for the program: returns twice, like vfork, with GUARD_VFORK set
 * in the child and cleared in the parent once the child has exec'd or
 * exited (guard.h). Errors set errno and return -1.
 */
int tramp_vfork(void);

/*
 * Calls fn with the registers saved in f and `window` bytes (a multiple of
 * 16) of the caller's stack arguments, then saves the return registers in f.
 * Implemented in assembly with unwind info, so exceptions pass through.
 */
void tramp_invoke(struct tramp_frame *f, void *fn, size_t window);

#endif
