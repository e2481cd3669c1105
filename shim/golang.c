/* SPDX-License-Identifier: MIT */
/*
 * golang.c - Go executables: only their cgo calls reach libc (golang.h).
 *
 * The Go linker writes the build information into every executable it
 * makes, linked internally or by the C linker (cgo), stripped or not: a
 * 16-byte-aligned blob that begins "\xff Go buildinf:" at the start of the
 * writable section .go.buildinfo (Go's debug/buildinfo reads it there).
 * It is looked for once, in memory, in the writable PT_LOAD segments of
 * the main executable (no file is opened: strip and section-less files
 * keep it); a Go 1.18+ blob also names the toolchain (flag 2: the version
 * string inline after the 32-byte header). A cgo call site of a libc
 * function is a relocation naming it in a loaded object other than libc,
 * the shim and the dynamic linker: what relocation or entry patching
 * guards. Only the report asks, in the constructor; nothing allocates.
 */
#include "golang.h"

#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/auxv.h>

static const unsigned char magic[14] = "\xff Go buildinf:";
static int looked;           /* the executable and libc were looked for */
static int is_go;            /* the executable holds Go's build information */
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

/* Returns whether a 16-byte-aligned blob in [lo, hi) starts with magic; it
 * reads the executable's data, which is no object of an instrumented
 * build's own. */
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

/* dl_iterate_phdr: the first object is the executable; libc is the one
 * whose file name begins "libc.so". */
static int look_at(struct dl_phdr_info *info, size_t size, void *data)
{
	const char *name = info->dlpi_name ? info->dlpi_name : "", *base = strrchr(name, '/');
	int *first = data;

	(void)size;
	for (int i = 0; *first && i < info->dlpi_phnum && !is_go; i++) {
		const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
		uintptr_t lo = info->dlpi_addr + ph->p_vaddr;
		const unsigned char *blob;

		if (ph->p_type != PT_LOAD || (ph->p_flags & (PF_W | PF_X)) != PF_W)
			continue;
		if ((blob = find_blob(lo, lo + ph->p_filesz))) {
			is_go = 1;
			read_version(blob, (const unsigned char *)(lo + ph->p_filesz));
		}
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

struct sites {
	const char *name;
	uintptr_t self, rtld;
	int count;
};

static uintptr_t dyn_addr(uintptr_t base, ElfW(Addr) v)
{
	return v < base ? v + base : v;
}

/* dl_iterate_phdr: counts the relocations naming an undefined s->name in
 * each object but libc, the shim, the dynamic linker and the vDSO. */
static int count_sites(struct dl_phdr_info *info, size_t size, void *data)
{
	struct sites *s = data;
	uintptr_t b = info->dlpi_addr, tab[2] = { 0, 0 };
	size_t sz[2] = { 0, 0 }, strsz = 0;
	const ElfW(Sym) *sym = NULL;
	const ElfW(Dyn) *dyn = NULL;
	const char *str = NULL, *name = info->dlpi_name ? info->dlpi_name : "";

	(void)size;
	if (b == libc_base || b == s->self || (s->rtld && b == s->rtld) ||
	    strncmp(name, "linux-", 6) == 0)
		return 0;
	for (int i = 0; i < info->dlpi_phnum; i++)
		if (info->dlpi_phdr[i].p_type == PT_DYNAMIC)
			dyn = (const ElfW(Dyn) *)(b + info->dlpi_phdr[i].p_vaddr);
	for (; dyn && dyn->d_tag != DT_NULL; dyn++) {
		switch (dyn->d_tag) {
		case DT_SYMTAB: sym = (const ElfW(Sym) *)dyn_addr(b, dyn->d_un.d_ptr); break;
		case DT_STRTAB: str = (const char *)dyn_addr(b, dyn->d_un.d_ptr); break;
		case DT_STRSZ: strsz = dyn->d_un.d_val; break;
		case DT_JMPREL: tab[0] = dyn_addr(b, dyn->d_un.d_ptr); break;
		case DT_PLTRELSZ: sz[0] = dyn->d_un.d_val; break;
		case DT_RELA: tab[1] = dyn_addr(b, dyn->d_un.d_ptr); break;
		case DT_RELASZ: sz[1] = dyn->d_un.d_val; break;
		}
	}
	for (int t = 0; sym && str && t < 2; t++) {
		const ElfW(Rela) *r = (const ElfW(Rela) *)tab[t];

		for (size_t i = 0; r && i < sz[t] / sizeof(*r); i++) {
			const ElfW(Sym) *y = &sym[ELF64_R_SYM(r[i].r_info)];

			if (ELF64_R_SYM(r[i].r_info) && y->st_shndx == SHN_UNDEF &&
			    y->st_name < strsz && strcmp(str + y->st_name, s->name) == 0)
				s->count++;
		}
	}
	return 0;
}

int golang_why(const char *name, char *why, size_t len)
{
	struct sites s = { name, 0, getauxval(AT_BASE), 0 };
	const char *v1 = "", *v2 = "";
	Dl_info di;
	int first = 1;

	if (!looked) {
		looked = 1;
		dl_iterate_phdr(look_at, &first);
	}
	if (!is_go || !libc_defines(name))
		return GOLANG_NOT;
	if (version[0]) {
		v1 = " (";
		v2 = ")";
	}
	if (dladdr((void *)golang_why, &di))
		s.self = (uintptr_t)di.dli_fbase;
	dl_iterate_phdr(count_sites, &s);
	if (!s.count) {
		snprintf(why, len, "%s is libc's and this is a Go program%s%s%s: Go makes system "
			 "calls directly, not through libc, and only its cgo calls reach libc; "
			 "no loaded object but libc calls %s", name, v1, version, v2, name);
		return GOLANG_UNGUARDED;
	}
	snprintf(why, len, "%s: cgo calls only: this is a Go program%s%s%s: Go makes system "
		 "calls directly, not through libc, and only its cgo calls reach libc; %d call "
		 "site%s outside libc %s guarded", name, v1, version, v2, s.count,
		 s.count == 1 ? "" : "s", s.count == 1 ? "is" : "are");
	return GOLANG_CGO_ONLY;
}
