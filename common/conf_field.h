/* SPDX-License-Identifier: MIT */
/*
 * conf_field.h - the machinery of the setting tables, for the files that
 * define or walk one: conf.c (top level, locks), a backend's settings
 * (backend_redis_conf.c) and the CLI's description (cli/settings.c). Not
 * for the shim's hooks, which only read the frozen struct conf.
 *
 * DESIGN: a table of struct conf_field describes a group of the file. An
 * entry names a setting, how its value is read (kind), the member written
 * (offset and size, taken by FIELD), its range and its default. So one
 * entry is enough to read, range-check, default, copy, release and
 * describe a setting: nothing strdup's or frees a member by hand. A
 * backend's settings are a struct conf_group (a top-level group and its
 * table) that the caller gives conf_load, so common/ names no backend.
 */
#ifndef LOCKSHIM_CONF_FIELD_H
#define LOCKSHIM_CONF_FIELD_H

#include <libconfig.h>
#include <limits.h>
#include <stddef.h>
#include <stdint.h>

struct conf;      /* conf.h */
struct lock_spec; /* conf.h */

/* Where a parse error is written: "<file>:<line>: <setting>: <problem>". */
struct conf_err {
	char *buf;
	size_t len;
	const char *file;
	int untrusted; /* set with the error when a file failed conf_open_trusted */
};

enum conf_kind {
	F_INT,      /* integer in min..max */
	F_USEC,     /* milliseconds, whole or decimal, in min..max; stored as us */
	F_BOOL,     /* true or false, stored as 0 or 1 */
	F_STR,      /* string of min..max bytes (max 0: no limit), strdup'd */
	F_ERRNO,    /* errno name or number in 0..max */
	F_SIGNAL,   /* signal name (with or without SIG) or number in 1..max */
	F_RETURN,   /* integer or float: a long long and a double (off2) */
	F_LOGLEVEL, /* log level name (.names), any case */
	F_ENUM,     /* one of the names in .names, stored as its index */
	F_ADDR,     /* integer or "0x..." string in 0..max */
	F_HEX,      /* hex string of min..max bytes, strdup'd in lowercase */
	F_STRS,     /* list of non-empty strings, a NULL-terminated char ** */
	F_GROUP,    /* a group read with the table sub into the member */
	F_SERVERS,  /* a list of groups read with sub, each into an element of
		     * .elem bytes: the array (member) and its length (the int at off2) */
	F_DEFAULTS, /* the group of per-lock defaults (conf.c's parse_root) */
	F_LOCKS,    /* the list of locks (conf.c's parse_root) */
};

struct conf_field {
	const char *name;
	enum conf_kind kind;
	size_t off, size;   /* the member written */
	long long min, max; /* values written (integer kinds), bytes (F_STR, F_HEX) */
	size_t off2;        /* F_RETURN: the double member; F_SERVERS: the count;
			     * F_GROUP with FL_PRESENT: the int set to 1 when read */
	size_t elem;        /* F_SERVERS: the size of an element */
	const struct conf_field *sub; /* F_GROUP, F_SERVERS: its settings */
	const char *label;  /* F_GROUP, F_SERVERS: the group `lockshim settings`
			     * lists sub under ("tls", "master") */
	const char *const *names; /* F_ENUM, F_LOGLEVEL: the values, NULL-terminated */
	/* F_GROUP: checks (and completes) the member once the group is read */
	int (*check)(struct conf_err *e, const config_setting_t *g, void *member);
	unsigned flags;
	/* The default, which a struct gets before its group is read: .def for
	 * the integer kinds, F_USEC (in microseconds) and F_RETURN (both
	 * members); .def_str for F_STR and F_HEX; .def_strs (NULL-terminated)
	 * for F_STRS. Zero, NULL: none. */
	long long def;
	const char *def_str;
	const char *const *def_strs;
	/* The default as `lockshim settings` prints it when .def is only the
	 * parser's "not set" mark: another setting's value ("=GROUP.NAME",
	 * filled in when the group is checked), or "none" for a group whose
	 * absence is the default. NULL: the default is .def/.def_str/.def_strs. */
	const char *dflt;
};

