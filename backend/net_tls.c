/* SPDX-License-Identifier: MIT */
/*
 * net_tls.c - TLS on the shim's sockets (see net_tls.h), with mbedTLS 2.28
 * linked statically with hidden symbols: the program's own TLS library
 * never sees or binds them. What connections share is built once per
 * process, at the first TLS connect: the mbedtls_ssl_config with the CA
 * chain and the client certificate, published by a compare-and-swap (a
 * thread losing the race frees its copy). Handshakes take turns (hs_mu:
 * mbedTLS fills caches in shared keys at first use). Randomness is the
 * kernel's (getrandom): no DRBG to seed, lock or reseed in a fork child.
 * Each connection has its own mbedtls_ssl_context and a read-ahead buffer.
 * The handshake uses MSG_DONTWAIT and polls up to the connect deadline;
 * records then go through the blocking socket and its timeouts, reads by
 * the deadline of net.c's last send (its flags callback), sends with
 * MSG_NOSIGNAL. mbedTLS 2.28 matches DNS names only: an IP address is
 * checked here against the certificate's iPAddress SANs.
 */
#include "net_tls.h"

#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <mbedtls/asn1.h>
#include <mbedtls/error.h>
#include <mbedtls/net_sockets.h>
#include <mbedtls/pk.h>
#include <mbedtls/ssl.h>
#include <mbedtls/x509_crt.h>

#include "backend_redis_conf.h"
#include "fdown.h"
#include "util.h"

/* Debian's ca-certificates bundle: the system's CA store. */
#define SYSTEM_CA_FILE "/etc/ssl/certs/ca-certificates.crt"

/* Cipher suites offered first: AES-GCM runs on AES-NI and PCLMULQDQ, where
 * mbedTLS's ChaCha20 (preferred by default) is plain C. The server picks. */
static const int fast_suites[] = {
	MBEDTLS_TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, MBEDTLS_TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
	MBEDTLS_TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384, MBEDTLS_TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
};
#define NSUITES_MAX 256

struct tls_shared {
	mbedtls_ssl_config conf;
	mbedtls_x509_crt ca, cert;
	mbedtls_pk_context key;
	int has_cert;
	int suites[NSUITES_MAX + 1]; /* fast_suites, then the rest of mbedTLS's list */
};

/* A connection reads ahead into a buffer of this size: mbedTLS asks for a
 * record's header and then its body, and a reply's records usually come
 * in one segment, so one recv(2) serves them all. */
#define READ_AHEAD 4096

struct net_tls {
	mbedtls_ssl_context ssl;
	struct fdown *own;
	int handshaking; /* MSG_DONTWAIT: the handshake polls */
	int (*flags)(void *arg); /* net_tls_recv's: the flags of each recv */
	void *flags_arg;
	int err;         /* errno of the last failed socket call */
	int first;       /* first byte received, -1 before */
	int failed;      /* a send or a record failed: the session is unusable */
	int has_cert;
	size_t rpos, rlen; /* read ahead: rbuf[rpos, rlen) not given to mbedTLS yet */
	unsigned char rbuf[READ_AHEAD];
	size_t iplen;    /* name is an IP address of iplen bytes (ip) */
	unsigned char ip[16];
	char name[256];  /* the name verified */
};

static struct tls_shared *shared;

/* f_rng: the kernel's CSPRNG. */
static int rng(void *unused, unsigned char *out, size_t len)
{
	(void)unused;
	while (len > 0) {
		ssize_t n = getrandom(out, len, 0);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			return MBEDTLS_ERR_SSL_INTERNAL_ERROR;
		}
		out += n;
		len -= (size_t)n;
	}
	return 0;
}

/* Describes mbedTLS error ret in why after prefix. Returns -1. */
static int why_mbedtls(char *why, size_t len, const char *prefix, int ret)
{
	char text[128];

	mbedtls_strerror(ret, text, sizeof(text));
	snprintf(why, len, "TLS: %s%s", prefix, text);
	return -1;
}

/* Checks that path can be read, naming the setting. Returns 0 or -1. */
static int readable(const char *path, const char *setting, char *why, size_t len)
{
	if (access(path, R_OK) == 0)
		return 0;
	snprintf(why, len, "TLS: cannot read redis.tls.%s %s: %s", setting, path, strerror(errno));
	return -1;
}

