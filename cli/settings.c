/* SPDX-License-Identifier: MIT */
/*
 * settings.c - the settings, described from the parser's tables (see
 * settings.h): `lockshim settings` lists every setting with its type and
 * default, `lockshim check` the settings of a config that differ from
 * their defaults. Both read the same tables the parser walks (conf.c's
 * and the backends' groups) and write values in one syntax, libconfig
 * literals without blanks; a default comes from its table entry (.def,
 * .def_str, .def_strs, or .dflt when it is another setting's value). Only
 * the CLI links it: the shared object never describes a setting.
 */
#include "settings.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conf_field.h"
#include "log.h"

/* ---- values as libconfig literals --------------------------------------- */

/* Writes s as a libconfig string literal without blanks: quotes,
 * backslashes, blanks and control characters escaped (\xNN). */
static void quote(char *buf, size_t len, const char *s)
{
	size_t n = 0;

	if (len < 2) { /* no room for a quote and the NUL: an empty string */
		if (len)
			buf[0] = 0;
		return;
	}
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

/* Writes d with the fewest digits that read back as d, always with a
 * decimal point or an exponent (a libconfig float). */
static void shortest_double(char *buf, size_t len, double d)
{
	for (int p = 1; p <= 17; p++) {
		snprintf(buf, len, "%.*g", p, d);
		if (strtod(buf, NULL) == d)
			break;
	}
	if (!strpbrk(buf, ".eEn") && strlen(buf) + 2 < len)
		strcat(buf, ".0");
}

/* Writes names as "a,b,c" after prefix. */
static void type_enum(char *buf, size_t len, const char *const *names)
{
	snprintf(buf, len, "enum:");
	for (int i = 0; names[i]; i++)
		snprintf(buf + strlen(buf), len - strlen(buf), "%s%s", i ? "," : "", names[i]);
}

static void describe_type(const struct conf_field *f, char *buf, size_t len)
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
	case F_LOGLEVEL: type_enum(buf, len, f->names); return;
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
static void describe_value(const struct conf_field *f, const void *base, char *buf, size_t len)
{
	const char *src = (const char *)base + f->off, *name;
	long long v = KIND_IS_INT(f->kind) || f->kind == F_USEC || f->kind == F_RETURN ?
		      conf_int_load(src, f->size) : 0;
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
		quote(buf, len, f->names[v >= 0 ? v : log_threshold]);
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
			shortest_double(buf, len, d);
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

/* Writes the value of f in the struct at base as describe_value does, a
 * group that says whether the file has it (FL_PRESENT) as {} or none. */
static void value_of(const struct conf_field *f, const void *base, char *buf, size_t len)
{
	if (f->kind == F_GROUP && (f->flags & FL_PRESENT))
		snprintf(buf, len, "%s", conf_int_load((const char *)base + f->off2, sizeof(int)) ?
			 "{}" : "none");
	else
		describe_value(f, base, buf, len);
}

/* Writes the built-in default of f, from its table entry (not .dflt). */
static void table_default(const struct conf_field *f, char *buf, size_t len)
{
	struct conf_field one[2] = { *f, { .name = NULL } };
	size_t size = f->off + f->size;
	void *scratch;

	if (f->off2 + sizeof(double) > size) /* F_RETURN's double, a count, a flag */
		size = f->off2 + sizeof(double);
	scratch = calloc(1, size);
	if (!scratch || conf_field_default(f, scratch))
		snprintf(buf, len, "?");
	else
		value_of(f, scratch, buf, len);
	if (scratch)
		conf_fields_release(one, scratch);
	free(scratch);
}

/* ---- lockshim settings --------------------------------------------------- */

/* A table and the group name `settings` prints for it. */
struct table {
	const char *group;
	const struct conf_field *fields;
};

#define TABLES_MAX 32

/* Appends the tables inside fields (F_GROUP, F_SERVERS: .sub under
 * .label), each once, after those already in t. */
static void add_subtables(struct table *t, size_t *n, const struct conf_field *fields)
{
	size_t first = *n;

	for (; fields->name; fields++) {
		size_t k = 0;

		if (!fields->sub || !fields->label)
			continue;
		while (k < *n && t[k].fields != fields->sub)
			k++;
		if (k == *n && *n < TABLES_MAX)
			t[(*n)++] = (struct table){ fields->label, fields->sub };
	}
	for (size_t k = first, end = *n; k < end; k++)
		add_subtables(t, n, t[k].fields);
}

int settings_describe(const struct conf_group *const *groups, int i, struct settings_desc *d)
{
	struct table t[TABLES_MAX];
	const struct conf_field *f = NULL;
	size_t n = 0, k;
	int ngroups = 0;

	while (groups && groups[ngroups])
		ngroups++;
	memset(d, 0, sizeof(*d));
	if (i < 0)
		return 0;
	if (i < ngroups) { /* the backends' groups are groups of the top level */
		d->group = "top";
		d->name = groups[i]->name;
		snprintf(d->type, sizeof(d->type), "group");
		snprintf(d->dflt, sizeof(d->dflt), "{}");
		return 1;
	}
	i -= ngroups;
	t[n++] = (struct table){ "top", conf_top_fields };
	for (int g = 0; g < ngroups && n < TABLES_MAX; g++) {
		t[n++] = (struct table){ groups[g]->name, groups[g]->fields };
		add_subtables(t, &n, groups[g]->fields);
	}
	if (n < TABLES_MAX)
		t[n++] = (struct table){ "lock", conf_lock_fields };
	for (k = 0; i >= 0 && k < n; k++) {
		int m = 0;

		while (t[k].fields[m].name)
			m++;
		if (i < m) {
			f = &t[k].fields[i];
			break;
		}
		i -= m;
	}
	if (!f)
		return 0;
	d->group = t[k].group;
	d->name = f->name;
	describe_type(f, d->type, sizeof(d->type));
	if (f->flags & FL_REQUIRED)
		snprintf(d->dflt, sizeof(d->dflt), "required");
	else if (f->dflt)
		snprintf(d->dflt, sizeof(d->dflt), "%s", f->dflt);
	else
		table_default(f, d->dflt, sizeof(d->dflt));
	return 1;
}

/* ---- lockshim check ------------------------------------------------------ */

struct diff {
	char *buf;
	size_t len;
	const struct conf *cfg;
	const struct lock_spec *lock; /* =lock.NAME defaults are its settings */
};

/* Finds the setting a default "=GROUP.NAME" names: its entry in *f, the
 * struct holding it returned; NULL when there is none. */
static const void *resolve(const struct diff *d, const char *ref, const struct conf_field **f)
{
	const char *dot = strchr(ref, '.');
	const struct conf_field *fields = NULL;
	const void *base = NULL;
	size_t glen;

	if (ref[0] != '=' || !dot)
		return NULL;
	ref++;
	glen = (size_t)(dot - ref);
	if (glen == 3 && !strncmp(ref, "top", 3)) {
		fields = conf_top_fields;
		base = d->cfg;
	} else if (glen == 4 && !strncmp(ref, "lock", 4)) {
		fields = conf_lock_fields;
		base = d->lock;
	} else {
		for (int i = 0; d->cfg->groups[i]; i++)
			if (strlen(d->cfg->groups[i]->name) == glen &&
			    !strncmp(d->cfg->groups[i]->name, ref, glen)) {
				fields = d->cfg->groups[i]->fields;
				base = d->cfg->group_data[i];
			}
	}
	if (!base || !(*f = conf_field_find(fields, dot + 1)))
		return NULL;
	return base;
}

/* Writes the default of f as value_of writes values: the value of the
 * setting .dflt names, .dflt itself, or the table's. */
static void default_of(const struct diff *d, const struct conf_field *f, char *buf, size_t len)
{
	const struct conf_field *rf;
	const void *base;

	if (f->dflt && (base = resolve(d, f->dflt, &rf)))
		value_of(rf, base, buf, len);
	else if (f->dflt)
		snprintf(buf, len, "%s", f->dflt);
	else
		table_default(f, buf, len);
}

/* Appends "name value" to d's list. */
static void add(struct diff *d, const char *name, const char *value)
{
	size_t n = strlen(d->buf);

	snprintf(d->buf + n, d->len - n, "%s%s %s", n ? ", " : "", name, value);
}

/*
 * Appends the settings of fields in the struct at base that differ from
 * their defaults, each named prefix + its name. dflt_base: the struct
 * holding the defaults (a group whose default is another group), or NULL
 * for each entry's own default.
 */
static void diff_fields(struct diff *d, const char *prefix, const struct conf_field *fields,
			const void *base, const void *dflt_base)
{
	for (const struct conf_field *f = fields; f->name; f++) {
		char name[128], sub[160], cur[1024], def[1024];
		const struct conf_field *rf;
		const char *v;
		int n;

		snprintf(name, sizeof(name), "%s%s", prefix, f->name);
		switch (f->kind) {
		case F_DEFAULTS:
		case F_LOCKS:
			continue;
		case F_SERVERS:
			n = (int)conf_int_load((const char *)base + f->off2, sizeof(int));
			memcpy(&v, (const char *)base + f->off, sizeof(v));
			for (int i = 0; v && i < n; i++) {
				snprintf(sub, sizeof(sub), "%s[%d].", name, i);
				diff_fields(d, sub, f->sub, v + (size_t)i * f->elem, NULL);
			}
			continue;
		default:
			break;
		}
		if (d->lock && ((f->flags & FL_REQUIRED) || !strcmp(f->name, "key") ||
				!strcmp(f->name, "keys")))
			continue; /* symbol and key(s): the lock's line says them */
		value_of(f, base, cur, sizeof(cur));
		if (dflt_base)
			value_of(f, dflt_base, def, sizeof(def));
		else
			default_of(d, f, def, sizeof(def));
		if (strcmp(cur, def))
			add(d, name, f->flags & FL_SECRET ? "(hidden)" : cur);
		if (f->kind != F_GROUP || !strcmp(cur, "none"))
			continue;
		snprintf(sub, sizeof(sub), "%s.", name);
		v = f->dflt ? resolve(d, f->dflt, &rf) : NULL; /* a group's default group */
		diff_fields(d, sub, f->sub, (const char *)base + f->off,
			    v ? v + rf->off : dflt_base ? (const char *)dflt_base + f->off : NULL);
	}
}

void settings_diff(const struct conf *cfg, const struct lock_spec *l, char *buf, size_t len)
{
	struct diff d = { buf, len, cfg, l };

	buf[0] = 0;
	if (l) {
		diff_fields(&d, "", conf_lock_fields, l, NULL);
		return;
	}
	for (int i = 0; cfg->groups[i]; i++) {
		char prefix[64];

		snprintf(prefix, sizeof(prefix), "%s.", cfg->groups[i]->name);
		diff_fields(&d, prefix, cfg->groups[i]->fields, cfg->group_data[i], NULL);
	}
	diff_fields(&d, "", conf_top_fields, cfg, NULL);
}
