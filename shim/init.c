/* SPDX-License-Identifier: MIT */
/*
 * init.c - the shim's life cycle: constructor, fork handlers, destructor.
 *
 * The constructor first asks scope.h whether this program is a lock
 * server's own (redis-server, ...) or lockshim's command: then it does
 * nothing, not even read the config. Otherwise it loads the config, named explicitly
 * (LOCKSHIM_CONFIG, which `lockshim run -c` sets; a relative one is made
 * absolute in the environment, so that children started after a chdir
 * read the same file) or implicitly (the default path). Explicit: an
 * unusable config stops the program before main with one message and
 * exit status 78, so nothing runs unguarded by accident; so does a
 * `strict` lock that cannot be guarded. Implicit (the system-wide
 * preload's case): a missing file means nothing is done, silently; an
 * unusable one, or a strict lock unguarded, one `error` line on stderr and
 * to syslog (log_syslog_once), and nothing else: it never stops a program.
 * Then scoping: a program the top-level `programs` does not match, or in
 * which no lock applies once the locks whose `programs` do not match are
 * removed, gets nothing either: no log line (at any level), no file
 * opened beyond the config, no thread, no socket. Otherwise it applies the
 * logging settings, picks the backend that serves the `redis` group
 * (backend.c), sets up the counters (count.h), sizes the trampoline,
 * prepares the lock layer and redirects every call site it can find.
 * Connections and the renewal thread start lazily, on the first guarded
 * call. With LOCKSHIM_CHECK_FD set (`lockshim check -- PROGRAM`), it writes
 * to that descriptor how each lock will be guarded (redirect_init), or
 * that it or the whole program is out of scope, and ends the process
 * there, before the program's own code runs: status 0 when every lock in
 * scope is guarded, 1 when some is not, 78 as above.
 * A set-ID program (conf_secure) reads no LOCKSHIM_* variable, only the
 * default path (implicit); a file there not root's alone
 * (conf_open_trusted): one line on stderr, and nothing more is done.
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
#include "scope.h"
#include "shim.h"
#include "staticlib.h"
#include "arch.h"

int shim_state;
pthread_t shim_initial_thread;
static struct conf cfg;
static struct backend backend;

static int implicit; /* the config is the default path, named by nobody */

/*
 * Says that the config (or a strict lock of it) is unusable: explicit, on
 * stderr, and the program ends with CONF_EXIT_CODE before main; implicit,
 * as one `error` line on stderr and to syslog, and returns: the caller
 * then leaves this process alone.
 */
static void config_error(const char *msg)
{
	static const char tail[] = "; nothing is guarded in this process";
	char line[2048], text[1536];
	const char *sys;
	int n = (int)log_prefix(line, sizeof(line));

	snprintf(text, sizeof(text), "config error: %s%s", msg, implicit ? tail : "");
	n += snprintf(line + n, sizeof(line) - (size_t)n, "%s", implicit ? "error: " : "");
	n += (int)log_escape(line + n, sizeof(line) - (size_t)n - 1, text, strlen(text));
	line[n++] = '\n';
	if (write(2, line, (size_t)n) < 0) {
		/* nothing else to tell */
	}
	if (!implicit)
		_exit(CONF_EXIT_CODE);
	/* the tests' own socket; never read in secure-execution mode */
	sys = secure_getenv("LOCKSHIM_TEST_SYSLOG_PATH");
	log_syslog_once(sys && *sys ? sys : "/dev/log", LOG_ERROR, text);
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
 * relative (children may run in another directory), and sets implicit
 * when it is the default path because nothing named one (always in
 * secure-execution mode: secure_getenv returns NULL there). */
static const char *init_config_path(void)
{
	const char *path = secure_getenv("LOCKSHIM_CONFIG");
	char *abs;

	if (!path || !*path) {
		implicit = 1;
		return CONF_DEFAULT_PATH;
	}
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
	static struct scope_exe exe;
	const char *path;
	char err[1024];
	int check = check_fd(), rc, saved_errno = errno;

	guard_enter();
	shim_initial_thread = pthread_self();
	scope_self(&exe);
	log_init_exe(exe.path);
	if (scope_exempt(&exe)) {
		if (check >= 0) {
			scope_report_program(check, &exe, NULL);
			_exit(0);
		}
		goto out;
	}
	staticlib_init();
	path = init_config_path();
	if (implicit && access(path, F_OK) != 0 && errno == ENOENT) {
		if (check >= 0)
			_exit(0);
		goto out; /* no config: the system-wide preload guards nothing here */
	}
	backend_conf_groups(groups, sizeof(groups) / sizeof(*groups));
	rc = conf_load(&cfg, path, groups, err, sizeof(err));
	if (rc == CONF_UNTRUSTED) {
		refuse_untrusted(err);
		goto released;
	}
	if (rc != 0) {
		config_error(err);
		goto released;
	}
	/* scope: before anything else reads the config */
	if (!scope_match(cfg.programs, &exe)) {
		if (check >= 0) {
			scope_report_program(check, &exe, cfg.programs);
			_exit(0);
		}
		goto released;
	}
	if (scope_keep(&cfg, &exe, check) == 0) {
		if (check >= 0)
			_exit(0);
		goto released;
	}
	rc = conf_logging(&cfg, 1, err, sizeof(err));
	if (rc == CONF_UNTRUSTED) {
		refuse_untrusted(err);
		goto released;
	}
	if (rc != 0 || backend_init(&backend, &cfg, err, sizeof(err)) != 0) {
		config_error(err);
		goto released;
	}
	if (count_setup(&cfg) != 0)
		LOG(LOG_WARN, "out of memory for the counters; no metrics from this process");
	if (arch_init() != 0 || lock_setup(&backend) != 0 ||
	    pthread_atfork(atfork_prepare, atfork_parent, atfork_child) != 0) {
		LOG(LOG_ERROR, "initialisation failed; calls stay unguarded");
		if (check >= 0)
			_exit(1);
		goto out;
	}
	backend_on_lost_all(renew_lost_all);
	__atomic_store_n(&shim_state, SHIM_ON, __ATOMIC_RELEASE);
	rc = redirect_init(&cfg, check, err, sizeof(err));
	if (check >= 0)
		_exit(rc ? 1 : 0);
	if (rc != 0) {
		/* implicit: the hooks stay, as pass-throughs; nothing is taken */
		__atomic_store_n(&shim_state, SHIM_DOWN, __ATOMIC_RELEASE);
		config_error(err);
		goto out;
	}
	LOG(LOG_DEBUG, "%s: %d lock(s) configured", path, cfg.nlocks);
	goto out;
released:
	conf_release(&cfg);
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
