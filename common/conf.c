/* SPDX-License-Identifier: MIT */
/*
 * conf.c - parsing and validating the libconfig file (see conf.h).
 *
 * Settings are described by tables (see "setting tables" below): top_fields
 * for the top level, redis_fields for the `redis` group and lock_fields for
 * the per-lock settings, which parses the `defaults` group and every entry of
 * `locks`. So a setting is defined, range-checked and written in one place,
 * and a new one is one line. A lock starts from the built-in defaults, then
 * `defaults`, then its own settings. Every error is one line:
 * "<file>:<line>: <setting>: <problem>".
 */
#include "conf.h"

#include <ctype.h>
#include <errno.h>
#include <libconfig.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"

struct errbuf {
	char *buf;
	size_t len;
	const char *file;
};

static int fail(struct errbuf *e, const config_setting_t *s, const char *what,
		const char *fmt, ...) __attribute__((format(printf, 4, 5)));

static int fail(struct errbuf *e, const config_setting_t *s, const char *what,
		const char *fmt, ...)
{
	va_list ap;
	int n;

	if (s && config_setting_source_line(s))
		n = snprintf(e->buf, e->len, "%s:%u: %s: ", e->file,
			     config_setting_source_line(s), what);
	else
		n = snprintf(e->buf, e->len, "%s: %s: ", e->file, what);
	if (n < 0 || (size_t)n >= e->len)
		return -1;
	va_start(ap, fmt);
	vsnprintf(e->buf + n, e->len - (size_t)n, fmt, ap);
	va_end(ap);
	return -1;
}

/* ---- value helpers ---------------------------------------------------- */

static const char *type_name(const config_setting_t *s)
{
	switch (config_setting_type(s)) {
	case CONFIG_TYPE_GROUP: return "a group";
	case CONFIG_TYPE_INT:
	case CONFIG_TYPE_INT64: return "an integer";
	case CONFIG_TYPE_FLOAT: return "a float";
	case CONFIG_TYPE_STRING: return "a string";
	case CONFIG_TYPE_BOOL: return "a boolean";
	case CONFIG_TYPE_ARRAY: return "an array";
	case CONFIG_TYPE_LIST: return "a list";
	}
	return "unknown";
}

static int get_int(struct errbuf *e, const config_setting_t *s, const char *what,
		   long long min, long long max, long long *out)
{
	int t = config_setting_type(s);
	long long v = 0;

	if (t != CONFIG_TYPE_INT && t != CONFIG_TYPE_INT64)
		return fail(e, s, what, "expected an integer, got %s", type_name(s));
	v = config_setting_get_int64(s);
	if (v < min || v > max)
		return fail(e, s, what, "value %lld out of range (%lld..%lld)", v,
			    min, max);
	*out = v;
	return 0;
}

/* Accepts milliseconds as an integer or a decimal (0.5) in min..max ms;
 * stores microseconds. */
static int get_ms_as_us(struct errbuf *e, const config_setting_t *s, const char *what,
			long long min, long long max, long long *out_us)
{
	int t = config_setting_type(s);
	double v;

	if (t != CONFIG_TYPE_FLOAT && t != CONFIG_TYPE_INT && t != CONFIG_TYPE_INT64)
		return fail(e, s, what, "expected a number, got %s", type_name(s));
	if (t != CONFIG_TYPE_FLOAT) {
		if (get_int(e, s, what, min, max, out_us))
			return -1;
		*out_us *= 1000;
		return 0;
	}
	v = config_setting_get_float(s);
	if (!(v >= (double)min && v <= (double)max))
		return fail(e, s, what, "value %g out of range (%lld..%lld)", v, min, max);
	*out_us = (long long)(v * 1000 + 0.5);
	return 0;
}

static int get_str(struct errbuf *e, const config_setting_t *s, const char *what,
		   const char **out)
{
	if (config_setting_type(s) != CONFIG_TYPE_STRING)
		return fail(e, s, what, "expected a string, got %s", type_name(s));
	*out = config_setting_get_string(s);
	return 0;
}

static int set_str(char **dst, const char *v)
{
	char *p = strdup(v);

	if (!p)
		return -1;
	free(*dst);
	*dst = p;
	return 0;
}

static const char *const call_policies[] = { "skip", "exit", "abort", "proceed", NULL };
static const char *const hold_policies[] = { "log", "kill", "abort", NULL };

static const char *const methods[] = { "auto", "entry", "reloc", NULL };

const char *conf_call_policy_name(int p) { return call_policies[p]; }
const char *conf_hold_policy_name(int p) { return hold_policies[p]; }
const char *conf_method_name(int m) { return methods[m]; }

/* Level names of log.h's enum log_level, for log_level's messages; log.c
 * parses them (log_level_parse, any case). */
static const char *const log_levels[] = { "error", "warn", "info", "debug", NULL };

/* Writes "a, b, c" (names, NULL-terminated) into buf. */
static void join_names(char *buf, size_t len, const char *const *names)
{
	buf[0] = 0;
	for (int i = 0; names[i]; i++)
		snprintf(buf + strlen(buf), len - strlen(buf), "%s%s", i ? ", " : "", names[i]);
}

static int get_enum(struct errbuf *e, const config_setting_t *s, const char *what,
		    const char *const *names, int *out)
{
	const char *v = NULL;
	char expected[128];

	if (get_str(e, s, what, &v))
		return -1;
	for (int i = 0; names[i]; i++) {
		if (strcmp(v, names[i]) == 0) {
			*out = i;
			return 0;
		}
	}
	join_names(expected, sizeof(expected), names);
	return fail(e, s, what, "unknown value \"%s\" (expected one of: %s)", v,
		    expected);
}

static int get_log_level(struct errbuf *e, const config_setting_t *s, const char *what,
			 int *out)
{
	const char *v = NULL;
	char expected[128];

	if (get_str(e, s, what, &v))
		return -1;
	*out = log_level_parse(v);
	if (*out >= 0)
		return 0;
	join_names(expected, sizeof(expected), log_levels);
	return fail(e, s, what, "unknown value \"%s\" (expected one of: %s)", v,
		    expected);
}

static int errno_by_name(const char *name)
{
	for (int i = 1; i < 4096; i++) {
		const char *n = strerrorname_np(i);

		if (n && strcmp(n, name) == 0)
			return i;
	}
	return -1;
}

static int signal_by_name(const char *name)
{
	if (strncmp(name, "SIG", 3) == 0)
		name += 3;
	for (int i = 1; i < NSIG; i++) {
		const char *n = sigabbrev_np(i);

		if (n && strcmp(n, name) == 0)
			return i;
	}
	return -1;
}

/* Accepts an integer or a string holding one ("0x1a2b", "6699") in 0..max. */
static int get_address(struct errbuf *e, const config_setting_t *s, const char *what,
		       long long max, long long *out)
{
	const char *v;
	char *end;
	unsigned long long u;

	if (config_setting_type(s) != CONFIG_TYPE_STRING)
		return get_int(e, s, what, 0, max, out);
	v = config_setting_get_string(s);
	errno = 0;
	u = strtoull(v, &end, 0);
	if (!*v || *v == '-' || *v == '+' || *end || errno)
		return fail(e, s, what, "\"%s\" is not an address (an integer or \"0x...\")", v);
	if (u > (unsigned long long)max)
		return fail(e, s, what, "value %s out of range (0..%lld)", v, max);
	*out = (long long)u;
	return 0;
}

