/* SPDX-License-Identifier: MIT */
/*
 * hook.c - the registry of hooks and their stubs (see hook.h).
 *
 * Stubs are packed into pages that are writable only while a stub is being
 * written (then read+execute); when the system refuses to make a page
 * writable again, the next stub starts a fresh page. Creation is serialised
 * by a mutex; lookups read a published count and never lock.
 */
#include "hook.h"

#include <pthread.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "log.h"
#include "arch.h"

#define HOOK_MAX 4096

static struct hook *hooks[HOOK_MAX];
static int nhooks;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static unsigned char *page;
static size_t page_used, page_size;

/* Returns room for one stub in a writable page, or NULL. Holds mu. */
static unsigned char *stub_slot(void)
{
	size_t sz = arch_stub_size();

	if (!page_size)
		page_size = (size_t)sysconf(_SC_PAGESIZE);
	if (page && page_used + sz <= page_size &&
	    mprotect(page, page_size, PROT_READ | PROT_WRITE | PROT_EXEC) == 0)
		return page + page_used;
	page = mmap(NULL, page_size, PROT_READ | PROT_WRITE,
		    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (page == MAP_FAILED) {
		page = NULL;
		return NULL;
	}
	page_used = 0;
	return page;
}

static struct hook *find(const struct lock_spec *spec, void *target)
{
	int n = __atomic_load_n(&nhooks, __ATOMIC_ACQUIRE);

	for (int i = 0; i < n; i++)
		if (hooks[i]->spec == spec && hooks[i]->target == target)
			return hooks[i];
	return NULL;
}

struct hook *hook_get(const struct lock_spec *spec, void *target, void *call)
{
	struct hook *h;
	unsigned char *at;

	pthread_mutex_lock(&mu);
	h = find(spec, target);
	if (h)
		goto out;
	if (nhooks == HOOK_MAX || !(h = malloc(sizeof(*h))) || !(at = stub_slot())) {
		LOG(LOG_ERROR, "%s: cannot create a hook (limit %d or no memory); "
		    "calls stay unguarded", spec->symbol, HOOK_MAX);
		free(h);
		h = NULL;
		goto out;
	}
	h->spec = spec;
	h->target = target;
	h->call = call;
	h->stub = at;
	h->entry = 0;
	arch_write_stub(at, h);
	page_used += arch_stub_size();
	mprotect(page, page_size, PROT_READ | PROT_EXEC);
	__builtin___clear_cache((char *)at, (char *)at + arch_stub_size());
	hooks[nhooks] = h;
	__atomic_store_n(&nhooks, nhooks + 1, __ATOMIC_RELEASE);
out:
	pthread_mutex_unlock(&mu);
	return h;
}

const struct hook *hook_by_stub(const void *addr)
{
	int n = __atomic_load_n(&nhooks, __ATOMIC_ACQUIRE);

	for (int i = 0; i < n; i++)
		if (hooks[i]->stub == addr)
			return hooks[i];
	return NULL;
}
