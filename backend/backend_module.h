/* SPDX-License-Identifier: MIT */
/*
 * backend_module.h - backends built as modules (liblockshim-NAME.so): a
 * backend whose client library must not be loaded into every guarded
 * program (postgres: libpq), built from backend/NAME/, installed beside
 * liblockshim.so. backend.c's table names it with a stub struct backend_ops
 * (.name, .settings: the group stays in the core, .module: a struct
 * backend_module_file); backend_init dlopens it (RTLD_NOW | RTLD_LOCAL)
 * only when the config selects it, from the shim's own directory, and
 * takes its table from the one symbol it exports, a struct backend_module
 * of this BACKEND_MODULE_ABI. The module links nothing of the core (bind
 * lends it a warning line). What its dlopen brought in (the module, its
 * client library, theirs) is never redirected (backend_module_owns).
 */
#ifndef LOCKSHIM_BACKEND_MODULE_H
#define LOCKSHIM_BACKEND_MODULE_H

#include <stdint.h>

struct backend_ops;

/* Raised whenever struct backend_ops, struct backend_item or a module's
 * settings struct changes: a module of another build is refused. */
#define BACKEND_MODULE_ABI 6

/* The stub's description of its module file. */
struct backend_module_file {
	const char *file;    /* "liblockshim-postgres.so" */
	const char *symbol;  /* "lockshim_backend_postgres" */
	const char *package; /* the Debian packages whose absence is the usual cause */
};

/* What the core lends a module: one log line at level warn (the text
 * without the prefix, which the core adds); lost_all(why), for a backend
 * whose table says .reports_lost, reports every lock the process holds
 * through the backend as lost, at once (the lost-lease path: on_lost
 * applied, counted; backend_on_lost_all), from any thread, never under a
 * lock the module's own releases take. */
struct backend_module_host {
	void (*warn)(const char *msg);
	void (*lost_all)(const char *why);
};

/* The module's one exported symbol. */
struct backend_module {
	int abi;                        /* BACKEND_MODULE_ABI of its build */
	const struct backend_ops *ops;  /* its .settings is the core's group */
	void (*bind)(const struct backend_module_host *host);
};

/* Where the command looks for liblockshim.so (cli_find_shim) and for the
 * modules (backend_init): formats of its own executable's directory, in
 * this order; the last ignores it (LOCKSHIM_LIBDIR, the installed one).
 * The shim looks in its own directory only. */
#define BACKEND_CLI_DIRS 4
extern const char *const backend_cli_dirs[BACKEND_CLI_DIRS];

/* Returns 1 when the object loaded at base (its dlpi_addr) came in with a
 * backend module (the module or a library it needs that was not loaded
 * before), else 0. */
int backend_module_owns(uintptr_t base);

#endif
