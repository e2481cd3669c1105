/* SPDX-License-Identifier: MIT */
/*
 * symdef.c - where functions are defined inside one loaded object (see
 * symdef.h).
 *
 * The names asked for go into a small open-addressing hash (FNV-1a, sized
 * at 4x), so each table is walked once whatever the number of names. The
 * dynamic symbols are read in memory (their count from DT_HASH, or from
 * the last chain of DT_GNU_HASH); .symtab and the debug file through
 * symfile.c, which checks every offset against the file. Runs at start-up
 * and after dlopen, never on a call: it may allocate.
 */
#include "symdef.h"

#include <elf.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "symfile.h"

#define BUILD_ID_HEX 129

struct wanted {
	struct symdef **slot; /* open addressing, nslot a power of 2 */
	unsigned nslot;
};

static unsigned hash_n(const char *s, size_t n)
{
	unsigned h = 2166136261u;

	while (n--)
		h = (h ^ (unsigned char)*s++) * 16777619u;
	return h;
}

static struct symdef *wanted_find(const struct wanted *w, const char *s, size_t n)
{
	for (unsigned i = hash_n(s, n) & (w->nslot - 1);; i = (i + 1) & (w->nslot - 1)) {
		struct symdef *d = w->slot[i];

		if (!d)
			return NULL;
		if (strncmp(d->name, s, n) == 0 && d->name[n] == 0)
			return d;
	}
}

static int wanted_init(struct wanted *w, struct symdef *defs, int n)
{
	for (w->nslot = 16; w->nslot < 4u * (unsigned)n; w->nslot *= 2)
		;
	if (!(w->slot = calloc(w->nslot, sizeof(*w->slot))))
		return -1;
	for (int k = 0; k < n; k++) {
		unsigned i = hash_n(defs[k].name, strlen(defs[k].name)) & (w->nslot - 1);

		while (w->slot[i])
			i = (i + 1) & (w->nslot - 1);
		w->slot[i] = &defs[k];
	}
	return 0;
}

/* Returns whether suffix (what follows "name.") is a compiler clone's. */
static int clone_suffix(const char *suffix)
{
	static const char *const kinds[] = { "isra", "constprop", "part", "cold", "lto_priv",
					     "localalias", NULL };

	for (int i = 0; kinds[i]; i++) {
		size_t k = strlen(kinds[i]);

		if (strncmp(suffix, kinds[i], k) == 0 && (suffix[k] == 0 || suffix[k] == '.'))
			return 1;
	}
	return 0;
}

/* Returns whether name is an item of the ", "-separated list. */
static int listed(const char *list, const char *name)
{
	size_t len = strlen(name);

	for (const char *p = list; (p = strstr(p, name)); p += len)
		if ((p == list || p[-1] == ' ') && (p[len] == 0 || p[len] == ','))
			return 1;
	return 0;
}

static void add_clone(struct symdef *d, const char *name)
{
	size_t used = strlen(d->clones), len = strlen(name);

	if (listed(d->clones, name))
		return; /* a clone in both tables */
	if (used + len + 6 >= sizeof(d->clones)) {
		if (used + 6 < sizeof(d->clones) && (used < 3 || strcmp(d->clones + used - 3, "...")))
			snprintf(d->clones + used, sizeof(d->clones) - used, ", ...");
		return;
	}
	snprintf(d->clones + used, sizeof(d->clones) - used, "%s%s", used ? ", " : "", name);
}

/*
 * Walks one table: records each wanted name's first definition (and any
 * definition at another address in `more`) when still not found, and, for
 * a static table (clones), the clones of each name.
 */
