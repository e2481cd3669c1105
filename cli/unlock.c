/* SPDX-License-Identifier: MIT */
/*
 * unlock.c - `lockshim unlock [-c FILE] [--force] [--json] KEY`: removes the
 * current holder's lock of KEY exactly as its own release would. The value
 * is read first (lockview.c); a holder alive on this machine is refused
 * without --force. The removal is the backend's release of that value
 * (compare-and-delete: a newer holder's lock is never removed; the head
 * waiter gets the lock at once, as the release of a holder done with its
 * turn hands it over; with Redlock, on every master), synchronous, with the
 * built-in lock settings (this KEY may be no lock of the config) and the
 * longest waiter TTL of the config's locks for the hand-off. The
 * former holder finds its lease gone at its next renewal (on_lost).
 * Exit 0 removed, 1 not held or changed meanwhile or refused, 69 the server
 * unreachable, 78 a bad config, 64 a usage error.
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "conf.h"
#include "conf_field.h"
#include "lockview.h"

#define USAGE "[-c FILE] [--force] [--json] KEY"

/* Fills it with l's key and value and the built-in lock settings; a
 * waiter handed the lock gets the longest waiter TTL of cfg's locks (or
 * the built-in one) to take it up. Returns 0, or -1 out of memory. */
static int release_item(const struct conf *cfg, const struct lv_lock *l,
			struct backend_item *it)
{
	struct lock_spec d = { 0 };
	long long request_ms = 0;

	if (conf_fields_default(conf_lock_fields, &d) != 0)
		return -1;
	for (int i = 0; cfg->groups[i]; i++)
		if (cfg->groups[i]->request_ms)
			request_ms += cfg->groups[i]->request_ms(cfg->group_data[i]);
	memset(it, 0, sizeof(*it));
	it->key = l->key;
	it->klen = l->klen;
	it->val = l->val;
	it->vlen = l->vlen;
	it->lease_ms = d.lease_ms;
	it->fair = d.fair;
	it->handoff_us = d.handoff_us;
	it->waiter_ttl_ms = conf_waiter_ttl_ms(&d, request_ms);
	for (int i = 0; i < cfg->nlocks; i++)
		if (cfg->locks[i].waiter_ttl_ms > it->waiter_ttl_ms)
			it->waiter_ttl_ms = cfg->locks[i].waiter_ttl_ms;
	it->turn_done = 1; /* a queued waiter gets it now, due or not */
	conf_fields_release(conf_lock_fields, &d);
	return 0;
}

/* Runs the backend's release of l. Returns 0 removed, 1 not ours any
 * more, 69 unreachable (said on stderr). */
static int remove_lock(const struct lockview *lv, const struct lv_lock *l)
{
	const struct backend_ops *ops = lv->b.ops;
	struct backend_item it;
	struct backend_conn *c;
	char err[512];
	int rc;

	if (release_item(lv->cfg, l, &it) != 0) {
		fprintf(stderr, "lockshim: out of memory\n");
		return EX_UNAVAILABLE;
	}
	if (!(c = ops->open(lv->b.cfg, err, sizeof(err)))) {
		fprintf(stderr, "lockshim: %s\n", err);
		return EX_UNAVAILABLE;
	}
	rc = ops->release(c, &it, 0);
	if (rc == BACKEND_ERR)
		fprintf(stderr, "lockshim: release: %s\n", ops->errstr(c));
	ops->close(c);
	return rc == BACKEND_OK ? 0 : rc == BACKEND_NO ? 1 : EX_UNAVAILABLE;
}

int cmd_unlock(int argc, char **argv)
{
	struct lv_args a;
	struct lockview lv;
	struct lv_lock l;
	struct conf cfg;
	char err[1024];
	int rc;

	if ((rc = lockview_args(argc, argv, 1, USAGE, &a)) != 0)
		return rc;
	if (!a.operand) {
		fprintf(stderr, "lockshim: unlock needs a KEY\nusage: lockshim unlock " USAGE "\n");
		return EX_USAGE;
	}
	if ((rc = lockview_start(&lv, &cfg, &a)) != 0)
		return rc;
	rc = lockview_read(&lv, a.operand, &l, err, sizeof(err));
	if (rc < 0) {
		fprintf(stderr, "lockshim: cannot read the lock: %s\n", err);
		rc = EX_UNAVAILABLE;
	} else if (rc == 0) {
		fprintf(stderr, "lockshim: %s is not held\n", a.operand);
		rc = 1;
	} else if (!a.force && owner_state(l.val, l.vlen) == OWNER_ALIVE_HERE) {
		fprintf(stderr, "lockshim: not unlocking %s: its holder, pid %d (%s), is alive on "
			"this host; --force removes it anyway\n", a.operand, l.owner.pid,
			l.owner.program);
		lv_lock_free(&l);
		rc = 1;
	} else {
		rc = remove_lock(&lv, &l);
		if (rc == 0) {
			if (!a.json)
				fputs("removed ", stdout);
			lockview_print(&lv, &l, a.json, lockview_now_ms());
		} else if (rc == 1) {
			fprintf(stderr, "lockshim: %s changed hands meanwhile: not removed\n",
				a.operand);
		}
		lv_lock_free(&l);
	}
	lockview_close(&lv);
	conf_release(&cfg);
	return rc;
}