/* Accepts a string of hex digits encoding min..max bytes; *out gets a
 * malloc'd lowercase copy. */
static int get_hex(struct errbuf *e, const config_setting_t *s, const char *what,
		   long long min, long long max, char **out)
{
	const char *v = NULL;
	size_t len;
	char *p;

	if (get_str(e, s, what, &v))
		return -1;
	len = strlen(v);
	for (size_t i = 0; i < len; i++)
		if (!isxdigit((unsigned char)v[i]))
			return fail(e, s, what, "\"%s\" is not hex (digits 0-9 a-f)", v);
	if (len % 2 || len / 2 < (size_t)min || len / 2 > (size_t)max)
		return fail(e, s, what, "\"%s\" must be %lld..%lld bytes in hex (an even "
			    "number of digits)", v, min, max);
	if (!(p = strdup(v)))
		return fail(e, s, what, "out of memory");
	for (size_t i = 0; i < len; i++)
		p[i] = (char)tolower((unsigned char)p[i]);
	free(*out);
	*out = p;
	return 0;
}

static void free_strs(char **v)
{
	for (size_t i = 0; v && v[i]; i++)
		free(v[i]);
	free(v);
}

/* Accepts a list or array of non-empty strings; *out gets a malloc'd,
 * NULL-terminated copy (free_strs). */
static int get_strs(struct errbuf *e, const config_setting_t *s, const char *what,
		    char ***out)
{
	int n = config_setting_length(s);
	char **v;

	if (!config_setting_is_list(s) && !config_setting_is_array(s))
		return fail(e, s, what, "expected a list ( \"...\", ... ), got %s", type_name(s));
	if (!(v = calloc((size_t)n + 1, sizeof(*v))))
		return fail(e, s, what, "out of memory");
	for (int i = 0; i < n; i++) {
		const config_setting_t *x = config_setting_get_elem(s, (unsigned)i);
		const char *str = NULL;

		if (get_str(e, x, what, &str) || (!*str && fail(e, x, what, "must not be empty")) ||
		    !(v[i] = strdup(str))) {
			free_strs(v);
			return -1;
		}
	}
	free_strs(*out);
	*out = v;
	return 0;
}

/* Accepts a symbolic name (looked up with lookup) or a number in 1..max. */
static int get_named_number(struct errbuf *e, const config_setting_t *s,
			    const char *what, int (*lookup)(const char *), int max,
			    int *out)
{
	long long v = 0;
	const char *name;

	if (config_setting_type(s) == CONFIG_TYPE_STRING) {
		name = config_setting_get_string(s);
		*out = lookup(name);
		if (*out < 0)
			return fail(e, s, what, "unknown name \"%s\"", name);
		return 0;
	}
	if (get_int(e, s, what, 0, max, &v))
		return -1;
	*out = (int)v;
	return 0;
}

/* ---- setting tables ---------------------------------------------------- */

/*
 * A table of settings describes a group of the file: each entry names a
 * setting, how its value is read (kind), where it is written (offset and
 * size of the member, taken with offsetof and sizeof by FIELD) and the range
 * of values it may take. The writer stores integers by the member's size, so
 * an entry can never write past its member; FIELD refuses at build time a
 * member whose size the writer does not handle or that cannot hold every
 * value of the range. Three tables use this machinery: top_fields (the top
 * level, written into struct conf), redis_fields (struct redis_spec) and
 * lock_fields (struct lock_spec, for `defaults` and each lock).
 */
enum field_kind {
	F_INT,      /* integer in min..max */
	F_USEC,     /* milliseconds, whole or decimal, in min..max; stored as us */
	F_BOOL,     /* true or false, stored as 0 or 1 */
	F_STR,      /* string of min..max bytes (max 0: no limit), strdup'd */
	F_ERRNO,    /* errno name or number in 0..max */
	F_SIGNAL,   /* signal name (with or without SIG) or number in 1..max */
	F_RETURN,   /* integer or float: a long long and a double (off2) */
	F_LOGLEVEL, /* log level name, any case */
	F_ENUM,     /* one of the names in .names, stored as its index */
	F_ADDR,     /* integer or "0x..." string in 0..max */
	F_HEX,      /* hex string of min..max bytes, strdup'd in lowercase */
	F_STRS,     /* list of non-empty strings, a NULL-terminated char ** */
	F_GROUP,    /* a group read with the table sub into the member */
	F_SERVERS,  /* a list of groups read with sub, each into a struct redis_spec:
		     * the array (member) and its length (the int at off2) */
	F_DEFAULTS, /* the group of per-lock defaults (parse_root) */
	F_LOCKS,    /* the list of locks (parse_root) */
};

struct field {
	const char *name;
	enum field_kind kind;
	size_t off, size;   /* the member written */
	long long min, max; /* values written (integer kinds), bytes (F_STR) */
	size_t off2;        /* F_RETURN: the double member; F_SERVERS: the count */
	const struct field *sub; /* F_GROUP, F_SERVERS: its settings */
	const char *const *names; /* F_ENUM: the values, NULL-terminated */
	/* F_GROUP: checks the member once the group is read */
	int (*check)(struct errbuf *e, const config_setting_t *g, const void *member);
	unsigned flags;
	/* For `lockshim settings`: the default when it is another setting's
	 * value ("=<group>.<name>"); else it is read from the built-in values. */
	const char *dflt;
};

#define FL_REQUIRED 1u  /* a lock must set it */
#define FL_PER_LOCK 2u  /* not allowed in `defaults` */

/* Kinds whose value is an integer stored by the member's size. */
#define KIND_IS_INT(k) ((k) == F_INT || (k) == F_BOOL ||                        \
			(k) == F_ERRNO || (k) == F_SIGNAL ||                    \
			(k) == F_LOGLEVEL || (k) == F_ENUM || (k) == F_ADDR)

/* Nonzero when a signed integer of sz bytes holds every value in lo..hi. */
#define INT_FITS(sz, lo, hi)                                                   \
	(((sz) == 1 && (lo) >= SCHAR_MIN && (hi) <= SCHAR_MAX) ||              \
	 ((sz) == 2 && (lo) >= SHRT_MIN && (hi) <= SHRT_MAX) ||                \
	 ((sz) == 4 && (lo) >= INT32_MIN && (hi) <= INT32_MAX) ||              \
	 (sz) == 8)

/* Nonzero when the writer of kind k handles a member of sz bytes. */
#define FIELD_OK(k, sz, lo, hi)                                                \
	(KIND_IS_INT(k) ? INT_FITS(sz, lo, hi) :                                \
	 (k) == F_USEC ? (sz) == sizeof(long long) && (hi) <= LLONG_MAX / 1000 : \
	 (k) == F_STR || (k) == F_HEX ? (sz) == sizeof(char *) :                \
	 (k) == F_STRS ? (sz) == sizeof(char **) :                              \
	 (k) == F_SERVERS ? (sz) == sizeof(struct redis_spec *) :              \
	 (k) == F_GROUP)

