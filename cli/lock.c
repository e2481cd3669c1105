/* SPDX-License-Identifier: MIT */
/*
 * lock.c - `lockshim lock ... KEY -- COMMAND`: run COMMAND while holding
 * the lock KEY, a distributed flock(1).
 *
 * The lock is the shim's own, so a guarded call naming the same key
 * excludes COMMAND: the config's defaults make a spec for KEY taken
 * literally (conf_add_literal_lock), --limit N or --shared set its limit
 * and mode (the server groups refuse what they cannot honour, as for the
 * file's locks), shim/lock.c takes it and shim/renew.c renews it.
 * COMMAND is a child in its own process group that dies with lockshim
 * (PR_SET_PDEATHSIG), gets LOCKSHIM_LOCK_KEY and LOCKSHIM_FENCE and the
 * caller's signal mask and dispositions. The main thread sleeps in
 * poll(2) on a pipe that the SIGCHLD handler and the lost-lease hook write
 * to, and alone signals the group: the four forwarded signals, and after a
 * lost lease SIGTERM, SIGKILL 5 s later, exit 75. As a shell's job it hands
 * the terminal to COMMAND's group (foreground_tty, supervise).
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include "backend.h"
#include "cli.h"
#include "conf.h"
#include "conf_field.h"
#include "count.h"
#include "lock.h"
#include "log.h"
#include "owner.h"
#include "renew.h"
#include "util.h"

#define EX_OSERR 71
#define EX_TEMPFAIL 75
#define LOCK_KILL_GRACE_MS 5000 /* SIGTERM to SIGKILL after a lost lease */

/* The signals passed to the child's process group. */
static const int forwarded[] = { SIGINT, SIGTERM, SIGHUP, SIGQUIT };
#define NFORWARDED (int)(sizeof(forwarded) / sizeof(*forwarded))

/* Shared with the signal handlers and the renewal thread: lock-free
 * atomics (__atomic_*), safe in a handler. */
static int child_pid;    /* the group to forward to; 0: none */
static int wake_fd = -1; /* the pipe's write end */
static int lease_lost;   /* set by the lost hook */

static int get(const int *v)
{
	return __atomic_load_n(v, __ATOMIC_SEQ_CST);
}

static void set(int *v, int x)
{
	__atomic_store_n(v, x, __ATOMIC_SEQ_CST);
}

struct lock_opts {
	const char *config;
	const char *key;
	char **argv;         /* COMMAND [ARG...] */
	long long wait_ms;   /* -1: forever */
	long long lease_ms;  /* 0: the config's */
	int conflict_code;   /* exit status when the lock is busy */
	int limit;           /* --limit N: N exclusive permits; 0: the config's */
	int shared;          /* --shared: a shared holder */
};

/* getopt_long's values of the options without a short form */
enum { OPT_LIMIT = 256, OPT_SHARED };
#define LOCK_LIMIT_MAX 10000 /* the `limit` setting's range, lockshim.cfg(5) */

static void on_forwarded(int sig)
{
	int e = errno, pid = get(&child_pid);

	if (pid > 0)
		kill(-pid, sig);
	errno = e;
}

static void on_child(int sig)
{
	int e = errno;

	(void)sig;
	if (write(get(&wake_fd), "c", 1) < 0) {
		/* full: the main thread has a wake-up pending anyway */
	}
	errno = e;
}

/* renew_on_lost's hook: runs on the renewal thread (its mutex held); says
 * so once and wakes the main thread, which stops the child's group (if
 * COMMAND has not started yet, it never does). */
static void on_lost(const struct lease *l, const char *why)
{
	LOG(LOG_ERROR, "lease on %.*s %s: SIGTERM to the command's process group %d, SIGKILL "
	    "%d s later if any of it is left; exiting %d", (int)l->klen, l->key, why,
	    get(&child_pid), LOCK_KILL_GRACE_MS / 1000, EX_TEMPFAIL);
	set(&lease_lost, 1);
	if (write(get(&wake_fd), "l", 1) < 0) {
		/* full: the main thread has a wake-up pending anyway */
	}
}

