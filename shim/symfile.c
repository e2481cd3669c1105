/* SPDX-License-Identifier: MIT */
/*
 * symfile.c - reading .symtab from an ELF file (see symfile.h).
 *
 * Every offset and size read from the file is checked against the mapping
 * before use: a truncated or hostile file yields "no symbols", never a
 * fault. Also: a section by name (.gnu_debuglink) and the GNU build-id,
 * from a file's note sections or from a loaded object's note segment.
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
		    s->st_name >= f->strsz || f->strsz - s->st_name <= len ||
		    f->strs[s->st_name] != name[0])
			continue; /* (the first byte spares most calls of memcmp) */
		if (memcmp(f->strs + s->st_name, name, len + 1) == 0)
			return s;
	}
	return NULL;
}

/* Returns the section headers of f, or NULL (checked by symfile_open). */
static const ElfW(Shdr) *sections(const struct symfile *f, int *n)
{
	const ElfW(Ehdr) *eh = f->map;

	if (!eh)
		return NULL;
	*n = eh->e_shnum;
	return (const ElfW(Shdr) *)((const char *)f->map + eh->e_shoff);
}

const void *symfile_section(const struct symfile *f, const char *name, size_t *size)
{
	const ElfW(Ehdr) *eh = f->map;
	const ElfW(Shdr) *sh, *names;
	size_t len = strlen(name);
	int n = 0;

	if (!(sh = sections(f, &n)) || eh->e_shstrndx >= n)
		return NULL;
	names = &sh[eh->e_shstrndx];
	if (!inside(f, names->sh_offset, names->sh_size))
		return NULL;
	for (int i = 0; i < n; i++) {
		if (sh[i].sh_type == SHT_NOBITS || sh[i].sh_name >= names->sh_size ||
		    names->sh_size - sh[i].sh_name <= len ||
		    memcmp((const char *)f->map + names->sh_offset + sh[i].sh_name, name,
			   len + 1) != 0 ||
		    !inside(f, sh[i].sh_offset, sh[i].sh_size))
			continue;
		*size = sh[i].sh_size;
		return (const char *)f->map + sh[i].sh_offset;
	}
	return NULL;
}

int symfile_note_build_id(const void *notes, size_t len, char *hex, size_t hexlen)
{
	const unsigned char *p = notes, *end = p + len;

	while ((size_t)(end - p) >= sizeof(ElfW(Nhdr))) {
		const ElfW(Nhdr) *nh = (const ElfW(Nhdr) *)p;
		size_t name = (nh->n_namesz + 3) & ~(size_t)3, desc = (nh->n_descsz + 3) & ~(size_t)3;
		const unsigned char *d = p + sizeof(*nh) + name;

		if (name > (size_t)(end - p) - sizeof(*nh) ||
		    desc > (size_t)(end - p) - sizeof(*nh) - name)
			return 0;
		if (nh->n_type == NT_GNU_BUILD_ID && nh->n_namesz == 4 &&
		    memcmp(p + sizeof(*nh), "GNU", 4) == 0 && nh->n_descsz > 0 &&
		    2 * (size_t)nh->n_descsz < hexlen) {
			for (size_t i = 0; i < nh->n_descsz; i++) {
				hex[2 * i] = "0123456789abcdef"[d[i] >> 4];
				hex[2 * i + 1] = "0123456789abcdef"[d[i] & 15];
			}
			hex[2 * nh->n_descsz] = 0;
			return 1;
		}
		p = d + desc;
	}
	return 0;
}

int symfile_build_id(const struct symfile *f, char *hex, size_t hexlen)
{
	const ElfW(Shdr) *sh;
	int n = 0;

	if (!(sh = sections(f, &n)))
		return 0;
	for (int i = 0; i < n; i++)
		if (sh[i].sh_type == SHT_NOTE && inside(f, sh[i].sh_offset, sh[i].sh_size) &&
		    symfile_note_build_id((const char *)f->map + sh[i].sh_offset, sh[i].sh_size,
					  hex, hexlen))
			return 1;
	return 0;
}
