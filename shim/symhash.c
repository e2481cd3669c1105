/* SPDX-License-Identifier: MIT */
/*
 * symhash.c - dynamic symbols by name through DT_GNU_HASH / DT_HASH (see
 * symhash.h).
 *
 * The dynamic section gives where each table starts, not its size: the
 * bound of each is the end of the PT_LOAD segment holding it. A bucket or
 * chain value is an index, checked against the chain's and the symbol
 * table's bounds before it is followed; a DT_HASH chain is followed at
 * most nchain steps (a loop in a hostile table ends). The bloom filter of
 * DT_GNU_HASH is not read: the chain answers alone.
 */
#include "symhash.h"

#include <elf.h>
#include <string.h>

uint32_t symhash_gnu(const char *name)
{
	uint32_t h = 5381;

	for (const unsigned char *p = (const unsigned char *)name; *p; p++)
		h = h * 33 + *p;
	return h;
}

uint32_t symhash_sysv(const char *name)
{
	uint32_t h = 0, g;

	for (const unsigned char *p = (const unsigned char *)name; *p; p++) {
		h = (h << 4) + *p;
		g = h & 0xf0000000u;
		if (g)
			h ^= g >> 24;
		h &= ~g;
	}
	return h;
}

/* Returns the bytes readable from p to the end of the PT_LOAD segment that
 * holds it, or 0 when none does. */
static size_t room(uintptr_t p, uintptr_t base, const ElfW(Phdr) *phdr, int phnum)
{
	for (int i = 0; i < phnum; i++) {
		uintptr_t lo = base + phdr[i].p_vaddr;

		if (phdr[i].p_type == PT_LOAD && p >= lo && p - lo < phdr[i].p_memsz)
			return (size_t)(phdr[i].p_memsz - (p - lo));
	}
	return 0;
}

int symhash_init(struct symhash *h, uintptr_t base, const ElfW(Phdr) *phdr, int phnum)
{
	const ElfW(Dyn) *dyn = NULL;
	size_t dynroom = 0, strsz = 0;
	uintptr_t syms = 0, strs = 0, gnu = 0, sysv = 0;

	memset(h, 0, sizeof(*h));
	for (int i = 0; i < phnum; i++)
		if (phdr[i].p_type == PT_DYNAMIC) {
			dyn = (const ElfW(Dyn) *)(base + phdr[i].p_vaddr);
			dynroom = room((uintptr_t)dyn, base, phdr, phnum) / sizeof(*dyn);
		}
	for (size_t i = 0; dyn && i < dynroom && dyn[i].d_tag != DT_NULL; i++) {
		/* the vdso's entries are not relocated: offsets from base */
		uintptr_t v = dyn[i].d_un.d_ptr < base ? dyn[i].d_un.d_ptr + base : dyn[i].d_un.d_ptr;

		switch (dyn[i].d_tag) {
		case DT_SYMTAB: syms = v; break;
		case DT_STRTAB: strs = v; break;
		case DT_STRSZ: strsz = dyn[i].d_un.d_val; break;
		case DT_GNU_HASH: gnu = v; break;
		case DT_HASH: sysv = v; break;
		}
	}
	if (!syms || !strs || (!gnu && !sysv))
		return -1;
	h->syms = (const ElfW(Sym) *)syms;
	h->nsyms = room(syms, base, phdr, phnum) / sizeof(ElfW(Sym));
	h->strs = (const char *)strs;
	h->strsz = room(strs, base, phdr, phnum);
	if (strsz < h->strsz)
		h->strsz = strsz;
	if (gnu) {
		h->gnu = (const uint32_t *)gnu;
		h->gnuwords = room(gnu, base, phdr, phnum) / 4;
	}
	if (sysv) {
		h->sysv = (const uint32_t *)sysv;
		h->sysvwords = room(sysv, base, phdr, phnum) / 4;
	}
	return h->nsyms && h->strsz && (h->gnuwords || h->sysvwords) ? 0 : -1;
}

