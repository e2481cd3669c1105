/* SPDX-License-Identifier: MIT */
/*
 * init.c - the shim's life cycle: constructor, fork handlers, destructor.
 *
 * The constructor loads the config (LOCKSHIM_CONFIG, else the default path);
 * an unusable config stops the program before main with one message and
 * exit status 78, so nothing runs unguarded by accident. With no lock
 * configured it stops there: no thread, no connection, nothing redirected.
 * Otherwise it sizes the trampoline, prepares the lock layer and redirects
 * every call site it can find. Connections and the renewal thread start
 * lazily, on the first guarded call. The destructor turns wrappers into
 * pass-throughs and releases the locks still held.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "config.h"
#include "guard.h"
#include "lock.h"
#include "log.h"
#include "redirect.h"
#include "renew.h"
#include "shim.h"
#include "tramp.h"

int shim_state;
pthread_t shim_initial_thread;
static struct config cfg;

static void die_config(const char *msg)
{
	char line[1024];
	int n = snprintf(line, sizeof(line), "lockshim[%d]: config error: %s\n",
			 (int)getpid(), msg);

	if (n > (int)sizeof(line))
		n = (int)sizeof(line);
	if (write(2, line, (size_t)n) < 0) {
		/* nothing else to tell */
	}
	_exit(CONFIG_EXIT_CODE);
}

static void atfork_prepare(void)
{
	guard_enter();
	lock_flush();
	guard_leave();
	renew_atfork_prepare();
}

static void atfork_parent(void)
{
	renew_atfork_parent();
}

static void atfork_child(void)
{
	renew_atfork_child();
	lock_atfork_child();
	log_set_pid(getpid());
}

/* Applies log_level / log_file and LOCKSHIM_LOG_LEVEL. */
static void setup_logging(void)
{
	const char *env = getenv("LOCKSHIM_LOG_LEVEL");
	char msg[512];
	int rc;

	if (cfg.log_level >= 0)
		log_threshold = cfg.log_level;
	if (env && *env) {
		if (log_level_parse(env) < 0) {
			snprintf(msg, sizeof(msg), "LOCKSHIM_LOG_LEVEL: unknown value \"%s\" "
				 "(expected one of: error, warn, info, debug)", env);
			die_config(msg);
		}
		log_threshold = log_level_parse(env);
	}
	if (cfg.log_file && (rc = log_open_file(cfg.log_file)) < 0) {
		snprintf(msg, sizeof(msg), "%s: log_file: cannot open \"%s\": %s", cfg.path,
			 cfg.log_file, strerror(-rc));
		die_config(msg);
	}
}

__attribute__((constructor)) static void shim_init(void)
{
	const char *path = getenv("LOCKSHIM_CONFIG");
	char err[768];

	guard_enter();
	shim_initial_thread = pthread_self();
	log_set_pid(getpid());
	if (!path || !*path)
		path = CONFIG_DEFAULT_PATH;
	if (config_load(&cfg, path, err, sizeof(err)) != 0)
		die_config(err);
	setup_logging();
	if (cfg.nlocks == 0) {
		LOG(LOG_INFO, "%s: no locks configured; nothing is redirected", path);
		goto out;
	}
	if (arch_init() != 0 || lock_setup(&backend_redis, &cfg.redis) != 0 ||
	    pthread_atfork(atfork_prepare, atfork_parent, atfork_child) != 0) {
		LOG(LOG_ERROR, "initialisation failed; calls stay unguarded");
		goto out;
	}
	__atomic_store_n(&shim_state, SHIM_ON, __ATOMIC_RELEASE);
	if (redirect_init(&cfg) != 0)
		LOG(LOG_ERROR, "redirection failed; some calls may stay unguarded");
	LOG(LOG_DEBUG, "%s: %d lock(s) configured", path, cfg.nlocks);
out:
	guard_leave();
}

__attribute__((destructor)) static void shim_fini(void)
{
	if (!shim_active())
		return;
	guard_enter();
	__atomic_store_n(&shim_state, SHIM_DOWN, __ATOMIC_RELEASE);
	lock_release_all();
	guard_leave();
}
