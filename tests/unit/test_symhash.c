/* SPDX-License-Identifier: MIT */
/*
 * test_symhash.c - dynamic symbols by name through DT_GNU_HASH and DT_HASH:
 * lookups in this process's own libc and executable against dlsym, and in
 * tables built here (names of one bucket, versions of one name, undefined
 * symbols) in heap blocks of their exact size, so that ASan sees any read
 * past them; then hostile and truncated tables (indexes out of range,
 * chains without an end or with a loop, huge counts, names past the string
 * table or unterminated, a segment cut short), which must give "not
 * found", never a fault.
 */
#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "symhash.h"
#include "test.h"

/* ---- this process's own objects ---------------------------------------- */

struct found {
	const char *part;       /* in: a substring of the object's name; "" the executable */
	struct symhash h;
	uintptr_t base;
	int ok;
};

static int pick(struct dl_phdr_info *info, size_t size, void *data)
{
	struct found *f = data;
	const char *name = info->dlpi_name ? info->dlpi_name : "";

	(void)size;
	if (f->ok || (f->part[0] ? !strstr(name, f->part) : name[0] != 0))
		return 0;
	f->base = info->dlpi_addr;
	f->ok = symhash_init(&f->h, info->dlpi_addr, info->dlpi_phdr, info->dlpi_phnum) == 0;
	return f->ok;
}

static void test_own_objects(void)
{
	struct found libc = { .part = "libc.so" }, exe = { .part = "" };
	size_t idx[8], n;
	void *h = dlopen("libc.so.6", RTLD_LAZY | RTLD_NOLOAD);

	dl_iterate_phdr(pick, &libc);
	dl_iterate_phdr(pick, &exe);
	test("libc's tables are found");
	test_cond(libc.ok && h);
	if (!libc.ok || !h)
		return;
	test("getpid: one definition, at dlsym's address");
	n = symhash_find(&libc.h, "getpid", idx, 8);
	test_cond(n == 1 && libc.base + libc.h.syms[idx[0]].st_value == (uintptr_t)dlsym(h, "getpid"));
	test("realpath: two versions, in table order");
	n = symhash_find(&libc.h, "realpath", idx, 8);
	test_cond(n >= 2 && idx[0] < idx[1]);
	test("a name libc does not have");
	test_cond(symhash_find(&libc.h, "symhash_no_such_name", idx, 8) == 0);
	test_cond(symhash_find(&libc.h, "", idx, 8) == 0);
	test("libc defines getpid: it does not import it");
	test_cond(!symhash_imports(&libc.h, "getpid"));
	test("this executable imports getpid (it calls it), not an unknown name");
	test_cond(getpid() > 0 && exe.ok && symhash_imports(&exe.h, "getpid"));
	test_cond(exe.ok && !symhash_imports(&exe.h, "symhash_no_such_name"));
	dlclose(h);
}

/* ---- tables built here ---------------------------------------------------- */

#define NSYM_MAX 16

/* One image: a dynamic section, symbols, strings and a hash table, in a
 * heap block of its exact size; one PT_LOAD over it, PT_DYNAMIC at its
 * start; base 0, so the tables' addresses are their pointers. */
struct image {
	unsigned char *mem;
	size_t size;
	ElfW(Phdr) ph[2];
	ElfW(Dyn) *dyn;
	ElfW(Sym) *syms;
	char *strs;
	uint32_t *hash; /* gnu or sysv */
	size_t nsyms, strsz, hashwords;
	size_t at[NSYM_MAX]; /* the symbol index of each name given */
};

static int by_bucket(const void *a, const void *b, void *nb)
{
	uint32_t x = symhash_gnu(*(const char *const *)a) % *(uint32_t *)nb;
	uint32_t y = symhash_gnu(*(const char *const *)b) % *(uint32_t *)nb;

	return x < y ? -1 : x > y;
}

/*
 * Builds an image of names[0..n): the first nundef undefined, the rest
 * defined functions (value 0x1000 + 16 * their index in names), with a
 * DT_GNU_HASH of nbuckets buckets (gnu) or a DT_HASH. Returns 0 or -1.
 */
