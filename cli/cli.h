/* SPDX-License-Identifier: MIT */
/*
 * cli.h - what cli.c shares with the verbs that live in files of their own
 * (cli/NAME.c, one handler each, listed in cli.c's commands[]): the usage
 * error, where the config is, and loading it as the shim does.
 */
#ifndef LOCKSHIM_CLI_H
#define LOCKSHIM_CLI_H

#include "conf.h"

#define EX_USAGE 64
#define EX_UNAVAILABLE 69
#define EX_IOERR 74
#define EX_NOPERM 77

/* Where `make install` puts the shim (the Makefile passes its LIBDIR). */
#ifndef LOCKSHIM_LIBDIR
#define LOCKSHIM_LIBDIR "/usr/local/lib"
#endif

/* Prints "lockshim: <message>" and the usage on stderr; returns EX_USAGE. */
int cli_usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Returns $LOCKSHIM_CONFIG when set and not empty, else CONF_DEFAULT_PATH. */
const char *cli_default_config(void);

/* Loads path into cfg as the shim would; prints the error and returns -1
 * when unusable (the caller releases cfg either way). */
int cli_load(struct conf *cfg, const char *path);

/* Returns the shim's absolute path (malloc'd; the caller frees it): the
 * first readable liblockshim.so of backend_cli_dirs (next to this program,
 * in ../lib or ../lib/lockshim, else LOCKSHIM_LIBDIR's), symbolic links
 * resolved; NULL when none is readable. */
char *cli_find_shim(void);

/* `lockshim enable` and `disable` (cli/preload.c). argv[1] is the verb;
 * return the exit status. */
int cmd_enable(int argc, char **argv);
int cmd_disable(int argc, char **argv);

/* `lockshim lock` (cli/lock.c). argv[1] is the verb; returns the exit status. */
int cmd_lock(int argc, char **argv);

#endif
