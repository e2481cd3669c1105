/* SPDX-License-Identifier: MIT */
/*
 * symdef.c - where functions are defined inside one loaded object (see
 * symdef.h).
 *
 * The dynamic symbols are looked up by name in memory, through their hash
 * table (symhash.c). The names a static table is walked for go into a
 * small open-addressing hash (FNV-1a, sized at 4x), so each table is
 * walked once whatever the number of names, behind a filter of the names'
 * first 8 (or 4) bytes that skips most symbols after one load; .symtab and
 * the debug file are read through symfile.c, which checks every offset
 * against the file, and only for a name found (its clones) or one the
 * object does not import. Runs at start-up and after dlopen, never on a
 * call: it may allocate.
 */
#include "symdef.h"

#include <elf.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "symfile.h"
#include "symhash.h"

#define BUILD_ID_HEX 129

struct wanted {
	struct symdef **slot; /* open addressing, nslot a power of 2 */
	unsigned nslot;
	/* 4096-bit filters of the names' first 8 bytes (names of 8 bytes or
	 * more) and first 4 bytes (4 to 7): a symbol's name, or its clone's,
	 * begins with the same bytes; names shorter than 4 (nshort) match any
	 * symbol with a NUL or '.' in its first 4 bytes */
	uint64_t bloom8[64], bloom4[64];
	int n8, n4, nshort;
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

/* Returns the filter bit of key (and its word in *word). */
static uint64_t bloom_bit(uint64_t key, unsigned *word)
{
	unsigned b = (unsigned)((key * 0x9e3779b97f4a7c15ull) >> 52);

	*word = b >> 6;
	return 1ull << (b & 63);
}

static void bloom_add(uint64_t *bloom, uint64_t key)
{
	unsigned word;
	uint64_t bit = bloom_bit(key, &word);

	bloom[word] |= bit;
}

static int bloom_has(const uint64_t *bloom, uint64_t key)
{
	unsigned word;
	uint64_t bit = bloom_bit(key, &word);

	return (bloom[word] & bit) != 0;
}

/* Returns whether one of the 4 bytes of k is a NUL or a '.'. */
static int has_stop(uint32_t k)
{
	uint32_t dots = k ^ 0x2e2e2e2eu;

	return (((k - 0x01010101u) & ~k) | ((dots - 0x01010101u) & ~dots)) & 0x80808080u;
}

/* Returns 0 when the name at p (left bytes of table from there) is surely
 * neither a wanted name nor a clone of one: a test of its first bytes,
 * which spares reading the rest of most names of a large table. */
static int may_match(const struct wanted *w, const char *p, size_t left)
{
	uint64_t k8;
	uint32_t k4;

	if (left < 8)
		return 1;
	memcpy(&k8, p, 8);
	memcpy(&k4, p, 4);
	return (w->n8 && bloom_has(w->bloom8, k8)) || (w->n4 && bloom_has(w->bloom4, k4)) ||
	       (w->nshort && has_stop(k4));
}

/* Builds w from the names of defs[0..n) not imported by the object.
 * Returns 0 (w->slot to free), or -1. */
static int wanted_init(struct wanted *w, struct symdef *defs, int n)
{
	memset(w, 0, sizeof(*w));
	for (w->nslot = 16; w->nslot < 4u * (unsigned)n; w->nslot *= 2)
		;
	if (!(w->slot = calloc(w->nslot, sizeof(*w->slot))))
		return -1;
	for (int k = 0; k < n; k++) {
		size_t len = strlen(defs[k].name);
		unsigned i = hash_n(defs[k].name, len) & (w->nslot - 1);
		uint64_t k8;
		uint32_t k4;

		if (defs[k].imported)
			continue;
		while (w->slot[i])
			i = (i + 1) & (w->nslot - 1);
		w->slot[i] = &defs[k];
		if (len >= 8) {
			memcpy(&k8, defs[k].name, 8);
			bloom_add(w->bloom8, k8);
			w->n8++;
		} else if (len >= 4) {
			memcpy(&k4, defs[k].name, 4);
			bloom_add(w->bloom4, k4);
			w->n4++;
		} else {
			w->nshort++;
		}
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
		    s->st_name >= strsz || !may_match(w, strs + s->st_name, strsz - s->st_name))
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

/* Looks d up in o's dynamic symbols through their hash table: the first
 * definition in table order, and in `more` those at other addresses (the
 * versions of a name). */
static void find_dynamic(const struct symhash *h, uintptr_t base, struct symdef *d)
{
	size_t idx[32], n = symhash_find(h, d->name, idx, 32);

	for (size_t i = 0; i < n && i < 32; i++) {
		const ElfW(Sym) *s = &h->syms[idx[i]];
		int type = ELF64_ST_TYPE(s->st_info);

		if ((type != STT_FUNC && type != STT_GNU_IFUNC) || s->st_shndx == SHN_UNDEF)
			continue;
		if (!d->addr) {
			d->addr = base + s->st_value;
			d->size = s->st_size;
			d->ifunc = type == STT_GNU_IFUNC;
			d->source = "dynamic symbols";
		} else if (d->addr != base + s->st_value) {
			d->more++;
		}
	}
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
	struct symhash h;
	int found = 0, missing = 0, statics = 0, dyn;

	debug[0] = 0;
	if (s)
		s->symtab = s->ntried = s->nlisted = 0;
	for (int i = 0; i < n; i++) {
		defs[i].addr = 0;
		defs[i].size = 0;
		defs[i].more = defs[i].ifunc = defs[i].imported = 0;
		defs[i].source = NULL;
		defs[i].clones[0] = 0;
	}
	if (n <= 0)
		return 0;
	dyn = symhash_init(&h, o->base, o->phdr, o->phnum) == 0;
	for (int i = 0; i < n; i++) {
		if (dyn)
			find_dynamic(&h, o->base, &defs[i]);
		if (!defs[i].addr && dyn && symhash_imports(&h, defs[i].name))
			defs[i].imported = 1; /* not o's: its static tables are not read for it */
		else
			statics = 1; /* the clones of a definition found, or a local function */
	}
	if (!statics || !path || !path[0] || wanted_init(&w, defs, n) != 0)
		goto out;
	memset(&file, 0, sizeof(file));
	if (symfile_open(&file, o->name && o->name[0] ? path : "/proc/self/exe") == 0 &&
	    file.syms)
		walk(&w, file.syms, file.nsyms, file.strs, file.strsz, o->base, "symbol table", 1);
	if (s)
		s->symtab = file.syms != NULL;
	for (int i = 0; i < n; i++)
		missing += !defs[i].addr && !defs[i].imported;
	if ((missing || !file.syms) &&
	    find_debug(o, &file, path, dirs, &dbg, debug, len, s) == 0) {
		walk(&w, dbg.syms, dbg.nsyms, dbg.strs, dbg.strsz, o->base, "debug file",
		     !file.syms);
		symfile_close(&dbg);
	} else {
		debug[0] = 0;
	}
	symfile_close(&file);
	free(w.slot);
out:
	for (int i = 0; i < n; i++)
		found += defs[i].addr != 0;
	return found;
}
