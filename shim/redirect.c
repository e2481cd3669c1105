/* SPDX-License-Identifier: MIT */
/*
 * redirect.c - runs the redirection methods (see redirect.h).
 *
 * A mutex serialises scans: dlopen may be called from several threads.
 */
#include "redirect.h"

#include <pthread.h>

#include "hook.h"
#include "log.h"

static const struct redirect_method *const methods[] = { &redirect_reloc, NULL };
static const struct config *cfg;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static int scan_all(void)
{
	int total = 0;

	for (int i = 0; methods[i]; i++) {
		int n = methods[i]->scan(cfg);

		if (n < 0)
			return -1;
		LOG(LOG_DEBUG, "%s: %d call site(s) redirected", methods[i]->name, n);
		total += n;
	}
	return total;
}

int redirect_init(const struct config *c)
{
	cfg = c;
	return scan_all() < 0 ? -1 : 0;
}

void redirect_refresh(void)
{
	if (!cfg)
		return;
	pthread_mutex_lock(&mu);
	scan_all();
	pthread_mutex_unlock(&mu);
}

void *redirect_resolved(const char *name, void *addr)
{
	const struct lock_spec *s;
	struct hook *h;

	if (!cfg || !addr || !name || !(s = config_find(cfg, name)))
		return addr;
	if (hook_by_stub(addr))
		return addr;
	h = hook_get(s, addr);
	return h ? h->stub : addr;
}
