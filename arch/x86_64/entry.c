/* SPDX-License-Identifier: MIT */
/*
 * entry.c - moving an x86-64 function's first instructions
 * (see arch.h, "Entry patching").
 *
 * Instructions are decoded with capstone (linked statically, its symbols
 * hidden). An endbr64 at the entry stays; the 5 bytes after it become
 * `jmp rel32` to the hook's stub, so the instructions covering them move
 * to a copy: plain ones byte for byte; a RIP-relative operand with its
 * displacement recomputed (refused when the copy is out of its reach);
 * jmp, jcc and call rel8/rel32 rewritten as rel32 forms, or as an absolute
 * jump through an inline address (jcc: the inverted short jcc over it)
 * when the target is out of reach. The copy's own call returns into the
 * copy (never push+ret: CET's shadow stack stays right). Everything else
 * with a relative operand (loop, jrcxz, xbegin) is refused. The whole
 * function (its symbol's size; else up to 512 bytes) is then scanned: a
 * jump into [entry, entry + replaced bytes) or a call into the replaced
 * bytes would land in the middle of the new jump, and is refused.
 */
#include <capstone/capstone.h>
#include <stdio.h>
#include <string.h>

#include "arch.h"

#define JMP_REL32 5
#define SCAN_UNKNOWN 512 /* bytes scanned when the function's size is unknown */

static const unsigned char endbr64[4] = { 0xf3, 0x0f, 0x1e, 0xfa };

static csh cs;
static cs_insn *insn;

size_t arch_entry_reach(void)
{
	return (size_t)INT32_MAX - (1u << 20); /* less a margin for the copy's own size */
}

/* Opens the decoder once. Returns 0, or -1. */
static int decoder(void)
{
	if (insn)
		return 0;
	if (cs_open(CS_ARCH_X86, CS_MODE_64, &cs) != CS_ERR_OK)
		return -1;
	cs_option(cs, CS_OPT_DETAIL, CS_OPT_ON);
	insn = cs_malloc(cs);
	if (!insn) {
		cs_close(&cs);
		return -1;
	}
	return 0;
}

/* Decodes one instruction at p (at most avail bytes). Returns its length, 0 on failure. */
static size_t decode(const unsigned char *p, size_t avail)
{
	const uint8_t *code = p;
	size_t n = avail > 15 ? 15 : avail;
	uint64_t addr = (uintptr_t)p;

	return cs_disasm_iter(cs, &code, &n, &addr, insn) ? insn->size : 0;
}

static int in_group(uint8_t group)
{
	for (int i = 0; i < insn->detail->groups_count; i++)
		if (insn->detail->groups[i] == group)
			return 1;
	return 0;
}

/* Returns the target of a relative branch just decoded, or 0 for another
 * instruction. */
static uintptr_t branch_target(void)
{
	const cs_x86 *x = &insn->detail->x86;

	if (!in_group(X86_GRP_BRANCH_RELATIVE) || x->op_count < 1 || x->operands[0].type != X86_OP_IMM)
		return 0;
	return (uintptr_t)x->operands[0].imm;
}

static int fits32(intptr_t d)
{
	return d >= INT32_MIN && d <= INT32_MAX;
}

/* Writes `jmp target` for code running at addr into out. Returns bytes. */
static size_t emit_jmp(unsigned char *out, uintptr_t addr, uintptr_t target)
{
	intptr_t d = (intptr_t)(target - (addr + JMP_REL32));
	int32_t r = (int32_t)d;

	if (fits32(d)) {
		out[0] = 0xe9;
		memcpy(out + 1, &r, 4);
		return JMP_REL32;
	}
	memcpy(out, "\xff\x25\0\0\0\0", 6); /* jmp *0(%rip) */
	memcpy(out + 6, &target, 8);
	return 14;
}

static size_t emit_call(unsigned char *out, uintptr_t addr, uintptr_t target)
{
	intptr_t d = (intptr_t)(target - (addr + 5));
	int32_t r = (int32_t)d;

	if (fits32(d)) {
		out[0] = 0xe8;
		memcpy(out + 1, &r, 4);
		return 5;
	}
	memcpy(out, "\xff\x15\x02\0\0\0\xeb\x08", 8); /* call *2(%rip); jmp .+10 */
	memcpy(out + 8, &target, 8);
	return 16;
}