static void walk(const struct wanted *w, const ElfW(Sym) *syms, size_t nsyms,
		 const char *strs, size_t strsz, uintptr_t base, const char *source,
		 int clones)
{
	for (size_t i = 0; i < nsyms; i++) {
		const ElfW(Sym) *s = &syms[i];
		int type = ELF64_ST_TYPE(s->st_info);
		const char *name, *dot;
		size_t len;
		struct symdef *d;

		if ((type != STT_FUNC && type != STT_GNU_IFUNC) || s->st_shndx == SHN_UNDEF ||
		    s->st_name >= strsz)
			continue;
		name = strs + s->st_name;
		len = strnlen(name, strsz - s->st_name);
		if (len == strsz - s->st_name)
			continue; /* not terminated inside the table */
		if ((d = wanted_find(w, name, len))) {
			if (!d->addr || d->source == source) {
				if (!d->addr) {
					d->addr = base + s->st_value;
					d->size = s->st_size;
					d->ifunc = type == STT_GNU_IFUNC;
					d->source = source;
				} else if (d->addr != base + s->st_value) {
					d->more++;
				}
			}
			continue;
		}
		if (clones && (dot = memchr(name, '.', len)) && dot > name &&
		    clone_suffix(dot + 1) && (d = wanted_find(w, name, (size_t)(dot - name))))
			add_clone(d, name);
	}
}

/* Returns the number of dynamic symbols of an object (DT_HASH's nchain, or
 * one past the last symbol DT_GNU_HASH reaches), or 0. */
static size_t dynsym_count(const uint32_t *hash, const uint32_t *gnu)
{
	uint32_t nbuckets, symoffset, bloom, last = 0;
	const uint32_t *buckets, *chain;

	if (hash)
		return hash[1];
	if (!gnu)
		return 0;
	nbuckets = gnu[0];
	symoffset = gnu[1];
	bloom = gnu[2];
	buckets = gnu + 4 + bloom * (sizeof(ElfW(Addr)) / 4);
	for (uint32_t b = 0; b < nbuckets; b++)
		if (buckets[b] > last)
			last = buckets[b];
	if (last < symoffset)
		return symoffset;
	chain = buckets + nbuckets;
	while (!(chain[last - symoffset] & 1))
		last++;
	return (size_t)last + 1;
}

/* Walks o's dynamic symbols (mapped with o). */
static void walk_dynamic(const struct symdef_object *o, const struct wanted *w)
{
	const ElfW(Dyn) *dyn = NULL;
	const ElfW(Sym) *syms = NULL;
	const uint32_t *hash = NULL, *gnu = NULL;
	const char *strs = NULL;
	size_t strsz = 0;

	for (int i = 0; i < o->phnum; i++)
		if (o->phdr[i].p_type == PT_DYNAMIC)
			dyn = (const ElfW(Dyn) *)(o->base + o->phdr[i].p_vaddr);
	for (; dyn && dyn->d_tag != DT_NULL; dyn++) {
		uintptr_t v = dyn->d_un.d_ptr < o->base ? dyn->d_un.d_ptr + o->base : dyn->d_un.d_ptr;

		switch (dyn->d_tag) {
		case DT_SYMTAB: syms = (const ElfW(Sym) *)v; break;
		case DT_STRTAB: strs = (const char *)v; break;
		case DT_STRSZ: strsz = dyn->d_un.d_val; break;
		case DT_HASH: hash = (const uint32_t *)v; break;
		case DT_GNU_HASH: gnu = (const uint32_t *)v; break;
		}
	}
	if (syms && strs)
		walk(w, syms, dynsym_count(hash, gnu), strs, strsz, o->base, "dynamic symbols", 0);
}

int symdef_path(const struct symdef_object *o, char *path, size_t len)
{
	ssize_t n;

	if (o->name && o->name[0]) {
		snprintf(path, len, "%s", o->name);
		return 0;
	}
	n = readlink("/proc/self/exe", path, len - 1);
	if (n <= 0)
		return -1;
	path[n] = 0;
	return 0;
}

int symdef_build_id(const struct symdef_object *o, char *hex, size_t len)
{
	for (int i = 0; i < o->phnum; i++)
		if (o->phdr[i].p_type == PT_NOTE &&
		    symfile_note_build_id((const void *)(o->base + o->phdr[i].p_vaddr),
					  o->phdr[i].p_memsz, hex, len))
			return 1;
	return 0;
}

/* Notes in s (if any) that path was tried in vain, and why (after it). */
static void tried(struct symdef_search *s, const char *path, const char *why)
{
	size_t used = 0;
	int n;

	if (!s)
		return;
	for (int i = 0; i < s->nlisted; i++)
		used += strlen(s->tried + used) + 1;
	s->ntried++;
	n = snprintf(s->tried + used, sizeof(s->tried) - used, "%s%s", path, why);
	if (n >= 0 && (size_t)n < sizeof(s->tried) - used)
		s->nlisted++;
	else
		s->tried[used] = 0;
}

