/* SPDX-License-Identifier: MIT */
/*
 * conf.c - the settings of the top level and of the locks, and the parse of
 * a file into a frozen struct conf (see conf.h).
 *
 * The settings are tables of conf_field.h: conf_top_fields for the top
 * level and conf_lock_fields for the per-lock settings, which reads the
 * `defaults` group and every entry of `locks`. A backend's group (`redis`)
 * is the backend's own table (backend/backend_redis_conf.c), given to
 * conf_load; the top-level `backend`, read first, names the one group the
 * file may have, whose per-lock checks apply. Each entry holds its
 * setting's default, so a new setting is one entry plus its struct member:
 * the parser, the copy from `defaults`, the release and `lockshim settings`
 * all walk the tables.
 *
 * A lock starts from the built-in defaults, then `defaults`, then its own
 * settings. Every error is one line: "<file>:<line>: <setting>: <problem>".
 * Two helpers serve the backends' groups (conf_field.h): the reader of a
 * password_file and the refusal of the lock settings a backend lacks.
 */
#include "conf.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/stat.h>
#include <unistd.h>

#include "conf_field.h"
#include "log.h"

static const char *const call_policies[] = { "skip", "exit", "abort", "proceed", NULL };
static const char *const hold_policies[] = { "log", "kill", "abort", NULL };
static const char *const methods[] = { "auto", "entry", "reloc", NULL };
static const char *const modes[] = { "exclusive", "shared", NULL };
/* `backend`: the names the issue fixes; one without a registered group of
 * the same name is refused as not built (parse_root). */
static const char *const backend_names[] = { "redis", "local", "zookeeper", "postgres",
					     "etcd", NULL };

/* Level names of log.h's enum log_level; log.c parses them
 * (log_level_parse, any case). */
static const char *const log_levels[] = { "error", "warn", "info", "debug", NULL };
static const char *const log_formats[] = { "text", "json", NULL };

_Static_assert(sizeof(call_policies) / sizeof(*call_policies) == POLICY_PROCEED + 2,
	       "call_policies names every enum call_policy");
_Static_assert(sizeof(hold_policies) / sizeof(*hold_policies) == HOLD_ABORT + 2,
	       "hold_policies names every enum hold_policy");
_Static_assert(sizeof(log_levels) / sizeof(*log_levels) == LOG_DEBUG + 2,
	       "log_levels names every enum log_level");

const char *conf_call_policy_name(int p) { return call_policies[p]; }
const char *conf_hold_policy_name(int p) { return hold_policies[p]; }
const char *conf_method_name(int m) { return methods[m]; }
const char *conf_backend_name(int b) { return backend_names[b]; }

/* ---- the tables --------------------------------------------------------- */

#define LOCK_FIELD(n, k, lo, hi, ...) FIELD(struct lock_spec, #n, n, k, lo, hi, __VA_ARGS__)
const struct conf_field conf_lock_fields[] = {
	/* exactly one of the two (check_symbols) */
	LOCK_FIELD(symbol, F_STR, 0, 0, .flags = FL_REQUIRED | FL_PER_LOCK),
	LOCK_FIELD(symbols, F_STRS, 0, 0, .flags = FL_REQUIRED | FL_PER_LOCK),
	FIELD(struct lock_spec, "key", key_src, F_STR, 0, 0, .def_str = "{symbol}"),
	/* instead of key: 1..CONF_KEYS_MAX templates (check_keys) */
	FIELD(struct lock_spec, "keys", keys_src, F_STRS, 0, 0, .flags = FL_PER_LOCK),
	LOCK_FIELD(lease_ms, F_INT, 30, INT_MAX, .def = 30000),
	LOCK_FIELD(wait_ms, F_INT, -1, LLONG_MAX / 4, .def = 10000),
	LOCK_FIELD(on_timeout, F_ENUM, 0, POLICY_PROCEED, .names = call_policies,
		   .def = POLICY_SKIP),
	RETURN_FIELD(struct lock_spec, "return", ret, ret_double, .def = -1),
	FIELD(struct lock_spec, "errno", err, F_ERRNO, 0, 4095, .def = EBUSY),
	LOCK_FIELD(exit_code, F_INT, 0, 255, .def = 75),
	/* -1: not set, follows on_timeout (parse_lock) */
	LOCK_FIELD(on_error, F_ENUM, 0, POLICY_PROCEED, .names = call_policies,
		   .def = -1, .dflt = "=lock.on_timeout"),
	LOCK_FIELD(on_lost, F_ENUM, 0, HOLD_ABORT, .names = hold_policies, .def = HOLD_LOG),
	LOCK_FIELD(max_hold_ms, F_INT, 0, LLONG_MAX / 4),
	LOCK_FIELD(on_overrun, F_ENUM, 0, HOLD_ABORT, .names = hold_policies, .def = HOLD_LOG),
	LOCK_FIELD(kill_signal, F_SIGNAL, 1, NSIG - 1, .def = SIGTERM),
	LOCK_FIELD(kill_grace_ms, F_INT, 0, LLONG_MAX / 4, .def = 5000),
	LOCK_FIELD(reentrant, F_BOOL, 0, 1, .def = 1),
	LOCK_FIELD(fair, F_BOOL, 0, 1),
	LOCK_FIELD(limit, F_INT, 1, 10000, .def = 1),
	FIELD(struct lock_spec, "mode", shared, F_ENUM, 0, 1, .names = modes),
	FIELD(struct lock_spec, "break_dead_holders", break_dead, F_BOOL, 0, 1, .def = 1),
	FIELD(struct lock_spec, "handoff_ms", handoff_us, F_USEC, 0, 60000, .def = 500),
	LOCK_FIELD(linger_ms, F_INT, 0, 60000, .def = 1),
	LOCK_FIELD(stack_args_bytes, F_INT, 0, STACK_ARGS_MAX, .def = 256),
	LOCK_FIELD(retry_max_ms, F_INT, 1, 60000, .def = 100),
	LOCK_FIELD(warn_wait_ms, F_INT, 0, LLONG_MAX / 4, .def = 1000),
	/* the top level's strict (parse_root) */
	LOCK_FIELD(strict, F_BOOL, 0, 1, .dflt = "=top.strict"),
	LOCK_FIELD(method, F_ENUM, 0, METHOD_RELOC, .names = methods, .def = METHOD_AUTO),
	LOCK_FIELD(object, F_STR, 1, 0),
	/* -1: by symbol */
	LOCK_FIELD(offset, F_ADDR, 0, LLONG_MAX, .def = -1),
	LOCK_FIELD(build_id, F_HEX, 1, CONF_BUILD_ID_MAX),
	/* NULL: every program (check_programs, shim/scope.c) */
	LOCK_FIELD(programs, F_STRS, 0, 0),
	{ .name = NULL }
};

