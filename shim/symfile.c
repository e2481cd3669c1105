/* SPDX-License-Identifier: MIT */
/*
 * symfile.c - reading .symtab from an ELF file (see symfile.h).
 *
 * Every offset and size read from the file is checked against the mapping
 * before use: a truncated or hostile file yields "no symbols", never a
 * fault.
 */
#include "symfile.h"

#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if __SIZEOF_POINTER__ == 8
#define ELF_CLASS ELFCLASS64
#else
#define ELF_CLASS ELFCLASS32
#endif

/* Returns whether [off, off + len) lies inside the mapping. */
static int inside(const struct symfile *f, size_t off, size_t len)
{
	return off <= f->size && len <= f->size - off;
}

int symfile_open(struct symfile *f, const char *path)
{
	const ElfW(Ehdr) *eh;
	const ElfW(Shdr) *sh;
	struct stat st;
	int fd, e;

	memset(f, 0, sizeof(*f));
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	if (fstat(fd, &st) != 0 || st.st_size < (off_t)sizeof(*eh)) {
		e = errno ? errno : ENOEXEC;
		close(fd);
		return -e;
	}
	f->size = (size_t)st.st_size;
	f->map = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
	close(fd);
	if (f->map == MAP_FAILED) {
		f->map = NULL;
		return -errno;
	}
	eh = f->map;
	if (memcmp(eh->e_ident, ELFMAG, SELFMAG) != 0 || eh->e_ident[EI_CLASS] != ELF_CLASS ||
	    eh->e_shentsize != sizeof(*sh) ||
	    !inside(f, eh->e_shoff, (size_t)eh->e_shnum * sizeof(*sh))) {
		symfile_close(f);
		return -ENOEXEC;
	}
	sh = (const ElfW(Shdr) *)((const char *)f->map + eh->e_shoff);
	for (int i = 0; i < eh->e_shnum; i++) {
		const ElfW(Shdr) *str;

		if (sh[i].sh_type != SHT_SYMTAB || sh[i].sh_link >= eh->e_shnum)
			continue;
		str = &sh[sh[i].sh_link];
		if (!inside(f, sh[i].sh_offset, sh[i].sh_size) ||
		    !inside(f, str->sh_offset, str->sh_size) || str->sh_size == 0)
			break;
		f->syms = (const ElfW(Sym) *)((const char *)f->map + sh[i].sh_offset);
		f->nsyms = sh[i].sh_size / sizeof(ElfW(Sym));
		f->strs = (const char *)f->map + str->sh_offset;
		f->strsz = str->sh_size;
		break;
	}
	return 0;
}

void symfile_close(struct symfile *f)
{
	if (f->map)
		munmap(f->map, f->size);
	memset(f, 0, sizeof(*f));
}

const ElfW(Sym) *symfile_find_function(const struct symfile *f, const char *name)
{
	size_t len = strlen(name);

	for (size_t i = 0; i < f->nsyms; i++) {
		const ElfW(Sym) *s = &f->syms[i];
		int type = ELF64_ST_TYPE(s->st_info);

		if ((type != STT_FUNC && type != STT_GNU_IFUNC) || s->st_shndx == SHN_UNDEF ||
		    s->st_name >= f->strsz || f->strsz - s->st_name <= len)
			continue;
		if (memcmp(f->strs + s->st_name, name, len + 1) == 0)
			return s;
	}
	return NULL;
}
