# SPDX-License-Identifier: MIT
"""`lockshim status` and `lockshim unlock` on holder sets (issue 22: a
semaphore's permits, shared holders), and `lockshim lock`'s --limit and
--shared option errors. The sets are seeded by the test in the layout the
shim's scripts write (doc/semantics.md): `<key>` a ZSET of lock values
(common/owner.h) scored by their expiry in ms of the server's clock,
`<key>:f` with `l` (the limit) and `m` ("s" shared, "x" exclusive
permits), waiters in `<key>:q` as "+<value>". These tests need no backend
support for sets (test_lock_sets.py has those that do), but for kept
holders, whose marks (`<key>:f`'s k:<token>) the shim's renewals write.

1. status: one object (line) per holder, each with limit and mode;
   expired members hidden; "+" waiters parsed; a string lock beside them
   is limit 1, exclusive; a set's holders cost one more round trip per
   page (TIME, ZRANGE WITHSCORES, HKEYS), a page of string locks none;
   every kept permit holder shown kept (real holders under the shim);
2. status: shared holders; zsets that are not lockshim's are skipped;
3. Redlock: a holder shown when a quorum of masters holds its value;
   Cluster: a set on any primary;
4. unlock: a live holder of a set on this host is refused without
   --force (exit 1, the set untouched);
5. lock: --shared with --limit, --limit outside 1..10000 or not a number:
   64 and COMMAND never started.
"""
import json
import os
import re
import signal
import socket
import subprocess
import time

import pytest

from support.server import started
from support.topology import Cluster, keyslot, lock_key
from support.util import CLI, MULT, run, write_config
from support.workers import calls

HOST = socket.gethostname()
OK = "call rc=42 errno=0"
FIELDS = {"key", "host", "pid", "tid", "program", "since", "held_ms", "lease_left_ms", "fence",
          "limit", "mode", "kept", "waiters"}


def cli(*args):
    """Runs `lockshim ARGS` without the shim; returns the CompletedProcess."""
    return run([CLI] + list(args))


def status_json(cfg, *args):
    """`status --json`'s objects, checked to have exactly the fields of
    lockshim(1) (and `masters` with Redlock)."""
    r = cli("status", "-c", cfg, "--json", *args)
    assert r.returncode == 0, r.stderr
    locks = [json.loads(line) for line in r.stdout.splitlines()]
    for l in locks:
        assert set(l) - {"masters"} == FIELDS, l
        assert isinstance(l["limit"], int) and l["mode"] in ("exclusive", "shared"), l
    return locks


def start_time(pid):
    """A process's start time (clock ticks after boot), /proc/PID/stat's 22nd field."""
    with open("/proc/%d/stat" % pid) as f:
        return int(f.read().rsplit(")", 1)[1].split()[19])


def value(n, pid, prog, since_ms=None, start=None, boot=None):
    """A lock value as the shim makes it (common/owner.h), token n. A pid of
    this machine with its real start time reads as alive here; boot: another
    machine's boot id."""
    with open("/proc/sys/kernel/random/boot_id") as f:
        here = f.read().strip()
    ns = os.stat("/proc/self/ns/pid").st_ino
    return "%032x:%s:%d:%d:%s:%d:%d:%d:%s" % (
        n, HOST, pid, pid, boot or here, ns, start if start is not None else 1,
        since_ms or int(time.time() * 1000), prog)


def server_ms(node):
    sec, usec = node.cmd("TIME")
    return int(sec) * 1000 + int(usec) // 1000


def seed_set(node, key, members, limit=3, mode="x", waiters=(), fence=7):
    """Makes key a holder set on node: members [(value, ms of lease left;
    negative: expired)], its counter hash's n, l and m, and waiters (values)
    queued as "+<value>"."""
    now = server_ms(node)
    args = []
    for v, left in members:
        args += [now + left, v]
    node.cmd("ZADD", key, *args)
    node.cmd("PEXPIRE", key, max(left for _, left in members) + 1000)
    node.cmd("HSET", key + ":f", "n", fence, "l", limit, "m", mode)
    for i, w in enumerate(waiters):
        node.cmd("ZADD", key + ":q", i + 1, "+" + w)
        node.cmd("ZADD", key + ":qx", now + 60000, "+" + w)


# ---- 1. one holder per line ----------------------------------------------------------