static int build(struct image *im, const char *const *names, int n, int nundef,
		 uint32_t nbuckets, int gnu)
{
	const char *order[NSYM_MAX];
	size_t strsz = 1, nsyms = (size_t)n + 1, words, symoffset = (size_t)nundef + 1;
	int k;

	memset(im, 0, sizeof(*im));
	for (k = 0; k < n; k++)
		strsz += strlen(names[k]) + 1;
	words = gnu ? 4 + 2 + nbuckets + (nsyms - symoffset) : 2 + nbuckets + nsyms;
	/* the hash table last: ASan sees a read past it */
	im->size = 8 * sizeof(ElfW(Dyn)) + nsyms * sizeof(ElfW(Sym)) + ((strsz + 7) & ~7ul) +
		   words * 4;
	if (!(im->mem = calloc(1, im->size)))
		return -1;
	im->dyn = (ElfW(Dyn) *)im->mem;
	im->syms = (ElfW(Sym) *)(im->dyn + 8);
	im->strs = (char *)(im->syms + nsyms);
	im->hash = (uint32_t *)(im->strs + ((strsz + 7) & ~7ul));
	im->nsyms = nsyms;
	im->strsz = strsz;
	im->hashwords = words;
	/* the undefined first, then the defined in bucket order (gnu) */
	memcpy(order, names, (size_t)n * sizeof(*order));
	if (gnu)
		qsort_r(order + nundef, (size_t)(n - nundef), sizeof(*order), by_bucket, &nbuckets);
	strsz = 1;
	for (k = 0; k < n; k++) {
		ElfW(Sym) *s = &im->syms[k + 1];
		int given = 0;

		while (names[given] != order[k])
			given++;
		im->at[given] = (size_t)k + 1;
		s->st_name = (uint32_t)strsz;
		s->st_info = ELF64_ST_INFO(STB_GLOBAL, k < nundef ? STT_NOTYPE : STT_FUNC);
		s->st_shndx = k < nundef ? SHN_UNDEF : 1;
		s->st_value = k < nundef ? 0 : 0x1000 + 16 * (size_t)given;
		memcpy(im->strs + strsz, order[k], strlen(order[k]) + 1);
		strsz += strlen(order[k]) + 1;
	}
	if (gnu) {
		uint32_t *buckets = im->hash + 6, *chain = buckets + nbuckets;

		im->hash[0] = nbuckets;
		im->hash[1] = (uint32_t)symoffset;
		im->hash[2] = 1; /* one bloom word (64 bits), not read */
		im->hash[3] = 6;
		for (size_t i = symoffset; i < nsyms; i++) {
			uint32_t hv = symhash_gnu(im->strs + im->syms[i].st_name), b = hv % nbuckets;
			int last = i + 1 == nsyms ||
				   symhash_gnu(im->strs + im->syms[i + 1].st_name) % nbuckets != b;

			if (!buckets[b])
				buckets[b] = (uint32_t)i;
			chain[i - symoffset] = (hv & ~1u) | (uint32_t)last;
		}
	} else {
		uint32_t *buckets = im->hash + 2, *chain = buckets + nbuckets;

		im->hash[0] = nbuckets;
		im->hash[1] = (uint32_t)nsyms;
		for (size_t i = 1; i < nsyms; i++) {
			uint32_t b = symhash_sysv(im->strs + im->syms[i].st_name) % nbuckets;

			chain[i] = buckets[b];
			buckets[b] = (uint32_t)i;
		}
	}
	im->dyn[0] = (ElfW(Dyn)){ DT_SYMTAB, { (ElfW(Addr))im->syms } };
	im->dyn[1] = (ElfW(Dyn)){ DT_STRTAB, { (ElfW(Addr))im->strs } };
	im->dyn[2] = (ElfW(Dyn)){ DT_STRSZ, { im->strsz } };
	im->dyn[3] = (ElfW(Dyn)){ gnu ? DT_GNU_HASH : DT_HASH, { (ElfW(Addr))im->hash } };
	im->dyn[4] = (ElfW(Dyn)){ DT_NULL, { 0 } };
	im->ph[0] = (ElfW(Phdr)){ .p_type = PT_LOAD, .p_vaddr = (ElfW(Addr))im->mem,
				  .p_memsz = im->size };
	im->ph[1] = (ElfW(Phdr)){ .p_type = PT_DYNAMIC, .p_vaddr = (ElfW(Addr))im->mem,
				  .p_memsz = 8 * sizeof(ElfW(Dyn)) };
	return 0;
}

