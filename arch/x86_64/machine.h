/* SPDX-License-Identifier: MIT */
/*
 * machine.h - the x86-64 SysV facts: ARCH_INT_ARGS for the generic code
 * (reached through arch.h, which includes this file from the include
 * path), and the frame layout shared by tramp.S and arch.c. Valid in C and in assembly.
 *
 * The frame sits 64-byte aligned on the stack of arch_tramp_entry: integer
 * argument registers, the caller's stack-argument address, the return
 * registers, then an XSAVE (or FXSAVE) area with the vector and x87 state.
 */
#ifndef LOCKSHIM_MACHINE_H
#define LOCKSHIM_MACHINE_H

/* Integer/pointer argument registers: rdi, rsi, rdx, rcx, r8, r9. */
#define ARCH_INT_ARGS 6

/* Entry patching: a relocated copy (endbr64, up to five instructions of up
 * to 15 bytes that grow to at most 16, a 14-byte jump back, with room) and
 * the bytes replaced at the entry (instructions covering a 5-byte jmp). */
#define ARCH_ENTRY_COPY_MAX 128
#define ARCH_ENTRY_PATCH_MAX 24

#define TF_RDI 0
#define TF_RSI 8
#define TF_RDX 16
#define TF_RCX 24
#define TF_R8 32
#define TF_R9 40
#define TF_RAX 48 /* al: vector registers used by a variadic call */
#define TF_R10 56 /* static chain */
#define TF_STACK 64
#define TF_RET_RAX 72
#define TF_RET_RDX 80
#define TF_SKIP 88 /* nonzero: load TF_SKIP_XMM0 into xmm0 on return */
#define TF_SKIP_XMM0 96
#define TF_XSAVE 128 /* 64-byte aligned */
#define TF_XSAVE_HDR (TF_XSAVE + 512)

#ifndef __ASSEMBLER__
#include <stdint.h>
struct arch_frame {
	uint64_t gpr[ARCH_INT_ARGS]; /* TF_RDI .. TF_R9 */
	uint64_t rax, r10, stack_args, ret_rax, ret_rdx, skip;
	double skip_xmm0;
};
#endif

#endif
