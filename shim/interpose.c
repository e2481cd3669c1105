/* SPDX-License-Identifier: MIT */
/*
 * interpose.c - wrappers the redirector installs beside the guarded symbols.
 *
 * dlopen/dlmopen: load (a bare name is first looked up in the caller's
 * RUNPATH and $ORIGIN is the caller's directory, see dlpath.c), then rescan
 * so the new objects' slots are redirected (their constructors have already
 * run). dlsym/dlvsym: a guarded name yields its hook's stub, a wrapped one
 * its wrapper; RTLD_NEXT is resolved relative to the real caller, not to
 * the shim. The longjmp family: release the guarded calls whose frames the
 * jump discards, then jump. exec family: read the replies of asynchronous
 * releases and release kept locks first; _exit/_Exit: release every lock of
 * the process first. close/dup2/dup3/close_range/closefrom: tell fdown.c
 * that a descriptor of the shim's may be gone. vfork (arch/<name>/tramp.S): the child
 * runs with the guard set, so that nothing it calls touches its parent's
 * lock state. These are not exported symbols: they are reached only
 * through redirected slots and dlsym results, so the shim's own calls go
 * straight to libc. They are registered as data, in interpose_table at the
 * end of this file: redirect.c puts each entry in its name table, like a
 * guarded symbol, and checks at init that each is found.
 */
#include <dlfcn.h>
#include <link.h>
#include <alloca.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dlpath.h"
#include "fdown.h"
#include "guard.h"
#include "lock.h"
#include "log.h"
#include "redirect.h"
#include "shim.h"
#include "arch.h"

extern void __longjmp_chk(sigjmp_buf env, int val) __attribute__((noreturn));

/* Opens file as the caller's own dlopen would (see dlpath.c). */
static void *open_as(const void *caller, const char *file, Lmid_t lmid, int use_lmid,
		     int mode)
{
	char *path;
	void *h;

	guard_enter();
	path = dlpath_search(caller, file);
	guard_leave();
	if (path)
		file = path;
	h = use_lmid ? dlmopen(lmid, file, mode) : dlopen(file, mode);
	free(path);
	return h;
}

static void *wrap_dlopen(const char *file, int mode)
{
	void *h = open_as(__builtin_return_address(0), file, 0, 0, mode);

	if (h && shim_active()) {
		guard_enter();
		redirect_refresh();
		guard_leave();
	}
	return h;
}

static void *wrap_dlmopen(Lmid_t lmid, const char *file, int mode)
{
	void *h = open_as(__builtin_return_address(0), file, lmid, 1, mode);

	if (h && shim_active()) {
		guard_enter();
		if (lmid != LM_ID_BASE)
			LOG(LOG_WARN, "dlmopen(%s) outside the base namespace: calls between "
			    "the objects loaded there are not guarded (a pointer from dlsym on "
			    "its handle is)", file ? file : "NULL");
		redirect_refresh();
		guard_leave();
	}
	return h;
}

static void *lookup(void *handle, const char *name, const char *version,
		    const void *caller)
{
	void *p;

	guard_enter();
	if (handle == RTLD_NEXT)
		p = redirect_resolved_next(caller, name, version);
	else
		p = redirect_resolved(name, version ? dlvsym(handle, name, version)
						    : dlsym(handle, name));
	guard_leave();
	return p;
}

static void *wrap_dlsym(void *handle, const char *name)
{
	return lookup(handle, name, NULL, __builtin_return_address(0));
}

static void *wrap_dlvsym(void *handle, const char *name, const char *version)
{
	return lookup(handle, name, version, __builtin_return_address(0));
}

static void unwind(const void *env)
{
	guard_enter();
	lock_unwind_to(arch_jmpbuf_sp(env));
	guard_leave();
}

static void wrap_longjmp(jmp_buf env, int val)
{
	unwind(env);
	longjmp(env, val);
}

static void wrap_siglongjmp(sigjmp_buf env, int val)
{
	unwind(env);
	siglongjmp(env, val);
}

static void wrap_longjmp_chk(sigjmp_buf env, int val)
{
	unwind(env);
	__longjmp_chk(env, val);
}

/* Runs fn (lock.c) with the guard set; not when the shim is off, nor in
 * a vfork child (guard set), nor inside the shim's own work. */
static void in_shim(void (*fn)(void))
{
	if (!shim_active() || guard_active())
		return;
	guard_enter();
	fn();
	guard_leave();
}

static void before_exec(void)
{
	in_shim(lock_before_exec);
}

static int wrap_execve(const char *path, char *const argv[], char *const envp[])
{
	before_exec();
	return execve(path, argv, envp);
}

