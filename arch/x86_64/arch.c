/* SPDX-License-Identifier: MIT */
/*
 * arch.c - x86-64 facts for the generic code (see arch.h).
 *
 * Sizes the trampoline frame from the CPU's XSAVE area (CPUID leaf 0xD)
 * for the enabled user components (x87, SSE, AVX, AVX-512; XCR0), uses the
 * compacted XSAVEC when the CPU has it, and falls back to FXSAVE; writes
 * the 48-byte stubs (which keep the caller's r11 below the stack pointer
 * for arch_tramp_entry); maps relocation types; demangles the stack pointer of
 * a glibc jmp_buf (PTR_MANGLE: xor with the pointer guard at %fs:0x30, rol
 * 17); reads and writes the saved frame (machine.h) for dispatch.c.
 */
#include <cpuid.h>
#include <elf.h>
#include <errno.h>
#include <stddef.h>
#include <string.h>

#include "arch.h" /* and, through it, machine.h */

/* The struct and the offsets tramp.S uses describe one layout. */
_Static_assert(offsetof(struct arch_frame, gpr) == TF_RDI &&
	       offsetof(struct arch_frame, gpr[ARCH_INT_ARGS - 1]) == TF_R9 &&
	       offsetof(struct arch_frame, rax) == TF_RAX &&
	       offsetof(struct arch_frame, r10) == TF_R10 &&
	       offsetof(struct arch_frame, stack_args) == TF_STACK &&
	       offsetof(struct arch_frame, ret_rax) == TF_RET_RAX &&
	       offsetof(struct arch_frame, ret_rdx) == TF_RET_RDX &&
	       offsetof(struct arch_frame, skip) == TF_SKIP &&
	       offsetof(struct arch_frame, skip_xmm0) == TF_SKIP_XMM0,
	       "struct arch_frame does not match the TF_* offsets");

/* Read by tramp.S. */
__attribute__((visibility("hidden"))) unsigned arch_xsave_mask;
__attribute__((visibility("hidden"))) unsigned char arch_xsavec;
__attribute__((visibility("hidden"))) unsigned long arch_frame_size =
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
	arch_xsave_mask = lo & XSTATE_USER_MASK;
	arch_frame_size = TF_XSAVE + b + 64; /* the standard size bounds XSAVEC's */
	__cpuid_count(0xd, 1, a, b, c, d);
	arch_xsavec = (a & 2) != 0;
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
	extern void arch_tramp_entry(void);
	void (*entry)(void) = arch_tramp_entry;

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

/* arch_vfork's error path: sets errno to e and returns -1. */
__attribute__((visibility("hidden"))) int arch_vfork_failed(int e);

int arch_vfork_failed(int e)
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

const uint64_t *arch_int_args(const struct arch_frame *f)
{
	return f->gpr;
}

uintptr_t arch_stack_args(const struct arch_frame *f)
{
	return f->stack_args;
}

void arch_set_return(struct arch_frame *f, long long v, double d)
{
	f->ret_rax = (uint64_t)v;
	f->ret_rdx = f->gpr[2]; /* rdx as the caller left it (see tramp.S) */
	f->skip = 1;
	f->skip_xmm0 = d;
}