/* The top level, besides the backends' groups (conf_load's groups). */
const struct conf_field conf_top_fields[] = {
	/* read first (parse_root): it says which group the file may have */
	FIELD(struct conf, "backend", backend, F_ENUM, 0, 4, .names = backend_names),
	FIELD(struct conf, "namespace", ns, F_STR, 1, KEY_MAX_NAMESPACE, .def_str = "lockshim"),
	/* -1: not set, log.c's threshold stands */
	FIELD(struct conf, "log_level", log_level, F_LOGLEVEL, LOG_ERROR, LOG_DEBUG,
	      .names = log_levels, .def = -1),
	FIELD(struct conf, "log_file", log_file, F_STR, 0, 0),
	FIELD(struct conf, "log_format", log_format, F_ENUM, 0, 1, .names = log_formats),
	FIELD(struct conf, "log_syslog", log_syslog, F_BOOL, 0, 1),
	FIELD(struct conf, "strict", strict, F_BOOL, 0, 1),
	FIELD(struct conf, "debug_dirs", debug_dirs, F_STRS, 0, 0,
	      .def_strs = (const char *const[]){ "/usr/lib/debug", NULL }),
	/* NULL: every program (check_programs, shim/scope.c) */
	FIELD(struct conf, "programs", programs, F_STRS, 0, 0),
	SECTION("defaults", F_DEFAULTS),
	SECTION("locks", F_LOCKS),
	{ .name = NULL }
};

/* ---- symbols ------------------------------------------------------------ */

/* Functions that return twice, never return, or belong to the dynamic linker. */
static const char *const forbidden_symbols[] = {
	"setjmp", "_setjmp", "sigsetjmp", "__sigsetjmp", "savectx", "vfork", "__vfork",
	"getcontext", "setcontext", "swapcontext", "makecontext",
	"longjmp", "_longjmp", "siglongjmp", "__longjmp_chk",
	"exit", "_exit", "_Exit", "quick_exit", "abort", "pthread_exit",
	"__libc_start_main", "__cxa_throw", "_Unwind_Resume",
	"dlopen", "dlmopen", "dlsym", "dlvsym", "dlclose", "dlerror",
	"dladdr", "dladdr1", "dlinfo", "dl_iterate_phdr", NULL
};

/* Functions that replace the process image: a lock held for the call would
 * never be released (the call does not return when it succeeds). */
static const char *const exec_symbols[] = {
	"execve", "execv", "execvp", "execvpe", "execl", "execlp", "execle",
	"fexecve", "execveat", NULL
};

static int check_symbol(struct conf_err *e, const config_setting_t *s,
			const char *what, const char *sym)
{
	if (!*sym)
		return conf_fail(e, s, what, "empty symbol name");
	for (const char *p = sym; *p; p++)
		if (!isalnum((unsigned char)*p) && *p != '_' && *p != '.' && *p != '$')
			return conf_fail(e, s, what,
				    "\"%s\" is not a symbol name (letters, digits, _ . $)",
				    sym);
	for (int i = 0; forbidden_symbols[i]; i++)
		if (strcmp(sym, forbidden_symbols[i]) == 0)
			return conf_fail(e, s, what,
				    "\"%s\" cannot be guarded (it returns twice, never "
				    "returns, or belongs to the dynamic linker)", sym);
	for (int i = 0; exec_symbols[i]; i++)
		if (strcmp(sym, exec_symbols[i]) == 0)
			return conf_fail(e, s, what,
				    "\"%s\" cannot be guarded: it replaces the program and does "
				    "not return when it succeeds, so its lock would stay held for "
				    "the whole lease", sym);
	return 0;
}

/* ---- programs ----------------------------------------------------------- */

/*
 * Checks a `programs` list (read from s, named what): not empty, and each
 * pattern one that can match something: the patterns are matched without
 * FNM_PATHNAME against an absolute path and a file name (shim/scope.c), so
 * a pattern with a '/' must start with '/' or a wildcard, and a trailing
 * lone backslash escapes nothing. NULL (not set) is fine. Returns 0, or -1
 * said with conf_fail.
 */