/* 0, or a compile error saying why when cond is false. */
#define BUILD_CHECK(cond, why) (0 * sizeof(struct { _Static_assert(cond, why); int x; }))

#define MEMBER_SIZE(type, member) sizeof(((type *)0)->member)

/* An entry of a table of settings written into a struct type; optional
 * designated initializers follow (.flags, .sub, .check, .dflt). */
#define FIELD(type, setting, member, k, lo, hi, ...)                           \
	{ .name = setting, .kind = k, .off = offsetof(type, member),           \
	  .size = MEMBER_SIZE(type, member) +                                  \
		  BUILD_CHECK(FIELD_OK(k, MEMBER_SIZE(type, member), lo, hi),  \
			      "setting " setting ": the writer of its kind "   \
			      "cannot store its range in a member of this size"), \
	  .min = lo, .max = hi, __VA_ARGS__ }

/* An integer-or-float setting written to a long long and a double. */
#define RETURN_FIELD(type, setting, member, member2)                           \
	{ .name = setting, .kind = F_RETURN, .off = offsetof(type, member),    \
	  .size = MEMBER_SIZE(type, member) +                                  \
		  BUILD_CHECK(MEMBER_SIZE(type, member) == sizeof(long long) && \
			      MEMBER_SIZE(type, member2) == sizeof(double),     \
			      "setting " setting ": needs a long long and a double"), \
	  .min = LLONG_MIN, .max = LLONG_MAX, .off2 = offsetof(type, member2) }

/* A top-level section that parse_root reads itself. */
#define SECTION(setting, k) { .name = setting, .kind = k }

_Static_assert(sizeof(call_policies) / sizeof(*call_policies) == POLICY_PROCEED + 2,
	       "call_policies names every enum call_policy");
_Static_assert(sizeof(hold_policies) / sizeof(*hold_policies) == HOLD_ABORT + 2,
	       "hold_policies names every enum hold_policy");
_Static_assert(sizeof(log_levels) / sizeof(*log_levels) == LOG_DEBUG + 2,
	       "log_levels names every enum log_level");

/* Stores v, which FIELD made sure fits, in the size-byte integer at dst. */
static int store_int(void *dst, size_t size, long long v)
{
	int8_t i8 = (int8_t)v;
	int16_t i16 = (int16_t)v;
	int32_t i32 = (int32_t)v;
	int64_t i64 = v;

	switch (size) {
	case 1: memcpy(dst, &i8, 1); return 0;
	case 2: memcpy(dst, &i16, 2); return 0;
	case 4: memcpy(dst, &i32, 4); return 0;
	case 8: memcpy(dst, &i64, 8); return 0;
	}
	return -1;
}

/* Returns the size-byte integer at src. */
static long long load_int(const void *src, size_t size)
{
	int8_t i8;
	int16_t i16;
	int32_t i32;
	int64_t i64;

	switch (size) {
	case 1: memcpy(&i8, src, 1); return i8;
	case 2: memcpy(&i16, src, 2); return i16;
	case 4: memcpy(&i32, src, 4); return i32;
	case 8: memcpy(&i64, src, 8); return i64;
	}
	return 0;
}

/* Returns the entry of fields named name, or NULL. */
static const struct field *field_find(const struct field *fields, const char *name)
{
	for (; fields->name; fields++)
		if (strcmp(fields->name, name) == 0)
			return fields;
	return NULL;
}

/* ---- the tables --------------------------------------------------------- */

#define LOCK_FIELD(n, k, lo, hi, ...) FIELD(struct lock_spec, #n, n, k, lo, hi, __VA_ARGS__)
static const struct field lock_fields[] = {
	LOCK_FIELD(symbol, F_STR, 0, 0, .flags = FL_REQUIRED | FL_PER_LOCK),
	FIELD(struct lock_spec, "key", key_src, F_STR, 0, 0),
	LOCK_FIELD(lease_ms, F_INT, 30, INT_MAX),
	LOCK_FIELD(wait_ms, F_INT, -1, LLONG_MAX / 4),
	LOCK_FIELD(on_timeout, F_ENUM, 0, POLICY_PROCEED, .names = call_policies),
	RETURN_FIELD(struct lock_spec, "return", ret, ret_double),
	FIELD(struct lock_spec, "errno", err, F_ERRNO, 0, 4095),
	LOCK_FIELD(exit_code, F_INT, 0, 255),
	LOCK_FIELD(on_error, F_ENUM, 0, POLICY_PROCEED, .names = call_policies,
		   .dflt = "=lock.on_timeout"),
	LOCK_FIELD(on_lost, F_ENUM, 0, HOLD_ABORT, .names = hold_policies),
	LOCK_FIELD(max_hold_ms, F_INT, 0, LLONG_MAX / 4),
	LOCK_FIELD(on_overrun, F_ENUM, 0, HOLD_ABORT, .names = hold_policies),
	LOCK_FIELD(kill_signal, F_SIGNAL, 1, NSIG - 1),
	LOCK_FIELD(kill_grace_ms, F_INT, 0, LLONG_MAX / 4),
	LOCK_FIELD(reentrant, F_BOOL, 0, 1),
	LOCK_FIELD(fair, F_BOOL, 0, 1),
	FIELD(struct lock_spec, "break_dead_holders", break_dead, F_BOOL, 0, 1),
	FIELD(struct lock_spec, "handoff_ms", handoff_us, F_USEC, 0, 60000),
	LOCK_FIELD(linger_ms, F_INT, 0, 60000),
	LOCK_FIELD(stack_args_bytes, F_INT, 0, STACK_ARGS_MAX),
	LOCK_FIELD(retry_max_ms, F_INT, 1, 60000),
	LOCK_FIELD(strict, F_BOOL, 0, 1, .dflt = "=top.strict"),
	LOCK_FIELD(method, F_ENUM, 0, METHOD_RELOC, .names = methods),
	LOCK_FIELD(object, F_STR, 1, 0),
	LOCK_FIELD(offset, F_ADDR, 0, LLONG_MAX),
	LOCK_FIELD(build_id, F_HEX, 1, CONF_BUILD_ID_MAX),
	{ .name = NULL }
};

#define TLS_FIELD(n, k, lo, hi) FIELD(struct redis_tls, #n, n, k, lo, hi)
static const struct field tls_fields[] = {
	TLS_FIELD(ca_file, F_STR, 1, 0),
	TLS_FIELD(ca_dir, F_STR, 1, 0),
	TLS_FIELD(cert_file, F_STR, 1, 0),
	TLS_FIELD(key_file, F_STR, 1, 0),
	TLS_FIELD(server_name, F_STR, 1, 0),
	TLS_FIELD(verify, F_BOOL, 0, 1),
	{ .name = NULL }
};

static int tls_check(struct errbuf *e, const config_setting_t *g, const void *member);

