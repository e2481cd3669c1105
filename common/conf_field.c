/* SPDX-License-Identifier: MIT */
/*
 * conf_field.c - the value readers and the table machinery of the settings
 * (see conf_field.h): how one libconfig value is read and range-checked,
 * and the walks of a table that apply a group of the file, give a struct
 * its defaults, copy it and release it. It knows no setting by name: the
 * tables are conf.c's (top level, locks) and the backends' (redis).
 */
#include "conf_field.h"

#include <ctype.h>
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

int conf_fail(struct conf_err *e, const config_setting_t *s, const char *what,
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

/* ---- value readers ---------------------------------------------------- */

const char *conf_type_name(const config_setting_t *s)
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

static int get_int(struct conf_err *e, const config_setting_t *s, const char *what,
		   long long min, long long max, long long *out)
{
	int t = config_setting_type(s);
	long long v = 0;

	if (t != CONFIG_TYPE_INT && t != CONFIG_TYPE_INT64)
		return conf_fail(e, s, what, "expected an integer, got %s", conf_type_name(s));
	v = config_setting_get_int64(s);
	if (v < min || v > max)
		return conf_fail(e, s, what, "value %lld out of range (%lld..%lld)", v,
			    min, max);
	*out = v;
	return 0;
}

/* Accepts milliseconds as an integer or a decimal (0.5) in min..max ms;
 * stores microseconds. */
static int get_ms_as_us(struct conf_err *e, const config_setting_t *s, const char *what,
			long long min, long long max, long long *out_us)
{
	int t = config_setting_type(s);
	double v;

	if (t != CONFIG_TYPE_FLOAT && t != CONFIG_TYPE_INT && t != CONFIG_TYPE_INT64)
		return conf_fail(e, s, what, "expected a number, got %s", conf_type_name(s));
	if (t != CONFIG_TYPE_FLOAT) {
		if (get_int(e, s, what, min, max, out_us))
			return -1;
		*out_us *= 1000;
		return 0;
	}
	v = config_setting_get_float(s);
	if (!(v >= (double)min && v <= (double)max))
		return conf_fail(e, s, what, "value %g out of range (%lld..%lld)", v, min, max);
	*out_us = (long long)(v * 1000 + 0.5);
	return 0;
}

static int get_str(struct conf_err *e, const config_setting_t *s, const char *what,
		   const char **out)
{
	if (config_setting_type(s) != CONFIG_TYPE_STRING)
		return conf_fail(e, s, what, "expected a string, got %s", conf_type_name(s));
	*out = config_setting_get_string(s);
	return 0;
}

int conf_str_set(char **dst, const char *v)
{
	char *p = strdup(v);

	if (!p)
		return -1;
	free(*dst);
	*dst = p;
	return 0;
}

/* Writes "a, b, c" (names, NULL-terminated) into buf. */
static void join_names(char *buf, size_t len, const char *const *names)
{
	buf[0] = 0;
	for (int i = 0; names[i]; i++)
		snprintf(buf + strlen(buf), len - strlen(buf), "%s%s", i ? ", " : "", names[i]);
}

static int get_enum(struct conf_err *e, const config_setting_t *s, const char *what,
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
	return conf_fail(e, s, what, "unknown value \"%s\" (expected one of: %s)", v,
		    expected);
}

/* Reads a level name of log.h's enum log_level (names: for the message);
 * log.c parses it (log_level_parse, any case). */
static int get_log_level(struct conf_err *e, const config_setting_t *s, const char *what,
			 const char *const *names, int *out)
{
	const char *v = NULL;
	char expected[128];

	if (get_str(e, s, what, &v))
		return -1;
	*out = log_level_parse(v);
	if (*out >= 0)
		return 0;
	join_names(expected, sizeof(expected), names);
	return conf_fail(e, s, what, "unknown value \"%s\" (expected one of: %s)", v,
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
static int get_address(struct conf_err *e, const config_setting_t *s, const char *what,
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
		return conf_fail(e, s, what, "\"%s\" is not an address (an integer or \"0x...\")", v);
	if (u > (unsigned long long)max)
		return conf_fail(e, s, what, "value %s out of range (0..%lld)", v, max);
	*out = (long long)u;
	return 0;
}

/* Accepts a string of hex digits encoding min..max bytes; *out gets a
 * malloc'd lowercase copy. */
static int get_hex(struct conf_err *e, const config_setting_t *s, const char *what,
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
			return conf_fail(e, s, what, "\"%s\" is not hex (digits 0-9 a-f)", v);
	if (len % 2 || len / 2 < (size_t)min || len / 2 > (size_t)max)
		return conf_fail(e, s, what, "\"%s\" must be %lld..%lld bytes in hex (an even "
			    "number of digits)", v, min, max);
	if (!(p = strdup(v)))
		return conf_fail(e, s, what, "out of memory");
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
static int get_strs(struct conf_err *e, const config_setting_t *s, const char *what,
		    char ***out)
{
	int n = config_setting_length(s);
	char **v;

	if (!config_setting_is_list(s) && !config_setting_is_array(s))
		return conf_fail(e, s, what, "expected a list ( \"...\", ... ), got %s", conf_type_name(s));
	if (!(v = calloc((size_t)n + 1, sizeof(*v))))
		return conf_fail(e, s, what, "out of memory");
	for (int i = 0; i < n; i++) {
		const config_setting_t *x = config_setting_get_elem(s, (unsigned)i);
		const char *str = NULL;

		if (get_str(e, x, what, &str) || (!*str && conf_fail(e, x, what, "must not be empty")) ||
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
static int get_named_number(struct conf_err *e, const config_setting_t *s,
			    const char *what, int (*lookup)(const char *), int max,
			    int *out)
{
	long long v = 0;
	const char *name;

	if (config_setting_type(s) == CONFIG_TYPE_STRING) {
		name = config_setting_get_string(s);
		*out = lookup(name);
		if (*out < 0)
			return conf_fail(e, s, what, "unknown name \"%s\"", name);
		return 0;
	}
	if (get_int(e, s, what, 0, max, &v))
		return -1;
	*out = (int)v;
	return 0;
}

/* ---- the table machinery ----------------------------------------------- */

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

long long conf_int_load(const void *src, size_t size)
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

const struct conf_field *conf_field_find(const struct conf_field *fields, const char *name)
{
	for (; fields->name; fields++)
		if (strcmp(fields->name, name) == 0)
			return fields;
	return NULL;
}

/* Returns a malloc'd copy of the NULL-terminated list v (free_strs), or
 * NULL out of memory. */
static char **strs_dup(const char *const *v)
{
	size_t n = 0;
	char **out;

	while (v[n])
		n++;
	if (!(out = calloc(n + 1, sizeof(*out))))
		return NULL;
	for (size_t i = 0; i < n; i++) {
		if (!(out[i] = strdup(v[i]))) {
			free_strs(out);
			return NULL;
		}
	}
	return out;
}

/* The member of f in the struct at base, and the int at f->off2. */
#define MEMBER(f, base) ((char *)(base) + (f)->off)
#define MEMBER2(f, base) ((char *)(base) + (f)->off2)

int conf_field_default(const struct conf_field *f, void *base)
{
	char *dst = MEMBER(f, base);
	double d = (double)f->def;

	switch (f->kind) {
	case F_STR:
	case F_HEX:
		return f->def_str ? conf_str_set((char **)dst, f->def_str) : 0;
	case F_STRS:
		if (!f->def_strs)
			return 0;
		return (*(char ***)dst = strs_dup(f->def_strs)) ? 0 : -1;
	case F_GROUP:
		return conf_fields_default(f->sub, dst);
	case F_SERVERS:
	case F_DEFAULTS:
	case F_LOCKS:
		return 0;
	case F_RETURN:
		memcpy(MEMBER2(f, base), &d, sizeof(d));
		break;
	default: /* the integer kinds, F_USEC */
		break;
	}
	return store_int(dst, f->size, f->def);
}

int conf_fields_default(const struct conf_field *fields, void *base)
{
	for (; fields->name; fields++)
		if (conf_field_default(fields, base))
			return -1;
	return 0;
}

/* Sets the members of fields that own memory in the struct at base to
 * NULL (and lists of groups to 0 entries) without freeing them: base is a
 * byte copy of a struct that still owns them. */
static void fields_disown(const struct conf_field *fields, void *base)
{
	for (; fields->name; fields++) {
		char *m = MEMBER(fields, base);

		switch (fields->kind) {
		case F_STR:
		case F_HEX:
		case F_STRS:
		case F_SERVERS:
			memset(m, 0, fields->size);
			if (fields->kind == F_SERVERS)
				store_int(MEMBER2(fields, base), sizeof(int), 0);
			break;
		case F_GROUP:
			fields_disown(fields->sub, m);
			break;
		default:
			break;
		}
	}
}

/* Frees the list of groups of f in the struct at base. */
static void servers_release(const struct conf_field *f, void *base)
{
	char *v;
	int n = (int)conf_int_load(MEMBER2(f, base), sizeof(int));

	memcpy(&v, MEMBER(f, base), sizeof(v));
	for (int i = 0; v && i < n; i++)
		conf_fields_release(f->sub, v + (size_t)i * f->elem);
	free(v);
	memset(MEMBER(f, base), 0, f->size);
	store_int(MEMBER2(f, base), sizeof(int), 0);
}

/* Copies the list of groups of f from src to dst (whose own is freed). */
static int servers_copy(const struct conf_field *f, void *dst, const void *src)
{
	const char *sv;
	char *dv;
	int n = (int)conf_int_load(MEMBER2(f, src), sizeof(int));

	servers_release(f, dst);
	memcpy(&sv, MEMBER(f, src), sizeof(sv));
	if (!sv)
		return 0;
	if (!(dv = calloc((size_t)n + 1, f->elem)))
		return -1;
	memcpy(MEMBER(f, dst), &dv, sizeof(dv));
	store_int(MEMBER2(f, dst), sizeof(int), n);
	for (int i = 0; i < n; i++) {
		char *d = dv + (size_t)i * f->elem;

		memcpy(d, sv + (size_t)i * f->elem, f->elem);
		fields_disown(f->sub, d);
		if (conf_fields_copy(f->sub, d, sv + (size_t)i * f->elem))
			return -1;
	}
	return 0;
}

int conf_field_copy(const struct conf_field *f, void *dst, const void *src)
{
	const char *s = (const char *)src + f->off;
	char *d = MEMBER(f, dst);
	const char *str;
	char **strs, **copy;

	switch (f->kind) {
	case F_STR:
	case F_HEX:
		memcpy(&str, s, sizeof(str));
		if (str)
			return conf_str_set((char **)d, str);
		free(*(char **)d);
		*(char **)d = NULL;
		return 0;
	case F_STRS:
		memcpy(&strs, s, sizeof(strs));
		copy = strs ? strs_dup((const char *const *)strs) : NULL;
		if (strs && !copy)
			return -1;
		free_strs(*(char ***)d);
		*(char ***)d = copy;
		return 0;
	case F_GROUP:
		/* the whole member (what no entry names, such as a flag, too),
		 * then what its entries own */
		conf_fields_release(f->sub, d);
		memcpy(d, s, f->size);
		fields_disown(f->sub, d);
		if (f->flags & FL_PRESENT)
			memcpy(MEMBER2(f, dst), (const char *)src + f->off2, sizeof(int));
		return conf_fields_copy(f->sub, d, s);
	case F_SERVERS:
		return servers_copy(f, dst, src);
	case F_DEFAULTS:
	case F_LOCKS:
		return 0;
	case F_RETURN:
		memcpy(MEMBER2(f, dst), (const char *)src + f->off2, sizeof(double));
		break;
	default:
		break;
	}
	memcpy(d, s, f->size);
	return 0;
}

int conf_fields_copy(const struct conf_field *fields, void *dst, const void *src)
{
	for (; fields->name; fields++)
		if (conf_field_copy(fields, dst, src))
			return -1;
	return 0;
}

void conf_fields_release(const struct conf_field *fields, void *base)
{
	for (; fields->name; fields++) {
		char *m = MEMBER(fields, base);

		switch (fields->kind) {
		case F_STR:
		case F_HEX:
			free(*(char **)m);
			*(char **)m = NULL;
			break;
		case F_STRS:
			free_strs(*(char ***)m);
			*(char ***)m = NULL;
			break;
		case F_GROUP:
			conf_fields_release(fields->sub, m);
			break;
		case F_SERVERS:
			servers_release(fields, base);
			break;
		default:
			break;
		}
	}
}

/* Reads the list s of groups (f->sub) into a new array of f->elem-byte
 * elements, each with its defaults first; the array is the member of f
 * and its length the int at f->off2, so the struct owns it from the start
 * (conf_fields_release). Returns 0 or -1. */
static int get_servers(struct conf_err *e, const config_setting_t *s, const char *what,
		       const struct conf_field *f, void *base)
{
	int len = config_setting_length(s);
	char *v;

	if (!config_setting_is_list(s))
		return conf_fail(e, s, what, "expected a list of groups ( { ... }, ... ), got %s",
				 conf_type_name(s));
	servers_release(f, base);
	if (!(v = calloc((size_t)len + 1, f->elem)))
		return conf_fail(e, s, what, "out of memory");
	memcpy(MEMBER(f, base), &v, sizeof(v));
	for (int n = 0; n < len; n++) {
		char where[64];

		store_int(MEMBER2(f, base), sizeof(int), n + 1);
		snprintf(where, sizeof(where), "%s[%d]", what, n);
		if (conf_fields_default(f->sub, v + (size_t)n * f->elem))
			return conf_fail(e, s, what, "out of memory");
		if (conf_group_apply(e, config_setting_get_elem(s, (unsigned)n), where, f->sub,
				     v + (size_t)n * f->elem))
			return -1;
	}
	return 0;
}

int conf_field_apply(struct conf_err *e, const struct conf_field *f,
		     const config_setting_t *s, const char *what, void *base)
{
	void *dst = MEMBER(f, base);
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
			return conf_fail(e, s, what, "expected true or false, got %s",
					 conf_type_name(s));
		v = config_setting_get_bool(s);
		break;
	case F_STR:
		if (get_str(e, s, what, &str))
			return -1;
		len = strlen(str);
		if (f->max && (len < (size_t)f->min || len > (size_t)f->max))
			return conf_fail(e, s, what, "must be %lld..%lld bytes", f->min, f->max);
		if (len < (size_t)f->min)
			return conf_fail(e, s, what, "must not be empty");
		return conf_str_set((char **)dst, str) ? conf_fail(e, s, what, "out of memory") : 0;
	case F_LOGLEVEL:
		if (get_log_level(e, s, what, f->names, &iv))
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
			return conf_fail(e, s, what, "signal 0 cannot stop a process");
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
		memcpy(MEMBER2(f, base), &d, sizeof(d));
		break;
	case F_GROUP:
		if (conf_group_apply(e, s, what, f->sub, dst))
			return -1;
		if (f->flags & FL_PRESENT)
			store_int(MEMBER2(f, base), sizeof(int), 1);
		return f->check ? f->check(e, s, dst) : 0;
	case F_SERVERS:
		return get_servers(e, s, what, f, base);
	case F_DEFAULTS:
	case F_LOCKS:
		return conf_fail(e, s, what, "internal error: read by parse_root");
	}
	if (store_int(dst, f->size, v))
		return conf_fail(e, s, what, "internal error: no writer for a %zu-byte member",
				 f->size);
	return 0;
}

int conf_group_apply(struct conf_err *e, const config_setting_t *g, const char *where,
		     const struct conf_field *fields, void *base)
{
	int n = config_setting_length(g);

	if (!config_setting_is_group(g))
		return conf_fail(e, g, where, "expected a group { ... }, got %s",
				 conf_type_name(g));
	for (int i = 0; i < n; i++) {
		const config_setting_t *s = config_setting_get_elem(g, (unsigned)i);
		const char *name = config_setting_name(s);
		const struct conf_field *f = conf_field_find(fields, name);
		char what[96];

		snprintf(what, sizeof(what), "%s.%s", where, name);
		if (!f)
			return conf_fail(e, s, what, "unknown setting");
		if (conf_field_apply(e, f, s, what, base))
			return -1;
	}
	return 0;
}
