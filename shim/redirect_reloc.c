/* SPDX-License-Identifier: MIT */
/*
 * redirect_reloc.c - redirection by relocation patching.
 *
 * Walks every loaded object but the shim itself and the dynamic linker, and
 * rewrites the slots that relocations naming a configured symbol filled in:
 * JUMP_SLOT (PLT calls), GLOB_DAT (-fno-plt calls, &f in PIC code) and
 * symbol-named absolute words with addend 0 (function pointers in data).
 * Each slot gets the stub of the hook for (lock, the slot's own target), so
 * symbol versions and RTLD_LOCAL copies keep their own real function. A lazy
 * PLT slot not yet bound is resolved with dlsym first. RELRO pages are made
 * writable for the store and restored. Slots already pointing at a stub or
 * an internal wrapper are left alone, so a rescan after dlopen is cheap.
 * Calls inside one object never pass through a slot and cannot be caught.
 */
#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/mman.h>
#include <unistd.h>

#include "hook.h"
#include "log.h"
#include "redirect.h"
#include "tramp.h"

struct obj {
	uintptr_t base, lo, hi;         /* load bias; mapped range */
	uintptr_t relro_lo, relro_hi;
	const char *name;
	const ElfW(Sym) *symtab;
	const char *strtab;
	size_t strsz;
};

struct scan {
	const struct config *cfg;
	uintptr_t self, rtld;
	int count;
	int *per_lock; /* call sites found per lock, first scan only */
};

static uintptr_t dyn_addr(const struct obj *o, ElfW(Addr) v)
{
	return v < o->base ? v + o->base : v;
}

/* Stores val in *slot, lifting RELRO protection when needed. */
static int write_slot(const struct obj *o, void **slot, void *val)
{
	uintptr_t a = (uintptr_t)slot;
	size_t pg = (size_t)sysconf(_SC_PAGESIZE);
	void *start = (void *)(a & ~(pg - 1));
	int relro = a >= o->relro_lo && a < o->relro_hi;

	if (relro && mprotect(start, pg, PROT_READ | PROT_WRITE) != 0) {
		LOG(LOG_ERROR, "%s: cannot unprotect RELRO slot at %p", o->name, (void *)slot);
		return -1;
	}
	__atomic_store_n(slot, val, __ATOMIC_RELEASE);
	if (relro)
		mprotect(start, pg, PROT_READ);
	return 0;
}

/* Returns the function a lazy slot of o will bind name to, or NULL. */
static void *resolve_lazy(const struct obj *o, const char *name)
{
	void *p = dlsym(RTLD_DEFAULT, name), *h;

	if (p)
		return p;
	h = dlopen(o->name, RTLD_LAZY | RTLD_NOLOAD);
	if (h) {
		p = dlsym(h, name);
		dlclose(h);
	}
	return p;
}

/* Redirects one relocation of o if it names a configured symbol. */
static void patch_rela(struct scan *sc, const struct obj *o, const ElfW(Rela) *r)
{
	int kind = arch_reloc_kind((unsigned)ELF64_R_TYPE(r->r_info));
	size_t si = ELF64_R_SYM(r->r_info);
	const ElfW(Sym) *sym;
	const struct lock_spec *spec;
	const char *name;
	void **slot, *cur, *target;
	struct hook *h;

	if (kind == RELOC_OTHER || si == 0 || (kind == RELOC_ABS64 && r->r_addend))
		return;
	sym = &o->symtab[si];
	if (sym->st_name >= o->strsz || ELF64_ST_TYPE(sym->st_info) == STT_OBJECT ||
	    ELF64_ST_TYPE(sym->st_info) == STT_TLS)
		return;
	name = o->strtab + sym->st_name;
	slot = (void **)(o->base + r->r_offset);
	target = interpose_lookup(name);
	spec = target ? NULL : config_find(sc->cfg, name);
	if (!target && !spec)
		return;
	cur = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
	if (cur == target || hook_by_stub(cur))
		return;
	if (spec) {
		if (kind == RELOC_JUMP_SLOT && (uintptr_t)cur >= o->lo &&
		    (uintptr_t)cur < o->hi)
			cur = resolve_lazy(o, name);
		if (!cur)
			return; /* weak and undefined: nothing to call */
		if (sc->per_lock)
			sc->per_lock[spec->index]++;
		if (!(h = hook_get(spec, cur)))
			return;
		target = h->stub;
	}
	if (write_slot(o, slot, target) == 0) {
		sc->count++;
		LOG(LOG_DEBUG, "%s: %s slot of %s redirected", o->name[0] ? o->name : "(main)",
		    kind == RELOC_JUMP_SLOT ? "PLT" : kind == RELOC_GLOB_DAT ? "GOT" : "data",
		    name);
	}
}

