/* SPDX-License-Identifier: MIT */
/*
 * symfile.h - the static symbol table (.symtab) of an ELF file on disk.
 *
 * The dynamic symbols of a loaded object name only what it exports; a
 * legacy executable's own functions are usually only in the .symtab of its
 * file (unless it was stripped). The file is mapped read-only, checked, and
 * searched without allocating.
 */
#ifndef LOCKSHIM_SYMFILE_H
#define LOCKSHIM_SYMFILE_H

#include <link.h>
#include <stddef.h>

struct symfile {
	void *map;
	size_t size;
	const ElfW(Sym) *syms; /* NULL when the file has no .symtab (stripped) */
	size_t nsyms;
	const char *strs;
	size_t strsz;
};

/* Maps path. Returns 0 (f->syms NULL when there is no .symtab), or -errno
 * (-ENOEXEC: not an ELF file of this machine's class). Release with
 * symfile_close. */
int symfile_open(struct symfile *f, const char *path);

void symfile_close(struct symfile *f);

/* Returns the defined function (or IFUNC) named name, or NULL. */
const ElfW(Sym) *symfile_find_function(const struct symfile *f, const char *name);

#endif
