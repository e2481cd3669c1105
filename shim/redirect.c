/* SPDX-License-Identifier: MIT */
/*
 * redirect.c - the name table, the methods and the start-up report (see
 * redirect.h).
 *
 * The table holds every guarded symbol and every internal wrapper
 * (interpose_table) as ordinary entries, in an open-addressing hash
 * (FNV-1a) sized at init, so a method pays one hash and, rarely, one strcmp
 * per relocation it looks at; at init every entry is checked to be found
 * (table_check). A mutex serialises scans: dlopen may be called from
 * several threads. The report after the first scan says, for each lock no
 * method caught a call site or entry of, whether the executable defines it
 * (its dynamic or static symbol table), a library does, or nothing loaded
 * does (a typo, the wrong program, or a library loaded later), with what
 * each method says it misses there; `strict` makes that fatal.
 */
#include "redirect.h"

#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "golang.h"
#include "hook.h"
#include "log.h"
#include "sibling.h"
#include "symfile.h"

static const struct redirect_method *const methods[] = { &redirect_entry, &redirect_reloc,
							 NULL };
static const struct conf *config; /* frozen at init */
static struct redirect_name *names; /* open addressing, nslots a power of 2 */
static unsigned nslots;
static int ready;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static unsigned hash(const char *s)
{
	unsigned h = 2166136261u;

	while (*s)
		h = (h ^ (unsigned char)*s++) * 16777619u;
	return h;
}

struct redirect_name *redirect_find(const char *name)
{
	unsigned h = hash(name);

	if (!nslots)
		return NULL;
	for (unsigned i = h & (nslots - 1);; i = (i + 1) & (nslots - 1)) {
		struct redirect_name *n = &names[i];

		if (!n->name)
			return NULL;
		if (n->hash == h && strcmp(n->name, name) == 0)
			return n;
	}
}

/* Adds name, or returns its entry. Returns NULL when out of memory. */
static struct redirect_name *add(const char *name)
{
	unsigned h = hash(name), i;

	for (i = h & (nslots - 1); names[i].name; i = (i + 1) & (nslots - 1))
		if (names[i].hash == h && strcmp(names[i].name, name) == 0)
			return &names[i];
	names[i].name = name;
	names[i].hash = h;
	return &names[i];
}

static int table_init(const struct conf *cfg)
{
	unsigned want = (unsigned)cfg->nlocks;

	for (const struct interpose_entry *w = interpose_table; w->name; w++)
		want++;
	for (nslots = 16; nslots < 4 * want; nslots *= 2)
		;
	names = calloc(nslots, sizeof(*names));
	if (!names) {
		nslots = 0;
		return -1;
	}
	for (const struct interpose_entry *w = interpose_table; w->name; w++)
		add(w->name)->wrapper = w->fn;
	for (int i = 0; i < cfg->nlocks; i++)
		add(cfg->locks[i].symbol)->spec = &cfg->locks[i];
	return 0;
}

/*
 * Checks that the methods will find every entry: each internal wrapper and
 * each lock is in the hashed table with its own wrapper or lock (not lost,
 * not displaced by a duplicate name), and each wrapper's name is defined
 * by a loaded object (a misspelt name would match no relocation). Any
 * failure is an error line: those calls would go unwrapped in silence.
 */
static void table_check(const struct conf *cfg)
{
	for (const struct interpose_entry *w = interpose_table; w->name; w++) {
		const struct redirect_name *n = redirect_find(w->name);
		const char *why = !n ? "missing from the name table" :
				  n->wrapper != w->fn ? "its name has another wrapper" :
				  !dlsym(RTLD_DEFAULT, w->name) ? "no loaded object defines it" :
				  NULL;

		if (why)
			LOG(LOG_ERROR, "internal wrapper %s is not installed: %s", w->name, why);
	}
	for (int i = 0; i < cfg->nlocks; i++) {
		const struct redirect_name *n = redirect_find(cfg->locks[i].symbol);

		if (!n || n->spec != &cfg->locks[i])
			LOG(LOG_ERROR, "locks[%d] (%s) is not in the name table; its calls stay "
			    "unguarded", cfg->locks[i].index, cfg->locks[i].symbol);
	}
}