/* Parses SECONDS (decimals allowed) into *ms. Returns 0 or -1. */
static int parse_seconds(const char *s, long long *ms)
{
	char *end;
	double v;

	errno = 0;
	v = strtod(s, &end);
	if (errno || end == s || *end || !isfinite(v) || v < 0 || v * 1000 > LLONG_MAX / 4)
		return -1;
	*ms = (long long)(v * 1000 + 0.5);
	return 0;
}

/* Parses a decimal integer in [lo, hi] into *v. Returns 0 or -1. */
static int parse_int(const char *s, long long lo, long long hi, long long *v)
{
	char *end;

	errno = 0;
	*v = strtoll(s, &end, 10);
	return errno || end == s || *end || *v < lo || *v > hi ? -1 : 0;
}

/* Reads argv into o. Returns 0, or EX_USAGE after saying why. */
static int parse_args(int argc, char **argv, struct lock_opts *o)
{
	static const struct option longs[] = {
		{ "config", required_argument, NULL, 'c' },
		{ "limit", required_argument, NULL, OPT_LIMIT },
		{ "shared", no_argument, NULL, OPT_SHARED },
		{ NULL, 0, NULL, 0 },
	};
	long long v;
	int c;

	*o = (struct lock_opts){ .config = cli_default_config(), .wait_ms = -1,
				 .conflict_code = 1 };
	opterr = 0;
	optind = 1;
	argc--, argv++; /* argv[0] is now the verb */
	while ((c = getopt_long(argc, argv, "+:c:w:nE:l:", longs, NULL)) != -1) {
		switch (c) {
		case 'c':
			o->config = optarg;
			break;
		case 'w':
			if (parse_seconds(optarg, &o->wait_ms))
				return cli_usage_error("-w: \"%s\" is not a number of seconds",
						       optarg);
			break;
		case 'n':
			o->wait_ms = 0;
			break;
		case 'E':
			if (parse_int(optarg, 0, 255, &v))
				return cli_usage_error("-E: \"%s\" is not an exit status (0..255)",
						       optarg);
			o->conflict_code = (int)v;
			break;
		case 'l':
			if (parse_int(optarg, 30, INT_MAX, &v))
				return cli_usage_error("-l: \"%s\" is not a lease in ms (30..%d)",
						       optarg, INT_MAX);
			o->lease_ms = v;
			break;
		case OPT_LIMIT:
			if (parse_int(optarg, 1, LOCK_LIMIT_MAX, &v))
				return cli_usage_error("--limit: \"%s\" is not a number of holders "
						       "(1..%d)", optarg, LOCK_LIMIT_MAX);
			o->limit = (int)v;
			break;
		case OPT_SHARED:
			o->shared = 1;
			break;
		case ':':
			return cli_usage_error("lock: %s needs a value", argv[optind - 1]);
		default:
			return cli_usage_error("lock: unknown option %s", argv[optind - 1]);
		}
	}
	if (o->shared && o->limit)
		return cli_usage_error("lock: --shared and --limit exclude each other (shared "
				       "holders have no limit)");
	if (optind >= argc)
		return cli_usage_error("lock needs a KEY and a COMMAND");
	o->key = argv[optind++];
	if (optind < argc && !strcmp(argv[optind], "--"))
		optind++;
	if (optind >= argc)
		return cli_usage_error("lock needs a COMMAND after KEY --");
	o->argv = argv + optind;
	return 0;
}

/*
 * Returns the controlling terminal (a descriptor the caller closes) when
 * this process leads the terminal's foreground group, as a job of an
 * interactive shell does, else -1. A process in someone else's group (a
 * script's, without job control) leaves the terminal alone: handing it
 * over would put the rest of that group in the background.
 */
static int foreground_tty(void)
{
	int fd;

	if (getpgrp() != getpid())
		return -1;
	fd = open("/dev/tty", O_RDWR | O_NOCTTY | O_CLOEXEC);
	if (fd >= 0 && tcgetpgrp(fd) == getpgrp())
		return fd;
	if (fd >= 0)
		close(fd);
	return -1;
}

/* Makes pgid the foreground group of terminal fd (none: -1), with SIGTTOU
 * blocked, which a caller in the background would get. */
static void tty_give(int fd, pid_t pgid)
{
	sigset_t ttou, old;

	if (fd < 0)
		return;
	sigemptyset(&ttou);
	sigaddset(&ttou, SIGTTOU);
	pthread_sigmask(SIG_BLOCK, &ttou, &old);
	tcsetpgrp(fd, pgid);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
}

