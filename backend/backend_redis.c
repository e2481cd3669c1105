/* SPDX-License-Identifier: MIT */
/*
 * backend_redis.c - the Redis implementation of backend.h.
 *
 * Sockets are net.c's (no SIGPIPE, never a descriptor the program took
 * back); hiredis parses the replies (its redisReader, linked statically
 * with hidden symbols). Every lock operation is one Lua script sent by EVALSHA
 * (EVAL on NOSCRIPT), named by the SHA-1 computed here, so a new connection
 * sends its first command at once (AUTH and SELECT, when configured, go
 * ahead of it in one round trip); the uncontended acquire too (S_ACQUIRE:
 * SET NX PX and HINCRBY of the fence in one round trip, ~3 µs more server
 * time than a plain SET NX GET; a pipelined INCR would count failed
 * attempts as well). Keys and
 * values are separate arguments with lengths, never spliced into command
 * text. Auxiliary keys hang off the lock key, and every script gets all the
 * keys it touches in KEYS (built here, by append_script), as Redis Cluster
 * requires; a waiter's signal list is named by KEYS[7], the common prefix,
 * plus its token, since a release learns the head waiter inside the script:
 *   <key>:f          the fencing counter, a hash that never expires: n the
 *                    fence (incremented at every grant), g "<token>:<ms>"
 *                    the last grant by the queue, k "<token>" while the
 *                    holder keeps the lock between calls (renew.c says)
 *   <key>:q, :qx     waiters by arrival (a counter: Redis runs many
 *                    arrivals in one millisecond) and by expiry (a waiter
 *                    that stops refreshing is purged within its waiter TTL)
 *   <key>:due        while waiters queue: when a release must hand over (µs, Redis TIME)
 *   <key>:w:<token>  a waiter's signal list: "g:<fence>" (the lock was
 *                    handed to it) or "w" (it is free: try again); waiters
 *                    BLPOP it
 * A lock of limit > 1 or mode shared (backend_item_set) is a holder set
 * instead of a string, with its own scripts (S_S*):
 *   <key>            a sorted set: member a holder's value, score when its
 *                    lease ends (ms, Redis TIME); the key's PTTL covers the
 *                    latest score, so an abandoned set goes
 *   <key>:f          also l (the holders' limit) and m ("s" shared, "x"
 *                    permits), written by the caller creating the set, and
 *                    k:<token> per holder keeping its entry between calls
 *                    (instead of k: S_SRENEW)
 *   <key>:q, :qx     its waiters as "+<token>" (their lists are named by
 *                    the bare token): a release only ever wakes them
 * A string script meeting a set (or a set script a string) never fails:
 * shared holders and an exclusive one wait for each other, and a limit
 * that differs from the holders' is a mismatch (a string counts as 1).
 * Only the refused path of the string scripts looks (pcall of GET), so a
 * plain lock costs what it did.
 * A release with a waiter due hands the lock straight to the queue head
 * (fair mode: always; default mode: handoff_ms after the head arrived or
 * after the last hand-off, or when the releaser has had it that long or is
 * idle); otherwise it deletes the key and wakes the head, and the releaser
 * may take it again first, which keeps a busy caller fast without starving
 * others.
 * Asynchronous releases are written at once and remembered; their replies
 * are read in front of the next command's reply (one round trip for both),
 * or by flush. Each connection knows which scripts the server has cached
 * (an EVAL sent, a script's reply other than NOSCRIPT; any NOSCRIPT read
 * forgets them all: a SCRIPT FLUSH): an asynchronous command goes as
 * EVALSHA when known (Redis then hashes no script text), else as EVAL. One
 * answered NOSCRIPT never ran: settle writes it again as EVAL, read in
 * stream order. So a SCRIPT FLUSH while a call is inside leaves its key
 * held (never shorter) until that reply is read, at the thread's next
 * command on the connection or at flush: at most a lease later. The rule
 * holds on every connection of this file: a thread's, the renewal
 * thread's, each node's of Cluster, Redlock and Sentinel. Those whose reply
 * never came are handed back by unconfirmed(); those a cluster node
 * redirected, by backend_redis_redirected(). For the backends of several nodes,
 * acquire and renew also come as send and receive halves (backend_redis.h).
 * Whatever the server sends, a read ends by the deadline net.c sets at each
 * send (command_timeout_ms for all the replies the send is owed), and the
 * bytes go through a scan (struct scan) before hiredis sees them: a header
 * announcing more than any reply to the shim's commands can hold, or a
 * reply nobody asked for, is a protocol error at once, and the connection
 * is closed.
 */
#include "backend_redis.h"

#include <hiredis/hiredis.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend_redis_conf.h"
#include "log.h"
#include "net.h"
#include "sha1.h"

#define LUA_NOW                                                                 \
	"local t = redis.call('time') local nowu = t[1] * 1000000 + t[2] "      \
	"local now = math.floor(nowu / 1000) "
#define LUA_PURGE                                                               \
	"for _, w in ipairs(redis.call('zrangebyscore', qx, '-inf', now)) do "  \
	"redis.call('zrem', q, w) redis.call('zrem', qx, w) end "

/* The queue scripts' KEYS, in this order (append_script builds them). */
#define LUA_KEYS                                                                \
	"local K, F, q, qx, due, mine, sig = KEYS[1], KEYS[2], KEYS[3], "       \
	"KEYS[4], KEYS[5], KEYS[6], KEYS[7] local tok = ARGV[1] "
/* The holder's token kept between calls (field k) is ours: forget it. */
#define LUA_UNKEEP                                                              \
	"if redis.call('hget', F, 'k') == tok:sub(1, 32) then "                 \
	"redis.call('hdel', F, 'k') end "
/* A holder set's: our own mark k:<token> goes, and k as LUA_UNKEEP (a
 * set script may drop a string key holding the token: a dead holder). */
#define LUA_SUNKEEP                                                             \
	"redis.call('hdel', F, 'k:' .. tok:sub(1, 32)) " LUA_UNKEEP

/* The string lock's scripts, then the holder set's (S_S*: backend_item_set). */
enum script { S_ACQUIRE, S_ENQUEUE, S_RELEASE, S_RENEW, S_LEAVE, S_UNLOCK, S_FENCE,
	      S_SACQUIRE, S_SENQUEUE, S_SRELEASE, S_SRENEW, S_SLEAVE, S_SUNLOCK, NSCRIPTS };
_Static_assert(NSCRIPTS <= 32, "a connection's known scripts are bits of an unsigned");

/*
 * The holder set's pieces. A waiter's member in the queue is "+" and its
 * token; signal strips the "+" (its list is named by the bare token).
 * state(lim, sh, now, pick) purges expired entries and says what the key
 * is to a caller of limit lim (sh: shared): 'in' (our entry is there),
 * 'free' (no key), 'room', 'busy' with the holder to report (the pick-th
 * entry by lease end, modulo their number, or the string holder) and when
 * the first entry frees at the latest (ms), or a negative number: minus
 * the holders' limit, which differs from lim. enter adds our entry (l and
 * m written by the caller creating the set; fresh: the key was free, so
 * nothing is read back), keeps the key's TTL past every score, and returns
 * the fence; refresh renews an entry already there (an attempt whose reply
 * was lost) and returns the fence as it is. drop removes our entry (or a string key holding our token: a
 * dead holder broken by a set caller) and returns 1, or 0 when not ours.
 * wake(ttl) wakes the queue head when it can enter now: the key free, or
 * a "+" head and room in a set (shared holders, or fewer than l).
 */
#define LUA_SIGNAL                                                              \
	"local function signal(w, v, ttl) "                                     \
	"local s = sig .. (w:sub(1, 1) == '+' and w:sub(2) or w) "              \
	"redis.call('del', s) redis.call('rpush', s, v) redis.call('pexpire', s, ttl) end "
#define LUA_SET                                                                 \
	"local function state(lim, sh, now, pick) "                                   \
	"local t = redis.call('type', K).ok "                                   \
	"if t == 'none' then return 'free' end "                                \
	"if t == 'string' then if lim > 1 then return -1 end "                  \
	"return 'busy', redis.call('get', K), redis.call('pttl', K) end "       \
	"redis.call('zremrangebyscore', K, '-inf', now) "                       \
	"local low = redis.call('zrange', K, 0, 0, 'WITHSCORES') "              \
	"if not low[1] then return 'room' end "                                 \
	"if redis.call('zscore', K, tok) then return 'in' end "                 \
	"local l = tonumber(redis.call('hget', F, 'l')) or 1 "                  \
	"if l ~= lim then return -l end "                                       \
	"if (redis.call('hget', F, 'm') == 's') == sh and "                     \
	"(sh or redis.call('zcard', K) < l) then return 'room' end "            \
	"local i = pick % redis.call('zcard', K) "                               \
	"return 'busy', redis.call('zrange', K, i, i)[1], tonumber(low[2]) - now end "                    \
	"local function enter(lim, sh, lease, now, fresh) "                     \
	"if fresh or redis.call('exists', K) == 0 then fresh = true "           \
	"redis.call('hset', F, 'l', lim, 'm', sh and 's' or 'x') end "          \
	"redis.call('zadd', K, now + lease, tok) "                              \
	"if fresh or redis.call('pttl', K) < lease then "                       \
	"redis.call('pexpire', K, lease) end "                                  \
	"return redis.call('hincrby', F, 'n', 1) end "                          \
	"local function refresh(lease, now) redis.call('zadd', K, now + lease, tok) " \
	"if redis.call('pttl', K) < lease then redis.call('pexpire', K, lease) end " \
	"return tonumber(redis.call('hget', F, 'n')) or 0 end "
#define LUA_SET_DROP                                                            \
	"local function drop() local n = redis.pcall('zrem', K, tok) "         \
	"if type(n) == 'number' then return n end "                             \
	"if redis.call('get', K) == tok then "                                  \
	"redis.call('del', K) return 1 end return 0 end "                       \
	"local function wake(ttl) local kt = redis.call('type', K).ok "         \
	"local head = redis.call('zrange', q, 0, 0)[1] "                        \
	"if kt == 'string' or not head then return end "                        \
	"local n = kt == 'zset' and redis.call('zcard', K) or 0 "               \
	"if n == 0 or (head:sub(1, 1) == '+' and (redis.call('hget', F, 'm') == 's' or " \
	"n < (tonumber(redis.call('hget', F, 'l')) or 1))) then signal(head, 'w', ttl) end end "


/* Suffixes of the keys after the lock key: the fencing counter, then the
 * queue's; the sixth is followed by the caller's token (its own signal
 * list), the seventh is the bare prefix. A script takes the first
 * script_nkeys of them. */