static void patch_table(struct scan *sc, const struct obj *o, uintptr_t rela, size_t sz)
{
	const ElfW(Rela) *r = (const ElfW(Rela) *)rela;

	for (size_t i = 0; rela && i < sz / sizeof(*r); i++)
		patch_rela(sc, o, &r[i]);
}

static int scan_object(struct dl_phdr_info *info, size_t size, void *data)
{
	struct scan *sc = data;
	struct obj o = { .base = info->dlpi_addr, .lo = UINTPTR_MAX,
			 .name = info->dlpi_name ? info->dlpi_name : "" };
	const ElfW(Dyn) *dyn = NULL;
	uintptr_t jmprel = 0, rela = 0;
	size_t pltsz = 0, relasz = 0;

	(void)size;
	if (o.base == sc->self || (sc->rtld && o.base == sc->rtld) ||
	    strncmp(o.name, "linux-vdso", 10) == 0 || strncmp(o.name, "linux-gate", 10) == 0)
		return 0;
	for (int i = 0; i < info->dlpi_phnum; i++) {
		const ElfW(Phdr) *p = &info->dlpi_phdr[i];
		uintptr_t a = o.base + p->p_vaddr;

		if (p->p_type == PT_LOAD) {
			if (a < o.lo)
				o.lo = a;
			if (a + p->p_memsz > o.hi)
				o.hi = a + p->p_memsz;
		} else if (p->p_type == PT_DYNAMIC) {
			dyn = (const ElfW(Dyn) *)a;
		} else if (p->p_type == PT_GNU_RELRO) {
			o.relro_lo = a;
			o.relro_hi = a + p->p_memsz;
		}
	}
	if (!dyn)
		return 0;
	for (; dyn->d_tag != DT_NULL; dyn++) {
		switch (dyn->d_tag) {
		case DT_SYMTAB: o.symtab = (const ElfW(Sym) *)dyn_addr(&o, dyn->d_un.d_ptr); break;
		case DT_STRTAB: o.strtab = (const char *)dyn_addr(&o, dyn->d_un.d_ptr); break;
		case DT_STRSZ: o.strsz = dyn->d_un.d_val; break;
		case DT_JMPREL: jmprel = dyn_addr(&o, dyn->d_un.d_ptr); break;
		case DT_PLTRELSZ: pltsz = dyn->d_un.d_val; break;
		case DT_RELA: rela = dyn_addr(&o, dyn->d_un.d_ptr); break;
		case DT_RELASZ: relasz = dyn->d_un.d_val; break;
		}
	}
	if (!o.symtab || !o.strtab)
		return 0;
	patch_table(sc, &o, jmprel, pltsz);
	patch_table(sc, &o, rela, relasz);
	return 0;
}

/* Returns nonzero when addr lies in the main executable. */
static int in_executable(void *addr)
{
	struct link_map *lm = NULL;
	Dl_info di;

	return dladdr1(addr, &di, (void **)&lm, RTLD_DL_LINKMAP) && lm && !lm->l_prev;
}

/* Says, once, which guarded symbols have no call site it can redirect. */
static void report_uncaught(const struct config *cfg, const int *per_lock)
{
	for (int i = 0; i < cfg->nlocks; i++) {
		const char *sym = cfg->locks[i].symbol;
		void *p;

		if (per_lock[i])
			continue;
		p = dlsym(RTLD_DEFAULT, sym);
		if (p && in_executable(p))
			LOG(LOG_WARN, "%s is defined in the executable and no loaded "
			    "object calls it through a relocation: calls inside the "
			    "executable cannot be caught", sym);
		else
			LOG(LOG_INFO, "%s: no call site in the loaded objects yet "
			    "(libraries loaded later with dlopen are scanned then)", sym);
	}
}

static int reloc_scan(const struct config *cfg)
{
	static int first = 1;
	Dl_info di;
	struct scan sc = { cfg, 0, getauxval(AT_BASE), 0, NULL };

	if (dladdr((void *)reloc_scan, &di))
		sc.self = (uintptr_t)di.dli_fbase;
	if (first && cfg->nlocks)
		sc.per_lock = calloc((size_t)cfg->nlocks, sizeof(int));
	dl_iterate_phdr(scan_object, &sc);
	if (sc.per_lock)
		report_uncaught(cfg, sc.per_lock);
	free(sc.per_lock);
	first = 0;
	return sc.count;
}

const struct redirect_method redirect_reloc = { "relocations", reloc_scan };
