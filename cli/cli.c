/* SPDX-License-Identifier: MIT */
/*
 * cli.c - the `lockshim` command.
 *
 *   lockshim run [-c FILE] [--] PROGRAM [ARG...]   run PROGRAM under the shim
 *   lockshim check [-c FILE] [-- PROGRAM [ARG...]] validate FILE, test Redis,
 *                                                  say how PROGRAM's locks are caught
 *   lockshim lock [-c FILE] [-w SECONDS] [-n] [-E CODE] [-l LEASE_MS] [--limit N] [--shared]
 *                 KEY -- COMMAND [ARG...]          run COMMAND holding KEY (cli/lock.c)
 *   lockshim status | unlock ...                   see and remove locks (status.c, unlock.c)
 *   lockshim metrics [-c FILE] [--listen HOST:PORT] counts and gauges (metrics.c)
 *   lockshim enable [-c FILE] | disable            the shim in /etc/ld.so.preload
 *                                                  (preload.c)
 *   lockshim settings                              the settings the parser knows
 *   lockshim version | help
 *
 * The verbs are one table (commands[], in the style of git's cmd_struct):
 * name, handler, usage, a one-line description and the exit statuses
 * (`lockshim help` prints them). Dispatch and the usage
 * text are made from it, and the README's CLI table is checked against
 * `lockshim help` (tests/integration/test_docs.py).
 *
 * `run` validates the config first (the shim would refuse it anyway, with
 * the same message and status 78), refuses a program the shim cannot be
 * loaded into (static, set-user-ID, file capabilities: the dynamic linker
 * would run it unguarded in silence), finds liblockshim.so next to itself,
 * in ../lib, or in the install prefix, prepends it to LD_PRELOAD, exports
 * the config's absolute path as LOCKSHIM_CONFIG and execs PROGRAM, whose
 * exit status is then its own. `check` validates exactly what the shim
 * validates (config, LOCKSHIM_LOG_LEVEL, log_file) and runs the server
 * self-test (selftest.c); with a PROGRAM, it then starts PROGRAM under the
 * shim with LOCKSHIM_CHECK_FD naming a pipe: the shim's constructor writes
 * one line per lock there (entry, reloc or unguarded) and ends the process
 * before main, and `check` prints those lines and exits 1 when some lock
 * would be unguarded. `settings` prints settings_describe's lines
 * (settings.c, from the parser's tables).
 *
 * `check`'s summary says every setting that differs from its default, in
 * the syntax `settings` writes defaults with (settings_diff), and nothing
 * about those that do not:
 *
 *   FILE: ok, N lock(s)
 *   settings: redis.port 6380, redis.tls {}, namespace "app"
 *     SYMBOL: key PREFIX:TEMPLATE, lease_ms 5000, on_timeout "exit"
 *   redis: ok (...)
 *
 * The `settings:` line (left out when
 * nothing differs) has the backends' groups, then the top level; a lock's
 * line its key in template syntax (a cluster's braces literal), then its
 * settings but symbol and key; a secret is written (hidden).
 *
 * Exit statuses of the CLI itself follow sysexits: 64 usage, 69 Redis unavailable (check) or the shim cannot be loaded
 * (run), 78 config error, 126/127 as a shell for a program that cannot be
 * executed or found; `lock` adds 1 (busy), 71 and 75 (lease lost).
 */
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <link.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "backend.h"
#include "backend_module.h"
#include "cli.h"
#include "conf.h"
#include "lockview.h"
#include "log.h"
#include "selftest.h"
#include "settings.h"

#ifndef LOCKSHIM_VERSION
#define LOCKSHIM_VERSION "0.1.0"
#endif

/* One verb. commands[] is the only list of them: main dispatches through
 * it, print_usage prints it, and the README's CLI table is checked against
 * `lockshim help`, so a new verb is one entry and its handler. */
struct cmd_struct {
	const char *name;
	const char *aliases[3];   /* other spellings, NULL-terminated */
	int (*fn)(int argc, char **argv); /* argv[1] is the verb */
	const char *usage;        /* what follows the name */
	const char *help;         /* one line */
	const char *exits;        /* its exit statuses, one line */
};

