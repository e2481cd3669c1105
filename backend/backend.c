/* SPDX-License-Identifier: MIT */
/*
 * backend.c - choosing the backend that serves a config (see backend.h).
 *
 * The table lists every backend in order of preference; the first whose
 * serves() accepts the `redis` group wins, so a new topology (Sentinel,
 * Cluster, several masters) is its own file plus one line here. The shim
 * and `lockshim check` both choose here, so they always agree.
 */
#include "backend.h"

#include <stdio.h>

static const struct backend_ops *const backends[] = {
	&backend_redlock,
	&backend_sentinel,
	&backend_cluster,
	&backend_redis,
};

int backend_init(struct backend *b, const struct redis_spec *r, char *err, size_t errlen)
{
	b->ops = NULL;
	b->cfg = NULL;
	for (size_t i = 0; i < sizeof(backends) / sizeof(backends[0]); i++) {
		if (!backends[i]->serves(r))
			continue;
		b->cfg = backends[i]->config_new(r, err, errlen);
		if (!b->cfg)
			return -1;
		b->ops = backends[i];
		return 0;
	}
	snprintf(err, errlen, "no backend serves this redis configuration");
	return -1;
}

void backend_release(struct backend *b)
{
	if (b->ops)
		b->ops->config_free(b->cfg);
	b->ops = NULL;
	b->cfg = NULL;
}