/* Loads the CAs to trust into s->ca. Returns 0 or -1. */
static int load_ca(struct tls_shared *s, const struct backend_tls *cfg, char *why, size_t len)
{
	char what[64];
	int ret;

	if (!cfg->ca_file && !cfg->ca_dir) {
		if (access(SYSTEM_CA_FILE, R_OK) != 0) {
			snprintf(why, len, "TLS: no CA store: %s: %s (install ca-certificates, "
				 "or set redis.tls.ca_file)", SYSTEM_CA_FILE, strerror(errno));
			return -1;
		}
		ret = mbedtls_x509_crt_parse_file(&s->ca, SYSTEM_CA_FILE);
		snprintf(what, sizeof(what), "the system's CA store %s", SYSTEM_CA_FILE);
	} else {
		ret = 0;
		if (cfg->ca_file) {
			if (readable(cfg->ca_file, "ca_file", why, len) != 0)
				return -1;
			ret = mbedtls_x509_crt_parse_file(&s->ca, cfg->ca_file);
			if (ret < 0) {
				snprintf(what, sizeof(what), "cannot load redis.tls.ca_file: ");
				return why_mbedtls(why, len, what, ret);
			}
		}
		if (cfg->ca_dir) {
			if (readable(cfg->ca_dir, "ca_dir", why, len) != 0)
				return -1;
			ret = mbedtls_x509_crt_parse_path(&s->ca, cfg->ca_dir);
		}
		snprintf(what, sizeof(what), "redis.tls.%s", cfg->ca_dir ? "ca_dir" : "ca_file");
	}
	/* A bundle may hold certificates mbedTLS cannot parse (ret > 0 of
	 * them); what matters is that some CA was loaded. */
	if (ret < 0 && s->ca.version == 0) {
		char pre[96];

		snprintf(pre, sizeof(pre), "cannot load %s: ", what);
		return why_mbedtls(why, len, pre, ret);
	}
	if (s->ca.version == 0) {
		snprintf(why, len, "TLS: no CA certificate in %s", what);
		return -1;
	}
	mbedtls_ssl_conf_ca_chain(&s->conf, &s->ca, NULL);
	return 0;
}

/* Loads the client certificate and its key. Returns 0 or -1. */
static int load_cert(struct tls_shared *s, const struct backend_tls *cfg, char *why, size_t len)
{
	int ret;

	if (readable(cfg->cert_file, "cert_file", why, len) != 0 ||
	    readable(cfg->key_file, "key_file", why, len) != 0)
		return -1;
	if ((ret = mbedtls_x509_crt_parse_file(&s->cert, cfg->cert_file)) != 0)
		return why_mbedtls(why, len, "cannot load redis.tls.cert_file: ", ret);
	if ((ret = mbedtls_pk_parse_keyfile(&s->key, cfg->key_file, NULL)) != 0)
		return why_mbedtls(why, len, "cannot load redis.tls.key_file (a PEM or DER key "
				   "without a passphrase): ", ret);
	if (mbedtls_pk_check_pair(&s->cert.pk, &s->key) != 0) {
		snprintf(why, len, "TLS: redis.tls.key_file is not the key of cert_file");
		return -1;
	}
	if ((ret = mbedtls_ssl_conf_own_cert(&s->conf, &s->cert, &s->key)) != 0)
		return why_mbedtls(why, len, "client certificate: ", ret);
	s->has_cert = 1;
	return 0;
}

static void shared_free(struct tls_shared *s)
{
	mbedtls_ssl_config_free(&s->conf);
	mbedtls_x509_crt_free(&s->ca);
	mbedtls_x509_crt_free(&s->cert);
	mbedtls_pk_free(&s->key);
	free(s);
}

/*
 * Handshakes run one at a time: mbedTLS 2.28 writes into shared keys at
 * their first use (an EC key's group caches its comb table, an RSA key its
 * Montgomery constant), and the CA chain and the client key are shared. A
 * handshake call never waits for I/O (MSG_DONTWAIT), so hs_mu is held for
 * CPU work only; fork takes it first (atfork), so a child never inherits
 * it held, nor a key half written.
 */
static pthread_mutex_t hs_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