/* Returns the file name of path (after its last '/'). */
static const char *base_name(const char *path)
{
	const char *s = strrchr(path, '/');

	return s && s[1] ? s + 1 : path;
}

/*
 * The child: its own process group (the terminal's foreground group when
 * tty is not -1), killed when lockshim dies, the caller's signal
 * dispositions (old) and mask (mask), then COMMAND. Never returns.
 */
static void run_child(char **argv, pid_t parent, int tty, const struct sigaction *old,
		      const sigset_t *mask)
{
	char msg[512];
	int n, e;

	setpgid(0, 0);
	tty_give(tty, getpid());
	if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent)
		_exit(EX_TEMPFAIL); /* lockshim is gone: the lock is not ours to use */
	for (int i = 0; i < NFORWARDED; i++)
		sigaction(forwarded[i], &old[i], NULL);
	sigaction(SIGCHLD, &old[NFORWARDED], NULL);
	sigprocmask(SIG_SETMASK, mask, NULL);
	execvp(argv[0], argv);
	e = errno;
	n = snprintf(msg, sizeof(msg), "lockshim: cannot run %s: %s\n", argv[0], strerror(e));
	if (n > (int)sizeof(msg) - 1)
		n = (int)sizeof(msg) - 1;
	if (n > 0 && write(STDERR_FILENO, msg, (size_t)n) < 0) {
		/* no standard error: the status says it */
	}
	_exit(e == ENOENT ? 127 : 126);
}

/* Returns the shell's view of status: the exit code, or 128 + the signal. */
static int shell_status(int status)
{
	if (WIFEXITED(status))
		return WEXITSTATUS(status);
	if (WIFSIGNALED(status))
		return 128 + WTERMSIG(status);
	return EX_OSERR;
}

/* Whether any process of group pgid is still there. */
static int group_alive(pid_t pgid)
{
	return kill(-pgid, 0) == 0 || errno == EPERM;
}

/*
 * The child, in the foreground of terminal tty, was stopped: takes the
 * terminal back and stops lockshim (the shell's job), then continues the
 * child, in the foreground again if the shell gave it back (fg, not bg).
 */
static void stopped(pid_t child, int tty)
{
	tty_give(tty, getpgrp());
	kill(getpid(), SIGSTOP);
	if (tcgetpgrp(tty) == getpgrp())
		tty_give(tty, child);
	kill(-child, SIGCONT);
}

/*
 * Waits for child, the leader of its process group: passes on a lost lease
 * (SIGTERM to the group, SIGKILL LOCK_KILL_GRACE_MS later if any of it is
 * left, also after the child itself ended) and, with a terminal tty (-1:
 * none), the child's stops. rfd is the wake-up pipe's read end. Returns the
 * child's shell status, or EX_TEMPFAIL once the lease was lost.
 */
static int supervise(pid_t child, int rfd, int tty)
{
	int64_t kill_at = 0;
	int status = 0, reaped = 0, killed = 0;

	for (;;) {
		struct pollfd p = { rfd, POLLIN, 0 };
		char buf[64];
		int timeout = -1;

		if (!reaped &&
		    waitpid(child, &status, WNOHANG | (tty >= 0 ? WUNTRACED : 0)) == child) {
			if (WIFSTOPPED(status)) {
				stopped(child, tty);
				continue;
			}
			reaped = 1;
			set(&child_pid, 0); /* no more forwarding: the group may be gone */
			if (tty >= 0 && tcgetpgrp(tty) == child)
				tty_give(tty, getpgrp());
		}
		if (get(&lease_lost) && !kill_at) {
			kill(-child, SIGTERM);
			kill_at = util_now_ms() + LOCK_KILL_GRACE_MS;
		}
		if (kill_at && !killed) {
			int64_t now = util_now_ms();

			if (reaped && !group_alive(child))
				killed = 1;
			else if (now >= kill_at) {
				LOG(LOG_ERROR, "process group %d still alive %d s after SIGTERM; "
				    "sending SIGKILL", (int)child, LOCK_KILL_GRACE_MS / 1000);
				kill(-child, SIGKILL);
				killed = 1;
			} else {
				timeout = (int)(kill_at - now);
			}
		}
		if (reaped && (!kill_at || killed))
			break;
		if (kill_at && killed && !reaped)
			timeout = -1; /* SIGKILL sent: the child's end comes by SIGCHLD */
		if (poll(&p, 1, timeout) > 0)
			while (read(rfd, buf, sizeof(buf)) > 0)
				;
	}
	return kill_at ? EX_TEMPFAIL : shell_status(status);
}

