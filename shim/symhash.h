/* SPDX-License-Identifier: MIT */
/*
 * symhash.h - a loaded object's dynamic symbols, looked up by name through
 * its hash tables (DT_GNU_HASH, else DT_HASH) as the dynamic linker does:
 * one bucket and its chain per name, whatever the number of symbols, where
 * a walk of every symbol would cost each scan of a 75,000-symbol program
 * milliseconds. Every table is bounded by what the object maps (or by the
 * sizes the caller gives): an index read from a table is checked before
 * use, so a hostile or truncated table yields "not found", never a fault.
 */
#ifndef LOCKSHIM_SYMHASH_H
#define LOCKSHIM_SYMHASH_H

#include <link.h>
#include <stddef.h>
#include <stdint.h>

/* One object's dynamic symbol table and hash table, with their bounds. */
struct symhash {
	const ElfW(Sym) *syms;
	size_t nsyms;            /* entries readable at syms (a bound) */
	const char *strs;
	size_t strsz;            /* bytes readable at strs */
	const uint32_t *gnu;     /* DT_GNU_HASH, or NULL */
	size_t gnuwords;         /* 32-bit words readable at gnu */
	const uint32_t *sysv;    /* DT_HASH (used when there is no gnu), or NULL */
	size_t sysvwords;
};

/*
 * Fills h from the dynamic section of the object loaded at base (its
 * program headers phdr[0..phnum)), each table bounded by the end of the
 * PT_LOAD segment that holds it. Returns 0, or -1 when the object has no
 * symbol table, string table or hash table inside its segments.
 */
int symhash_init(struct symhash *h, uintptr_t base, const ElfW(Phdr) *phdr, int phnum);

/*
 * Writes the indexes of the symbols named name that the hash table reaches
 * (DT_GNU_HASH: the defined ones; DT_HASH: all) into idx[0..max), in
 * ascending order. Returns how many there are (more than max: the first
 * max found are written, unsorted beyond them).
 */
size_t symhash_find(const struct symhash *h, const char *name, size_t *idx, size_t max);

/*
 * Returns 1 when the table has an undefined symbol named name (the object
 * imports it: its own code calls it through a relocation) and no defined
 * one, else 0. With DT_GNU_HASH the undefined symbols are the ones before
 * its first hashed symbol, searched one by one.
 */
int symhash_imports(const struct symhash *h, const char *name);

/* The GNU hash function (DT_GNU_HASH). */
uint32_t symhash_gnu(const char *name);

/* The System V hash function (DT_HASH). */
uint32_t symhash_sysv(const char *name);

#endif