static const char *const queue_suffix[] = { "", ":f", ":q", ":qx", ":due", ":w:", ":w:" };
#define QUEUE_KEYS 7
#define MINE_KEY 5     /* queue_suffix's index of the caller's own signal list */
#define ENQUEUE_ARGS 5 /* S_ENQUEUE's numeric arguments (enqueue_args) */
#define SENQUEUE_ARGS 9 /* S_SENQUEUE's: S_ENQUEUE's, limit, shared, signal ttl, pick */
static const int script_nkeys[NSCRIPTS] = {
	[S_ACQUIRE] = 2, [S_ENQUEUE] = QUEUE_KEYS, [S_RELEASE] = QUEUE_KEYS, [S_RENEW] = 2,
	[S_LEAVE] = QUEUE_KEYS, [S_UNLOCK] = 1, [S_FENCE] = 2,
	[S_SACQUIRE] = 4, [S_SENQUEUE] = QUEUE_KEYS, [S_SRELEASE] = QUEUE_KEYS,
	[S_SRENEW] = 2, [S_SLEAVE] = QUEUE_KEYS, [S_SUNLOCK] = 1,
};

static const char *const scripts[NSCRIPTS] = {
	/*
	 * KEYS: the lock, its fencing counter. ARGV: token, lease. The
	 * uncontended acquire: sets the lock when it is free and returns the
	 * fence (field n, incremented); when it holds the token already (an
	 * attempt whose reply was lost) returns the current n; else returns
	 * the holder's value (a string). A holder set there (only this refused
	 * path looks): shared holders are busy (the first of them reported), a
	 * semaphore's limit l a mismatch (-l).
	 */
	[S_ACQUIRE] =
	"if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then "
	"return redis.call('hincrby', KEYS[2], 'n', 1) end "
	"local cur = redis.pcall('get', KEYS[1]) "
	"if cur == ARGV[1] then return tonumber(redis.call('hget', KEYS[2], 'n')) or 0 end "
	"if type(cur) == 'table' then local l = tonumber(redis.call('hget', KEYS[2], 'l')) or 1 "
	"if l > 1 then return -l end return redis.call('zrange', KEYS[1], 0, 0)[1] or '' end "
	"return cur",
	/*
	 * KEYS: the queue keys (QUEUE_KEYS). ARGV: token, lease, waiter ttl,
	 * fair, hand-off µs, ticket. Takes the lock when free (fair: only with
	 * nobody ahead; a key that holds the token already, handed over or
	 * taken by an attempt whose reply was lost, gets the whole lease), else
	 * joins the queue (at the ticket, or after the last waiter when it is
	 * 0) or refreshes our place; the first waiter sets :due, when a release
	 * must hand over. Taking the lock increments the fence (F's n) and
	 * writes F's g, "<token>:<ms>", the grant time (the value's since_ms is
	 * when the wait began).
	 * Returns the fence (an integer) when the lock is ours; else how long
	 * to wait for a signal at most (the lock's remaining TTL, or the head's
	 * expiry when the lock is free but someone else is ahead) and the
	 * holder's value. A holder set there: its expired entries go (the key
	 * with the last), shared holders are busy, a semaphore's limit l is a
	 * mismatch (-l).
	 */
	[S_ENQUEUE] =
	LUA_KEYS
	"local cur = redis.pcall('get', K) "
	"if cur == tok then redis.call('zrem', q, tok) "
	"redis.call('zrem', qx, tok) redis.call('del', mine) "
	"redis.call('pexpire', K, ARGV[2]) "
	"return tonumber(redis.call('hget', F, 'n')) or 0 end "
	LUA_NOW LUA_PURGE
	"if type(cur) == 'table' then redis.call('zremrangebyscore', K, '-inf', now) "
	"local l = tonumber(redis.call('hget', F, 'l')) or 1 "
	"cur = redis.call('zrange', K, 0, 0)[1] or false "
	"if cur and l > 1 then return -l end end "
	"local ttl, lease = tonumber(ARGV[3]), tonumber(ARGV[2]) "
	"local head = redis.call('zrange', q, 0, 0)[1] "
	"if (ARGV[4] == '0' or not head or head == tok) and "
	"redis.call('set', K, tok, 'NX', 'PX', lease) then "
	"redis.call('zrem', q, tok) redis.call('zrem', qx, tok) "
	"if redis.call('exists', q) == 0 then redis.call('del', due) end "
	"local n = redis.call('hincrby', F, 'n', 1) "
	"redis.call('hset', F, 'g', tok:sub(1, 32) .. ':' .. now) return n end "
	"local keep = 4 * ttl + lease "
	"if not redis.call('zscore', q, tok) then "
	"if not head then redis.call('set', due, nowu + tonumber(ARGV[5]), 'PX', keep) end "
	"local at = tonumber(ARGV[6]) if at == 0 then "
	"at = (tonumber(redis.call('zrange', q, -1, -1, 'WITHSCORES')[2]) or 0) + 1 end "
	"redis.call('zadd', q, at, tok) head = redis.call('zrange', q, 0, 0)[1] end "
	"redis.call('zadd', qx, now + ttl, tok) "
	"redis.call('pexpire', q, keep) redis.call('pexpire', qx, keep) "
	"redis.call('pexpire', due, keep) "
	"local left = redis.call('pttl', K) "
	"if left <= 0 then return {math.max(tonumber(redis.call('zscore', qx, head)) - now, 1), ''} end "
	"return {left, cur or ''}",
	/*
	 * KEYS: the queue keys. ARGV: token, grant ttl, hand-off µs, signal ttl,
	 * turn done, ticket. Releases the lock only while it holds our token.
	 * A ticket (a waiter giving back what it took without a quorum) puts
	 * the releaser back in the queue at it first, so that the key goes to
	 * whoever comes first by ticket, maybe the releaser itself, and the
	 * queue keeps everyone it had. Nobody queued: delete it. The head
	 * not due yet (it has waited less than hand-off µs) and the releaser not
	 * done with its turn: delete it and wake the head ("w": try again; the
	 * releaser may take it first). Else hand it to the head: the key takes
	 * the head's token (for the grant ttl, until its first renewal), the
	 * fence (F's n) is incremented and F's g says "<head's token>:<ms>",
	 * the head's list gets "g:<fence>", and the next waiter is due
	 * hand-off µs from now. F's k, when it is our token, goes. A head that
	 * waits for a holder-set entry ("+") is woken, never handed the key.
	 */
	[S_RELEASE] =
	LUA_KEYS
	"if redis.pcall('get', K) ~= tok then return 0 end "
	LUA_UNKEEP
	"if ARGV[6] ~= '0' then " LUA_NOW
	"local ttl = tonumber(ARGV[2]) redis.call('zadd', q, ARGV[6], tok) "
	"redis.call('zadd', qx, now + ttl, tok) redis.call('set', due, 0, 'NX', 'PX', 4 * ttl) "
	"for _, k in ipairs({q, qx}) do if redis.call('pttl', k) < 0 then "
	"redis.call('pexpire', k, 4 * ttl) end end end "
	"local dueat = redis.call('get', due) "
	"if not dueat then redis.call('del', K) return 1 end "
	LUA_NOW LUA_PURGE
	"local head = redis.call('zrange', q, 0, 0)[1] "
	"if not head then redis.call('del', K, due) return 1 end "
	"local function signal(w, v) local s = sig .. w redis.call('del', s) "
	"redis.call('rpush', s, v) redis.call('pexpire', s, ARGV[4]) end "
	"if head:sub(1, 1) == '+' then redis.call('del', K) signal(head:sub(2), 'w') return 1 end "
	"if nowu < tonumber(dueat) and ARGV[5] ~= '1' then "
	"redis.call('del', K) signal(head, 'w') return 1 end "
	"redis.call('set', K, head, 'PX', ARGV[2]) "
	"redis.call('zrem', q, head) redis.call('zrem', qx, head) "
	"local n = redis.call('hincrby', F, 'n', 1) "
	"redis.call('hset', F, 'g', head:sub(1, 32) .. ':' .. now) "
	"signal(head, 'g:' .. n) "
	"if redis.call('exists', q) == 0 then redis.call('del', due) return 1 end "
	"redis.call('set', due, nowu + tonumber(ARGV[3]), 'KEEPTTL') return 1",
	/* KEYS: the lock. ARGV: token. Deletes it while it holds the token,
	 * touching nothing else: 1 deleted, 0 gone or not ours. */
	[S_UNLOCK] =
	"if redis.pcall('get', KEYS[1]) == ARGV[1] then "
	"return redis.call('del', KEYS[1]) else return 0 end",
	/* KEYS: the lock, its fencing counter. ARGV: token, fence. Raises the
	 * counter's n to the fence when it is lower (Redlock: a grant's fence,
	 * the largest of its quorum's, on each master of the quorum). 1. */
	[S_FENCE] =
	"if (tonumber(redis.call('hget', KEYS[2], 'n')) or 0) < tonumber(ARGV[2]) then "
	"redis.call('hset', KEYS[2], 'n', ARGV[2]) end return 1",
	/* KEYS: the lock, and its fencing counter when kept is given. ARGV:
	 * token, lease, and optionally kept: 1 the lease is kept between calls
	 * (F's k = our token), 2 in use again (F's k goes if it is ours); a
	 * plain renewal names the lock alone (a cluster slot in migration
	 * follows it by ASK). 1 renewed, 0 gone or not ours. */
	[S_RENEW] =
	"if redis.pcall('get', KEYS[1]) ~= ARGV[1] then return 0 end "
	"local t = ARGV[1]:sub(1, 32) "
	"if ARGV[3] == '1' then redis.call('hset', KEYS[2], 'k', t) "
	"elseif ARGV[3] == '2' and redis.call('hget', KEYS[2], 'k') == t then "
	"redis.call('hdel', KEYS[2], 'k') end "
	"return redis.call('pexpire', KEYS[1], ARGV[2])",
	/* KEYS: the queue keys. ARGV: token, signal ttl. Forgets the token:
	 * leaves the queue, deletes
	 * the lock if it holds the token; when the lock is free, the next head
	 * is woken ("w") to take it, and so is a "+" head (a holder-set
	 * waiter) beside a set, which may have room now that this waiter is
	 * no longer ahead of it. 1 when the lock held the token, else 0. */
	[S_LEAVE] =
	LUA_KEYS
	"redis.call('zrem', q, tok) redis.call('zrem', qx, tok) "
	"redis.call('del', mine) local held = 0 "
	"if redis.pcall('get', K) == tok then redis.call('del', K) held = 1 " LUA_UNKEEP "end "
	"if redis.call('exists', q) == 0 then redis.call('del', due) return held end "
	"local h = redis.call('zrange', q, 0, 0)[1] "
	"if redis.call('exists', K) == 0 or (h:sub(1, 1) == '+' and "
	"redis.call('type', K).ok == 'zset') then "
	"local s = sig .. (h:sub(1, 1) == '+' and h:sub(2) or h) "
	"redis.call('del', s) redis.call('rpush', s, 'w') redis.call('pexpire', s, ARGV[2]) end "
	"return held",
	/*
	 * The holder set (backend_item_set; the key layout above). KEYS: the
	 * lock, its counter, the queue and its expiries. ARGV: token, lease,
	 * limit, shared, pick (backend_item). The uncontended entry: with room and nobody queued,
	 * adds our entry and returns the fence; our entry there already (a
	 * lost reply) is renewed, the fence returned; a limit that differs
	 * from the holders' returns minus theirs; else the holder to report
	 * (a string, "" when the set has room but waiters are queued).
	 */
	[S_SACQUIRE] =
	LUA_KEYS LUA_NOW LUA_SET
	"local lease, lim, sh = tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4] == '1' "
	"if redis.call('exists', K, q) == 0 then return enter(lim, sh, lease, now, true) end "
	"local st, who = state(lim, sh, now, tonumber(ARGV[5])) "
	"if st == 'in' then return refresh(lease, now) end "
	"if type(st) == 'number' then return st end "
	"if st ~= 'busy' and redis.call('exists', q) == 1 then " LUA_PURGE "end "
	"if st ~= 'busy' and redis.call('exists', q) == 0 then "
	"return enter(lim, sh, lease, now, st == 'free') end "
	"return who or ''",
	/*
	 * KEYS: the queue keys. ARGV: token, lease, waiter ttl, fair, hand-off
	 * µs, ticket, limit, shared, signal ttl, pick. Takes an entry when there is
	 * room and nobody is ahead (fair or not: a queued exclusive caller
	 * keeps new shared ones out), else joins the queue as "+<token>" (at
	 * the ticket, or last) or refreshes its place. An entry taken writes
	 * F's g as S_ENQUEUE does, and wakes the next head when it is a "+"
	 * waiter with room too, so queued shared waiters enter together.
	 * Returns the fence, minus the holders' limit (a mismatch: the queue
	 * is left as it was), or how long to wait at most and the holder.
	 */
	[S_SENQUEUE] =
	LUA_KEYS LUA_NOW LUA_PURGE LUA_SIGNAL LUA_SET
	"local lease, ttl, lim = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[7]) "
	"local sh, me = ARGV[8] == '1', '+' .. tok "
	"local st, who, left = state(lim, sh, now, tonumber(ARGV[10])) "
	"if type(st) == 'number' then return st end "
	"local head = redis.call('zrange', q, 0, 0)[1] "
	"if st == 'in' or (st ~= 'busy' and (not head or head == me)) then "
	"redis.call('zrem', q, me) redis.call('zrem', qx, me) redis.call('del', mine) "
	"if redis.call('exists', q) == 0 then redis.call('del', due) end "
	"if st == 'in' then return refresh(lease, now) end "
	"local n = enter(lim, sh, lease, now, st == 'free') "
	"redis.call('hset', F, 'g', tok:sub(1, 32) .. ':' .. now) "
	"local nx = redis.call('zrange', q, 0, 0)[1] "
	"if nx and nx:sub(1, 1) == '+' and (sh or redis.call('zcard', K) < lim) then "
	"signal(nx, 'w', ARGV[9]) end return n end "
	"local keep = 4 * ttl + lease "
	"if not redis.call('zscore', q, me) then "
	"if not head then redis.call('set', due, nowu + tonumber(ARGV[5]), 'PX', keep) end "
	"local at = tonumber(ARGV[6]) if at == 0 then "
	"at = (tonumber(redis.call('zrange', q, -1, -1, 'WITHSCORES')[2]) or 0) + 1 end "
	"redis.call('zadd', q, at, me) head = redis.call('zrange', q, 0, 0)[1] end "
	"redis.call('zadd', qx, now + ttl, me) "
	"redis.call('pexpire', q, keep) redis.call('pexpire', qx, keep) "
	"redis.call('pexpire', due, keep) "
	"if not left then left = tonumber(redis.call('zscore', qx, head)) - now end "
	"return {math.max(left, 1), who or ''}",
	/*
	 * KEYS: the queue keys. ARGV: token, waiter ttl, signal ttl, ticket.
	 * Removes our entry (drop); 0 when it was not there. A ticket puts us
	 * back in the queue at it, as S_RELEASE does. Wakes the head when it
	 * can enter now (wake). 1.
	 */
	[S_SRELEASE] =
	LUA_KEYS LUA_SIGNAL LUA_SET_DROP
	"if drop() == 0 then return 0 end "
	LUA_SUNKEEP
	"if ARGV[4] == '0' and redis.call('exists', q, due) == 0 then return 1 end "
	"if ARGV[4] == '0' and redis.call('exists', q) == 0 then "
	"redis.call('del', due) return 1 end "
	LUA_NOW
	"if ARGV[4] ~= '0' then local ttl, me = tonumber(ARGV[2]), '+' .. tok "
	"redis.call('zadd', q, ARGV[4], me) redis.call('zadd', qx, now + ttl, me) "
	"redis.call('set', due, 0, 'NX', 'PX', 4 * ttl) "
	"for _, k in ipairs({q, qx}) do if redis.call('pttl', k) < 0 then "
	"redis.call('pexpire', k, 4 * ttl) end end end "
	"if redis.call('type', K).ok == 'zset' then "
	"redis.call('zremrangebyscore', K, '-inf', now) end "
	LUA_PURGE
	"if redis.call('exists', q) == 0 then redis.call('del', due) return 1 end "
	"wake(ARGV[3]) return 1",
	/* KEYS: the lock, and its counter when kept is given. ARGV: token,
	 * lease, kept (as S_RENEW, but per holder: 1 writes the counter's
	 * field k:<token>, 2 deletes it). Our entry still there and unexpired
	 * gets a new score (now + lease), the key's TTL raised to cover it: 1;
	 * else 0. A new mark first prunes the marks of tokens that hold no
	 * live entry (a holder that died while kept), so they never outnumber
	 * the set's holders at the last mark. */
	[S_SRENEW] =
	"local s = redis.pcall('zscore', KEYS[1], ARGV[1]) "
	"if type(s) ~= 'string' then return 0 end "
	LUA_NOW
	"local lease = tonumber(ARGV[2]) "
	"if tonumber(s) <= now then return 0 end "
	"local t = 'k:' .. ARGV[1]:sub(1, 32) "
	"if ARGV[3] == '1' and redis.call('hsetnx', KEYS[2], t, 1) == 1 then local live = {} "
	"for _, v in ipairs(redis.call('zrangebyscore', KEYS[1], '(' .. now, '+inf')) do "
	"live['k:' .. v:sub(1, 32)] = true end "
	"for _, f in ipairs(redis.call('hkeys', KEYS[2])) do "
	"if f:sub(1, 2) == 'k:' and not live[f] then redis.call('hdel', KEYS[2], f) end end "
	"elseif ARGV[3] == '2' then redis.call('hdel', KEYS[2], t) end "
	"redis.call('zadd', KEYS[1], now + lease, ARGV[1]) "
	"if redis.call('pttl', KEYS[1]) < lease then redis.call('pexpire', KEYS[1], lease) end "
	"return 1",
	/* KEYS: the queue keys. ARGV: token, signal ttl. Forgets the token:
	 * leaves the queue ("+<token>"), drops our entry, wakes the head when
	 * it can enter now. 1 when the entry was there, else 0. */
	[S_SLEAVE] =
	LUA_KEYS LUA_NOW LUA_PURGE LUA_SIGNAL LUA_SET_DROP
	"local me = '+' .. tok "
	"redis.call('zrem', q, me) redis.call('zrem', qx, me) redis.call('del', mine) "
	"local held = drop() "
	LUA_SUNKEEP
	"if redis.call('exists', q) == 0 then redis.call('del', due) return held end "
	"wake(ARGV[2]) return held",
	/* KEYS: the lock. ARGV: token. Removes our entry (or our string key),
	 * touching nothing else: 1 removed, 0 not there. */
	[S_SUNLOCK] =
	"local t = redis.call('type', KEYS[1]).ok "
	"if t == 'zset' then return redis.call('zrem', KEYS[1], ARGV[1]) end "
	"if t == 'string' and redis.call('get', KEYS[1]) == ARGV[1] then "
	"return redis.call('del', KEYS[1]) end return 0",
};

