/* SPDX-License-Identifier: MIT */
/*
 * backend.c - choosing the backend that serves a config (see backend.h).
 *
 * The table lists every backend in order of preference; among those whose
 * group is named as the config's `backend`, the first whose serves()
 * accepts the settings of its group wins, so a new topology is its own
 * file plus one line here. The same table registers the settings groups
 * (backend_conf_groups, for conf_load): no edit in common/ or cli/. The
 * shim and `lockshim check` both choose here, so they always agree. A
 * module (backend_module.h) is a stub here, opened by module_load when
 * selected; the objects its dlopen brought in are recorded
 * (backend_module_owns) so that the redirection never patches them.
 */
#include "backend.h"

#include <dlfcn.h>
#include <limits.h>
#include <link.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend_etcd_conf.h"
#include "backend_module.h"
#include "backend_postgres_conf.h"
#include "backend_zookeeper_conf.h"
#include "conf.h"
#include "conf_field.h"
#include "log.h"

/* Each backend's table, defined in its own file. */
extern const struct backend_ops backend_redlock, backend_sentinel, backend_cluster,
	backend_redis, backend_local;

/* The postgres backend is a module (backend/postgres/, libpq): this stub
 * names its group and its file; backend_init loads the real table. */
static const struct backend_module_file postgres_module = {
	"liblockshim-postgres.so", "lockshim_backend_postgres", "libpq5"
};
static const struct backend_ops backend_postgres_stub = {
	.name = "postgres",
	.settings = &backend_postgres_settings,
	.module = &postgres_module,
};

/* The zookeeper backend is a module (backend/zookeeper/, libzookeeper-mt). */
static const struct backend_module_file zookeeper_module = {
	"liblockshim-zookeeper.so", "lockshim_backend_zookeeper", "libzookeeper-mt2"
};
static const struct backend_ops backend_zookeeper_stub = {
	.name = "zookeeper",
	.settings = &backend_zookeeper_settings,
	.module = &zookeeper_module,
};

/* The etcd backend is a module (backend/etcd/: libcurl to etcd's JSON
 * gateway, json-c for its replies). */
static const struct backend_module_file etcd_module = {
	"liblockshim-etcd.so", "lockshim_backend_etcd", "libcurl4 libjson-c5"
};
static const struct backend_ops backend_etcd_stub = {
	.name = "etcd",
	.settings = &backend_etcd_settings,
	.module = &etcd_module,
};