#define REDIS_FIELD(n, k, lo, hi, ...) FIELD(struct redis_spec, #n, n, k, lo, hi, __VA_ARGS__)
/* An entry of redis.masters: one server. What it leaves unset, it takes
 * from the redis group (backend_redis_check). */
static const struct field master_fields[] = {
	REDIS_FIELD(host, F_STR, 1, 0, .dflt = "none"),
	REDIS_FIELD(port, F_INT, 1, 65535),
	REDIS_FIELD(socket, F_STR, 1, 0),
	REDIS_FIELD(password, F_STR, 1, 0, .dflt = "=redis.password"),
	REDIS_FIELD(username, F_STR, 1, 0, .dflt = "=redis.username"),
	REDIS_FIELD(password_file, F_STR, 1, 0),
	REDIS_FIELD(db, F_INT, 0, INT_MAX, .dflt = "=redis.db"),
	FIELD(struct redis_spec, "tls", tls, F_GROUP, 0, 0, .sub = tls_fields,
	      .check = tls_check, .dflt = "=redis.tls"),
	{ .name = NULL }
};

static const struct field redis_fields[] = {
	REDIS_FIELD(host, F_STR, 1, 0),
	REDIS_FIELD(port, F_INT, 1, 65535),
	REDIS_FIELD(socket, F_STR, 1, 0),
	REDIS_FIELD(password, F_STR, 1, 0),
	REDIS_FIELD(username, F_STR, 1, 0),
	REDIS_FIELD(db, F_INT, 0, INT_MAX),
	REDIS_FIELD(connect_timeout_ms, F_INT, 1, 600000),
	REDIS_FIELD(command_timeout_ms, F_INT, 1, 600000),
	REDIS_FIELD(sentinels, F_STRS, 0, 0),
	REDIS_FIELD(master_name, F_STR, 1, 0),
	REDIS_FIELD(sentinel_username, F_STR, 1, 0),
	REDIS_FIELD(sentinel_password, F_STR, 1, 0),
	REDIS_FIELD(password_file, F_STR, 1, 0),
	REDIS_FIELD(wait_replicas, F_INT, 0, 64),
	REDIS_FIELD(wait_replicas_ms, F_INT, 1, 600000),
	FIELD(struct redis_spec, "tls", tls, F_GROUP, 0, 0, .sub = tls_fields,
	      .check = tls_check, .dflt = "none"),
	REDIS_FIELD(cluster, F_STRS, 0, 0),
	FIELD(struct redis_spec, "masters", masters, F_SERVERS, 0, 0, .sub = master_fields,
	      .off2 = offsetof(struct redis_spec, nmasters)),
	{ .name = NULL }
};

static int backend_redis_check(struct errbuf *e, const config_setting_t *g, const void *member);

static const struct field top_fields[] = {
	FIELD(struct conf, "redis", redis, F_GROUP, 0, 0, .sub = redis_fields,
	      .check = backend_redis_check),
	FIELD(struct conf, "namespace", ns, F_STR, 1, KEY_MAX_NAMESPACE),
	FIELD(struct conf, "log_level", log_level, F_LOGLEVEL, LOG_ERROR, LOG_DEBUG),
	FIELD(struct conf, "log_file", log_file, F_STR, 0, 0),
	FIELD(struct conf, "strict", strict, F_BOOL, 0, 1),
	FIELD(struct conf, "debug_dirs", debug_dirs, F_STRS, 0, 0),
	SECTION("defaults", F_DEFAULTS),
	SECTION("locks", F_LOCKS),
	{ .name = NULL }
};

/* The built-in values of the top level and of redis. */
static int config_defaults(struct conf *cfg)
{
	memset(cfg, 0, sizeof(*cfg));
	cfg->log_level = -1;
	cfg->redis.port = 6379;
	cfg->redis.connect_timeout_ms = 500;
	cfg->redis.command_timeout_ms = 500;
	cfg->redis.wait_replicas_ms = 100;
	cfg->redis.tls.verify = 1;
	if (set_str(&cfg->ns, "lockshim") || set_str(&cfg->redis.host, "127.0.0.1") ||
	    !(cfg->debug_dirs = calloc(2, sizeof(char *))) ||
	    set_str(&cfg->debug_dirs[0], "/usr/lib/debug"))
		return -1;
	return 0;
}

/* The built-in values of a lock; strict is then the top level's. Returns 0,
 * or -1 out of memory. */
static int lock_builtin_defaults(struct lock_spec *l)
{
	memset(l, 0, sizeof(*l));
	l->lease_ms = 30000;
	l->wait_ms = 10000;
	l->on_timeout = POLICY_SKIP;
	l->on_error = -1; /* follows on_timeout */
	l->ret = -1;
	l->ret_double = -1.0;
	l->err = EBUSY;
	l->exit_code = 75;
	l->on_lost = HOLD_LOG;
	l->on_overrun = HOLD_LOG;
	l->kill_signal = SIGTERM;
	l->kill_grace_ms = 5000;
	l->reentrant = 1;
	l->break_dead = 1;
	l->stack_args_bytes = 256;
	l->retry_max_ms = 100;
	l->handoff_us = 500;
	l->linger_ms = 1;
	l->offset = -1;
	return set_str(&l->key_src, "{symbol}");
}

static int apply_group(struct errbuf *e, const config_setting_t *g,
		       const char *where, const struct field *fields, void *base);

/* Reads s as f says and writes it into the struct at base. */
/* Frees what r owns (its strings, and its masters'), not r itself. */
static void release_redis(struct redis_spec *r)
{
	for (int i = 0; i < r->nmasters; i++)
		release_redis(&r->masters[i]);
	free(r->masters);
	free(r->host);
	free(r->socket);
	free(r->password);
	free(r->username);
	free_strs(r->sentinels);
	free_strs(r->cluster);
	free(r->master_name);
	free(r->sentinel_username);
	free(r->sentinel_password);
	free(r->password_file);
	free(r->tls.ca_file);
	free(r->tls.ca_dir);
	free(r->tls.cert_file);
	free(r->tls.key_file);
	free(r->tls.server_name);
}

/* Reads the list s of server groups (fields) into a new array *out of *n
 * specs, port and db left at 0 and -1 when not set (backend_redis_check fills
 * them). The config owns the array (release_redis). Returns 0 or -1. */
static int get_servers(struct errbuf *e, const config_setting_t *s, const char *what,
		       const struct field *fields, struct redis_spec **out, int *n)
{
	int len = config_setting_length(s);

	if (!config_setting_is_list(s))
		return fail(e, s, what, "expected a list of groups ( { ... }, ... ), got %s",
			    type_name(s));
	*out = calloc((size_t)len + 1, sizeof(**out));
	if (!*out)
		return fail(e, s, what, "out of memory");
	for (*n = 0; *n < len; (*n)++) {
		struct redis_spec *m = &(*out)[*n];
		char where[64];

		m->db = -1;
		m->tls.verify = 1;
		snprintf(where, sizeof(where), "%s[%d]", what, *n);
		if (apply_group(e, config_setting_get_elem(s, (unsigned)*n), where, fields, m)) {
			(*n)++;
			return -1;
		}
	}
	return 0;
}