#define PENDING_MAX 16
#define WAKE_TTL_MS 1000 /* a wake-up outlives a waiter's race window, no more */
#define RECV_CHUNK 16384

/*
 * The most a reply to one of the shim's commands can hold. Their replies:
 * the scripts an integer, the holder's value (BACKEND_VAL_MAX) or {integer,
 * value}; BLPOP {list name, "g:<fence>"|"w"}; WAIT,
 * AUTH, SELECT, PING a line; SENTINEL get-master-addr-by-name {host,
 * port}; ROLE {"master", offset, {{ip, port, offset}...}}; CLUSTER SLOTS,
 * the largest: a range per slot at most (16384), each {start, end,
 * node...}, a node {ip, port, id, {hostname...}}: four levels deep.
 */
#define SCAN_ELEMENTS 16384        /* in one array: CLUSTER SLOTS's ranges */
#define SCAN_DEPTH 4               /* nested arrays: CLUSTER SLOTS's metadata */
#define SCAN_BULK (64 << 10)       /* one string (the longest: a hostname, a value) */
#define SCAN_LINE (64 << 10)       /* one status, error or integer line */
#define SCAN_REPLY (32 << 20)      /* 16384 single-slot ranges, 8 nodes each, 256 B a node */

/*
 * The scan of the bytes a connection receives, ahead of hiredis's reader
 * (hiredis 0.14 has no limit: an array header is allocated as announced,
 * a bulk string buffered until it is complete): where the stream is, item
 * by item, across chunks.
 */
struct scan {
	enum { SCAN_TYPE, SCAN_HEAD, SCAN_CR, SCAN_PAYLOAD } state;
	char type;          /* the item's first byte */
	int neg;            /* its number has a minus sign */
	long long num;      /* its number so far (array or bulk length) */
	size_t line;        /* bytes of its line so far */
	size_t payload;     /* a bulk string's bytes (and CRLF) still to come */
	int depth;          /* arrays open */
	long long left[SCAN_DEPTH]; /* items still due in each */
	size_t bytes;       /* of the reply being scanned */
};

#define ASYNC_ARGS 5 /* the most numeric arguments of an asynchronous script (S_RELEASE's) */

/* An asynchronous command whose reply is still unread, or (unsent) one
 * answered NOSCRIPT that is to be written again as EVAL. */
