/* SPDX-License-Identifier: MIT */
/*
 * backend.c - choosing the backend that serves a config (see backend.h).
 *
 * The table lists every backend in order of preference; among those whose
 * group is named as the config's `backend`, the first whose serves()
 * accepts the settings of its group (its .settings, such as the `redis`
 * group) wins, so a new topology (Sentinel, Cluster, several
 * masters) is its own file plus one line here. The same table registers
 * the settings groups: backend_conf_groups gives them to conf_load, so a
 * new backend's group is parsed, checked, released and described without
 * an edit in common/ or cli/. The shim and `lockshim check` both choose
 * here, so they always agree.
 */
#include "backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conf.h"
#include "conf_field.h"

/* Each backend's table, defined in its own file. */
extern const struct backend_ops backend_redlock, backend_sentinel, backend_cluster,
	backend_redis, backend_local;

static const struct backend_ops *const backends[] = {
	&backend_redlock,
	&backend_sentinel,
	&backend_cluster,
	&backend_redis,
	&backend_local,
};

#define NBACKENDS (sizeof(backends) / sizeof(backends[0]))

void backend_conf_groups(const struct conf_group **groups, size_t n)
{
	size_t k = 0;

	for (size_t i = 0; i < NBACKENDS && k + 1 < n; i++) {
		size_t j = 0;

		while (j < k && groups[j] != backends[i]->settings)
			j++;
		if (j == k)
			groups[k++] = backends[i]->settings;
	}
	groups[k] = NULL;
}

int backend_init(struct backend *b, const struct conf *cfg, char *err, size_t errlen)
{
	const char *name = conf_backend_name(cfg->backend);

	b->ops = NULL;
	b->cfg = NULL;
	for (size_t i = 0; i < NBACKENDS; i++) {
		const void *settings = conf_group_data(cfg, backends[i]->settings);

		if (!settings || strcmp(backends[i]->settings->name, name) != 0 ||
		    !backends[i]->serves(settings))
			continue;
		b->cfg = backends[i]->config_new(settings, err, errlen);
		if (!b->cfg)
			return -1;
		b->ops = backends[i];
		return 0;
	}
	snprintf(err, errlen, "no backend serves this %s configuration", name);
	return -1;
}

void backend_release(struct backend *b)
{
	if (b->ops)
		b->ops->config_free(b->cfg);
	b->ops = NULL;
	b->cfg = NULL;
}

void *backend_calloc(size_t size, char *err, size_t errlen)
{
	void *p = calloc(1, size);

	if (!p)
		snprintf(err, errlen, "out of memory");
	return p;
}

const char *backend_plain_tls_hint(const char *err)
{
	static const struct {
		const char *says, *means;
	} hints[] = {
		{ "Server closed the connection", "the server closed the connection at the "
			"first command: a TLS-only port? (lockshim speaks plain TCP)" },
		{ "Connection reset", "the server reset the connection at the first command: "
			"a TLS-only port? (lockshim speaks plain TCP)" },
	};

	for (size_t i = 0; i < sizeof(hints) / sizeof(hints[0]); i++)
		if (strstr(err, hints[i].says))
			return hints[i].means;
	return NULL;
}