static int apply_field(struct errbuf *e, const struct field *f,
		       const config_setting_t *s, const char *what, void *base)
{
	void *dst = (char *)base + f->off;
	const char *str = NULL;
	long long v = 0;
	double d;
	int iv = 0, t;
	size_t len;

	switch (f->kind) {
	case F_INT:
		if (get_int(e, s, what, f->min, f->max, &v))
			return -1;
		break;
	case F_USEC:
		if (get_ms_as_us(e, s, what, f->min, f->max, &v))
			return -1;
		break;
	case F_BOOL:
		if (config_setting_type(s) != CONFIG_TYPE_BOOL)
			return fail(e, s, what, "expected true or false, got %s",
				    type_name(s));
		v = config_setting_get_bool(s);
		break;
	case F_STR:
		if (get_str(e, s, what, &str))
			return -1;
		len = strlen(str);
		if (f->max && (len < (size_t)f->min || len > (size_t)f->max))
			return fail(e, s, what, "must be %lld..%lld bytes", f->min, f->max);
		if (len < (size_t)f->min)
			return fail(e, s, what, "must not be empty");
		return set_str((char **)dst, str) ? fail(e, s, what, "out of memory") : 0;
	case F_LOGLEVEL:
		if (get_log_level(e, s, what, &iv))
			return -1;
		v = iv;
		break;
	case F_ENUM:
		if (get_enum(e, s, what, f->names, &iv))
			return -1;
		v = iv;
		break;
	case F_ADDR:
		if (get_address(e, s, what, f->max, &v))
			return -1;
		break;
	case F_HEX:
		return get_hex(e, s, what, f->min, f->max, (char **)dst);
	case F_STRS:
		return get_strs(e, s, what, (char ***)dst);
	case F_ERRNO:
		if (get_named_number(e, s, what, errno_by_name, (int)f->max, &iv))
			return -1;
		v = iv;
		break;
	case F_SIGNAL:
		if (get_named_number(e, s, what, signal_by_name, (int)f->max, &iv))
			return -1;
		if (iv == 0)
			return fail(e, s, what, "signal 0 cannot stop a process");
		v = iv;
		break;
	case F_RETURN:
		t = config_setting_type(s);
		if (t == CONFIG_TYPE_FLOAT) {
			d = config_setting_get_float(s);
			v = (long long)d;
		} else {
			if (get_int(e, s, what, LLONG_MIN, LLONG_MAX, &v))
				return -1;
			d = (double)v;
		}
		memcpy((char *)base + f->off2, &d, sizeof(d));
		break;
	case F_GROUP:
		if (apply_group(e, s, what, f->sub, dst))
			return -1;
		return f->check ? f->check(e, s, dst) : 0;
	case F_SERVERS:
		return get_servers(e, s, what, f->sub, (struct redis_spec **)dst,
				   (int *)((char *)base + f->off2));
	case F_DEFAULTS:
	case F_LOCKS:
		return fail(e, s, what, "internal error: read by parse_root");
	}
	if (store_int(dst, f->size, v))
		return fail(e, s, what, "internal error: no writer for a %zu-byte member",
			    f->size);
	return 0;
}

/* Applies every setting of group g, found in fields, to the struct at
 * base. where names g in messages. */
static int apply_group(struct errbuf *e, const config_setting_t *g,
		       const char *where, const struct field *fields, void *base)
{
	int n = config_setting_length(g);

	if (!config_setting_is_group(g))
		return fail(e, g, where, "expected a group { ... }, got %s",
			    type_name(g));
	for (int i = 0; i < n; i++) {
		const config_setting_t *s = config_setting_get_elem(g, (unsigned)i);
		const char *name = config_setting_name(s);
		const struct field *f = field_find(fields, name);
		char what[96];

		snprintf(what, sizeof(what), "%s.%s", where, name);
		if (!f)
			return fail(e, s, what, "unknown setting");
		if (apply_field(e, f, s, what, base))
			return -1;
	}
	return 0;
}

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

static int check_symbol(struct errbuf *e, const config_setting_t *s,
			const char *what, const char *sym)
{
	if (!*sym)
		return fail(e, s, what, "empty symbol name");
	for (const char *p = sym; *p; p++)
		if (!isalnum((unsigned char)*p) && *p != '_' && *p != '.' && *p != '$')
			return fail(e, s, what,
				    "\"%s\" is not a symbol name (letters, digits, _ . $)",
				    sym);
	for (int i = 0; forbidden_symbols[i]; i++)
		if (strcmp(sym, forbidden_symbols[i]) == 0)
			return fail(e, s, what,
				    "\"%s\" cannot be guarded (it returns twice, never "
				    "returns, or belongs to the dynamic linker)", sym);
	for (int i = 0; exec_symbols[i]; i++)
		if (strcmp(sym, exec_symbols[i]) == 0)
			return fail(e, s, what,
				    "\"%s\" cannot be guarded: it replaces the program and does "
				    "not return when it succeeds, so its lock would stay held for "
				    "the whole lease", sym);
	return 0;
}

/* ---- top level ---------------------------------------------------------- */

static int tls_check(struct errbuf *e, const config_setting_t *g, const void *member)
{
	struct redis_tls *t = (struct redis_tls *)member;

	if (!!t->cert_file != !!t->key_file)
		return fail(e, g, "redis.tls", "cert_file and key_file go together");
	t->enabled = 1;
	return 0;
}

/* Reads the first line of r->password_file into r->password. */
static int read_password_file(struct errbuf *e, const config_setting_t *g, struct redis_spec *r)
{
	char line[1024];
	FILE *f = fopen(r->password_file, "re");
	size_t n;

	if (!f)
		return fail(e, g, "redis.password_file", "cannot open \"%s\": %s",
			    r->password_file, strerror(errno));
	if (!fgets(line, sizeof(line), f))
		line[0] = 0;
	fclose(f);
	n = strcspn(line, "\r\n");
	line[n] = 0;
	if (!n)
		return fail(e, g, "redis.password_file", "\"%s\" has no password on its first line",
			    r->password_file);
	return set_str(&r->password, line) ? fail(e, g, "redis.password_file", "out of memory") : 0;
}

/* Checks the "host:port" entries of the list v, the setting what (at
 * least one). Returns 0, or -1 (said). */
static int check_endpoints(struct errbuf *e, const config_setting_t *g, const char *what,
			   char *const *v)
{
	if (!v[0])
		return fail(e, g, what, "is empty");
	for (; *v; v++) {
		const char *colon = strrchr(*v, ':');
		char *end;
		long port;

		if (!colon || colon == *v)
			return fail(e, g, what, "\"%s\" is not host:port", *v);
		port = strtol(colon + 1, &end, 10);
		if (*end || port < 1 || port > 65535)
			return fail(e, g, what, "\"%s\": port out of range (1..65535)", *v);
	}
	return 0;
}

/* Fails when g sets one of the settings (NULL-terminated) besides what,
 * which replaces them. Returns 0, or -1 (said). */