/* Exports the lock to COMMAND's environment: LOCKSHIM_LOCK_KEY (the key
 * as stored) and LOCKSHIM_FENCE. Returns 0 or -1. */
static int export_lock(const struct lock_spec *spec, const struct lock_call *call)
{
	uint64_t args[ARCH_INT_ARGS] = { 0 };
	char key[KEY_BUF_SIZE + 1], fence[24];
	size_t n = key_expand(&spec->key, args, getpid(), key);

	key[n] = 0;
	snprintf(fence, sizeof(fence), "%lld", lock_fence(call));
	return setenv("LOCKSHIM_LOCK_KEY", key, 1) || setenv("LOCKSHIM_FENCE", fence, 1) ? -1 : 0;
}

/*
 * Holding the lock: starts COMMAND and waits for it with the four signals
 * passed on; rfd is the wake-up pipe's read end. Returns the exit status of
 * `lockshim lock`.
 */
static int run_locked(char **argv, int rfd)
{
	struct sigaction sa = { 0 }, old[NFORWARDED + 1];
	sigset_t block, mask;
	pid_t parent = getpid(), pid;
	int rc, tty = foreground_tty();

	sigemptyset(&block);
	for (int i = 0; i < NFORWARDED; i++)
		sigaddset(&block, forwarded[i]);
	sigaddset(&block, SIGCHLD);
	sigaddset(&block, SIGTTOU);
	sigprocmask(SIG_BLOCK, &block, &mask);
	sa.sa_handler = on_forwarded;
	sigfillset(&sa.sa_mask);
	for (int i = 0; i < NFORWARDED; i++)
		sigaction(forwarded[i], &sa, &old[i]);
	sa.sa_handler = on_child;
	sa.sa_flags = SA_RESTART; /* a stop wakes supervise too */
	sigaction(SIGCHLD, &sa, &old[NFORWARDED]);
	fflush(NULL);
	pid = fork();
	if (pid == 0)
		run_child(argv, parent, tty, old, &mask);
	if (pid < 0) {
		fprintf(stderr, "lockshim: fork: %s\n", strerror(errno));
		rc = EX_OSERR;
	} else {
		setpgid(pid, pid); /* also here: the group exists before any signal */
		tty_give(tty, pid);
		set(&child_pid, pid);
		sigprocmask(SIG_SETMASK, &mask, NULL);
		rc = supervise(pid, rfd, tty);
	}
	if (tty >= 0)
		close(tty);
	for (int i = 0; i < NFORWARDED; i++)
		sigaction(forwarded[i], &old[i], NULL);
	sigaction(SIGCHLD, &old[NFORWARDED], NULL);
	return rc;
}

/*
 * Sets spec's limit and mode from --limit (N exclusive permits) or --shared
 * (limit 1, shared); without either the config's defaults stand. Then asks
 * the selected backend's group whether it can honour the lock, as conf_load
 * asks for the file's locks (Redlock masters refuse fair, for one; local
 * refuses a limit above 1 and shared). Returns 0, or -1 with one line in
 * err naming the file and the setting.
 */
static int apply_mode(const struct conf *cfg, struct lock_spec *spec, const struct lock_opts *o,
		      char *err, size_t errlen)
{
	struct conf_err e = { err, errlen, cfg->path, 0 };
	int sel = conf_backend_group(cfg);

	if (o->limit) {
		spec->limit = o->limit;
		spec->shared = 0;
	} else if (o->shared) {
		spec->limit = 1;
		spec->shared = 1;
	}
	if (sel >= 0 && cfg->groups[sel]->check_lock &&
	    cfg->groups[sel]->check_lock(&e, NULL, "lockshim lock", spec, cfg,
					 cfg->group_data[sel]))
		return -1;
	return 0;
}

/* Takes the lock of spec (opts' wait) and runs COMMAND under it. Returns
 * the exit status. */