static int check_programs(struct conf_err *e, const config_setting_t *s, const char *what,
			  char *const *pats)
{
	if (!pats)
		return 0;
	if (!pats[0])
		return conf_fail(e, s, what, "is empty: it would match no program; leave "
				 "programs out to mean every program");
	for (int i = 0; pats[i]; i++) {
		const config_setting_t *x = s ? config_setting_get_elem(s, (unsigned)i) : NULL;
		const char *p = pats[i];
		size_t n = strlen(p), bs = 0;

		while (bs < n && p[n - 1 - bs] == '\\')
			bs++;
		if (bs % 2)
			return conf_fail(e, x ? x : s, what, "\"%s\" ends with a lone backslash",
					 p);
		if (strchr(p, '/') && !strchr("/*?[", p[0]))
			return conf_fail(e, x ? x : s, what, "\"%s\" has a '/' but starts with "
					 "neither '/' nor a wildcard: it matches neither a "
					 "program's absolute path nor its file name", p);
	}
	return 0;
}

/* ---- parsing ------------------------------------------------------------ */

/* Returns the index of the lock of cfg->locks[0..nspecs) that guards sym, or -1. */
static int guarded_by(const struct conf *cfg, int nspecs, const char *sym)
{
	for (int i = 0; i < nspecs; i++)
		if (cfg->locks[i].symbol && strcmp(cfg->locks[i].symbol, sym) == 0)
			return cfg->locks[i].index;
	return -1;
}

/*
 * Checks the symbols of lock l (read from g, named where), whose first spec
 * is cfg->locks[first]: exactly one of symbol and symbols, a list not
 * empty, each name one that can be guarded, named once in the list and by
 * no earlier lock. Sets l->symbol to the list's first name. Returns 0, or
 * -1 said with conf_fail.
 */
static int check_symbols(struct conf_err *e, const config_setting_t *g, const char *where,
			 struct lock_spec *l, const struct conf *cfg, int first)
{
	const config_setting_t *one = config_setting_get_member(g, "symbol");
	const config_setting_t *list = config_setting_get_member(g, "symbols");
	char what[64];
	int other;

	if (!one && !list)
		return conf_fail(e, g, where, "missing required setting \"symbol\" (or "
				 "\"symbols\", a list)");
	if (one && list)
		return conf_fail(e, list, where, "symbol and symbols together: set one of the two");
	if (one) {
		snprintf(what, sizeof(what), "%s.symbol", where);
		if (check_symbol(e, one, what, l->symbol))
			return -1;
		if ((other = guarded_by(cfg, first, l->symbol)) >= 0)
			return conf_fail(e, one, what, "symbol \"%s\" is already guarded by "
					 "locks[%d]", l->symbol, other);
		return 0;
	}
	snprintf(what, sizeof(what), "%s.symbols", where);
	if (!l->symbols[0])
		return conf_fail(e, list, what, "is empty: name at least one symbol");
	for (int i = 0; l->symbols[i]; i++) {
		const config_setting_t *x = config_setting_get_elem(list, (unsigned)i);

		if (check_symbol(e, x, what, l->symbols[i]))
			return -1;
		for (int j = 0; j < i; j++)
			if (strcmp(l->symbols[j], l->symbols[i]) == 0)
				return conf_fail(e, x, what, "symbol \"%s\" is named twice",
						 l->symbols[i]);
		if ((other = guarded_by(cfg, first, l->symbols[i])) >= 0)
			return conf_fail(e, x, what, "symbol \"%s\" is already guarded by "
					 "locks[%d]", l->symbols[i], other);
	}
	return conf_str_set(&l->symbol, l->symbols[0]) ?
	       conf_fail(e, list, what, "out of memory") : 0;
}

/* Returns how many specs the lock g makes: one per name of its symbols
 * list, else one (a malformed lock too: parse_lock refuses it). */
static int lock_specs(const config_setting_t *g)
{
	const config_setting_t *list = config_setting_get_member(g, "symbols");
	int n = list && (config_setting_is_list(list) || config_setting_is_array(list)) ?
		config_setting_length(list) : 1;

	return n > 1 ? n : 1;
}

/*
 * Checks the lock g's `keys` (named where), when it has them: not beside
 * `key`, not empty, at most CONF_KEYS_MAX. Returns 0, or -1 said with
 * conf_fail.
 */
static int check_keys(struct conf_err *e, const config_setting_t *g, const char *where,
		      const struct lock_spec *l)
{
	const config_setting_t *ks = config_setting_get_member(g, "keys");
	char what[48];
	int n = 0;

	if (!ks)
		return 0;
	snprintf(what, sizeof(what), "%s.keys", where);
	if (config_setting_get_member(g, "key"))
		return conf_fail(e, ks, what, "key and keys together: set one of the two");
	while (l->keys_src[n])
		n++;
	if (n == 0)
		return conf_fail(e, ks, what, "is empty: name at least one key template");
	if (n > CONF_KEYS_MAX)
		return conf_fail(e, ks, what, "has %d templates; at most %d", n, CONF_KEYS_MAX);
	return 0;
}

/* Frees l's compiled key templates (key and the others of `keys`). */
static void keys_release(struct lock_spec *l)
{
	key_tmpl_release(&l->key);
	for (int i = 0; l->more_keys && i < l->nkeys - 1; i++)
		key_tmpl_release(&l->more_keys[i]);
	free(l->more_keys);
	l->more_keys = NULL;
	l->nkeys = 0;
}

/* Compiles l's key templates for its symbol: key, or each of keys (sets
 * nkeys); an error names the setting where the template was written (the
 * lock's key or keys, or the defaults' key). What was compiled is released
 * with l (keys_release). */
