/*
 * Hand-written x86-64 functions whose first instructions are awkward to
 * move out of the way of a 5-byte jump (entry patching). Each is global
 * (in .symtab only: the executable is linked without -rdynamic) and called
 * directly by entry_asm_main.c. The encodings named below are checked with
 * objdump by test_entry.py.
 *   rip_first(x)    a RIP-relative load first: counter += x; returns counter
 *   early_exit(x)   test; jz rel8 out of the first 5 bytes: -1 for 0, else x + 100
 *   endbr_first(x)  endbr64 first: 3 * x + 1
 *   tiny(x)         3 bytes long (mov; ret): x
 *   loop_back(n, s) a loop whose jnz rel8 goes back to byte 0: s + n (n >= 1)
 *   loop_mid(n)     the same with the loop head at byte 2: 2 * n (n >= 1)
 *   call_first(x)   a call rel32 first (to a local helper): x + 2 + x
 *   jmp_first(x)    nothing but a jmp rel32 to the local add_two (5 bytes): x + 2
 */
	.text

	.globl	rip_first
	.type	rip_first, @function
	.p2align 4
rip_first:
	movl	counter(%rip), %eax
	addl	%edi, %eax
	movl	%eax, counter(%rip)
	ret
	.size	rip_first, .-rip_first

	.globl	early_exit
	.type	early_exit, @function
	.p2align 4
early_exit:
	testl	%edi, %edi
	jz	1f
	leal	100(%rdi), %eax
	ret
1:	movl	$-1, %eax
	ret
	.size	early_exit, .-early_exit

	.globl	endbr_first
	.type	endbr_first, @function
	.p2align 4
endbr_first:
	endbr64
	movl	%edi, %eax
	imull	$3, %eax, %eax
	addl	$1, %eax
	ret
	.size	endbr_first, .-endbr_first

	.globl	tiny
	.type	tiny, @function
	.p2align 4
tiny:
	movl	%edi, %eax
	ret
	.size	tiny, .-tiny

	.globl	loop_back
	.type	loop_back, @function
	.p2align 4
loop_back:
1:	addl	$1, %esi
	subl	$1, %edi
	jnz	1b
	movl	%esi, %eax
	ret
	.size	loop_back, .-loop_back

	.globl	loop_mid
	.type	loop_mid, @function
	.p2align 4
loop_mid:
	xorl	%eax, %eax
1:	addl	$2, %eax
	subl	$1, %edi
	jnz	1b
	ret
	.size	loop_mid, .-loop_mid

	.type	add_two, @function
	.p2align 4
add_two:
	leal	2(%rdi), %eax
	ret
	.size	add_two, .-add_two

	.globl	call_first
	.type	call_first, @function
	.p2align 4
call_first:
	call	add_two
	addl	%edi, %eax
	ret
	.size	call_first, .-call_first

	.globl	jmp_first
	.type	jmp_first, @function
	.p2align 4
jmp_first:
	jmp.d32	add_two
	.size	jmp_first, .-jmp_first

	.data
	.p2align 2
counter:
	.long	5

	.section .note.GNU-stack,"",@progbits
