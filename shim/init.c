/* SPDX-License-Identifier: MIT */
/*
 * init.c - the shim's life cycle: constructor, fork handlers, destructor.
 *
 * The constructor loads the config (LOCKSHIM_CONFIG, else the default path;
 * a relative LOCKSHIM_CONFIG is made absolute in the environment, so that
 * children started after a chdir read the same file); an unusable config
 * stops the program before main with one message and exit status 78, so
 * nothing runs unguarded by accident; so does a `strict` lock that cannot
 * be guarded. With no lock configured it stops there: no thread, no
 * connection, nothing redirected. Otherwise it picks the backend that
 * serves the `redis` group (backend.c), sets up the counters (count.h),
 * sizes the trampoline, prepares the lock layer and redirects every call
 * site it can find.
 * Connections and the renewal thread start lazily, on the first guarded
 * call. With LOCKSHIM_CHECK_FD set (`lockshim check -- PROGRAM`), it writes
 * to that descriptor how each lock will be guarded (redirect_init) and
 * ends the process there, before the program's own code runs: status 0
 * when every lock is guarded, 1 when some is not, 78 as above.
 * A set-ID program (conf_secure) reads no LOCKSHIM_* variable, only the
 * default path; a file there not root's alone (conf_open_trusted): one
 * line on stderr, and nothing more is done.
 *
 * The destructor turns wrappers into pass-throughs and releases the locks
 * still held (not in a vfork child, which shares the parent's state).
 */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "conf.h"
#include "count.h"
#include "guard.h"
#include "lock.h"
#include "log.h"
#include "redirect.h"
#include "renew.h"
#include "shim.h"
#include "staticlib.h"
#include "arch.h"

int shim_state;
pthread_t shim_initial_thread;
static struct conf cfg;
static struct backend backend;

static void die_config(const char *msg)
{
	char line[2048];
	int n = (int)log_prefix(line, sizeof(line));

	n += snprintf(line + n, sizeof(line) - (size_t)n, "config error: ");
	n += (int)log_escape(line + n, sizeof(line) - (size_t)n - 1, msg, strlen(msg));
	line[n++] = '\n';
	if (write(2, line, (size_t)n) < 0) {
		/* nothing else to tell */
	}
	_exit(CONF_EXIT_CODE);
}

/* Says on stderr why secure-execution mode leaves this process alone. */
static void refuse_untrusted(const char *why)
{
	char line[2048];
	int n = (int)log_prefix(line, sizeof(line));
	static const char tail[] = "; nothing is guarded in this process\n";

	n += snprintf(line + n, sizeof(line) - (size_t)n, "secure-execution mode: ");
	n += (int)log_escape(line + n, sizeof(line) - (size_t)n - sizeof(tail), why, strlen(why));
	memcpy(line + n, tail, sizeof(tail) - 1);
	if (write(2, line, (size_t)n + sizeof(tail) - 1) < 0) {
		/* nothing else to tell */
	}
}

/* Returns the config path, made absolute in the environment when it was
 * relative (children may run in another directory); in secure-execution
 * mode always the default path (secure_getenv returns NULL there). */
static const char *init_config_path(void)
{
	const char *path = secure_getenv("LOCKSHIM_CONFIG");
	char *abs;

	if (!path || !*path)
		return CONF_DEFAULT_PATH;
	if (path[0] == '/' || !(abs = realpath(path, NULL)))
		return path;
	setenv("LOCKSHIM_CONFIG", abs, 1);
	free(abs);
	return getenv("LOCKSHIM_CONFIG");
}

/* Returns the descriptor LOCKSHIM_CHECK_FD names, or -1 when it is not set. */
static int check_fd(void)
{
	const char *v = secure_getenv("LOCKSHIM_CHECK_FD");
	char *end;
	long fd;

	if (!v || !*v)
		return -1;
	fd = strtol(v, &end, 10);
	return *end || fd < 0 || fd > INT_MAX ? -1 : (int)fd;
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

__attribute__((constructor)) static void shim_init(void)
{
	const struct conf_group *groups[CONF_GROUPS_MAX + 1];
	const char *path;
	char err[1024];
	int check = check_fd(), rc, saved_errno = errno;

	guard_enter();
	shim_initial_thread = pthread_self();
	log_init();
	staticlib_init();
	path = init_config_path();
	backend_conf_groups(groups, sizeof(groups) / sizeof(*groups));
	if ((rc = conf_load(&cfg, path, groups, err, sizeof(err))) == 0)
		rc = conf_logging(&cfg, 1, err, sizeof(err));
	if (rc == CONF_UNTRUSTED) {
		refuse_untrusted(err);
		conf_release(&cfg);
		goto out;
	}
	if (rc != 0)
		die_config(err);
	if (cfg.nlocks == 0) {
		LOG(LOG_INFO, "%s: no locks configured; nothing is redirected", path);
		if (check >= 0)
			_exit(0);
		goto out;
	}
	if (backend_init(&backend, &cfg, err, sizeof(err)) != 0)
		die_config(err);
	if (count_setup(&cfg) != 0)
		LOG(LOG_WARN, "out of memory for the counters; no metrics from this process");
	if (arch_init() != 0 || lock_setup(&backend) != 0 ||
	    pthread_atfork(atfork_prepare, atfork_parent, atfork_child) != 0) {
		LOG(LOG_ERROR, "initialisation failed; calls stay unguarded");
		if (check >= 0)
			_exit(1);
		goto out;
	}
	__atomic_store_n(&shim_state, SHIM_ON, __ATOMIC_RELEASE);
	rc = redirect_init(&cfg, check, err, sizeof(err));
	if (check >= 0)
		_exit(rc ? 1 : 0);
	if (rc != 0)
		die_config(err);
	LOG(LOG_DEBUG, "%s: %d lock(s) configured", path, cfg.nlocks);
out:
	guard_leave();
	errno = saved_errno; /* the program starts as it would without the shim */
}

__attribute__((destructor)) static void shim_fini(void)
{
	if (!shim_active() || guard_active()) /* a vfork child calling exit() */
		return;
	guard_enter();
	__atomic_store_n(&shim_state, SHIM_DOWN, __ATOMIC_RELEASE);
	lock_release_all();
	guard_leave();
}