static int compile_key(struct conf_err *e, const config_setting_t *g, const char *where,
		       const config_setting_t *defaults_g, struct lock_spec *l,
		       const struct conf *cfg, int tagged)
{
	char host[256] = "localhost", kerr[256], what[48];
	const config_setting_t *ks;
	int n = 0;

	gethostname(host, sizeof(host) - 1);
	if (!l->keys_src) {
		if (!key_compile(&l->key, cfg->ns, l->key_src, l->symbol, host, tagged,
				 kerr, sizeof(kerr))) {
			l->nkeys = 1;
			return 0;
		}
		ks = config_setting_get_member(g, "key");
		if (!ks)
			ks = defaults_g ? config_setting_get_member(defaults_g, "key") : g;
		snprintf(what, sizeof(what), "%s.key", where);
		return conf_fail(e, ks, what, "\"%s\": %s", l->key_src, kerr);
	}
	while (l->keys_src[n])
		n++;
	if (n > 1 && !(l->more_keys = calloc((size_t)n - 1, sizeof(*l->more_keys))))
		return conf_fail(e, g, where, "out of memory");
	for (int i = 0; i < n; i++) {
		struct key_tmpl *t = i ? &l->more_keys[i - 1] : &l->key;

		/* nkeys counts what is compiled, for keys_release */
		if (!key_compile(t, cfg->ns, l->keys_src[i], l->symbol, host, tagged,
				 kerr, sizeof(kerr))) {
			l->nkeys = i + 1;
			continue;
		}
		ks = config_setting_get_elem(config_setting_get_member(g, "keys"), (unsigned)i);
		snprintf(what, sizeof(what), "%s.keys", where);
		return conf_fail(e, ks ? ks : g, what, "\"%s\": %s", l->keys_src[i], kerr);
	}
	return 0;
}

/*
 * Refuses `mode = "shared"` with `limit` > 1 (a shared lock has no count, a
 * semaphore no shared mode), naming the lock's mode. Returns 0, or -1 said
 * with conf_fail.
 */
static int check_mode(struct conf_err *e, const config_setting_t *g, const char *where,
		      const struct lock_spec *l)
{
	const config_setting_t *m = config_setting_get_member(g, "mode");
	char what[48];

	if (!l->shared || l->limit <= 1)
		return 0;
	snprintf(what, sizeof(what), "%s.mode", where);
	return conf_fail(e, m ? m : g, what, "\"shared\" with limit = %d: shared holders "
			 "have no count (any number run together), a semaphore no shared "
			 "mode; set one of the two", l->limit);
}

/* Returns the index in cfg->groups of the group named name, or -1. */
static int group_index(const struct conf *cfg, const char *name)
{
	for (int i = 0; cfg->groups[i]; i++)
		if (strcmp(cfg->groups[i]->name, name) == 0)
			return i;
	return -1;
}

int conf_backend_group(const struct conf *cfg)
{
	return group_index(cfg, conf_backend_name(cfg->backend));
}

/* conf_backend_group, by its short name here. */
static int selected_group(const struct conf *cfg)
{
	return conf_backend_group(cfg);
}

static int refuse_lock(struct conf_err *e, const config_setting_t *lg, const char *where,
		       const struct lock_spec *l, const struct conf_group *grp);

/*
 * Reads the lock g (the idx'th of the file) into cfg->locks[first], and,
 * when it names several symbols, into one more spec per further symbol
 * (struct lock_spec). Returns the number of specs written, or -1 said
 * with conf_fail (the specs written so far are released with cfg).
 */
static int parse_lock(struct conf_err *e, const config_setting_t *g, int idx, int first,
		      const struct lock_spec *defaults,
		      const config_setting_t *defaults_g, struct conf *cfg)
{
	struct lock_spec *l = &cfg->locks[first];
	char where[32];
	int tagged = 0, n = 1, sel = selected_group(cfg);

	snprintf(where, sizeof(where), "locks[%d]", idx);
	l->index = idx;
	if (conf_fields_copy(conf_lock_fields, l, defaults))
		return conf_fail(e, g, where, "out of memory");
	if (conf_group_apply(e, g, where, conf_lock_fields, l))
		return -1;
	if (config_setting_get_member(g, "programs")) {
		char what[48];

		snprintf(what, sizeof(what), "%s.programs", where);
		if (check_programs(e, config_setting_get_member(g, "programs"), what,
				   l->programs))
			return -1;
	}
	for (const struct conf_field *f = conf_lock_fields; f->name; f++)
		if ((f->flags & FL_REQUIRED) && strcmp(f->name, "symbol") &&
		    strcmp(f->name, "symbols") && !config_setting_get_member(g, f->name))
			return conf_fail(e, g, where, "missing required setting \"%s\"", f->name);
	if (check_symbols(e, g, where, l, cfg, first) || check_keys(e, g, where, l))
		return -1;
	if (check_mode(e, g, where, l))
		return -1;
	if (l->offset >= 0 && !l->object)
		return conf_fail(e, g, where, "offset needs object (the file the offset is in)");
	if (l->offset >= 0 && l->method == METHOD_RELOC)
		return conf_fail(e, g, where, "offset needs method \"entry\" or \"auto\": "
				 "relocations are found by name");
	if (l->offset >= 0 && l->symbols && l->symbols[1])
		return conf_fail(e, g, where, "offset names one function: it needs one symbol, "
				 "not a list of several");
	if (sel >= 0) {
		const struct conf_group *grp = cfg->groups[sel];

		if (refuse_lock(e, g, where, l, grp) || (grp->check_lock &&
		    grp->check_lock(e, g, where, l, cfg, cfg->group_data[sel])))
			return -1;
		tagged = grp->hash_tag && grp->hash_tag(cfg->group_data[sel]);
	}
	if (l->on_error < 0)
		l->on_error = l->on_timeout;
	l->stack_args_bytes = (l->stack_args_bytes + 15) & ~15;
	if (compile_key(e, g, where, defaults_g, l, cfg, tagged))
		return -1;
	/* the other symbols: the same settings, each with its own {symbol} */
	for (; l->symbols && l->symbols[n]; n++) {
		struct lock_spec *m = &cfg->locks[first + n];

		if (conf_fields_copy(conf_lock_fields, m, l) ||
		    conf_str_set(&m->symbol, l->symbols[n]))
			return conf_fail(e, g, where, "out of memory");
		m->index = idx;
		m->member = n;
		if (compile_key(e, g, where, defaults_g, m, cfg, tagged))
			return -1;
	}
	return n;
}

