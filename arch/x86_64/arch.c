/* SPDX-License-Identifier: MIT */
/*
 * arch_x86_64.c - x86-64 facts for the generic code (see tramp.h).
 *
 * Sizes the trampoline frame from the CPU's XSAVE area (CPUID leaf 0xD)
 * for the enabled user components (x87, SSE, AVX, AVX-512; XCR0), uses the
 * compacted XSAVEC when the CPU has it, and falls back to FXSAVE; writes
 * the 48-byte stubs (which keep the caller's r11 below the stack pointer
 * for tramp_entry); maps relocation types; demangles the stack pointer of
 * a glibc jmp_buf (PTR_MANGLE: xor with the pointer guard at %fs:0x30, rol
 * 17); reads and writes the saved frame (tramp_x86_64.h) for dispatch.c.
 */
#include <cpuid.h>
#include <elf.h>
#include <errno.h>
#include <stddef.h>
#include <string.h>

#include "arch.h" /* and, through LOCKSHIM_ARCH_H, tramp_x86_64.h */

/* The struct and the offsets tramp_x86_64.S uses describe one layout. */
_Static_assert(offsetof(struct tramp_frame, gpr) == TF_RDI &&
	       offsetof(struct tramp_frame, gpr[ARCH_INT_ARGS - 1]) == TF_R9 &&
	       offsetof(struct tramp_frame, rax) == TF_RAX &&
	       offsetof(struct tramp_frame, r10) == TF_R10 &&
	       offsetof(struct tramp_frame, stack_args) == TF_STACK &&
	       offsetof(struct tramp_frame, ret_rax) == TF_RET_RAX &&
	       offsetof(struct tramp_frame, ret_rdx) == TF_RET_RDX &&
	       offsetof(struct tramp_frame, skip) == TF_SKIP &&
	       offsetof(struct tramp_frame, skip_xmm0) == TF_SKIP_XMM0,
	       "struct tramp_frame does not match the TF_* offsets");

/* Read by tramp_x86_64.S. */
__attribute__((visibility("hidden"))) unsigned tramp_xsave_mask;
__attribute__((visibility("hidden"))) unsigned char tramp_xsavec;
__attribute__((visibility("hidden"))) unsigned long tramp_frame_size =
	TF_XSAVE + 512 + 64;

#define XSTATE_USER_MASK 0xe7u /* x87, SSE, AVX, opmask, ZMM_Hi256, Hi16_ZMM */
#define STUB_SIZE 48

int arch_init(void)
{
	unsigned a, b, c, d, lo, hi;

	if (!__get_cpuid(1, &a, &b, &c, &d))
		return 0;
	if (!(c & bit_XSAVE) || !(c & bit_OSXSAVE))
		return 0; /* FXSAVE: x87 and SSE only, as the CPU has no more */
	__asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
	__cpuid_count(0xd, 0, a, b, c, d);
	tramp_xsave_mask = lo & XSTATE_USER_MASK;
	tramp_frame_size = TF_XSAVE + b + 64; /* the standard size bounds XSAVEC's */
	__cpuid_count(0xd, 1, a, b, c, d);
	tramp_xsavec = (a & 2) != 0;
	return 0;
}

size_t arch_stub_size(void)
{
	return STUB_SIZE;
}

void arch_write_stub(unsigned char *at, const void *ctx)
{
	static const unsigned char code[] = {
		0xf3, 0x0f, 0x1e, 0xfa,             /* endbr64 */
		0x4c, 0x89, 0x5c, 0x24, 0xf0,       /* mov %r11, -16(%rsp): the caller's */
		0x49, 0xbb, 0, 0, 0, 0, 0, 0, 0, 0, /* movabs $ctx, %r11 */
		0xff, 0x25, 0, 0, 0, 0,             /* jmp *0(%rip) */
	};
	extern void tramp_entry(void);
	void (*entry)(void) = tramp_entry;

	memcpy(at, code, sizeof(code));
	memcpy(at + 11, &ctx, 8);
	memcpy(at + sizeof(code), &entry, 8);
	memset(at + sizeof(code) + 8, 0xcc, STUB_SIZE - sizeof(code) - 8);
}

int arch_reloc_kind(unsigned type)
{
	switch (type) {
	case R_X86_64_JUMP_SLOT: return RELOC_JUMP_SLOT;
	case R_X86_64_GLOB_DAT: return RELOC_GLOB_DAT;
	case R_X86_64_64: return RELOC_ABS64;
	}
	return RELOC_OTHER;
}

/* tramp_vfork's error path: sets errno to e and returns -1. */
__attribute__((visibility("hidden"))) int tramp_vfork_failed(int e);

int tramp_vfork_failed(int e)
{
	errno = e;
	return -1;
}

uintptr_t arch_jmpbuf_sp(const void *env)
{
	uintptr_t v, guard;

	memcpy(&v, (const char *)env + 6 * 8, sizeof(v)); /* JB_RSP */
	__asm__("movq %%fs:0x30, %0" : "=r"(guard));
	v = (v >> 17) | (v << 47);
	return v ^ guard;
}

const uint64_t *tramp_int_args(const struct tramp_frame *f)
{
	return f->gpr;
}

uintptr_t tramp_stack_args(const struct tramp_frame *f)
{
	return f->stack_args;
}

void tramp_set_return(struct tramp_frame *f, long long v, double d)
{
	f->ret_rax = (uint64_t)v;
	f->ret_rdx = f->gpr[2]; /* rdx as the caller left it (see tramp_x86_64.S) */
	f->skip = 1;
	f->skip_xmm0 = d;
}
