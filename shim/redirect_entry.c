/* SPDX-License-Identifier: MIT */
/*
 * redirect_entry.c - redirection by patching a function's entry.
 *
 * For each lock whose method is "entry", or "auto" with a definition in the
 * executable, the definition is looked up (symdef.c: dynamic symbols,
 * .symtab, separate debug file; or `object` + `offset`), its first
 * instructions are moved to a relocated copy (arch_<arch>_entry.c) in
 * memory near it (patchmem.c), and a direct jump to a stub of the lock's
 * hook replaces them. The hook's target is the function (slots and dlsym
 * results that hold it are left alone: each call is wrapped once, at the
 * entry) and its call is the copy.
 *
 * When patching is safe: at start-up (the shim's constructor) only while
 * the process has one thread, checked in /proc/self/task; otherwise the
 * lock is refused ("entry") or falls back to relocations ("auto"). An
 * object loaded later is patched inside the dlopen that loaded it, after
 * the dynamic linker has run its constructors and before dlopen returns:
 * no other thread has been given its code yet. All copies and stubs of a
 * scan are written and sealed (read+execute) before the first jump is.
 * A lock naming `object` that is not loaded yet waits for it; patched
 * objects that were unloaded are patched again when loaded again.
 */
#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "backend_module.h"
#include "hook.h"
#include "log.h"
#include "patchmem.h"
#include "redirect.h"
#include "symdef.h"
#include "arch.h"

#define WHY_MAX 860
#define OBJECTS_MAX 1024
#define SEARCHED_MAX 200 /* the objects searched, in a message (then "and N more") */
#define TRIED_MAX 480    /* the debug-file paths tried, in a message */
#define SEARCHED_TEXT_MAX (SEARCHED_MAX + TRIED_MAX + 80) /* searched_text's */

/* One lock this method looks after. */
struct want {
	struct redirect_name *n;
	const struct lock_spec *l;
	int done;              /* patched, or given up */
	int check_only;        /* relocations catch it: only its object's build-id is checked */
	uintptr_t base;        /* the patched object's load bias */
	void *target;          /* the patched function */
	void *pending;         /* the function a patch of this scan is prepared for */
	char why[WHY_MAX];     /* why its entry was not patched, for the report */
	char searched[SEARCHED_MAX]; /* objects its definition was not found in, ", "-joined */
	char tried[TRIED_MAX]; /* debug-file paths tried there, ", "-joined */
	int more_searched, more_tried; /* more of each than the lists hold */
	int statics;           /* objects whose static tables were searched (not
				* skipped because they import the name) */
};

/* One patch prepared in a scan, written once every copy is sealed. */
struct patch {
	struct want *w;
	struct hook *h;
	struct arch_entry e;
	int prot;
	char where[256];
};

static struct want *wants;
static int nwants = -1; /* -1: not set up yet */
static int scans;

/* Returns the number of threads of the process, or -1 when it cannot tell. */
static int thread_count(void)
{
	struct stat st;

	return stat("/proc/self/task", &st) == 0 && st.st_nlink > 2 ? (int)st.st_nlink - 2 : -1;
}

/* One scan's loaded objects (but the shim, the dynamic linker and what a
 * backend module brought in: backend_module.h), and
 * room for the names asked of one object (nwants each). */
struct objects {
	struct symdef_object o[OBJECTS_MAX];
	int n;
	uintptr_t self, rtld;
	struct symdef *defs;
	struct want **ws;
	struct symdef_search search; /* the last object's, for the messages */
};

static int collect(struct dl_phdr_info *info, size_t size, void *data)
{
	struct objects *os = data;
	const char *name = info->dlpi_name ? info->dlpi_name : "";

	(void)size;
	if (os->n == OBJECTS_MAX || info->dlpi_addr == os->self ||
	    (os->rtld && info->dlpi_addr == os->rtld) || strncmp(name, "linux-vdso", 10) == 0 ||
	    (os->n > 0 && !name[0]) || backend_module_owns(info->dlpi_addr))
		return 0;
	os->o[os->n++] = (struct symdef_object){ name, info->dlpi_addr, info->dlpi_phdr,
						 info->dlpi_phnum };
	return 0;
}