/* Returns the selected backend's request_ms (conf_waiter_ttl_ms); 0 when
 * it has none. */
static long long request_ms_of(const struct conf *cfg)
{
	int sel = selected_group(cfg);

	if (sel < 0 || !cfg->groups[sel]->request_ms)
		return 0;
	return cfg->groups[sel]->request_ms(cfg->group_data[sel]);
}

/*
 * Reads `backend` from root before anything else, and refuses a backend
 * that no registered group serves (named by the issue, not built yet).
 * Returns 0, or -1 said with conf_fail.
 */
static int parse_backend(struct conf_err *e, const config_setting_t *root, struct conf *cfg)
{
	const config_setting_t *s = config_setting_get_member(root, "backend");

	if (s && conf_field_apply(e, conf_field_find(conf_top_fields, "backend"), s,
				  "backend", cfg))
		return -1;
	if (selected_group(cfg) < 0)
		return conf_fail(e, s, "backend", "\"%s\" is not available in this build",
				 conf_backend_name(cfg->backend));
	return 0;
}

/* Checks the `defaults` group dg (read into d) against the selected
 * backend's refusals and check_defaults. Returns 0, or -1 said with
 * conf_fail. */
static int check_defaults(struct conf_err *e, const config_setting_t *dg,
			  const struct lock_spec *d, const struct conf *cfg)
{
	int sel = selected_group(cfg);
	const struct conf_group *grp = sel >= 0 ? cfg->groups[sel] : NULL;

	if (!grp)
		return 0;
	if (refuse_lock(e, dg, "defaults", d, grp))
		return -1;
	return grp->check_defaults ?
	       grp->check_defaults(e, dg, "defaults", d, cfg, cfg->group_data[sel]) : 0;
}

/* Reads the top level: the backends' groups and conf_top_fields; defaults
 * and locks are read after it, so that they see the whole top level
 * (namespace, strict, the backends' settings). */
static int parse_root(struct conf_err *e, config_t *cf, struct conf *cfg)
{
	const config_setting_t *root = config_root_setting(cf), *s;
	const config_setting_t *locks = NULL, *defaults_g = NULL;
	struct lock_spec *defaults = &cfg->defaults; /* released with cfg */
	int n = config_setting_length(root), nfile, nspecs = 0, first = 0, sel;
	long long request_ms;

	if (conf_fields_default(conf_lock_fields, defaults))
		return conf_fail(e, NULL, "config", "out of memory");
	if (parse_backend(e, root, cfg))
		return -1;
	sel = selected_group(cfg);
	if (cfg->groups[sel]->lock_defaults)
		cfg->groups[sel]->lock_defaults(defaults);
	for (int i = 0; i < n; i++) {
		const char *name;
		const struct conf_field *f;
		int gi;

		s = config_setting_get_elem(root, (unsigned)i);
		name = config_setting_name(s);
		if ((gi = group_index(cfg, name)) >= 0) {
			if (gi != sel)
				return conf_fail(e, s, name, "is the group of backend \"%s\", but "
						 "backend is \"%s\": remove the group or select "
						 "its backend", name, conf_backend_name(cfg->backend));
			if (conf_group_apply(e, s, name, cfg->groups[gi]->fields,
					     cfg->group_data[gi]) ||
			    (cfg->groups[gi]->check &&
			     cfg->groups[gi]->check(e, s, cfg->group_data[gi])))
				return -1;
			continue;
		}
		f = conf_field_find(conf_top_fields, name);
		if (!f)
			return conf_fail(e, s, name, "unknown setting");
		if (f->kind == F_DEFAULTS)
			defaults_g = s;
		else if (f->kind == F_LOCKS)
			locks = s;
		else if (conf_field_apply(e, f, s, name, cfg))
			return -1;
	}
	if (check_programs(e, config_setting_get_member(root, "programs"), "programs",
			   cfg->programs))
		return -1;
	defaults->strict = cfg->strict;
	if (defaults_g) {
		for (const struct conf_field *f = conf_lock_fields; f->name; f++) {
			char what[64];

			if (!(f->flags & FL_PER_LOCK) ||
			    !(s = config_setting_get_member(defaults_g, f->name)))
				continue;
			snprintf(what, sizeof(what), "defaults.%s", f->name);
			return conf_fail(e, s, what, "%s is per lock, not a default", f->name);
		}
		if (conf_group_apply(e, defaults_g, "defaults", conf_lock_fields, defaults) ||
		    check_programs(e, config_setting_get_member(defaults_g, "programs"),
				   "defaults.programs", defaults->programs) ||
		    check_mode(e, defaults_g, "defaults", defaults) ||
		    check_defaults(e, defaults_g, defaults, cfg))
			return -1;
	}
	/* Derived fields, once everything they read is valid and final. */
	request_ms = request_ms_of(cfg);
	defaults->waiter_ttl_ms = conf_waiter_ttl_ms(defaults, request_ms);
	if (!locks)
		return 0;
	if (!config_setting_is_list(locks) && !config_setting_is_array(locks))
		return conf_fail(e, locks, "locks", "expected a list ( { ... }, ... ), got %s",
				 conf_type_name(locks));
	nfile = config_setting_length(locks);
	for (int i = 0; i < nfile; i++)
		nspecs += lock_specs(config_setting_get_elem(locks, (unsigned)i));
	cfg->locks = calloc((size_t)nspecs + 1, sizeof(*cfg->locks));
	if (!cfg->locks)
		return conf_fail(e, locks, "locks", "out of memory");
	for (int i = 0, made; i < nfile; i++) {
		/* what a failure leaves is released with cfg: every spec it may touch */
		cfg->nlocks = nspecs;
		made = parse_lock(e, config_setting_get_elem(locks, (unsigned)i), i, first,
				  defaults, defaults_g, cfg);
		if (made < 0)
			return -1;
		first += made;
	}
	cfg->nlocks = first;
	for (int i = 0; i < cfg->nlocks; i++)
		cfg->locks[i].waiter_ttl_ms = conf_waiter_ttl_ms(&cfg->locks[i], request_ms);
	return 0;
}

