/* SPDX-License-Identifier: MIT */
/*
 * patchmem.c - code memory near a patched function, and writes into code
 * (see patchmem.h).
 *
 * Near pages are found by probing: mmap with MAP_FIXED_NOREPLACE at 1 MiB
 * steps below the function, then above it, while within reach (a kernel
 * older than 4.17 takes the flag as a hint: a page elsewhere is unmapped
 * and the probe goes on). The pages in use are a small fixed table.
 */
#include "patchmem.h"

#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif

#define PAGES_MAX 256
#define PROBE_STEP (1UL << 20)

static struct page {
	uintptr_t addr;
	size_t used;
	int sealed;
} pages[PAGES_MAX];
static int npages;

static size_t page_size(void)
{
	return (size_t)sysconf(_SC_PAGESIZE);
}

static int within(uintptr_t a, uintptr_t b, size_t reach)
{
	return (a > b ? a - b : b - a) <= reach;
}

/* Maps one page within reach of near. Returns its address, or 0. */
static uintptr_t map_near(uintptr_t near, size_t reach)
{
	size_t pg = page_size();
	uintptr_t base = near & ~(uintptr_t)(pg - 1);

	for (int dir = -1; dir <= 1; dir += 2) {
		for (uintptr_t k = 1; k * PROBE_STEP + pg <= reach; k++) {
			uintptr_t want = dir < 0 ? base - k * PROBE_STEP : base + k * PROBE_STEP;
			void *p;

			if ((dir < 0 && want > base) || (dir > 0 && want < base) || want < (1UL << 16))
				break; /* wrapped around, or below mmap_min_addr */
			p = mmap((void *)want, pg, PROT_READ | PROT_WRITE,
				 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
			if (p == MAP_FAILED) {
				if (errno == EEXIST || errno == EPERM)
					continue;
				return 0;
			}
			if (within((uintptr_t)p, near, reach) && within((uintptr_t)p + pg, near, reach))
				return (uintptr_t)p;
			munmap(p, pg); /* the flag was taken as a hint */
		}
	}
	return 0;
}

void *patchmem_alloc(const void *nearv, size_t n, size_t reach)
{
	uintptr_t near = (uintptr_t)nearv, a;
	size_t pg = page_size();

	n = (n + 15) & ~(size_t)15;
	if (n > pg)
		return NULL;
	for (int i = 0; i < npages; i++) {
		struct page *p = &pages[i];

		if (!p->sealed && p->used + n <= pg && within(p->addr, near, reach) &&
		    within(p->addr + pg, near, reach)) {
			p->used += n;
			return (void *)(p->addr + p->used - n);
		}
	}
	if (npages == PAGES_MAX || !(a = map_near(near, reach)))
		return NULL;
	pages[npages++] = (struct page){ a, n, 0 };
	return (void *)a;
}

int patchmem_seal(void)
{
	int rc = 0;

	for (int i = 0; i < npages; i++) {
		if (pages[i].sealed)
			continue;
		if (mprotect((void *)pages[i].addr, page_size(), PROT_READ | PROT_EXEC) != 0)
			rc = -errno;
		__builtin___clear_cache((char *)pages[i].addr, (char *)pages[i].addr + pages[i].used);
		pages[i].sealed = 1;
	}
	return rc;
}

/*
 * Stores len bytes into code that mprotect made writable: up to 8 bytes
 * within one aligned word with one atomic store (a thread running the code
 * sees the old or the new bytes), more byte by byte. Not instrumented, and
 * no memcpy: ThreadSanitizer backs the shadow of read-only mappings with
 * one read-only page and does not see mprotect, so its checked store (or
 * its memcpy interceptor) into code faults; code is no data it could judge.
 */
__attribute__((no_sanitize("thread"))) static void store_code(uintptr_t a, const void *bytes,
							       size_t len)
{
	if ((a & 7) + len <= 8) {
		uint64_t word, *w = (uint64_t *)(a & ~(uintptr_t)7);

		memcpy(&word, w, 8);
		memcpy((char *)&word + (a & 7), bytes, len);
		__atomic_store_n(w, word, __ATOMIC_SEQ_CST);
	} else {
		for (size_t i = 0; i < len; i++)
			((volatile char *)a)[i] = ((const char *)bytes)[i];
	}
}

int patchmem_write(void *code, const void *bytes, size_t len, int prot, int alone)
{
	size_t pg = page_size();
	uintptr_t a = (uintptr_t)code, lo = a & ~(uintptr_t)(pg - 1);
	size_t span = ((a + len + pg - 1) & ~(uintptr_t)(pg - 1)) - lo;
	int e;

	if (mprotect((void *)lo, span, PROT_READ | PROT_WRITE | PROT_EXEC) != 0) {
		e = errno;
		if (!alone || mprotect((void *)lo, span, PROT_READ | PROT_WRITE) != 0)
			return -(errno ? errno : e);
	}
	store_code(a, bytes, len);
	__builtin___clear_cache((char *)code, (char *)code + len);
	return mprotect((void *)lo, span, prot) == 0 ? 0 : -errno;
}
