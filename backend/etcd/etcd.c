/* SPDX-License-Identifier: MIT */
/*
 * etcd.c - the etcd backend, a module (liblockshim-etcd.so) speaking etcd
 * 3.4's v3 JSON gateway through libcurl (a kept-alive handle per thread;
 * replies parsed by json-c as they stream in). A lock is concurrency.Mutex:
 * the key <prefix><key>/<mode><lease hex> (key escaped: % and /; mode "r"
 * shared, "p<limit>." a permit: recipes/rwmutex, a semaphore) put with a
 * lease derived from key and value; the lowest create revisions hold, a
 * waiter watches what keeps it out, release revokes the lease, renewal is
 * a LeaseKeepAlive. A host's counts: the key <prefix>%metrics/<escaped
 * "<ns>:metrics:{<host>}">, no lease (no lock key starts "%m", % being
 * escaped), valued "<flen>:<field>=<value>\n" per field in byte order,
 * rewritten by a txn comparing its mod_revision. etcd_holders lists the
 * locks for status. One export (etcd.map).
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <time.h>

#include <curl/curl.h>
#include <json-c/json.h>

#include "backend.h"
#include "backend_etcd_conf.h"
#include "backend_module.h"
#include "util.h"

#define ETCD_WAIT_MAX_MS 3600000 /* one watch at most (then asked again) */
#define ETCD_KEY_MAX (1024 + 3 * KEY_BUF_SIZE + 32) /* prefix, escaped key, /p<limit>.<lease> */
#define ETCD_B64(n) (((n) + 2) / 3 * 4 + 1)
#define ETCD_BODY_MAX (10 * ETCD_B64(ETCD_KEY_MAX) + ETCD_B64(BACKEND_VAL_MAX) + 1024)
#define ETCD_RESP_MAX 16384         /* a reply's bytes at most ... */
#define ETCD_KV_MAX (ETCD_B64(ETCD_KEY_MAX) + 256) /* ... and of count_before's, per key */
#define ETCD_EVENT_MAX (1 << 20)    /* one message of a watch at most */
#define ETCD_METRICS "%metrics/"    /* under the prefix: the hosts' counts (etcd_count) */

struct backend_config {
	const struct etcd_spec *spec;
	int nendpoints;
	struct curl_slist **connect_to; /* with tls.server_name: per endpoint,
					 * "NAME:PORT:HOST:PORT" (the URL names
					 * NAME, the socket goes to HOST) */
};

struct backend_conn {
	const struct backend_config *bc;
	CURL *curl;
	struct curl_slist *headers;  /* with the token's Authorization once authenticated */
	unsigned long tgen;      /* ... that token's generation (token.gen when taken) */
	char base[320];          /* "http(s)://host:port" of the endpoint reached */
	int ep;                  /* ... its index in the endpoints */
	int resent;              /* the last command was sent again after a
				  * failure that may have been applied */
	long long last_lease;    /* the lease of the last refused acquire ... */
	long long last_rev;      /* ... and its key's create revision (for wait) */
	int watching;            /* the write callback looks for a DELETE event
				  * (2: for any event) */
	int woken;               /* ... and saw one (or the watch's end) */
	size_t counting;         /* count_before's keys at most (a longer reply) */
	json_tokener *tok;       /* parses the reply as it streams in */
	json_object *doc;        /* the last reply (a watch: its error), freed by
				  * the next request */
	size_t fed, cap;         /* the bytes of the reply (a watch: of its
				  * message) so far, and at most */
	int cut;                 /* the last reply was longer than cap */
	int bad;                 /* ... was not one JSON object */
	char *mkey;              /* the count key c shipped to last (etcd_count) ... */
	size_t mklen;
	char *mval;              /* ... its value as c last saw it (malloc'd) ... */
	size_t mlen;
	long long mrev;          /* ... at this mod revision (0: absent) */
	char body[ETCD_BODY_MAX];
	char err[CURL_ERROR_SIZE + 192];
	char curl_err[CURL_ERROR_SIZE]; /* libcurl's detail of a failure (the
					 * certificate's problem, ...) */
};

/* One lock's names in etcd: its key, the range of its key's holders. */
struct etcd_names {
	long long lease;
	char key[ETCD_B64(ETCD_KEY_MAX)];   /* <prefix><escaped key>/<lease hex> */
	char from[ETCD_B64(ETCD_KEY_MAX)];  /* <prefix><escaped key>/ */
	char to[ETCD_B64(ETCD_KEY_MAX)];    /* ... with its last byte + 1 */
	char wto[ETCD_B64(ETCD_KEY_MAX)];   /* <prefix><escaped key>/r: [from, wto)
					     * holds the writers (every key not
					     * shared) */
};

/* What a holder's key says of its lock (the part after its last /):
 * "r<hex>" shared, "p<limit>.<hex>" a permit, "<hex>" exclusive (limit 1). */
struct etcd_mode {
	int limit;
	int shared;
};

static const struct backend_module_host *host;
static atomic_int endpoint_good; /* the endpoint that answered last: tried first */
static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_rc;

/*
 * The process's token (etcd.username's), shared by the connections of one
 * config (owner; another config's connections authenticate alone): a
 * simple token is valid on every member and connection, and each
 * authentication costs etcd a bcrypt (about 54 ms). mu guards every field
 * and is held only to copy them, never across a request; the connection
 * that authenticates for all sets busy, the others wait on cv. A fork child
 * keeps the token (token_atfork_*: mu is held across fork, so it is whole).
 */
static struct {
	pthread_mutex_t mu;
	pthread_cond_t cv;                  /* busy went back to 0 */
	const struct backend_config *owner; /* the config it is shared by */
	char *tok;                          /* malloc'd, or NULL */
	size_t len;
	unsigned long gen;                  /* 0: none yet; + 1 per authentication */
	int busy;                           /* a connection authenticates for all */
} token = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, NULL, NULL, 0, 0, 0 };

static void etcd_bind(const struct backend_module_host *h)
{
	host = h;
}

static void token_atfork_prepare(void)
{
	pthread_mutex_lock(&token.mu);
}

static void token_atfork_parent(void)
{
	pthread_mutex_unlock(&token.mu);
}

/* Fork child: the token kept (whole: mu was held); no authentication is
 * under way here (its thread is the parent's), so waiters would wait for
 * nothing: busy 0, mu and cv new. */
static void token_atfork_child(void)
{
	token.busy = 0;
	pthread_mutex_init(&token.mu, NULL);
	pthread_cond_init(&token.cv, NULL);
}

static void curl_global(void)
{
	curl_init_rc = curl_global_init(CURL_GLOBAL_NOTHING);
	if (curl_init_rc == CURLE_OK &&
	    pthread_atfork(token_atfork_prepare, token_atfork_parent, token_atfork_child))
		curl_init_rc = CURLE_FAILED_INIT;
}

/* ---- encoding ----------------------------------------------------------- */

/* Writes base64 of s[0..n) into out (ETCD_B64(n) bytes), NUL-terminated. */
static void b64_encode(const unsigned char *s, size_t n, char *out)
{
	static const char t[] =
		"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
	size_t i = 0;

	for (; i + 2 < n; i += 3) {
		*out++ = t[s[i] >> 2];
		*out++ = t[((s[i] & 3) << 4) | (s[i + 1] >> 4)];
		*out++ = t[((s[i + 1] & 15) << 2) | (s[i + 2] >> 6)];
		*out++ = t[s[i + 2] & 63];
	}
	if (i < n) {
		*out++ = t[s[i] >> 2];
		if (i + 1 < n) {
			*out++ = t[((s[i] & 3) << 4) | (s[i + 1] >> 4)];
			*out++ = t[(s[i + 1] & 15) << 2];
		} else {
			*out++ = t[(s[i] & 3) << 4];
			*out++ = '=';
		}
		*out++ = '=';
	}
	*out = 0;
}

static int b64_value(char ch)
{
	if (ch >= 'A' && ch <= 'Z')
		return ch - 'A';
	if (ch >= 'a' && ch <= 'z')
		return ch - 'a' + 26;
	if (ch >= '0' && ch <= '9')
		return ch - '0' + 52;
	return ch == '+' ? 62 : ch == '/' ? 63 : -1;
}

/* Decodes base64 s[0..n) into out (at most cap bytes). Returns the length
 * written (a longer value is cut at cap). */
static size_t b64_decode(const char *s, size_t n, char *out, size_t cap)
{
	unsigned acc = 0;
	int bits = 0;
	size_t k = 0;

	for (size_t i = 0; i < n; i++) {
		int v = b64_value(s[i]);

		if (v < 0)
			break;
		acc = (acc << 6) | (unsigned)v;
		bits += 6;
		if (bits >= 8) {
			bits -= 8;
			if (k < cap)
				out[k++] = (char)((acc >> bits) & 0xff);
		}
	}
	return k;
}

/* Returns the lease ID of lock it: FNV-1a of key and value, positive and
 * nonzero (the value holds a random token: two holders never share it). */
static long long lease_id(const struct backend_item *it)
{
	uint64_t h = util_fnv1a64(UTIL_FNV1A64_START, it->key, it->klen);

	h = util_fnv1a64(util_fnv1a64(h, "\xff", 1), it->val, it->vlen);
	h &= 0x7fffffffffffffffULL;
	return h ? (long long)h : 1;
}

/* Writes key[0..klen) escaped (% and / as %25 and %2F: no escaped key
 * holds a / or a % but "%2") at out (3 * klen bytes). Returns its length. */
static size_t key_escape(const char *key, size_t klen, unsigned char *out)
{
	static const char hex[] = "0123456789ABCDEF";
	size_t len = 0;

	for (size_t i = 0; i < klen; i++) {
		unsigned char ch = (unsigned char)key[i];

		if (ch == '/' || ch == '%') {
			out[len++] = '%';
			out[len++] = (unsigned char)hex[ch >> 4];
			out[len++] = (unsigned char)hex[ch & 15];
		} else {
			out[len++] = ch;
		}
	}
	return len;
}

/* Fills n with it's names (base64), under prefix: its key's last part
 * says its mode (struct etcd_mode). Returns 0, or -1 when too long. */
static int names_make(const struct backend_config *bc, const struct backend_item *it,
		      struct etcd_names *n)
{
	unsigned char k[ETCD_KEY_MAX];
	size_t plen = strlen(bc->spec->prefix), len = 0, head;

	if (plen + 3 * it->klen + 32 > sizeof(k))
		return -1;
	memcpy(k, bc->spec->prefix, plen);
	len = plen + key_escape(it->key, it->klen, k + plen);
	k[len++] = '/';
	head = len;
	b64_encode(k, head, n->from);
	k[head - 1] = '/' + 1;
	b64_encode(k, head, n->to);
	k[head - 1] = '/';
	k[head] = 'r';
	b64_encode(k, head + 1, n->wto);
	n->lease = lease_id(it);
	if (it->shared)
		len += (size_t)snprintf((char *)k + head, sizeof(k) - head, "r%llx", n->lease);
	else if (it->limit > 1)
		len += (size_t)snprintf((char *)k + head, sizeof(k) - head, "p%d.%llx", it->limit,
					n->lease);
	else
		len += (size_t)snprintf((char *)k + head, sizeof(k) - head, "%llx", n->lease);
	b64_encode(k, len, n->key);
	return 0;
}