def test_status_semaphore(redis, tmp_path):
    cfg = write_config(tmp_path, redis, "")
    since = int(time.time() * 1000) - 5000
    a, b, gone = (value(1, 101, "alpha", since), value(2, 102, "beta", since + 1000),
                  value(3, 103, "gone"))
    w1, w2 = value(4, 104, "waiter", since + 2000), value(5, 105, "waiter", since + 3000)
    seed_set(redis, "lockshim:sem", [(b, 25000), (gone, -1000), (a, 20000)], limit=3,
             waiters=[w1, w2])
    # a's token marked kept, and gone's (expired: the mark is ignored)
    redis.cmd("HSET", "lockshim:sem:f", "k:" + a[:32], 1, "k:" + gone[:32], 1)
    plain = value(6, 106, "plain")
    redis.cmd("SET", "lockshim:plain", plain, "PX", 30000)
    redis.cmd("HSET", "lockshim:plain:f", "n", 4, "l", 5, "m", "s")  # stale l, m: not read
    redis.cmd("CONFIG", "RESETSTAT")
    locks = status_json(cfg)
    # one TIME, ZRANGE WITHSCORES and HKEYS for the page's one set; GET per key
    assert calls(redis, "time") == 1 and calls(redis, "get") == 2, locks
    assert calls(redis, "hkeys") == 1, locks
    assert calls(redis, "zrange") == 3, locks  # two queues, one set
    assert [(l["key"], l["pid"]) for l in locks] == [("plain", 106), ("sem", 101),
                                                      ("sem", 102)], locks
    p, la, lb = locks
    assert p["limit"] == 1 and p["mode"] == "exclusive" and p["fence"] == 4, p
    assert p["waiters"] == [] and 25000 < p["lease_left_ms"] <= 30000, p
    for l, prog, lease, kept in ((la, "alpha", 20000, True), (lb, "beta", 25000, False)):
        assert l["limit"] == 3 and l["mode"] == "exclusive", l
        assert l["program"] == prog and l["host"] == HOST and l["tid"] == l["pid"], l
        assert lease - 5000 < l["lease_left_ms"] <= lease, l
        assert l["fence"] is None and l["kept"] is kept, l  # whose token n is: unknown
        assert [w["pid"] for w in l["waiters"]] == [104, 105], l  # "+" stripped
        assert l["waiters"][0]["waited_ms"] >= l["waiters"][1]["waited_ms"] >= 2000, l
    assert la["since"].startswith(time.strftime("%Y-%m-%dT", time.gmtime(since / 1000))), la

    text = cli("status", "-c", cfg)
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert len(lines) == 3, lines
    assert re.match(r"^plain  held by \S+ pid 106 tid 106 \(plain\) since \S+Z \([\d.]+ s\), "
                    r"lease [\d.]+ s left, fence 4$", lines[0]), lines
    for line, pid, prog, kept in ((lines[1], 101, "alpha", ", kept"),
                                  (lines[2], 102, "beta", "")):
        assert re.match(r"^sem  held by \S+ pid %d tid %d \(%s\) since \S+Z \([\d.]+ s\), "
                        r"lease [\d.]+ s left, limit 3%s, 2 waiting, oldest \S+ pid 104 "
                        r"\(waiter\) [\d.]+ s$" % (pid, pid, prog, kept), line), line

    # the only member expired: nothing held (the key outlives it until its PTTL)
    redis.cmd("ZREM", "lockshim:sem", a, b)
    assert [l["key"] for l in status_json(cfg)] == ["plain"]


def test_status_pages_of_strings_cost_no_more(redis, tmp_path):
    """Without sets a page stays one round trip: no TIME, one ZRANGE per
    lock (its queue)."""
    cfg = write_config(tmp_path, redis, "")
    for i in range(3):
        redis.cmd("SET", "lockshim:s%d" % i, value(i + 1, 200 + i, "p"), "PX", 30000)
    redis.cmd("CONFIG", "RESETSTAT")
    assert [l["pid"] for l in status_json(cfg)] == [200, 201, 202]
    assert calls(redis, "time") == 0 and calls(redis, "zrange") == 3


def settled(read, want, timeout=10.0):
    """Calls read() until it returns want or timeout (s) passes; returns
    the last value read."""
    deadline = time.monotonic() + timeout * MULT
    got = read()
    while got != want and time.monotonic() < deadline:
        time.sleep(0.05)
        got = read()
    return got