static void hs_lock(void)
{
	pthread_mutex_lock(&hs_mu);
}

static void hs_unlock(void)
{
	pthread_mutex_unlock(&hs_mu);
}

static void atfork_register(void)
{
	pthread_atfork(hs_lock, hs_unlock, hs_unlock);
}

/* Orders mbedTLS's cipher suites into s->suites, fast_suites first. */
static void order_suites(struct tls_shared *s)
{
	const int *all = mbedtls_ssl_list_ciphersuites();
	size_t n = 0, k;

	for (k = 0; k < sizeof(fast_suites) / sizeof(fast_suites[0]); k++)
		for (const int *a = all; *a; a++)
			if (*a == fast_suites[k])
				s->suites[n++] = *a;
	for (const int *a = all; *a && n < NSUITES_MAX; a++) {
		for (k = 0; k < sizeof(fast_suites) / sizeof(fast_suites[0]); k++)
			if (*a == fast_suites[k])
				break;
		if (k == sizeof(fast_suites) / sizeof(fast_suites[0]))
			s->suites[n++] = *a;
	}
	s->suites[n] = 0;
	mbedtls_ssl_conf_ciphersuites(&s->conf, s->suites);
}

/* Returns the process's shared settings, built from cfg at the first call
 * (again after a failure), or NULL with the cause in why. */
static struct tls_shared *shared_get(const struct backend_tls *cfg, char *why, size_t len)
{
	static const mbedtls_ecp_group_id curves[] = {
		MBEDTLS_ECP_DP_CURVE25519, MBEDTLS_ECP_DP_SECP256R1, MBEDTLS_ECP_DP_SECP384R1,
		MBEDTLS_ECP_DP_SECP521R1, MBEDTLS_ECP_DP_NONE,
	};
	struct tls_shared *s = __atomic_load_n(&shared, __ATOMIC_ACQUIRE), *none = NULL;
	int ret;

	if (s)
		return s;
	pthread_once(&atfork_once, atfork_register);
	if (!(s = calloc(1, sizeof(*s)))) {
		snprintf(why, len, "TLS: out of memory");
		return NULL;
	}
	mbedtls_ssl_config_init(&s->conf);
	mbedtls_x509_crt_init(&s->ca);
	mbedtls_x509_crt_init(&s->cert);
	mbedtls_pk_init(&s->key);
	ret = mbedtls_ssl_config_defaults(&s->conf, MBEDTLS_SSL_IS_CLIENT,
					  MBEDTLS_SSL_TRANSPORT_STREAM, MBEDTLS_SSL_PRESET_DEFAULT);
	if (ret != 0) {
		why_mbedtls(why, len, "", ret);
		goto fail;
	}
	mbedtls_ssl_conf_min_version(&s->conf, MBEDTLS_SSL_MAJOR_VERSION_3,
				     MBEDTLS_SSL_MINOR_VERSION_3); /* TLS 1.2 */
	mbedtls_ssl_conf_rng(&s->conf, rng, NULL);
	mbedtls_ssl_conf_curves(&s->conf, curves);
	order_suites(s);
	mbedtls_ssl_conf_authmode(&s->conf, cfg->verify ? MBEDTLS_SSL_VERIFY_REQUIRED
							: MBEDTLS_SSL_VERIFY_NONE);
	if ((cfg->verify && load_ca(s, cfg, why, len) != 0) ||
	    (cfg->cert_file && load_cert(s, cfg, why, len) != 0))
		goto fail;
	if (__atomic_compare_exchange_n(&shared, &none, s, 0, __ATOMIC_ACQ_REL,
					__ATOMIC_ACQUIRE))
		return s;
	shared_free(s); /* another thread was first */
	return none;
fail:
	shared_free(s);
	return NULL;
}

/* After a send or recv failed with errno: remembers it, and returns want
 * for EAGAIN (the timeout, or the handshake's turn to poll), else fail. */
static int sock_failed(struct net_tls *t, int want, int fail)
{
	t->err = errno;
	return errno == EAGAIN || errno == EWOULDBLOCK ? want : fail;
}

