/* SPDX-License-Identifier: MIT */
/*
 * sibling.c - libc's families of functions that do one thing under several
 * names, and the start-up report's note about them (see sibling.h).
 *
 * families[] is the one table: a row per family, any name in it a sibling
 * of every other (a name may sit in two rows: unlinkat removes files and
 * directories). Whether a sibling is called is read from the loaded
 * objects' dynamic relocations (PLT, GOT and data words naming it), but the
 * shim's own and the dynamic linker's, as relocation patching would find
 * them: only for a symbol the report found unguarded, so it costs nothing
 * when every lock is caught.
 */
#include "sibling.h"

#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/auxv.h>

#include "log.h"
#include "arch.h"

#define FAMILY_MAX 20 /* names in a row, NULL included */
#define CANDIDATES_MAX 32

static const char *const families[][FAMILY_MAX] = {
	{ "rename", "renameat", "renameat2", NULL },
	{ "open", "open64", "openat", "openat64", "creat", "creat64", "__open_2", "__open64_2",
	  "__openat_2", "__openat64_2", "fopen", "fopen64", NULL },
	{ "stat", "stat64", "lstat", "lstat64", "fstatat", "fstatat64", "newfstatat", "statx",
	  "__xstat", "__xstat64", "__lxstat", "__lxstat64", "__fxstatat", "__fxstatat64", NULL },
	{ "fstat", "fstat64", "__fxstat", "__fxstat64", NULL },
	{ "read", "pread", "pread64", "readv", "preadv", "preadv64", "preadv2", "preadv64v2",
	  "__read_chk", "__pread_chk", "__pread64_chk", NULL },
	{ "write", "pwrite", "pwrite64", "writev", "pwritev", "pwritev64", "pwritev2",
	  "pwritev64v2", NULL },
	{ "fsync", "fdatasync", "sync_file_range", "syncfs", NULL },
	{ "unlink", "unlinkat", NULL },
	{ "rmdir", "unlinkat", NULL },
	{ "link", "linkat", "symlink", "symlinkat", NULL },
	{ "mkdir", "mkdirat", NULL },
	{ "mknod", "mknodat", "__xmknod", "__xmknodat", "mkfifo", "mkfifoat", NULL },
	{ "chmod", "fchmodat", "lchmod", NULL },
	{ "chown", "fchownat", "lchown", NULL },
	{ "truncate", "truncate64", "ftruncate", "ftruncate64", NULL },
	{ "access", "faccessat", "euidaccess", "eaccess", NULL },
	{ "readlink", "readlinkat", "__readlink_chk", "__readlinkat_chk", NULL },
	{ "utime", "utimes", "lutimes", "futimes", "futimesat", "utimensat", "futimens", NULL },
};

/* The siblings asked about, and which of them some object calls. */
struct candidates {
	const char *name[CANDIDATES_MAX];
	int called[CANDIDATES_MAX];
	int n;
	uintptr_t self, rtld;
};

/* Adds the siblings of sym that no lock of cfg guards to c, once each. */
static void collect(const struct conf *cfg, const char *sym, struct candidates *c)
{
	for (size_t f = 0; f < sizeof(families) / sizeof(*families); f++) {
		int in = 0;

		for (int i = 0; families[f][i] && !in; i++)
			in = !strcmp(families[f][i], sym);
		for (int i = 0; in && families[f][i] && c->n < CANDIDATES_MAX; i++) {
			int dup = conf_find(cfg, families[f][i]) != NULL;

			for (int k = 0; k < c->n && !dup; k++)
				dup = !strcmp(c->name[k], families[f][i]);
			if (!dup)
				c->name[c->n++] = families[f][i];
		}
	}
}

static uintptr_t dyn_addr(uintptr_t base, ElfW(Addr) v)
{
	return v < base ? v + base : v;
}

/* Marks in c the candidates the relocations [rela, rela + sz) name. */
static void mark(struct candidates *c, uintptr_t rela, size_t sz, const ElfW(Sym) *symtab,
		 const char *strtab, size_t strsz)
{
	const ElfW(Rela) *r = (const ElfW(Rela) *)rela;

	for (size_t i = 0; rela && i < sz / sizeof(*r); i++) {
		size_t si = ELF64_R_SYM(r[i].r_info);
		const char *name;

		if (si == 0 || arch_reloc_kind((unsigned)ELF64_R_TYPE(r[i].r_info)) == RELOC_OTHER ||
		    symtab[si].st_name >= strsz || symtab[si].st_shndx != SHN_UNDEF)
			continue;
		name = strtab + symtab[si].st_name;
		for (int k = 0; k < c->n; k++)
			if (!c->called[k] && !strcmp(c->name[k], name))
				c->called[k] = 1;
	}
}

