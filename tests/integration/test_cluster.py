# SPDX-License-Identifier: MIT
"""Redis Cluster as the backend (`redis = { cluster = ( "host:port", ... ); }`).

Each cluster test gets its own cluster on 127.0.0.1 free ports (each node's
bus port chosen free too, with --cluster-port): three primaries and three
replicas joined by `redis-cli --cluster create --cluster-replicas 1`
(node timeout 1 s), or three primaries alone for the tests that need a
primary nobody replaces. The fixture waits, by polling, until every node
says cluster_state:ok with all 16384 slots and every replica's link is up;
every process is stopped by its pid when the test ends, after a SIGCONT.
Slot ownership is read from CLUSTER NODES; key slots are computed by
support/topology.py (CRC16 of the hash tag) and checked here against
CLUSTER KEYSLOT. The cluster is support/topology.py's Cluster, the counter
workload and its programs support/workers.py's.

1. mutual exclusion across processes and threads on three keys whose slots
   are on the three primaries (every primary serves lock traffic), against
   a control run without the shim that loses updates;
2. the key layout: a lock key is `<namespace>:{<key>}` on the primary that
   owns its slot, and its queue keys sit next to it; a user hash tag
   (`{{ledger}}:{pid}`) puts two locks' keys in one slot, on one node; an
   argument with braces (percent-encoded) leaves the tag the whole key, and
   every key of its lock is in that slot;
3. a slot migrated while workers update a counter guarded by a key of that
   slot: ASK followed during the migration, MOVED after it, counter exact,
   no call fails or hangs; a lease held while its key migrates follows it
   (renewed at the target, released there); a lease lost is reported by
   on_lost with the cluster key; a release during a migration reaches the
   importing node (after ASK, through a flushed script cache), and six
   back-and-forth migrations under load abandon no release;
4. a primary SIGKILLed and its replica promoted while workers run: no
   program dies, no call fails or hangs beyond wait_ms, the counter is
   exact unless a lost lease was reported; a held lease's renewals and the
   workers' acquires reach the promoted node within cluster-node-timeout
   + lease_ms/3 + 2 s of the promotion;
5. fair mode orders waiters by arrival; a waiter is woken by the release,
   not by its retry_max_ms re-check;
6. `lockshim check` self-tests every primary and names each; with a primary
   SIGKILLed (no replicas) it exits 69 naming that node.
"""
import os
import re
import subprocess
import time

import pytest

from resp import RespError
from support.server import namespace_keys, started
from support.topology import Cluster, keyslot, lock_key, stop_pid
from support.util import CLI, MULT, TIMEOUT, run, shim_env, wait_for
from support.workers import (WORK, assert_lost_format, calls, counter, finish_workers, lost_lines,
                             start_workers)

pytestmark = pytest.mark.timing  # time bounds and forced races: make test-repeat

OK_LINE = "call rc=42 errno=0"


# ---- the cluster (support/topology.py) ----------------------------------------------

@pytest.fixture
def cluster(request):
    """Three primaries, each with one replica."""
    yield from started(request, Cluster())


@pytest.fixture
def bare_cluster(request):
    """Three primaries, no replicas: a primary killed stays down."""
    yield from started(request, Cluster(replicas=0))


def test_keyslot_matches_redis(cluster):
    """The slot computation the tests rely on is Redis's, hash tags included
    (the lock-key layout's, and a user tag inside it)."""
    n = cluster.nodes[0]
    for key in ("ledger", lock_key("ledger"), lock_key("{ledger}:7"), lock_key("/tmp/x/c0"),
                lock_key("blk") + ":q", "a{}b", "{}{x}"):
        assert keyslot(key) == n.cmd("CLUSTER", "KEYSLOT", key), key
    assert keyslot(lock_key("{ledger}:7")) == keyslot("{ledger")
    assert sorted(p.port for p in cluster.primaries()) == sorted(
        v["port"] for v in cluster.view() if "master" in v["flags"])


# ---- 1. exclusion over every primary -------------------------------------------------

SPREAD = ('locks = ( { symbol = "ledger_update"; key = "{arg0:str}"; lease_ms = 5000; '
          'wait_ms = %d; on_timeout = "skip"; return = -7; } );\n')
GROUP_PROCS, GROUP_THREADS, GROUP_ITER = 2, 2, 40