static int wrap_execv(const char *path, char *const argv[])
{
	before_exec();
	return execv(path, argv);
}

static int wrap_execvp(const char *file, char *const argv[])
{
	before_exec();
	return execvp(file, argv);
}

static int wrap_execvpe(const char *file, char *const argv[], char *const envp[])
{
	before_exec();
	return execvpe(file, argv, envp);
}

static int wrap_fexecve(int fd, char *const argv[], char *const envp[])
{
	before_exec();
	return fexecve(fd, argv, envp);
}

enum exec_kind { EXEC_L, EXEC_LP, EXEC_LE };

/*
 * The list forms: collects the arguments after arg (up to the terminating
 * NULL, and for execle the environment after it) into an array on the stack
 * and calls the vector form. Returns -1 with errno set, like exec.
 */
static int exec_list(enum exec_kind kind, const char *path, const char *arg, va_list ap)
{
	char **argv, **envp;
	size_t n = 1;
	va_list count;

	va_copy(count, ap);
	while (va_arg(count, char *))
		n++;
	va_end(count);
	argv = alloca((n + 1) * sizeof(*argv));
	argv[0] = (char *)arg;
	for (size_t i = 1; i <= n; i++)
		argv[i] = va_arg(ap, char *); /* the last one read is the NULL */
	if (kind == EXEC_LE) {
		envp = va_arg(ap, char **);
		return wrap_execve(path, argv, envp);
	}
	return kind == EXEC_LP ? wrap_execvp(path, argv) : wrap_execv(path, argv);
}

static int wrap_execl(const char *path, const char *arg, ...)
{
	va_list ap;
	int rc;

	va_start(ap, arg);
	rc = exec_list(EXEC_L, path, arg, ap);
	va_end(ap);
	return rc;
}

static int wrap_execlp(const char *file, const char *arg, ...)
{
	va_list ap;
	int rc;

	va_start(ap, arg);
	rc = exec_list(EXEC_LP, file, arg, ap);
	va_end(ap);
	return rc;
}

static int wrap_execle(const char *path, const char *arg, ...)
{
	va_list ap;
	int rc;

	va_start(ap, arg);
	rc = exec_list(EXEC_LE, path, arg, ap);
	va_end(ap);
	return rc;
}

static void wrap__exit(int status)
{
	in_shim(lock_release_all);
	_exit(status);
}

static void wrap__Exit(int status)
{
	in_shim(lock_release_all);
	_Exit(status);
}

static int wrap_close(int fd)
{
	int rc = close(fd);

	fdown_note(fd);
	return rc;
}

static int wrap_dup2(int old, int fd)
{
	int rc = dup2(old, fd);

	fdown_note(fd);
	return rc;
}

static int wrap_dup3(int old, int fd, int flags)
{
	int rc = dup3(old, fd, flags);

	fdown_note(fd);
	return rc;
}

static int wrap_close_range(unsigned lo, unsigned hi, int flags)
{
	int rc = close_range(lo, hi, flags);

	fdown_note_all();
	return rc;
}

static void wrap_closefrom(int lo)
{
	closefrom(lo);
	fdown_note_all();
}

const struct interpose_entry interpose_table[] = {
	{ "execve", (void *)wrap_execve },
	{ "execv", (void *)wrap_execv },
	{ "execvp", (void *)wrap_execvp },
	{ "execvpe", (void *)wrap_execvpe },
	{ "fexecve", (void *)wrap_fexecve },
	{ "execl", (void *)wrap_execl },
	{ "execlp", (void *)wrap_execlp },
	{ "execle", (void *)wrap_execle },
	{ "_exit", (void *)wrap__exit },
	{ "_Exit", (void *)wrap__Exit },
	{ "vfork", (void *)arch_vfork },
	{ "__vfork", (void *)arch_vfork },
	{ "close", (void *)wrap_close },
	{ "dup2", (void *)wrap_dup2 },
	{ "dup3", (void *)wrap_dup3 },
	{ "close_range", (void *)wrap_close_range },
	{ "closefrom", (void *)wrap_closefrom },
	{ "dlopen", (void *)wrap_dlopen },
	{ "dlmopen", (void *)wrap_dlmopen },
	{ "dlsym", (void *)wrap_dlsym },
	{ "dlvsym", (void *)wrap_dlvsym },
	{ "longjmp", (void *)wrap_longjmp },
	{ "_longjmp", (void *)wrap_longjmp },
	{ "siglongjmp", (void *)wrap_siglongjmp },
	{ "__longjmp_chk", (void *)wrap_longjmp_chk },
	{ NULL, NULL }
};
