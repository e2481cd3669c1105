/* SPDX-License-Identifier: MIT */
/*
 * key.c - compiling and expanding lock key templates (see key.h).
 *
 * Expansion streams every byte of the expanded key through a sink that keeps
 * the first KEY_MAX_EXPANDED bytes and hashes all of them (two FNV-1a 64-bit
 * lanes with different offsets, mixed at the end). Long keys become
 * "<first 224 bytes>#<32 hex digits>", 257 bytes, one more than any key
 * kept verbatim. For a Redis Cluster (tagged) the expansion goes inside
 * braces, "<namespace>:{<key>}", so that the lock's queue keys, which append
 * to it, share its slot; a key that is empty or starts with '}' (which would
 * make the hash tag empty) gets a leading '~'. A value (an argument,
 * {env:NAME}, {host}) is percent-encoded (put_val) so that no value makes a
 * key another lock's queue key (<key>:q, :qx, :due, :w:<token>), its fencing
 * counter (<key>:f) or another
 * value's key; the template's own text is checked once (check_text).
 */
#include "key.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

#define HASH_HEX 32
#define LONG_KEEP (KEY_MAX_EXPANDED - HASH_HEX) /* 257 bytes with '#' and the hash */

struct sink {
	char *buf;
	size_t len;   /* bytes seen */
	uint64_t h1, h2;
	unsigned word; /* the text since the last ':', as word_next says */
};

/*
 * The text since the last ':' as a prefix of a word the layout appends
 * after one (q, qx, due, w, f): 0 none (or no ':' yet), 1 empty, 2 "q",
 * 3 "qx", 4 "d", 5 "du", 6 "due", 7 "w", 8 "f". Returns the state after
 * byte c.
 */
static unsigned word_next(unsigned w, unsigned char c)
{
	static const char step[] = "\1q\2\2x\3\1d\4\4u\5\5e\6\1w\7\1f\10";

	if (c == ':')
		return 1;
	for (const char *t = step; w && *t; t += 3)
		if ((unsigned)t[0] == w && (unsigned char)t[1] == c)
			return (unsigned)t[2];
	return 0;
}

/* Returns whether a value's byte c is always percent-encoded. */
static int key_reserved(unsigned char c)
{
	return c == '%' || c == ':' || c == '{' || c == '}';
}

static void sink_put(struct sink *s, const char *p, size_t n)
{
	/* in locals: the stores into buf could alias s's members */
	uint64_t h1 = s->h1, h2 = s->h2;
	size_t len = s->len;
	unsigned w = s->word;

	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)p[i];

		w = c == ':' || w ? word_next(w, c) : 0;
		if (len < KEY_MAX_EXPANDED)
			s->buf[len] = (char)c;
		len++;
		h1 = (h1 ^ c) * 0x100000001b3ULL;
		h2 = (h2 ^ c) * 0x100000001b3ULL;
		h2 ^= h2 >> 29;
	}
	s->h1 = h1;
	s->h2 = h2;
	s->len = len;
	s->word = w;
}

static size_t sink_finish(struct sink *s)
{
	static const char hex[] = "0123456789abcdef";
	uint64_t a, b;

	if (s->len <= KEY_MAX_EXPANDED)
		return s->len;
	/* out has room: KEY_BUF_SIZE counts the 257th byte, a '~' and a '}' */
	a = util_mix64(s->h1 ^ s->len);
	b = util_mix64(s->h2 + a);
	s->buf[LONG_KEEP] = '#';
	for (int i = 0; i < 16; i++) {
		s->buf[LONG_KEEP + 1 + i] = hex[(a >> (60 - 4 * i)) & 15];
		s->buf[LONG_KEEP + 17 + i] = hex[(b >> (60 - 4 * i)) & 15];
	}
	return KEY_MAX_EXPANDED + 1;
}

/*
 * Puts a value of n bytes, writing a byte as "%XX" when it is '%', ':', '{'
 * or '}', a '~' that would begin the key, or the first byte of a value after
 * which the text since the last ':' is still a prefix of q, qx, due, w or f.
 * So a value never brings a ':' or a brace (a cluster's hash tag is the whole
 * key), never ends a key in ":q", ":qx", ":due" or ":f" nor puts ":w:" in it, and
 * two values never give the same bytes.
 */
static void put_val(struct sink *s, const char *p, size_t n)
{
	static const char hex[] = "0123456789ABCDEF";
	unsigned w = s->word;
	size_t from = 0;

	for (size_t i = 0; i < n && w > 0; i++)
		w = key_reserved((unsigned char)p[i]) ? 0 : word_next(w, (unsigned char)p[i]);
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)p[i];

		if (key_reserved(c) || (i == 0 && (w > 0 || (c == '~' && s->len == 0)))) {
			char e[3] = { '%', hex[c >> 4], hex[c & 15] };

			sink_put(s, p + from, i - from); /* the bytes kept before it */
			sink_put(s, e, 3);
			from = i + 1;
		}
	}
	sink_put(s, p + from, n - from);
}