/* Returns the mode of a holder's key k[0..n) (decoded): its part after
 * the last / (struct etcd_mode). */
static struct etcd_mode mode_of(const char *k, size_t n)
{
	const char *slash = memrchr(k, '/', n);
	struct etcd_mode m = { 1, 0 };

	if (slash && (size_t)(slash + 1 - k) < n) {
		const char *d = slash + 2, *end = k + n;

		if (slash[1] == 'r')
			m.shared = 1;
		if (slash[1] == 'p')
			for (m.limit = 0; d < end && *d >= '0' && *d <= '9' && m.limit < 100000; d++)
				m.limit = m.limit * 10 + (*d - '0');
	}
	if (m.limit < 1)
		m.limit = 1;
	return m;
}

/* ---- JSON replies (json-c; anything unexpected is the request's error) --- */

/* Returns obj's member name when it is of type t, else NULL (absent, of
 * another type, or obj not an object). */
static json_object *reply_member(json_object *obj, const char *name, json_type t)
{
	json_object *m;

	if (!json_object_is_type(obj, json_type_object) ||
	    !json_object_object_get_ex(obj, name, &m) || !json_object_is_type(m, t))
		return NULL;
	return m;
}

/* Reads obj's integer member name (the gateway writes int64 fields as
 * decimal strings, others as numbers) into *v: dflt when absent (proto3
 * JSON leaves out zeros). Returns 0, or -1 when it is of another type,
 * not a whole decimal or out of int64's range. */
static int reply_int(json_object *obj, const char *name, long long dflt, long long *v)
{
	json_object *m;
	const char *s;
	char *end;

	*v = dflt;
	if (!json_object_is_type(obj, json_type_object))
		return -1;
	if (!json_object_object_get_ex(obj, name, &m))
		return 0;
	if (json_object_is_type(m, json_type_int)) {
		errno = 0;
		*v = json_object_get_int64(m);
		return errno || *v == INT64_MAX ? -1 : 0; /* (a uint64 beyond int64 saturates) */
	}
	if (!json_object_is_type(m, json_type_string))
		return -1;
	s = json_object_get_string(m);
	errno = 0;
	*v = strtoll(s, &end, 10);
	if (errno || end == s || *end || (size_t)(end - s) != (size_t)json_object_get_string_len(m))
		return -1; /* (a NUL inside: not the whole string) */
	return 0;
}

/* Points *v at obj's string member name (its length in *n; owned by obj).
 * Returns 1, or 0 when absent or not a string. */
static int reply_str(json_object *obj, const char *name, const char **v, size_t *n)
{
	json_object *m = reply_member(obj, name, json_type_string);

	if (!m)
		return 0;
	*v = json_object_get_string(m);
	*n = (size_t)json_object_get_string_len(m);
	return 1;
}

/* Returns obj's boolean member name (absent: 0), or -1 of another type. */
static int reply_bool(json_object *obj, const char *name)
{
	json_object *m;

	if (!json_object_object_get_ex(obj, name, &m))
		return 0;
	return json_object_is_type(m, json_type_boolean) ? json_object_get_boolean(m) : -1;
}

/* Returns element i of obj's array member name when it is an object, else
 * NULL. */
static json_object *reply_nth(json_object *obj, const char *name, size_t i)
{
	json_object *a = reply_member(obj, name, json_type_array), *e;

	if (!a || i >= json_object_array_length(a))
		return NULL;
	e = json_object_array_get_idx(a, i);
	return json_object_is_type(e, json_type_object) ? e : NULL;
}

/* Returns the revision of reply obj's header (0: none or not a positive
 * int64). */
static long long reply_revision(json_object *obj)
{
	json_object *h = reply_member(obj, "header", json_type_object);
	long long rev;

	if (reply_int(h, "revision", 0, &rev) || rev < 0)
		return 0;
	return rev;
}

/* ---- requests ----------------------------------------------------------- */

/* Records "what: msg" as c's error. Returns BACKEND_ERR. */
static int fail(struct backend_conn *c, const char *what, const char *msg)
{
	snprintf(c->err, sizeof(c->err), "%s: %s", what, msg && *msg ? msg : "failed");
	return BACKEND_ERR;
}

/* Examines message o of a watch's stream (one JSON object each): 1 when
 * the watch ends (a DELETE event, the watch canceled: c->woken; anything
 * but a result: c->doc keeps it, its error), else 0 (o freed). */
static int watch_message(struct backend_conn *c, json_object *o)
{
	json_object *r = reply_member(o, "result", json_type_object), *ev;
	const char *t;
	size_t tl;

	if (!r) {
		c->doc = o;
		return 1;
	}
	c->woken = reply_bool(r, "canceled") == 1;
	for (size_t i = 0; !c->woken && (ev = reply_nth(r, "events", i)); i++)
		c->woken = c->watching == 2 ||
			   (reply_str(ev, "type", &t, &tl) && tl == 6 && !memcmp(t, "DELETE", 6));
	json_object_put(o);
	return c->woken;
}

/* libcurl's write callback: feeds the reply to c->tok as it comes. A reply
 * is one object (c->doc), a watch's a stream of them (watch_message());
 * past c->cap bytes (c->cut) or not JSON (c->bad) the rest is drained, a
 * watch stopped (returns 0: curl aborts the transfer). */
static size_t on_data(char *data, size_t size, size_t n, void *arg)
{
	struct backend_conn *c = arg;
	size_t len = size * n, at = 0;

	while (at < len && !c->cut && !c->bad) {
		size_t part = len - at, used;
		json_object *o;

		if (part > c->cap - c->fed) {
			c->cut = 1;
			break;
		}
		o = json_tokener_parse_ex(c->tok, data + at, (int)part);
		if (!o) {
			c->bad = json_tokener_get_error(c->tok) != json_tokener_continue;
			c->fed += part;
			break;
		}
		used = json_tokener_get_parse_end(c->tok);
		json_tokener_reset(c->tok);
		at += used;
		if (c->watching) {
			c->fed = 0;
			if (watch_message(c, o))
				return 0;
		} else if (c->doc) { /* a second object */
			json_object_put(o);
			c->bad = 1;
		} else {
			c->doc = o;
			c->fed += used;
		}
	}
	return c->watching && (c->cut || c->bad) ? 0 : size * n;
}

/* Records c's reply's error in c->err, "what: etcd's message" (its
 * "error" member, a string or an object with a "message"), else "what:
 * HTTP status N". */
static void reply_error(struct backend_conn *c, const char *what, long status)
{
	json_object *e = reply_member(c->doc, "error", json_type_object);
	const char *m;
	size_t ml;

	if (reply_str(e ? e : c->doc, "message", &m, &ml) || reply_str(c->doc, "error", &m, &ml))
		snprintf(c->err, sizeof(c->err), "%s: %.*s", what, (int)ml, m);
	else
		snprintf(c->err, sizeof(c->err), "%s: HTTP status %ld", what, status);
}

/*
 * POSTs body to path, bounded by timeout_ms (and the connect by
 * connect_timeout_ms), its reply at most cap bytes (a watch: each
 * message). Returns CURLE_OK with the reply in c->doc (a JSON object, owned
 * by c) when it carries no error; else the failure's code with c->err set
 * ("what: etcd's message" when etcd answered one, "what: reply ..." when
 * the reply was not one JSON object or too long (c->cut), else
 * libcurl's).
 */
static CURLcode post_capped(struct backend_conn *c, const char *body, const char *path,
			    long long timeout_ms, size_t cap, const char *what)
{
	char url[sizeof(c->base) + 32];
	CURLcode rc;
	long status = 0;

	snprintf(url, sizeof(url), "%s%s", c->base, path);
	json_object_put(c->doc);
	c->doc = NULL;
	json_tokener_reset(c->tok);
	c->fed = 0;
	c->cap = cap;
	c->woken = 0;
	c->cut = 0;
	c->bad = 0;
	c->curl_err[0] = 0;
	curl_easy_setopt(c->curl, CURLOPT_URL, url);
	curl_easy_setopt(c->curl, CURLOPT_POSTFIELDS, body);
	curl_easy_setopt(c->curl, CURLOPT_TIMEOUT_MS, timeout_ms);
	rc = curl_easy_perform(c->curl);
	if (rc == CURLE_WRITE_ERROR && c->watching && c->woken)
		return CURLE_OK;
	if (rc == CURLE_OK)
		curl_easy_getinfo(c->curl, CURLINFO_RESPONSE_CODE, &status);
	if ((c->cut || c->bad) && rc == CURLE_OK && status != 200) {
		snprintf(c->err, sizeof(c->err), "%s: HTTP status %ld", what, status);
		return CURLE_HTTP_RETURNED_ERROR;
	}
	if ((c->cut || c->bad) && (rc == CURLE_OK || rc == CURLE_WRITE_ERROR)) {
		snprintf(c->err, sizeof(c->err), "%s: reply %s", what,
			 c->cut ? "too long" : "not a JSON object");
		return CURLE_WEIRD_SERVER_REPLY;
	}
	if (rc == CURLE_WRITE_ERROR && c->watching && c->doc)
		rc = CURLE_OK; /* the stream's error: said below */
	if (rc != CURLE_OK) {
		snprintf(c->err, sizeof(c->err), "%s: %s%s%s%s", what, curl_easy_strerror(rc),
			 c->curl_err[0] ? " (" : "", c->curl_err, c->curl_err[0] ? ")" : "");
		return rc;
	}
	if (c->watching && !c->doc)
		return CURLE_OK; /* the stream ended */
	if (!status)
		curl_easy_getinfo(c->curl, CURLINFO_RESPONSE_CODE, &status);
	if (!json_object_is_type(c->doc, json_type_object)) {
		if (status != 200 && !c->doc)
			snprintf(c->err, sizeof(c->err), "%s: HTTP status %ld", what, status);
		else
			snprintf(c->err, sizeof(c->err), "%s: reply not a JSON object", what);
		return status != 200 ? CURLE_HTTP_RETURNED_ERROR : CURLE_WEIRD_SERVER_REPLY;
	}
	if (status != 200 || json_object_object_get_ex(c->doc, "error", NULL) || c->watching) {
		reply_error(c, what, status);
		return CURLE_HTTP_RETURNED_ERROR;
	}
	return CURLE_OK;
}

/* post_capped() of a reply of ETCD_RESP_MAX bytes at most (a watch's
 * messages: ETCD_EVENT_MAX; count_before's: ETCD_KV_MAX more per key). */
