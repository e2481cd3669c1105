/* SPDX-License-Identifier: MIT */
/*
 * postgres_sql.h - the statements of the postgres backend (postgres.c
 * prepares them per session), for its three kinds of lock on a key k:
 * exclusive (limit 1), shared (mode "shared") and a permit of a semaphore
 * (limit N > 1). Ids: k's lock hashtextextended(k, 0), "id0"; permit i
 * (1..N) hashtextextended(k, i); and in the two-int space (pg_locks'
 * objsubid 2) under hashtext(k): (h, 0) held shared by every permit
 * holder, (h, 1) by every shared holder, (h, N) by a permit holder of
 * limit N (its limit, read from pg_locks). A permit holder also holds id0
 * shared, so exclusive callers wait for or refuse it. Callers that differ
 * in limit (shared counts as 1) see each other by a momentary exclusive
 * try of the other kind's (h, 0|1): a refused try returns -1 (busy), -2
 * (the other kind is there, or was trying at that instant) or -3 (no
 * permit free); then the why statement, which reads pg_locks, tells the
 * holders' limit (postgres.c asks it after -2, and after the first -3 of
 * a call). Then the tables' (the set-up at connect, the counts, the
 * names and status' read of them). Included by postgres.c only.
 */
#ifndef LOCKSHIM_POSTGRES_SQL_H
#define LOCKSHIM_POSTGRES_SQL_H

#define PG_ID0 "hashtextextended($1, 0)"
#define PG_H "hashtext($1)"
#define PG_FENCE "nextval('lockshim_fence')"

/* The limit of the key's other holders that match cond (granted, another
 * session's, this database), or NULL when none. */
#define PG_HOLDERS_LIMIT(cond) \
	"(SELECT CASE WHEN objsubid = 1 OR objid = 1 THEN 1 ELSE objid::text::int END " \
	"FROM pg_locks WHERE locktype = 'advisory' AND granted AND pid <> pg_backend_pid() " \
	"AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) " \
	"AND (" cond ") LIMIT 1)"
/* Permit holders (their limit marks), for an exclusive or shared caller. */
#define PG_PERMITS "objsubid = 2 AND classid = " PG_H "::oid AND objid NOT IN (0, 1) AND " \
	"mode = 'ShareLock'"
/* Holders of another limit than $L's, for a permit caller: permits of
 * another limit, shared holders, an exclusive holder. */
#define PG_OTHERS(L) \
	"(objsubid = 2 AND classid = " PG_H "::oid AND objid <> 0 AND objid <> " L "::int::oid " \
	"AND mode = 'ShareLock') " \
	"OR (objsubid = 1 AND ((classid::bigint << 32) | objid::bigint) = " PG_ID0 " AND " \
	"mode = 'ExclusiveLock')"

/* Exclusive. A try that fails sets nothing; when (h, 0) is held (permit
 * holders), it names their limit. $2 (try, unlock) or $3 (wait): the
 * session's idle_session_timeout from then on; a wait's $2 its
 * lock_timeout (a wait that times out sets nothing: rolled back). */
#define PG_TRY_X(F) "SELECT CASE WHEN pg_try_advisory_lock(" PG_ID0 ") THEN CASE " \
	"WHEN set_config('idle_session_timeout', $2, false) IS NOT NULL THEN " F " END " \
	"WHEN pg_try_advisory_lock(" PG_H ", 0) THEN CASE WHEN pg_advisory_unlock(" PG_H \
	", 0) THEN -1 END ELSE -2 END"
#define PG_WAIT_X(F) "SELECT set_config('lock_timeout', $2, false), " \
	"pg_advisory_lock(" PG_ID0 "), " F ", set_config('idle_session_timeout', $3, false)"
#define PG_UNLOCK_X "SELECT pg_advisory_unlock(" PG_ID0 "), " \
	"set_config('idle_session_timeout', $2, false)"

/* Shared: id0 shared, (h, 1) shared, then (h, 0) free (no permit
 * holders), else both given back. IDLE: the idle timeout's parameter. */
#define PG_SHARED_REST(F, IDLE) \
	"WHEN NOT pg_try_advisory_lock_shared(" PG_H ", 1) THEN CASE WHEN " \
	"pg_advisory_unlock_shared(" PG_ID0 ") THEN -1 END " \
	"WHEN NOT pg_try_advisory_lock(" PG_H ", 0) THEN CASE WHEN pg_advisory_unlock_shared(" \
	PG_ID0 ") AND pg_advisory_unlock_shared(" PG_H ", 1) THEN -2 END " \
	"WHEN NOT pg_advisory_unlock(" PG_H ", 0) THEN -1 " \
	"WHEN set_config('idle_session_timeout', " IDLE ", false) IS NOT NULL THEN " F " END"
