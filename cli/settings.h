/* SPDX-License-Identifier: MIT */
/*
 * settings.h - the settings described from the parser's tables, for the
 * CLI: `lockshim settings` (every setting, its type and its default) and
 * `lockshim check` (the settings of a loaded config that differ from their
 * defaults). The shared object does not carry it.
 */
#ifndef LOCKSHIM_SETTINGS_H
#define LOCKSHIM_SETTINGS_H

#include <stddef.h>

#include "conf.h"

/*
 * One setting the parser knows, described from the same tables it parses
 * with (`lockshim settings` prints one per line, "group name type default").
 *   group: "top" (top level), a backend's group ("redis"), a group inside
 *          one ("tls": redis.tls and a master's tls; "master": an entry
 *          of redis.masters) or "lock" (an entry of locks, and of
 *          defaults except symbol)
 *   type:  integer:MIN..MAX, decimal:MIN..MAX (whole or decimal), boolean,
 *          string, string:MIN.. or string:MIN..MAX (length in bytes),
 *          enum:A,B,C, errno:0..MAX and signal:MIN..MAX (a name or a
 *          number), number (integer or float), address (an integer or a
 *          "0x..." string, 0 or more), hex:MIN..MAX (a string of hex
 *          digits, length in bytes decoded), strings (a list of strings),
 *          group, list
 *   dflt:  a libconfig literal (30000, 0.5, true, "skip", {}, ()), none
 *          (not set), required, or =GROUP.NAME (that setting's value);
 *          never contains a blank.
 */
struct settings_desc {
	const char *group;
	const char *name;
	char type[96];
	char dflt[96];
};

/*
 * Describes the i-th setting (0, 1, ...) into d: the top level (the
 * groups of groups, NULL-terminated, then conf.c's), each group of groups
 * followed by the groups inside it, then the locks; each in table order.
 * Returns 1, or 0 when i is past the last.
 */
int settings_describe(const struct conf_group *const *groups, int i, struct settings_desc *d);

/*
 * Writes into buf (len bytes, always terminated) the settings of cfg that
 * differ from their defaults, as "name value, name value" with values
 * written as `settings` writes defaults (a secret as (hidden)):
 *   l NULL: the top level, then each backend group's (as redis.port,
 *           redis.tls.ca_file, redis.masters[0].host);
 *   l a lock of cfg: that lock's settings but symbol and key.
 * The default of a setting whose default is another's (=GROUP.NAME) is
 * that setting's value in cfg (l's own for =lock.NAME). Writes "" when
 * nothing differs.
 */
void settings_diff(const struct conf *cfg, const struct lock_spec *l, char *buf, size_t len);

#endif
