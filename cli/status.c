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
	if ((rc = lockview_start(&lv, &cfg, &a, LV_STATUS)) != 0)
		return rc;
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