static CURLcode post_body(struct backend_conn *c, const char *body, const char *path,
			  long long timeout_ms, const char *what)
{
	size_t cap = c->watching ? ETCD_EVENT_MAX : ETCD_RESP_MAX + c->counting * ETCD_KV_MAX;

	return post_capped(c, body, path, timeout_ms, cap, what);
}

/* post_body() of c->body. */
static CURLcode post(struct backend_conn *c, const char *path, long long timeout_ms,
		     const char *what)
{
	return post_body(c, c->body, path, timeout_ms, what);
}

/* ---- authentication ------------------------------------------------------ */

/* Appends s to out[*n..cap) as the contents of a JSON string (", \ and
 * control characters escaped). Returns 0, or -1 when it does not fit. */
static int json_put(char *out, size_t *n, size_t cap, const char *s)
{
	for (; *s; s++) {
		unsigned char ch = (unsigned char)*s;
		int w = ch == '"' || ch == '\\' ? snprintf(out + *n, cap - *n, "\\%c", ch) :
			ch < 0x20 ? snprintf(out + *n, cap - *n, "\\u%04x", ch) :
			snprintf(out + *n, cap - *n, "%c", ch);

		if (w < 0 || (size_t)w >= cap - *n)
			return -1;
		*n += (size_t)w;
	}
	return 0;
}

/* Sets c's request headers: the JSON ones, and "Authorization: token"
 * when token is not NULL (the old list freed). Returns 0, or -1. */
static int headers_set(struct backend_conn *c, const char *token, size_t toklen)
{
	char auth[2048];
	struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");

	if (token && toklen + 16 > sizeof(auth))
		h = (curl_slist_free_all(h), NULL);
	if (h && !curl_slist_append(h, "Expect:"))
		h = (curl_slist_free_all(h), NULL);
	if (h && token) {
		snprintf(auth, sizeof(auth), "Authorization: %.*s", (int)toklen, token);
		if (!curl_slist_append(h, auth))
			h = (curl_slist_free_all(h), NULL);
	}
	if (!h || curl_easy_setopt(c->curl, CURLOPT_HTTPHEADER, h)) {
		curl_slist_free_all(h);
		return -1;
	}
	curl_slist_free_all(c->headers);
	c->headers = h;
	return 0;
}

static long long now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Whether s[0..n) may go into a header line: no control character. */
static int header_safe(const char *s, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f)
			return 0;
	return 1;
}

/*
 * Authenticates c as etcd.username (/v3/auth/authenticate, bounded by
 * timeout_ms): the token answered becomes the Authorization header of c's
 * requests, and *tok (into c->doc: valid until c's next request, not to be
 * freed) its text. The password is only in this request's body (malloc'd,
 * wiped and freed here). Returns BACKEND_OK, or BACKEND_ERR with c->err
 * ("authenticate: " etcd's or libcurl's message: never the password).
 */
static int authenticate(struct backend_conn *c, long long timeout_ms, const char **tok,
			size_t *toklen)
{
	const struct etcd_spec *sp = c->bc->spec;
	size_t cap = 6 * (strlen(sp->username) + strlen(sp->password)) + 32, n = 0;
	char *body = malloc(cap);
	int rc = BACKEND_ERR;

	if (!body || headers_set(c, NULL, 0))
		return (free(body), fail(c, "authenticate", "out of memory"));
	n = (size_t)snprintf(body, cap, "{\"name\":\"");
	if (json_put(body, &n, cap, sp->username) ||
	    (n += (size_t)snprintf(body + n, cap - n, "\",\"password\":\"")) >= cap ||
	    json_put(body, &n, cap, sp->password) || n + 3 > cap)
		fail(c, "authenticate", "user name or password too long");
	else if (memcpy(body + n, "\"}", 3),
		 post_body(c, body, "/v3/auth/authenticate", timeout_ms, "authenticate") != CURLE_OK)
		; /* c->err says it */
	else if (!reply_str(c->doc, "token", tok, toklen))
		fail(c, "authenticate", "no token in the reply");
	else if (!header_safe(*tok, *toklen))
		fail(c, "authenticate", "unexpected reply");
	else if (headers_set(c, *tok, *toklen))
		fail(c, "authenticate", "token too long, or out of memory");
	else
		rc = BACKEND_OK;
	explicit_bzero(body, cap);
	free(body);
	return rc;
}

/*
 * Gives c the process's token (token, above) when it is newer than the
 * one c saw refused (c->tgen; 0: c has none): taken from another
 * connection when one authenticated since, else made by c itself, once
 * for all (the others wait for it). A connection of another config than
 * token.owner authenticates alone. Waits until deadline (CLOCK_MONOTONIC,
 * ms) at most. Returns BACKEND_OK (c's headers carry it), or BACKEND_ERR
 * with c->err.
 */
static int token_take(struct backend_conn *c, long long deadline)
{
	struct timespec until = { deadline / 1000, deadline % 1000 * 1000000 };
	const char *tok;
	size_t len;
	int rc = BACKEND_OK;

	pthread_mutex_lock(&token.mu);
	if (token.owner != c->bc) {
		pthread_mutex_unlock(&token.mu);
		return authenticate(c, deadline - now_ms(), &tok, &len);
	}
	while (token.busy && token.gen <= c->tgen &&
	       pthread_cond_clockwait(&token.cv, &token.mu, CLOCK_MONOTONIC, &until) == 0)
		;
	if (token.gen > c->tgen && token.tok) {
		if (headers_set(c, token.tok, token.len))
			rc = fail(c, "authenticate", "out of memory");
		c->tgen = token.gen;
		pthread_mutex_unlock(&token.mu);
		return rc;
	}
	if (token.busy) {
		pthread_mutex_unlock(&token.mu);
		return fail(c, "authenticate", "timed out waiting for another connection's");
	}
	token.busy = 1;
	pthread_mutex_unlock(&token.mu);
	rc = authenticate(c, deadline - now_ms(), &tok, &len);
	pthread_mutex_lock(&token.mu);
	token.busy = 0;
	if (rc == BACKEND_OK) {
		char *copy = malloc(len + 1);

		if (copy) {
			memcpy(copy, tok, len);
			copy[len] = 0;
			free(token.tok);
			token.tok = copy;
			token.len = len;
			c->tgen = ++token.gen;
		}
	}
	pthread_cond_broadcast(&token.cv);
	pthread_mutex_unlock(&token.mu);
	return rc;
}

/* Whether c's last error says its token is no longer valid (expired, or
 * the auth store changed): authenticating again may cure it. */
static int token_refused(const struct backend_conn *c)
{
	return c->bc->spec->password && (strstr(c->err, "invalid auth token") ||
					 strstr(c->err, "auth store is old") ||
					 strstr(c->err, "user name is empty"));
}

/* Whether rc says the member went away: no connection, or the connection
 * broken before the reply's end. */
static int member_gone(CURLcode rc)
{
	return rc == CURLE_COULDNT_CONNECT || rc == CURLE_SEND_ERROR || rc == CURLE_RECV_ERROR ||
	       rc == CURLE_GOT_NOTHING || rc == CURLE_PARTIAL_FILE;
}

/* Points c at endpoint i: its URL (https with tls; with tls.server_name,
 * the URL names that host and the socket goes to the endpoint). */
static void endpoint_set(struct backend_conn *c, int i)
{
	const struct etcd_spec *sp = c->bc->spec;
	const char *ep = sp->endpoints[i], *scheme = sp->tls.enabled ? "https" : "http";

	c->ep = i;
	if (c->bc->connect_to) {
		snprintf(c->base, sizeof(c->base), "%s://%s%s", scheme, sp->tls.server_name,
			 strrchr(ep, ':'));
		curl_easy_setopt(c->curl, CURLOPT_CONNECT_TO, c->bc->connect_to[i]);
	} else {
		snprintf(c->base, sizeof(c->base), "%s://%s", scheme, ep);
	}
}

/* Points c at the endpoint after its own: the next request connects there. */
static void endpoint_next(struct backend_conn *c)
{
	endpoint_set(c, (c->ep + 1) % c->bc->nendpoints);
}

/*
 * POSTs body to path (its reply cap bytes at most: post_capped()),
 * bounded by command_timeout_ms in all; when the member went away,
 * sent again within that time to the next endpoint (each other endpoint
 * once), which becomes the one a new connection tries first. Any request
 * of this module may be sent twice (a grant finds its lease, the
 * transaction its key; see lease_revoke; a count's counts twice). An error etcd answered is not
 * sent again here (lock.c retries until wait_ms), except once with a new
 * token when the token was refused (token_take: one authentication for
 * every connection that saw it refused). Sets c->resent when an
 * attempt may have been applied unanswered. Returns BACKEND_OK, or
 * BACKEND_ERR with c->err set (etcd's message when it answered one, else
 * libcurl's).
 */
static int command_body(struct backend_conn *c, const char *body, size_t cap,
			const char *path, const char *what)
{
	long long deadline = now_ms() + c->bc->spec->command_timeout_ms;
	long long left = c->bc->spec->command_timeout_ms;
	int moves = 0, reauth = 0;
	CURLcode rc;

	c->resent = 0;
	while ((rc = post_capped(c, body, path, left, cap, what)) != CURLE_OK) {
		left = deadline - now_ms();
		if (rc == CURLE_HTTP_RETURNED_ERROR && token_refused(c) && !reauth++ && left >= 1) {
			if (token_take(c, deadline) != BACKEND_OK)
				return BACKEND_ERR;
			left = deadline - now_ms();
			if (left >= 1)
				continue;
		}
		if (!member_gone(rc) || moves == c->bc->nendpoints - 1 || left < 1)
			return BACKEND_ERR;
		c->resent |= rc != CURLE_COULDNT_CONNECT;
		endpoint_next(c);
		moves++;
	}
	if (moves)
		atomic_store(&endpoint_good, c->ep);
	return BACKEND_OK;
}

/* command_body() of c->body, its reply ETCD_RESP_MAX bytes at most
 * (count_before's: ETCD_KV_MAX more per key). */
static int command(struct backend_conn *c, const char *path, const char *what)
{
	return command_body(c, c->body, ETCD_RESP_MAX + c->counting * ETCD_KV_MAX, path, what);
}

/* ---- set-up ------------------------------------------------------------- */

static int etcd_serves(const void *settings)
{
	(void)settings;
	return 1;
}

/*
 * In secure-execution mode (a set-ID program): libcurl reads SSLKEYLOGFILE
 * with getenv at its global init (with any protocol, TLS or not) and
 * opens that file for appending, creating it, to write every TLS
 * session's secrets there: with the program's privileges, at a path the
 * user chose. Returns 1 when it is set there (the backend is then
 * refused, before libcurl's init), else 0. Its other variables do not
 * apply: the proxy ones are overridden by CURLOPT_PROXY, netrc is off.
 */