void *redirect_target(struct redirect_name *n, void *addr)
{
	struct hook *h;

	if (!addr || addr == n->canonical || addr == n->wrapper || hook_by_stub(addr))
		return addr;
	if (!n->spec)
		return n->wrapper;
	/* guarded: the function at addr, run by the shim's wrapper if any */
	h = hook_get(n->spec, addr, n->wrapper ? n->wrapper : addr);
	if (h && __atomic_load_n(&h->entry, __ATOMIC_ACQUIRE))
		return addr; /* its entry is guarded: calls through addr are wrapped there */
	return h ? h->stub : addr;
}

void *redirect_resolved(const char *name, void *addr)
{
	struct redirect_name *n;

	if (!ready || !addr || !name || !(n = redirect_find(name)))
		return addr;
	return redirect_target(n, addr);
}

/* Returns the object containing at, or NULL. */
static struct link_map *map_of(const void *at)
{
	struct link_map *lm = NULL;
	Dl_info di;

	return dladdr1(at, &di, (void **)&lm, RTLD_DL_LINKMAP) ? lm : NULL;
}

/* Returns l's own definition of name (of version, when not NULL): what a
 * lookup in l finds, when it lies in l; else NULL. */
static void *own_definition(struct link_map *l, const char *name, const char *version)
{
	void *h = dlopen(l->l_name[0] ? l->l_name : NULL, RTLD_LAZY | RTLD_NOLOAD), *p;

	if (!h)
		return NULL;
	p = version ? dlvsym(h, name, version) : dlsym(h, name);
	dlclose(h);
	return p && map_of(p) == l ? p : NULL;
}

/* The first definition of name in an object after lm in load order. */
static void *next_after(struct link_map *lm, const char *name, const char *version)
{
	void *p = NULL;

	for (struct link_map *l = lm->l_next; l && !p; l = l->l_next)
		p = own_definition(l, name, version);
	return p;
}

void *redirect_resolved_next(const void *caller, const char *name, const char *version)
{
	struct link_map *lm = map_of(caller);
	void *p = lm ? next_after(lm, name, version) : redirect_next_definition(caller, name, version);
	struct redirect_name *n;

	if (!ready || !p || !name || !(n = redirect_find(name)))
		return p;
	if (n->spec && lm && own_definition(lm, name, version))
		return p; /* an interposer of a guarded name: wrapped at its own definition */
	return redirect_target(n, p);
}

void *redirect_next_definition(const void *after, const char *name, const char *version)
{
	struct link_map *lm = map_of(after);

	if (!lm)
		return version ? dlvsym(RTLD_NEXT, name, version) : dlsym(RTLD_NEXT, name);
	return next_after(lm, name, version);
}

static int scan_all(void)
{
	int total = 0;

	for (int i = 0; methods[i]; i++) {
		int n = methods[i]->scan(config);

		if (n < 0)
			return -1;
		LOG(LOG_DEBUG, "%s: %d call site(s) redirected", methods[i]->name, n);
		total += n;
	}
	return total;
}

/* Returns the object defining name through its dynamic symbols ("the
 * executable" for the main program), or NULL. */
static const char *defined_in(const char *name, int *in_exe)
{
	void *p = dlsym(RTLD_DEFAULT, name);
	struct link_map *lm = p ? map_of(p) : NULL;

	*in_exe = 0;
	if (!lm)
		return NULL;
	*in_exe = !lm->l_prev;
	return *in_exe ? "the executable" : lm->l_name;
}

/* Returns 1 when the executable's file defines a function name in its
 * static symbol table (.symtab). f is opened on first use. */
static int in_exe_symtab(struct symfile *f, int *opened, const char *name)
{
	if (!*opened) {
		*opened = symfile_open(f, "/proc/self/exe") == 0 ? 1 : -1;
		if (*opened < 0)
			return 0;
	}
	return *opened > 0 && symfile_find_function(f, name) != NULL;
}

void redirect_caught(struct redirect_name *n)
{
	n->caught++;
}

/* Returns 1 when a method caught a call site or the entry of name. */
static int was_caught(const char *name)
{
	const struct redirect_name *n = redirect_find(name);

	return n && (n->caught || n->entry_in);
}

/* Bytes snprintf wrote into a buffer of len bytes when it returned rc. */
static size_t wrote(int rc, size_t len)
{
	return rc < 0 ? 0 : (size_t)rc < len ? (size_t)rc : len - 1;
}