static int cmd_run(int argc, char **argv);
static int cmd_check(int argc, char **argv);
static int cmd_settings(int argc, char **argv);
static int cmd_version(int argc, char **argv);
static int cmd_help(int argc, char **argv);
int cmd_metrics(int argc, char **argv); /* metrics.c */

static const struct cmd_struct commands[] = {
	{ "run", { NULL }, cmd_run, "[-c FILE] [--] PROGRAM [ARG...]",
	  "validate FILE, then run PROGRAM under the shim",
	  "PROGRAM's; 64 usage, 69 the shim cannot be loaded, 78 config, 126/127 PROGRAM "
	  "not executable/found" },
	{ "check", { NULL }, cmd_check, "[-c FILE] [-- PROGRAM [ARG...]]",
	  "validate FILE as the shim does, print its locks, test the Redis server and say "
	  "how PROGRAM's calls would be caught",
	  "0 fine, 1 a lock of PROGRAM unguarded, 64 usage, 69 Redis unreachable, 78 config" },
	{ "lock", { NULL }, cmd_lock,
	  "[-c FILE] [-w SECONDS] [-n] [-E CODE] [-l LEASE_MS] [--limit N] [--shared] KEY -- "
	  "COMMAND [ARG...]",
	  "run COMMAND while holding the lock KEY (a distributed flock(1)); --limit N: one of N "
	  "permits (a semaphore), --shared: beside other shared holders, never an exclusive one",
	  "COMMAND's (128 + N: killed by signal N), 1 (or -E CODE) busy, 64 usage, 69 "
	  "Redis unreachable or KEY held with another limit, 71 system error, 75 lease lost, "
	  "78 config, 126/127" },
	{ "status", { NULL }, cmd_status, "[-c FILE] [--json] [PATTERN]",
	  "list the locks held in the namespace (PATTERN: a glob on KEY), one line per holder: "
	  "holder, since, lease left, fence, limit or shared, waiters",
	  "0 (also when nothing is held), 64 usage, 69 Redis unreachable, 78 config" },
	{ "unlock", { NULL }, cmd_unlock, "[-c FILE] [--force] [--json] KEY",
	  "remove KEY's lock (each holder's, for a semaphore or a shared lock) as its holder's "
	  "release would (refused for a live holder on this host without --force; postgres: "
	  "by ending the holder's session, its other locks with it)",
	  "0 removed, 1 not held, changed meanwhile or a live holder here, 64 usage, 69 "
	  "Redis unreachable, 78 config" },
	{ "metrics", { NULL }, cmd_metrics, "[-c FILE] [--listen HOST:PORT]",
	  "print the counts of every host and the locks held and waited for now, in the "
	  "Prometheus text format, or serve them at GET /metrics",
	  "0, 64 usage, 69 Redis unreachable (or --listen cannot bind), 78 config" },
	{ "enable", { NULL }, cmd_enable, "[-c FILE]",
	  "validate FILE (default " CONF_DEFAULT_PATH ") as the shim does, without the "
	  "server, then add the shim to /etc/ld.so.preload: every program loads it",
	  "0 added or already there, 64 usage, 69 the shim not found, 74 /etc/ld.so.preload "
	  "not written, 77 not root, 78 config" },
	{ "disable", { NULL }, cmd_disable, "",
	  "remove the shim's line from /etc/ld.so.preload",
	  "0 removed or not there, 64 usage, 74 /etc/ld.so.preload not written, 77 not root" },
	{ "settings", { NULL }, cmd_settings, "",
	  "print the settings the shim knows, one per line: group name type default", "0" },
	{ "version", { "--version", NULL }, cmd_version, "", "print the version", "0" },
	{ "help", { "--help", "-h", NULL }, cmd_help, "", "print this help", "0" },
};
static const size_t ncommands = sizeof(commands) / sizeof(*commands);

/* Prints the usage lines; with help, each command's description and exit
 * statuses too. */
