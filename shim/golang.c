/* SPDX-License-Identifier: MIT */
/*
 * golang.c - Go executables: only their cgo calls reach libc (golang.h).
 *
 * A Go executable is known by the note the go command always has its
 * linker write, owner "Go", type 4 (the build ID, .note.go.buildid), in a
 * PT_NOTE segment: read in memory, so other programs cost no file access.
 * Its toolchain comes from the build information, a 16-byte-aligned blob
 * beginning "\xff Go buildinf:" in the writable section .go.buildinfo,
 * which strip keeps (Go's debug/buildinfo): by that section of
 * /proc/self/exe, or, when the file has no section headers, in memory in
 * the executable's writable PT_LOAD segments (a Go 1.18+ blob names the
 * toolchain: flag 2, inline after the 32-byte header). A cgo call site is a relocation naming the
 * function in the executable or a library it needs (DT_NEEDED, directly or
 * not), libc aside: not a sanitizer runtime preloaded with the shim, nor
 * its libraries. Only the start-up report asks; static tables, no malloc.
 */
#include "golang.h"

#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/auxv.h>

#include "symfile.h"

static const unsigned char magic[14] = "\xff Go buildinf:";
static int looked;           /* the executable and libc were looked for */
static int is_go;            /* the executable has Go's build-ID note */
static int scan_memory;      /* its file told nothing: search its memory */
static char version[40];     /* "go1.19.8", or "" when the blob names none */
static uintptr_t libc_base;  /* libc's load bias, 0 when not found */
static const char *libc_name;

/* Copies the version string of a Go 1.18+ blob at p (end: the end of the
 * readable segment) into version; leaves it empty otherwise. */
static void read_version(const unsigned char *p, const unsigned char *end)
{
	uint64_t n = 0;
	int shift = 0;

	if (end - p < 33 || !(p[15] & 2))
		return;
	for (p += 32; p < end && shift < 64; shift += 7) {
		n |= (uint64_t)(*p & 0x7f) << shift;
		if (!(*p++ & 0x80))
			break;
	}
	if (!n || n >= sizeof(version) || (uint64_t)(end - p) < n)
		return;
	for (uint64_t i = 0; i < n; i++)
		if (p[i] <= ' ' || p[i] > '~')
			return;
	memcpy(version, p, n);
	version[n] = 0;
}

/* Returns the first 16-byte-aligned address in [lo, hi) where magic
 * starts, or NULL. It reads the executable's data, no object of an
 * instrumented build's own: not checked by AddressSanitizer. */
__attribute__((no_sanitize_address))
static const unsigned char *find_blob(uintptr_t lo, uintptr_t hi)
{
	for (uintptr_t a = (lo + 15) & ~(uintptr_t)15; a + 32 <= hi; a += 16) {
		const unsigned char *p = (const unsigned char *)a;
		size_t i = 0;

		while (i < sizeof(magic) && p[i] == magic[i])
			i++;
		if (i == sizeof(magic))
			return p;
	}
	return NULL;
}

/* Looks for the build information in the executable's file: its section
 * .go.buildinfo, beginning with magic. Sets scan_memory when the file
 * cannot be read or has no section headers. */
static void look_at_file(void)
{
	const unsigned char *blob;
	struct symfile f;
	size_t size = 0;

	if (symfile_open(&f, "/proc/self/exe") != 0) {
		scan_memory = 1;
		return;
	}
	scan_memory = ((const ElfW(Ehdr) *)f.map)->e_shnum == 0;
	blob = symfile_section(&f, ".go.buildinfo", &size);
	if (blob && size >= 32 && memcmp(blob, magic, sizeof(magic)) == 0)
		read_version(blob, blob + size);
	symfile_close(&f);
}

/* Returns whether the PT_NOTE segment ph of an object at base holds Go's
 * build-ID note (owner "Go", type 4). */
static int go_note(uintptr_t base, const ElfW(Phdr) *ph)
{
	const unsigned char *p = (const unsigned char *)(base + ph->p_vaddr), *end = p + ph->p_filesz;
	size_t align = ph->p_align == 8 ? 8 : 4;

	while ((size_t)(end - p) >= sizeof(ElfW(Nhdr))) {
		const ElfW(Nhdr) *n = (const ElfW(Nhdr) *)p;
		size_t name = (n->n_namesz + align - 1) & ~(align - 1);
		size_t desc = (n->n_descsz + align - 1) & ~(align - 1);

		if (n->n_type == 4 && (n->n_namesz == 3 || n->n_namesz == 4) &&
		    memcmp(n + 1, "Go", 3) == 0) /* Go pads its name: 4 */
			return 1;
		if (name > (size_t)(end - p) || desc > (size_t)(end - p) - name ||
		    sizeof(*n) > (size_t)(end - p) - name - desc)
			return 0;
		p += sizeof(*n) + name + desc;
	}
	return 0;
}