static const struct backend_ops *const backends[] = {
	&backend_redlock,
	&backend_sentinel,
	&backend_cluster,
	&backend_redis,
	&backend_local,
	&backend_postgres_stub,
	&backend_zookeeper_stub,
	&backend_etcd_stub,
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

const char *const backend_cli_dirs[BACKEND_CLI_DIRS] = {
	"%s", "%s/../lib", "%s/../lib/lockshim", "%.0s" LOCKSHIM_LIBDIR
};

/* The objects (load biases) that loading the modules brought in: a
 * module, its client library and theirs. Written at start-up only. */
#define MODULE_OBJECTS_MAX 64
static uintptr_t module_objs[MODULE_OBJECTS_MAX];
static int nmodule_objs;

/* The load biases of the objects loaded before a module's dlopen. */
struct objects {
	uintptr_t base[MODULE_OBJECTS_MAX * 4];
	int n;
};

static int objects_list(struct dl_phdr_info *info, size_t size, void *data)
{
	struct objects *o = data;

	(void)size;
	if (o->n < (int)(sizeof(o->base) / sizeof(o->base[0])))
		o->base[o->n++] = info->dlpi_addr;
	return 0;
}

/* Records in module_objs each object loaded now that was not in before. */
static int objects_new(struct dl_phdr_info *info, size_t size, void *data)
{
	const struct objects *before = data;

	(void)size;
	for (int i = 0; i < before->n; i++)
		if (before->base[i] == info->dlpi_addr)
			return 0;
	if (nmodule_objs < MODULE_OBJECTS_MAX)
		module_objs[nmodule_objs++] = info->dlpi_addr;
	return 0;
}

int backend_module_owns(uintptr_t base)
{
	for (int i = 0; i < nmodule_objs; i++)
		if (module_objs[i] == base)
			return 1;
	return 0;
}

/* The module's warning lines, in the core's log. */
static void module_warn(const char *msg)
{
	LOG(LOG_WARN, "%s", msg);
}

/* The shim's lost-lease path (backend_on_lost_all), set before any lock
 * and read by the module's threads after (their creation orders them). */
static void (*lost_path)(const char *why);

void backend_on_lost_all(void (*fn)(const char *why))
{
	lost_path = fn;
}

/* host->lost_all: the lent path, when there is one. */
static void module_lost_all(const char *why)
{
	if (lost_path)
		lost_path(why);
}

static const struct backend_module_host module_host = { module_warn, module_lost_all };

/* Writes into dir (PATH_MAX bytes) the directory of the object holding this
 * code: the shim's, or (the command, linked with it) the executable's.
 * Returns 1 for the shim, 0 for the executable, -1 when unknown. */
static int module_home(char *dir)
{
	struct link_map *lm = NULL;
	Dl_info di;
	char *slash;
	ssize_t n;
	int shim = 0;

	if (dladdr1((void *)module_home, &di, (void **)&lm, RTLD_DL_LINKMAP) && lm &&
	    lm->l_name && lm->l_name[0] == '/') {
		snprintf(dir, PATH_MAX, "%s", lm->l_name);
		shim = 1;
	} else if ((n = readlink("/proc/self/exe", dir, PATH_MAX - 1)) > 0) {
		dir[n] = 0;
	} else {
		return -1;
	}
	slash = strrchr(dir, '/');
	*(slash == dir ? slash + 1 : slash) = 0;
	return shim;
}

/*
 * Opens the module of stub (backend_module.h) and returns its table (a
 * copy in into, with the stub's settings group: the module links none), or
 * NULL with one line in err naming what to install. The shim looks in its
 * own directory only; the command in backend_cli_dirs. The handle is never
 * closed: its code is the backend's while the process runs.
 */
static const struct backend_ops *module_load(const struct backend_ops *stub,
					     struct backend_ops *into, char *err, size_t errlen)
{
	const struct backend_module_file *mf = stub->module;
	char dir[PATH_MAX], path[PATH_MAX + 64];
	const struct backend_module *m;
	int home = module_home(dir), found = 0;
	struct objects *before;
	void *h = NULL;

	for (size_t i = 0; home >= 0 && !found && i < (home ? 1 : BACKEND_CLI_DIRS); i++) {
		char d[PATH_MAX + 32];

		snprintf(d, sizeof(d), backend_cli_dirs[i], dir);
		snprintf(path, sizeof(path), "%s/%s", d, mf->file);
		found = access(path, F_OK) == 0;
	}
	if (!found) {
		snprintf(err, errlen, "backend %s: %s is not installed beside %s (%s): "
			 "install it with lockshim (make install, or the lockshim package)",
			 stub->name, mf->file, home > 0 ? "liblockshim.so" : "lockshim",
			 home >= 0 ? dir : "unknown directory");
		return NULL;
	}
	/* without the list, the module's objects could not be kept out of
	 * the redirection */
	if (!(before = calloc(1, sizeof(*before)))) {
		snprintf(err, errlen, "backend %s: out of memory", stub->name);
		return NULL;
	}
	dl_iterate_phdr(objects_list, before);
	h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (h)
		dl_iterate_phdr(objects_new, before);
	free(before);
	if (!h) {
		const char *why = dlerror();

		snprintf(err, errlen, "backend %s: %s cannot be loaded (%s): install %s",
			 stub->name, mf->file, why ? why : "?", mf->package);
		return NULL;
	}
	m = dlsym(h, mf->symbol);
	if (!m || m->abi != BACKEND_MODULE_ABI || !m->ops ||
	    strcmp(m->ops->name, stub->name) != 0) {
		snprintf(err, errlen, "backend %s: %s is not of this lockshim build (%s): "
			 "install both from one build", stub->name, path,
			 m ? "another module ABI" : "no backend symbol");
		dlclose(h);
		return NULL;
	}
	if (m->bind)
		m->bind(&module_host);
	*into = *m->ops;
	into->settings = stub->settings;
	return into;
}

int backend_init(struct backend *b, const struct conf *cfg, char *err, size_t errlen)
{
	/* the tables of the loaded modules (filled at start-up, then read) */
	static struct backend_ops loaded[NBACKENDS];
	const char *name = conf_backend_name(cfg->backend);

	b->ops = NULL;
	b->cfg = NULL;
	for (size_t i = 0; i < NBACKENDS; i++) {
		const void *settings = conf_group_data(cfg, backends[i]->settings);

		const struct backend_ops *ops = backends[i];

		if (!settings || strcmp(ops->settings->name, name) != 0)
			continue;
		if (ops->module && !(ops = module_load(ops, &loaded[i], err, errlen)))
			return BACKEND_INIT_MODULE;
		if (!ops->serves(settings))
			continue;
		b->cfg = ops->config_new(settings, err, errlen);
		if (!b->cfg)
			return -1;
		b->ops = ops;
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