static int secure_keylog_set(void)
{
	return getauxval(AT_SECURE) && getenv("SSLKEYLOGFILE");
}

/* Fills bc->connect_to (tls.server_name): per endpoint HOST:PORT, the
 * list "NAME:PORT:HOST:PORT". Returns 0, or -1 out of memory. */
static int connect_to_make(struct backend_config *bc)
{
	const char *name = bc->spec->tls.server_name;

	if (!(bc->connect_to = calloc((size_t)bc->nendpoints, sizeof(*bc->connect_to))))
		return -1;
	for (int i = 0; i < bc->nendpoints; i++) {
		const char *ep = bc->spec->endpoints[i];
		size_t len = strlen(name) + 2 * strlen(ep) + 2;
		char *line = malloc(len);

		if (line)
			snprintf(line, len, "%s%s:%s", name, strrchr(ep, ':'), ep);
		bc->connect_to[i] = line ? curl_slist_append(NULL, line) : NULL;
		free(line);
		if (!bc->connect_to[i])
			return -1;
	}
	return 0;
}

static void etcd_config_free(struct backend_config *bc)
{
	if (!bc)
		return;
	pthread_mutex_lock(&token.mu);
	if (token.owner == bc) {
		token.owner = NULL;
		free(token.tok);
		token.tok = NULL;
	}
	pthread_mutex_unlock(&token.mu);
	for (int i = 0; bc->connect_to && i < bc->nendpoints; i++)
		curl_slist_free_all(bc->connect_to[i]);
	free(bc->connect_to);
	free(bc);
}

static struct backend_config *etcd_config_new(const void *settings, char *err, size_t errlen)
{
	const struct etcd_spec *sp = settings;
	struct backend_config *bc;

	if (secure_keylog_set()) {
		snprintf(err, errlen, "backend etcd: SSLKEYLOGFILE is set in a set-ID program "
			 "(secure-execution mode), where libcurl would create that file and write "
			 "TLS secrets to it: unset it");
		return NULL;
	}
	pthread_once(&curl_once, curl_global);
	if (curl_init_rc != CURLE_OK) {
		snprintf(err, errlen, "backend etcd: libcurl: %s", curl_easy_strerror(curl_init_rc));
		return NULL;
	}
	if (!(bc = calloc(1, sizeof(*bc)))) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	bc->spec = sp;
	while (sp->endpoints[bc->nendpoints])
		bc->nendpoints++;
	if (sp->tls.enabled && sp->tls.server_name && connect_to_make(bc)) {
		etcd_config_free(bc);
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	pthread_mutex_lock(&token.mu);
	if (!token.owner && sp->password)
		token.owner = bc;
	pthread_mutex_unlock(&token.mu);
	return bc;
}

/* Sets c's TLS options from etcd.tls (when present): the CAs (ca_file
 * and ca_dir replace the system's store, which stays when neither is set),
 * the client certificate, the verification. Returns 0, or -1. */
static int tls_setup(struct backend_conn *c)
{
	const struct backend_tls *t = &c->bc->spec->tls;
	CURL *h = c->curl;

	if (!t->enabled)
		return 0;
	return (curl_easy_setopt(h, CURLOPT_SSL_VERIFYPEER, (long)!!t->verify) ||
		curl_easy_setopt(h, CURLOPT_SSL_VERIFYHOST, t->verify ? 2L : 0L) ||
		((t->ca_file || t->ca_dir) &&
		 (curl_easy_setopt(h, CURLOPT_CAINFO, t->ca_file) ||
		  curl_easy_setopt(h, CURLOPT_CAPATH, t->ca_dir))) ||
		(t->cert_file && (curl_easy_setopt(h, CURLOPT_SSLCERT, t->cert_file) ||
				  curl_easy_setopt(h, CURLOPT_SSLKEY, t->key_file)))) ? -1 : 0;
}

/* Sets the options every request of c shares. Returns 0, or -1. */
static int handle_setup(struct backend_conn *c)
{
	CURL *h = c->curl;

	return (headers_set(c, NULL, 0) || tls_setup(c) ||
		curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L) ||
		curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR,
				 c->bc->spec->tls.enabled ? "https" : "http") ||
		curl_easy_setopt(h, CURLOPT_PROXY, "") ||
		curl_easy_setopt(h, CURLOPT_NOPROXY, "*") ||
		curl_easy_setopt(h, CURLOPT_TCP_NODELAY, 1L) ||
		curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS,
				 (long)c->bc->spec->connect_timeout_ms) ||
		curl_easy_setopt(h, CURLOPT_ERRORBUFFER, c->curl_err) ||
		curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_data) ||
		curl_easy_setopt(h, CURLOPT_WRITEDATA, c)) ? -1 : 0;
}

static void etcd_close(struct backend_conn *c)
{
	if (!c)
		return;
	if (c->curl)
		curl_easy_cleanup(c->curl);
	curl_slist_free_all(c->headers);
	json_object_put(c->doc);
	if (c->tok)
		json_tokener_free(c->tok);
	free(c->mkey);
	free(c->mval);
	free(c);
}

/* Returns a connection to the first endpoint that answers a status
 * request (and, with a password, carries the process's token: token_take),
 * trying them in order
 * from the one that answered last, or NULL with the last endpoint's error
 * in err. */
static struct backend_conn *etcd_open(const struct backend_config *bc, char *err, size_t errlen)
{
	struct backend_conn *c = calloc(1, sizeof(*c));
	int authfail = 0;

	if (!c || !(c->curl = curl_easy_init()) || !(c->tok = json_tokener_new())) {
		snprintf(err, errlen, "out of memory");
		etcd_close(c);
		return NULL;
	}
	c->bc = bc;
	if (handle_setup(c)) {
		snprintf(err, errlen, "libcurl: cannot set up a handle");
		etcd_close(c);
		return NULL;
	}
	for (int k = 0, first = atomic_load(&endpoint_good); k < bc->nendpoints; k++) {
		int i = (first + k) % bc->nendpoints;
		const char *ep = bc->spec->endpoints[i];

		endpoint_set(c, i);
		snprintf(c->body, sizeof(c->body), "{}");
		if (post(c, "/v3/maintenance/status", bc->spec->connect_timeout_ms,
			 ep) != CURLE_OK)
			continue;
		if (bc->spec->password &&
		    token_take(c, now_ms() + bc->spec->command_timeout_ms) != BACKEND_OK) {
			authfail = 1;
			continue;
		}
		atomic_store(&endpoint_good, i);
		return c;
	}
	snprintf(err, errlen, "%s%s", authfail ? "" : "connect: ", c->err);
	etcd_close(c);
	return NULL;
}

/* Writes "etcd HOST:PORT[, TLS][, user NAME], prefix P (leases, lowest
 * create revision holds)". */
static void etcd_describe(const struct backend_config *bc, char *buf, size_t len)
{
	const struct etcd_spec *sp = bc->spec;

	snprintf(buf, len, "etcd %s%s%s%s%s, prefix %s (a lease per lock; the lowest create "
		 "revision holds)", sp->endpoints[0], sp->endpoints[1] ?
		 " (first of the endpoints)" : "", sp->tls.enabled ? ", TLS" : "",
		 sp->username ? ", user " : "", sp->username ? sp->username : "", sp->prefix);
}

/* ---- locking ------------------------------------------------------------ */

/* Returns the lease TTL in whole seconds for lease_ms: rounded up, at
 * least 2 (etcd's leases are whole seconds; 1 s would expire between two
 * renewals at a third of it). */
static long long ttl_s(long long lease_ms)
{
	long long s = (lease_ms + 999) / 1000;

	return s < 2 ? 2 : s;
}

/* Reads the TTL of c's keepalive reply ({"result":{"header":...,
 * "TTL":...}}, TTL 0 left out) into *ttl. Returns BACKEND_OK, or
 * BACKEND_ERR ("keepalive: unexpected reply") when it is not one. */
static int keepalive_ttl(struct backend_conn *c, long long *ttl)
{
	json_object *r = reply_member(c->doc, "result", json_type_object);

	if (!r || !reply_revision(r) || reply_int(r, "TTL", 0, ttl))
		return fail(c, "keepalive", "unexpected reply");
	return BACKEND_OK;
}

/* Makes sure lease n->lease lives: a waiter's may exist already (a
 * keepalive renews it), a first attempt grants it. Returns BACKEND_OK or
 * BACKEND_ERR. */
static int lease_ensure(struct backend_conn *c, const struct backend_item *it,
			const struct etcd_names *n)
{
	long long ttl;

	if (it->waiting) {
		snprintf(c->body, sizeof(c->body), "{\"ID\":\"%lld\"}", n->lease);
		if (command(c, "/v3/lease/keepalive", "keepalive") != BACKEND_OK ||
		    keepalive_ttl(c, &ttl) != BACKEND_OK)
			return BACKEND_ERR;
		if (ttl > 0)
			return BACKEND_OK;
	}
	snprintf(c->body, sizeof(c->body), "{\"ID\":\"%lld\",\"TTL\":\"%lld\"}", n->lease,
		 ttl_s(it->lease_ms));
	if (command(c, "/v3/lease/grant", "lease grant") != BACKEND_OK)
		return strstr(c->err, "lease already exists") ? BACKEND_OK : BACKEND_ERR;
	if (reply_int(c->doc, "ID", 0, &ttl) || ttl != n->lease ||
	    reply_int(c->doc, "TTL", 0, &ttl) || ttl <= 0)
		return fail(c, "lease grant", "unexpected reply");
	return BACKEND_OK;
}

/* Revokes lease n->lease (its key goes with it). Returns BACKEND_OK,
 * BACKEND_NO when it was gone (BACKEND_OK when an earlier attempt of this
 * revoke may have removed it: sent again after a failure), or BACKEND_ERR. */
static int lease_revoke(struct backend_conn *c, const struct etcd_names *n)
{

	snprintf(c->body, sizeof(c->body), "{\"ID\":\"%lld\"}", n->lease);
	if (command(c, "/v3/lease/revoke", "lease revoke") == BACKEND_OK)
		return BACKEND_OK;
	if (!strstr(c->err, "lease not found"))
		return BACKEND_ERR;
	return c->resent ? BACKEND_OK : BACKEND_NO;
}

/* What join saw of a lock's keys. */
struct etcd_seen {
	long long rev;       /* the transaction's revision */
	long long mine;      /* our key's create revision */
	long long owner;     /* the first key's (the lowest create revision) */
	long long count;     /* the keys under the lock's range */
	long long writers;   /* shared, put: the writers' keys (all older) */
	int put;             /* our key was put now: every other key is older */
	struct etcd_mode om; /* the first key's mode */
};

/* Returns the i-th (from 0) "response_range" of transaction reply doc's
 * responses, or NULL. */