static int lock_and_run(const struct backend *b, const struct lock_spec *spec,
			const struct lock_opts *o)
{
	uint64_t args[ARCH_INT_ARGS] = { 0 };
	struct lock_call call;
	int rc, fds[2];

	/* open until the renewal thread is gone: the lost hook writes to it */
	if (pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0 || lock_setup(b) != 0) {
		fprintf(stderr, "lockshim: cannot set up the lock state: %s\n", strerror(errno));
		return EX_OSERR;
	}
	set(&wake_fd, fds[1]);
	renew_on_lost(on_lost);
	backend_on_lost_all(renew_lost_all);
	owner_set_program(base_name(o->argv[0]));
	switch (lock_acquire(spec, args, &call)) {
	case LOCK_OK:
		break;
	case LOCK_TIMEOUT:
		count_add(spec, MC_TIMEOUTS);
		rc = o->conflict_code;
		goto out;
	case LOCK_ERROR:
	case LOCK_REFUSED: /* another limit: said by lock.c */
		count_add(spec, MC_ERRORS);
		rc = EX_UNAVAILABLE;
		goto out;
	default: /* LOCK_NOLEASE: said by lock.c */
		rc = EX_OSERR;
		goto out;
	}
	if (export_lock(spec, &call) != 0) {
		fprintf(stderr, "lockshim: cannot set the environment: %s\n", strerror(errno));
		rc = EX_OSERR;
	} else if (get(&lease_lost)) {
		rc = EX_TEMPFAIL; /* lost before COMMAND could start: it never does */
	} else {
		rc = run_locked(o->argv, fds[0]);
	}
	lock_release(&call);
out:
	lock_release_all(); /* also stops the renewal thread */
	close(fds[0]);
	close(fds[1]);
	set(&wake_fd, -1);
	return rc;
}

int cmd_lock(int argc, char **argv)
{
	struct lock_opts o;
	struct lock_spec *spec;
	struct backend b;
	struct conf cfg;
	char err[1024], *log_file;
	int rc;

	if ((rc = parse_args(argc, argv, &o)) != 0)
		return rc;
	if (cli_load(&cfg, o.config) != 0) {
		conf_release(&cfg);
		return CONF_EXIT_CODE;
	}
	/* the level, format and syslog apply; the lines go to the operator on
	 * standard error, not to log_file (checked by cli_load) */
	log_file = cfg.log_file;
	cfg.log_file = NULL;
	rc = conf_logging(&cfg, 1, err, sizeof(err));
	cfg.log_file = log_file;
	if (rc != 0) {
		log_stderr("config error: %s", err);
		conf_release(&cfg);
		return CONF_EXIT_CODE;
	}
	if (!(spec = conf_add_literal_lock(&cfg, o.key, err, sizeof(err)))) {
		conf_release(&cfg);
		return cli_usage_error("lock: KEY \"%s\": %s", o.key, err);
	}
	spec->wait_ms = o.wait_ms;
	if (o.lease_ms)
		spec->lease_ms = o.lease_ms;
	spec->linger_ms = 0;   /* one call: nothing to keep the lock for */
	spec->max_hold_ms = 0; /* COMMAND's duration is its own business */
	if (apply_mode(&cfg, spec, &o, err, sizeof(err)) != 0) {
		log_stderr("config error: %s", err);
		conf_release(&cfg);
		return CONF_EXIT_CODE;
	}
	if (count_setup(&cfg) != 0) /* counted as the lock KEY, shipped at exit */
		fprintf(stderr, "lockshim: out of memory for the counters; not counted\n");
	if (backend_init(&b, &cfg, err, sizeof(err)) != 0) {
		log_stderr("config error: %s", err);
		conf_release(&cfg);
		return CONF_EXIT_CODE;
	}
	if (o.lease_ms && b.ops->leaseless) {
		fprintf(stderr, "lockshim: config error: -l: not available with backend \"%s\": "
			"its locks have no lease\n", conf_backend_name(cfg.backend));
		backend_release(&b);
		conf_release(&cfg);
		return CONF_EXIT_CODE;
	}
	rc = lock_and_run(&b, spec, &o);
	backend_release(&b);
	conf_release(&cfg);
	return rc;
}