static void put_arg(struct sink *s, uint64_t v, int fmt)
{
	char num[24];
	int n;

	switch (fmt) {
	case KEY_FMT_STR: {
		const char *p = (const char *)(uintptr_t)v;

		if (!p) /* no string has a NUL byte: "%00" is no string's key */
			sink_put(s, "%00", 3);
		else
			put_val(s, p, strnlen(p, KEY_STR_SCAN_MAX));
		return;
	}
	case KEY_FMT_UNSIGNED:
		n = snprintf(num, sizeof(num), "%llu", (unsigned long long)v);
		break;
	case KEY_FMT_HEX:
		n = snprintf(num, sizeof(num), "%llx", (unsigned long long)v);
		break;
	default:
		n = snprintf(num, sizeof(num), "%lld", (long long)v);
		break;
	}
	put_val(s, num, (size_t)n); /* hex can spell "d" */
}

size_t key_expand(const struct key_tmpl *t, const uint64_t args[ARCH_INT_ARGS], int pid,
		  char *out)
{
	struct sink s = { out + t->prefix_len, 0, 0xcbf29ce484222325ULL,
			  0x84222325cbf29ce4ULL, 0 };
	char num[16];
	size_t n;

	memcpy(out, t->prefix, t->prefix_len);
	for (int i = 0; i < t->nsegs; i++) {
		const struct key_seg *g = &t->segs[i];

		if (g->kind == KEY_SEG_LIT)
			sink_put(&s, g->lit, g->len);
		else if (g->kind == KEY_SEG_VAL)
			put_val(&s, g->lit, g->len);
		else if (g->kind == KEY_SEG_PID)
			sink_put(&s, num, (size_t)snprintf(num, sizeof(num), "%d", pid));
		else
			put_arg(&s, args[g->arg], g->fmt);
	}
	n = sink_finish(&s);
	if (!t->tagged)
		return t->prefix_len + n;
	/* "<ns>:{<key>}": Redis hashes what lies between the first '{' and the
	 * first '}' after it, when that is not empty. */
	if (n == 0 || s.buf[0] == '}') {
		memmove(s.buf + 1, s.buf, n++);
		s.buf[0] = '~';
	}
	s.buf[n++] = '}';
	return t->prefix_len + n;
}

/* Appends a segment; literal text is copied. Returns 0 or -1 (no memory). */
static int add_seg(struct key_tmpl *t, int kind, int arg, int fmt,
		   const char *lit, size_t len)
{
	struct key_seg *segs, *g;

	if ((kind == KEY_SEG_LIT || kind == KEY_SEG_VAL) && len == 0)
		return 0;
	if (kind == KEY_SEG_LIT && t->nsegs > 0 &&
	    t->segs[t->nsegs - 1].kind == KEY_SEG_LIT) {
		g = &t->segs[t->nsegs - 1];
		char *p = realloc(g->lit, g->len + len + 1);

		if (!p)
			return -1;
		memcpy(p + g->len, lit, len);
		g->len += len;
		p[g->len] = 0;
		g->lit = p;
		return 0;
	}
	segs = realloc(t->segs, sizeof(*segs) * (size_t)(t->nsegs + 1));
	if (!segs)
		return -1;
	t->segs = segs;
	g = &segs[t->nsegs++];
	memset(g, 0, sizeof(*g));
	g->kind = (unsigned char)kind;
	g->arg = (unsigned char)arg;
	g->fmt = (unsigned char)fmt;
	if (kind == KEY_SEG_LIT || kind == KEY_SEG_VAL) {
		g->lit = strndup(lit, len);
		g->len = len;
		if (!g->lit)
			return -1;
	}
	return 0;
}