/* The BIO: plain send/recv on the descriptor net.c owns. */
static int bio_send(void *ctx, const unsigned char *buf, size_t len)
{
	struct net_tls *t = ctx;
	int flags = MSG_NOSIGNAL | (t->handshaking ? MSG_DONTWAIT : 0);
	ssize_t n;

	while ((n = send(t->own->fd, buf, len, flags)) < 0)
		if (errno != EINTR)
			return sock_failed(t, MBEDTLS_ERR_SSL_WANT_WRITE, MBEDTLS_ERR_NET_SEND_FAILED);
	return (int)n;
}

/* Reads what the socket has, up to the free end of rbuf. Returns the
 * bytes read (0: closed by the server) or a mbedTLS error. */
static int read_ahead(struct net_tls *t)
{
	ssize_t n;
	int flags;

	do {
		flags = t->handshaking ? MSG_DONTWAIT : t->flags ? t->flags(t->flags_arg) : 0;
		n = flags < 0 ? -1 : recv(t->own->fd, t->rbuf + t->rlen,
					  sizeof(t->rbuf) - t->rlen, flags);
	} while (n < 0 && errno == EINTR);
	if (n < 0)
		return sock_failed(t, MBEDTLS_ERR_SSL_WANT_READ, MBEDTLS_ERR_NET_RECV_FAILED);
	if (n > 0 && t->first < 0)
		t->first = t->rbuf[t->rlen];
	t->rlen += (size_t)n;
	return (int)n;
}

static int bio_recv(void *ctx, unsigned char *buf, size_t len)
{
	struct net_tls *t = ctx;
	size_t n;

	if (t->rpos == t->rlen) {
		int rc;

		t->rpos = t->rlen = 0;
		if ((rc = read_ahead(t)) <= 0)
			return rc;
	}
	n = t->rlen - t->rpos < len ? t->rlen - t->rpos : len;
	memcpy(buf, t->rbuf + t->rpos, n);
	t->rpos += n;
	return (int)n;
}

/* Whether crt names ip (iplen bytes) in an iPAddress subjectAltName. */
static int crt_has_ip(const mbedtls_x509_crt *crt, const unsigned char *ip, size_t iplen)
{
	static const unsigned char san_oid[] = { 0x55, 0x1d, 0x11 }; /* 2.5.29.17 */
	unsigned char *p = crt->v3_ext.p, *end, *ext_end, *names_end;
	size_t len;

	if (!p || mbedtls_asn1_get_tag(&p, p + crt->v3_ext.len, &len,
				       MBEDTLS_ASN1_CONSTRUCTED | MBEDTLS_ASN1_SEQUENCE) != 0)
		return 0;
	for (end = p + len; p < end; p = ext_end) {
		if (mbedtls_asn1_get_tag(&p, end, &len,
					 MBEDTLS_ASN1_CONSTRUCTED | MBEDTLS_ASN1_SEQUENCE) != 0)
			return 0;
		ext_end = p + len;
		if (mbedtls_asn1_get_tag(&p, ext_end, &len, MBEDTLS_ASN1_OID) != 0)
			return 0;
		if (len != sizeof(san_oid) || memcmp(p, san_oid, len) != 0)
			continue;
		p += len;
		if (p < ext_end && *p == MBEDTLS_ASN1_BOOLEAN && /* critical */
		    mbedtls_asn1_get_tag(&p, ext_end, &len, MBEDTLS_ASN1_BOOLEAN) == 0)
			p += len;
		if (mbedtls_asn1_get_tag(&p, ext_end, &len, MBEDTLS_ASN1_OCTET_STRING) != 0 ||
		    mbedtls_asn1_get_tag(&p, ext_end, &len,
					 MBEDTLS_ASN1_CONSTRUCTED | MBEDTLS_ASN1_SEQUENCE) != 0)
			return 0;
		for (names_end = p + len; p < names_end; p += len) {
			int tag = *p++;

			if (mbedtls_asn1_get_len(&p, names_end, &len) != 0)
				return 0;
			if (tag == (MBEDTLS_ASN1_CONTEXT_SPECIFIC | 7) && len == iplen &&
			    memcmp(p, ip, iplen) == 0)
				return 1;
		}
		return 0;
	}
	return 0;
}

/* Verify callback when the name is an IP address: the leaf must hold it. */
static int verify_ip(void *ctx, mbedtls_x509_crt *crt, int depth, uint32_t *flags)
{
	struct net_tls *t = ctx;

	if (depth == 0 && !crt_has_ip(crt, t->ip, t->iplen))
		*flags |= MBEDTLS_X509_BADCERT_CN_MISMATCH;
	return 0;
}