static json_object *nth_range(json_object *doc, int i)
{
	json_object *r, *rr;

	for (size_t k = 0; (r = reply_nth(doc, "responses", k)); k++)
		if ((rr = reply_member(r, "response_range", json_type_object)) && i-- == 0)
			return rr;
	return NULL;
}

/* Reads range reply r's first kv (its create revision, key and value) and
 * count into w, the value into holder (holder_len not NULL). Returns 0, or
 * -1 when a field is of the wrong type. */
static int first_read(json_object *r, struct etcd_seen *w, char *holder, size_t *holder_len)
{
	json_object *kv = reply_nth(r, "kvs", 0);
	char first[ETCD_KEY_MAX];
	const char *v;
	size_t vl;

	if ((kv && reply_int(kv, "create_revision", 0, &w->owner)) ||
	    (r && reply_int(r, "count", 0, &w->count)))
		return -1;
	w->om = (struct etcd_mode){ 1, 0 };
	if (reply_str(kv, "key", &v, &vl))
		w->om = mode_of(first, b64_decode(v, vl, first, sizeof(first)));
	if (holder_len && reply_str(kv, "value", &v, &vl))
		*holder_len = b64_decode(v, vl, holder, BACKEND_VAL_MAX);
	return 0;
}

/*
 * Puts our key with its lease unless it exists, and reads the first key
 * (and, for a shared caller whose key is new, counts the writers' keys),
 * in one transaction. Fills *w, and the first key's value into holder.
 * Returns BACKEND_OK or BACKEND_ERR.
 */
static int join(struct backend_conn *c, const struct backend_item *it,
		const struct etcd_names *n, struct etcd_seen *w, char *holder, size_t *holder_len)
{
	char val[ETCD_B64(BACKEND_VAL_MAX)], range[2 * sizeof(n->from) + 160];
	char writers[2 * sizeof(n->from) + 96] = "";
	json_object *r;

	b64_encode((const unsigned char *)it->val, it->vlen, val);
	snprintf(range, sizeof(range), "{\"request_range\":{\"key\":\"%s\",\"range_end\":\"%s\","
		 "\"sort_order\":\"ASCEND\",\"sort_target\":\"CREATE\",\"limit\":\"1\"}}",
		 n->from, n->to);
	if (it->shared)
		snprintf(writers, sizeof(writers), ",{\"request_range\":{\"key\":\"%s\","
			 "\"range_end\":\"%s\",\"count_only\":true}}", n->from, n->wto);
	snprintf(c->body, sizeof(c->body),
		 "{\"compare\":[{\"target\":\"CREATE\",\"key\":\"%s\",\"create_revision\":\"0\","
		 "\"result\":\"EQUAL\"}],"
		 "\"success\":[{\"request_put\":{\"key\":\"%s\",\"value\":\"%s\",\"lease\":\"%lld\"}},"
		 "%s%s],\"failure\":[{\"request_range\":{\"key\":\"%s\"}},%s]}",
		 n->key, n->key, val, n->lease, range, writers, n->key, range);
	if (command(c, "/v3/kv/txn", "transaction") != BACKEND_OK)
		return BACKEND_ERR;
	memset(w, 0, sizeof(*w));
	if (holder_len)
		*holder_len = 0;
	w->rev = reply_revision(c->doc);
	if ((w->put = reply_bool(c->doc, "succeeded")) < 0)
		return fail(c, "transaction", "unexpected reply");
	if (w->put) {
		w->mine = w->rev;
		r = nth_range(c->doc, 0);
		if (it->shared && reply_int(nth_range(c->doc, 1), "count", 0, &w->writers))
			return fail(c, "transaction", "unexpected reply");
	} else {
		if (reply_int(reply_nth(nth_range(c->doc, 0), "kvs", 0), "create_revision", 0,
			     &w->mine))
			w->mine = 0;
		r = nth_range(c->doc, 1);
	}
	if (first_read(r, w, holder, holder_len))
		return fail(c, "transaction", "unexpected reply");
	if (w->mine <= 0 || w->owner <= 0)
		return fail(c, "transaction", "no create revision in the reply (our lease "
			    "expired?)");
	return BACKEND_OK;
}

/*
 * Counts the keys of [n->from, end) created before revision mine, up to
 * most, into *count (*rev: the read's revision). etcd's own count ignores
 * the create revision's bound, so the keys read (keys only, at most most;
 * the oldest, or with newest the newest first, in c->doc's "kvs") are
 * counted: the reply may be ETCD_KV_MAX bytes per key. Returns
 * BACKEND_OK or BACKEND_ERR.
 */
static int count_before(struct backend_conn *c, const struct etcd_names *n, const char *end,
			long long mine, int most, int newest, long long *count, long long *rev)
{
	json_object *kvs;
	int rc;

	snprintf(c->body, sizeof(c->body), "{\"key\":\"%s\",\"range_end\":\"%s\",\"keys_only\":"
		 "true,\"sort_order\":\"%s\",\"sort_target\":\"CREATE\",\"limit\":\"%d\","
		 "\"max_create_revision\":\"%lld\"}", n->from, end, newest ? "DESCEND" : "ASCEND",
		 most, mine - 1);
	c->counting = (size_t)most;
	rc = command(c, "/v3/kv/range", "count");
	c->counting = 0;
	if (rc != BACKEND_OK)
		return BACKEND_ERR;
	kvs = reply_member(c->doc, "kvs", json_type_array);
	*count = kvs ? (long long)json_object_array_length(kvs) : 0;
	*rev = reply_revision(c->doc);
	if (*rev <= 0 || (!kvs && json_object_object_get_ex(c->doc, "kvs", NULL)))
		return fail(c, "count", "unexpected reply");
	return BACKEND_OK;
}

/*
 * Whether what join saw (w) grants it: exclusive, the first key is ours;
 * a permit, fewer than limit keys are older than ours; shared, no writer
 * is. An older key's count not in w (our key was there already: an
 * attempt again) is read (one more request). Returns 1 granted, 0 not,
 * or BACKEND_ERR.
 */
static int granted(struct backend_conn *c, const struct backend_item *it,
		   const struct etcd_names *n, const struct etcd_seen *w)
{
	long long older, rev;

	if (!backend_item_set(it))
		return w->mine == w->owner;
	if (w->put)
		older = it->shared ? w->writers : w->count - 1;
	else if (count_before(c, n, it->shared ? n->wto : n->to, w->mine,
			      it->shared ? 1 : it->limit, 0, &older, &rev) != BACKEND_OK)
		return BACKEND_ERR;
	return older < (it->shared ? 1 : it->limit);
}

/*
 * Puts our permit's key again, its value and lease kept (its create
 * revision, the fence, too), when it enters after waiting: the permit
 * waiter behind it watches for that (etcd_wait). A failure only delays
 * that waiter until it asks again (a third of its lease): not reported.
 */
static void permit_touch(struct backend_conn *c, const struct etcd_names *n)
{
	snprintf(c->body, sizeof(c->body), "{\"key\":\"%s\",\"ignore_value\":true,"
		 "\"ignore_lease\":true}", n->key);
	command(c, "/v3/kv/put", "entry");
}

/*
 * Takes the lock: our key (joining the queue when it is new), granted by
 * its mode (granted()); the key's first holder with another limit (a
 * shared or exclusive one counts as 1) is BACKEND_MISMATCH, our key
 * removed. Refused, the caller stays queued (a watched backend: lock.c
 * leaves when it gives up), and its wait is bounded by a third of its
 * lease, so that it renews its lease in time.
 */
static int etcd_acquire(struct backend_conn *c, const struct backend_item *it, long long *wait_ms,
			char *holder, size_t *holder_len, long long *fence)
{
	struct etcd_names n;
	struct etcd_seen w;
	int limit = it->limit > 1 ? it->limit : 1, rc;

	*fence = 0;
	*holder_len = 0;
	if (names_make(c->bc, it, &n))
		return fail(c, "acquire", "key too long");
	if (lease_ensure(c, it, &n) != BACKEND_OK ||
	    join(c, it, &n, &w, holder, holder_len) != BACKEND_OK)
		return BACKEND_ERR;
	if (w.om.limit != limit) {
		lease_revoke(c, &n);
		snprintf(c->err, sizeof(c->err), "limit %d here, %d for the key's holders", limit,
			 w.om.limit);
		return BACKEND_MISMATCH;
	}
	if ((rc = granted(c, it, &n, &w)) == BACKEND_ERR)
		return BACKEND_ERR;
	if (rc) {
		if (!w.put && it->limit > 1 && !it->shared)
			permit_touch(c, &n);
		*fence = w.mine;
		return BACKEND_OK;
	}
	c->last_lease = n.lease;
	c->last_rev = w.mine;
	*wait_ms = ttl_s(it->lease_ms) * 1000 / 3;
	return BACKEND_NO;
}

/* Revokes the lease: the key goes with it. BACKEND_NO: it was gone. */
static int etcd_release(struct backend_conn *c, const struct backend_item *it, int async)
{
	struct etcd_names n;

	(void)async;
	if (names_make(c->bc, it, &n))
		return fail(c, "release", "key too long");
	return lease_revoke(c, &n);
}

/*
 * Watches from revision from on: key k (the gateway's base64, kl bytes),
 * until it is deleted (any: or put), or with end the range [k, end) until
 * a key there is deleted (etcd sends no puts: NOPUT), or timeout_ms.
 * Returns BACKEND_OK (woken, or the watch's member went away: try again,
 * through the next endpoint), BACKEND_NO (timed out) or BACKEND_ERR.
 */
static int watch_delete(struct backend_conn *c, const char *k, size_t kl, const char *end,
			long long from, long long timeout_ms, int any)
{
	CURLcode rc;

	snprintf(c->body, sizeof(c->body), "{\"create_request\":{\"key\":\"%.*s\",%s%s%s"
		 "\"start_revision\":\"%lld\"}}", (int)kl, k, end ? "\"range_end\":\"" : "",
		 end ? end : "", end ? "\",\"filters\":[\"NOPUT\"]," : "", from);
	if (timeout_ms > ETCD_WAIT_MAX_MS)
		timeout_ms = ETCD_WAIT_MAX_MS;
	c->watching = any ? 2 : 1;
	rc = post(c, "/v3/watch", timeout_ms < 1 ? 1 : timeout_ms, "watch");
	c->watching = 0;
	if (rc == CURLE_OK)
		return c->woken ? BACKEND_OK : BACKEND_NO;
	if (member_gone(rc)) {
		endpoint_next(c);
		return BACKEND_OK;
	}
	return rc == CURLE_OPERATION_TIMEDOUT ? BACKEND_NO : BACKEND_ERR;
}