def spread_paths(tmp_path, cluster):
    """One counter path per primary (in cluster.primaries() order): names
    c<i> are tried until each primary owns the slot of one path's lock key
    (the key is the path itself, "{arg0:str}")."""
    view = [v for v in cluster.view() if "master" in v["flags"]]
    want = [p.port for p in cluster.primaries()]
    found = {}
    for i in range(10000):
        path = str(tmp_path / ("c%d" % i))
        assert "{" not in path and "}" not in path, path
        slot = keyslot(lock_key(path))
        found.setdefault(next(v["port"] for v in view if slot in v["slots"]), path)
        if len(found) == len(want):
            return [found[p] for p in want]
    raise AssertionError("no paths spreading over %d primaries" % len(want))


def test_control_spread_workers_lose_updates(worker_progs, tmp_path):
    """Without the shim, the workload of the exclusion test below loses
    updates on every counter: its exact counts mean something."""
    stop = str(tmp_path / "stop")
    env = shim_env(None, preload=False)
    paths = [str(tmp_path / ("c%d" % i)) for i in range(3)]
    ps = []
    for path in paths:
        with open(path, "w") as f:
            f.write("0\n")
        ps += [subprocess.Popen([worker_progs["worker"], path, str(GROUP_THREADS), str(GROUP_ITER), stop],
                                env=env, stdout=subprocess.PIPE, text=True)
               for _ in range(GROUP_PROCS)]
    try:
        outs = [p.communicate(timeout=TIMEOUT)[0] for p in ps]
    finally:
        for p in ps:
            stop_pid(p)
    assert all(p.returncode == 0 for p in ps), outs
    for path in paths:
        assert counter(path) < GROUP_PROCS * GROUP_THREADS * GROUP_ITER, path


def test_exclusion_on_keys_over_every_primary(cluster, worker_progs, bg, tmp_path):
    """Three counters whose lock keys live on the three primaries, each
    updated by 2 processes x 2 threads x 40 calls at once: every call
    succeeds, every counter is exact, every primary served lock commands,
    and no lock key is left behind."""
    primaries = cluster.primaries()
    paths = spread_paths(tmp_path, cluster)
    for path, p in zip(paths, primaries):
        assert cluster.owner(keyslot(lock_key(path))) is p
        p.cmd("CONFIG", "RESETSTAT")
    cfg = cluster.config(tmp_path, SPREAD % 30000)
    stop = str(tmp_path / "stop")
    ws = []
    for path in paths:
        ws.append(start_workers(bg, worker_progs, cfg, path, stop, procs=GROUP_PROCS,
                                threads=GROUP_THREADS, maxiter=GROUP_ITER))
    for path, group in zip(paths, ws):
        total, err = finish_workers(group, 30000)
        assert total == GROUP_PROCS * GROUP_THREADS * GROUP_ITER, err[-3000:]
        assert counter(path) == total, (path, err[-3000:])
        assert lost_lines(err) == [], err[-3000:]
    for p in primaries:
        assert calls(p, "set") > 0, "primary %d served no SET" % p.port
    wait_for(lambda: all(v == [] for v in cluster.keys().values()), timeout=10,
             what="every lock key to be released")


# ---- 2. key layout ------------------------------------------------------------------

BLK = 'locks = ( { symbol = "block_call"; key = "%s"; wait_ms = 30000; %s } );\n'


def test_lock_and_queue_keys_live_on_the_slot_owner(cluster, worker_progs, bg, tmp_path):
    """While H holds "blk" and W waits for it, lockshim:{blk} (H's value) and
    its queue lockshim:{blk}:q (W queued) are on the primary that owns the
    slot of "blk", and no other primary has any lockshim key; once both
    calls are over no lock key is left."""
    key = lock_key("blk")
    slot = keyslot("blk")
    owner = cluster.owner(slot)
    others = [p for p in cluster.primaries() if p is not owner]
    cfg = cluster.config(tmp_path, BLK % ("blk", "lease_ms = 20000;"))
    h = bg([worker_progs["block"]], cfg)
    h.expect("enter")
    assert ":%d:" % h.p.pid in owner.cmd("GET", key)
    w = bg([worker_progs["block"]], cfg)
    wait_for(lambda: owner.cmd("ZCARD", key + ":q") == 1, what="W queued in %s:q" % key)
    held = namespace_keys(owner)
    assert key in held and key + ":q" in held, held
    assert all(k.startswith(key) and keyslot(k) == slot for k in held), held
    for p in others:
        assert namespace_keys(p) == [], p.port
    assert w.lines.empty()
    h.send()
    assert h.expect("call") == OK_LINE
    w.expect("enter")
    assert ":%d:" % w.p.pid in owner.cmd("GET", key)
    w.send()
    assert w.expect("call") == OK_LINE
    for p in (h, w):
        assert p.wait() == 0, p.stderr()
    wait_for(lambda: all(v == [] for v in cluster.keys().values()), timeout=10,
             what="every lock key to be released")