/* Gives cfg the built-in values: the top level's, and each group's (in a
 * struct of its own). Returns 0, or -1 out of memory. */
static int conf_defaults(struct conf *cfg, const struct conf_group *const *groups)
{
	memset(cfg, 0, sizeof(*cfg));
	if (conf_fields_default(conf_top_fields, cfg))
		return -1;
	for (int i = 0; groups && groups[i]; i++) {
		if (i == CONF_GROUPS_MAX)
			return -1;
		cfg->groups[i] = groups[i];
		if (!(cfg->group_data[i] = calloc(1, groups[i]->size)) ||
		    conf_fields_default(groups[i]->fields, cfg->group_data[i]))
			return -1;
	}
	return 0;
}

int conf_secure(void)
{
	return getauxval(AT_SECURE) != 0;
}

/* Returns 1 when st is owned by root and writable by nobody else. */
static int root_only(const struct stat *st)
{
	return st->st_uid == 0 && !(st->st_mode & (S_IWGRP | S_IWOTH));
}

/* Opens the directory dir (absolute) one component at a time from "/",
 * none followed through a symbolic link, each checked with fstat to be
 * root's alone. Returns its descriptor, -1 when one cannot be opened, or
 * CONF_UNTRUSTED; the reason in why. */
static int open_trusted_dir(const char *dir, char *why, size_t whylen)
{
	char part[PATH_MAX];
	const char *p = dir;
	struct stat st = { 0 };
	int fd = open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC), next;

	for (;;) {
		size_t n = (size_t)(p - dir);

		if (fd < 0 && (errno == ELOOP || errno == ENOTDIR)) {
			snprintf(why, whylen, "\"%.*s\" is a symbolic link or not a directory",
				 (int)n, dir);
			return CONF_UNTRUSTED;
		}
		if (fd < 0) {
			snprintf(why, whylen, "cannot open \"%.*s\": %s", (int)(n ? n : 1), dir,
				 strerror(errno));
			return -1;
		}
		if (fstat(fd, &st) != 0 || !root_only(&st)) {
			snprintf(why, whylen, "directory \"%.*s\" (owner %u, mode %04o) is not owned "
				 "by root or is writable by group or others", (int)(n ? n : 1), dir,
				 (unsigned)st.st_uid, (unsigned)st.st_mode & 07777);
			close(fd);
			return CONF_UNTRUSTED;
		}
		while (*p == '/')
			p++;
		if (!*p)
			return fd;
		n = strcspn(p, "/");
		memcpy(part, p, n);
		part[n] = 0;
		p += n;
		next = openat(fd, part, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		close(fd);
		fd = next;
	}
}

int conf_open_trusted(const char *path, int flags, int mode, int file_too, char *why,
		      size_t whylen)
{
	const char *base = strrchr(path, '/');
	char dir[PATH_MAX];
	struct stat st = { 0 };
	int dfd, fd, e;

	if (path[0] != '/' || !base[1] || (size_t)(base - path) >= sizeof(dir)) {
		snprintf(why, whylen, "\"%s\" is not an absolute path to a file", path);
		return CONF_UNTRUSTED;
	}
	memcpy(dir, path, (size_t)(base - path));
	dir[base - path] = 0;
	if ((dfd = open_trusted_dir(dir, why, whylen)) < 0)
		return dfd;
	fd = openat(dfd, base + 1, flags | O_NOFOLLOW | O_NOCTTY | O_CLOEXEC, (mode_t)mode);
	e = errno;
	close(dfd);
	if (fd < 0) {
		snprintf(why, whylen, "\"%s\" %s%s", path, e == ELOOP ? "is a symbolic link" :
			 "cannot be opened: ", e == ELOOP ? "" : strerror(e));
		return e == ELOOP ? CONF_UNTRUSTED : -1;
	}
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || (file_too && !root_only(&st))) {
		snprintf(why, whylen, "\"%s\" (owner %u, mode %04o) is not a regular file owned by "
			 "root and not writable by group or others", path, (unsigned)st.st_uid,
			 (unsigned)st.st_mode & 07777);
		close(fd);
		return CONF_UNTRUSTED;
	}
	return fd;
}