@pytest.mark.timing
def test_status_kept_per_holder(progs, redis, tmp_path, procs):
    """limit = 3 on the shim's own sets (linger_ms 60 s, lease_ms 900, a
    kept permit marked at its renewals): two holders whose calls ended
    keep their permits (each driver waits on stdin), a third is in its
    call: `status --json` shows both kept, the third not. Then one of the
    two calls again (in use: not kept), the other exits (its mark goes
    with its release), and a holder SIGKILLed while kept leaves a mark
    that the next holder marked kept prunes once the dead one's permit has
    expired. Control: before kept was per holder, the counter hash's one
    field k named a single token, and this run showed one of the two kept
    holders kept and the other not (verified before the change)."""
    c = write_config(tmp_path, redis, 'locks = ( { symbol = "hold_call"; key = "k"; limit = 3; '
                     'lease_ms = 900; linger_ms = 60000; handoff_ms = 30000; } );\n')
    driver = progs["driver"]

    def kept():
        return {l["pid"]: l["kept"] for l in status_json(c)}

    def marks():
        return sorted(f[2:] for f in redis.cmd("HKEYS", "lockshim:k:f") if f.startswith("k:"))

    def token(p):
        return [v[:32] for v in redis.cmd("ZRANGE", "lockshim:k", 0, -1)
                if v.split(":")[2] == str(p.p.pid)][0]

    again = procs([driver, "call:0", "stdin", "call:60000"], c)
    leaves = procs([driver, "call:0", "stdin"], c)
    for p in (again, leaves):
        assert p.expect("call") == OK
    busy = procs([driver, "call:60000"], c)
    busy.expect("enter")
    both = {again.p.pid: True, leaves.p.pid: True, busy.p.pid: False}
    assert settled(kept, both) == both
    assert marks() == sorted([token(again), token(leaves)])

    again.send()
    again.expect("enter")
    one = {again.p.pid: False, leaves.p.pid: True, busy.p.pid: False}
    assert settled(kept, one) == one
    gone = token(leaves)
    leaves.send()
    assert leaves.finish()[0] == 0
    assert gone not in marks() and kept() == {again.p.pid: False, busy.p.pid: False}

    dead = procs([driver, "call:0", "stdin"], c)
    assert dead.expect("call") == OK
    three = {again.p.pid: False, busy.p.pid: False, dead.p.pid: True}
    assert settled(kept, three) == three
    stale = token(dead)
    dead.signal(signal.SIGKILL)
    dead.finish()
    assert settled(lambda: dead.p.pid in kept(), False) is False  # its permit expired
    assert marks() == [stale]
    late = procs([driver, "call:0", "stdin"], c)
    assert late.expect("call") == OK
    assert settled(kept, {again.p.pid: False, busy.p.pid: False, late.p.pid: True})[
        late.p.pid] is True
    assert marks() == [token(late)]  # the dead holder's mark pruned


# ---- 2. shared holders, foreign zsets ---------------------------------------------------

def test_status_shared(redis, tmp_path):
    cfg = write_config(tmp_path, redis, "")
    seed_set(redis, "lockshim:rw", [(value(1, 301, "reader"), 30000),
                                    (value(2, 302, "reader"), 30000)], limit=1, mode="s",
             waiters=[value(3, 303, "reader")])
    # an exclusive waiter (no "+") queued behind the readers
    redis.cmd("ZADD", "lockshim:rw:q", 0, value(4, 304, "writer"))
    locks = status_json(cfg)
    assert [l["pid"] for l in locks] == [301, 302], locks
    assert all(l["mode"] == "shared" and l["limit"] == 1 for l in locks), locks
    assert [w["pid"] for w in locks[0]["waiters"]] == [304, 303], locks
    lines = cli("status", "-c", cfg).stdout.splitlines()
    assert len(lines) == 2 and all(", shared, 2 waiting, oldest " in l for l in lines), lines
    assert all(", limit" not in l for l in lines), lines


def test_status_skips_zsets_not_lockshims(redis, tmp_path):
    """A zset whose counter hash has no (or a bad) l and m, or whose members
    are not lock values, holds no lock; a "+" waiter on a string lock (a
    shared caller behind an exclusive holder) is a waiter."""
    cfg = write_config(tmp_path, redis, "")
    seed_set(redis, "lockshim:bad-limit", [(value(1, 401, "p"), 30000)], limit=0)
    seed_set(redis, "lockshim:bad-mode", [(value(2, 402, "p"), 30000)], mode="r")
    redis.cmd("ZADD", "lockshim:no-hash", server_ms(redis) + 30000, value(3, 403, "p"))
    seed_set(redis, "lockshim:junk", [("not a lock value", 30000)])
    redis.cmd("HSET", "lockshim:a-hash", "x", "y")  # WRONGTYPE for ZRANGE too
    redis.cmd("SET", "lockshim:x", value(5, 405, "excl"), "PX", 30000)
    redis.cmd("ZADD", "lockshim:x:q", 1, "+" + value(6, 406, "reader"))
    [l] = status_json(cfg)
    assert l["pid"] == 405 and [w["pid"] for w in l["waiters"]] == [406], l