#define PG_TRY_S(F) "SELECT CASE WHEN NOT pg_try_advisory_lock_shared(" PG_ID0 ") THEN -1 " \
	PG_SHARED_REST(F, "$2")
#define PG_WAIT_S(F) "SELECT set_config('lock_timeout', $2, false), " \
	"pg_advisory_lock_shared(" PG_ID0 "), CASE " PG_SHARED_REST(F, "$3")
#define PG_UNLOCK_S "SELECT pg_advisory_unlock_shared(" PG_ID0 "), " \
	"pg_advisory_unlock_shared(" PG_H ", 1), set_config('idle_session_timeout', $2, false)"

/* A permit, after its slot's lock is held or while looking for one:
 * (h, 0) shared, id0 shared, (h, 1) free (no shared holders), else what
 * was taken is given back. FREE: what gives the permit back on a refusal
 * ("" while looking for one). */
#define PG_PERMIT_CHECKS(FREE) \
	"WHEN NOT pg_try_advisory_lock_shared(" PG_H ", 0) THEN CASE WHEN true " FREE \
	" THEN -1 END " \
	"WHEN NOT pg_try_advisory_lock_shared(" PG_ID0 ") THEN CASE WHEN " \
	"pg_advisory_unlock_shared(" PG_H ", 0) " FREE " THEN -2 END " \
	"WHEN NOT pg_try_advisory_lock(" PG_H ", 1) THEN CASE WHEN pg_advisory_unlock_shared(" \
	PG_H ", 0) AND pg_advisory_unlock_shared(" PG_ID0 ") " FREE " THEN -2 END " \
	"WHEN NOT pg_advisory_unlock(" PG_H ", 1) THEN -1 "
/* Try: the checks, then the first free permit of 1..$3 (a row r: the
 * permit, or -1, -2, -3) and its fence; its limit mark (h, $3) taken. */
#define PG_TRY_P(F) "SELECT r, CASE WHEN r > 0 THEN " F " ELSE 0 END FROM (SELECT CASE " \
	PG_PERMIT_CHECKS("") \
	"ELSE (SELECT CASE WHEN s.i IS NULL THEN CASE WHEN pg_advisory_unlock_shared(" PG_H \
	", 0) AND pg_advisory_unlock_shared(" PG_ID0 ") THEN -3 END " \
	"WHEN pg_try_advisory_lock_shared(" PG_H ", $3::int) AND " \
	"set_config('idle_session_timeout', $2, false) IS NOT NULL THEN s.i END FROM (SELECT " \
	"(SELECT i FROM generate_series(1, $3::int) i WHERE pg_try_advisory_lock(" \
	"hashtextextended($1, i)) LIMIT 1) AS i) s) END AS r OFFSET 0) q"
/* Wait: blocks on permit $5 (under lock_timeout $2), then the checks;
 * $3 the idle timeout, $4 the limit. */
#define PG_P_FREE " AND pg_advisory_unlock(hashtextextended($1, $5::int))"
#define PG_WAIT_P(F) "SELECT r, CASE WHEN r > 0 THEN " F " ELSE 0 END FROM (SELECT CASE " \
	"WHEN set_config('lock_timeout', $2, false) IS NULL THEN -1 " \
	"WHEN pg_advisory_lock(hashtextextended($1, $5::int))::text IS NULL THEN -1 " \
	PG_PERMIT_CHECKS(PG_P_FREE) \
	"WHEN pg_try_advisory_lock_shared(" PG_H ", $4::int) AND " \
	"set_config('idle_session_timeout', $3, false) IS NOT NULL THEN $5::int END AS r " \
	"OFFSET 0) q"
/* Release: $3 the permit, $4 the limit. */
#define PG_UNLOCK_P "SELECT pg_advisory_unlock(hashtextextended($1, $3::int)), " \
	"pg_advisory_unlock_shared(" PG_H ", $4::int), pg_advisory_unlock_shared(" PG_H \
	", 0), pg_advisory_unlock_shared(" PG_ID0 "), " \
	"set_config('idle_session_timeout', $2, false)"