static int init(struct image *im, struct symhash *h)
{
	return symhash_init(h, 0, im->ph, 2);
}

/* Returns how many symbols named name h finds (their indexes in idx). */
static size_t find(const struct symhash *h, const char *name, size_t *idx)
{
	return symhash_find(h, name, idx, 8);
}

static const char *const NAMES[] = { "imported_a", "imported_b", "alpha", "beta", "gamma",
				     "delta", "epsilon", "zeta", "eta", "theta", "a" };
#define NNAMES 11
#define NUNDEF 2

static void test_built(int gnu)
{
	struct image im;
	struct symhash h;
	size_t idx[8];
	int all = 1;

	test(gnu ? "gnu: built" : "sysv: built");
	test_cond(build(&im, NAMES, NNAMES, NUNDEF, 3, gnu) == 0 && init(&im, &h) == 0);
	if (!im.mem)
		return;
	test(gnu ? "gnu: every defined name, several per bucket" :
		   "sysv: every defined name, several per bucket");
	for (int k = NUNDEF; k < NNAMES; k++)
		all &= find(&h, NAMES[k], idx) == 1 && idx[0] == im.at[k] &&
		       h.syms[idx[0]].st_value == 0x1000 + 16 * (size_t)k;
	test_cond(all);
	test("absent names");
	test_cond(find(&h, "omega", idx) == 0 && find(&h, "alph", idx) == 0 &&
		  find(&h, "alphaa", idx) == 0);
	test("imports: the undefined ones only");
	test_cond(symhash_imports(&h, "imported_a") && symhash_imports(&h, "imported_b"));
	test_cond(!symhash_imports(&h, "alpha") && !symhash_imports(&h, "omega"));
	if (gnu) {
		test("gnu: the undefined are not hashed");
		test_cond(find(&h, "imported_a", idx) == 0);
	}
	free(im.mem);
}

static void test_versions(int gnu)
{
	static const char *const names[] = { "dup", "other", "dup" };
	struct image im;
	struct symhash h;
	size_t idx[8];

	test("two symbols of one name: both, ascending");
	test_cond(build(&im, names, 3, 0, 2, gnu) == 0 && init(&im, &h) == 0);
	if (!im.mem)
		return;
	test_cond(find(&h, "dup", idx) == 2 && idx[0] < idx[1]);
	test("max 1: counted, one written");
	test_cond(symhash_find(&h, "dup", idx, 1) == 2);
	free(im.mem);
}

/* Builds the standard image, breaks it with how, and checks that nothing is
 * found past the break and nothing faults. */
