/* SPDX-License-Identifier: MIT */
/*
 * cli.c - the `lockshim` command.
 *
 *   lockshim run [-c FILE] [--] PROGRAM [ARG...]   run PROGRAM under the shim
 *   lockshim check [-c FILE]                       validate FILE, PING Redis
 *   lockshim version | help
 *
 * `run` validates the config first (the shim would refuse it anyway, with
 * the same message and status 78), finds liblockshim.so next to itself, in
 * ../lib, or in the install prefix, prepends it to LD_PRELOAD, exports the
 * config's absolute path as LOCKSHIM_CONFIG and execs PROGRAM, whose exit
 * status is then its own. Exit statuses of the CLI itself follow sysexits:
 * 64 usage, 69 Redis unavailable (check), 78 config error, 126/127 as a
 * shell for a program that cannot be executed or found.
 */
#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "config.h"

#ifndef LOCKSHIM_LIBDIR
#define LOCKSHIM_LIBDIR "/usr/local/lib"
#endif
#ifndef LOCKSHIM_VERSION
#define LOCKSHIM_VERSION "0.1.0"
#endif

#define EX_USAGE 64
#define EX_UNAVAILABLE 69

static const char usage[] =
	"usage: lockshim run [-c FILE] [--] PROGRAM [ARG...]\n"
	"       lockshim check [-c FILE]\n"
	"       lockshim version | help\n"
	"FILE defaults to $LOCKSHIM_CONFIG, else " CONFIG_DEFAULT_PATH ".\n";

/* Parses "-c FILE" / "--config FILE" / "--config=FILE". Returns the index of
 * the first operand, or -1 after printing a usage error. */
static int parse_opts(int argc, char **argv, int i, const char **config)
{
	for (; i < argc; i++) {
		if (!strcmp(argv[i], "--"))
			return i + 1;
		if (!strcmp(argv[i], "-c") || !strcmp(argv[i], "--config")) {
			if (++i == argc) {
				fprintf(stderr, "lockshim: %s needs a file\n%s", argv[i - 1], usage);
				return -1;
			}
			*config = argv[i];
		} else if (!strncmp(argv[i], "--config=", 9)) {
			*config = argv[i] + 9;
		} else if (argv[i][0] == '-' && argv[i][1]) {
			fprintf(stderr, "lockshim: unknown option %s\n%s", argv[i], usage);
			return -1;
		} else {
			return i;
		}
	}
	return i;
}

static const char *default_config(void)
{
	const char *env = getenv("LOCKSHIM_CONFIG");

	return env && *env ? env : CONFIG_DEFAULT_PATH;
}

/* Loads path; prints the error and returns -1 when unusable. */
static int load(struct config *cfg, const char *path)
{
	char err[768];

	if (config_load(cfg, path, err, sizeof(err)) == 0)
		return 0;
	fprintf(stderr, "lockshim: config error: %s\n", err);
	return -1;
}

/* Finds liblockshim.so; returns a malloc'd path or NULL. */
static char *find_shim(void)
{
	char self[PATH_MAX], *dir, *p = NULL;
	const char *candidates[] = { "%s/liblockshim.so", "%s/../lib/liblockshim.so",
				     "%s/../lib/lockshim/liblockshim.so" };
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);

	if (n > 0) {
		self[n] = 0;
		dir = dirname(self);
		for (size_t i = 0; i < sizeof(candidates) / sizeof(*candidates); i++) {
			char buf[PATH_MAX + 64];

			snprintf(buf, sizeof(buf), candidates[i], dir);
			if (access(buf, R_OK) == 0 && (p = realpath(buf, NULL)))
				return p;
		}
	}
	if (access(LOCKSHIM_LIBDIR "/liblockshim.so", R_OK) == 0)
		return strdup(LOCKSHIM_LIBDIR "/liblockshim.so");
	return NULL;
}

static int cmd_run(int argc, char **argv)
{
	const char *config = default_config(), *old;
	struct config cfg;
	char *shim, *abs, *preload;
	int i = parse_opts(argc, argv, 2, &config);

	if (i < 0)
		return EX_USAGE;
	if (i >= argc) {
		fprintf(stderr, "lockshim: run needs a program\n%s", usage);
		return EX_USAGE;
	}
	if (load(&cfg, config) != 0)
		return CONFIG_EXIT_CODE;
	config_release(&cfg);
	abs = realpath(config, NULL);
	shim = find_shim();
	if (!shim) {
		fprintf(stderr, "lockshim: cannot find liblockshim.so next to this "
			"program or in " LOCKSHIM_LIBDIR "\n");
		return EX_UNAVAILABLE;
	}
	old = getenv("LD_PRELOAD");
	if (asprintf(&preload, "%s%s%s", shim, old && *old ? ":" : "",
		     old && *old ? old : "") < 0)
		return EX_UNAVAILABLE;
	setenv("LD_PRELOAD", preload, 1);
	setenv("LOCKSHIM_CONFIG", abs ? abs : config, 1);
	execvp(argv[i], argv + i);
	fprintf(stderr, "lockshim: cannot run %s: %s\n", argv[i], strerror(errno));
	return errno == ENOENT ? 127 : 126;
}

static int cmd_check(int argc, char **argv)
{
	const char *config = default_config();
	struct backend_conn *c;
	struct config cfg;
	char err[256];
	int i = parse_opts(argc, argv, 2, &config), rc = 0;

	if (i < 0 || i < argc) {
		if (i >= 0)
			fprintf(stderr, "lockshim: check takes no operand\n%s", usage);
		return EX_USAGE;
	}
	if (load(&cfg, config) != 0)
		return CONFIG_EXIT_CODE;
	printf("%s: ok, %d lock(s)\n", config, cfg.nlocks);
	for (int k = 0; k < cfg.nlocks; k++) {
		const struct lock_spec *l = &cfg.locks[k];

		printf("  %s: key %s%s lease %lld ms, wait %lld ms, on_timeout %s, "
		       "on_error %s, on_lost %s\n", l->symbol, l->key.prefix, l->key_src,
		       l->lease_ms, l->wait_ms, config_call_policy_name(l->on_timeout),
		       config_call_policy_name(l->on_error),
		       config_hold_policy_name(l->on_lost));
	}
	c = backend_redis.open(&cfg.redis, err, sizeof(err));
	if (!c || backend_redis.ping(c) != 1) {
		fprintf(stderr, "lockshim: redis: %s\n", c ? backend_redis.errstr(c) : err);
		rc = EX_UNAVAILABLE;
	} else {
		printf("redis: ok\n");
	}
	if (c)
		backend_redis.close(c);
	config_release(&cfg);
	return rc;
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fputs(usage, stderr);
		return EX_USAGE;
	}
	if (!strcmp(argv[1], "run"))
		return cmd_run(argc, argv);
	if (!strcmp(argv[1], "check"))
		return cmd_check(argc, argv);
	if (!strcmp(argv[1], "version") || !strcmp(argv[1], "--version")) {
		printf("lockshim %s\n", LOCKSHIM_VERSION);
		return 0;
	}
	if (!strcmp(argv[1], "help") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
		fputs(usage, stdout);
		return 0;
	}
	fprintf(stderr, "lockshim: unknown command \"%s\"\n%s", argv[1], usage);
	return EX_USAGE;
}