/* Returns o's DT_SONAME, or NULL. */
static const char *soname(const struct symdef_object *o)
{
	const ElfW(Dyn) *dyn = NULL;
	const char *strtab = NULL;
	long name = -1;

	for (int i = 0; i < o->phnum; i++)
		if (o->phdr[i].p_type == PT_DYNAMIC)
			dyn = (const ElfW(Dyn) *)(o->base + o->phdr[i].p_vaddr);
	for (; dyn && dyn->d_tag != DT_NULL; dyn++) {
		if (dyn->d_tag == DT_STRTAB)
			strtab = (const char *)(dyn->d_un.d_ptr < o->base ? dyn->d_un.d_ptr + o->base :
						dyn->d_un.d_ptr);
		else if (dyn->d_tag == DT_SONAME)
			name = (long)dyn->d_un.d_val;
	}
	return strtab && name >= 0 ? strtab + name : NULL;
}

/* Returns whether `object` (a lock's setting) names o, whose file is path. */
static int names_object(const char *object, const struct symdef_object *o, const char *path,
			int exe)
{
	const char *base = strrchr(path, '/'), *so;
	char *real;
	int same;

	if (strcmp(object, "main") == 0)
		return exe;
	if (strchr(object, '/')) {
		if (strcmp(object, path) == 0)
			return 1;
		if (!(real = realpath(object, NULL)))
			return 0;
		same = strcmp(real, path) == 0;
		if (!same) {
			char *mine = realpath(path, NULL);

			same = mine && strcmp(real, mine) == 0;
			free(mine);
		}
		free(real);
		return same;
	}
	if (strcmp(base ? base + 1 : path, object) == 0)
		return 1;
	return !exe && (so = soname(o)) && strcmp(so, object) == 0;
}

/* Returns the protection of o's segment holding [a, a + len) when it is
 * code, else -1. */
static int code_prot(const struct symdef_object *o, uintptr_t a, size_t len)
{
	for (int i = 0; i < o->phnum; i++) {
		const ElfW(Phdr) *p = &o->phdr[i];
		uintptr_t lo = o->base + p->p_vaddr;

		if (p->p_type != PT_LOAD || !(p->p_flags & PF_X) || a < lo ||
		    a + len > lo + p->p_memsz)
			continue;
		return (p->p_flags & PF_R ? PROT_READ : 0) | PROT_EXEC |
		       (p->p_flags & PF_W ? PROT_WRITE : 0);
	}
	return -1;
}

/*
 * Gives up on w: for method "entry", a lock with `offset`, or one whose
 * build-id does not match (must), the report makes it fatal at start-up
 * (n->refused); else relocations stand in, said at warn. late: after
 * start-up (dlopen), where nothing is fatal: an error line.
 */
static void refuse_as(struct want *w, const char *where, const char *why, int late, int must)
{
	char line[WHY_MAX + 300];

	must |= w->l->method == METHOD_ENTRY || w->l->offset >= 0;
	w->done = 1;
	snprintf(w->why, WHY_MAX, "%s", why);
	snprintf(line, sizeof(line), "cannot patch the entry of %s in %s: %s", w->l->symbol,
		 where, why);
	if (must && !late) {
		free(w->n->refused);
		w->n->refused = strdup(line);
		return;
	}
	if (must)
		LOG(LOG_ERROR, "%s; its calls stay unguarded", line);
	else
		LOG(LOG_WARN, "%s; falling back to relocations: calls from inside %s are not "
		    "guarded", line, where);
}

static void refuse(struct want *w, const char *where, const char *why, int late)
{
	refuse_as(w, where, why, late, 0);
}

