/* SPDX-License-Identifier: MIT */
/*
 * unlock.c - `lockshim unlock [-c FILE] [--force] [--json] KEY`: removes the
 * current holder's lock of KEY exactly as its own release would; of a
 * holder set (a semaphore, shared holders), each holder's in turn. The
 * holders are read first (lockview.c); one alive on this machine is
 * refused (and kept) without --force. The removal is the backend's release
 * of that value with the built-in lock settings (KEY may be no lock of the
 * config), the holder's limit and mode and the config's longest waiter
 * TTL (compare-and-delete: a newer holder is never removed; the head
 * waiter gets the lock at once, or is woken to take a freed place; with
 * Redlock, on every master); where only its holder can give a lock back,
 * the backend's .remove (postgres: the holder's session ended, its other
 * locks named). A former holder finds its lease gone at its next renewal
 * (on_lost). Exit 0 every holder removed, 1 not held, one refused or
 * changed meanwhile, 69 unreachable, 78 config, 64 usage.
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "conf.h"
#include "conf_field.h"
#include "lockview.h"
#include "log.h"
#include "renew.h"

#define USAGE "[-c FILE] [--force] [--json] KEY"

/*
 * Fills spec with the built-in lock settings and l's limit and mode (a
 * waiter handed the lock gets the longest waiter TTL of cfg's locks, or
 * the built-in one, to take it up), and lease with l's key and value
 * under spec, as the holder's own lease. Returns 0, or -1 out of memory;
 * the caller releases spec with conf_fields_release either way.
 */
static int release_lease(const struct conf *cfg, const struct lv_lock *l,
			 struct lock_spec *spec, struct lease *lease)
{
	long long request_ms = 0;

	memset(spec, 0, sizeof(*spec));
	if (conf_fields_default(conf_lock_fields, spec) != 0)
		return -1;
	for (int i = 0; cfg->groups[i]; i++)
		if (cfg->groups[i]->request_ms)
			request_ms += cfg->groups[i]->request_ms(cfg->group_data[i]);
	spec->waiter_ttl_ms = conf_waiter_ttl_ms(spec, request_ms);
	for (int i = 0; i < cfg->nlocks; i++)
		if (cfg->locks[i].waiter_ttl_ms > spec->waiter_ttl_ms)
			spec->waiter_ttl_ms = cfg->locks[i].waiter_ttl_ms;
	spec->limit = l->limit;
	spec->shared = l->shared;
	memset(lease, 0, sizeof(*lease));
	lease->spec = spec;
	memcpy(lease->key, l->key, l->klen);
	lease->klen = l->klen;
	memcpy(lease->val, l->val, l->vlen);
	lease->vlen = l->vlen;
	return 0;
}

/* Runs the backend's removal of l on c (.remove, else its release),
 * saying on stderr which other locks went with it. Returns 0 removed, 1
 * not held any more, 69 unreachable (said on stderr). */
static int remove_holder(const struct lockview *lv, struct backend_conn *c,
			 const struct lv_lock *l)
{
	const struct backend_ops *ops = lv->b.ops;
	struct backend_item it;
	struct lock_spec spec;
	struct lease lease;
	char also[1024] = "";
	int rc;

	if (release_lease(lv->cfg, l, &spec, &lease) != 0) {
		conf_fields_release(conf_lock_fields, &spec);
		fprintf(stderr, "lockshim: out of memory\n");
		return EX_UNAVAILABLE;
	}
	it = renew_item(&lease);
	it.turn_done = 1; /* a queued waiter gets it now, due or not */
	rc = ops->remove ? ops->remove(c, &it, also, sizeof(also)) : ops->release(c, &it, 0);
	if (rc == BACKEND_ERR)
		log_stderr("%s: %s", ops->remove ? "remove" : "release", ops->errstr(c));
	else if (rc == BACKEND_OK && also[0])
		log_stderr("%.*s: these locks of the same holder went with it: %s", (int)l->klen,
			   l->key, also);
	conf_fields_release(conf_lock_fields, &spec);
	return rc == BACKEND_OK ? 0 : rc == BACKEND_NO ? 1 : EX_UNAVAILABLE;
}

/*
 * Removes each holder of s (KEY's, as read) but, without force, those
 * alive on this host, printing each one removed. Returns 0 all removed,
 * 1 one refused or changed meanwhile, 69 the server unreachable.
 */
static int remove_holders(const struct lockview *lv, const struct lv_set *s, const char *key,
			  const struct lv_args *a)
{
	struct backend_conn *c;
	char err[512];
	int rc = 0;

	if (!(c = lv->b.ops->open(lv->b.cfg, err, sizeof(err)))) {
		log_stderr("%s", err);
		return EX_UNAVAILABLE;
	}
	for (int i = 0; i < s->n && rc != EX_UNAVAILABLE; i++) {
		const struct lv_lock *l = &s->v[i];
		int r;

		if (!a->force && owner_state(l->val, l->vlen) == OWNER_ALIVE_HERE) {
			log_stderr("not unlocking %s: its holder, pid %d (%s), is alive on this "
				  "host; --force removes it anyway", key, l->owner.pid,
				  l->owner.program);
			rc = 1;
			continue;
		}
		r = remove_holder(lv, c, l);
		if (r == 0) {
			if (!a->json)
				fputs("removed ", stdout);
			lockview_print(lv, l, a->json, lockview_now_ms());
		} else if (r == 1) {
			log_stderr("%s changed hands meanwhile: not removed", key);
		}
		if (r > rc)
			rc = r;
	}
	lv->b.ops->close(c);
	return rc;
}

int cmd_unlock(int argc, char **argv)
{
	struct lv_args a;
	struct lockview lv;
	struct lv_set s = { 0 };
	struct conf cfg;
	char err[1024];
	int rc;

	if ((rc = lockview_args(argc, argv, 1, USAGE, &a)) != 0)
		return rc;
	if (!a.operand) {
		fprintf(stderr, "lockshim: unlock needs a KEY\nusage: lockshim unlock " USAGE "\n");
		return EX_USAGE;
	}
	if ((rc = lockview_start(&lv, &cfg, &a, LV_UNLOCK)) != 0)
		return rc;
	rc = lockview_read(&lv, a.operand, &s, err, sizeof(err));
	if (rc < 0) {
		log_stderr("cannot read the lock: %s", err);
		rc = EX_UNAVAILABLE;
	} else if (rc == 0) {
		log_stderr("%s is not held", a.operand);
		rc = 1;
	} else {
		rc = remove_holders(&lv, &s, a.operand, &a);
	}
	lv_set_free(&s);
	lockview_close(&lv);
	conf_release(&cfg);
	return rc;
}
