/* SPDX-License-Identifier: MIT */
/*
 * tramp.S - the generic wrapper for x86-64 SysV.
 *
 * arch_tramp_entry is reached from a per-hook stub with the hook in %r11. It
 * builds a normal frame (full CFI, so C++ exceptions and backtraces unwind
 * through it), saves every argument register and the whole vector/x87 state
 * (XSAVEC, which skips components in their initial state, or XSAVE, with
 * the enabled user components; FXSAVE on CPUs without XSAVE), and calls
 * dispatch_call(frame, hook). The dispatcher calls arch_invoke with the
 * hook's call (the guarded function, or the shim's wrapper for it), which
 * copies a window of the caller's stack arguments, restores the saved
 * state, calls it and saves its return state (rax, rdx and the vector/x87
 * state: xmm0/xmm1, ymm/zmm, st0/st1). arch_tramp_entry restores that state
 * exactly and returns to the caller, or, for a skipped call, returns
 * arch_set_return's values. No return address is ever rewritten.
 *
 * Every other call-clobbered register (rdi, rsi, rcx, r8-r11) goes back to
 * the caller as it was at the call, as the vector registers the callee does
 * not touch do: a caller compiled with gcc's -fipa-ra (the default at -O2)
 * keeps values in the registers it knows a local callee leaves alone, and
 * a patched entry (redirect_entry.c) puts the wrapper in such a call. The
 * stub stores the caller's r11 at -16(%rsp) before loading the hook into
 * it (below the stack pointer, in the red zone the kernel's signal frames
 * skip); arch_tramp_entry's frame never reaches that slot, 8 bytes below its
 * saved %rbp, as the area is 64 bytes larger than the XSAVE image.
 */
#include <sys/syscall.h>

#include "guard.h"
#include "machine.h"

	.text

/*
 * SAVE_FP saves the vector/x87 state into the frame at \base (its area at
 * TF_XSAVE, the XSAVE header cleared first); RESTORE_FP loads it back.
 * Both clobber eax and edx.
 */
.macro SAVE_FP base
	movl	arch_xsave_mask(%rip), %eax
	testl	%eax, %eax
	jz	1f
	xorl	%edx, %edx
	movq	%rdx, TF_XSAVE_HDR(\base)
	movq	%rdx, TF_XSAVE_HDR+8(\base)
	movq	%rdx, TF_XSAVE_HDR+16(\base)
	movq	%rdx, TF_XSAVE_HDR+24(\base)
	movq	%rdx, TF_XSAVE_HDR+32(\base)
	movq	%rdx, TF_XSAVE_HDR+40(\base)
	movq	%rdx, TF_XSAVE_HDR+48(\base)
	movq	%rdx, TF_XSAVE_HDR+56(\base)
	cmpb	$0, arch_xsavec(%rip)
	je	3f
	xsavec	TF_XSAVE(\base)
	jmp	2f
3:	xsave	TF_XSAVE(\base)
	jmp	2f
1:	fxsave	TF_XSAVE(\base)
2:
.endm

.macro RESTORE_FP base
	movl	arch_xsave_mask(%rip), %eax
	testl	%eax, %eax
	jz	1f
	xorl	%edx, %edx
	xrstor	TF_XSAVE(\base)
	jmp	2f
1:	fxrstor	TF_XSAVE(\base)
2:
.endm

	.globl	arch_tramp_entry
	.hidden	arch_tramp_entry
	.type	arch_tramp_entry, @function
arch_tramp_entry:
	.cfi_startproc
	endbr64
	pushq	%rbp
	.cfi_def_cfa_offset 16
	.cfi_offset %rbp, -16
	movq	%rsp, %rbp
	.cfi_def_cfa_register %rbp
	subq	arch_frame_size(%rip), %rsp
	andq	$-64, %rsp
	movq	%rdi, TF_RDI(%rsp)
	movq	%rsi, TF_RSI(%rsp)
	movq	%rdx, TF_RDX(%rsp)
	movq	%rcx, TF_RCX(%rsp)
	movq	%r8, TF_R8(%rsp)
	movq	%r9, TF_R9(%rsp)
	movq	%rax, TF_RAX(%rsp)
	movq	%r10, TF_R10(%rsp)
	leaq	16(%rbp), %rax
	movq	%rax, TF_STACK(%rsp)
	movq	$0, TF_SKIP(%rsp)
	SAVE_FP	%rsp
	movq	%rsp, %rdi
	movq	%r11, %rsi
	call	dispatch_call
	RESTORE_FP %rsp
	cmpq	$0, TF_SKIP(%rsp)
	je	3f
	movsd	TF_SKIP_XMM0(%rsp), %xmm0
