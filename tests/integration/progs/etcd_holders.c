/*
 * etcd_holders ENDPOINT PREFIX: prints what etcd_holders (the etcd
 * module's .holders) reports, one line per lock: "lock KEY fence=N lease_left_ms=N
 * holder=VALUE waiters=N" then " | VALUE" per waiter, oldest first. The
 * module's source is compiled in (the module exports its table only), so
 * that any value can be read back, not only owner records as `lockshim
 * status` shows them. Exit 0, or 1 with
 * the error on stderr.
 */
#include "etcd.c"

static void show(void *arg, const struct backend_holder *l)
{
	(void)arg;
	printf("lock %.*s fence=%lld lease_left_ms=%lld holder=%.*s waiters=%d", (int)l->klen,
	       l->key, l->fence, l->lease_left_ms, (int)l->vlen, l->val, l->nwaiters);
	for (int i = 0; i < l->nwaiters; i++)
		printf(" | %.*s", (int)l->wlen[i], l->wval[i]);
	printf("\n");
}

int main(int argc, char **argv)
{
	char *endpoints[2] = { NULL, NULL }, err[256];
	struct etcd_spec spec = { endpoints, NULL, 2000, 2000 };
	struct backend_config *bc;
	struct backend_conn *c;
	int rc;

	if (argc != 3)
		return 2;
	endpoints[0] = argv[1];
	spec.prefix = argv[2];
	if (!(bc = etcd_config_new(&spec, err, sizeof(err))) ||
	    !(c = etcd_open(bc, err, sizeof(err)))) {
		fprintf(stderr, "%s\n", err);
		return 1;
	}
	rc = etcd_holders(c, show, NULL);
	if (rc != BACKEND_OK)
		fprintf(stderr, "%s\n", etcd_errstr(c));
	etcd_close(c);
	etcd_config_free(bc);
	return rc == BACKEND_OK ? 0 : 1;
}