static int check_replaces(struct errbuf *e, const config_setting_t *g, const char *what,
			  const char *const *settings)
{
	for (; *settings; settings++)
		if (config_setting_get_member(g, *settings))
			return fail(e, g, what, "replaces %s: give one of them", *settings);
	return 0;
}

/* Copies what the redis.masters entry m leaves unset from r, the redis
 * group: port, password, username, db, TLS and the timeouts. Returns 0, or
 * -1 (said). */
static int master_inherit(struct errbuf *e, const config_setting_t *g, struct redis_spec *m,
			  int i, const struct redis_spec *r)
{
	const struct redis_tls *t = &r->tls;
	char what[48];

	snprintf(what, sizeof(what), "redis.masters[%d]", i);
	if (!m->host == !m->socket)
		return fail(e, g, what, "give host (and port) or socket");
	if (m->password && m->password_file)
		return fail(e, g, what, "give password or password_file, not both");
	if (m->password_file && read_password_file(e, g, m))
		return -1;
	if (!m->port)
		m->port = 6379;
	if (m->db < 0)
		m->db = r->db;
	if (!m->password && ((r->password && !(m->password = strdup(r->password))) ||
			     (r->username && !(m->username = strdup(r->username)))))
		return fail(e, g, what, "out of memory");
	if (m->username && !m->password)
		return fail(e, g, what, "username needs a password as well");
	if (!m->tls.enabled && t->enabled) {
		m->tls.enabled = 1;
		m->tls.verify = t->verify;
		if ((t->ca_file && !(m->tls.ca_file = strdup(t->ca_file))) ||
		    (t->ca_dir && !(m->tls.ca_dir = strdup(t->ca_dir))) ||
		    (t->cert_file && !(m->tls.cert_file = strdup(t->cert_file))) ||
		    (t->key_file && !(m->tls.key_file = strdup(t->key_file))) ||
		    (t->server_name && !(m->tls.server_name = strdup(t->server_name))))
			return fail(e, g, what, "out of memory");
	}
	if (m->tls.enabled && m->socket)
		return fail(e, g, what, "TLS is for TCP connections, not the unix socket");
	m->connect_timeout_ms = r->connect_timeout_ms;
	m->command_timeout_ms = r->command_timeout_ms;
	m->wait_replicas_ms = r->wait_replicas_ms;
	return 0;
}

/* Checks the topology settings of r: sentinels, cluster or masters, each
 * instead of host, port and socket. Returns 0, or -1 (said). */
static int check_topology(struct errbuf *e, const config_setting_t *g, struct redis_spec *r)
{
	static const char *const single[] = { "host", "port", "socket", NULL };
	static const char *const not_cluster[] = { "host", "port", "socket", "sentinels",
						   "masters", NULL };
	static const char *const not_masters[] = { "host", "port", "socket", "sentinels",
						   "wait_replicas", NULL };

	if (r->sentinels) {
		if (check_endpoints(e, g, "redis.sentinels", r->sentinels))
			return -1;
		if (!r->master_name)
			return fail(e, g, "redis.master_name", "is required with sentinels");
		if (check_replaces(e, g, "redis.sentinels", single))
			return -1;
	} else if (r->master_name || r->sentinel_username || r->sentinel_password) {
		return fail(e, g, "redis.master_name", "master_name and the sentinel_* settings "
			    "need sentinels");
	}
	if (r->cluster) {
		if (check_endpoints(e, g, "redis.cluster", r->cluster) ||
		    check_replaces(e, g, "redis.cluster", not_cluster))
			return -1;
		if (r->db)
			return fail(e, g, "redis.db", "a Redis Cluster has database 0 only");
	}
	if (r->masters) {
		if (r->nmasters < 3)
			return fail(e, g, "redis.masters", "has %d entr%s: Redlock needs 3 or more "
				    "independent masters", r->nmasters, r->nmasters == 1 ? "y" : "ies");
		if (check_replaces(e, g, "redis.masters", not_masters))
			return -1;
		for (int i = 0; i < r->nmasters; i++)
			if (master_inherit(e, g, &r->masters[i], i, r))
				return -1;
	}
	return 0;
}

static int backend_redis_check(struct errbuf *e, const config_setting_t *g, const void *member)
{
	struct redis_spec *r = (struct redis_spec *)member;
	const char *env = getenv("LOCKSHIM_REDIS_PASSWORD");

	if (r->password && r->password_file)
		return fail(e, g, "redis.password_file", "give password or password_file, not both");
	if (r->password_file && read_password_file(e, g, r))
		return -1;
	if (env && *env && set_str(&r->password, env))
		return fail(e, g, "redis", "out of memory");
	if (r->username && !r->password)
		return fail(e, g, "redis.username", "needs redis.password as well");
	if (r->sentinel_username && !r->sentinel_password)
		return fail(e, g, "redis.sentinel_username", "needs redis.sentinel_password as well");
	if (check_topology(e, g, r))
		return -1;
	if (r->tls.enabled && r->socket)
		return fail(e, g, "redis.tls", "TLS is for TCP connections, not the unix socket");
	return 0;
}

static int parse_lock(struct errbuf *e, const config_setting_t *g, int idx,
		      const struct lock_spec *defaults,
		      const config_setting_t *defaults_g, struct conf *cfg)
{
	struct lock_spec *l = &cfg->locks[idx];
	char where[32], what[48], host[256] = "localhost", kerr[256];
	const config_setting_t *ks;

	snprintf(where, sizeof(where), "locks[%d]", idx);
	*l = *defaults;
	l->symbol = NULL;
	l->key_src = strdup(defaults->key_src);
	l->object = defaults->object ? strdup(defaults->object) : NULL;
	l->build_id = defaults->build_id ? strdup(defaults->build_id) : NULL;
	l->index = idx;
	if (!l->key_src || (defaults->object && !l->object) ||
	    (defaults->build_id && !l->build_id))
		return fail(e, g, where, "out of memory");
	if (apply_group(e, g, where, lock_fields, l))
		return -1;
	for (const struct field *f = lock_fields; f->name; f++)
		if ((f->flags & FL_REQUIRED) && !config_setting_get_member(g, f->name))
			return fail(e, g, where, "missing required setting \"%s\"", f->name);
	snprintf(what, sizeof(what), "%s.symbol", where);
	if (check_symbol(e, config_setting_get_member(g, "symbol"), what, l->symbol))
		return -1;
	for (int i = 0; i < idx; i++)
		if (strcmp(cfg->locks[i].symbol, l->symbol) == 0)
			return fail(e, config_setting_get_member(g, "symbol"), what,
				    "symbol \"%s\" is already guarded by locks[%d]",
				    l->symbol, i);
	if (l->offset >= 0 && !l->object)
		return fail(e, g, where, "offset needs object (the file the offset is in)");
	if (l->offset >= 0 && l->method == METHOD_RELOC)
		return fail(e, g, where, "offset needs method \"entry\" or \"auto\": relocations "
			    "are found by name");
	if (l->fair && cfg->redis.masters)
		return fail(e, g, where, "fair = true is not available with redis.masters: "
			    "the masters order their queues alike, but a free key can still go "
			    "to a caller not queued yet, so strict arrival order is not promised");
	if (cfg->redis.cluster && strpbrk(cfg->ns, "{}"))
		return fail(e, g, "namespace", "\"%s\": braces in the namespace would change "
			    "the lock's Redis Cluster hash tag", cfg->ns);
	if (l->on_error < 0)
		l->on_error = l->on_timeout;
	l->stack_args_bytes = (l->stack_args_bytes + 15) & ~15;
	gethostname(host, sizeof(host) - 1);
	if (key_compile(&l->key, cfg->ns, l->key_src, l->symbol, host, cfg->redis.cluster != NULL,
			kerr, sizeof(kerr))) {
		ks = config_setting_get_member(g, "key");
		if (!ks)
			ks = defaults_g ? config_setting_get_member(defaults_g, "key") : g;
		snprintf(where + strlen(where), sizeof(where) - strlen(where), ".key");
		return fail(e, ks, where, "\"%s\": %s", l->key_src, kerr);
	}
	return 0;
}