/* Returns whether symbol i (checked against nsyms) is named name (len). */
static int named(const struct symhash *h, size_t i, const char *name, size_t len)
{
	size_t off;

	if (i >= h->nsyms)
		return 0;
	off = h->syms[i].st_name;
	return off < h->strsz && h->strsz - off > len && memcmp(h->strs + off, name, len + 1) == 0;
}

/* Records index i in idx (count so far: n). Returns n + 1. */
static size_t note(size_t *idx, size_t max, size_t n, size_t i)
{
	if (n < max)
		idx[n] = i;
	return n + 1;
}

static size_t find_gnu(const struct symhash *h, const char *name, size_t len, size_t *idx,
		       size_t max)
{
	const uint32_t *g = h->gnu;
	size_t nbuckets, symoffset, head, nchain, n = 0;
	uint32_t hash = symhash_gnu(name);
	const uint32_t *buckets, *chain;

	if (h->gnuwords < 4)
		return 0;
	nbuckets = g[0];
	symoffset = g[1];
	head = 4 + (size_t)g[2] * (sizeof(ElfW(Addr)) / 4); /* the header and the bloom */
	if (!nbuckets || head > h->gnuwords || nbuckets > h->gnuwords - head)
		return 0;
	buckets = g + head;
	chain = buckets + nbuckets;
	nchain = h->gnuwords - head - nbuckets;
	for (size_t i = buckets[hash % nbuckets]; i >= symoffset && i - symoffset < nchain; i++) {
		uint32_t c = chain[i - symoffset];

		if ((c | 1) == (hash | 1) && named(h, i, name, len))
			n = note(idx, max, n, i);
		if (c & 1)
			break; /* the chain's last */
	}
	return n;
}

static size_t find_sysv(const struct symhash *h, const char *name, size_t len, size_t *idx,
			size_t max)
{
	const uint32_t *w = h->sysv;
	size_t nbucket, nchain, n = 0, steps = 0;
	const uint32_t *chain;

	if (h->sysvwords < 2)
		return 0;
	nbucket = w[0];
	nchain = w[1];
	if (!nbucket || nbucket > h->sysvwords - 2 || nchain > h->sysvwords - 2 - nbucket)
		return 0;
	chain = w + 2 + nbucket;
	for (size_t i = w[2 + symhash_sysv(name) % nbucket]; i != STN_UNDEF && i < nchain &&
	     steps++ < nchain; i = chain[i])
		if (named(h, i, name, len))
			n = note(idx, max, n, i);
	return n;
}

size_t symhash_find(const struct symhash *h, const char *name, size_t *idx, size_t max)
{
	size_t len = strlen(name), n;

	n = h->gnu ? find_gnu(h, name, len, idx, max) : h->sysv ? find_sysv(h, name, len, idx, max) : 0;
	/* ascending (a DT_HASH chain runs from the last symbol of a bucket down) */
	for (size_t i = 1; i < n && i < max; i++)
		for (size_t j = i; j > 0 && idx[j - 1] > idx[j]; j--) {
			size_t t = idx[j];

			idx[j] = idx[j - 1];
			idx[j - 1] = t;
		}
	return n;
}

int symhash_imports(const struct symhash *h, const char *name)
{
	size_t idx[16], n = symhash_find(h, name, idx, 16), len = strlen(name), end;
	int undef = 0;

	for (size_t i = 0; i < n && i < 16; i++) {
		if (h->syms[idx[i]].st_shndx != SHN_UNDEF)
			return 0; /* it defines it */
		undef = 1;
	}
	if (undef || !h->gnu || h->gnuwords < 4)
		return undef;
	/* DT_GNU_HASH leaves the undefined symbols out, before symoffset */
	end = h->gnu[1] < h->nsyms ? h->gnu[1] : h->nsyms;
	for (size_t i = 1; i < end; i++)
		if (h->syms[i].st_shndx == SHN_UNDEF && named(h, i, name, len))
			return 1;
	return 0;
}