def test_an_argument_with_braces_keeps_its_lock_in_one_slot(cluster, progs, procs, tmp_path):
    """key = "kc:{arg0:str}", the argument a path ending in "xN}{y": its
    braces are percent-encoded, so the hash tag is the whole expanded key.
    While H holds it (log_call opens a FIFO: blocked until the test reads)
    and W waits for it, the lock key and its queue keys are all in the slot
    of that tag, on its primary; N is chosen so that the slot of the tag an
    unencoded '}' would end ("kc:<dir>/xN") is owned by another primary."""
    d = str(tmp_path)
    for n in range(1000):
        enc = "kc:%s/x%d%%7D%%7By" % (d, n)
        if cluster.owner(keyslot(lock_key(enc))) is not cluster.owner(
                keyslot(lock_key("kc:%s/x%d" % (d, n)))):
            break
    path = "%s/x%d}{y" % (d, n)
    os.mkfifo(path)
    key, slot = lock_key(enc), keyslot(enc)
    owner = cluster.owner(slot)
    cfg = cluster.config(tmp_path, 'locks = ( { symbol = "log_call"; key = "kc:{arg0:str}"; '
                         'lease_ms = 20000; wait_ms = 30000; } );\n')
    h = procs([progs["driver"], "log:" + path], cfg)
    wait_for(lambda: ":%d:" % h.p.pid in (owner.cmd("GET", key) or ""),
             what="H holding %s" % key)
    w = procs([progs["driver"], "log:" + path], cfg)
    wait_for(lambda: owner.cmd("ZCARD", key + ":q") == 1, what="W queued in %s:q" % key)
    held = namespace_keys(owner)
    assert {key, key + ":q", key + ":qx", key + ":due"} <= set(held), held
    assert all(k.startswith(key) and keyslot(k) == slot for k in held), held
    for p in cluster.primaries():
        assert p is owner or namespace_keys(p) == [], p.port
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        assert h.expect("log") == "log rc=1 errno=0"
        assert w.expect("log") == "log rc=1 errno=0"
    finally:
        os.close(fd)
    assert h.finish()[0] == 0 and w.finish()[0] == 0


def test_user_hash_tag_keeps_two_locks_on_one_node(cluster, worker_progs, bg, tmp_path):
    """key = "{{ledger}}:{pid}": two processes hold two different locks,
    lockshim:{{ledger}:PID}, whose hash tag is "{ledger": one slot, both keys
    on its primary at once."""
    cfg = cluster.config(tmp_path, BLK % ("{{ledger}}:{pid}", "lease_ms = 20000;"))
    a = bg([worker_progs["block"]], cfg)
    a.expect("enter")
    b = bg([worker_progs["block"]], cfg)
    b.expect("enter")  # a different key: b does not wait for a
    keys = [lock_key("{ledger}:%d" % p.p.pid) for p in (a, b)]
    slot = keyslot("{ledger")
    owner = cluster.owner(slot)
    for k, p in zip(keys, (a, b)):
        assert owner.cmd("CLUSTER", "KEYSLOT", k) == slot, k
        assert ":%d:" % p.p.pid in (owner.cmd("GET", k) or ""), (k, owner.cmd("KEYS", "*"))
    for p in (a, b):
        p.send()
        assert p.expect("call") == OK_LINE
        assert p.wait() == 0, p.stderr()
    wait_for(lambda: namespace_keys(owner) == [], timeout=10, what="the releases")


# ---- 3. slot migration ----------------------------------------------------------------

def live_counter(path):
    """The counter while workers update it: a read between a worker's
    truncation of the file and its write sees nothing, and is done again."""
    def read():
        with open(path) as f:
            text = f.read().strip()
        return (int(text),) if text else None
    return wait_for(read, what="a complete counter in " + path)[0]


def traffic_reaches(node, path):
    """Polls until the workers run calls on node: its SET count grows and the
    counter moves on by a few more updates."""
    node.cmd("CONFIG", "RESETSTAT")
    start = live_counter(path)
    wait_for(lambda: calls(node, "set") >= 10 and live_counter(path) >= start + 10, timeout=40,
             what="lock traffic on port %d" % node.port)


def move_counter(source, target, name):
    """MIGRATEs the fencing counter of lock name (it never expires) to
    target, so that the lock's scripts, which name it, are sent on with ASK
    whenever the lock key is not at the source either (with it still at the
    source they get TRYAGAIN: the lock waits for the migration)."""
    key = lock_key(name) + ":f"
    if source.cmd("EXISTS", key):
        r = source.cmd("MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", key)
        assert r in ("OK", "NOKEY"), r


