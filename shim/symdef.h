/* SPDX-License-Identifier: MIT */
/*
 * symdef.h - where functions are defined inside one loaded object.
 *
 * Entry patching needs the address and size of a function that the object
 * may not export. Names are looked up in the order gdb uses: the object's
 * dynamic symbols (in memory, through their hash table: no walk), the
 * symbol table of its file on disk (.symtab), then its separate debug
 * file: by build-id under each debug directory (DIR/.build-id/NN/REST.debug),
 * then by .gnu_debuglink next to the object, in its .debug/ and under each
 * debug directory + the object's directory. A debug file whose build-id
 * differs from the object's is not used. A name the object imports (an
 * undefined dynamic symbol) is not its own: its static tables are not read
 * for it, so a lock on a library function costs a large program nothing.
 * Otherwise each static table is walked once for all the names asked (a
 * small hash of them behind a filter of their first bytes); it also shows
 * the compiler's clones of each name (name.isra.N, name.constprop.N,
 * name.part.N, name.cold), which calls can reach without passing through
 * the patched entry.
 */
#ifndef LOCKSHIM_SYMDEF_H
#define LOCKSHIM_SYMDEF_H

#include <link.h>
#include <stddef.h>
#include <stdint.h>

/* One loaded object, as dl_iterate_phdr describes it. */
struct symdef_object {
	const char *name;        /* dlpi_name: "" for the executable */
	uintptr_t base;          /* load bias */
	const ElfW(Phdr) *phdr;
	int phnum;
};

/* One name asked for, and what was found. */
struct symdef {
	const char *name;        /* in: the symbol-table name (mangled for C++) */
	uintptr_t addr;          /* out: the run-time address; 0: not found */
	size_t size;             /* out: bytes, from the symbol; 0: unknown */
	int more;                /* out: other definitions of name at other
				  * addresses (static functions of several files) */
	int ifunc;               /* out: an IFUNC (its resolver, not the function) */
	int imported;            /* out: not found, and the object imports name (an
				  * undefined dynamic symbol): its .symtab and
				  * debug file were not searched for it */
	const char *source;      /* out: "dynamic symbols", "symbol table" or
				  * "debug file" */
	char clones[160];        /* out: the clones' names, ", "-separated (cut
				  * with "..." when longer) */
};

/* What symdef_find looked at in one object, for the message about a
 * definition it did not find. */
struct symdef_search {
	int symtab;              /* out: its file has a symbol table (.symtab);
				  * 0 too when the file was not read (every
				  * name asked was imported) */
	int ntried;              /* out: debug-file paths tried and not used */
	int nlisted;             /* out: how many of them are in tried */
	char tried[2048];        /* out: those paths, each NUL-terminated, one
				  * after the other; " (not its debug file)"
				  * after one that is there but is not o's (another
				  * build-id, no symbols), " (unreadable)" */
};

/*
 * Looks defs[0..n) up in o, whose file is path (symdef_path's; NULL or "":
 * its dynamic symbols only), dirs being the debug directories
 * (NULL-terminated). Returns how many were found (a name o imports is not
 * looked for past its dynamic symbols: imported). Writes the debug file
 * read, if any, into debug (len bytes; "" when none), and, when s is not
 * NULL, what was searched into s.
 */
int symdef_find(const struct symdef_object *o, const char *path, struct symdef *defs, int n,
		char *const *dirs, char *debug, size_t len, struct symdef_search *s);

/* Writes the path of o's file into path (len bytes): its name, or the
 * executable's real path. Returns 0, or -1. */
int symdef_path(const struct symdef_object *o, char *path, size_t len);

/* Writes o's GNU build-id (from its note segments in memory) into hex,
 * lowercase. Returns 1 when o has one, else 0. */
int symdef_build_id(const struct symdef_object *o, char *hex, size_t len);

#endif