static void print_usage(FILE *f, int help)
{
	int width = 0;

	for (size_t i = 0; i < ncommands; i++) {
		fprintf(f, "%s lockshim %s%s%s\n", i ? "      " : "usage:", commands[i].name,
			*commands[i].usage ? " " : "", commands[i].usage);
		if ((int)strlen(commands[i].name) > width)
			width = (int)strlen(commands[i].name);
	}
	if (help) {
		fputc('\n', f);
		for (size_t i = 0; i < ncommands; i++)
			fprintf(f, "  %-*s  %s\n  %-*s  exit: %s\n", width, commands[i].name,
				commands[i].help, width, "", commands[i].exits);
		fputc('\n', f);
	}
	fputs("FILE defaults to $LOCKSHIM_CONFIG, else " CONF_DEFAULT_PATH ".\n", f);
}

int cli_usage_error(const char *fmt, ...)
{
	va_list ap;

	fputs("lockshim: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	print_usage(stderr, 0);
	return EX_USAGE;
}

/* Parses "-c FILE" / "--config FILE" / "--config=FILE". Returns the index of
 * the first operand, or -1 after printing a usage error. */
static int parse_opts(int argc, char **argv, int i, const char **config)
{
	for (; i < argc; i++) {
		if (!strcmp(argv[i], "--"))
			return i + 1;
		if (!strcmp(argv[i], "-c") || !strcmp(argv[i], "--config")) {
			if (++i == argc) {
				cli_usage_error("%s needs a file", argv[i - 1]);
				return -1;
			}
			*config = argv[i];
		} else if (!strncmp(argv[i], "--config=", 9)) {
			*config = argv[i] + 9;
		} else if (argv[i][0] == '-' && argv[i][1]) {
			cli_usage_error("unknown option %s", argv[i]);
			return -1;
		} else {
			return i;
		}
	}
	return i;
}

const char *cli_default_config(void)
{
	const char *env = getenv("LOCKSHIM_CONFIG");

	return env && *env ? env : CONF_DEFAULT_PATH;
}

int cli_load(struct conf *cfg, const char *path)
{
	const struct conf_group *groups[CONF_GROUPS_MAX + 1];
	char err[1024];

	backend_conf_groups(groups, sizeof(groups) / sizeof(*groups));
	if (conf_load(cfg, path, groups, err, sizeof(err)) == 0 &&
	    conf_logging(cfg, 0, err, sizeof(err)) == 0)
		return 0;
	log_stderr("config error: %s", err);
	return -1;
}

/* Prints one line of `check`'s summary, control characters escaped. */
static void print_line(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void print_line(const char *fmt, ...)
{
	char msg[8192], line[4 * sizeof(msg)];
	va_list ap;
	size_t n;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	n = log_escape(line, sizeof(line) - 1, msg, strlen(msg));
	line[n] = 0;
	printf("%s\n", line);
}

/* Finds prog as execvp would. Returns 0 with its path in out, or -1. */
static int find_program(const char *prog, char *out, size_t len)
{
	const char *path = getenv("PATH");

	if (strchr(prog, '/')) {
		snprintf(out, len, "%s", prog);
		return 0;
	}
	if (!path || !*path)
		path = "/bin:/usr/bin";
	while (*path) {
		const char *end = strchr(path, ':');
		size_t dlen = end ? (size_t)(end - path) : strlen(path);

		snprintf(out, len, "%.*s/%s", (int)dlen, dlen ? path : ".", prog);
		if (access(out, X_OK) == 0)
			return 0;
		path += dlen + (end != NULL);
	}
	return -1;
}

/*
 * Returns why the dynamic linker would not load the shim into the program
 * at path (a static executable, set-user-ID or -group, file capabilities),
 * or NULL when it would, or when that cannot be told (exec will say). A
 * "#!" script is judged by its interpreter.
 */
static const char *not_loadable(const char *path, int depth)
{
	unsigned char buf[sizeof(ElfW(Ehdr))];
	ElfW(Ehdr) eh;
	struct stat st;
	int fd = open(path, O_RDONLY | O_CLOEXEC), has_interp = 0;
	ssize_t n;

	if (fd < 0 || fstat(fd, &st) != 0)
		goto unknown;
	if ((st.st_mode & S_ISUID) && st.st_uid != getuid())
		goto setid;
	if ((st.st_mode & S_ISGID) && st.st_gid != getgid())
		goto setid;
	if (getuid() != 0 && fgetxattr(fd, "security.capability", NULL, 0) > 0) {
		close(fd);
		return "it has file capabilities: the dynamic linker runs it in secure mode "
		       "and ignores LD_PRELOAD paths with a slash";
	}
	n = pread(fd, buf, sizeof(buf), 0);
	if (n >= 2 && buf[0] == '#' && buf[1] == '!' && depth == 0) {
		char line[PATH_MAX + 3] = "", *p, *e;
		ssize_t m = pread(fd, line, sizeof(line) - 1, 2);

		close(fd);
		if (m <= 0)
			return NULL;
		line[m] = 0;
		for (p = line; *p == ' ' || *p == '\t'; p++)
			;
		for (e = p; *e && *e != ' ' && *e != '\t' && *e != '\n'; e++)
			;
		*e = 0;
		return *p ? not_loadable(p, 1) : NULL;
	}
	if (n != (ssize_t)sizeof(eh))
		goto unknown;
	memcpy(&eh, buf, sizeof(eh));
	if (memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 || eh.e_phentsize != sizeof(ElfW(Phdr)))
		goto unknown;
	for (int i = 0; i < eh.e_phnum; i++) {
		ElfW(Phdr) ph;

		if (pread(fd, &ph, sizeof(ph), (off_t)(eh.e_phoff + (size_t)i * sizeof(ph))) !=
		    (ssize_t)sizeof(ph))
			goto unknown;
		has_interp |= ph.p_type == PT_INTERP;
	}
	close(fd);
	return has_interp ? NULL : "it is statically linked: no dynamic linker loads LD_PRELOAD";
setid:
	close(fd);
	return "it is set-user-ID or set-group-ID: the dynamic linker runs it in secure mode "
	       "and ignores LD_PRELOAD paths with a slash";
unknown:
	if (fd >= 0)
		close(fd);
	return NULL;
}

char *cli_find_shim(void)
{
	char self[PATH_MAX], *p;
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	const char *dir = NULL;

	if (n > 0) {
		self[n] = 0;
		dir = dirname(self);
	}
	for (size_t i = 0; i < BACKEND_CLI_DIRS; i++) {
		char d[PATH_MAX + 32], buf[PATH_MAX + 64];

		if (!dir && i + 1 < BACKEND_CLI_DIRS)
			continue;
		snprintf(d, sizeof(d), backend_cli_dirs[i], dir ? dir : "");
		snprintf(buf, sizeof(buf), "%s/liblockshim.so", d);
		if (access(buf, R_OK) == 0 && (p = realpath(buf, NULL)))
			return p;
	}
	return NULL;
}

/*
 * Makes this process's environment run a program under the shim with
 * config: the shim first in LD_PRELOAD, LOCKSHIM_CONFIG absolute. Returns
 * 0, or EX_UNAVAILABLE (said on stderr).
 */
static int shim_environment(const char *config)
{
	char *shim = cli_find_shim(), *abs = realpath(config, NULL), *preload;
	const char *old = getenv("LD_PRELOAD");

	if (!shim) {
		fprintf(stderr, "lockshim: cannot find liblockshim.so next to this "
			"program or in " LOCKSHIM_LIBDIR "\n");
		free(abs);
		return EX_UNAVAILABLE;
	}
	if (asprintf(&preload, "%s%s%s", shim, old && *old ? ":" : "",
		     old && *old ? old : "") < 0) {
		free(shim);
		free(abs);
		return EX_UNAVAILABLE;
	}
	setenv("LD_PRELOAD", preload, 1);
	setenv("LOCKSHIM_CONFIG", abs ? abs : config, 1);
	free(preload);
	free(shim);
	free(abs);
	return 0;
}

/* Returns 0 when the shim can be loaded into the program argv0, else
 * EX_UNAVAILABLE (said on stderr, with what that means). */
static int loadable(const char *argv0, const char *what)
{
	char path[PATH_MAX];
	const char *why;

	if (find_program(argv0, path, sizeof(path)) == 0 && (why = not_loadable(path, 0))) {
		fprintf(stderr, "lockshim: the shim cannot be loaded into %s: %s; %s\n", path, why,
			what);
		return EX_UNAVAILABLE;
	}
	return 0;
}

static int cmd_run(int argc, char **argv)
{
	const char *config = cli_default_config();
	struct conf cfg;
	int i = parse_opts(argc, argv, 2, &config), rc;

	if (i < 0)
		return EX_USAGE;
	if (i >= argc)
		return cli_usage_error("run needs a program");
	if (cli_load(&cfg, config) != 0)
		return CONF_EXIT_CODE;
	conf_release(&cfg);
	if ((rc = loadable(argv[i], "not running it unguarded")) != 0 ||
	    (rc = shim_environment(config)) != 0)
		return rc;
	execvp(argv[i], argv + i);
	fprintf(stderr, "lockshim: cannot run %s: %s\n", argv[i], strerror(errno));
	return errno == ENOENT ? 127 : 126;
}

/*
 * Starts argv under the shim in check mode and prints the lines the shim
 * writes (one per lock). Returns 0 when every lock will be guarded, 1 when
 * some will not, 78 when the shim refused the config, 126/127 when the
 * program cannot be run.
 */
static int check_program(const char *config, char **argv)
{
	int fds[2], status = 0, lines = 0, code;
	char buf[4096], fdname[16];
	FILE *in;
	pid_t pid;

	if (loadable(argv[0], "none of its calls would be guarded") != 0)
		return 1;
	if (pipe2(fds, O_CLOEXEC) != 0) {
		fprintf(stderr, "lockshim: pipe: %s\n", strerror(errno));
		return 1;
	}
	fflush(stdout);
	pid = fork();
	if (pid == 0) {
		close(fds[0]);
		fcntl(fds[1], F_SETFD, 0);
		snprintf(fdname, sizeof(fdname), "%d", fds[1]);
		setenv("LOCKSHIM_CHECK_FD", fdname, 1);
		if (shim_environment(config) != 0)
			_exit(EX_UNAVAILABLE);
		execvp(argv[0], argv);
		fprintf(stderr, "lockshim: cannot run %s: %s\n", argv[0], strerror(errno));
		_exit(errno == ENOENT ? 127 : 126);
	}
	close(fds[1]);
	if (pid < 0) {
		close(fds[0]);
		fprintf(stderr, "lockshim: fork: %s\n", strerror(errno));
		return 1;
	}
	in = fdopen(fds[0], "r");
	while (in && fgets(buf, sizeof(buf), in)) {
		fputs(buf, stdout);
		lines++;
	}
	if (in)
		fclose(in);
	else
		close(fds[0]);
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;
	code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
	if (code == CONF_EXIT_CODE || code >= 126 || (lines && (code == 0 || code == 1)))
		return code;
	if (code == 0)
		return 0; /* no lock configured: the shim had nothing to say */
	fprintf(stderr, "lockshim: %s ended without a report from the shim (%s %d): was the "
		"shim loaded?\n", argv[0], code >= 0 ? "exit status" : "signal",
		code >= 0 ? code : WTERMSIG(status));
	return 1;
}

/*
 * Writes l's Redis keys as `check` shows them, in template syntax (a
 * cluster's braces are literal): "key NS:TEMPLATE", or for a lock of
 * several keys "keys NS:TEMPLATE NS:TEMPLATE ...".
 */
static void keys_line(const struct lock_spec *l, char *buf, size_t len)
{
	int n = l->keys_src ? l->nkeys : 1;

	snprintf(buf, len, "%s", l->keys_src ? "keys" : "key");
	for (int i = 0; i < n; i++) {
		const struct key_tmpl *t = conf_key(l, i);
		size_t used = strlen(buf);

		snprintf(buf + used, len - used, " %.*s%s%s%s", (int)t->prefix_len - t->tagged,
			 t->prefix, t->tagged ? "{{" : "", l->keys_src ? l->keys_src[i] : l->key_src,
			 t->tagged ? "}}" : "");
	}
}

static int cmd_check(int argc, char **argv)
{
	const char *config = cli_default_config();
	struct conf cfg;
	char msg[1024], diff[4096];
	int i = parse_opts(argc, argv, 2, &config), rc = 0, prc;

	if (i < 0)
		return EX_USAGE;
	if (i < argc && strcmp(argv[i - 1], "--") != 0)
		return cli_usage_error("check takes a program only after --");
	if (cli_load(&cfg, config) != 0)
		return CONF_EXIT_CODE;
	printf("%s: ok, %d lock(s)\n", config,
	       cfg.nlocks ? cfg.locks[cfg.nlocks - 1].index + 1 : 0);
	settings_diff(&cfg, NULL, diff, sizeof(diff));
	if (diff[0])
		print_line("settings: %s", diff);
	for (int k = 0; k < cfg.nlocks; k++) {
		const struct lock_spec *l = &cfg.locks[k];
		char syms[1024] = "", keys[CONF_KEYS_MAX * 300];

		if (l->member)
			continue; /* a lock of several symbols: one line, at its first */
		for (int j = 0; l->symbols && l->symbols[j]; j++)
			snprintf(syms + strlen(syms), sizeof(syms) - strlen(syms), "%s%s",
				 j ? ", " : "", l->symbols[j]);
		settings_diff(&cfg, l, diff, sizeof(diff));
		keys_line(l, keys, sizeof(keys));
		print_line("  %s: %s%s%s", syms[0] ? syms : l->symbol, keys, diff[0] ? ", " : "",
			   diff);
	}
	if ((rc = selftest_run(&cfg, msg, sizeof(msg))) == BACKEND_INIT_MODULE) {
		log_stderr("%s", msg); /* its module cannot be loaded: a config error */
		rc = CONF_EXIT_CODE;
	} else if (rc != 0) {
		log_stderr("%s: %s", conf_backend_name(cfg.backend), msg);
		rc = EX_UNAVAILABLE;
	} else {
		printf("%s: ok (%s)\n", conf_backend_name(cfg.backend), msg);
	}
	conf_release(&cfg);
	if (i < argc) {
		prc = check_program(config, argv + i);
		if (rc == 0 || prc == CONF_EXIT_CODE)
			rc = prc;
	}
	return rc;
}

static int cmd_settings(int argc, char **argv)
{
	const struct conf_group *groups[CONF_GROUPS_MAX + 1];
	struct settings_desc d;

	if (argc > 2)
		return argv[2][0] == '-' && argv[2][1] ?
			cli_usage_error("unknown option %s", argv[2]) :
			cli_usage_error("settings takes no operand");
	backend_conf_groups(groups, sizeof(groups) / sizeof(*groups));
	for (int i = 0; settings_describe(groups, i, &d); i++)
		printf("%s %s %s %s\n", d.group, d.name, d.type, d.dflt);
	return 0;
}

static int cmd_version(int argc, char **argv)
{
	(void)argc, (void)argv;
	printf("lockshim %s\n", LOCKSHIM_VERSION);
	return 0;
}

static int cmd_help(int argc, char **argv)
{
	(void)argc, (void)argv;
	print_usage(stdout, 1);
	return 0;
}

static const struct cmd_struct *find_command(const char *name)
{
	for (size_t i = 0; i < ncommands; i++) {
		if (!strcmp(commands[i].name, name))
			return &commands[i];
		for (int k = 0; commands[i].aliases[k]; k++)
			if (!strcmp(commands[i].aliases[k], name))
				return &commands[i];
	}
	return NULL;
}

int main(int argc, char **argv)
{
	const struct cmd_struct *cmd;

	log_init();
	if (argc < 2) {
		print_usage(stderr, 0);
		return EX_USAGE;
	}
	cmd = find_command(argv[1]);
	if (!cmd)
		return cli_usage_error("unknown command \"%s\"", argv[1]);
	return cmd->fn(argc, argv);
}