/*
 * Waits for what keeps us out to change (our key's create revision: the
 * refused acquire's, else read again), by a watch from the revision of a
 * read on. Exclusive: the deletion of our predecessor (the key of the
 * greatest create revision below ours); shared: of the last writer's key
 * below ours (readers wait for writers only). A permit of limit L: with
 * exactly L older keys (all holders: the first waiter), the deletion of
 * any key of the lock; with more, our predecessor (a waiter) deleted or
 * put again: permit_touch, at its entry, after which we are the first
 * waiter. So a release wakes one permit waiter, whose entry wakes the
 * next, not all. One read gives both the count (L + 1 at most) and the
 * predecessor. BACKEND_OK when it went (or nothing is in the way: try
 * again), BACKEND_NO when timeout_ms passed first.
 */
static int etcd_wait(struct backend_conn *c, const struct backend_item *it,
		     long long timeout_ms, long long *fence)
{
	struct etcd_names n;
	struct etcd_seen w;
	long long mine = 0, rev, older;
	const char *pk;
	size_t pkl;
	int rc, permit = it->limit > 1 && !it->shared;

	*fence = 0;
	if (names_make(c->bc, it, &n))
		return fail(c, "wait", "key too long");
	if (c->last_lease == n.lease && c->last_rev > 0) {
		mine = c->last_rev;
	} else {
		if (join(c, it, &n, &w, NULL, NULL) != BACKEND_OK ||
		    (rc = granted(c, it, &n, &w)) == BACKEND_ERR)
			return BACKEND_ERR;
		if (rc)
			return BACKEND_OK;
		mine = w.mine;
	}
	c->last_lease = 0;
	if (permit) {
		if (count_before(c, &n, n.to, mine, it->limit + 1, 1, &older, &rev) != BACKEND_OK)
			return BACKEND_ERR;
		if (older < it->limit)
			return BACKEND_OK;
		if (older == it->limit) /* the first waiter: behind holders only */
			return watch_delete(c, n.from, strlen(n.from), n.to, rev + 1, timeout_ms, 0);
	} else {
		snprintf(c->body, sizeof(c->body), "{\"key\":\"%s\",\"range_end\":\"%s\","
			 "\"sort_order\":\"DESCEND\",\"sort_target\":\"CREATE\",\"limit\":\"1\","
			 "\"keys_only\":true,\"max_create_revision\":\"%lld\"}", n.from,
			 it->shared ? n.wto : n.to, mine - 1);
		if (command(c, "/v3/kv/range", "predecessor") != BACKEND_OK)
			return BACKEND_ERR;
		if ((rev = reply_revision(c->doc)) <= 0)
			return fail(c, "predecessor", "unexpected reply");
	}
	if (!reply_str(reply_nth(c->doc, "kvs", 0), "key", &pk, &pkl))
		return BACKEND_OK;
	if (pkl >= sizeof(n.key))
		return fail(c, "wait", "predecessor key too long");
	for (size_t i = 0; i < pkl; i++) /* it goes into the watch's JSON as is */
		if (b64_value(pk[i]) < 0 && pk[i] != '=')
			return fail(c, "predecessor", "unexpected reply");
	memcpy(n.key, pk, pkl); /* out of c->doc, which the watch frees */
	return watch_delete(c, n.key, pkl, NULL, rev + 1, timeout_ms, permit);
}

/* Leaves the queue (or forgets a grant): the lease and its key go. */
static int etcd_leave(struct backend_conn *c, const struct backend_item *it, int async)
{
	return etcd_release(c, it, async);
}

/* Releases are synchronous: nothing is ever unread. */
static int etcd_flush(struct backend_conn *c)
{
	(void)c;
	return BACKEND_OK;
}

static void etcd_unconfirmed(struct backend_conn *c,
			     void (*fn)(void *arg, const struct backend_item *it), void *arg)
{
	(void)c;
	(void)fn;
	(void)arg;
}

/* One LeaseKeepAlive per lock (the gateway's stream, one request long): a
 * lease answered with TTL 0 (or not found) is lost. */
static int etcd_renew(struct backend_conn *c, int n, const struct backend_item *items,
		      int *results)
{
	for (int i = 0; i < n; i++) {

		snprintf(c->body, sizeof(c->body), "{\"ID\":\"%lld\"}", lease_id(&items[i]));
		long long ttl;

		if (command(c, "/v3/lease/keepalive", "keepalive") != BACKEND_OK ||
		    keepalive_ttl(c, &ttl) != BACKEND_OK)
			return BACKEND_ERR;
		results[i] = ttl > 0 ? BACKEND_OK : BACKEND_NO;
	}
	return BACKEND_OK;
}

static const char *etcd_errstr(const struct backend_conn *c)
{
	return c->err;
}

static int etcd_ping(struct backend_conn *c)
{

	snprintf(c->body, sizeof(c->body), "{}");
	return command(c, "/v3/maintenance/status", "status");
}

/* ---- status ------------------------------------------------------------- */

#define ETCD_PAGE_MAX 64 /* keys per range read of etcd_holders */

/* One key under the prefix, as etcd_holders reads it (malloc'd strings). */
struct etcd_entry {
	char *name;   /* the escaped key: between the prefix and the last / */
	size_t nlen;
	char *val;    /* its value, decoded */
	size_t vlen;
	long long rev, lease, ttl_ms;
	struct etcd_mode mode; /* what its key says */
};

/* The keys read so far, in key order. */
struct etcd_listing {
	struct etcd_entry *e;
	int n, cap;
};

static void listing_free(struct etcd_listing *ls)
{
	for (int i = 0; i < ls->n; i++) {
		free(ls->e[i].name);
		free(ls->e[i].val);
	}
	free(ls->e);
}

/* Adds the key of the gateway's kv object obj to ls when it is
 * <prefix><name>/<lease hex>; *last (ETCD_KEY_MAX + 1 bytes) gets its raw
 * key, *lastlen its length. Returns 0, -1 out of memory, or -2 when a
 * field is of the wrong type. */
static int listing_add(struct etcd_listing *ls, json_object *obj, size_t plen,
		       unsigned char *last, size_t *lastlen)
{
	struct etcd_entry *e;
	const char *k, *v, *slash;
	size_t kl, vl;
	long long rev, lease;

	if (!reply_str(obj, "key", &k, &kl))
		return 0;
	if (reply_int(obj, "create_revision", 0, &rev) || reply_int(obj, "lease", 0, &lease))
		return -2;
	*lastlen = b64_decode(k, kl, (char *)last, ETCD_KEY_MAX);
	last[*lastlen] = 0;
	slash = memrchr(last, '/', *lastlen);
	if (!slash || (size_t)(slash - (char *)last) <= plen)
		return 0;
	if (ls->n == ls->cap) {
		int cap = ls->cap ? 2 * ls->cap : 64;
		struct etcd_entry *grown = realloc(ls->e, (size_t)cap * sizeof(*grown));

		if (!grown)
			return -1;
		ls->e = grown;
		ls->cap = cap;
	}
	e = &ls->e[ls->n];
	memset(e, 0, sizeof(*e));
	e->nlen = (size_t)(slash - (char *)last) - plen;
	if (!reply_str(obj, "value", &v, &vl))
		vl = 0;
	if (!(e->name = strndup((char *)last + plen, e->nlen)) || !(e->val = malloc(vl / 4 * 3 + 3))) {
		free(e->name);
		return -1;
	}
	e->vlen = vl ? b64_decode(v, vl, e->val, vl / 4 * 3 + 3) : 0;
	e->rev = rev;
	e->lease = lease;
	e->mode = mode_of((char *)last, *lastlen);
	ls->n++;
	return 0;
}

/* Reads the keys of [lo, hi) (raw bytes) into ls, in key order: range
 * reads of ETCD_PAGE_MAX keys, halved while a reply overflows. Returns
 * BACKEND_OK or BACKEND_ERR (c->err set). */
static int listing_range(struct backend_conn *c, struct etcd_listing *ls,
			 const unsigned char *lo, size_t lolen, const unsigned char *hi,
			 size_t hilen)
{
	size_t plen = strlen(c->bc->spec->prefix), lastlen = lolen;
	unsigned char last[ETCD_KEY_MAX + 1];
	char from[ETCD_B64(ETCD_KEY_MAX + 1)], to[ETCD_B64(ETCD_KEY_MAX)];
	int limit = ETCD_PAGE_MAX, more = 1;

	memcpy(last, lo, lolen);
	b64_encode(hi, hilen, to);
	b64_encode(last, lastlen, from);
	while (more) {
		json_object *kv;
		int rc;

		snprintf(c->body, sizeof(c->body), "{\"key\":\"%s\",\"range_end\":\"%s\","
			 "\"sort_order\":\"ASCEND\",\"sort_target\":\"KEY\",\"limit\":\"%d\"}",
			 from, to, limit);
		if (command(c, "/v3/kv/range", "status") != BACKEND_OK) {
			if (!c->cut)
				return BACKEND_ERR;
			if (limit == 1)
				return fail(c, "status", "a key and its value too long to read");
			limit /= 2;
			continue;
		}
		if ((more = reply_bool(c->doc, "more")) < 0)
			return fail(c, "status", "unexpected reply");
		for (size_t i = 0; (kv = reply_nth(c->doc, "kvs", i)); i++)
			if ((rc = listing_add(ls, kv, plen, last, &lastlen)) != 0)
				return fail(c, "status",
					    rc == -1 ? "out of memory" : "unexpected reply");
		last[lastlen] = 0; /* the next page starts just after the last key */
		b64_encode(last, lastlen + 1, from);
	}
	return BACKEND_OK;
}

/* Reads every key under c's prefix but the hosts' counts into ls, in key
 * order: [<prefix>, <prefix>%metrics/), then [<prefix>%metrics0, the
 * prefix's end). Returns BACKEND_OK or BACKEND_ERR (c->err set). */
static int listing_read(struct backend_conn *c, struct etcd_listing *ls)
{
	const char *prefix = c->bc->spec->prefix;
	size_t plen = strlen(prefix), mlen = strlen(ETCD_METRICS);
	unsigned char p[ETCD_KEY_MAX], m[ETCD_KEY_MAX];

	memcpy(p, prefix, plen);
	memcpy(m, prefix, plen);
	memcpy(m + plen, ETCD_METRICS, mlen);
	if (listing_range(c, ls, p, plen, m, plen + mlen) != BACKEND_OK)
		return BACKEND_ERR;
	m[plen + mlen - 1]++;
	p[plen - 1]++;
	return listing_range(c, ls, m, plen + mlen, p, plen);
}

/* Fills e->ttl_ms with its lease's TTL left (-1: gone). Returns BACKEND_OK
 * or BACKEND_ERR. */
static int entry_ttl(struct backend_conn *c, struct etcd_entry *e)
{
	long long ttl;

	snprintf(c->body, sizeof(c->body), "{\"ID\":\"%lld\"}", e->lease);
	if (command(c, "/v3/lease/timetolive", "status") != BACKEND_OK)
		return BACKEND_ERR;
	if (reply_int(c->doc, "TTL", -1, &ttl))
		return fail(c, "status", "unexpected reply");
	e->ttl_ms = ttl < 0 ? -1 : ttl * 1000;
	return BACKEND_OK;
}