#define FL_REQUIRED 1u  /* a lock must set it */
#define FL_PER_LOCK 2u  /* not allowed in `defaults` */
#define FL_PRESENT  4u  /* F_GROUP: the int at off2 says the file has the group */
#define FL_SECRET   8u  /* `lockshim check` does not print the value */

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
	 (k) == F_SERVERS ? (sz) == sizeof(void *) :                            \
	 (k) == F_GROUP)

/* 0, or a compile error saying why when cond is false. */
#define BUILD_CHECK(cond, why) (0 * sizeof(struct { _Static_assert(cond, why); int x; }))

#define MEMBER_SIZE(type, member) sizeof(((type *)0)->member)

/* An entry of a table of settings written into a struct type; optional
 * designated initializers follow (.def, .def_str, .flags, .sub, .check,
 * .dflt, ...). FIELD refuses at build time a member whose size the writer
 * does not handle or that cannot hold every value of the range. */
#define FIELD(type, setting, member, k, lo, hi, ...)                           \
	{ .name = setting, .kind = k, .off = offsetof(type, member),           \
	  .size = MEMBER_SIZE(type, member) +                                  \
		  BUILD_CHECK(FIELD_OK(k, MEMBER_SIZE(type, member), lo, hi),  \
			      "setting " setting ": the writer of its kind "   \
			      "cannot store its range in a member of this size"), \
	  .min = lo, .max = hi, __VA_ARGS__ }

/* An integer-or-float setting written to a long long and a double. */
#define RETURN_FIELD(type, setting, member, member2, ...)                      \
	{ .name = setting, .kind = F_RETURN, .off = offsetof(type, member),    \
	  .size = MEMBER_SIZE(type, member) +                                  \
		  BUILD_CHECK(MEMBER_SIZE(type, member) == sizeof(long long) && \
			      MEMBER_SIZE(type, member2) == sizeof(double),     \
			      "setting " setting ": needs a long long and a double"), \
	  .min = LLONG_MIN, .max = LLONG_MAX, .off2 = offsetof(type, member2), \
	  __VA_ARGS__ }

/* A top-level section that conf.c's parse_root reads itself. */
#define SECTION(setting, k) { .name = setting, .kind = k }

/*
 * The settings of one backend: a top-level group of the file (`redis`),
 * read with fields into a struct of size bytes that the config owns
 * (conf_group_data). Registered in backend/backend.c's table; conf_load
 * gets the list from its caller. Its name is also the value of the
 * top-level `backend` that selects it: only the selected backend's group
 * may be in the file, and only its check_lock, check_defaults,
 * lock_defaults, hash_tag and request_ms apply. Every function is optional.
 */
/* A per-lock setting a backend refuses, and why (struct conf_group). */
struct conf_refusal {
	const char *setting, *why;
};

struct conf_group {
	const char *name;
	const struct conf_field *fields;
	size_t size;
	/* Checks and completes the settings once the file's group is read
	 * (not called when the file has no such group). Returns 0, or -1 said
	 * with conf_fail. */
	int (*check)(struct conf_err *e, const config_setting_t *g, void *data);
	/* Refuses a lock (read from the group lg, named where) that this
	 * backend cannot honour. Returns 0, or -1 said with conf_fail. */
	int (*check_lock)(struct conf_err *e, const config_setting_t *lg, const char *where,
			  const struct lock_spec *l, const struct conf *cfg, const void *data);
	/* Refuses a setting of the file's `defaults` group (dg, read into d,
	 * named "defaults") that this backend cannot honour, as check_lock
	 * does a lock's. Returns 0, or -1 said with conf_fail. */
	int (*check_defaults)(struct conf_err *e, const config_setting_t *dg, const char *where,
			      const struct lock_spec *d, const struct conf *cfg, const void *data);
	/* The per-lock settings this backend refuses in every lock and in
	 * `defaults` (before check_lock), naming the backend and the setting:
	 * unavailable, those refused when set at all; unbuilt, those refused
	 * when asked for by value (fair, limit > 1, mode "shared", linger_ms >
	 * 0, max_hold_ms > 0; why then says what was asked). Each ends with
	 * { NULL }; the first match in table order is said. NULL: none. */
	const struct conf_refusal *unavailable, *unbuilt;
	/* Changes the built-in per-lock values where this backend's differ
	 * (before `defaults` and the locks are read). */
	void (*lock_defaults)(struct lock_spec *d);
	/* Returns 1 when the lock keys must carry a hash tag (Redis Cluster). */
	int (*hash_tag)(const void *data);
	/* Returns how long one request to the server may take, in ms (a lock's
	 * waiter_ttl_ms, conf_waiter_ttl_ms). */
	long long (*request_ms)(const void *data);
};