/* Appends a then b as one item to list (len bytes, ", "-separated), or
 * counts it in *more when it does not fit (and after one that did not). */
static void list_add(char *list, size_t len, int *more, const char *a, const char *b)
{
	size_t used = strlen(list);

	if (*more || used + 2 + strlen(a) + strlen(b) >= len) {
		(*more)++;
		return;
	}
	snprintf(list + used, len - used, "%s%s%s", used ? ", " : "", a, b);
}

/* Notes that w's definition d is not in the object whose file is path:
 * what s says was searched there (nothing static when the object imports
 * the name), and the debug file read ("" when none). */
static void note_search(struct want *w, const struct symdef *d, const char *path,
			const struct symdef_search *s, const char *debug)
{
	const char *p = s->tried;

	list_add(w->searched, sizeof(w->searched), &w->more_searched, path,
		 d->imported ? " (imports it)" : s->symtab ? "" : " (no symbol table)");
	if (d->imported)
		return;
	w->statics++;
	for (int i = 0; i < s->nlisted; i++, p += strlen(p) + 1)
		list_add(w->tried, sizeof(w->tried), &w->more_tried, p, "");
	w->more_tried += s->ntried - s->nlisted;
	if (debug[0])
		list_add(w->tried, sizeof(w->tried), &w->more_tried, debug, " (read)");
}

/*
 * Writes into out (len bytes) where w's definition was looked for in vain
 * (the dynamic symbols, symbol table and debug files of each object):
 * "searched OBJECT (no symbol table), OBJECT (imports it), ...; debug files
 * tried: PATH, ..." (no debug-file clause when every object imports it)
 * with "and N more" after a list cut short (which keeps it under
 * SEARCHED_TEXT_MAX).
 */
static void searched_text(const struct want *w, char *out, size_t len)
{
	char objs[24] = "", paths[24] = "";
	/* every object searched imports it: no static table, no debug file read */
	int imports = w->searched[0] && !w->statics && !w->tried[0] && !w->more_tried;

	if (w->more_searched)
		snprintf(objs, sizeof(objs), " and %d more", w->more_searched);
	if (w->more_tried)
		snprintf(paths, sizeof(paths), " and %d more", w->more_tried);
	snprintf(out, len, "searched %s%s%s%s%s%s", w->searched[0] ? w->searched : "no object",
		 objs, imports ? "" : "; ", imports ? "" : w->tried[0] || w->more_tried ?
		 "debug files tried: " : "no debug file to try (no build-id, no .gnu_debuglink)",
		 w->tried, paths);
}

static int set_up(const struct conf *cfg)
{
	wants = calloc((size_t)cfg->nlocks + 1, sizeof(*wants));
	if (!wants)
		return -1;
	nwants = 0;
	for (int i = 0; i < cfg->nlocks; i++) {
		const struct lock_spec *l = &cfg->locks[i];
		struct redirect_name *n = redirect_find(l->symbol);
		struct want *w = &wants[nwants];
		int reloc = l->method == METHOD_RELOC ||
			    (l->method == METHOD_AUTO && l->object && strcmp(l->object, "main") != 0);

		if (!n || (reloc && !(l->object && l->build_id)) ||
		    (!reloc && n->wrapper && l->method == METHOD_AUTO))
			continue;
		w->n = n;
		w->l = l;
		w->check_only = reloc;
		if (!reloc && n->wrapper)
			refuse(w, "this program", "the shim wraps it itself (use method = "
			       "\"reloc\")", 0);
		nwants++;
	}
	return 0;
}