/* dl_iterate_phdr's callback: marks the candidates one object calls. */
static int scan_object(struct dl_phdr_info *info, size_t size, void *data)
{
	struct candidates *c = data;
	uintptr_t base = info->dlpi_addr, jmprel = 0, rela = 0;
	size_t pltsz = 0, relasz = 0, strsz = 0;
	const ElfW(Dyn) *dyn = NULL;
	const ElfW(Sym) *symtab = NULL;
	const char *strtab = NULL, *name = info->dlpi_name ? info->dlpi_name : "";

	(void)size;
	if (base == c->self || (c->rtld && base == c->rtld) || !strncmp(name, "linux-vdso", 10))
		return 0;
	for (int i = 0; i < info->dlpi_phnum; i++)
		if (info->dlpi_phdr[i].p_type == PT_DYNAMIC)
			dyn = (const ElfW(Dyn) *)(base + info->dlpi_phdr[i].p_vaddr);
	for (; dyn && dyn->d_tag != DT_NULL; dyn++) {
		switch (dyn->d_tag) {
		case DT_SYMTAB: symtab = (const ElfW(Sym) *)dyn_addr(base, dyn->d_un.d_ptr); break;
		case DT_STRTAB: strtab = (const char *)dyn_addr(base, dyn->d_un.d_ptr); break;
		case DT_STRSZ: strsz = dyn->d_un.d_val; break;
		case DT_JMPREL: jmprel = dyn_addr(base, dyn->d_un.d_ptr); break;
		case DT_PLTRELSZ: pltsz = dyn->d_un.d_val; break;
		case DT_RELA: rela = dyn_addr(base, dyn->d_un.d_ptr); break;
		case DT_RELASZ: relasz = dyn->d_un.d_val; break;
		}
	}
	if (symtab && strtab) {
		mark(c, jmprel, pltsz, symtab, strtab, strsz);
		mark(c, rela, relasz, symtab, strtab, strsz);
	}
	return 0;
}

/* Appends the formatted text to why (len bytes, NUL-terminated), cut at its end. */
__attribute__((format(printf, 3, 4)))
static void append(char *why, size_t len, const char *fmt, ...)
{
	size_t k = strlen(why);
	va_list ap;

	if (k + 1 >= len)
		return;
	va_start(ap, fmt);
	vsnprintf(why + k, len - k, fmt, ap);
	va_end(ap);
}

/* Returns 1 when l's key template has an argument placeholder ({argN}). */
static int key_reads_args(const struct lock_spec *l)
{
	for (int i = 0; i < l->key.nsegs; i++)
		if (l->key.segs[i].kind == KEY_SEG_ARG)
			return 1;
	return 0;
}

/* Returns the first other symbol of l's lock that caught says a method
 * caught, or NULL. */
static const char *caught_member(const struct conf *cfg, const struct lock_spec *l,
				 int (*caught)(const char *symbol))
{
	for (int i = 0; i < cfg->nlocks; i++) {
		const struct lock_spec *m = &cfg->locks[i];

		if (m->index == l->index && m != l && caught(m->symbol))
			return m->symbol;
	}
	return NULL;
}

int sibling_note(const struct conf *cfg, const struct lock_spec *l,
		 int (*caught)(const char *symbol), char *why, size_t len, int level)
{
	struct candidates c = { .n = 0 };
	const char *member, *sep = "";
	Dl_info di;
	int called = 0;

	collect(cfg, l->symbol, &c);
	if (c.n) {
		if (dladdr((void *)sibling_note, &di))
			c.self = (uintptr_t)di.dli_fbase;
		c.rtld = getauxval(AT_BASE);
		dl_iterate_phdr(scan_object, &c);
	}
	for (int k = 0; k < c.n; k++)
		called += c.called[k];
	if (!called) {
		if (!(member = caught_member(cfg, l, caught)))
			return level;
		append(why, len, "; the lock guards %s, which the program calls", member);
		return SIBLING_COVERED;
	}
	append(why, len, "; the program calls ");
	for (int k = 0, i = 0; k < c.n; k++) {
		if (!c.called[k])
			continue;
		append(why, len, "%s%s", i == 0 ? "" : i + 1 == called ? " and " : ", ",
		       c.name[k]);
		i++;
	}
	append(why, len, " (%s): guard %s too with symbols = (", called == 1 ? "a sibling" :
	       "siblings", called == 1 ? "it" : "them");
	for (int i = 0; l->symbols ? l->symbols[i] != NULL : i == 0; i++, sep = ",")
		append(why, len, "%s \"%s\"", sep, l->symbols ? l->symbols[i] : l->symbol);
	for (int k = 0; k < c.n; k++) {
		if (c.called[k]) {
			append(why, len, "%s \"%s\"", sep, c.name[k]);
			sep = ",";
		}
	}
	append(why, len, " )%s", key_reads_args(l) ? " (their arguments differ: check that "
	       "the key's {argN} names the same value in each)" : "");
	return LOG_WARN;
}