static size_t emit_jcc(unsigned char *out, uintptr_t addr, unsigned cc, uintptr_t target)
{
	intptr_t d = (intptr_t)(target - (addr + 6));
	int32_t r = (int32_t)d;

	if (fits32(d)) {
		out[0] = 0x0f;
		out[1] = (unsigned char)(0x80 | cc);
		memcpy(out + 2, &r, 4);
		return 6;
	}
	out[0] = (unsigned char)(0x70 | (cc ^ 1)); /* the opposite condition skips the jump */
	out[1] = 14;
	return 2 + emit_jmp(out + 2, addr + 2, target);
}

/*
 * Returns where the 32-bit displacement of the RIP-relative instruction
 * just decoded (at src) lies in its bytes, or 0 when that cannot be told.
 * Capstone 4 leaves encoding.disp_offset at 0 for some SSE instructions
 * (mulpd 0x814(%rip), %xmm0): then it is the byte after the ModRM byte
 * (RIP-relative addressing has no SIB byte), or else the one place where
 * the displacement's value appears. Any answer is checked against the
 * value capstone decoded.
 */
static size_t disp_offset(const unsigned char *src)
{
	const cs_x86 *x = &insn->detail->x86;
	int32_t want = (int32_t)x->disp;
	size_t found = 0, n = 0;

	if (x->encoding.disp_offset && x->encoding.disp_offset + 4u <= insn->size &&
	    !memcmp(src + x->encoding.disp_offset, &want, 4))
		return x->encoding.disp_offset;
	if (x->encoding.modrm_offset && x->encoding.modrm_offset + 5u <= insn->size &&
	    !memcmp(src + x->encoding.modrm_offset + 1, &want, 4))
		return x->encoding.modrm_offset + 1u;
	for (size_t i = 1; i + 4 <= insn->size; i++)
		if (!memcmp(src + i, &want, 4)) {
			found = i;
			n++;
		}
	return n == 1 ? found : 0;
}

/*
 * Writes the instruction just decoded, from src, relocated for the address
 * `addr`, into out. Returns its length, or 0 with why set when it cannot be
 * relocated.
 */
static size_t relocate(const unsigned char *src, unsigned char *out, uintptr_t addr,
		       char *why, size_t len)
{
	const cs_x86 *x = &insn->detail->x86;
	uintptr_t target = branch_target();
	uint8_t op = x->opcode[0];

	if (target) {
		if (insn->id == X86_INS_JMP)
			return emit_jmp(out, addr, target);
		if (insn->id == X86_INS_CALL)
			return emit_call(out, addr, target);
		if (op >= 0x70 && op <= 0x7f)
			return emit_jcc(out, addr, op & 0xfu, target);
		if (op == 0x0f && x->opcode[1] >= 0x80 && x->opcode[1] <= 0x8f)
			return emit_jcc(out, addr, x->opcode[1] & 0xfu, target);
		snprintf(why, len, "its first instructions include `%s %s`, whose relative "
			 "operand cannot be relocated", insn->mnemonic, insn->op_str);
		return 0;
	}
	memcpy(out, src, insn->size);
	for (int i = 0; i < x->op_count; i++) {
		intptr_t d;
		int32_t disp;
		size_t at;

		if (x->operands[i].type != X86_OP_MEM || x->operands[i].mem.base != X86_REG_RIP)
			continue;
		if (!(at = disp_offset(src))) {
			snprintf(why, len, "cannot find the displacement of `%s %s`", insn->mnemonic,
				 insn->op_str);
			return 0;
		}
		/* target = end of the original + disp; the copy keeps the length */
		d = (intptr_t)(((uintptr_t)src + insn->size + (uintptr_t)x->disp) -
			       (addr + insn->size));
		if (!fits32(d)) {
			snprintf(why, len, "the RIP-relative operand of `%s %s` is out of reach "
				 "of the copy", insn->mnemonic, insn->op_str);
			return 0;
		}
		disp = (int32_t)d;
		memcpy(out + at, &disp, 4);
	}
	return insn->size;
}