/*
 * Writes into why (len bytes) what the methods say they miss of n, defined
 * in def, joined by " and ". Returns the length.
 */
static size_t missed(const struct redirect_name *n, const char *def, int in_exe,
		     char *why, size_t len)
{
	size_t k = 0;

	why[0] = 0;
	for (int i = 0; methods[i]; i++) {
		size_t sep = k ? wrote(snprintf(why + k, len - k, " and "), len - k) : 0;
		size_t m = methods[i]->missed ?
			   methods[i]->missed(n, def, in_exe, why + k + sep, len - k - sep) : 0;

		if (m)
			k += sep + (m < len - k - sep ? m : len - k - sep - 1);
		why[k] = 0;
	}
	if (!k)
		k = wrote(snprintf(why, len, "no redirection method reaches it"), len);
	return k;
}

/* Writes one line of `lockshim check -- PROGRAM` to fd. */
static void check_line(int fd, const char *fmt, ...)
{
	char line[1024];
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(line, sizeof(line) - 1, fmt, ap);
	va_end(ap);
	if (n < 0)
		return;
	if ((size_t)n > sizeof(line) - 2)
		n = (int)sizeof(line) - 2;
	line[n++] = '\n';
	if (write(fd, line, (size_t)n) < 0) {
		/* the check's reader is gone: nothing else to tell */
	}
}

/* Returns whether a lock's `object` names a library that is not loaded
 * (neither by a name it was loaded by, its soname, nor as the same file)
 * and, when a path, is there: its calls are guarded when dlopen loads it,
 * not "never". */
static int not_loaded_yet(const char *object)
{
	void *h;

	if (!object || !strcmp(object, "main") || (strchr(object, '/') && access(object, R_OK)))
		return 0; /* a path to no file: never */
	if ((h = dlopen(object, RTLD_LAZY | RTLD_NOLOAD))) {
		dlclose(h);
		return 0;
	}
	return 1;
}

/*
 * Writes into why (len bytes) where the unguarded name n is defined and what
 * the methods miss there. Returns the log level the report uses for it.
 */
static int unguarded_why(const struct lock_spec *l, const struct redirect_name *n,
			 struct symfile *exe, int *opened, char *why, size_t len)
{
	const char *where;
	int in_exe = 0;
	size_t k;

	where = defined_in(l->symbol, &in_exe);
	if (!where && in_exe_symtab(exe, opened, l->symbol)) {
		where = "the executable";
		in_exe = 1;
	}
	if (!where) {
		k = wrote(snprintf(why, len, "%s: no loaded object calls or defines it (a typo, or "
				   "another program?); libraries loaded later with dlopen are "
				   "scanned then", l->symbol), len);
		/* where entry patching looked for it (a stripped executable's debug files) */
		if (n && k + 2 < len && redirect_entry.missed(n, NULL, 0, why + k + 2, len - k - 2))
			memcpy(why + k, "; ", 2);
		return LOG_WARN;
	}
	k = wrote(snprintf(why, len, "%s is defined in %s and ", l->symbol, where), len);
	k += missed(n, where, in_exe, why + k, len - k);
	if (in_exe)
		return LOG_WARN;
	snprintf(why + k, len - k, "; libraries loaded later with dlopen are scanned then");
	return LOG_INFO; /* a library function this program does not use */
}

/* After a guarded lock's line: a Go program's caveat (golang_why), at warn. */
static void cgo_note(int go, int check_fd, const char *why)
{
	if (go == GOLANG_CGO_ONLY && check_fd >= 0)
		check_line(check_fd, "%s", why);
	else if (go == GOLANG_CGO_ONLY)
		LOG(LOG_WARN, "%s", why);
}

/*
 * Says how lock l is caught (entry, reloc), or that its object is not
 * loaded yet (deferred: later, not never), on check_fd or in the log, with
 * a Go program's caveat (go, why: golang_why's). Returns 1 when it said so,
 * 0 when l is unguarded so far.
 */