def migrate_slot(cluster, slot, source, target, between=None):
    """Moves slot from source to target as redis-cli --cluster reshard does:
    IMPORTING on the target, MIGRATING on the source, between() (if given),
    MIGRATE of its keys until the source has none, then SETSLOT NODE on
    the target, the source and every other primary."""
    assert target.cmd("CLUSTER", "SETSLOT", slot, "IMPORTING", source.id) == "OK"
    assert source.cmd("CLUSTER", "SETSLOT", slot, "MIGRATING", target.id) == "OK"
    if between:
        between()

    def moved_all():
        keys = source.cmd("CLUSTER", "GETKEYSINSLOT", slot, 100)
        if keys:
            r = source.cmd("MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", *keys)
            assert r in ("OK", "NOKEY"), r
        return not source.cmd("CLUSTER", "GETKEYSINSLOT", slot, 100)
    wait_for(moved_all, timeout=20, what="slot %d's keys migrated" % slot)
    others = [p for p in cluster.primaries() if p not in (source, target)]
    for p in [target, source] + others:
        assert p.cmd("CLUSTER", "SETSLOT", slot, "NODE", target.id) == "OK"


def test_slot_migrated_while_workers_run(cluster, worker_progs, bg, tmp_path):
    """3 processes x 2 threads update a counter guarded by "ledger" while its
    slot moves to another primary: during the migration the shim follows ASK
    (ASKING seen at the target, "cluster: ASK" logged), after it MOVED
    ("cluster: MOVED"); the calls go on at the target; every call succeeds
    within its bound and the counter is exact; no release is left to expire
    with its lease (one that meets the split keys deletes the lock key
    alone)."""
    slot = keyslot("ledger")
    source = cluster.owner(slot)
    target = next(p for p in cluster.primaries() if p is not source)
    cfg = cluster.config(tmp_path, WORK % 30000)
    path, stop = str(tmp_path / "c"), str(tmp_path / "stop")
    target.cmd("CONFIG", "RESETSTAT")
    try:
        ws = start_workers(bg, worker_progs, cfg, path, stop, procs=3, threads=2)
        assert calls(source, "set") > 0

        def asked():
            # A command for a key the source no longer has went to the
            # target through ASK, before the other keys move. (Scripts on
            # the lock's several keys get TRYAGAIN until all of them are on
            # one side: locks of a migrating slot wait for the migration.)
            move_counter(source, target, "ledger")
            wait_for(lambda: calls(target, "asking") > 0, timeout=20,
                     what="ASKING at the target during the migration")
        migrate_slot(cluster, slot, source, target, between=asked)
        traffic_reaches(target, path)
    finally:
        open(stop, "w").close()
    total, err = finish_workers(ws, 30000)
    assert counter(path) == total, err[-3000:]
    assert lost_lines(err) == [], err[-3000:]
    # a release that met the split keys deleted the lock key alone
    assert "expires with its lease" not in err, err[-3000:]
    assert cluster.owner(slot) is target
    wait_for(lambda: all(v == [] for v in cluster.keys().values()), timeout=10,
             what="every lock key to be released")


MIGRATION_LEASE_MS = 20000


def rejected(node):
    """How many commands node refused before running them (MOVED, ASK,
    TRYAGAIN: INFO commandstats' rejected_calls, summed)."""
    return sum(int(n) for n in re.findall(r"rejected_calls=(\d+)", node.cmd("INFO", "commandstats")))