/* dl_iterate_phdr: the first object is the executable (its notes, and its
 * writable segments when scan_memory asks); libc is the one whose file
 * name begins "libc.so". */
static int look_at(struct dl_phdr_info *info, size_t size, void *data)
{
	const char *name = info->dlpi_name ? info->dlpi_name : "", *base = strrchr(name, '/');
	int *first = data;

	(void)size;
	for (int i = 0; *first && i < info->dlpi_phnum; i++) {
		const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
		uintptr_t lo = info->dlpi_addr + ph->p_vaddr;
		const unsigned char *blob;

		if (ph->p_type == PT_NOTE && !is_go)
			is_go = go_note(info->dlpi_addr, ph);
		if (!scan_memory || version[0] || ph->p_type != PT_LOAD ||
		    (ph->p_flags & (PF_W | PF_X)) != PF_W)
			continue;
		if ((blob = find_blob(lo, lo + ph->p_filesz)))
			read_version(blob, (const unsigned char *)(lo + ph->p_filesz));
	}
	*first = 0;
	base = base ? base + 1 : name;
	if (!libc_name && strncmp(base, "libc.so", 7) == 0) {
		libc_name = name;
		libc_base = info->dlpi_addr;
	}
	return 0;
}

/* Returns whether libc itself defines name. */
static int libc_defines(const char *name)
{
	void *h = libc_name ? dlopen(libc_name, RTLD_LAZY | RTLD_NOLOAD) : NULL, *p;
	struct link_map *lm = NULL;
	Dl_info di;
	int own;

	if (!h)
		return 0;
	p = dlsym(h, name);
	own = p && dladdr1(p, &di, (void **)&lm, RTLD_DL_LINKMAP) && lm &&
	      lm->l_addr == libc_base;
	dlclose(h);
	return own;
}

#define OBJS_MAX 512

/* A loaded object, for the cgo call sites: its dynamic section read once. */
struct obj {
	uintptr_t base;
	const char *path, *soname, *str;
	const ElfW(Dyn) *dyn;
	const ElfW(Sym) *sym;
	size_t strsz;
	int linked;     /* the executable or a library it needs, directly or not */
};

static struct obj objs[OBJS_MAX];
static int nobjs;

static uintptr_t dyn_addr(uintptr_t base, ElfW(Addr) v)
{
	return v < base ? v + base : v;
}

/* dl_iterate_phdr: records each object but the shim, the dynamic linker
 * and the vDSO (data: the shim's base), with its symbols and names. */
static int record(struct dl_phdr_info *info, size_t size, void *data)
{
	struct obj *o = &objs[nobjs];
	const char *name = info->dlpi_name ? info->dlpi_name : "";
	uintptr_t rtld = getauxval(AT_BASE);
	size_t soname = 0;

	(void)size;
	if (nobjs == OBJS_MAX || info->dlpi_addr == *(uintptr_t *)data ||
	    (rtld && info->dlpi_addr == rtld) || strncmp(name, "linux-", 6) == 0)
		return 0;
	memset(o, 0, sizeof(*o));
	o->base = info->dlpi_addr;
	o->path = name;
	o->linked = nobjs == 0; /* the first object is the executable */
	for (int i = 0; i < info->dlpi_phnum; i++)
		if (info->dlpi_phdr[i].p_type == PT_DYNAMIC)
			o->dyn = (const ElfW(Dyn) *)(o->base + info->dlpi_phdr[i].p_vaddr);
	for (const ElfW(Dyn) *d = o->dyn; d && d->d_tag != DT_NULL; d++) {
		if (d->d_tag == DT_SYMTAB)
			o->sym = (const ElfW(Sym) *)dyn_addr(o->base, d->d_un.d_ptr);
		else if (d->d_tag == DT_STRTAB)
			o->str = (const char *)dyn_addr(o->base, d->d_un.d_ptr);
		else if (d->d_tag == DT_STRSZ)
			o->strsz = d->d_un.d_val;
		else if (d->d_tag == DT_SONAME)
			soname = d->d_un.d_val + 1;
	}
	if (o->str && soname && soname - 1 < o->strsz)
		o->soname = o->str + soname - 1;
	nobjs += o->sym && o->str;
	return 0;
}