/* Writes the causes of a failed verification (flags) into why. */
static void why_verify(const struct net_tls *t, uint32_t flags, char *why, size_t len)
{
	static const struct {
		uint32_t flags;
		const char *text;
	} causes[] = {
		{ MBEDTLS_X509_BADCERT_NOT_TRUSTED, "certificate not trusted (unknown CA)" },
		{ MBEDTLS_X509_BADCERT_EXPIRED, "certificate expired" },
		{ MBEDTLS_X509_BADCERT_FUTURE, "certificate not valid yet" },
		{ MBEDTLS_X509_BADCERT_CN_MISMATCH, "certificate name mismatch: expected " },
		{ MBEDTLS_X509_BADCERT_REVOKED, "certificate revoked" },
		{ MBEDTLS_X509_BADCERT_KEY_USAGE | MBEDTLS_X509_BADCERT_EXT_KEY_USAGE |
		  MBEDTLS_X509_BADCERT_NS_CERT_TYPE, "certificate not meant for a TLS server" },
		{ MBEDTLS_X509_BADCERT_BAD_MD | MBEDTLS_X509_BADCERT_BAD_PK |
		  MBEDTLS_X509_BADCERT_BAD_KEY, "certificate signed with an algorithm or a key "
		  "size mbedTLS refuses" },
	};
	size_t n = (size_t)snprintf(why, len, "TLS: ");

	for (size_t i = 0; i < sizeof(causes) / sizeof(causes[0]) && n < len; i++) {
		if (!(flags & causes[i].flags))
			continue;
		flags &= ~causes[i].flags;
		n += (size_t)snprintf(why + n, len - n, "%s%s%s", n > 5 ? "; " : "",
				      causes[i].text,
				      causes[i].flags == MBEDTLS_X509_BADCERT_CN_MISMATCH ? t->name
											 : "");
	}
	if (flags && n < len) { /* anything else, in mbedTLS's words */
		char rest[256], *nl;

		mbedtls_x509_crt_verify_info(rest, sizeof(rest), "", flags);
		while ((nl = strchr(rest, '\n')))
			*nl = nl[1] ? ';' : '\0';
		snprintf(why + n, len - n, "%s%s", n > 5 ? "; " : "", rest);
	}
}

static const char *alert_name(int a)
{
	switch (a) {
	case 10: return "unexpected_message";
	case 20: return "bad_record_mac";
	case 40: return "handshake_failure";
	case 42: return "bad_certificate";
	case 43: return "unsupported_certificate";
	case 44: return "certificate_revoked";
	case 45: return "certificate_expired";
	case 46: return "certificate_unknown";
	case 47: return "illegal_parameter";
	case 48: return "unknown_ca";
	case 49: return "access_denied";
	case 50: return "decode_error";
	case 51: return "decrypt_error";
	case 70: return "protocol_version";
	case 71: return "insufficient_security";
	case 80: return "internal_error";
	case 112: return "unrecognized_name";
	case 116: return "certificate_required";
	default: return "unknown alert";
	}
}

/* After a send failed during the handshake: the server may have sent a
 * fatal alert and closed (a client certificate missing, say) while the
 * client was still writing. Returns the alert's description, or -1. */
static int alert_left(struct net_tls *t)
{
	const unsigned char *rec = t->rbuf + t->rpos;

	if (t->rlen - t->rpos < 7 && fdown_check(t->own) && t->rlen < sizeof(t->rbuf))
		read_ahead(t);
	if (t->rlen - t->rpos < 7)
		return -1;
	return rec[0] == MBEDTLS_SSL_MSG_ALERT && rec[3] == 0 && rec[4] == 2 &&
	       rec[5] == MBEDTLS_SSL_ALERT_LEVEL_FATAL ? rec[6] : -1;
}