static int say_caught(const struct lock_spec *l, const struct redirect_name *n, int go,
		      const char *why, int check_fd)
{
	const char *where;
	int in_exe;

	if (n && n->entry_in) {
		if (check_fd >= 0)
			check_line(check_fd, "%s: entry in %s", l->symbol, n->entry_in);
	} else if (n && n->caught) {
		if (check_fd >= 0) {
			where = defined_in(l->symbol, &in_exe);
			check_line(check_fd, "%s: reloc (%d call site%s) in %s", l->symbol,
				   n->caught, n->caught == 1 ? "" : "s",
				   where ? where : "an object loaded with it");
		}
	} else if (not_loaded_yet(l->object)) {
		if (check_fd >= 0)
			check_line(check_fd, "%s: deferred: %s is not loaded at start-up; "
				   "it is scanned when dlopen loads it", l->symbol, l->object);
		else
			LOG(LOG_INFO, "%s: %s is not loaded yet; it is scanned when dlopen "
			    "loads it", l->symbol, l->object);
		return 1;
	} else {
		return 0;
	}
	cgo_note(go, check_fd, why);
	return 1;
}

/*
 * Says that lock l is unguarded (why, at level; SIBLING_COVERED: a sibling
 * it names is guarded) on check_fd or in the log. Returns 1 when it counts
 * as unguarded for `check`, 0 when not, -1 with err when the program must
 * stop (l is strict).
 */
static int say_unguarded(const struct lock_spec *l, int level, const char *why,
			 int check_fd, char *err, size_t errlen)
{
	if (check_fd >= 0) {
		check_line(check_fd, "%s: unguarded: %s", l->symbol, why);
		return level != SIBLING_COVERED;
	}
	if (l->strict && level != SIBLING_COVERED) {
		snprintf(err, errlen, "locks[%d] (%s) cannot be guarded in this program and "
			 "is strict: %s", l->index, l->symbol, why);
		return -1;
	}
	LOG(level == SIBLING_COVERED ? LOG_INFO : level, "%s", why);
	return 0;
}

/*
 * Says, once, which locks have no call site (or entry) any method could
 * redirect, where their function is defined, and what the methods miss.
 * Returns 0, or -1 with err set for the first such lock that is `strict`,
 * or whose entry had to be patched (method "entry") and could not be.
 * With check_fd >= 0: one line per lock there instead (redirect_init),
 * and returns the number of unguarded locks.
 */
static int report(const struct conf *cfg, int check_fd, char *err, size_t errlen)
{
	struct symfile exe;
	int opened = 0, rc = 0, unguarded = 0;

	for (int i = 0; i < cfg->nlocks; i++) {
		const struct lock_spec *l = &cfg->locks[i];
		const struct redirect_name *n = redirect_find(l->symbol);
		char why[1000];
		int level = LOG_WARN, go, r;

		if (n && n->refused) {
			if (check_fd >= 0) {
				check_line(check_fd, "%s: unguarded: %s (the program would stop "
					   "with status %d)", l->symbol, n->refused, CONF_EXIT_CODE);
				unguarded++;
				continue;
			}
			snprintf(err, errlen, "locks[%d] (%s): %s", l->index, l->symbol, n->refused);
			rc = -1;
			break;
		}
		/* a Go program: only cgo calls reach libc (golang.c) */
		go = golang_why(l->symbol, why, sizeof(why));
		if (go != GOLANG_UNGUARDED) {
			if (say_caught(l, n, go, why, check_fd))
				continue;
			level = unguarded_why(l, n, &exe, &opened, why, sizeof(why));
			level = sibling_note(cfg, l, was_caught, why, sizeof(why), level);
		}
		if ((r = say_unguarded(l, level, why, check_fd, err, errlen)) < 0) {
			rc = -1;
			break;
		}
		unguarded += r;
	}
	if (opened > 0)
		symfile_close(&exe);
	return check_fd >= 0 ? unguarded : rc;
}

int redirect_init(const struct conf *cfg, int check_fd, char *err, size_t errlen)
{
	config = cfg;
	if (table_init(cfg) != 0) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	table_check(cfg);
	__atomic_store_n(&ready, 1, __ATOMIC_RELEASE);
	if (scan_all() < 0) {
		LOG(LOG_ERROR, "redirection failed; some calls may stay unguarded");
		if (check_fd < 0)
			return 0;
	}
	return report(cfg, check_fd, err, errlen);
}

void redirect_refresh(void)
{
	if (!__atomic_load_n(&ready, __ATOMIC_ACQUIRE))
		return;
	pthread_mutex_lock(&mu);
	scan_all();
	pthread_mutex_unlock(&mu);
}