# ---- 3. topologies -------------------------------------------------------------------

def test_redlock_quorum_per_holder(masters, tmp_path):
    """Each holder is judged on its own: one on 2 of 3 masters is shown
    (masters 2), one on 1 of 3 is not."""
    cfg = masters.config(tmp_path, "")
    a, b = value(1, 501, "reader"), value(2, 502, "reader")
    seed_set(masters.nodes[0], "lockshim:rw", [(a, 30000), (b, 30000)], limit=1, mode="s")
    seed_set(masters.nodes[1], "lockshim:rw", [(a, 20000)], limit=1, mode="s")
    [l] = status_json(cfg)
    assert l["pid"] == 501 and l["masters"] == 2 and l["mode"] == "shared", l
    assert 15000 < l["lease_left_ms"] <= 20000, l  # the shortest
    assert "on 2 masters" in cli("status", "-c", cfg).stdout


@pytest.fixture
def cluster(request):
    yield from started(request, Cluster(replicas=0))


def test_cluster(cluster, tmp_path):
    """Sets on two primaries are both read (KEY without the braces)."""
    keys, seen = [], set()
    for i in range(64):  # two keys whose slots two different primaries serve
        k = "s%d" % i
        owner = cluster.owner(keyslot(lock_key(k)))
        if owner.port not in seen:
            seen.add(owner.port)
            keys.append((k, owner))
        if len(keys) == 2:
            break
    for n, (k, owner) in enumerate(keys):
        seed_set(owner, lock_key(k), [(value(n + 1, 600 + n, "p"), 30000)], limit=2)
    cfg = cluster.config(tmp_path, "")
    locks = status_json(cfg)
    assert sorted((l["key"], l["pid"], l["limit"]) for l in locks) == \
        [(k, 600 + n, 2) for n, (k, _) in enumerate(keys)], locks


# ---- 4. unlock -----------------------------------------------------------------------

def test_unlock_refuses_live_set_holder(redis, tmp_path):
    """A holder of the set alive on this host (a process of the test, its
    real start time) is refused without --force, the set untouched."""
    cfg = write_config(tmp_path, redis, "")
    p = subprocess.Popen(["sleep", "60"])
    try:
        live = value(1, p.pid, "sleep", start=start_time(p.pid))
        seed_set(redis, "lockshim:sem", [(live, 30000)], limit=2)
        r = cli("unlock", "-c", cfg, "sem")
        assert r.returncode == 1 and r.stdout == "", r
        assert "alive" in r.stderr and "pid %d" % p.pid in r.stderr, r.stderr
        assert redis.cmd("ZRANGE", "lockshim:sem", 0, -1) == [live]
    finally:
        p.kill()
        p.wait()
    assert cli("unlock", "-c", cfg, "nothing-here").returncode == 1


# ---- 5. lock's options ------------------------------------------------------------------

@pytest.mark.parametrize("args,says", [
    (["--shared", "--limit", "2"], "--shared and --limit"),
    (["--limit", "2", "--shared"], "--shared and --limit"),
    (["--limit", "0"], "--limit"),
    (["--limit", "10001"], "--limit"),
    (["--limit", "3x"], "--limit"),
    (["--limit", ""], "--limit"),
])
def test_lock_option_errors(redis, tmp_path, args, says):
    cfg = write_config(tmp_path, redis, "")
    mark = str(tmp_path / "ran")
    r = cli("lock", "-c", cfg, *args, "k", "--", "touch", mark)
    assert r.returncode == 64, r
    first = r.stderr.splitlines()[0]
    assert first.startswith("lockshim: ") and says in first, r.stderr
    assert "usage:" in r.stderr and not os.path.exists(mark)


def test_lock_good_options_run(redis, tmp_path):
    """The control of the errors above: valid --limit and --shared run COMMAND."""
    cfg = write_config(tmp_path, redis, "")
    for args in (["--limit", "1"], ["--limit", "10000"], ["--shared"]):
        mark = str(tmp_path / ("ran%s" % args[-1]))
        r = cli("lock", "-c", cfg, *args, "k", "--", "touch", mark)
        assert r.returncode == 0 and os.path.exists(mark), (args, r)


def test_lock_limit_needs_a_value(redis, tmp_path):
    cfg = write_config(tmp_path, redis, "")
    r = cli("lock", "-c", cfg, "--limit")
    assert r.returncode == 64 and "--limit needs a value" in r.stderr, r