int conf_read_password_file(struct conf_err *e, const config_setting_t *s, const char *what,
			    const char *path, char **password)
{
	char line[1024], why[512];
	FILE *f = NULL;
	size_t n;
	int fd;

	if (!conf_secure()) {
		f = fopen(path, "re");
	} else if ((fd = conf_open_trusted(path, O_RDONLY, 0, 1, why, sizeof(why))) >= 0) {
		if (!(f = fdopen(fd, "re")))
			close(fd);
	} else {
		e->untrusted = fd == CONF_UNTRUSTED;
		return conf_fail(e, s, what, "%s", why);
	}
	if (!f)
		return conf_fail(e, s, what, "cannot open \"%s\": %s", path, strerror(errno));
	if (!fgets(line, sizeof(line), f))
		line[0] = 0;
	fclose(f);
	n = strcspn(line, "\r\n");
	line[n] = 0;
	if (!n)
		return conf_fail(e, s, what, "\"%s\" has no password on its first line", path);
	return conf_str_set(password, line) ? conf_fail(e, s, what, "out of memory") : 0;
}

/* Returns 1 when lock l asks by value for the per-lock setting name that a
 * backend may not have built (struct conf_group's unbuilt), else 0. */
static int lock_asks(const struct lock_spec *l, const char *name)
{
	if (!strcmp(name, "fair"))
		return l->fair;
	if (!strcmp(name, "limit"))
		return l->limit > 1;
	if (!strcmp(name, "mode"))
		return l->shared;
	if (!strcmp(name, "linger_ms"))
		return l->linger_ms > 0;
	if (!strcmp(name, "max_hold_ms"))
		return l->max_hold_ms > 0;
	return 0;
}

/* Returns g's member name, or NULL (also when g is NULL: a lock made by
 * `lockshim lock`, whose settings are the defaults and its options). */
static const config_setting_t *member(const config_setting_t *g, const char *name)
{
	return g ? config_setting_get_member(g, name) : NULL;
}

/* Refuses what lock l (read from the group lg, named where: a lock or
 * `defaults`; lg NULL for `lockshim lock`'s) sets that grp's backend
 * refuses (struct conf_group's unavailable and unbuilt). Returns 0, or -1
 * said with conf_fail. */
static int refuse_lock(struct conf_err *e, const config_setting_t *lg, const char *where,
		       const struct lock_spec *l, const struct conf_group *grp)
{
	const struct conf_refusal *unavailable = grp->unavailable, *unbuilt = grp->unbuilt;
	const char *backend = grp->name;
	const config_setting_t *s;
	char what[64];

	for (; unavailable && unavailable->setting; unavailable++)
		if ((s = member(lg, unavailable->setting))) {
			snprintf(what, sizeof(what), "%s.%s", where, unavailable->setting);
			return conf_fail(e, s, what, "not available with backend \"%s\": %s",
					 backend, unavailable->why);
		}
	for (; unbuilt && unbuilt->setting; unbuilt++)
		if (lock_asks(l, unbuilt->setting)) {
			s = member(lg, unbuilt->setting);
			snprintf(what, sizeof(what), "%s.%s", where, unbuilt->setting);
			return conf_fail(e, s ? s : lg, what, "%s is not built yet for backend \"%s\"",
					 unbuilt->why, backend);
		}
	return 0;
}

void conf_no_linger(struct lock_spec *d)
{
	d->linger_ms = 0;
}

int conf_load(struct conf *cfg, const char *path, const struct conf_group *const *groups,
	      char *err, size_t errlen)
{
	struct conf_err e = { err, errlen, path, 0 };
	config_t cf;
	FILE *f;
	int rc;

	if (conf_defaults(cfg, groups) || conf_str_set(&cfg->path, path))
		return conf_fail(&e, NULL, "config", "out of memory");
	if (conf_secure()) {
		char why[512];
		int fd = conf_open_trusted(path, O_RDONLY, 0, 1, why, sizeof(why));

		if (fd == CONF_UNTRUSTED) {
			snprintf(err, errlen, "%s", why);
			return CONF_UNTRUSTED;
		}
		if (fd < 0 || !(f = fdopen(fd, "re"))) {
			if (fd >= 0)
				close(fd);
			return conf_fail(&e, NULL, "config", "%s", why);
		}
	} else if (!(f = fopen(path, "re"))) {
		return conf_fail(&e, NULL, "config", "cannot open: %s", strerror(errno));
	}
	config_init(&cf);
	if (!config_read(&cf, f)) {
		snprintf(err, errlen, "%s:%d: syntax error: %s", path,
			 config_error_line(&cf), config_error_text(&cf));
		rc = -1;
	} else {
		rc = parse_root(&e, &cf, cfg);
	}
	config_destroy(&cf);
	fclose(f);
	return rc && e.untrusted ? CONF_UNTRUSTED : rc;
}

void conf_release(struct conf *cfg)
{
	for (int i = 0; i < cfg->nlocks; i++) {
		conf_fields_release(conf_lock_fields, &cfg->locks[i]);
		keys_release(&cfg->locks[i]);
	}
	free(cfg->locks);
	conf_fields_release(conf_lock_fields, &cfg->defaults);
	for (int i = 0; i < CONF_GROUPS_MAX && cfg->groups[i]; i++) {
		if (cfg->group_data[i])
			conf_fields_release(cfg->groups[i]->fields, cfg->group_data[i]);
		free(cfg->group_data[i]);
	}
	conf_fields_release(conf_top_fields, cfg);
	free(cfg->path);
	memset(cfg, 0, sizeof(*cfg));
}