struct pending {
	enum script script;
	int sha;            /* sent by EVALSHA: NOSCRIPT says it never ran */
	enum { P_SENT, P_UNSENT, P_DONE } state; /* unsent: answered NOSCRIPT, to write again */
	unsigned long long seq; /* its place among the connection's commands */
	int nargs;
	long long args[ASYNC_ARGS];
	struct backend_copy c;
};

static char script_sha[NSCRIPTS][41];
static pthread_once_t sha_once = PTHREAD_ONCE_INIT;

struct backend_config {
	const struct redis_spec *r; /* the config's, frozen */
};

struct backend_conn {
	struct net_sock sock;
	redisReader *reader;
	char *out;          /* commands not sent yet */
	size_t outlen, outcap;
	long long cmd_ms;   /* command timeout (and the WAIT's, with wait_n) */
	int wait_n;         /* redis.wait_replicas */
	int one_of_many;    /* backend_redis_one_of_many */
	int wait_ms;        /* redis.wait_replicas_ms */
	int asked;          /* backend_redis_asked: scripts go as EVAL */
	int hold;           /* no resend now: an ASKING (until its command) or a BLPOP in flight */
	unsigned known;     /* scripts the server has cached, as far as this connection saw (1 << s) */
	unsigned long long nsent, nread; /* commands appended, replies read: a reply's place */
	int npending;       /* the pending commands, in no particular order (seq says) */
	struct pending pend[PENDING_MAX];
	int nredirected;    /* asynchronous commands a cluster node sent elsewhere */
	struct pending redirected[PENDING_MAX];
	long long owed;     /* replies due for the commands queued or sent */
	int broken;         /* a read failed: nothing more is sent or read */
	int tls;            /* redis.tls is on */
	int answered;       /* a reply was read */
	struct scan scan;
	char ioerr[160];    /* the last transport error */
	char errstr[192];
};

/* Sets errstr to "what: reason", the reason being r's error text or the
 * last transport error. Returns BACKEND_ERR. */
static int conn_fail(struct backend_conn *c, const char *what, const redisReply *r)
{
	if (r && r->type == REDIS_REPLY_ERROR)
		snprintf(c->errstr, sizeof(c->errstr), "%s: %s", what, r->str);
	else if (c->ioerr[0] && !c->tls && !c->answered && backend_plain_tls_hint(c->ioerr))
		snprintf(c->errstr, sizeof(c->errstr), "%s: %s; likely cause: %s", what, c->ioerr,
			 backend_plain_tls_hint(c->ioerr));
	else if (c->ioerr[0])
		snprintf(c->errstr, sizeof(c->errstr), "%s: %s", what, c->ioerr);
	else
		snprintf(c->errstr, sizeof(c->errstr), "%s: unexpected reply", what);
	return BACKEND_ERR;
}

void backend_redis_close(struct backend_conn *c)
{
	if (!c)
		return;
	net_close(&c->sock);
	if (c->reader)
		redisReaderFree(c->reader);
	free(c->out);
	free(c);
}

/* Queues len bytes for sending. Returns 0 or -1. */
static int out_add(struct backend_conn *c, const char *buf, size_t len)
{
	if (c->outlen + len > c->outcap) {
		size_t cap = c->outcap ? c->outcap : 4096;
		char *p;

		while (cap < c->outlen + len)
			cap *= 2;
		p = realloc(c->out, cap);
		if (!p) {
			snprintf(c->ioerr, sizeof(c->ioerr), "out of memory");
			return -1;
		}
		c->out = p;
		c->outcap = cap;
	}
	memcpy(c->out + c->outlen, buf, len);
	c->outlen += len;
	return 0;
}

/* Sends what is queued. Returns 0 or -1 (ioerr set). */
static int out_flush(struct backend_conn *c)
{
	size_t n = c->outlen;

	c->outlen = 0;
	if (c->broken)
		return -1;
	return n ? net_send(&c->sock, c->out, n, c->ioerr, sizeof(c->ioerr)) : 0;
}

/* One item of the stream is complete: closes the arrays it completes, and
 * counts the reply it completes. Returns 0, or -1 with ioerr set. */
static int scan_item(struct backend_conn *c)
{
	struct scan *sc = &c->scan;

	sc->state = SCAN_TYPE;
	while (sc->depth > 0) {
		if (--sc->left[sc->depth - 1] > 0)
			return 0;
		sc->depth--;
	}
	sc->bytes = 0;
	if (c->owed <= 0) {
		snprintf(c->ioerr, sizeof(c->ioerr), "protocol error: a reply nobody asked for");
		return -1;
	}
	c->owed--;
	return 0;
}

/* Sets ioerr to "protocol error: WHAT N (more than MAX)". Returns -1. */
static int scan_limit(struct backend_conn *c, const char *what, long long n, long long max)
{
	snprintf(c->ioerr, sizeof(c->ioerr), "protocol error: %s %lld (more than %lld)", what, n,
		 max);
	return -1;
}

/* The header line of the item (its type byte and number) is complete. */
static int scan_head(struct backend_conn *c)
{
	struct scan *sc = &c->scan;

	if (sc->type == '$' && !sc->neg) {
		sc->payload = (size_t)sc->num + 2;
		sc->state = SCAN_PAYLOAD;
		return 0;
	}
	if (sc->type == '*' && !sc->neg && sc->num > 0) {
		if (sc->depth == SCAN_DEPTH)
			return scan_limit(c, "arrays nested", SCAN_DEPTH + 1, SCAN_DEPTH);
		sc->left[sc->depth++] = sc->num;
		sc->state = SCAN_TYPE;
		return 0;
	}
	return scan_item(c); /* a line, nil, or an empty array */
}

/*
 * Scans n received bytes at p ahead of the reader: each array within
 * SCAN_ELEMENTS, SCAN_DEPTH deep, each bulk string within SCAN_BULK, each
 * line within SCAN_LINE, each reply within SCAN_REPLY and owed. A header
 * fails as soon as its digits pass the limit. Returns 0, or -1 with ioerr
 * set (the stream is then unusable).
 */
static int scan_feed(struct backend_conn *c, const char *p, size_t n)
{
	struct scan *sc = &c->scan;
	const char *end = p + n;

	while (p < end) {
		size_t k;

		if (sc->state == SCAN_PAYLOAD) {
			k = (size_t)(end - p) < sc->payload ? (size_t)(end - p) : sc->payload;
			p += k;
			sc->payload -= k;
			if ((sc->bytes += k) > SCAN_REPLY)
				return scan_limit(c, "reply of bytes", (long long)sc->bytes, SCAN_REPLY);
			if (sc->payload == 0 && scan_item(c) != 0)
				return -1;
			continue;
		}
		if (++sc->bytes > SCAN_REPLY)
			return scan_limit(c, "reply of bytes", (long long)sc->bytes, SCAN_REPLY);
		switch (sc->state) {
		case SCAN_TYPE:
			if (!strchr("+-:$*", *p) || !*p) {
				snprintf(c->ioerr, sizeof(c->ioerr), "protocol error: byte 0x%02x where "
					 "a reply's type was due", (unsigned char)*p);
				return -1;
			}
			sc->type = *p;
			sc->neg = 0;
			sc->num = 0;
			sc->line = 0;
			sc->state = SCAN_HEAD;
			break;
		case SCAN_HEAD:
			if (*p == '\r') {
				sc->state = SCAN_CR;
				break;
			}
			if (++sc->line > SCAN_LINE)
				return scan_limit(c, "line of bytes", (long long)sc->line, SCAN_LINE);
			if (sc->type != '$' && sc->type != '*')
				break;
			if (*p == '-' && sc->line == 1) {
				sc->neg = 1;
			} else if (*p >= '0' && *p <= '9') {
				sc->num = sc->num * 10 + (*p - '0');
				if (sc->type == '$' && !sc->neg && sc->num > SCAN_BULK)
					return scan_limit(c, "string of bytes", sc->num, SCAN_BULK);
				if (sc->type == '*' && !sc->neg && sc->num > SCAN_ELEMENTS)
					return scan_limit(c, "array of elements", sc->num, SCAN_ELEMENTS);
				if (sc->neg && sc->num > 1)
					return scan_limit(c, "negative length", -sc->num, -1);
			} else {
				snprintf(c->ioerr, sizeof(c->ioerr), "protocol error: byte 0x%02x in "
					 "a length", (unsigned char)*p);
				return -1;
			}
			break;
		case SCAN_CR:
			if (*p != '\n') {
				snprintf(c->ioerr, sizeof(c->ioerr), "protocol error: CR without LF");
				return -1;
			}
			if (scan_head(c) != 0)
				return -1;
			break;
		case SCAN_PAYLOAD:
			break;
		}
		p++;
	}
	return 0;
}

static int is_noscript(const redisReply *r)
{
	return r->type == REDIS_REPLY_ERROR && strncmp(r->str, "NOSCRIPT", 8) == 0;
}

/*
 * Sends what is queued, then reads one reply, the next in the stream
 * (whoever's it is: callers read their own through reply_next). Returns 0
 * with *r set (the caller frees it with freeReplyObject), or -1 with
 * ioerr set. A NOSCRIPT reply empties the scripts known to be cached.
 */
static int get_reply(struct backend_conn *c, redisReply **r)
{
	char buf[RECV_CHUNK];
	void *rep = NULL;

	if (out_flush(c) != 0)
		return -1;
	for (;;) {
		ssize_t n;

		if (redisReaderGetReply(c->reader, &rep) != REDIS_OK) {
			snprintf(c->ioerr, sizeof(c->ioerr), "protocol error: %s", c->reader->errstr);
			break;
		}
		if (rep) {
			*r = rep;
			c->answered = 1;
			c->nread++;
			if (is_noscript(rep))
				c->known = 0; /* SCRIPT FLUSH: every script is suspect */
			return 0;
		}
		n = net_recv(&c->sock, buf, sizeof(buf), c->ioerr, sizeof(c->ioerr));
		if (n < 0 || scan_feed(c, buf, (size_t)n) != 0)
			break;
		if (redisReaderFeed(c->reader, buf, (size_t)n) != REDIS_OK) {
			snprintf(c->ioerr, sizeof(c->ioerr), "protocol error: %s", c->reader->errstr);
			break;
		}
	}
	/* the stream is out of step (a reply cut short, a lie): never again */
	c->broken = 1;
	net_close(&c->sock);
	return -1;
}

/*
 * Commands are written in RESP into a stack buffer and queued ready-made:
 * no format parsing, no allocation on the hot path.
 */
struct resp {
	char *p, *end;
	char buf[4096 + QUEUE_KEYS * (KEY_BUF_SIZE + 16) + 2 * BACKEND_VAL_MAX];
};