/* Writes why the handshake failed with ret into why. */
static void why_handshake(struct net_tls *t, int ret, char *why, size_t len)
{
	int alert = ret == MBEDTLS_ERR_SSL_FATAL_ALERT_MESSAGE ? t->ssl.in_msg[1] :
		    ret == MBEDTLS_ERR_NET_SEND_FAILED ? alert_left(t) : -1;

	if (ret == MBEDTLS_ERR_X509_CERT_VERIFY_FAILED) {
		why_verify(t, mbedtls_ssl_get_verify_result(&t->ssl), why, len);
	} else if (t->first >= 0 && (t->first < 20 || t->first > 23)) {
		/* not a TLS record type: Redis answering "-ERR ..." in plain text */
		snprintf(why, len, "TLS: the server answered in plain text (a port without TLS?)");
	} else if (alert >= 0 && t->ssl.client_auth && !t->has_cert) {
		snprintf(why, len, "TLS: the server requires a client certificate (alert %s): "
			 "set redis.tls.cert_file and key_file", alert_name(alert));
	} else if (alert >= 0 && t->ssl.client_auth) {
		snprintf(why, len, "TLS: the server refused the client certificate (alert %s)",
			 alert_name(alert));
	} else if (alert >= 0) {
		snprintf(why, len, "TLS: the server refused the handshake (alert %s)",
			 alert_name(alert));
	} else if (ret == MBEDTLS_ERR_SSL_CONN_EOF || (t->err && ret == MBEDTLS_ERR_NET_RECV_FAILED)) {
		snprintf(why, len, "TLS: the server closed the connection during the handshake%s",
			 t->first < 0 ? " (not a TLS port?)" : "");
	} else if (t->err && ret == MBEDTLS_ERR_NET_SEND_FAILED) {
		snprintf(why, len, "TLS: handshake: %s", strerror(t->err));
	} else {
		why_mbedtls(why, len, "handshake: ", ret);
	}
}

/* Runs the handshake by deadline. Returns 0 or -1 (why set). */
static int handshake(struct net_tls *t, int64_t deadline, char *why, size_t len)
{
	int ret;

	t->handshaking = 1;
	for (;;) {
		struct pollfd p = { .fd = t->own->fd };
		int64_t left;
		int n;

		hs_lock();
		ret = mbedtls_ssl_handshake(&t->ssl);
		hs_unlock();
		if (ret == 0)
			break;
		left = deadline - util_now_ms();

		if (ret != MBEDTLS_ERR_SSL_WANT_READ && ret != MBEDTLS_ERR_SSL_WANT_WRITE) {
			why_handshake(t, ret, why, len);
			return -1;
		}
		p.events = ret == MBEDTLS_ERR_SSL_WANT_READ ? POLLIN : POLLOUT;
		if (!fdown_check(t->own)) {
			snprintf(why, len, "socket closed or replaced by the program");
			return -1;
		}
		n = left > 0 ? poll(&p, 1, (int)left) : 0;
		if (n == 0 && t->first < 0) {
			snprintf(why, len, "TLS: no answer to the handshake within "
				 "redis.connect_timeout_ms (a port without TLS?)");
			return -1;
		}
		if (n == 0) {
			snprintf(why, len, "TLS: handshake timed out (redis.connect_timeout_ms)");
			return -1;
		}
		if (n < 0 && errno != EINTR) {
			snprintf(why, len, "TLS: handshake: poll: %s", strerror(errno));
			return -1;
		}
	}
	t->handshaking = 0;
	return 0;
}

struct net_tls *net_tls_open(struct fdown *own, const struct backend_tls *cfg, const char *name,
			     int64_t deadline, char *why, size_t whylen)
{
	struct tls_shared *s = shared_get(cfg, why, whylen);
	struct net_tls *t;
	int ret;

	if (!s)
		return NULL;
	if (!(t = calloc(1, sizeof(*t)))) {
		snprintf(why, whylen, "TLS: out of memory");
		return NULL;
	}
	mbedtls_ssl_init(&t->ssl);
	t->own = own;
	t->first = -1;
	t->has_cert = s->has_cert;
	snprintf(t->name, sizeof(t->name), "%s", name);
	if (inet_pton(AF_INET, name, t->ip) == 1)
		t->iplen = 4;
	else if (inet_pton(AF_INET6, name, t->ip) == 1)
		t->iplen = 16;
	if ((ret = mbedtls_ssl_setup(&t->ssl, &s->conf)) != 0) {
		why_mbedtls(why, whylen, "", ret);
		goto fail;
	}
	/* A DNS name goes into SNI and is verified by mbedTLS; an IP address is
	 * not sent (RFC 6066) and is verified by verify_ip. */
	if (t->iplen)
		mbedtls_ssl_set_verify(&t->ssl, verify_ip, t);
	else if ((ret = mbedtls_ssl_set_hostname(&t->ssl, name)) != 0) {
		why_mbedtls(why, whylen, "server name: ", ret);
		goto fail;
	}
	mbedtls_ssl_set_bio(&t->ssl, t, bio_send, bio_recv, NULL);
	if (handshake(t, deadline, why, whylen) != 0)
		goto fail;
	return t;
fail:
	net_tls_free(t);
	return NULL;
}