def test_release_during_a_migration_reaches_the_importing_node(cluster, worker_progs, bg,
                                                               tmp_path):
    """H holds "blk" (lease 20 s), W waits for it; the slot is set migrating
    to a node whose script cache was flushed, and every key of the slot
    moves there (SETSLOT NODE not yet sent). H's call ends: its release,
    redirected by ASK, is sent again at the importing node (as EVAL after
    ASKING: an EVALSHA there meets NOSCRIPT, and the EVAL sent again
    without ASKING was sent back with MOVED, five times, and the release
    abandoned). The key is gone from the target before the migration ends,
    nothing is left to expire with its lease, and once the slot is the
    target's W enters at once, not when H's lease ends."""
    key = lock_key("blk")
    slot = keyslot("blk")
    source = cluster.owner(slot)
    target = next(p for p in cluster.primaries() if p is not source)
    cfg = cluster.config(tmp_path, BLK % ("blk", "lease_ms = %d;" % MIGRATION_LEASE_MS))
    h = bg([worker_progs["block"]], cfg, LOCKSHIM_LOG_LEVEL="debug")
    h.expect("enter")
    w = bg([worker_progs["block"]], cfg)
    wait_for(lambda: source.cmd("ZCARD", key + ":q") == 1, what="W queued")
    assert target.cmd("SCRIPT", "FLUSH") == "OK"
    assert target.cmd("CLUSTER", "SETSLOT", slot, "IMPORTING", source.id) == "OK"
    assert source.cmd("CLUSTER", "SETSLOT", slot, "MIGRATING", target.id) == "OK"
    keys = source.cmd("CLUSTER", "GETKEYSINSLOT", slot, 100)
    assert key in keys, keys
    assert source.cmd("MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", *keys) == "OK"
    h.send()
    assert h.expect("call") == OK_LINE
    assert h.wait() == 0
    err = h.stderr()
    assert "expires with its lease" not in err and "redirections" not in err, err[-3000:]
    assert "cluster: ASK %d %s" % (slot, target.addr()) in err, err[-3000:]
    c = target.client()
    try:
        c.cmd("ASKING")
        assert c.cmd("EXISTS", key) == 0, "H's lock outlived H: %s" % err[-3000:]
    finally:
        c.close()
    for p in [target, source] + [p for p in cluster.primaries() if p not in (source, target)]:
        assert p.cmd("CLUSTER", "SETSLOT", slot, "NODE", target.id) == "OK"
    moved = time.monotonic()
    w.expect("enter", timeout=MIGRATION_LEASE_MS / 1000)
    assert time.monotonic() - moved < 5 * MULT, "W waited for H's lease"
    w.send()
    assert w.expect("call") == OK_LINE
    assert w.wait() == 0


