/* SPDX-License-Identifier: MIT */
/*
 * patchmem.h - code memory near a patched function, and writes into code.
 *
 * A patched entry reaches its stub, and the relocated copy reaches the rest
 * of the function, by direct jumps: both live within arch_entry_reach of
 * the function. Blocks are carved from pages mapped near it (probed with
 * MAP_FIXED_NOREPLACE, below the function first, so that the heap's room
 * above an executable stays free). Pages are writable while filled and
 * become read+execute at patchmem_seal; a sealed page is never made
 * writable again (another thread may run it), later blocks start new
 * pages. Blocks are never freed: a saved pointer may reach them forever.
 * Not thread-safe: called under redirect.c's scan lock.
 */
#ifndef LOCKSHIM_PATCHMEM_H
#define LOCKSHIM_PATCHMEM_H

#include <stddef.h>

/* Returns n bytes (at most a page) of writable memory within reach bytes
 * of near, or NULL. */
void *patchmem_alloc(const void *near, size_t n, size_t reach);

/* Makes every page handed out since the last call read+execute. Returns 0,
 * or -errno. */
int patchmem_seal(void);

/*
 * Writes len bytes over the code at code, in a mapping whose protection is
 * prot (PROT_* of its segment), and restores that protection. The pages
 * stay executable meanwhile where the system allows writable+executable
 * pages; else, only when alone (no other thread runs), they are writable
 * alone for the write. A patch inside one aligned 8-byte word is one
 * atomic store. Returns 0, or -errno.
 */
int patchmem_write(void *code, const void *bytes, size_t len, int prot, int alone);

#endif