/* Opens path as the debug file of an object whose build-id is id ("" when
 * it has none). Returns 0 when it is one (f open), else -1 (noted in s). */
static int open_debug(struct symfile *f, const char *path, const char *id,
		      struct symdef_search *s)
{
	char other[BUILD_ID_HEX];

	if (access(path, R_OK) != 0) {
		tried(s, path, access(path, F_OK) == 0 ? " (unreadable)" : "");
		return -1;
	}
	if (symfile_open(f, path) != 0) {
		tried(s, path, " (not its debug file)");
		return -1;
	}
	if (f->syms && (!id[0] || (symfile_build_id(f, other, sizeof(other)) &&
				   strcmp(other, id) == 0)))
		return 0;
	symfile_close(f);
	tried(s, path, " (not its debug file)");
	return -1;
}

/* Finds and opens o's separate debug file, as gdb looks for it. Returns 0
 * with f open and its path in out, or -1. file: o's file, mapped. */
static int find_debug(const struct symdef_object *o, const struct symfile *file,
		      const char *path, char *const *dirs, struct symfile *f, char *out,
		      size_t len, struct symdef_search *s)
{
	char id[BUILD_ID_HEX] = "", dir[PATH_MAX], *slash;
	const char *link = NULL;
	size_t linksz = 0;

	symdef_build_id(o, id, sizeof(id));
	for (int i = 0; id[0] && id[1] && id[2] && dirs && dirs[i]; i++) {
		snprintf(out, len, "%s/.build-id/%.2s/%s.debug", dirs[i], id, id + 2);
		if (open_debug(f, out, id, s) == 0)
			return 0;
	}
	if (file->map)
		link = symfile_section(file, ".gnu_debuglink", &linksz);
	if (!link || !linksz || !memchr(link, 0, linksz) || strchr(link, '/'))
		return -1;
	snprintf(dir, sizeof(dir), "%s", path);
	slash = strrchr(dir, '/');
	if (!slash)
		return -1;
	*slash = 0;
	snprintf(out, len, "%s/%s", dir, link);
	if (strcmp(out, path) != 0 && open_debug(f, out, id, s) == 0)
		return 0;
	snprintf(out, len, "%s/.debug/%s", dir, link);
	if (open_debug(f, out, id, s) == 0)
		return 0;
	for (int i = 0; dirs && dirs[i]; i++) {
		snprintf(out, len, "%s%s/%s", dirs[i], dir, link);
		if (open_debug(f, out, id, s) == 0)
			return 0;
	}
	return -1;
}

int symdef_find(const struct symdef_object *o, const char *path, struct symdef *defs, int n,
		char *const *dirs, char *debug, size_t len, struct symdef_search *s)
{
	struct wanted w;
	struct symfile file, dbg;
	int found = 0, missing = 0;

	debug[0] = 0;
	if (s)
		s->symtab = s->ntried = s->nlisted = 0;
	for (int i = 0; i < n; i++) {
		defs[i].addr = 0;
		defs[i].size = 0;
		defs[i].more = defs[i].ifunc = 0;
		defs[i].source = NULL;
		defs[i].clones[0] = 0;
	}
	if (n <= 0 || wanted_init(&w, defs, n) != 0)
		return 0;
	walk_dynamic(o, &w);
	memset(&file, 0, sizeof(file));
	if (path && path[0] &&
	    symfile_open(&file, o->name && o->name[0] ? path : "/proc/self/exe") == 0 &&
	    file.syms)
		walk(&w, file.syms, file.nsyms, file.strs, file.strsz, o->base, "symbol table", 1);
	if (s)
		s->symtab = file.syms != NULL;
	for (int i = 0; i < n; i++)
		missing += !defs[i].addr;
	if ((missing || !file.syms) && path && path[0] &&
	    find_debug(o, &file, path, dirs, &dbg, debug, len, s) == 0) {
		walk(&w, dbg.syms, dbg.nsyms, dbg.strs, dbg.strsz, o->base, "debug file",
		     !file.syms);
		symfile_close(&dbg);
	} else {
		debug[0] = 0;
	}
	symfile_close(&file);
	free(w.slot);
	for (int i = 0; i < n; i++)
		found += defs[i].addr != 0;
	return found;
}