3:	movq	TF_RET_RAX(%rsp), %rax
	movq	TF_RET_RDX(%rsp), %rdx
	movq	TF_RDI(%rsp), %rdi
	movq	TF_RSI(%rsp), %rsi
	movq	TF_RCX(%rsp), %rcx
	movq	TF_R8(%rsp), %r8
	movq	TF_R9(%rsp), %r9
	movq	TF_R10(%rsp), %r10
	movq	-8(%rbp), %r11
	leave
	.cfi_def_cfa %rsp, 8
	ret
	.cfi_endproc
	.size	arch_tramp_entry, .-arch_tramp_entry

/* void arch_invoke(struct arch_frame *f, void *fn, size_t window) */
	.globl	arch_invoke
	.hidden	arch_invoke
	.type	arch_invoke, @function
arch_invoke:
	.cfi_startproc
	endbr64
	pushq	%rbp
	.cfi_def_cfa_offset 16
	.cfi_offset %rbp, -16
	movq	%rsp, %rbp
	.cfi_def_cfa_register %rbp
	pushq	%rbx
	.cfi_offset %rbx, -24
	subq	$8, %rsp
	movq	%rdi, %rbx
	movq	%rsi, %r11
	subq	%rdx, %rsp
	andq	$-16, %rsp
	movq	%rdx, %rcx
	shrq	$3, %rcx
	movq	TF_STACK(%rbx), %rsi
	movq	%rsp, %rdi
	cld
	rep movsq
	RESTORE_FP %rbx
	movq	TF_RDI(%rbx), %rdi
	movq	TF_RSI(%rbx), %rsi
	movq	TF_RDX(%rbx), %rdx
	movq	TF_RCX(%rbx), %rcx
	movq	TF_R8(%rbx), %r8
	movq	TF_R9(%rbx), %r9
	movq	TF_R10(%rbx), %r10
	movq	TF_RAX(%rbx), %rax
	call	*%r11
	movq	%rax, TF_RET_RAX(%rbx)
	movq	%rdx, TF_RET_RDX(%rbx)
	SAVE_FP	%rbx
	movq	-8(%rbp), %rbx
	leave
	.cfi_def_cfa %rsp, 8
	ret
	.cfi_endproc
	.size	arch_invoke, .-arch_invoke

/*
 * int arch_vfork(void). As in glibc's vfork, the return address is popped
 * into a register that the system call preserves and pushed back after it:
 * the child runs on the parent's stack and may overwrite that slot before
 * the parent resumes. The child sets GUARD_VFORK in the thread's guard
 * (shared with the parent); the parent, resuming once the child has
 * exec'd or exited, clears it.
 */
	.globl	arch_vfork
	.hidden	arch_vfork
	.type	arch_vfork, @function
arch_vfork:
	.cfi_startproc
	endbr64
	popq	%rdi
	.cfi_adjust_cfa_offset -8
	.cfi_register %rip, %rdi
	movl	$SYS_vfork, %eax
	syscall
	pushq	%rdi
	.cfi_adjust_cfa_offset 8
	.cfi_rel_offset %rip, 0
	movq	guard_depth@gottpoff(%rip), %rcx
	testq	%rax, %rax
	jz	1f
	andl	$~GUARD_VFORK, %fs:(%rcx)
	cmpq	$-4095, %rax
	jae	2f
	ret
1:	orl	$GUARD_VFORK, %fs:(%rcx)
	ret
2:	negl	%eax
	movl	%eax, %edi
	subq	$8, %rsp
	.cfi_adjust_cfa_offset 8
	call	arch_vfork_failed
	addq	$8, %rsp
	.cfi_adjust_cfa_offset -8
	ret
	.cfi_endproc
	.size	arch_vfork, .-arch_vfork

	.section .note.GNU-stack, "", @progbits