/*
 * Scans [fn, end) for a branch landing inside the bytes to be replaced,
 * [at, at + moved): a jump to any of [fn, at + moved) (also to the entry:
 * each pass of such a loop would enter the lock again, deeper on the
 * stack), a call strictly inside. Returns 0, or -1 with why set.
 */
static int branches_back(const unsigned char *fn, const unsigned char *end, size_t known,
			 const unsigned char *at, size_t moved, char *why, size_t len)
{
	for (const unsigned char *p = fn; p < end;) {
		size_t n = decode(p, (size_t)(end - p));
		uintptr_t t;

		if (!n) {
			if (!known)
				break; /* past the function's end, most likely */
			p++;
			continue;
		}
		t = branch_target();
		if (t && (insn->id == X86_INS_CALL ?
			  t > (uintptr_t)at && t < (uintptr_t)at + moved :
			  t >= (uintptr_t)fn && t < (uintptr_t)at + moved)) {
			snprintf(why, len, "prologue branches back into the %zu bytes to be "
				 "replaced (`%s %s` at +0x%zx)", moved, insn->mnemonic,
				 insn->op_str, (size_t)(p - fn));
			return -1;
		}
		p += n;
	}
	return 0;
}

int arch_entry_prepare(const void *fnv, size_t size, unsigned char *copy, const void *to,
		       struct arch_entry *e, char *why, size_t len)
{
	const unsigned char *fn = fnv, *at = fn, *end;
	size_t moved = 0, c = 0;
	int ended = 0;
	intptr_t d;
	int32_t r;

	if (decoder() != 0) {
		snprintf(why, len, "the instruction decoder cannot start (out of memory)");
		return -1;
	}
	if ((!size || size >= sizeof(endbr64)) && memcmp(fn, endbr64, sizeof(endbr64)) == 0)
		at += sizeof(endbr64);
	if (size && size < (size_t)(at - fn) + JMP_REL32) {
		snprintf(why, len, "function is %zu bytes long", size);
		return -1;
	}
	end = size ? fn + size : fn + SCAN_UNKNOWN;
	memcpy(copy, endbr64, sizeof(endbr64));
	c = sizeof(endbr64);
	while (moved < JMP_REL32) {
		size_t n = decode(at + moved, (size_t)(end - (at + moved))), k;

		if (!n) {
			snprintf(why, len, "cannot decode the instruction at +0x%zx",
				 (size_t)(at + moved - fn));
			return -1;
		}
		if (ended && !size) {
			snprintf(why, len, "the function may end within the bytes to be replaced "
				 "(its size is unknown)");
			return -1;
		}
		if (c + 16 > ARCH_ENTRY_COPY_MAX - 14 || moved + n > ARCH_ENTRY_PATCH_MAX) {
			snprintf(why, len, "its first instructions do not fit the copy");
			return -1;
		}
		k = relocate(at + moved, copy + c, (uintptr_t)(copy + c), why, len);
		if (!k)
			return -1;
		ended |= in_group(X86_GRP_RET) || insn->id == X86_INS_JMP || insn->id == X86_INS_UD2;
		c += k;
		moved += n;
	}
	if (branches_back(fn, end, size, at, moved, why, len) != 0)
		return -1;
	c += emit_jmp(copy + c, (uintptr_t)(copy + c), (uintptr_t)(at + moved));
	d = (intptr_t)((uintptr_t)to - ((uintptr_t)at + JMP_REL32));
	if (!fits32(d)) {
		snprintf(why, len, "its stub is out of reach of a direct jump");
		return -1;
	}
	r = (int32_t)d;
	e->at = (unsigned char *)at;
	e->len = moved;
	e->jump[0] = 0xe9;
	memcpy(e->jump + 1, &r, 4);
	memset(e->jump + JMP_REL32, 0xcc, moved - JMP_REL32); /* never reached: checked above */
	e->copy_len = c;
	return 0;
}