/* Returns the value of hex digit ch, or -1. */
static int hex_value(char ch)
{
	if (ch >= '0' && ch <= '9')
		return ch - '0';
	if (ch >= 'A' && ch <= 'F')
		return ch - 'A' + 10;
	return ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1;
}

/* Writes the stored key of escaped name[0..n) (each %XX decoded) into out
 * (n bytes at least). Returns its length. */
static size_t name_unescape(const char *name, size_t n, char *out)
{
	size_t k = 0;

	for (size_t i = 0; i < n; i++) {
		int hi = i + 2 < n && name[i] == '%' ? hex_value(name[i + 1]) : -1;
		int lo = hi >= 0 ? hex_value(name[i + 2]) : -1;

		if (lo >= 0) {
			out[k++] = (char)(hi << 4 | lo);
			i += 2;
		} else {
			out[k++] = name[i];
		}
	}
	return k;
}

/* Room for reporting one lock of a listing of n keys (group_report). */
struct etcd_report {
	const char **wval;
	size_t *wlen;
	char *key;
};

/* Sorts g[0..n) (one lock's keys, in key order) by create revision. */
static void group_sort(struct etcd_entry *g, int n)
{
	for (int i = 1; i < n; i++) /* insertion sort */
		for (int j = i; j > 0 && g[j].rev < g[j - 1].rev; j--) {
			struct etcd_entry t = g[j];

			g[j] = g[j - 1];
			g[j - 1] = t;
		}
}

/* Returns how many of g[0..n) (sorted) hold the lock: the first key's
 * mode says (exclusive: 1; permits: up to its limit; shared: the shared
 * keys before the first writer's). */
static int group_holders(const struct etcd_entry *g, int n)
{
	int h = 1;

	if (g->mode.shared)
		while (h < n && g[h].mode.shared)
			h++;
	else
		h = g->mode.limit < n ? g->mode.limit : n;
	return h;
}

/* Reports the lock of g[0..n) (one name; sorted), each of its holders
 * (their waiters, the rest, with the first), to fn through r's room. */
static void group_report(struct etcd_entry *g, int n, const struct etcd_report *r,
			 void (*fn)(void *arg, const struct backend_holder *l), void *arg)
{
	int nh = group_holders(g, n);
	struct backend_holder l = { .key = r->key, .wval = r->wval, .wlen = r->wlen };

	for (int i = nh; i < n; i++) {
		r->wval[i - nh] = g[i].val;
		r->wlen[i - nh] = g[i].vlen;
	}
	l.klen = name_unescape(g->name, g->nlen, r->key);
	for (int i = 0; i < nh; i++) {
		l.val = g[i].val;
		l.vlen = g[i].vlen;
		l.fence = g[i].rev;
		l.lease_left_ms = g[i].ttl_ms;
		l.limit = g[i].mode.limit;
		l.shared = g[i].mode.shared;
		l.in_set = g[i].mode.shared || g[i].mode.limit > 1;
		l.nwaiters = i ? 0 : n - nh;
		fn(arg, &l);
	}
}

/* Returns the end of the group of keys of ls->e[i]'s name. */
static int group_end(const struct etcd_listing *ls, int i)
{
	int j = i + 1;

	while (j < ls->n && ls->e[j].nlen == ls->e[i].nlen &&
	       memcmp(ls->e[j].name, ls->e[i].name, ls->e[i].nlen) == 0)
		j++;
	return j;
}

/* .holders: the locks under c's prefix, in key order: each one's holders
 * (the key of the lowest create revision under <prefix><key>/, or the
 * keys its mode lets in beside it: group_holders) and its waiters (the
 * rest, in create revision order, given with its first holder). Reads
 * the prefix, around the hosts' counts (listing_read), in pages of at
 * most ETCD_PAGE_MAX keys (fewer while a page overflows the reply
 * buffer), then one lease TTL per holder; keys not of the form
 * <prefix><escaped key>/<mode and lease hex> are skipped. */
static int etcd_holders(struct backend_conn *c,
			void (*fn)(void *arg, const struct backend_holder *l), void *arg)
{
	struct etcd_listing ls = { 0 };
	struct etcd_report r = { 0 };
	int rc = listing_read(c, &ls);

	for (int i = 0, j; rc == BACKEND_OK && i < ls.n; i = j) {
		j = group_end(&ls, i);
		group_sort(ls.e + i, j - i);
		for (int k = 0; rc == BACKEND_OK && k < group_holders(ls.e + i, j - i); k++)
			rc = entry_ttl(c, &ls.e[i + k]);
	}
	if (rc == BACKEND_OK && ls.n &&
	    (!(r.wval = calloc((size_t)ls.n, sizeof(*r.wval))) ||
	     !(r.wlen = calloc((size_t)ls.n, sizeof(*r.wlen))) ||
	     !(r.key = malloc(ETCD_KEY_MAX))))
		rc = fail(c, "status", "out of memory");
	for (int i = 0, j; rc == BACKEND_OK && i < ls.n; i = j) {
		j = group_end(&ls, i);
		group_report(ls.e + i, j - i, &r, fn, arg);
	}
	free(r.wval);
	free(r.wlen);
	free(r.key);
	listing_free(&ls);
	return rc;
}

/* ---- metrics ------------------------------------------------------------ */

#define ETCD_COUNT_TRIES 16            /* transactions of one shipment at most */
#define ETCD_COUNT_VALUE_MAX (3 << 20) /* a host's value at most (etcd refuses a
					* request past --max-request-bytes first:
					* 1.5 MiB by default) */
#define ETCD_COUNT_REPLY_MAX (ETCD_B64(ETCD_COUNT_VALUE_MAX) + ETCD_RESP_MAX)
#define ETCD_METRICS_READ_MAX (64 << 20) /* count_read's one reply at most */

/* One field of a host's value, pointing into it (or into .count's
 * arguments). */
struct etcd_count {
	const char *field;
	size_t flen;
	long long value;
};

/* Orders fields a[0..al) and b[0..bl) bytewise (a prefix first). */
static int field_cmp(const char *a, size_t al, const char *b, size_t bl)
{
	int r = memcmp(a, b, al < bl ? al : bl);

	return r ? r : (al > bl) - (al < bl);
}

static int count_cmp(const void *x, const void *y)
{
	const struct etcd_count *a = x, *b = y;

	return field_cmp(a->field, a->flen, b->field, b->flen);
}

/* Reads the decimal at v[*at..n) (a '-' first when neg) ending at byte
 * end into *out; *at moves past end. Returns 0, or -1. */
static int count_number(const char *v, size_t n, size_t *at, int neg, char end, long long *out)
{
	size_t i = *at, first;
	int minus = neg && i < n && v[i] == '-';
	long long x = 0;

	i += (size_t)minus;
	for (first = i; i < n && v[i] >= '0' && v[i] <= '9'; i++)
		if (__builtin_mul_overflow(x, 10, &x) ||
		    __builtin_add_overflow(x, minus ? -(v[i] - '0') : v[i] - '0', &x))
			return -1;
	if (i == first || i >= n || v[i] != end)
		return -1;
	*at = i + 1;
	*out = x;
	return 0;
}

/*
 * Parses a host's value v[0..n): "<flen>:<field>=<value>\n" per field,
 * fields in strictly increasing byte order. Fills *out (malloc'd, the
 * caller frees it; fields point into v) and *nout. Returns 0, -1 when v is
 * not of that form, or -2 out of memory.
 */
static int counts_parse(const char *v, size_t n, struct etcd_count **out, size_t *nout)
{
	struct etcd_count *e = malloc((n / 6 + 1) * sizeof(*e));
	size_t k = 0, at = 0;
	long long flen;

	if (!e)
		return -2;
	while (at < n) {
		if (count_number(v, n, &at, 0, ':', &flen) || flen < 1 || (size_t)flen > n - at)
			break;
		e[k].field = v + at;
		e[k].flen = (size_t)flen;
		at += (size_t)flen;
		if (at >= n || v[at++] != '=' || count_number(v, n, &at, 1, '\n', &e[k].value) ||
		    (k && count_cmp(&e[k - 1], &e[k]) >= 0))
			break;
		k++;
	}
	if (at < n) {
		free(e);
		return -1;
	}
	*out = e;
	*nout = k;
	return 0;
}

/*
 * Writes the value of old[0..no) plus add[0..na) (both in field order,
 * add's fields each once): each field's value plus its delta (a new field
 * from 0), into *out (malloc'd; the caller frees it), its length in *olen.
 * Returns 0, or -1 out of memory or when a value would overflow.
 */
static int counts_merge(const struct etcd_count *old, size_t no, const struct etcd_count *add,
			size_t na, char **out, size_t *olen)
{
	size_t cap = 1, len = 0, i = 0, j = 0;
	char *buf;

	for (size_t k = 0; k < no; k++)
		cap += old[k].flen + 44;
	for (size_t k = 0; k < na; k++)
		cap += add[k].flen + 44;
	if (!(buf = malloc(cap)))
		return -1;
	while (i < no || j < na) {
		int r = i == no ? 1 : j == na ? -1 : count_cmp(&old[i], &add[j]);
		const struct etcd_count *e = r <= 0 ? &old[i] : &add[j];
		long long v = e->value;

		if (r == 0 && __builtin_add_overflow(v, add[j].value, &v)) {
			free(buf);
			return -1;
		}
		len += (size_t)snprintf(buf + len, cap - len, "%zu:", e->flen);
		memcpy(buf + len, e->field, e->flen);
		len += e->flen;
		len += (size_t)snprintf(buf + len, cap - len, "=%lld\n", v);
		i += r <= 0;
		j += r >= 0;
	}
	*out = buf;
	*olen = len;
	return 0;
}

/* Returns the raw name of count key key[0..klen) under bc's prefix,
 * <prefix>%metrics/<escaped key> (malloc'd, the caller frees it; NULL out
 * of memory), its length in *len. */
static unsigned char *metrics_name(const struct backend_config *bc, const char *key,
				   size_t klen, size_t *len)
{
	size_t plen = strlen(bc->spec->prefix), mlen = strlen(ETCD_METRICS);
	unsigned char *k = malloc(plen + mlen + 3 * klen + 1);

	if (!k)
		return NULL;
	memcpy(k, bc->spec->prefix, plen);
	memcpy(k + plen, ETCD_METRICS, mlen);
	*len = plen + mlen + key_escape(key, klen, k + plen + mlen);
	return k;
}

/* Remembers v[0..n) (NULL: none) as c's count key's value at mod revision
 * rev. Returns 0, or -1 out of memory (then nothing is remembered). */
static int count_seen(struct backend_conn *c, const char *v, size_t n, long long rev)
{
	char *copy = n ? malloc(n) : NULL;

	if (n && !copy) {
		c->mrev = c->mlen = 0;
		return -1;
	}
	if (n)
		memcpy(copy, v, n);
	free(c->mval);
	c->mval = copy;
	c->mlen = n;
	c->mrev = rev;
	return 0;
}