/* The tables of conf.c, for cli/settings.c. */
extern const struct conf_field conf_top_fields[];
extern const struct conf_field conf_lock_fields[];

/* Writes "<file>:<line>: <what>: <fmt...>" (no line when s is NULL or has
 * none) into e. Returns -1, so that callers can `return conf_fail(...)`. */
int conf_fail(struct conf_err *e, const config_setting_t *s, const char *what,
	      const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/*
 * Reads the first line of the file path (a backend's password_file) into
 * *password (malloc'd, what it held freed; the config owns it); in
 * secure-execution mode only from a file conf_open_trusted accepts (else
 * e->untrusted is set with the error). Errors name the setting what at s.
 * Returns 0, or -1 said with conf_fail. Defined in conf.c.
 */
int conf_read_password_file(struct conf_err *e, const config_setting_t *s, const char *what,
			    const char *path, char **password);

/* A backend's lock_defaults when a lock is not kept between calls unless
 * the file says linger_ms (the built-in 1 ms, Redis's, becomes 0): a kept
 * lock needs the renewal thread, and it keeps other processes out. */
void conf_no_linger(struct lock_spec *d);

/* Returns "a group", "an integer", ... for s's type, for messages. */
const char *conf_type_name(const config_setting_t *s);

/* Replaces the malloc'd string *dst by a copy of v. Returns 0, or -1 out of
 * memory (*dst unchanged). */
int conf_str_set(char **dst, const char *v);

/* Returns the entry of fields named name, or NULL. */
const struct conf_field *conf_field_find(const struct conf_field *fields, const char *name);

/* Returns the size-byte integer at src. */
long long conf_int_load(const void *src, size_t size);

/*
 * Gives each setting of fields its default in the struct at base, whose
 * members of fields must own nothing (zeroed). Returns 0, or -1 out of
 * memory (what was set is released by conf_fields_release).
 */
int conf_fields_default(const struct conf_field *fields, void *base);
int conf_field_default(const struct conf_field *f, void *base);

/*
 * Copies each setting of fields from the struct at src to the one at dst:
 * integers by value, strings and lists duplicated (what dst owned is freed
 * first), groups and lists of groups through their tables. A member of a
 * group or of a list's element that no entry names is copied by value, so
 * it must own nothing (a flag such as tls.enabled). Returns 0, or -1 out
 * of memory (dst stays releasable by conf_fields_release).
 */
int conf_fields_copy(const struct conf_field *fields, void *dst, const void *src);
int conf_field_copy(const struct conf_field *f, void *dst, const void *src);

/* Frees what the settings of fields own in the struct at base (strings,
 * lists, groups, lists of groups) and sets those members to NULL; base
 * itself is the caller's. */
void conf_fields_release(const struct conf_field *fields, void *base);

/* Applies every setting of group g, found in fields, to the struct at base
 * (which has its defaults). where names g in messages ("redis",
 * "locks[2]"). Returns 0, or -1 said in e (unknown setting, wrong type or
 * range, a failed check). */
int conf_group_apply(struct conf_err *e, const config_setting_t *g, const char *where,
		     const struct conf_field *fields, void *base);

/* Reads s, the setting what, as f says into the struct at base. Returns 0,
 * or -1 said in e. */
int conf_field_apply(struct conf_err *e, const struct conf_field *f,
		     const config_setting_t *s, const char *what, void *base);

#endif