/* Reads the top level with top_fields; defaults and locks are read after
 * it, so that they see the whole top level (namespace, strict, redis). */
static int parse_root(struct errbuf *e, config_t *cf, struct conf *cfg)
{
	const config_setting_t *root = config_root_setting(cf), *s;
	const config_setting_t *locks = NULL, *defaults_g = NULL;
	struct lock_spec defaults;
	int n = config_setting_length(root), rc = -1;

	if (lock_builtin_defaults(&defaults)) {
		fail(e, NULL, "config", "out of memory");
		goto out;
	}
	for (int i = 0; i < n; i++) {
		const char *name;
		const struct field *f;

		s = config_setting_get_elem(root, (unsigned)i);
		name = config_setting_name(s);
		f = field_find(top_fields, name);
		if (!f) {
			fail(e, s, name, "unknown setting");
			goto out;
		}
		if (f->kind == F_DEFAULTS)
			defaults_g = s;
		else if (f->kind == F_LOCKS)
			locks = s;
		else if (apply_field(e, f, s, name, cfg))
			goto out;
	}
	defaults.strict = cfg->strict;
	if (defaults_g) {
		for (const struct field *f = lock_fields; f->name; f++) {
			char what[64];

			if (!(f->flags & FL_PER_LOCK) ||
			    !(s = config_setting_get_member(defaults_g, f->name)))
				continue;
			snprintf(what, sizeof(what), "defaults.%s", f->name);
			fail(e, s, what, "%s is per lock, not a default", f->name);
			goto out;
		}
		if (apply_group(e, defaults_g, "defaults", lock_fields, &defaults))
			goto out;
	}
	if (!locks) {
		rc = 0;
		goto out;
	}
	if (!config_setting_is_list(locks) && !config_setting_is_array(locks)) {
		fail(e, locks, "locks", "expected a list ( { ... }, ... ), got %s",
		     type_name(locks));
		goto out;
	}
	cfg->nlocks = config_setting_length(locks);
	cfg->locks = calloc((size_t)cfg->nlocks + 1, sizeof(*cfg->locks));
	if (!cfg->locks)
		goto out;
	for (int i = 0; i < cfg->nlocks; i++)
		if (parse_lock(e, config_setting_get_elem(locks, (unsigned)i), i,
			       &defaults, defaults_g, cfg)) {
			cfg->nlocks = i + 1;
			goto out;
		}
	/* Derived fields, once everything they read is valid and final. */
	for (int i = 0; i < cfg->nlocks; i++)
		cfg->locks[i].waiter_ttl_ms = conf_waiter_ttl_ms(&cfg->locks[i], &cfg->redis);
	rc = 0;
out:
	free(defaults.key_src);
	free(defaults.object);
	free(defaults.build_id);
	return rc;
}

int conf_load(struct conf *cfg, const char *path, char *err, size_t errlen)
{
	struct errbuf e = { err, errlen, path };
	config_t cf;
	FILE *f;
	int rc;

	if (config_defaults(cfg) || set_str(&cfg->path, path))
		return fail(&e, NULL, "config", "out of memory");
	f = fopen(path, "re");
	if (!f)
		return fail(&e, NULL, "config", "cannot open: %s", strerror(errno));
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
	return rc;
}

void conf_release(struct conf *cfg)
{
	for (int i = 0; i < cfg->nlocks; i++) {
		free(cfg->locks[i].symbol);
		free(cfg->locks[i].key_src);
		free(cfg->locks[i].object);
		free(cfg->locks[i].build_id);
		key_tmpl_release(&cfg->locks[i].key);
	}
	free(cfg->locks);
	free(cfg->path);
	free(cfg->ns);
	free(cfg->log_file);
	free_strs(cfg->debug_dirs);
	release_redis(&cfg->redis);
	memset(cfg, 0, sizeof(*cfg));
}

int conf_logging(const struct conf *cfg, int apply, char *err, size_t errlen)
{
	const char *env = getenv("LOCKSHIM_LOG_LEVEL");
	int level = cfg->log_level, rc;

	if (env && *env && (level = log_level_parse(env)) < 0) {
		snprintf(err, errlen, "LOCKSHIM_LOG_LEVEL: unknown value \"%s\" (expected one "
			 "of: error, warn, info, debug)", env);
		return -1;
	}
	if (cfg->log_file &&
	    (rc = apply ? log_open_file(cfg->log_file) : log_check_file(cfg->log_file)) < 0) {
		snprintf(err, errlen, "%s: log_file: cannot open \"%s\": %s", cfg->path,
			 cfg->log_file, strerror(-rc));
		return -1;
	}
	if (apply && level >= 0)
		log_threshold = level;
	return 0;
}

/* ---- describing the settings (lockshim settings) ----------------------- */

/* The tables, with the group names `lockshim settings` prints. */
static const struct {
	const char *group;
	const struct field *fields;
} tables[] = {
	{ "top", top_fields },
	{ "redis", redis_fields },
	{ "tls", tls_fields },
	{ "master", master_fields },
	{ "lock", lock_fields },
};

/* Writes s as a libconfig string literal without blanks: quotes,
 * backslashes, blanks and control characters escaped (\xNN). */
static void quote(char *buf, size_t len, const char *s)
{
	size_t n = 0;

	buf[n++] = '"';
	for (; *s && n + 6 < len; s++) {
		unsigned char c = (unsigned char)*s;

		if (c == '"' || c == '\\')
			n += (size_t)snprintf(buf + n, len - n, "\\%c", c);
		else if (c <= ' ' || c >= 0x7f)
			n += (size_t)snprintf(buf + n, len - n, "\\x%02x", c);
		else
			buf[n++] = (char)c;
	}
	snprintf(buf + n, len - n, "\"");
}

/* Writes names as "a,b,c" after prefix. */
static void type_enum(char *buf, size_t len, const char *const *names)
{
	snprintf(buf, len, "enum:");
	for (int i = 0; names[i]; i++)
		snprintf(buf + strlen(buf), len - strlen(buf), "%s%s", i ? "," : "", names[i]);
}