/* Checks o's build-id against w's build_id. Returns 0, or -1 (refused). */
static int check_build_id(struct want *w, const struct symdef_object *o, const char *where,
			  int late)
{
	char id[2 * CONF_BUILD_ID_MAX + 2], why[WHY_MAX];

	if (!w->l->build_id)
		return 0;
	if (!symdef_build_id(o, id, sizeof(id)))
		snprintf(why, sizeof(why), "it has no build-id (build_id %s was asked for)",
			 w->l->build_id);
	else if (strcmp(id, w->l->build_id) != 0)
		snprintf(why, sizeof(why), "its build-id is %s, not %s (another build of the "
			 "program?)", id, w->l->build_id);
	else
		return 0;
	refuse_as(w, where, why, late, 1);
	return -1;
}

/*
 * Prepares w's patch at addr (size bytes, 0: unknown) in o: copy and stub
 * near it, the hook. Returns 0 with p filled, or -1 (refused).
 */
static int prepare(struct want *w, const struct symdef_object *o, const char *where,
		   uintptr_t addr, size_t size, struct patch *p, int late)
{
	size_t stub = (arch_stub_size() + 15) & ~(size_t)15;
	unsigned char *block, *copy;
	char why[WHY_MAX];
	struct hook *h;

	for (int i = 0; i < nwants; i++)
		if (&wants[i] != w && (wants[i].target == (void *)addr ||
				       (wants[i].pending == (void *)addr))) {
			snprintf(why, sizeof(why), "locks[%d] (%s) patches the same function",
				 wants[i].l->index, wants[i].l->symbol);
			goto refused;
		}
	p->prot = code_prot(o, addr, size ? (size < 16 ? size : 16) : 1);
	if (p->prot < 0) {
		snprintf(why, sizeof(why), "0x%zx is not in its code", (size_t)(addr - o->base));
		goto refused;
	}
	block = patchmem_alloc((void *)addr, stub + ARCH_ENTRY_COPY_MAX, arch_entry_reach());
	if (!block) {
		snprintf(why, sizeof(why), "no free memory within reach of a direct jump");
		goto refused;
	}
	copy = block + stub;
	if (arch_entry_prepare((void *)addr, size, copy, block, &p->e, why, sizeof(why)) != 0)
		goto refused;
	h = hook_get(w->l, (void *)addr, copy);
	if (!h) {
		snprintf(why, sizeof(why), "cannot create its hook");
		goto refused;
	}
	if (h->call != copy && (h->call == h->target || memcmp(h->call, copy, p->e.copy_len))) {
		snprintf(why, sizeof(why), "its address was wrapped before by another method");
		goto refused;
	}
	arch_write_stub(block, h);
	w->pending = (void *)addr;
	p->w = w;
	p->h = h;
	snprintf(p->where, sizeof(p->where), "%s", where);
	return 0;
refused:
	refuse(w, where, why, late);
	return -1;
}

/* Writes a prepared patch. Returns 0, or -1 (refused). */
static int apply(struct patch *p, int alone, int late)
{
	int rc = patchmem_write(p->e.at, p->e.jump, p->e.len, p->prot, alone);
	char why[WHY_MAX];

	if (rc != 0) {
		snprintf(why, sizeof(why), "cannot write its code: %s", strerror(-rc));
		refuse(p->w, p->where, why, late);
		return -1;
	}
	__atomic_store_n(&p->h->entry, 1, __ATOMIC_RELEASE);
	p->w->done = 1;
	p->w->why[0] = 0;
	p->w->target = p->h->target;
	p->w->pending = NULL;
	free(p->w->n->entry_in);
	p->w->n->entry_in = strdup(p->where);
	redirect_caught(p->w->n);
	LOG(LOG_DEBUG, "%s: entry patched in %s (%zu bytes moved)", p->w->l->symbol, p->where,
	    p->e.len);
	return 0;
}

/* Says at warn which copies of w's function calls can reach around its entry. */
static void warn_clones(const struct want *w, const struct symdef *d, const char *where)
{
	if (d->clones[0])
		LOG(LOG_WARN, "%s: the compiler made copies of it in %s (%s); calls through "
		    "them are not guarded", w->l->symbol, where, d->clones);
}

