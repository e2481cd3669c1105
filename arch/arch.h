/* SPDX-License-Identifier: MIT */
/*
 * arch.h - what the generic code needs from an architecture: the seam,
 * whose functions all carry the prefix arch_.
 *
 * An architecture <name> (the Makefile's ARCH, `uname -m` by default:
 * x86_64, aarch64, ...) is one folder, arch/<name>/, and nothing else:
 *
 *   machine.h  ARCH_INT_ARGS, the number of integer/pointer argument
 *              registers (the {argN} placeholders, key.h; the saved
 *              registers arch_int_args returns), ARCH_ENTRY_COPY_MAX and
 *              ARCH_ENTRY_PATCH_MAX (entry patching), and what its .S and
 *              .c share (the layout of struct arch_frame). Included by
 *              this header, for the shim and the CLI alike, and by the .S:
 *              valid in C and in assembly.
 *   tramp.S    arch_tramp_entry, which every stub jumps to and which calls
 *              dispatch_call(frame, hook) (dispatch.c); arch_invoke;
 *              arch_vfork.
 *   arch.c     the other arch_* functions below: CPU features, the
 *              per-hook stub, relocation types, the stack pointer inside a
 *              jmp_buf, the saved frame.
 *   entry.c    arch_entry_prepare: decoding a function's first
 *              instructions and relocating them into a copy (entry
 *              patching, redirect_entry.c).
 *
 * The Makefile compiles every .c and .S of arch/$(ARCH)/ and puts that
 * folder on the include path (-iquote), so "machine.h" below is the
 * architecture's: no #ifdef per architecture anywhere. The generic code
 * assumes a 64-bit ELF target whose objects use RELA relocations
 * (redirect_reloc.c) and stack arguments copied in 16-byte units.
 */
#ifndef LOCKSHIM_ARCH_H
#define LOCKSHIM_ARCH_H

#include <stddef.h>
#include <stdint.h>

#include "machine.h" /* arch/$(ARCH)/machine.h: the Makefile's -iquote */

#if !defined(ARCH_INT_ARGS) || !defined(ARCH_ENTRY_COPY_MAX) || !defined(ARCH_ENTRY_PATCH_MAX)
#error "arch/$(ARCH)/machine.h must define ARCH_INT_ARGS, ARCH_ENTRY_COPY_MAX, ARCH_ENTRY_PATCH_MAX"
#endif

struct arch_frame; /* saved caller state; only arch/<name>/ uses its fields */

enum reloc_kind { RELOC_OTHER, RELOC_JUMP_SLOT, RELOC_GLOB_DAT, RELOC_ABS64 };

/*
 * Detects CPU features (vector state size). Returns 0 when the trampoline
 * can run on this CPU; init.c leaves every call unguarded otherwise.
 * x86-64 always can (no XSAVE: FXSAVE) and always returns 0.
 */
int arch_init(void);

/* Bytes one stub takes; stubs are written by arch_write_stub. */
size_t arch_stub_size(void);

/* Writes a stub at `at` that enters the trampoline with ctx as its hook. */
void arch_write_stub(unsigned char *at, const void *ctx);

/* Classifies an ELF relocation type of this architecture. */
int arch_reloc_kind(unsigned type);

/* Returns the stack pointer a longjmp to env will restore. */
uintptr_t arch_jmpbuf_sp(const void *env);

/* The ARCH_INT_ARGS integer argument registers saved in f, for the key. */
const uint64_t *arch_int_args(const struct arch_frame *f);

/* Address of the caller's first stack argument. */
uintptr_t arch_stack_args(const struct arch_frame *f);

/* Makes the call return v (integer registers) and d (first FP register). */
void arch_set_return(struct arch_frame *f, long long v, double d);

/*
 * vfork(2) for the program: returns twice, like vfork, with GUARD_VFORK set
 * in the child and cleared in the parent once the child has exec'd or
 * exited (guard.h). Errors set errno and return -1.
 */
int arch_vfork(void);

/*
 * Calls fn with the registers saved in f and `window` bytes (a multiple of
 * 16) of the caller's stack arguments, then saves the return registers in f.
 * Implemented in assembly with unwind info, so exceptions pass through.
 */
void arch_invoke(struct arch_frame *f, void *fn, size_t window);

/*
 * Entry patching (arch_<name>_entry.c). A patched function's first
 * instructions are replaced by a direct jump to `to` (a stub entering the
 * trampoline); they run instead from a copy, relocated for the copy's
 * address and followed by a jump back to the rest of the function. A
 * landing pad at the entry (x86-64: endbr64) stays in place, and the copy
 * starts with one, as an indirect call reaches it.
 */
struct arch_entry {
	unsigned char *at;      /* where the jump is written: the entry, after its landing pad */
	size_t len;             /* bytes replaced there (whole instructions) */
	unsigned char jump[ARCH_ENTRY_PATCH_MAX]; /* the len bytes written at `at` */
	size_t copy_len;        /* bytes of the copy */
};

/*
 * Prepares patching the function at fn, size bytes long (0: unknown):
 * checks that its first instructions can be moved (the function is long
 * enough, nothing branches back into them, each can be relocated), writes
 * the copy into copy (ARCH_ENTRY_COPY_MAX bytes, run where they are, within
 * arch_entry_reach of fn) and fills e with the jump to `to` (within reach
 * too). Writes nothing at fn. Returns 0, or -1 with the reason in why
 * ("function is 3 bytes long"). Not thread-safe (one decoder); called under
 * redirect.c's scan lock.
 */
int arch_entry_prepare(const void *fn, size_t size, unsigned char *copy, const void *to,
		       struct arch_entry *e, char *why, size_t len);

/* The greatest distance between a patched function and its copy or the
 * stub its entry jumps to (the reach of a direct jump). */
size_t arch_entry_reach(void);

#endif