/* Parses one placeholder body (between braces) into a segment. */
static int add_placeholder(struct key_tmpl *t, const char *name, size_t n,
			   const char *symbol, const char *host, char *err,
			   size_t errlen)
{
	static const char *const fmts[] = { "", ":u", ":x", ":str" };

	if (n == 6 && memcmp(name, "symbol", 6) == 0)
		return add_seg(t, KEY_SEG_LIT, 0, 0, symbol, strlen(symbol));
	if (n == 4 && memcmp(name, "host", 4) == 0)
		return add_seg(t, KEY_SEG_VAL, 0, 0, host, strlen(host));
	if (n == 3 && memcmp(name, "pid", 3) == 0)
		return add_seg(t, KEY_SEG_PID, 0, 0, NULL, 0);
	if (n > 4 && memcmp(name, "env:", 4) == 0) {
		char var[128];
		const char *v;

		if (n - 4 >= sizeof(var))
			goto bad;
		memcpy(var, name + 4, n - 4);
		var[n - 4] = 0;
		v = getenv(var);
		return add_seg(t, KEY_SEG_VAL, 0, 0, v ? v : "", v ? strlen(v) : 0);
	}
	if (n >= 4 && memcmp(name, "arg", 3) == 0) {
		size_t d = 3;
		unsigned idx = 0;

		for (; d < n && name[d] >= '0' && name[d] <= '9'; d++)
			idx = idx < 1000 ? idx * 10 + (unsigned)(name[d] - '0') : idx;
		if (d == 3)
			goto bad;
		/* a leading zero ({arg05}) is refused like a number too big */
		if (idx >= ARCH_INT_ARGS || (d > 4 && name[3] == '0')) {
			snprintf(err, errlen,
				 "placeholder {%.*s}: argument index out of range (0..%d)",
				 (int)n, name, ARCH_INT_ARGS - 1);
			return -1;
		}
		for (int f = 0; f < 4; f++)
			if (n - d == strlen(fmts[f]) &&
			    memcmp(name + d, fmts[f], n - d) == 0)
				return add_seg(t, KEY_SEG_ARG, (int)idx, f, NULL, 0);
	}
bad:
	snprintf(err, errlen,
		 "unknown placeholder {%.*s} (expected {symbol}, {argN}, {argN:u}, "
		 "{argN:x}, {argN:str}, {pid}, {host} or {env:NAME})",
		 (int)n, name);
	return -1;
}

/*
 * The template's own text (its literal segments, values left out, as when
 * they are empty) must not end in ":q", ":qx", ":due" or ":f" nor contain
 * ":w:": such a key would be another lock's queue key or fencing counter.
 * Returns 0, or -1 with a message in err.
 */
static int check_text(const struct key_tmpl *t, char *err, size_t errlen)
{
	static const char *const end[] = { [2] = ":q", [3] = ":qx", [6] = ":due", [8] = ":f" };
	unsigned w = 0;

	for (int i = 0; i < t->nsegs; i++)
		for (size_t j = 0; t->segs[i].kind == KEY_SEG_LIT && j < t->segs[i].len; j++) {
			if (w == 7 && t->segs[i].lit[j] == ':') {
				snprintf(err, errlen, "the key's text contains \":w:\", which the "
					 "shim uses for a waiter's list (<key>:w:<token>)");
				return -1;
			}
			w = word_next(w, (unsigned char)t->segs[i].lit[j]);
		}
	if (w < sizeof(end) / sizeof(end[0]) && end[w]) {
		snprintf(err, errlen, "the key's text ends in \"%s\", which the shim appends "
			 "to a lock's key for its queue or fencing counter (<key>:q, :qx, "
			 ":due, :f)", end[w]);
		return -1;
	}
	return 0;
}

int key_compile(struct key_tmpl *t, const char *ns, const char *src,
		const char *symbol, const char *host, int tagged, char *err, size_t errlen)
{
	const char *p = src;

	memset(t, 0, sizeof(*t));
	t->tagged = tagged;
	t->prefix_len = strlen(ns) + (tagged ? 2 : 1);
	t->prefix = malloc(t->prefix_len + 1);
	if (!t->prefix)
		goto nomem;
	snprintf(t->prefix, t->prefix_len + 1, "%s:%s", ns, tagged ? "{" : "");
	while (*p) {
		size_t lit = strcspn(p, "{}");
		const char *close;

		if (add_seg(t, KEY_SEG_LIT, 0, 0, p, lit))
			goto nomem;
		p += lit;
		if (!*p)
			break;
		if (p[0] == p[1] || p[0] == '}') { /* "{{", "}}": a brace; a lone '}' too */
			if (add_seg(t, KEY_SEG_LIT, 0, 0, p, 1))
				goto nomem;
			p += p[0] == p[1] ? 2 : 1;
			continue;
		}
		close = strchr(p, '}');
		if (!close) {
			snprintf(err, errlen, "unterminated placeholder \"%s\" (write {{ for a "
				 "literal brace)", p);
			goto fail;
		}
		if (add_placeholder(t, p + 1, (size_t)(close - p - 1), symbol,
				    host, err, errlen))
			goto fail;
		p = close + 1;
	}
	if (t->nsegs == 0) {
		snprintf(err, errlen, "key expands to an empty string");
		goto fail;
	}
	if (check_text(t, err, errlen))
		goto fail;
	return 0;
nomem:
	snprintf(err, errlen, "out of memory");
fail:
	key_tmpl_release(t);
	return -1;
}

void key_tmpl_release(struct key_tmpl *t)
{
	for (int i = 0; i < t->nsegs; i++)
		free(t->segs[i].lit);
	free(t->segs);
	free(t->prefix);
	memset(t, 0, sizeof(*t));
}