def test_slot_migrated_back_and_forth_under_load(cluster, worker_progs, bg, tmp_path):
    """The slot of "ledger" moves between two primaries 6 times while 3
    processes x 2 threads update its counter (lease 20 s, wait_ms 30 s);
    before each move the target's script cache is flushed, and the keys
    move once the source has refused some of the workers' commands (ASK or
    TRYAGAIN: the move overlaps the traffic). No release is abandoned: none
    gives up after too many redirections or is left to expire with its
    lease, so no waiter waits for a lease to end (every call well under
    lease_ms); counter exact."""
    slot = keyslot("ledger")
    a = cluster.owner(slot)
    b = next(p for p in cluster.primaries() if p is not a)
    cfg = cluster.config(tmp_path, 'locks = ( { symbol = "ledger_update"; key = "ledger"; '
                         'lease_ms = %d; wait_ms = 30000; on_timeout = "skip"; return = -7; } );\n'
                         % MIGRATION_LEASE_MS)
    path, stop = str(tmp_path / "c"), str(tmp_path / "stop")
    try:
        ws = start_workers(bg, worker_progs, cfg, path, stop, procs=3, threads=2)
        for i in range(6):
            source, target = (a, b) if i % 2 == 0 else (b, a)
            assert target.cmd("SCRIPT", "FLUSH") == "OK"
            before = rejected(source)
            migrate_slot(cluster, slot, source, target, between=lambda: wait_for(
                lambda: rejected(source) > before, timeout=20,
                what="commands refused by port %d during move %d" % (source.port, i + 1)))
            traffic_reaches(target, path)
    finally:
        open(stop, "w").close()
    # every call within half the lease (+ finish_workers' margin): none waited for a lease to end
    total, err = finish_workers(ws, MIGRATION_LEASE_MS // 2)
    assert "redirections" not in err, err[-3000:]
    assert "expires with its lease" not in err, err[-3000:]
    assert counter(path) == total, err[-3000:]
    assert lost_lines(err) == [], err[-3000:]
    wait_for(lambda: all(v == [] for v in cluster.keys().values()), timeout=10,
             what="every lock key to be released")


def test_slot_migration_is_logged_at_debug_level(cluster, worker_progs, bg, tmp_path):
    """The same migration with LOCKSHIM_LOG_LEVEL=debug: the workers log
    "cluster: ASK <slot> <target>" while the slot is migrating and
    "cluster: MOVED <slot> <target>" after it; counter exact."""
    slot = keyslot("ledger")
    source = cluster.owner(slot)
    target = next(p for p in cluster.primaries() if p is not source)
    cfg = cluster.config(tmp_path, WORK % 30000)
    path, stop = str(tmp_path / "c"), str(tmp_path / "stop")
    ask = "cluster: ASK %d %s" % (slot, target.addr())
    moved = "cluster: MOVED %d %s" % (slot, target.addr())
    try:
        with open(path, "w") as f:
            f.write("0\n")
        ws = [bg([worker_progs["worker"], path, "2", "0", stop], cfg, LOCKSHIM_LOG_LEVEL="debug")
              for _ in range(2)]
        for w in ws:
            w.expect("started")
        def asked():
            move_counter(source, target, "ledger")
            wait_for(lambda: any(ask in w.stderr() for w in ws), timeout=20, what=repr(ask))
        migrate_slot(cluster, slot, source, target, between=asked)
        wait_for(lambda: any(moved in w.stderr() for w in ws), timeout=20, what=repr(moved))
    finally:
        open(stop, "w").close()
    total, err = finish_workers(ws, 30000)
    assert counter(path) == total
    assert ask in err and moved in err


def test_a_held_lease_follows_its_key_to_another_node(cluster, worker_progs, bg, tmp_path):
    """H holds "blk" (600 ms lease, renewed every 200 ms) while the slot moves,
    key and all, to another primary: the renewals follow it (the key keeps
    H's value and is renewed at the target; no lost lease), and H's release
    deletes it there."""
    key = lock_key("blk")
    slot = keyslot("blk")
    source = cluster.owner(slot)
    target = next(p for p in cluster.primaries() if p is not source)
    cfg = cluster.config(tmp_path, BLK % ("blk", "lease_ms = 600; on_lost = \"log\";"))
    h = bg([worker_progs["block"]], cfg, LOCKSHIM_LOG_LEVEL="debug")
    h.expect("enter")
    value = source.cmd("GET", key)
    assert ":%d:" % h.p.pid in value
    migrate_slot(cluster, slot, source, target)
    assert source.cmd("CLUSTER", "COUNTKEYSINSLOT", slot) == 0
    assert target.cmd("GET", key) == value
    # Past the lease it had when it moved: only renewals at the target keep it.
    end = time.monotonic() + 1.5
    while time.monotonic() < end:
        assert target.cmd("GET", key) == value, h.stderr()[-3000:]
        time.sleep(0.05)
    h.send()
    assert h.expect("call") == OK_LINE
    assert h.wait() == 0
    err = h.stderr()
    assert lost_lines(err) == [], err[-3000:]
    assert "cluster: MOVED %d %s" % (slot, target.addr()) in err, err[-3000:]
    wait_for(lambda: target.cmd("EXISTS", key) == 0, timeout=5, what="the release at the target")


def test_lost_lease_is_reported_with_the_cluster_key(cluster, worker_progs, bg, tmp_path):
    """H holds "blk"; its key is then another owner's on the slot's primary
    (as after a failover that lost it): the renewal reports the lost lease
    naming lockshim:{blk}, the call ends normally, and the release leaves
    the other owner's key alone."""
    key = lock_key("blk")
    owner = cluster.owner(keyslot("blk"))
    cfg = cluster.config(tmp_path, BLK % ("blk", "lease_ms = 600; on_lost = \"log\";"))
    h = bg([worker_progs["block"]], cfg)
    h.expect("enter")
    assert ":%d:" % h.p.pid in owner.cmd("GET", key)
    other = "0123456789abcdef0123456789abcdef:elsewhere:1:1:x:1:1"
    owner.cmd("SET", key, other, "PX", 60000)
    wait_for(lambda: lost_lines(h.stderr()), timeout=10, what="the lost lease to be reported")
    assert h.p.poll() is None
    h.send()
    assert h.expect("call") == OK_LINE
    assert h.wait() == 0
    assert_lost_format(h.stderr(), "block_call", key)
    assert owner.cmd("GET", key) == other


# ---- 4. failover --------------------------------------------------------------------

def promoted(cluster, old, replica):
    """replica once it is a primary serving old's slots, as every live node
    sees it, and says so itself."""
    try:
        if replica.role() != "master":
            return None
        for n in cluster.alive():
            v = next(v for v in cluster.view(n) if v["id"] == replica.id)
            if "master" not in v["flags"] or not v["slots"]:
                return None
            if n.cluster_info().get("cluster_state") != "ok":
                return None
        return replica
    except (OSError, ConnectionError, RespError, StopIteration):
        return None


def test_primary_killed_and_replica_promoted(cluster, worker_progs, bg, tmp_path):
    """SIGKILL of the primary serving "ledger" while 3 processes x 2 threads
    update its counter: its replica is promoted; the calls retry through the
    gap and go on at the new primary; no program dies, no call fails or
    takes longer than wait_ms, the counter is exact unless a lost lease was
    reported by on_lost."""
    slot = keyslot("ledger")
    old = cluster.owner(slot)
    replica = cluster.replica_of(old)
    cfg = cluster.config(tmp_path, WORK % 30000)
    path, stop = str(tmp_path / "c"), str(tmp_path / "stop")
    try:
        ws = start_workers(bg, worker_progs, cfg, path, stop)
        assert calls(old, "set") > 0
        old.kill()
        new = wait_for(lambda: promoted(cluster, old, replica), timeout=30,
                       what="the replica of port %d promoted" % old.port)
        assert cluster.owner(slot) is new
        traffic_reaches(new, path)
    finally:
        open(stop, "w").close()
    total, err = finish_workers(ws, 30000)
    assert_lost_format(err, "ledger_update", lock_key("ledger"))
    assert counter(path) == total or lost_lines(err), err[-3000:]


NODE_TIMEOUT_MS = 1000  # support/topology.py's cluster-node-timeout
FAILOVER_LEASE_MS = 6000


def key_on(cluster, node, prefix):
    """A lock key name (prefix<i>) whose slot node serves."""
    for i in range(10000):
        name = "%s%d" % (prefix, i)
        if cluster.owner(keyslot(lock_key(name))) is node:
            return name
    raise AssertionError("no key of port %d" % node.port)


def test_renewals_and_acquires_reach_the_promoted_primary(cluster, worker_progs, bg, tmp_path):
    """H holds a lock (lease 6 s, renewed every 2 s; a failed renewal is
    retried every 667 ms) on the primary that also serves "ledger", whose
    counter 3 processes x 2 threads update; that primary is SIGKILLed and
    its replica promoted. Measured from the moment the test sees the
    promotion, H's renewals (the key's PTTL at the promoted node rises above its decay)
    and the workers' acquires (SETs there) reach the promoted node within
    cluster-node-timeout + lease_ms/3 + 2 s; H never loses its lease (the
    renewal thread, the only thing H does meanwhile, relearns the slot map
    from a live node), and its release deletes the key there."""
    slot = keyslot("ledger")
    old = cluster.owner(slot)
    replica = cluster.replica_of(old)
    name = key_on(cluster, old, "h")
    key = lock_key(name)
    hcfg = cluster.config(tmp_path, BLK % (name, "lease_ms = %d; on_lost = \"log\";"
                                           % FAILOVER_LEASE_MS), name="h.cfg")
    wcfg = cluster.config(tmp_path, WORK % 30000, name="w.cfg")
    bound = (NODE_TIMEOUT_MS + FAILOVER_LEASE_MS / 3 + 2000) / 1000 * MULT
    path, stop = str(tmp_path / "c"), str(tmp_path / "stop")
    h = bg([worker_progs["block"]], hcfg)
    h.expect("enter")
    value = old.cmd("GET", key)
    assert ":%d:" % h.p.pid in value
    rc = replica.client()
    try:
        rc.cmd("READONLY")
        wait_for(lambda: rc.cmd("GET", key) == value, what="the lock replicated")
    finally:
        rc.close()
    try:
        ws = start_workers(bg, worker_progs, wcfg, path, stop)
        assert calls(old, "set") > 0
        killed = time.monotonic()
        old.kill()
        new = wait_for(lambda: promoted(cluster, old, replica), timeout=30,
                       what="the replica of port %d promoted" % old.port)
        seen = time.monotonic()
        new.cmd("CONFIG", "RESETSTAT")
        ttl, read = new.cmd("PTTL", key), time.monotonic()
        assert ttl > 0, (ttl, h.stderr()[-3000:])
        renewed = acquired = None
        while time.monotonic() < seen + bound and not (renewed and acquired):
            now = time.monotonic()
            # renewed: more left than the TTL read at "seen" decayed since
            # (a renewal just before "seen" leaves the next one no higher)
            if not renewed and new.cmd("PTTL", key) > ttl - (now - read) * 1000 + 100:
                renewed = now
            if not acquired and calls(new, "set") > 0:
                acquired = now
            time.sleep(0.02)
        print("promoted %.2f s after the kill; renewed %s, acquired %s s after that"
              % (seen - killed, renewed and round(renewed - seen, 2),
                 acquired and round(acquired - seen, 2)))
        assert renewed, ("no renewal at the promoted node within %.1f s" % bound,
                         h.stderr()[-3000:])
        assert acquired, "no acquire at the promoted node within %.1f s" % bound
        assert new.cmd("GET", key) == value
        traffic_reaches(new, path)
    finally:
        open(stop, "w").close()
    total, err = finish_workers(ws, 30000)
    assert counter(path) == total or lost_lines(err), err[-3000:]
    h.send()
    assert h.expect("call") == OK_LINE
    assert h.wait() == 0
    assert lost_lines(h.stderr()) == [], h.stderr()[-3000:]
    wait_for(lambda: new.cmd("EXISTS", key) == 0, timeout=5, what="the release at the new primary")


# ---- 5. waiting -----------------------------------------------------------------------

def waiters_cfg(cluster, tmp_path, settings):
    """block_call (the holder) and log_call (the waiters) on the key "f"."""
    return cluster.config(tmp_path, """locks = (
  { symbol = "block_call"; key = "f"; %s },
  { symbol = "log_call"; key = "f"; %s } );
""" % (settings, settings))


def test_fair_mode_orders_waiters_by_arrival(cluster, worker_progs, progs, bg, tmp_path):
    """fair = true: three waiters queued one after another (each seen in
    lockshim:{f}:q on the slot's primary before the next starts) enter in
    that order once the holder releases."""
    cfg = waiters_cfg(cluster, tmp_path, "fair = true; wait_ms = 30000; lease_ms = 20000;")
    key = lock_key("f")
    owner = cluster.owner(keyslot("f"))
    order = str(tmp_path / "order")
    h = bg([worker_progs["block"]], cfg)
    h.expect("enter")
    waiters = []
    for n in range(1, 4):
        waiters.append(bg([progs["driver"], "log:" + order], cfg))
        wait_for(lambda: owner.cmd("ZCARD", key + ":q") == n, what="waiter %d queued" % n)
    h.send()
    assert h.expect("call") == OK_LINE
    for w in waiters:
        assert w.expect("log") == "log rc=1 errno=0"
        assert w.wait() == 0, w.stderr()
    assert h.wait() == 0
    with open(order) as f:
        assert f.read().split() == [str(w.p.pid) for w in waiters]


def test_waiter_is_woken_by_the_release(cluster, worker_progs, progs, bg, tmp_path):
    """retry_max_ms = 60000: a waiter blocked on the slot's primary enters
    within a second of the holder's release, so the release woke it."""
    cfg = waiters_cfg(cluster, tmp_path, "lease_ms = 30000; wait_ms = 60000; "
                      "retry_max_ms = 60000;")
    owner = cluster.owner(keyslot("f"))
    h = bg([worker_progs["block"]], cfg)
    h.expect("enter")
    w = bg([progs["driver"], "log:" + str(tmp_path / "order")], cfg)
    wait_for(lambda: owner.cmd("CLIENT", "LIST").count("cmd=blpop") == 1,
             what="the waiter blocked at port %d" % owner.port)
    h.send()
    assert h.expect("call") == OK_LINE
    released = time.monotonic()
    assert w.expect("log", timeout=10) == "log rc=1 errno=0"
    assert time.monotonic() - released < 1.0 * MULT
    assert w.wait() == 0 and h.wait() == 0


# ---- 6. lockshim check ----------------------------------------------------------------

HOLD = 'locks = ( { symbol = "hold_call"; } );\n'


def check(cfg, **env):
    return subprocess.run([CLI, "check", "-c", cfg], env=shim_env(None, preload=False, **env),
                          capture_output=True, text=True, timeout=TIMEOUT,
                          stdin=subprocess.DEVNULL)


def test_check_names_every_primary(cluster, tmp_path):
    r = check(cluster.config(tmp_path, HOLD))
    assert r.returncode == 0, (r.stdout, r.stderr)
    # check's settings line names the seeds too: look at the rest
    said = "\n".join(x for x in r.stdout.splitlines()
                     if not x.startswith("settings: "))
    for p in cluster.primaries():
        assert re.search(r"127\.0\.0\.1:%d\b" % p.port, said), (p.port, r.stdout)
    assert all(v == [] for v in cluster.keys("*").values())  # probe keys cleaned up


def test_check_with_a_dead_primary_fails_naming_it(bare_cluster, tmp_path):
    """Three primaries without replicas, one SIGKILLed: check exits 69 and
    names the dead node (the others are still listed as seeds)."""
    dead = bare_cluster.primaries()[1]
    cfg = bare_cluster.config(tmp_path, HOLD)
    dead.kill()
    r = check(cfg)
    assert r.returncode == 69, (r.stdout, r.stderr)
    # check's settings line names the seeds too: look at the rest
    said = "\n".join(x for x in r.stdout.splitlines()
                     if not x.startswith("settings: ")) + r.stderr
    assert re.search(r"127\.0\.0\.1:%d\b" % dead.port, said), (r.stdout, r.stderr)


def test_guarded_call_in_a_cluster(cluster, progs, tmp_path):
    """The simplest case: one guarded call, its lock taken on the slot's
    primary (debug line) and released."""
    cfg = cluster.config(tmp_path, 'locks = ( { symbol = "hold_call"; key = "k"; } );\n')
    r = run([progs["driver"], "call:0"], cfg, LOCKSHIM_LOG_LEVEL="debug")
    assert r.returncode == 0 and r.stdout.strip().splitlines()[-1] == OK_LINE, r.stderr
    assert "acquired %s" % lock_key("k") in r.stderr, r.stderr
    assert all(v == [] for v in cluster.keys().values())