/* A failed record operation ret: the errno for net.c, or the cause in
 * why. Returns -1. */
static int io_failed(struct net_tls *t, int ret, int *e, char *why, size_t len)
{
	*e = 0;
	if (ret != MBEDTLS_ERR_SSL_WANT_READ) /* a timed-out read can be resumed */
		t->failed = 1;
	if (ret == MBEDTLS_ERR_SSL_CONN_EOF || ret == MBEDTLS_ERR_SSL_PEER_CLOSE_NOTIFY)
		snprintf(why, len, "Server closed the connection");
	else if ((ret == MBEDTLS_ERR_SSL_WANT_READ || ret == MBEDTLS_ERR_SSL_WANT_WRITE ||
		  ret == MBEDTLS_ERR_NET_SEND_FAILED || ret == MBEDTLS_ERR_NET_RECV_FAILED) && t->err)
		*e = t->err;
	else if (ret == MBEDTLS_ERR_SSL_FATAL_ALERT_MESSAGE)
		snprintf(why, len, "TLS: the server sent alert %s",
			 alert_name(t->ssl.in_msg ? t->ssl.in_msg[1] : 0));
	else
		why_mbedtls(why, len, "", ret);
	return -1;
}

int net_tls_send(struct net_tls *t, const void *buf, size_t len, int *e, char *why,
		 size_t whylen)
{
	const unsigned char *p = buf;

	if (t->failed) {
		*e = 0;
		snprintf(why, whylen, "TLS: the session failed earlier");
		return -1;
	}
	t->err = 0;
	while (len > 0) {
		int n = mbedtls_ssl_write(&t->ssl, p, len);

		if (n < 0)
			return io_failed(t, n, e, why, whylen);
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

ssize_t net_tls_recv(struct net_tls *t, void *buf, size_t len, int (*flags)(void *arg),
		     void *arg, int *e, char *why, size_t whylen)
{
	int n;

	if (t->failed) {
		*e = 0;
		snprintf(why, whylen, "TLS: the session failed earlier");
		return -1;
	}
	t->err = 0;
	t->flags = flags;
	t->flags_arg = arg;
	n = mbedtls_ssl_read(&t->ssl, buf, len);
	t->flags = NULL;
	if (n > 0)
		return n;
	return io_failed(t, n == 0 ? MBEDTLS_ERR_SSL_CONN_EOF : n, e, why, whylen);
}

int net_tls_alive(struct net_tls *t)
{
	unsigned char peek[64];
	size_t at = t->rpos; /* where the next record starts, counted in rbuf */
	ssize_t n;

	if (t->failed)
		return 0;
	/* Skips the records read ahead and not consumed yet (replies). */
	while (at + 5 <= t->rlen) {
		if (t->rbuf[at] == MBEDTLS_SSL_MSG_ALERT)
			return 0;
		at += 5 + ((size_t)t->rbuf[at + 3] << 8 | t->rbuf[at + 4]);
	}
	if (at < t->rlen)
		return 1; /* within a record's header: more is on its way */
	do
		n = recv(t->own->fd, peek, sizeof(peek), MSG_PEEK | MSG_DONTWAIT);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return errno == EAGAIN || errno == EWOULDBLOCK;
	at -= t->rlen; /* the next record's start within the socket's bytes */
	return n > 0 && (at >= (size_t)n || peek[at] != MBEDTLS_SSL_MSG_ALERT);
}

void net_tls_free(struct net_tls *t)
{
	if (!t)
		return;
	mbedtls_ssl_free(&t->ssl);
	free(t);
}