/*
 * Prepares w's patch at the definition d found in o (debug: the debug file
 * read, or ""), or refuses it. Returns 1 when a patch was prepared into p.
 */
static int prepare_found(struct want *w, const struct symdef_object *o, const char *path,
			 const struct symdef *d, const char *debug, struct patch *p, int late)
{
	char why[WHY_MAX];
	int from_debug = debug[0] && !strcmp(d->source, "debug file");

	w->base = o->base;
	warn_clones(w, d, path);
	if (d->more || d->ifunc) {
		if (d->more)
			snprintf(why, sizeof(why), "%s has %d more definition(s) in its %s (static "
				 "functions of several files?); name one with offset", w->l->symbol,
				 d->more, d->source);
		else
			snprintf(why, sizeof(why), "%s is an IFUNC (its implementation is chosen "
				 "at load time)", w->l->symbol);
		refuse(w, path, why, late);
		return 0;
	}
	if (prepare(w, o, path, d->addr, d->size, p, late) != 0)
		return 0;
	LOG(LOG_DEBUG, "%s: defined in %s at 0x%zx (%s%s%s)", w->l->symbol, path,
	    (size_t)(d->addr - o->base), d->source, from_debug ? " " : "", from_debug ? debug : "");
	return 1;
}

/*
 * Looks the pending wants that consider object k up in it and prepares
 * their patches into ps (*np of them so far). first: the start-up scan.
 */
static void scan_object(struct objects *os, int k, const struct conf *cfg,
			struct patch *ps, int *np, int first, int alone, int threads)
{
	const struct symdef_object *o = &os->o[k];
	struct symdef *defs = os->defs;
	struct want **ws = os->ws;
	char path[4096], debug[4096], why[WHY_MAX];
	int m = 0, exe = k == 0, have_path = symdef_path(o, path, sizeof(path)) == 0;

	if (!have_path)
		snprintf(path, sizeof(path), "%s", exe ? "the executable" : o->name);
	for (int i = 0; i < nwants; i++) {
		struct want *w = &wants[i];

		if (w->done || (w->l->object ? !names_object(w->l->object, o, path, exe) :
				!first || (w->l->method == METHOD_AUTO && !exe)))
			continue;
		if (check_build_id(w, o, path, !first))
			continue;
		if (w->check_only) {
			w->done = 1; /* build-id checked; relocations catch its calls */
			continue;
		}
		if (first && !alone) {
			snprintf(why, sizeof(why), threads > 1 ? "%d threads are running already "
				 "(started by a library's constructor?); entries are patched "
				 "only while the process has one thread" : "cannot tell whether other "
				 "threads run (/proc is not mounted)", threads);
			refuse(w, path, why, 0);
			continue;
		}
		if (w->l->offset >= 0) {
			w->base = o->base;
			if (prepare(w, o, path, o->base + (uintptr_t)w->l->offset, 0, &ps[*np],
				    !first) == 0)
				(*np)++;
			continue;
		}
		defs[m].name = w->l->symbol;
		ws[m++] = w;
	}
	if (!m)
		return;
	symdef_find(o, have_path ? path : NULL, defs, m, cfg->debug_dirs, debug, sizeof(debug),
		    &os->search);
	for (int j = 0; j < m; j++) {
		struct want *w = ws[j];

		if (!defs[j].addr) {
			note_search(w, &defs[j], path, &os->search, debug);
			if (w->l->object) {
				char text[SEARCHED_TEXT_MAX];

				searched_text(w, text, sizeof(text));
				snprintf(why, sizeof(why), "%s is not defined there (%s)",
					 w->l->symbol, text);
				refuse(w, path, why, !first);
			}
			continue; /* the next object in load order */
		}
		*np += prepare_found(w, o, path, &defs[j], debug, &ps[*np], !first);
	}
}