/* Why a try or wait was refused (-2, or -3: no permit free), a second
 * statement, as pg_locks costs every statement that names it (its
 * executor's set-up, about 20 us, taken or not): the limit of the key's
 * holders of another kind, NULL when none (busy). $1 the key; $2 a
 * permit's limit. */
#define PG_WHY_X "SELECT " PG_HOLDERS_LIMIT(PG_PERMITS)
#define PG_WHY_P "SELECT " PG_HOLDERS_LIMIT(PG_OTHERS("$2"))

static const char sql_try_fenced[] = PG_TRY_X(PG_FENCE);
static const char sql_try[] = PG_TRY_X("0");
static const char sql_wait_fenced[] = PG_WAIT_X(PG_FENCE);
static const char sql_wait[] = PG_WAIT_X("0");
static const char sql_unlock[] = PG_UNLOCK_X;
static const char sql_try_fenced_s[] = PG_TRY_S(PG_FENCE);
static const char sql_try_s[] = PG_TRY_S("0");
static const char sql_wait_fenced_s[] = PG_WAIT_S(PG_FENCE);
static const char sql_wait_s[] = PG_WAIT_S("0");
static const char sql_unlock_s[] = PG_UNLOCK_S;
static const char sql_try_fenced_p[] = PG_TRY_P(PG_FENCE);
static const char sql_try_p[] = PG_TRY_P("0");
static const char sql_wait_fenced_p[] = PG_WAIT_P(PG_FENCE);
static const char sql_wait_p[] = PG_WAIT_P("0");
static const char sql_unlock_p[] = PG_UNLOCK_P;
static const char sql_why_x[] = PG_WHY_X;
static const char sql_why_p[] = PG_WHY_P;

/* ---- the tables: counts (metrics) and names (status) ------------------ */

/* At connect, one round trip: the state of each object (0 absent, 1
 * usable, 2 present but not usable: no privilege): the fence sequence,
 * the counts table, the two names tables; and the session's settings
 * (TCP keepalive: a holder's host that died or was cut off is noticed in
 * about 10 + 4 x 5 s, not the system's 2 h, and its locks freed; no idle
 * timeout while it holds nothing). */
#define PG_PRIV(t, p) "has_table_privilege('lockshim_" t "', '" p "')"
static const char sql_setup_state[] =
	"SELECT CASE WHEN to_regclass('lockshim_fence') IS NULL THEN 0 "
	"WHEN has_sequence_privilege('lockshim_fence', 'USAGE') THEN 1 ELSE 2 END, "
	"CASE WHEN to_regclass('lockshim_metrics') IS NULL THEN 0 ELSE 1 END, "
	"CASE WHEN to_regclass('lockshim_keys') IS NULL OR to_regclass('lockshim_sessions') IS NULL "
	"OR to_regclass('lockshim_keys_seen') IS NULL THEN 0 WHEN "
	PG_PRIV("keys", "SELECT") " AND " PG_PRIV("keys", "INSERT") " AND " PG_PRIV("keys", "UPDATE")
	" AND " PG_PRIV("keys", "DELETE") " AND " PG_PRIV("sessions", "SELECT") " AND "
	PG_PRIV("sessions", "INSERT") " AND " PG_PRIV("sessions", "UPDATE") " THEN 1 ELSE 2 END, "
	"set_config('tcp_keepalives_idle', '10', false), "
	"set_config('tcp_keepalives_interval', '5', false), "
	"set_config('tcp_keepalives_count', '4', false), "
	"set_config('idle_session_timeout', '0', false)";
/* Made when absent (the state is read first: IF NOT EXISTS alone needs
 * CREATE on the schema even when the object exists). The counts are
 * logged (a restart keeps them); the names are UNLOGGED (no WAL, no
 * flush at commit: a crash empties them, and ends every session, whose
 * successors write them again). */
#define PG_CREATES_MAX 3
static const char *const sql_setup_create[][PG_CREATES_MAX] = {
	{ "CREATE SEQUENCE IF NOT EXISTS lockshim_fence", NULL, NULL },
	{ "CREATE TABLE IF NOT EXISTS lockshim_metrics (key bytea NOT NULL, field bytea NOT NULL, "
	  "value bigint NOT NULL, PRIMARY KEY (key, field))", NULL, NULL },
	{ "CREATE UNLOGGED TABLE IF NOT EXISTS lockshim_keys (id bigint PRIMARY KEY, "
	  "key text NOT NULL, seen timestamptz NOT NULL)",
	  "CREATE INDEX IF NOT EXISTS lockshim_keys_seen ON lockshim_keys (seen)",
	  "CREATE UNLOGGED TABLE IF NOT EXISTS lockshim_sessions (pid int PRIMARY KEY, "
	  "started timestamptz NOT NULL, owner text NOT NULL)" },
};
enum { PG_OBJ_FENCE, PG_OBJ_METRICS, PG_OBJ_NAMES, PG_NOBJS };