static void describe_type(const struct field *f, char *buf, size_t len)
{
	switch (f->kind) {
	case F_INT: snprintf(buf, len, "integer:%lld..%lld", f->min, f->max); return;
	case F_USEC: snprintf(buf, len, "decimal:%lld..%lld", f->min, f->max); return;
	case F_BOOL: snprintf(buf, len, "boolean"); return;
	case F_STR:
		if (f->max)
			snprintf(buf, len, "string:%lld..%lld", f->min, f->max);
		else if (f->min)
			snprintf(buf, len, "string:%lld..", f->min);
		else
			snprintf(buf, len, "string");
		return;
	case F_LOGLEVEL: type_enum(buf, len, log_levels); return;
	case F_ENUM: type_enum(buf, len, f->names); return;
	case F_ADDR: snprintf(buf, len, "address"); return;
	case F_HEX: snprintf(buf, len, "hex:%lld..%lld", f->min, f->max); return;
	case F_STRS: snprintf(buf, len, "strings"); return;
	case F_ERRNO: snprintf(buf, len, "errno:0..%lld", f->max); return;
	case F_SIGNAL: snprintf(buf, len, "signal:%lld..%lld", f->min, f->max); return;
	case F_RETURN: snprintf(buf, len, "number"); return;
	case F_GROUP:
	case F_DEFAULTS: snprintf(buf, len, "group"); return;
	case F_LOCKS:
	case F_SERVERS: snprintf(buf, len, "list"); return;
	}
	snprintf(buf, len, "?");
}

/* Writes the value of f in the struct at base as a libconfig literal. */
static void describe_value(const struct field *f, const void *base, char *buf, size_t len)
{
	const char *src = (const char *)base + f->off, *name;
	long long v = KIND_IS_INT(f->kind) || f->kind == F_USEC || f->kind == F_RETURN ?
		      load_int(src, f->size) : 0;
	double d;
	char sig[16];

	switch (f->kind) {
	case F_INT:
		snprintf(buf, len, "%lld", v);
		return;
	case F_USEC: /* microseconds, written as milliseconds */
		snprintf(buf, len, "%lld.%03lld", v / 1000, v % 1000);
		while (buf[strlen(buf) - 1] == '0')
			buf[strlen(buf) - 1] = 0;
		if (buf[strlen(buf) - 1] == '.')
			buf[strlen(buf) - 1] = 0;
		return;
	case F_BOOL:
		snprintf(buf, len, "%s", v ? "true" : "false");
		return;
	case F_STR:
	case F_HEX: /* strings, NULL when not set */
		memcpy(&name, src, sizeof(name));
		if (name)
			quote(buf, len, name);
		else
			snprintf(buf, len, "none");
		return;
	case F_ENUM: /* -1: set later from another setting (its entry's .dflt) */
		if (v >= 0)
			quote(buf, len, f->names[v]);
		else
			snprintf(buf, len, "none");
		return;
	case F_ADDR: /* -1: not set */
		if (v >= 0)
			snprintf(buf, len, "%lld", v);
		else
			snprintf(buf, len, "none");
		return;
	case F_STRS: {
		char **v2;
		size_t k;

		memcpy(&v2, src, sizeof(v2));
		if (!v2) {
			snprintf(buf, len, "none");
			return;
		}
		k = (size_t)snprintf(buf, len, "(");
		for (size_t i = 0; v2 && v2[i] && k < len; i++) {
			if (i)
				k += (size_t)snprintf(buf + k, len - k, ",");
			if (k < len)
				quote(buf + k, len - k, v2[i]);
			k = strlen(buf);
		}
		if (k < len)
			snprintf(buf + k, len - k, ")");
		return;
	}
	case F_LOGLEVEL: /* -1: not set, log.c's threshold stands */
		quote(buf, len, log_levels[v >= 0 ? v : log_threshold]);
		return;
	case F_ERRNO:
		name = strerrorname_np((int)v);
		if (name)
			quote(buf, len, name);
		else
			snprintf(buf, len, "%lld", v);
		return;
	case F_SIGNAL:
		name = sigabbrev_np((int)v);
		snprintf(sig, sizeof(sig), "SIG%s", name ? name : "");
		if (name)
			quote(buf, len, sig);
		else
			snprintf(buf, len, "%lld", v);
		return;
	case F_RETURN:
		memcpy(&d, (const char *)base + f->off2, sizeof(d));
		if (d == (double)v)
			snprintf(buf, len, "%lld", v);
		else
			snprintf(buf, len, "%#.17g", d);
		return;
	case F_GROUP:
	case F_DEFAULTS:
		snprintf(buf, len, "{}");
		return;
	case F_LOCKS:
		snprintf(buf, len, "()");
		return;
	case F_SERVERS:
		snprintf(buf, len, "none");
		return;
	}
	snprintf(buf, len, "?");
}

int conf_setting_describe(int i, struct conf_setting_desc *d)
{
	struct conf cfg;
	struct lock_spec lock;
	const struct field *f = NULL;
	const void *base;
	size_t t;

	for (t = 0; i >= 0 && t < sizeof(tables) / sizeof(*tables); t++) {
		int n = 0;

		while (tables[t].fields[n].name)
			n++;
		if (i < n) {
			f = &tables[t].fields[i];
			break;
		}
		i -= n;
	}
	if (!f)
		return 0;
	memset(d, 0, sizeof(*d));
	d->group = tables[t].group;
	d->name = f->name;
	describe_type(f, d->type, sizeof(d->type));
	if (f->flags & FL_REQUIRED) {
		snprintf(d->dflt, sizeof(d->dflt), "required");
		return 1;
	}
	if (f->dflt) {
		snprintf(d->dflt, sizeof(d->dflt), "%s", f->dflt);
		return 1;
	}
	/* The values a file without this setting gets, as conf_load and
	 * parse_root set them up. */
	if (config_defaults(&cfg) | lock_builtin_defaults(&lock)) {
		snprintf(d->dflt, sizeof(d->dflt), "?");
	} else {
		lock.strict = cfg.strict;
		base = tables[t].fields == redis_fields ? (const void *)&cfg.redis :
		       tables[t].fields == tls_fields ? (const void *)&cfg.redis.tls :
		       tables[t].fields == master_fields ? (const void *)&cfg.redis :
		       tables[t].fields == lock_fields ? (const void *)&lock :
		       (const void *)&cfg;
		describe_value(f, base, d->dflt, sizeof(d->dflt));
	}
	free(lock.key_src);
	conf_release(&cfg);
	return 1;
}

long long conf_waiter_ttl_ms(const struct lock_spec *l, const struct redis_spec *r)
{
	return 2 * l->retry_max_ms + r->command_timeout_ms;
}

const struct lock_spec *conf_find(const struct conf *cfg, const char *symbol)
{
	for (int i = 0; i < cfg->nlocks; i++)
		if (strcmp(cfg->locks[i].symbol, symbol) == 0)
			return &cfg->locks[i];
	return NULL;
}