/* Returns whether o is what a DT_NEEDED entry naming need loaded. */
static int is_needed(const struct obj *o, const char *need)
{
	const char *base = strrchr(o->path, '/');

	if (strchr(need, '/'))
		return strcmp(o->path, need) == 0;
	return (o->soname && strcmp(o->soname, need) == 0) ||
	       strcmp(base ? base + 1 : o->path, need) == 0;
}

/* Marks the libraries the executable needs, directly or not: what its cgo
 * code may call (not, say, a sanitizer runtime preloaded with the shim, or
 * what that one needs). */
static void mark_linked(void)
{
	for (int changed = 1; changed;) {
		changed = 0;
		for (int i = 0; i < nobjs; i++) {
			for (const ElfW(Dyn) *d = objs[i].dyn; objs[i].linked && d->d_tag != DT_NULL;
			     d++) {
				if (d->d_tag != DT_NEEDED || d->d_un.d_val >= objs[i].strsz)
					continue;
				for (int j = 0; j < nobjs; j++)
					if (!objs[j].linked &&
					    is_needed(&objs[j], objs[i].str + d->d_un.d_val))
						changed = objs[j].linked = 1;
			}
		}
	}
}

/* Returns the relocations naming an undefined name in the objects linked
 * with the executable, libc itself aside. */
static int cgo_sites(const char *name)
{
	int count = 0;

	for (int k = 0; k < nobjs; k++) {
		const struct obj *o = &objs[k];
		uintptr_t tab[2] = { 0, 0 };
		size_t sz[2] = { 0, 0 };

		if (!o->linked || o->base == libc_base)
			continue;
		for (const ElfW(Dyn) *d = o->dyn; d->d_tag != DT_NULL; d++) {
			switch (d->d_tag) {
			case DT_JMPREL: tab[0] = dyn_addr(o->base, d->d_un.d_ptr); break;
			case DT_PLTRELSZ: sz[0] = d->d_un.d_val; break;
			case DT_RELA: tab[1] = dyn_addr(o->base, d->d_un.d_ptr); break;
			case DT_RELASZ: sz[1] = d->d_un.d_val; break;
			}
		}
		for (int t = 0; t < 2; t++) {
			const ElfW(Rela) *r = (const ElfW(Rela) *)tab[t];

			for (size_t i = 0; r && i < sz[t] / sizeof(*r); i++) {
				const ElfW(Sym) *y = &o->sym[ELF64_R_SYM(r[i].r_info)];

				if (ELF64_R_SYM(r[i].r_info) && y->st_shndx == SHN_UNDEF &&
				    y->st_name < o->strsz && strcmp(o->str + y->st_name, name) == 0)
					count++;
			}
		}
	}
	return count;
}

int golang_why(const char *name, char *why, size_t len)
{
	const char *v1 = "", *v2 = "";
	uintptr_t self = 0;
	int first = 1, n;
	Dl_info di;

	if (!looked) {
		looked = 1;
		dl_iterate_phdr(look_at, &first);
		if (is_go) {
			look_at_file();
			first = scan_memory;
			if (scan_memory)
				dl_iterate_phdr(look_at, &first);
			if (dladdr((void *)golang_why, &di))
				self = (uintptr_t)di.dli_fbase;
			dl_iterate_phdr(record, &self);
			mark_linked();
		}
	}
	if (!is_go || !libc_defines(name))
		return GOLANG_NOT;
	if (version[0]) {
		v1 = " (";
		v2 = ")";
	}
	if (!(n = cgo_sites(name))) {
		snprintf(why, len, "%s is libc's and this is a Go program%s%s%s: Go makes system "
			 "calls directly, not through libc, and only its cgo calls reach libc; "
			 "no cgo call site of %s in the program or the libraries it links", name, v1, version, v2, name);
		return GOLANG_UNGUARDED;
	}
	snprintf(why, len, "%s: cgo calls only: this is a Go program%s%s%s: Go makes system "
		 "calls directly, not through libc, and only its cgo calls reach libc; %d call "
		 "site%s outside libc %s guarded", name, v1, version, v2, n, n == 1 ? "" : "s",
		 n == 1 ? "is" : "are");
	return GOLANG_CGO_ONLY;
}