/* A shipment of counts, one statement (one transaction: two processes'
 * shipments into one key serialise on its rows, and none is lost): $1 the
 * key, $2 the fields (text[] of hex), $3 their deltas (bigint[]); a field
 * given twice adds up; rows taken in field order (two shipments never
 * wait for each other crosswise). */
static const char sql_count[] =
	"INSERT INTO lockshim_metrics (key, field, value) SELECT decode($1, 'hex'), "
	"decode(f, 'hex'), sum(d) FROM unnest($2::text[], $3::bigint[]) AS u(f, d) "
	"GROUP BY f ORDER BY f ON CONFLICT (key, field) DO UPDATE SET value = "
	"lockshim_metrics.value + excluded.value";
/* Every count of the keys that begin with $1 (hex: "<ns>:metrics:{"). */
static const char sql_count_read[] =
	"SELECT encode(key, 'hex'), encode(field, 'hex'), value FROM lockshim_metrics "
	"WHERE substr(key, 1, length(decode($1, 'hex'))) = decode($1, 'hex') ORDER BY key, field";

/* Names, for status (advisory lock ids are hashes): a key's id, text and
 * when it was last named, sent (async, ahead of its try) the first time a
 * session locks or waits for the key, and again after PG_NAME_AGAIN_MS of
 * use; with it, the rows not named for PG_NAME_KEEP (twice that) are
 * deleted, unless their key is locked or waited for now (a session names
 * a key again before its row can go, and a lock it holds keeps its row;
 * every prune and upsert takes the rows in seen order: no deadlock; the
 * row being named is not pruned by its own statement); and the session's
 * owner record (its first lock's value: every field but the token and
 * since_ms is the session's thread's), sent with its first name. $1 the
 * key text (key_text), or the owner record. */
#define PG_NAME_AGAIN_MS 3600000
#define PG_NAME_KEEP "interval '2 hours'"
static const char sql_name_key[] =
	"WITH d AS (DELETE FROM lockshim_keys WHERE seen < now() - " PG_NAME_KEEP " AND "
	"id <> hashtextextended($1, 0) AND id NOT IN (SELECT (classid::bigint << 32) | "
	"objid::bigint FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1)) "
	"INSERT INTO lockshim_keys (id, key, seen) VALUES (hashtextextended($1, 0), $1, now()) "
	"ON CONFLICT (id) DO UPDATE SET seen = excluded.seen";
static const char sql_name_session[] =
	"INSERT INTO lockshim_sessions (pid, started, owner) SELECT pg_backend_pid(), "
	"backend_start, $1 FROM pg_stat_get_activity(pg_backend_pid()) ON CONFLICT (pid) "
	"DO UPDATE SET started = excluded.started, owner = excluded.owner";
/*
 * status: every advisory lock of this database whose id (objsubid 1) is a
 * named key's id0, granted (a holder) or not (a waiter, exclusive or
 * shared), with: its mode; its session's owner record (NULL: none written,
 * or the pid's row is an earlier session's; another role's session, whose
 * backend_start and query_start this role may not see, gets its pid's row); since, in ms: a waiter's
 * waitstart, a holder's session's last statement's start (the renewal's
 * ping is a bare Sync, no statement), NULL after a SELECT 1 ping; the session's largest limit mark (h, N) of the
 * key (a permit holder; 0 or NULL: none). Then the waiters on a permit id
 * (hashtextextended(key, 1..N)) of a key whose holders have limit N. pg_locks
 * is read once (it copies the lock table). In key order, holders first,
 * waiters in wait order.
 */
#define PG_H_SESSION(L) \
	"LEFT JOIN pg_stat_activity a ON a.pid = " L ".pid LEFT JOIN lockshim_sessions s ON " \
	"s.pid = " L ".pid AND (s.started = a.backend_start OR a.backend_start IS NULL) "
