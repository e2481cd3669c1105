/* SPDX-License-Identifier: MIT */
/*
 * redirect_reloc.c - redirection by relocation patching.
 *
 * Walks every loaded object it has not scanned yet, but the shim itself,
 * the dynamic linker and what a backend module brought in
 * (backend_module.h), and rewrites the slots that relocations naming a
 * configured symbol or an internal wrapper filled in: JUMP_SLOT (PLT
 * calls), GLOB_DAT (-fno-plt calls, &f in PIC code) and symbol-named
 * absolute words with addend 0 (function pointers in data). Names are
 * matched through redirect.c's hash table. Each slot gets the stub of the
 * hook whose target is the function the slot held (redirect_target), so
 * symbol versions and RTLD_LOCAL copies keep their own function. A lazy PLT
 * slot not yet bound is resolved first, as the dynamic linker would bind
 * it: never to a non-PIE executable's canonical PLT entry (the executable's
 * undefined symbol with a value, which dlsym returns for pointer equality);
 * slots of other objects that hold that entry are left alone, since calls
 * through it reach the executable's own redirected slot: every call is
 * wrapped once. RELRO pages are made writable for the store and restored.
 * Objects are remembered by their program headers; after a dlclose
 * everything is scanned again (an address may then be reused).
 * Calls inside one object never pass through a slot and cannot be caught.
 */
#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/mman.h>
#include <unistd.h>

#include "backend_module.h"
#include "hook.h"
#include "log.h"
#include "redirect.h"
#include "arch.h"

struct obj {
	uintptr_t base, lo, hi;         /* load bias; mapped range */
	uintptr_t relro_lo, relro_hi;
	const char *name;
	const ElfW(Sym) *symtab;
	const char *strtab;
	size_t strsz;
};

struct scan {
	uintptr_t self, rtld;
	int count;
};

/* Objects scanned so far, by their program headers; reset after dlclose. */
static const void **seen;
static size_t nseen, capseen;
static unsigned long long seen_subs;

static int was_seen(const void *phdr)
{
	for (size_t i = 0; i < nseen; i++)
		if (seen[i] == phdr)
			return 1;
	return 0;
}

static void remember(const void *phdr)
{
	if (nseen == capseen) {
		size_t cap = capseen ? capseen * 2 : 64;
		const void **p = realloc(seen, cap * sizeof(*p));

		if (!p)
			return; /* scanned again next time: slower, not wrong */
		seen = p;
		capseen = cap;
	}
	seen[nseen++] = phdr;
}

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

/* Returns the function a lazy slot of o will bind n to, or NULL. */
static void *resolve_lazy(const struct obj *o, const struct redirect_name *n)
{
	void *p = dlsym(RTLD_DEFAULT, n->name), *h;

	if (p && p == n->canonical) /* the dynamic linker skips it for PLT slots */
		p = redirect_next_definition(n->canonical, n->name, NULL);
	if (p)
		return p;
	h = dlopen(o->name, RTLD_LAZY | RTLD_NOLOAD);
	if (h) {
		p = dlsym(h, n->name);
		dlclose(h);
	}
	return p;
}

static const char *slot_kind(int kind)
{
	return kind == RELOC_JUMP_SLOT ? "PLT" : kind == RELOC_GLOB_DAT ? "GOT" : "data";
}

/* Redirects one relocation of o if it names a symbol in the table. */
static void patch_rela(struct scan *sc, const struct obj *o, const ElfW(Rela) *r)
{
	int kind = arch_reloc_kind((unsigned)ELF64_R_TYPE(r->r_info));
	size_t si = ELF64_R_SYM(r->r_info);
	const ElfW(Sym) *sym;
	struct redirect_name *n;
	void **slot, *cur, *target;

	if (kind == RELOC_OTHER || si == 0 || (kind == RELOC_ABS64 && r->r_addend))
		return;
	sym = &o->symtab[si];
	if (sym->st_name >= o->strsz || ELF64_ST_TYPE(sym->st_info) == STT_OBJECT ||
	    ELF64_ST_TYPE(sym->st_info) == STT_TLS ||
	    !(n = redirect_find(o->strtab + sym->st_name)))
		return;
	if (sym->st_shndx == SHN_UNDEF && sym->st_value && !n->canonical)
		n->canonical = (void *)(o->base + sym->st_value);
	slot = (void **)(o->base + r->r_offset);
	cur = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
	if (n->spec && kind == RELOC_JUMP_SLOT && (uintptr_t)cur >= o->lo &&
	    (uintptr_t)cur < o->hi)
		cur = resolve_lazy(o, n);
	if (!cur && n->spec)
		return; /* weak and undefined: nothing to call */
	target = redirect_target(n, cur);
	if (target == cur || !target)
		return;
	if (write_slot(o, slot, target) == 0) {
		sc->count++;
		redirect_caught(n);
		LOG(LOG_DEBUG, "%s: %s slot of %s redirected", o->name[0] ? o->name : "(main)",
		    slot_kind(kind), n->name);
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
	if (was_seen(info->dlpi_phdr))
		return 0;
	remember(info->dlpi_phdr);
	if (o.base == sc->self || (sc->rtld && o.base == sc->rtld) ||
	    strncmp(o.name, "linux-vdso", 10) == 0 || strncmp(o.name, "linux-gate", 10) == 0 ||
	    backend_module_owns(o.base))
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

/* Notices a dlclose since the last scan: everything is scanned again. */
static int check_unloads(struct dl_phdr_info *info, size_t size, void *data)
{
	(void)size;
	(void)data;
	if (info->dlpi_subs != seen_subs) {
		nseen = 0;
		seen_subs = info->dlpi_subs;
	}
	return 1; /* the counters are the same in every entry */
}

static int reloc_scan(const struct conf *cfg)
{
	Dl_info di;
	struct scan sc = { 0, getauxval(AT_BASE), 0 };

	(void)cfg;

	if (dladdr((void *)reloc_scan, &di))
		sc.self = (uintptr_t)di.dli_fbase;
	dl_iterate_phdr(check_unloads, NULL);
	dl_iterate_phdr(scan_object, &sc);
	return sc.count;
}

/* For the report: what relocation patching misses of a function that no
 * relocation reaches. */
static size_t reloc_missed(const struct redirect_name *n, const char *def, int in_exe,
			   char *why, size_t len)
{
	int rc;

	(void)n;
	if (in_exe)
		rc = snprintf(why, len, "no loaded object calls it through a relocation: "
			      "calls inside %s cannot be caught", def);
	else
		rc = snprintf(why, len, "no loaded object calls it through a relocation "
			      "(calls inside %s cannot be caught)", def);
	return rc < 0 ? 0 : (size_t)rc;
}

const struct redirect_method redirect_reloc = { "relocations", reloc_scan, reloc_missed };