/*
 * Reads the failed count transaction's range (the key's value and mod
 * revision now; none: absent) into what c remembers. Returns BACKEND_OK
 * or BACKEND_ERR.
 */
static int count_reread(struct backend_conn *c)
{
	json_object *r = nth_range(c->doc, 0), *kv = reply_nth(r, "kvs", 0);
	const char *v = "";
	size_t vl = 0;
	char *raw;
	long long rev = 0;
	int rc;

	if (!r || (kv && (reply_int(kv, "mod_revision", 0, &rev) || rev <= 0)))
		return fail(c, "metrics", "unexpected reply");
	if (kv)
		reply_str(kv, "value", &v, &vl);
	if (!(raw = malloc(vl / 4 * 3 + 3)))
		return fail(c, "metrics", "out of memory");
	rc = count_seen(c, raw, b64_decode(v, vl, raw, vl / 4 * 3 + 3), rev);
	free(raw);
	return rc ? fail(c, "metrics", "out of memory") : BACKEND_OK;
}

/*
 * One attempt at the count key (base64 k): the value c remembers plus
 * add[0..na), put if the key's mod revision is still the one remembered;
 * else the key's value now read (for the next attempt). Returns 1 done, 0
 * lost the compare, or BACKEND_ERR.
 */
static int count_try(struct backend_conn *c, const char *k, const struct etcd_count *add,
		     size_t na)
{
	struct etcd_count *old = NULL;
	size_t no = 0, nlen = 0, blen;
	char *next = NULL, *b64 = NULL, *body = NULL;
	int rc = BACKEND_ERR, p = counts_parse(c->mval, c->mlen, &old, &no);

	if (p == -1)
		fail(c, "metrics", "the host's key holds a value not of lockshim's format");
	else if (p || counts_merge(old, no, add, na, &next, &nlen))
		fail(c, "metrics", p ? "out of memory" : "out of memory, or a count overflows");
	else if (nlen > ETCD_COUNT_VALUE_MAX)
		fail(c, "metrics", "the host's counts take more than 3 MiB");
	else if (!(b64 = malloc(ETCD_B64(nlen))) ||
		 !(body = malloc(blen = 3 * strlen(k) + ETCD_B64(nlen) + 256)))
		fail(c, "metrics", "out of memory");
	else {
		b64_encode((const unsigned char *)next, nlen, b64);
		snprintf(body, blen, "{\"compare\":[{\"target\":\"MOD\",\"key\":\"%s\","
			 "\"mod_revision\":\"%lld\",\"result\":\"EQUAL\"}],\"success\":[{"
			 "\"request_put\":{\"key\":\"%s\",\"value\":\"%s\"}}],\"failure\":[{"
			 "\"request_range\":{\"key\":\"%s\"}}]}", k, c->mrev, k, b64, k);
		if (command_body(c, body, ETCD_COUNT_REPLY_MAX, "/v3/kv/txn", "metrics") ==
		    BACKEND_OK) {
			int put = reply_bool(c->doc, "succeeded");
			long long rev = reply_revision(c->doc);

			if (put < 0 || (put && rev <= 0))
				fail(c, "metrics", "unexpected reply");
			else if (put)
				rc = count_seen(c, next, nlen, rev) ? fail(c, "metrics", "out of "
									   "memory") : 1;
			else
				rc = count_reread(c) == BACKEND_OK ? 0 : BACKEND_ERR;
		}
	}
	free(old);
	free(next);
	free(b64);
	free(body);
	return rc;
}

/*
 * .count: adds deltas[i] to fields[i] of the host's count key
 * <prefix>%metrics/<escaped key>, in one transaction that puts the value
 * c last saw plus the deltas if the key's mod revision is still the one
 * it saw; lost (another process of the host wrote), the transaction's
 * failure branch reads the value anew, and it is tried again
 * (ETCD_COUNT_TRIES at most): no increment is lost, and a shipment is
 * one round trip while c's view is current. Past etcd's request limit
 * (--max-request-bytes, 1.5 MiB by default) etcd refuses the put
 * ("request is too large"): every shipment of that host fails from then
 * on, its counts staying in its processes. A transaction applied whose
 * answer was lost (sent again by command(), or shipped again by the
 * shim) counts twice. Returns BACKEND_OK or BACKEND_ERR.
 */
static int etcd_count(struct backend_conn *c, const char *key, size_t klen, int n,
		      const char *const *fields, const size_t *flens, const long long *deltas)
{
	struct etcd_count *add = malloc((size_t)(n > 0 ? n : 1) * sizeof(*add));
	size_t len = 0, na = 0;
	unsigned char *name = metrics_name(c->bc, key, klen, &len);
	char *k = name ? malloc(ETCD_B64(len)) : NULL;
	int rc = 0;

	if (!add || !k) {
		rc = fail(c, "metrics", "out of memory");
		goto out;
	}
	for (int i = 0; i < n; i++)
		add[i] = (struct etcd_count){ fields[i], flens[i], deltas[i] };
	qsort(add, (size_t)n, sizeof(*add), count_cmp);
	for (int i = 0; i < n; i++) /* one entry per field: the deltas summed */
		if (na && !count_cmp(&add[na - 1], &add[i]))
			add[na - 1].value += add[i].value;
		else
			add[na++] = add[i];
	if (!c->mkey || c->mklen != klen || memcmp(c->mkey, key, klen)) {
		free(c->mkey);
		c->mklen = 0;
		if (!(c->mkey = malloc(klen + 1)) || count_seen(c, NULL, 0, 0)) {
			rc = fail(c, "metrics", "out of memory");
			goto out;
		}
		memcpy(c->mkey, key, klen);
		c->mklen = klen;
	}
	b64_encode(name, len, k);
	for (int i = 0; rc == 0 && i < ETCD_COUNT_TRIES; i++)
		rc = count_try(c, k, add, na);
	if (rc == 0)
		rc = fail(c, "metrics", "the host's key changed under every attempt");
out:
	free(add);
	free(name);
	free(k);
	return rc == 1 ? BACKEND_OK : BACKEND_ERR;
}

/*
 * Calls fn for each field of kv (a count key of the gateway's reply, under
 * the metrics name m[0..mlen)): its key unescaped, its value parsed.
 * Returns BACKEND_OK or BACKEND_ERR.
 */
static int count_report(struct backend_conn *c, json_object *kv, size_t mlen,
			void (*fn)(void *arg, const char *key, size_t klen, const char *field,
				   size_t flen, long long value),
			void *arg)
{
	const char *k, *v = "";
	size_t kl, vl = 0, rawlen, vlen, ne = 0;
	char *raw = NULL, *val = NULL;
	struct etcd_count *e = NULL;
	int rc = BACKEND_ERR, p;

	if (!reply_str(kv, "key", &k, &kl))
		return fail(c, "metrics", "unexpected reply");
	reply_str(kv, "value", &v, &vl);
	if (!(raw = malloc(kl / 4 * 3 + 3)) || !(val = malloc(vl / 4 * 3 + 3))) {
		fail(c, "metrics", "out of memory");
		goto out;
	}
	rawlen = b64_decode(k, kl, raw, kl / 4 * 3 + 3);
	vlen = b64_decode(v, vl, val, vl / 4 * 3 + 3);
	if (rawlen < mlen || (p = counts_parse(val, vlen, &e, &ne)) == -1) {
		fail(c, "metrics", "a host's key holds a value not of lockshim's format");
		goto out;
	}
	if (p) {
		fail(c, "metrics", "out of memory");
		goto out;
	}
	rawlen = name_unescape(raw + mlen, rawlen - mlen, raw);
	for (size_t i = 0; i < ne; i++)
		fn(arg, raw, rawlen, e[i].field, e[i].flen, e[i].value);
	rc = BACKEND_OK;
out:
	free(raw);
	free(val);
	free(e);
	return rc;
}

/*
 * .count_read: every host's count key of namespace ns, in one range read
 * of [<prefix>%metrics/<escaped ns>:metrics:{, ...|) (its reply at most
 * ETCD_METRICS_READ_MAX bytes, "metrics: reply too long" past it), each
 * field to fn. Returns BACKEND_OK or BACKEND_ERR.
 */
static int etcd_count_read(struct backend_conn *c, const char *ns,
			   void (*fn)(void *arg, const char *key, size_t klen, const char *field,
				      size_t flen, long long value),
			   void *arg)
{
	char head[KEY_MAX_NAMESPACE + 16];
	size_t hlen = (size_t)snprintf(head, sizeof(head), "%s:metrics:{", ns), len, mlen;
	unsigned char *name = hlen < sizeof(head) ? metrics_name(c->bc, head, hlen, &len) : NULL;
	char from[ETCD_B64(ETCD_KEY_MAX)], to[ETCD_B64(ETCD_KEY_MAX)];
	json_object *kv;
	int rc = BACKEND_OK;

	if (!name)
		return fail(c, "metrics", hlen < sizeof(head) ? "out of memory" :
			    "namespace too long");
	mlen = strlen(c->bc->spec->prefix) + strlen(ETCD_METRICS);
	b64_encode(name, len, from);
	name[len - 1]++;
	b64_encode(name, len, to);
	free(name);
	snprintf(c->body, sizeof(c->body), "{\"key\":\"%s\",\"range_end\":\"%s\"}", from, to);
	if (command_body(c, c->body, ETCD_METRICS_READ_MAX, "/v3/kv/range", "metrics") !=
	    BACKEND_OK)
		return BACKEND_ERR;
	if (reply_revision(c->doc) <= 0)
		return fail(c, "metrics", "unexpected reply");
	for (size_t i = 0; rc == BACKEND_OK && (kv = reply_nth(c->doc, "kvs", i)); i++)
		rc = count_report(c, kv, mlen, fn, arg);
	return rc;
}

static const struct backend_ops etcd_ops = {
	.name = "etcd",
	.watched = 1,
	.store = "etcd",
	/* .settings: the core's group (backend_init sets it in its copy) */
	.serves = etcd_serves,
	.config_new = etcd_config_new,
	.config_free = etcd_config_free,
	.open = etcd_open,
	.describe = etcd_describe,
	.close = etcd_close,
	.acquire = etcd_acquire,
	.release = etcd_release,
	.wait = etcd_wait,
	.leave = etcd_leave,
	.flush = etcd_flush,
	.unconfirmed = etcd_unconfirmed,
	.renew = etcd_renew,
	.errstr = etcd_errstr,
	.ping = etcd_ping,
	.holders = etcd_holders,
	.count = etcd_count,
	.count_read = etcd_count_read,
};

__attribute__((visibility("default")))
const struct backend_module lockshim_backend_etcd = {
	.abi = BACKEND_MODULE_ABI,
	.ops = &etcd_ops,
	.bind = etcd_bind,
};