/* Writes v in decimal at p; returns the end. */
static char *put_num(char *p, long long v)
{
	char tmp[24];
	int n = 0;
	unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;

	do
		tmp[n++] = (char)('0' + u % 10);
	while ((u /= 10) != 0);
	if (v < 0)
		*p++ = '-';
	while (n)
		*p++ = tmp[--n];
	return p;
}

static void resp_start(struct resp *r, int argc)
{
	r->p = r->buf;
	r->end = r->buf + sizeof(r->buf);
	*r->p++ = '*';
	r->p = put_num(r->p, argc);
	*r->p++ = '\r';
	*r->p++ = '\n';
}

/* Appends one bulk string made of the k pieces s[i] (n[i] bytes each);
 * returns -1 when it does not fit. */
static int resp_cat(struct resp *r, const char *const *s, const size_t *n, int k)
{
	size_t len = 0;

	for (int i = 0; i < k; i++)
		len += n[i];
	if (!r->p || (size_t)(r->end - r->p) < len + 32) {
		r->p = NULL;
		return -1;
	}
	*r->p++ = '$';
	r->p = put_num(r->p, (long long)len);
	*r->p++ = '\r';
	*r->p++ = '\n';
	for (int i = 0; i < k; i++) {
		memcpy(r->p, s[i], n[i]);
		r->p += n[i];
	}
	*r->p++ = '\r';
	*r->p++ = '\n';
	return 0;
}

/* Appends one bulk string; returns -1 when it does not fit. */
static int resp_arg(struct resp *r, const char *s, size_t n)
{
	return resp_cat(r, &s, &n, 1);
}

/* Appends one bulk string made of key, suffix and (tok) the item's value. */
static int resp_key(struct resp *r, const struct backend_item *it, const char *suffix,
		    int tok)
{
	const char *s[3] = { it->key, suffix, it->val };
	size_t n[3] = { it->klen, strlen(suffix), it->vlen };

	return resp_cat(r, s, n, tok ? 3 : 2);
}

static int resp_str(struct resp *r, const char *s)
{
	return resp_arg(r, s, strlen(s));
}

static int resp_num(struct resp *r, long long v)
{
	char tmp[24];

	return resp_arg(r, tmp, (size_t)(put_num(tmp, v) - tmp));
}

/* Queues the built command on c. Returns 0 or -1. */
static int resp_append(struct backend_conn *c, struct resp *r)
{
	if (!r->p) {
		snprintf(c->errstr, sizeof(c->errstr), "command too long");
		return -1;
	}
	if (out_add(c, r->buf, (size_t)(r->p - r->buf)) != 0)
		return conn_fail(c, "append", NULL);
	c->owed++;
	c->nsent++;
	c->hold = 0; /* an ASKING in flight is followed by its command now */
	return 0;
}

int backend_redis_split_addr(const char *s, char *host, size_t len, int *port)
{
	const char *colon = strrchr(s, ':');
	size_t n;

	if (!colon)
		return -1;
	n = (size_t)(colon - s);
	if (n >= 2 && s[0] == '[' && s[n - 1] == ']') {
		s++;
		n -= 2;
	}
	if (n >= len)
		return -1;
	memcpy(host, s, n);
	host[n] = 0;
	*port = atoi(colon + 1);
	return 0;
}

/* Sends AUTH and SELECT, when configured, in one round trip, whose
 * deadline the next command shares. Returns 0 or BACKEND_ERR. */
static int conn_setup(struct backend_conn *c, const struct redis_endpoint *r)
{
	struct resp cmd;
	int n = 0, rc = 0;

	if (r->password) {
		resp_start(&cmd, r->username ? 3 : 2);
		resp_str(&cmd, "AUTH");
		if (r->username)
			resp_str(&cmd, r->username);
		resp_str(&cmd, r->password);
		if (resp_append(c, &cmd) != 0)
			return -1;
		n++;
	}
	if (r->db) {
		resp_start(&cmd, 2);
		resp_str(&cmd, "SELECT");
		resp_num(&cmd, r->db);
		if (resp_append(c, &cmd) != 0)
			return -1;
		n++;
	}
	for (int i = 0; i < n; i++) {
		redisReply *rep = NULL;

		if (get_reply(c, &rep) != 0)
			return conn_fail(c, "setup", NULL);
		if (rep->type == REDIS_REPLY_ERROR && rc == 0)
			rc = conn_fail(c, i == 0 && r->password ? "AUTH" : "SELECT", rep);
		freeReplyObject(rep);
	}
	/* the first command ends by the set-up's deadline: one command timeout
	 * for both, as if they had gone in one round trip */
	c->sock.keep = n > 0;
	return rc;
}

/* Names every script by its SHA-1, as Redis's script cache does. */
static void sha_init(void)
{
	for (int s = 0; s < NSCRIPTS; s++)
		sha1_hex(scripts[s], strlen(scripts[s]), script_sha[s]);
}

/* This backend serves a single server (host and port, or socket). */
static int backend_redis_serves(const void *settings)
{
	const struct redis_spec *r = settings;

	return !r->sentinels && !r->cluster && !r->masters;
}

static struct backend_config *backend_redis_config_new(const void *settings, char *err,
						       size_t errlen)
{
	const struct redis_spec *r = settings;
	struct backend_config *bc = backend_calloc(sizeof(*bc), err, errlen);

	if (bc)
		bc->r = r;
	return bc;
}

static void backend_redis_config_free(struct backend_config *bc)
{
	free(bc);
}

struct backend_conn *backend_redis_connect(const struct redis_spec *r,
					   const struct redis_endpoint *ep,
					   char *err, size_t errlen)
{
	struct backend_conn *c = calloc(1, sizeof(*c));

	if (!c || !(c->reader = redisReaderCreate())) {
		snprintf(err, errlen, "out of memory");
		free(c);
		return NULL;
	}
	pthread_once(&sha_once, sha_init);
	c->wait_n = ep->wait_replicas;
	c->tls = r->tls.enabled;
	c->wait_ms = r->wait_replicas_ms;
	c->cmd_ms = r->command_timeout_ms + (c->wait_n ? c->wait_ms : 0);
	if (net_connect(&c->sock, ep->host, ep->port, ep->socket, &r->tls, r->connect_timeout_ms,
			c->cmd_ms, err, errlen) != 0) {
		backend_redis_close(c);
		return NULL;
	}
	if (conn_setup(c, ep) != 0) {
		snprintf(err, errlen, "%s", c->errstr[0] ? c->errstr : "setup failed");
		backend_redis_close(c);
		return NULL;
	}
	return c;
}

static struct backend_conn *backend_redis_open(const struct backend_config *bc, char *err,
				       size_t errlen)
{
	const struct redis_spec *r = bc->r;
	struct redis_endpoint ep = { r->host, r->port, r->socket, r->username, r->password,
				     r->db, r->wait_replicas };

	return backend_redis_connect(r, &ep, err, errlen);
}

/* Appends EVALSHA (or EVAL: eval, or after ASK) of script s with its keys
 * (script_nkeys of them; a plain renewal, one) and value, followed by the
 * numeric arguments args[0..nargs); an EVAL makes s known to be cached.
 * Returns 0 or -1. */
static int append_script(struct backend_conn *c, enum script s,
			 const struct backend_item *it, const long long *args, int nargs,
			 int eval)
{
	/* a renewal names the counter only to mark it kept or not */
	int nkeys = (s == S_RENEW || s == S_SRENEW) && !it->kept ? 1 : script_nkeys[s];
	struct resp r;

	resp_start(&r, 4 + nkeys + nargs);
	if (eval || c->asked) {
		resp_arg(&r, "EVAL", 4);
		resp_arg(&r, scripts[s], strlen(scripts[s]));
	} else {
		resp_arg(&r, "EVALSHA", 7);
		resp_arg(&r, script_sha[s], 40);
	}
	resp_num(&r, nkeys);
	for (int k = 0; k < nkeys; k++)
		resp_key(&r, it, queue_suffix[k], k == MINE_KEY);
	resp_arg(&r, it->val, it->vlen);
	for (int i = 0; i < nargs; i++)
		resp_num(&r, args[i]);
	if (resp_append(c, &r) != 0)
		return -1;
	if (eval || c->asked)
		c->known |= 1u << s; /* EVAL caches it */
	return 0;
}

/* A command running s (EVALSHA, or EVAL) was answered r: anything but
 * NOSCRIPT (or a redirection, sent before the script was looked up) says
 * the server has s cached at that point in the stream. */
static void script_seen(struct backend_conn *c, enum script s, const redisReply *r)
{
	if (!is_noscript(r) && !(r->type == REDIS_REPLY_ERROR && backend_redis_is_redirect(r->str)))
		c->known |= 1u << s;
}

void backend_redis_one_of_many(struct backend_conn *c)
{
	c->one_of_many = 1;
}

void backend_redis_asked(struct backend_conn *c, int on)
{
	c->asked = on;
	if (!on)
		c->hold = 0; /* the ASKING's command is over, if it was ever sent */
}

int backend_redis_is_redirect(const char *err)
{
	return strncmp(err, "MOVED ", 6) == 0 || strncmp(err, "ASK ", 4) == 0 ||
	       strncmp(err, "TRYAGAIN", 8) == 0 || strncmp(err, "CLUSTERDOWN", 11) == 0;
}

/* The name of asynchronous script s in the log. */
static const char *async_name(enum script s)
{
	return s == S_RELEASE || s == S_SRELEASE ? "release" :
	       s == S_LEAVE || s == S_SLEAVE ? "leave" : "fence";
}

/*
 * Logs the outcome of an asynchronous command read back later; keeps one
 * that a cluster node refused for another node, for backend_redis_redirected.
 * Returns 1 when p must be written again: an EVALSHA answered NOSCRIPT did
 * not run (an EVAL's NOSCRIPT cannot happen, and would be logged).
 */
