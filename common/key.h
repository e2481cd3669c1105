/* SPDX-License-Identifier: MIT */
/*
 * key.h - lock key templates: compiled once from the config, expanded per call.
 *
 * A template is a list of segments: literals (with {symbol} substituted at
 * load time), values read at load time ({host}, {env:NAME}) and run-time
 * placeholders ({argN} in four formats, {pid}); values and arguments are
 * percent-encoded where the key layout needs it (key.c). Expansion writes
 * into a caller buffer and never allocates; an expanded key over
 * KEY_MAX_EXPANDED bytes keeps a prefix and a 128-bit hash of the whole
 * text, one byte longer than any key kept verbatim, so distinct values stay
 * distinct.
 */
#ifndef LOCKSHIM_KEY_H
#define LOCKSHIM_KEY_H

#include <stddef.h>
#include <stdint.h>

#include "arch.h" /* ARCH_INT_ARGS */

#define KEY_MAX_EXPANDED 256
#define KEY_MAX_NAMESPACE 128
/* ":{", a long key's form (KEY_MAX_EXPANDED + 1 bytes), "~}" */
#define KEY_BUF_SIZE (KEY_MAX_NAMESPACE + 2 + KEY_MAX_EXPANDED + 3)
#define KEY_STR_SCAN_MAX 65536 /* bytes read from an {argN:str} argument */

enum key_seg_kind { KEY_SEG_LIT, KEY_SEG_ARG, KEY_SEG_PID, KEY_SEG_VAL };
enum key_arg_fmt { KEY_FMT_DEC, KEY_FMT_UNSIGNED, KEY_FMT_HEX, KEY_FMT_STR };

struct key_seg {
	unsigned char kind;
	unsigned char arg; /* KEY_SEG_ARG: argument index 0..ARCH_INT_ARGS-1 */
	unsigned char fmt; /* KEY_SEG_ARG: enum key_arg_fmt */
	size_t len;        /* KEY_SEG_LIT, KEY_SEG_VAL */
	char *lit;         /* KEY_SEG_LIT, KEY_SEG_VAL, owned by the template */
};

struct key_tmpl {
	char *prefix; /* "<namespace>:", or "<namespace>:{" when tagged; owned */
	size_t prefix_len;
	int tagged;   /* Redis Cluster: the key goes inside a hash tag */
	struct key_seg *segs; /* owned */
	int nsegs;
};

/*
 * Compiles src. symbol and host fill {symbol} and {host}; {env:NAME} is read
 * now; "{{" and "}}" are literal braces. tagged: keys expand to
 * "<namespace>:{<key>}" (Redis Cluster). Returns 0, or -1 with a message in
 * err. Release with key_tmpl_release.
 */
int key_compile(struct key_tmpl *t, const char *ns, const char *src,
		const char *symbol, const char *host, int tagged, char *err, size_t errlen);

void key_tmpl_release(struct key_tmpl *t);

/*
 * Expands t for one call: args are the ARCH_INT_ARGS integer argument
 * registers, pid the current process id. Writes "<namespace>:<key>" (or
 * "<namespace>:{<key>}", tagged) into
 * out, a buffer of KEY_BUF_SIZE bytes (no NUL is written). Returns the
 * length.
 */
size_t key_expand(const struct key_tmpl *t, const uint64_t args[ARCH_INT_ARGS], int pid,
		  char *out);

#endif
