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

/* Returns the contents of the section named name (its size in *size), or
 * NULL when the file has none or it lies outside the file (NOBITS). */
const void *symfile_section(const struct symfile *f, const char *name, size_t *size);

/*
 * Writes the GNU build-id found in the notes of the ELF image at notes
 * (len bytes: a PT_NOTE segment or SHT_NOTE section) into hex (lowercase,
 * NUL-terminated; hexlen >= 2 * 64 + 1). Returns 1 when found, else 0.
 */
int symfile_note_build_id(const void *notes, size_t len, char *hex, size_t hexlen);

/* The same for the file's SHT_NOTE sections. */
int symfile_build_id(const struct symfile *f, char *hex, size_t hexlen);

#endif