static int settle_one(struct backend_conn *c, const struct pending *p, const redisReply *r)
{
	if (p->sha && is_noscript(r)) {
		LOG(LOG_DEBUG, "%s of %.*s: NOSCRIPT (SCRIPT FLUSH); sent again as EVAL",
		    async_name(p->script), (int)p->c.klen, p->c.key);
		return 1;
	}
	script_seen(c, p->script, r); /* an EVAL's reply too: it is cached at that point */
	if (r->type == REDIS_REPLY_ERROR && backend_redis_is_redirect(r->str) &&
	    p->script != S_FENCE && c->nredirected < PENDING_MAX) {
		LOG(LOG_DEBUG, "%s of %.*s: %s; sent again", async_name(p->script),
		    (int)p->c.klen, p->c.key, r->str);
		c->redirected[c->nredirected++] = *p;
	} else if (r->type == REDIS_REPLY_INTEGER && r->integer == 0 &&
		   (p->script == S_RELEASE || p->script == S_SRELEASE))
		LOG(c->one_of_many ? LOG_DEBUG : LOG_WARN, "%.*s was no longer ours at release "
		    "(expired or taken over); nothing deleted", (int)p->c.klen, p->c.key);
	else if (r->type != REDIS_REPLY_INTEGER)
		LOG(LOG_ERROR, "%s of %.*s failed: %s",
		    async_name(p->script), (int)p->c.klen, p->c.key,
		    r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply");
	return 0;
}

/* Returns the index of the pending command whose reply is the next in the
 * stream, or -1 when the next reply is not a pending command's. */
static int pending_next(const struct backend_conn *c)
{
	for (int i = 0; i < c->npending; i++)
		if (c->pend[i].state == P_SENT && c->pend[i].seq == c->nread)
			return i;
	return -1;
}

/* Drops the settled pending commands, keeping the others in their order. */
static void pending_compact(struct backend_conn *c)
{
	int n = 0;

	for (int i = 0; i < c->npending; i++) {
		if (c->pend[i].state == P_DONE)
			continue;
		if (i != n)
			c->pend[n] = c->pend[i];
		n++;
	}
	c->npending = n;
}

/* Writes each unsent pending command again as EVAL (it never ran), after
 * every command appended so far; it stays pending. Returns how many, or -1
 * with errstr set (those not written stay unsent, for unconfirmed()). */
static int pending_resend(struct backend_conn *c)
{
	int n = 0;

	for (int i = 0; i < c->npending; i++) {
		struct pending *p = &c->pend[i];
		struct backend_item it;

		if (p->state != P_UNSENT)
			continue;
		it = backend_copy_item(&p->c);
		p->seq = c->nsent;
		if (append_script(c, p->script, &it, p->args, p->nargs, 1) != 0)
			return -1;
		p->sha = 0;
		p->state = P_SENT;
		n++;
	}
	return n;
}

/*
 * Reads the replies of the pending asynchronous commands that come next in
 * the stream, and logs failures. A pending command's reply is read only at
 * its place (seq), so settle never takes the reply of a command appended
 * ahead of it whose caller reads it itself. Those answered NOSCRIPT are
 * written again as EVAL at the end of the stream (not between an ASKING
 * and its command: hold; then at the next settle), and read at once when
 * nothing is in flight ahead of them (the loop); else they stay pending
 * behind the caller's commands, read by the next settle once the caller
 * has read its replies. On a transport error the unread ones (and the
 * unsent) stay pending for unconfirmed(). Returns 0 or -1.
 *
 * Callers, and why each is safe with the resends:
 * - reply_after_pending (backend_redis_command, script_reply, fast_read,
 *   wait, ping) and reply_next (read_wait, renew_read, count, batch_read,
 *   pipeline), before a reply of the caller's own: its commands are
 *   appended already, so the resends go after them and are read later,
 *   at their place; the caller's own reply is the next one once settle
 *   returns, since every pending command ahead of it has been read.
 * - backend_redis_flush (fork, exec, exit; each node of Cluster and
 *   Redlock), backend_redis_renew and backend_redis_count before they
 *   append, send_async when the queue is full: nothing of theirs is in
 *   flight, so the resends are written, flushed and read in the loop.
 * - acquire_recv and renew_recv (Redlock's, after their _send): as
 *   reply_next, their commands in flight ahead of any resend.
 * - the cluster's ASKING (backend_redis_command): c->hold, set until its
 *   command is appended, keeps the resends out from between the two.
 * - backend_redis_wait settles before it appends BLPOP, and holds while
 *   it reads the BLPOP's reply, so that no resend waits behind a blocking
 *   command.
 */
static int settle(struct backend_conn *c)
{
	if (c->npending == 0)
		return 0;
	for (;;) {
		int k;

		while ((k = pending_next(c)) >= 0) {
			redisReply *r = NULL;

			if (get_reply(c, &r) != 0) {
				pending_compact(c);
				return conn_fail(c, "release", NULL);
			}
			c->pend[k].state = settle_one(c, &c->pend[k], r) ? P_UNSENT : P_DONE;
			freeReplyObject(r);
		}
		pending_compact(c);
		if (c->hold || (k = pending_resend(c)) == 0)
			return 0;
		if (k < 0)
			return -1;
	}
}

/* Reads the reply of the caller's next command (appended by it), after
 * those of the pending commands ahead of it. Returns 0 with *r set (the
 * caller frees it), or -1 with ioerr (settle: errstr) set. */
static int reply_next(struct backend_conn *c, redisReply **r)
{
	if (settle(c) != 0)
		return -1;
	return get_reply(c, r);
}

/*
 * Reads the reply of the command just appended, after the pending ones.
 * Returns it (the caller frees it) or NULL with errstr set.
 */
static redisReply *reply_after_pending(struct backend_conn *c, const char *what)
{
	redisReply *r = NULL;

	if (settle(c) != 0)
		return NULL;
	if (get_reply(c, &r) != 0) {
		conn_fail(c, what, NULL);
		return NULL;
	}
	return r;
}

/* Runs script s and returns its reply, retrying as EVAL on NOSCRIPT. */
redisReply *backend_redis_command(struct backend_conn *c, int argc, const char *const *argv)
{
	struct resp cmd;

	resp_start(&cmd, argc);
	for (int i = 0; i < argc; i++)
		if (resp_str(&cmd, argv[i]) != 0)
			return NULL;
	if (resp_append(c, &cmd) != 0)
		return NULL;
	/* ASKING covers the next command only: no resend between (settle) */
	c->hold = strcmp(argv[0], "ASKING") == 0;
	return reply_after_pending(c, argv[0]);
}

/*
 * Reads the reply of script s, appended by EVALSHA on it, after those of the
 * pending commands, sending it again as EVAL on NOSCRIPT. Returns the reply
 * (the caller frees it), or NULL with errstr set (an error reply too).
 */
static redisReply *script_reply(struct backend_conn *c, const char *what, enum script s,
				const struct backend_item *it, const long long *args, int nargs)
{
	redisReply *r = reply_after_pending(c, what);

	if (r)
		script_seen(c, s, r);
	if (r && is_noscript(r)) {
		freeReplyObject(r);
		if (append_script(c, s, it, args, nargs, 1) != 0)
			return NULL;
		r = reply_after_pending(c, what);
	}
	if (r && r->type == REDIS_REPLY_ERROR) {
		conn_fail(c, what, r);
		freeReplyObject(r);
		return NULL;
	}
	return r;
}

static redisReply *run_script(struct backend_conn *c, const char *what, enum script s,
			      const struct backend_item *it, const long long *args, int nargs)
{
	if (append_script(c, s, it, args, nargs, 0) != 0)
		return NULL;
	return script_reply(c, what, s, it, args, nargs);
}

/* Copies a holder's value (a bulk reply) out. */
static void holder_copy(const redisReply *r, char *holder, size_t *holder_len)
{
	*holder_len = 0;
	if (r && r->type == REDIS_REPLY_STRING && r->len <= BACKEND_VAL_MAX) {
		memcpy(holder, r->str, r->len);
		*holder_len = r->len;
	}
}

/* Appends WAIT for the connection's replicas (redis.wait_replicas).
 * Returns 0 or -1. */
static int append_wait(struct backend_conn *c)
{
	struct resp cmd;

	resp_start(&cmd, 3);
	resp_str(&cmd, "WAIT");
	resp_num(&cmd, c->wait_n);
	resp_num(&cmd, c->wait_ms);
	return resp_append(c, &cmd);
}

/* Reads the reply of an appended WAIT. Returns how many replicas
 * acknowledged, or -1 (errstr set). */
static long long read_wait(struct backend_conn *c)
{
	redisReply *r = NULL;
	long long n = -1;

	if (reply_next(c, &r) != 0) {
		conn_fail(c, "WAIT", NULL);
		return -1;
	}
	if (r->type == REDIS_REPLY_INTEGER)
		n = r->integer;
	else
		conn_fail(c, "WAIT", r);
	freeReplyObject(r);
	return n;
}

/*
 * After an acquire that took its key: returns BACKEND_OK when acked (the
 * WAIT's answer) reaches redis.wait_replicas; else releases the key and
 * returns BACKEND_ERR, the attempt counting as a Redis error.
 */
static int acknowledged(struct backend_conn *c, const struct backend_item *it, long long acked)
{
	if (acked >= c->wait_n)
		return BACKEND_OK;
	if (acked < 0)
		return BACKEND_ERR;
	backend_redis_release(c, it, 0);
	snprintf(c->errstr, sizeof(c->errstr), "acquire: WAIT: %lld of %d replica(s) "
		 "acknowledged within %d ms", acked, c->wait_n, c->wait_ms);
	return BACKEND_ERR;
}

/*
 * The uncontended path of the default mode: S_ACQUIRE, whose reply is the
 * fence when the key was set, or the holder's value when it was not.
 * WAIT follows in the same write when configured. eval: as EVAL (after
 * NOSCRIPT). Returns 0 or -1.
 */
static int fast_append(struct backend_conn *c, const struct backend_item *it, int eval)
{
	long long args[4] = { it->lease_ms, it->limit > 1 ? it->limit : 1, it->shared, it->pick };
	int set = backend_item_set(it);

	/* WAIT goes in the same write: one round trip plus the replication */
	if (append_script(c, set ? S_SACQUIRE : S_ACQUIRE, it, args, set ? 4 : 1, eval) != 0 ||
	    (c->wait_n && append_wait(c) != 0))
		return -1;
	return 0;
}

/* The key's holders took it with limit theirs, it with another: says both
 * in errstr. Returns BACKEND_MISMATCH. */
static int mismatch(struct backend_conn *c, const struct backend_item *it, long long theirs)
{
	snprintf(c->errstr, sizeof(c->errstr), "limit %d here, %lld for the key's holders",
		 it->limit > 1 ? it->limit : 1, theirs);
	return BACKEND_MISMATCH;
}

/* Reads the replies of fast_append's commands (once more after NOSCRIPT).
 * Returns an enum backend_result; holder and fence as acquire's. */
static int fast_read(struct backend_conn *c, const struct backend_item *it, char *holder,
		     size_t *holder_len, long long *fence)
{
	redisReply *rep;
	int rc;

	rep = reply_after_pending(c, "acquire");
	if (rep)
		script_seen(c, backend_item_set(it) ? S_SACQUIRE : S_ACQUIRE, rep);
	if (rep && is_noscript(rep)) {
		freeReplyObject(rep);
		if ((c->wait_n && read_wait(c) < 0) || fast_append(c, it, 1) != 0)
			return BACKEND_ERR;
		rep = reply_after_pending(c, "acquire");
	}
	if (!rep)
		return BACKEND_ERR;
	if (rep->type == REDIS_REPLY_INTEGER && rep->integer < 0) {
		rc = mismatch(c, it, -rep->integer);
	} else if (rep->type == REDIS_REPLY_INTEGER) {
		*fence = rep->integer;
		rc = BACKEND_OK;
	} else if (rep->type == REDIS_REPLY_STRING) {
		holder_copy(rep, holder, holder_len);
		rc = BACKEND_NO;
	} else {
		rc = conn_fail(c, "acquire", rep);
	}
	freeReplyObject(rep);
	if (c->wait_n) {
		/* read even after an error reply: the connection stays usable */
		long long acked = read_wait(c);

		if (rc != BACKEND_ERR && rc != BACKEND_MISMATCH)
			rc = rc == BACKEND_OK ? acknowledged(c, it, acked) :
			     acked < 0 ? BACKEND_ERR : rc;
	}
	return rc;
}

/* The queue script's numeric arguments for it (S_ENQUEUE's ENQUEUE_ARGS,
 * followed by S_SENQUEUE's). Returns the script and sets *nargs. */
static enum script enqueue_args(const struct backend_item *it, long long args[SENQUEUE_ARGS],
				int *nargs)
{
	args[0] = it->lease_ms;
	args[1] = it->waiter_ttl_ms;
	args[2] = it->fair;
	args[3] = it->fair ? 0 : it->handoff_us;
	args[4] = it->ticket;
	args[5] = it->limit > 1 ? it->limit : 1;
	args[6] = it->shared;
	args[7] = WAKE_TTL_MS;
	args[8] = it->pick;
	*nargs = backend_item_set(it) ? SENQUEUE_ARGS : ENQUEUE_ARGS;
	return backend_item_set(it) ? S_SENQUEUE : S_ENQUEUE;
}

/* Whether acquire takes it with S_ACQUIRE (else the queue script). */
static int plain_acquire(const struct backend_item *it)
{
	return !it->fair && !it->waiting;
}

/* Appends acquire's commands for it. Returns 0 or -1 (errstr set). */
static int acquire_append(struct backend_conn *c, const struct backend_item *it)
{
	long long args[SENQUEUE_ARGS];
	int nargs;
	enum script s;

	if (plain_acquire(it))
		return fast_append(c, it, 0);
	s = enqueue_args(it, args, &nargs);
	return append_script(c, s, it, args, nargs, 0);
}

/* Reads the replies of acquire_append's commands; as backend_redis_acquire. */
static int acquire_read(struct backend_conn *c, const struct backend_item *it,
			long long *wait_ms, char *holder, size_t *holder_len, long long *fence)
{
	long long args[SENQUEUE_ARGS];
	redisReply *r;
	enum script s;
	int rc, nargs;

	*holder_len = 0;
	*fence = 0;
	if (plain_acquire(it)) {
		*wait_ms = BACKEND_NOT_QUEUED;
		return fast_read(c, it, holder, holder_len, fence);
	}
	s = enqueue_args(it, args, &nargs);
	r = script_reply(c, "acquire", s, it, args, nargs);
	if (!r)
		return BACKEND_ERR;
	if (r->type == REDIS_REPLY_INTEGER && r->integer < 0) {
		rc = mismatch(c, it, -r->integer);
	} else if (r->type == REDIS_REPLY_INTEGER) {
		*fence = r->integer;
		rc = !c->wait_n ? BACKEND_OK :
		     acknowledged(c, it, append_wait(c) == 0 ? read_wait(c) : -1);
	} else if (r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
		   r->element[0]->type == REDIS_REPLY_INTEGER) {
		*wait_ms = r->element[0]->integer;
		holder_copy(r->element[1], holder, holder_len);
		rc = BACKEND_NO;
	} else {
		rc = conn_fail(c, "acquire", r);
	}
	freeReplyObject(r);
	return rc;
}

int backend_redis_acquire(struct backend_conn *c, const struct backend_item *it,
		  long long *wait_ms, char *holder, size_t *holder_len, long long *fence)
{
	*holder_len = 0;
	*fence = 0;
	if (acquire_append(c, it) != 0)
		return BACKEND_ERR;
	return acquire_read(c, it, wait_ms, holder, holder_len, fence);
}

int backend_redis_acquire_send(struct backend_conn *c, const struct backend_item *it)
{
	if (acquire_append(c, it) != 0)
		return BACKEND_ERR;
	return out_flush(c) == 0 ? BACKEND_OK : conn_fail(c, "acquire", NULL);
}

int backend_redis_acquire_recv(struct backend_conn *c, const struct backend_item *it,
		       long long *wait_ms, char *holder, size_t *holder_len, long long *fence)
{
	return acquire_read(c, it, wait_ms, holder, holder_len, fence);
}

int backend_redis_flush(struct backend_conn *c)
{
	c->hold = 0; /* nothing follows: a resend goes now */
	return settle(c) == 0 ? BACKEND_OK : BACKEND_ERR;
}

/*
 * Writes script s on it at once (more: with the next command written on c)
 * and remembers it; its reply is read later. Sent as EVALSHA when the
 * server is known to have s cached (c->known), else as EVAL, which caches
 * it; an EVALSHA answered NOSCRIPT is written again as EVAL by settle.
 * Settles first when the queue is full. Returns an enum backend_result.
 */
static int send_async(struct backend_conn *c, enum script s, const struct backend_item *it,
		      const long long *args, int nargs, int more)
{
	struct pending *p;
	int eval;

	if (c->npending == PENDING_MAX && settle(c) != 0)
		return BACKEND_ERR;
	if (c->npending == PENDING_MAX) { /* replies owed ahead of them: not now */
		snprintf(c->errstr, sizeof(c->errstr), "%s: too many replies unread",
			 async_name(s));
		return BACKEND_ERR;
	}
	eval = !(c->known & (1u << s)); /* as settle left it */
	p = &c->pend[c->npending];
	if (backend_copy_set(&p->c, it) != 0) {
		snprintf(c->errstr, sizeof(c->errstr), "key or value too long");
		return BACKEND_ERR;
	}
	/* Nobody waits for this reply: on a connection the server closed (a
	 * failover's CLIENT KILL) the command would be lost in silence. The
	 * command that writes it checks (more: a later one). */
	if (!more && !net_alive(&c->sock)) {
		snprintf(c->ioerr, sizeof(c->ioerr), "Server closed the connection");
		return conn_fail(c, async_name(s), NULL);
	}
	p->seq = c->nsent;
	if (append_script(c, s, it, args, nargs, eval) != 0)
		return BACKEND_ERR;
	p->script = s;
	p->sha = !eval && !c->asked;
	p->state = P_SENT;
	p->nargs = nargs;
	memcpy(p->args, args, sizeof(args[0]) * (size_t)nargs);
	c->npending++;
	if (more)
		return BACKEND_OK;
	if (out_flush(c) != 0) {
		c->npending--; /* the caller owns the fate of a command it could not send */
		return conn_fail(c, async_name(s), NULL);
	}
	return BACKEND_OK;
}

/* Runs script s on it; returns BACKEND_OK or BACKEND_NO (its integer
 * reply, nonzero or 0), or BACKEND_ERR. */
static int run_int(struct backend_conn *c, const char *what, enum script s,
		   const struct backend_item *it, const long long *args, int nargs)
{
	redisReply *r = run_script(c, what, s, it, args, nargs);
	int rc;

	if (!r)
		return BACKEND_ERR;
	if (r->type != REDIS_REPLY_INTEGER)
		rc = conn_fail(c, what, r);
	else
		rc = r->integer != 0 ? BACKEND_OK : BACKEND_NO;
	freeReplyObject(r);
	return rc;
}

int backend_redis_release(struct backend_conn *c, const struct backend_item *it, int async)
{
	long long args[5] = { it->waiter_ttl_ms, it->fair ? 0 : it->handoff_us, WAKE_TTL_MS,
			      it->turn_done, it->ticket };
	long long sargs[3] = { it->waiter_ttl_ms, WAKE_TTL_MS, it->ticket };
	int set = backend_item_set(it);
	enum script s = set ? S_SRELEASE : S_RELEASE;

	if (async)
		return send_async(c, s, it, set ? sargs : args, set ? 3 : 5,
				  async == BACKEND_ASYNC_MORE);
	return run_int(c, "release", s, it, set ? sargs : args, set ? 3 : 5);
}

int backend_redis_leave(struct backend_conn *c, const struct backend_item *it, int async)
{
	long long ttl = WAKE_TTL_MS;
	enum script s = backend_item_set(it) ? S_SLEAVE : S_LEAVE;

	if (async)
		return send_async(c, s, it, &ttl, 1, 0);
	return run_int(c, "leave", s, it, &ttl, 1);
}

int backend_redis_fence_send(struct backend_conn *c, const struct backend_item *it,
			     long long fence)
{
	return send_async(c, S_FENCE, it, &fence, 1, 0);
}

int backend_redis_unlock(struct backend_conn *c, const struct backend_item *it)
{
	return run_int(c, "unlock", backend_item_set(it) ? S_SUNLOCK : S_UNLOCK, it, NULL, 0);
}

/* Passes each of the n commands of p to fn as an item to forget (not a
 * fence: its token is still held, and the counter can only go up). */
static void hand_back(const struct pending *p, int n,
		      void (*fn)(void *arg, const struct backend_item *it), void *arg)
{
	for (int i = 0; i < n; i++) {
		struct backend_item it = backend_copy_item(&p[i].c);

		if (p[i].script != S_FENCE)
			fn(arg, &it);
	}
}

void backend_redis_unconfirmed(struct backend_conn *c,
		       void (*fn)(void *arg, const struct backend_item *it), void *arg)
{
	backend_redis_redirected(c, fn, arg);
	hand_back(c->pend, c->npending, fn, arg);
	c->npending = 0;
}

int backend_redis_redirected(struct backend_conn *c,
		     void (*fn)(void *arg, const struct backend_item *it), void *arg)
{
	int n = c->nredirected;

	c->nredirected = 0;
	hand_back(c->redirected, n, fn, arg);
	return n;
}

int backend_redis_wait(struct backend_conn *c, const struct backend_item *it,
	       long long timeout_ms, long long *fence)
{
	char secs[32];
	struct resp cmd;
	redisReply *r;
	int rc;

	resp_start(&cmd, 3);
	resp_arg(&cmd, "BLPOP", 5);
	resp_key(&cmd, it, queue_suffix[MINE_KEY], 1);
	resp_arg(&cmd, secs, (size_t)snprintf(secs, sizeof(secs), "%lld.%03lld",
					      timeout_ms / 1000, timeout_ms % 1000));
	/* A resend must not wait behind the BLPOP: the pending replies first
	 * (a round trip, but a wait follows the queue script's reply, so
	 * nothing is pending here unless a release was sent in between). */
	if (settle(c) != 0)
		return BACKEND_ERR;
	/* The socket must outwait the server's own timeout. */
	if (net_timeout(&c->sock, timeout_ms + c->cmd_ms, c->ioerr, sizeof(c->ioerr)) != 0)
		return conn_fail(c, "BLPOP", NULL);
	if (resp_append(c, &cmd) != 0)
		return -1;
	c->hold = 1; /* and none behind it (one deferred by an ASKING's hold) */
	r = reply_after_pending(c, "BLPOP");
	c->hold = 0;
	if (net_timeout(&c->sock, c->cmd_ms, c->ioerr, sizeof(c->ioerr)) != 0 && r) {
		freeReplyObject(r);
		return conn_fail(c, "BLPOP", NULL);
	}
	if (!r)
		return -1;
	*fence = 0;
	if (r->type == REDIS_REPLY_ARRAY && r->elements == 2) {
		const char *sig = r->element[1]->str;

		rc = sig && sig[0] == 'g' ? BACKEND_GRANTED : BACKEND_OK;
		if (rc == BACKEND_GRANTED && sig[1] == ':') /* "g:<fence>" */
			*fence = strtoll(sig + 2, NULL, 10);
	}
	else if (r->type == REDIS_REPLY_NIL)
		rc = BACKEND_NO;
	else
		rc = conn_fail(c, "BLPOP", r);
	freeReplyObject(r);
	return rc;
}

static enum script renew_script(const struct backend_item *it)
{
	return backend_item_set(it) ? S_SRENEW : S_RENEW;
}

/* Appends a renewal of each of the n items (and WAIT when configured).
 * Returns 0 or -1 (errstr set). */
static int renew_append(struct backend_conn *c, int n, const struct backend_item *items)
{
	for (int i = 0; i < n; i++) {
		long long args[2] = { items[i].lease_ms, items[i].kept };

		if (append_script(c, renew_script(&items[i]), &items[i], args,
				  items[i].kept ? 2 : 1, 0) != 0)
			return -1;
	}
	if (c->wait_n && n && append_wait(c) != 0)
		return -1;
	return 0;
}

/* Reads the replies of renew_append's commands (the pending ones read
 * already); as backend_redis_renew. */
static int renew_read(struct backend_conn *c, int n, const struct backend_item *items,
		      int *results)
{
	enum { REDO = BACKEND_GRANTED + 1 }; /* NOSCRIPT: run it again as EVAL */
	int rc = BACKEND_OK;

	for (int i = 0; i < n; i++) {
		redisReply *r = NULL;

		if (reply_next(c, &r) != 0)
			return conn_fail(c, "renew", NULL);
		script_seen(c, renew_script(&items[i]), r);
		if (is_noscript(r))
			results[i] = REDO; /* after the pipeline drains */
		else if (r->type == REDIS_REPLY_INTEGER)
			results[i] = r->integer != 0 ? BACKEND_OK : BACKEND_NO;
		else
			rc = results[i] = conn_fail(c, "renew", r);
		freeReplyObject(r);
	}
	if (c->wait_n && n && rc == BACKEND_OK) {
		long long acked = read_wait(c);

		if (acked < 0)
			return BACKEND_ERR;
		if (acked < c->wait_n)
			LOG(LOG_WARN, "renewal of %d lease(s) not acknowledged by %d replica(s) within "
			    "%d ms (%lld did); the leases are kept", n, c->wait_n, c->wait_ms, acked);
	}
	for (int i = 0; i < n && rc == BACKEND_OK; i++) {
		if (results[i] != REDO)
			continue;
		long long args[2] = { items[i].lease_ms, items[i].kept };

		results[i] = run_int(c, "renew", renew_script(&items[i]), &items[i], args,
				     items[i].kept ? 2 : 1);
		if (results[i] == BACKEND_ERR)
			rc = BACKEND_ERR;
	}
	return rc;
}

int backend_redis_renew(struct backend_conn *c, int n, const struct backend_item *items,
		int *results)
{
	if (settle(c) != 0 || renew_append(c, n, items) != 0)
		return BACKEND_ERR;
	return renew_read(c, n, items, results);
}

int backend_redis_renew_send(struct backend_conn *c, int n, const struct backend_item *items)
{
	if (renew_append(c, n, items) != 0)
		return BACKEND_ERR;
	return out_flush(c) == 0 ? BACKEND_OK : conn_fail(c, "renew", NULL);
}

int backend_redis_renew_recv(struct backend_conn *c, int n, const struct backend_item *items,
		     int *results)
{
	if (settle(c) != 0)
		return BACKEND_ERR;
	return renew_read(c, n, items, results);
}

const char *backend_redis_errstr(const struct backend_conn *c)
{
	return c->errstr;
}

int backend_redis_ping(struct backend_conn *c)
{
	struct resp cmd;
	redisReply *r;
	int rc;

	resp_start(&cmd, 1);
	resp_str(&cmd, "PING");
	if (resp_append(c, &cmd) != 0)
		return BACKEND_ERR;
	r = reply_after_pending(c, "PING");
	rc = r && r->type == REDIS_REPLY_STATUS ? BACKEND_OK : conn_fail(c, "PING", r);
	if (r)
		freeReplyObject(r);
	return rc;
}

/* The metrics' increments: one HINCRBY per field, pipelined (backend.h
 * count). Each command is small, so any number of fields fits. */
int backend_redis_count(struct backend_conn *c, const char *key, size_t klen, int n,
			const char *const *fields, const size_t *flens, const long long *deltas)
{
	int rc = BACKEND_OK;

	if (settle(c) != 0)
		return BACKEND_ERR;
	for (int i = 0; i < n; i++) {
		struct resp cmd;

		resp_start(&cmd, 4);
		resp_str(&cmd, "HINCRBY");
		resp_arg(&cmd, key, klen);
		resp_arg(&cmd, fields[i], flens[i]);
		resp_num(&cmd, deltas[i]);
		if (resp_append(c, &cmd) != 0)
			return BACKEND_ERR;
	}
	for (int i = 0; i < n; i++) {
		redisReply *r = NULL;

		if (reply_next(c, &r) != 0)
			return conn_fail(c, "HINCRBY", NULL);
		if (r->type != REDIS_REPLY_INTEGER && rc == BACKEND_OK)
			rc = conn_fail(c, "HINCRBY", r);
		freeReplyObject(r);
	}
	return rc;
}

/*
 * Reads the replies of the S_ACQUIRE or S_SACQUIRE of the items whose
 * results[i] is want, in order, into results and fences: BACKEND_OK,
 * BACKEND_NO (held, or a limit that differs: a negative number, which the
 * caller's acquire of that key alone reports), redo (NOSCRIPT) or
 * BACKEND_ERR. Returns BACKEND_OK, or BACKEND_ERR when a reply could not
 * be read or was an error.
 */
static int batch_read(struct backend_conn *c, int n, int *results, long long *fences,
		      int want, int redo)
{
	int rc = BACKEND_OK;

	for (int i = 0; i < n; i++) {
		redisReply *r = NULL;

		if (results[i] != want)
			continue;
		if (reply_next(c, &r) != 0)
			return conn_fail(c, "acquire", NULL);
		if (is_noscript(r)) {
			results[i] = redo;
		} else if (r->type == REDIS_REPLY_INTEGER && r->integer >= 0) {
			fences[i] = r->integer;
			results[i] = BACKEND_OK;
		} else if (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_INTEGER) {
			results[i] = BACKEND_NO;
		} else {
			rc = results[i] = conn_fail(c, "acquire", r);
		}
		freeReplyObject(r);
	}
	return rc;
}

/*
 * backend.h's acquire_batch (issue 22, several keys): the uncontended
 * acquire (fast_append: S_ACQUIRE, or S_SACQUIRE for a holder set) of each
 * item written at once, then every reply read; those refused by NOSCRIPT
 * are sent again together as EVAL. One server and Sentinel's primary
 * (REDIS_CONN_OPS); not with WAIT, nor on a connection of Redlock or of a
 * cluster's ASK (BACKEND_NO: one acquire per key there).
 */
int backend_redis_acquire_batch(struct backend_conn *c, int n, const struct backend_item *items,
				int *results, long long *fences)
{
	enum { SENT = BACKEND_GRANTED + 1, REDO }; /* REDO: NOSCRIPT, again as EVAL */
	int redo = 0;

	if (c->wait_n || c->asked || c->one_of_many)
		return BACKEND_NO;
	for (int i = 0; i < n; i++)
		if (!plain_acquire(&items[i]))
			return BACKEND_NO;
	for (int i = 0; i < n; i++) {
		fences[i] = 0;
		results[i] = SENT;
		if (fast_append(c, &items[i], 0) != 0)
			return BACKEND_ERR;
	}
	if (settle(c) != 0 || batch_read(c, n, results, fences, SENT, REDO) != BACKEND_OK)
		return BACKEND_ERR;
	for (int i = 0; i < n; i++)
		if (results[i] == REDO) {
			redo = 1;
			if (fast_append(c, &items[i], 1) != 0)
				return BACKEND_ERR;
		}
	if (redo && batch_read(c, n, results, fences, REDO, BACKEND_ERR) != BACKEND_OK)
		return BACKEND_ERR;
	return BACKEND_OK;
}

const struct backend_ops backend_redis = {
	.name = "redis",
	.settings = &backend_redis_settings,
	.serves = backend_redis_serves,
	.config_new = backend_redis_config_new,
	.config_free = backend_redis_config_free,
	.open = backend_redis_open,
	REDIS_CONN_OPS,
};

/*
 * `lockshim status` and `unlock`: ncmd commands written at once and their
 * replies read in one round trip. The reply limits stay the shim's: a
 * SCAN page (COUNT 1000) and a queue of waiters fit them.
 */
int backend_redis_pipeline(struct backend_conn *c, int ncmd, const int *argc,
			   const char *const *argv, const size_t *argvlen, redisReply **replies)
{
	struct resp cmd;
	int i, k = 0;

	for (i = 0; i < ncmd; i++)
		replies[i] = NULL;
	for (i = 0; i < ncmd; k += argc[i++]) {
		resp_start(&cmd, argc[i]);
		for (int j = k; j < k + argc[i]; j++)
			resp_arg(&cmd, argv[j], argvlen[j]);
		if (resp_append(c, &cmd) != 0) {
			/* those queued already would be sent with the next command */
			c->broken = 1;
			net_close(&c->sock);
			return -1;
		}
	}
	if (settle(c) != 0)
		return -1;
	for (i = 0; i < ncmd; i++) {
		if (reply_next(c, &replies[i]) != 0) {
			conn_fail(c, argv[0], NULL);
			while (i-- > 0) {
				freeReplyObject(replies[i]);
				replies[i] = NULL;
			}
			return -1;
		}
	}
	return 0;
}