void *conf_group_data(const struct conf *cfg, const struct conf_group *g)
{
	for (int i = 0; i < CONF_GROUPS_MAX && cfg->groups[i]; i++)
		if (cfg->groups[i] == g)
			return cfg->group_data[i];
	return NULL;
}

int conf_logging(const struct conf *cfg, int apply, char *err, size_t errlen)
{
	const char *env = secure_getenv("LOCKSHIM_LOG_LEVEL");
	int level = cfg->log_level, rc;

	if (env && *env && (level = log_level_parse(env)) < 0) {
		snprintf(err, errlen, "LOCKSHIM_LOG_LEVEL: unknown value \"%s\" (expected one "
			 "of: error, warn, info, debug)", env);
		return -1;
	}
	if (cfg->log_file && conf_secure()) {
		char why[512];
		int fd = conf_open_trusted(cfg->log_file, O_WRONLY | O_APPEND | O_CREAT, 0644, 0,
					   why, sizeof(why));

		if (fd < 0) {
			snprintf(err, errlen, "%s: log_file: %s", cfg->path, why);
			return fd == CONF_UNTRUSTED ? CONF_UNTRUSTED : -1;
		}
		rc = apply ? log_use_file(cfg->log_file, fd) : (close(fd), 0);
	} else if (cfg->log_file) {
		rc = apply ? log_open_file(cfg->log_file) : log_check_file(cfg->log_file);
	} else {
		rc = 0;
	}
	if (rc < 0) {
		snprintf(err, errlen, "%s: log_file: cannot open \"%s\": %s", cfg->path,
			 cfg->log_file, strerror(-rc));
		return -1;
	}
	if (apply && level >= 0)
		log_threshold = level;
	if (apply)
		log_set_json(cfg->log_format == 1);
	if (apply && cfg->log_syslog) {
		/* the tests' own socket; never read in secure-execution mode */
		const char *sys = secure_getenv("LOCKSHIM_TEST_SYSLOG_PATH");

		if ((rc = log_open_syslog(sys && *sys ? sys : "/dev/log")) < 0) {
			snprintf(err, errlen, "%s: log_syslog: %s", cfg->path, strerror(-rc));
			return -1;
		}
	}
	return 0;
}

struct lock_spec *conf_add_literal_lock(struct conf *cfg, const char *key, char *err,
					size_t errlen)
{
	struct lock_spec *locks, *l;
	char *src = malloc(2 * strlen(key) + 1), *q = src;
	int tagged = 0, sel;

	if (!src)
		goto nomem;
	for (const char *p = key; *p; p++) { /* "{{" and "}}": the brace itself */
		if (*p == '{' || *p == '}')
			*q++ = *p;
		*q++ = *p;
	}
	*q = 0;
	locks = realloc(cfg->locks, sizeof(*locks) * (size_t)(cfg->nlocks + 2));
	if (!locks)
		goto nomem;
	cfg->locks = locks;
	l = &locks[cfg->nlocks];
	memset(l, 0, 2 * sizeof(*l));
	if ((sel = selected_group(cfg)) >= 0 && cfg->groups[sel]->hash_tag)
		tagged = cfg->groups[sel]->hash_tag(cfg->group_data[sel]);
	/* counted from here: conf_release frees whatever was set */
	cfg->nlocks++;
	if (conf_fields_copy(conf_lock_fields, l, &cfg->defaults) ||
	    conf_str_set(&l->symbol, key) || conf_str_set(&l->key_src, src))
		goto nomem;
	l->index = cfg->nlocks > 1 ? locks[cfg->nlocks - 2].index + 1 : 0;
	if (l->on_error < 0)
		l->on_error = l->on_timeout;
	l->waiter_ttl_ms = conf_waiter_ttl_ms(l, request_ms_of(cfg));
	if (key_compile(&l->key, cfg->ns, src, key, "", tagged, err, errlen)) {
		cfg->nlocks--;
		conf_fields_release(conf_lock_fields, l);
		free(src);
		return NULL;
	}
	l->nkeys = 1;
	free(src);
	return l;
nomem:
	free(src);
	snprintf(err, errlen, "out of memory");
	return NULL;
}

long long conf_waiter_ttl_ms(const struct lock_spec *l, long long request_ms)
{
	return 2 * l->retry_max_ms + request_ms;
}

int conf_keep_locks(struct conf *cfg, int (*keep)(const struct lock_spec *l, void *arg),
		    void *arg)
{
	int n = 0;

	for (int i = 0; i < cfg->nlocks; i++) {
		struct lock_spec *l = &cfg->locks[i];

		if (keep(l, arg)) {
			if (n != i)
				cfg->locks[n] = *l;
			n++;
			continue;
		}
		conf_fields_release(conf_lock_fields, l);
		keys_release(l);
	}
	if (n < cfg->nlocks)
		memset(&cfg->locks[n], 0, sizeof(*cfg->locks) * (size_t)(cfg->nlocks - n));
	cfg->nlocks = n;
	return n;
}

const struct lock_spec *conf_find(const struct conf *cfg, const char *symbol)
{
	for (int i = 0; i < cfg->nlocks; i++)
		if (strcmp(cfg->locks[i].symbol, symbol) == 0)
			return &cfg->locks[i];
	return NULL;
}
