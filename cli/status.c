/* SPDX-License-Identifier: MIT */
/*
 * status.c - `lockshim status [-c FILE] [--json] [PATTERN]`: every lock of
 * the config's namespace whose KEY matches PATTERN, one line per holder (a
 * semaphore's or shared lock's several), in key order (lockview.c reads
 * and prints them). Exit 0, also when nothing is held; 69 when a node
 * cannot be read (with Redlock: no quorum of them), 78 a bad config, 64 a
 * usage error. With backend "local" the held lock files (lockview.c).
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "conf.h"
#include "lockview.h"
#include "log.h"

int cmd_status(int argc, char **argv)
{
	struct lv_args a;
	struct lv_set s = { 0 };
	struct lockview lv;
	struct conf cfg;
	char err[1024];
	int rc;

	if ((rc = lockview_args(argc, argv, 0, "[-c FILE] [--json] [PATTERN]", &a)) != 0)
		return rc;
	if ((rc = lockview_start(&lv, &cfg, &a, NULL)) != 0)
		return rc;
	if (!strcmp(lv.b.ops->name, "postgres")) {
		fprintf(stderr, "lockshim: status is not built yet for backend \"postgres\"; its "
			"holders: SELECT l.pid, a.application_name, (l.classid::bigint << 32) | "
			"l.objid::bigint AS id FROM pg_locks l JOIN pg_stat_activity a USING (pid) "
			"WHERE l.locktype = 'advisory' AND l.granted\n");
		lockview_close(&lv);
		conf_release(&cfg);
		return 1;
	}
	if (!strcmp(lv.b.ops->name, "etcd")) {
		fprintf(stderr, "lockshim: status is not built yet for backend \"etcd\"; its "
			"holders and waiters: etcdctl get --prefix <etcd.prefix> (per key, the "
			"lowest create revision holds)\n");
		lockview_close(&lv);
		conf_release(&cfg);
		return 1;
	}
	rc = lockview_scan(&lv, a.operand, &s, err, sizeof(err));
	if (rc == 0) {
		long long now = lockview_now_ms();

		for (int i = 0; i < s.n; i++)
			lockview_print(&lv, &s.v[i], a.json, now);
	} else {
		log_stderr("cannot read the locks: %s", err);
	}
	lv_set_free(&s);
	lockview_close(&lv);
	conf_release(&cfg);
	return rc == 0 ? 0 : EX_UNAVAILABLE;
}