static const char sql_holders[] =
	"WITH l AS MATERIALIZED (SELECT pid, granted, mode, objsubid, classid, objid, waitstart, "
	"(classid::bigint << 32) | objid::bigint AS id FROM pg_locks WHERE locktype = 'advisory' "
	"AND database = (SELECT oid FROM pg_database WHERE datname = current_database())), "
	"h AS (SELECT k.key, l.granted, l.mode, s.owner, (extract(epoch FROM CASE WHEN NOT "
	"l.granted THEN l.waitstart WHEN a.query <> 'SELECT 1' THEN a.query_start END) * "
	"1000)::bigint AS since, (SELECT max(m.objid::bigint) FROM l m WHERE m.pid = l.pid AND "
	"m.objsubid = 2 AND m.granted AND m.classid = hashtext(k.key)::oid AND m.objid <> 1) "
	"AS lim, l.waitstart, l.pid FROM l JOIN lockshim_keys k ON k.id = l.id "
	PG_H_SESSION("l") "WHERE l.objsubid = 1), "
	"p AS (SELECT DISTINCT key, lim FROM h WHERE granted AND lim > 1) "
	"SELECT key, granted, mode, owner, since, lim, waitstart, pid FROM h UNION ALL "
	"SELECT p.key, false, w.mode, s.owner, (extract(epoch FROM w.waitstart) * 1000)::bigint, "
	"NULL, w.waitstart, w.pid FROM p CROSS JOIN LATERAL generate_series(1, p.lim::int) i "
	"JOIN l w ON NOT w.granted AND w.objsubid = 1 AND w.id = hashtextextended(p.key, i) "
	PG_H_SESSION("w") "ORDER BY 1, 2 DESC, 7, 8";
enum { PG_H_KEY, PG_H_GRANTED, PG_H_MODE, PG_H_OWNER, PG_H_SINCE, PG_H_LIMIT, PG_H_WAITSTART,
       PG_H_PID };
/*
 * unlock (pg_remove), $1 a holder's server pid, $2 its key: the keys of
 * the other locks its session holds (NULL: none), then the session ended
 * (pg_terminate_backend, waiting $3 ms for it) only while it still holds
 * $2: no row when it does not.
 */
#define PG_HELD_BY(P) "FROM pg_locks l WHERE l.pid = " P " AND l.locktype = 'advisory' AND " \
	"l.granted AND l.objsubid = 1 AND l.database = (SELECT oid FROM pg_database WHERE " \
	"datname = current_database())"
static const char sql_remove_also[] =
	"SELECT string_agg(k.key, ', ' ORDER BY k.key) FROM lockshim_keys k WHERE k.key <> $2 "
	"AND k.id IN (SELECT (l.classid::bigint << 32) | l.objid::bigint " PG_HELD_BY("$1::int")
	")";
static const char sql_remove[] =
	"SELECT pg_terminate_backend(l.pid, $3::bigint) " PG_HELD_BY("$1::int")
	" AND ((l.classid::bigint << 32) | l.objid::bigint) = hashtextextended($2, 0) LIMIT 1";

/* The statements a session prepares (prepare_statements: the fenced
 * variants when the sequence is usable, else the others, under the same
 * names), and their parameters' types: exclusive, shared, permit. */
static const struct pg_stmt {
	const char *name, *types, *sql, *sql_fenced;
} pg_stmts[] = {
	{ "lockshim_try", "text, text", sql_try, sql_try_fenced },
	{ "lockshim_wait", "text, text, text", sql_wait, sql_wait_fenced },
	{ "lockshim_unlock", "text, text", sql_unlock, sql_unlock },
	{ "lockshim_why", "text", sql_why_x, sql_why_x },
	{ "lockshim_try_s", "text, text", sql_try_s, sql_try_fenced_s },
	{ "lockshim_wait_s", "text, text, text", sql_wait_s, sql_wait_fenced_s },
	{ "lockshim_unlock_s", "text, text", sql_unlock_s, sql_unlock_s },
	{ "lockshim_why_s", "text", sql_why_x, sql_why_x },
	{ "lockshim_try_p", "text, text, text", sql_try_p, sql_try_fenced_p },
	{ "lockshim_wait_p", "text, text, text, text, text", sql_wait_p, sql_wait_fenced_p },
	{ "lockshim_unlock_p", "text, text, text, text", sql_unlock_p, sql_unlock_p },
	{ "lockshim_why_p", "text, text", sql_why_p, sql_why_p },
};
#define PG_NSTMTS (sizeof(pg_stmts) / sizeof(pg_stmts[0]))
/* A statement's index: its kind, + PG_S_KINDS shared, + 2 x PG_S_KINDS a permit. */
enum { PG_S_TRY, PG_S_WAIT, PG_S_UNLOCK, PG_S_WHY, PG_S_KINDS };

#endif