/* Marks the patched wants whose object was unloaded as pending again. */
static void forget_unloaded(void)
{
	for (int i = 0; i < nwants; i++) {
		struct want *w = &wants[i];
		struct link_map *lm = NULL;
		Dl_info di;

		if (!w->done || !w->target || !w->l->object)
			continue;
		if (!dladdr1(w->target, &di, (void **)&lm, RTLD_DL_LINKMAP) || !lm ||
		    lm->l_addr != w->base) {
			w->target = NULL;
			w->done = 0;
			free(w->n->entry_in);
			w->n->entry_in = NULL;
		}
	}
}

static int entry_scan(const struct conf *cfg)
{
	struct objects *os;
	struct patch *ps;
	int np = 0, patched = 0, first = scans++ == 0, threads, alone, pending = 0;
	char text[SEARCHED_TEXT_MAX], why[WHY_MAX];
	Dl_info di;

	if (nwants < 0 && set_up(cfg) != 0)
		return -1;
	if (!first)
		forget_unloaded();
	for (int i = 0; i < nwants; i++) {
		struct want *w = &wants[i];

		pending |= !w->done;
		if (!w->done) {
			w->searched[0] = w->tried[0] = 0;
			w->more_searched = w->more_tried = w->statics = 0;
		}
	}
	if (!pending)
		return 0;
	os = calloc(1, sizeof(*os));
	ps = calloc((size_t)nwants, sizeof(*ps));
	if (!os || !ps || !(os->defs = calloc((size_t)nwants, sizeof(*os->defs))) ||
	    !(os->ws = calloc((size_t)nwants, sizeof(*os->ws)))) {
		patched = -1;
		goto out;
	}
	if (dladdr((void *)entry_scan, &di))
		os->self = (uintptr_t)di.dli_fbase;
	os->rtld = getauxval(AT_BASE);
	dl_iterate_phdr(collect, os);
	threads = thread_count();
	alone = threads == 1;
	for (int k = 0; k < os->n; k++)
		scan_object(os, k, cfg, ps, &np, first, alone, threads);
	if (patchmem_seal() != 0) {
		for (int i = 0; i < np; i++)
			refuse(ps[i].w, ps[i].where, "cannot make its copy executable", !first);
		np = 0;
	}
	for (int i = 0; i < np; i++)
		patched += apply(&ps[i], alone, !first) == 0;
	for (int i = 0; first && i < nwants; i++) {
		struct want *w = &wants[i];

		if (w->done || w->l->object)
			continue;
		if (w->l->method != METHOD_ENTRY) {
			w->done = 1; /* auto: not the executable's; relocations catch it */
			continue;
		}
		searched_text(w, text, sizeof(text));
		snprintf(why, sizeof(why), "it is not defined there (%s; name the library in "
			 "`object` if it is loaded later with dlopen)", text);
		refuse(w, "any loaded object", why, 0);
	}
out:
	if (os) {
		free(os->defs);
		free(os->ws);
	}
	free(os);
	free(ps);
	return patched;
}

/* For the report: why the entry of n (no method caught it) was not patched;
 * with def NULL (no loaded object defines n), where it was looked for. */
static size_t entry_missed(const struct redirect_name *n, const char *def, int in_exe,
			   char *why, size_t len)
{
	char text[SEARCHED_TEXT_MAX];
	int rc;

	(void)in_exe;
	for (int i = 0; i < nwants; i++) {
		if (wants[i].n != n || !(def ? wants[i].why[0] : wants[i].searched[0]))
			continue;
		if (def) {
			rc = snprintf(why, len, "its entry cannot be patched (%s)", wants[i].why);
		} else {
			searched_text(&wants[i], text, sizeof(text));
			rc = snprintf(why, len, "for its entry, %s", text);
		}
		return rc < 0 ? 0 : (size_t)rc;
	}
	return 0;
}

const struct redirect_method redirect_entry = { "entries", entry_scan, entry_missed };