static void test_hostile(int gnu)
{
	struct image im;
	struct symhash h;
	size_t idx[8];
	uint32_t *buckets;

	/* a bucket pointing past every symbol */
	test("bucket index out of range");
	if (build(&im, NAMES, NNAMES, NUNDEF, 3, gnu) == 0) {
		buckets = im.hash + (gnu ? 6 : 2);
		for (int b = 0; b < 3; b++)
			buckets[b] = 0x7fffffff;
		test_cond(init(&im, &h) == 0 && find(&h, "alpha", idx) == 0 &&
			  find(&h, "zeta", idx) == 0);
		free(im.mem);
	}
	test("chains without an end (gnu) or with a loop (sysv)");
	if (build(&im, NAMES, NNAMES, NUNDEF, 3, gnu) == 0) {
		uint32_t *chain = im.hash + (gnu ? 6 : 2) + 3;

		for (size_t i = 0; i < (gnu ? im.nsyms - NUNDEF - 1 : im.nsyms); i++)
			chain[i] = gnu ? chain[i] & ~1u : (uint32_t)i;
		test_cond(init(&im, &h) == 0);
		find(&h, "omega", idx); /* ends */
		test_cond(1);
		free(im.mem);
	}
	test("huge bucket and bloom counts");
	if (build(&im, NAMES, NNAMES, NUNDEF, 3, gnu) == 0) {
		im.hash[0] = 0xffffffffu;
		if (gnu)
			im.hash[2] = 0xffffffffu;
		test_cond(init(&im, &h) == 0 && find(&h, "alpha", idx) == 0);
		im.hash[0] = 0;
		test_cond(find(&h, "alpha", idx) == 0);
		if (gnu) {
			im.hash[0] = 3;
			im.hash[1] = 0xffffffffu; /* symoffset past every symbol */
			test_cond(find(&h, "alpha", idx) == 0 && symhash_imports(&h, "imported_a") &&
				  !symhash_imports(&h, "alpha"));
		}
		free(im.mem);
	}
	test("a name past the string table, and one not terminated inside it");
	if (build(&im, NAMES, NNAMES, NUNDEF, 3, gnu) == 0) {
		size_t last = 1, first = NUNDEF + 1;
		const char *lastname, *firstname;

		for (size_t i = 1; i < im.nsyms; i++) {
			if (im.syms[i].st_name > im.syms[last].st_name)
				last = i;
			if (im.syms[i].st_name < im.syms[first].st_name && i > NUNDEF)
				first = i;
		}
		lastname = im.strs + im.syms[last].st_name;
		firstname = im.strs + im.syms[first].st_name;
		/* the table ends one byte into the last name: it is not found */
		im.dyn[2].d_un.d_val = im.syms[last].st_name + 1;
		test_cond(init(&im, &h) == 0 && find(&h, lastname, idx) == 0 &&
			  find(&h, firstname, idx) == 1);
		im.syms[first].st_name = 0xfffffff0u;
		test_cond(init(&im, &h) == 0 && find(&h, firstname, idx) == 0);
		free(im.mem);
	}
	test("tables cut short by the end of their segment");
	if (build(&im, NAMES, NNAMES, NUNDEF, 3, gnu) == 0) {
		int found = 0, ok;

		/* the segment ends inside the hash table (gnu: after its buckets;
		 * sysv: inside them): the words past its end are not read */
		im.ph[0].p_memsz = (size_t)((unsigned char *)im.hash - im.mem) + (gnu ? 9 : 4) * 4;
		ok = init(&im, &h) == 0;
		for (int k = NUNDEF; ok && k < NNAMES; k++)
			found += find(&h, NAMES[k], idx) != 0;
		test_cond(ok && found == 0);
		/* it ends before the string table: no table */
		im.ph[0].p_memsz = (size_t)((unsigned char *)im.strs - im.mem);
		test_cond(init(&im, &h) != 0);
		/* a dynamic section without DT_NULL inside its segment */
		im.ph[0].p_memsz = 3 * sizeof(ElfW(Dyn));
		test_cond(init(&im, &h) != 0);
		free(im.mem);
	}
	test("no hash table: nothing to look up");
	if (build(&im, NAMES, NNAMES, NUNDEF, 3, gnu) == 0) {
		im.dyn[3].d_tag = DT_NEEDED;
		test_cond(init(&im, &h) != 0);
		free(im.mem);
	}
}

int main(void)
{
	test("the hash functions (the ELF specification's and GNU's examples)");
	test_cond(symhash_gnu("") == 5381 && symhash_gnu("printf") == 0x156b2bb8u);
	test_cond(symhash_sysv("") == 0 && symhash_sysv("printf") == 0x077905a6u);
	test_own_objects();
	for (int gnu = 0; gnu < 2; gnu++) {
		test_built(gnu);
		test_versions(gnu);
		test_hostile(gnu);
	}
	return test_report("symhash");
}
