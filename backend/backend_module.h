/* SPDX-License-Identifier: MIT */
/*
 * backend_module.h - backends built as modules (liblockshim-NAME.so).
 *
 * A backend whose client library the shim must not carry into every
 * guarded program (postgres: libpq) is a shared object of its own, built
 * from backend/NAME/ and installed beside liblockshim.so. backend.c's table
 * names it with a stub struct backend_ops: its .name, its .settings (the
 * group stays in the core: settings, validation and docs work without the
 * module) and .module, a struct backend_module_file. backend_init opens the
 * file with dlopen(RTLD_NOW | RTLD_LOCAL) only when the config selects that
 * backend, from the directory of the object that holds backend.c (the
 * shim; for the command, its own directory and then where cli_find_shim
 * looks), and takes the ops from the one symbol the module exports: a
 * struct backend_module whose abi must equal BACKEND_MODULE_ABI. The module
 * links nothing of the core: what it needs of it (a warning line) comes
 * through bind. The objects that loading a module brought into the process
 * (the module, its client library, theirs) are never redirected: the shim's
 * scans skip them (backend_module_owns), so a lock on send, write or poll
 * never reaches libpq's own calls (the guard would pass them through too).
 */
#ifndef LOCKSHIM_BACKEND_MODULE_H
#define LOCKSHIM_BACKEND_MODULE_H

#include <stdint.h>

struct backend_ops;

/* Raised whenever struct backend_ops, struct backend_item or a module's
 * settings struct changes: a module of another build is refused. */
#define BACKEND_MODULE_ABI 1

/* The stub's description of its module file. */
struct backend_module_file {
	const char *file;    /* "liblockshim-postgres.so" */
	const char *symbol;  /* "lockshim_backend_postgres" */
	const char *package; /* the Debian package whose absence is the usual cause */
};

/* What the core lends a module: one log line at level warn (the text
 * without the prefix, which the core adds). */
struct backend_module_host {
	void (*warn)(const char *msg);
};

/* The module's one exported symbol. */
struct backend_module {
	int abi;                        /* BACKEND_MODULE_ABI of its build */
	const struct backend_ops *ops;  /* its .settings is the core's group */
	void (*bind)(const struct backend_module_host *host);
};

/* Returns 1 when the object loaded at base (its dlpi_addr) came in with a
 * backend module (the module or a library it needs that was not loaded
 * before), else 0. */
int backend_module_owns(uintptr_t base);

#endif
