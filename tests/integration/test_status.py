# SPDX-License-Identifier: MIT
"""`lockshim status` and `lockshim unlock` against real servers and real
holders (support/workers.py's blocking program, under the shim, which
writes the lock values).

1. status while a lock is held and waited for, as text and as JSON (every
   field's type and value: the holder's pid and program, plausible times,
   waiters oldest first), while it is kept between calls (linger_ms: field
   k), and nothing once it is released; PATTERN filters on KEY; auxiliary
   keys and keys that hold no lock value are not listed;
2. unlock refuses a live holder on this host without --force (exit 1, the
   lock untouched, the waiter still waiting), removes it with --force (the
   waiter enters at once, by the hand-off, and the former holder's on_lost
   fires at its next renewal), removes a dead holder's lock without
   --force, and exits 1 for a key nobody holds;
3. exit statuses: 69 with the server stopped, 78 a bad config, 64 usage;
4. Sentinel, Cluster (every primary scanned, KEY shown without the braces),
   Redlock (a lock shown when a quorum holds it, with `masters`; unlock
   removes it on every master) and a TLS-only server.
"""
import json
import os
import re
import signal
import socket
import time

import pytest

from support.server import start_servers, started
from support.tls import TlsServer
from support.topology import Cluster, Topology
from support.util import CLI, MULT, run, wait_for, write_config
from support.workers import assert_lost_format, calls, lost_lines

RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
# the blocking holder's lock; %s: the key, %d: lease_ms, %s: more settings
BLOCK = ('locks = ( { symbol = "block_call"; key = "%s"; lease_ms = %d; wait_ms = 60000; '
         '%s } );\n')
HOST = socket.gethostname()


def cli(*args):
    """Runs `lockshim ARGS` without the shim; returns the CompletedProcess."""
    return run([CLI] + list(args))


def status_json(cfg, *args):
    """The locks `status --json` prints, one dict per line, checked to be
    exactly the issue's fields, each of its type."""
    r = cli("status", "-c", cfg, "--json", *args)
    assert r.returncode == 0, r.stderr
    locks = [json.loads(line) for line in r.stdout.splitlines()]
    for l in locks:
        assert set(l) - {"masters"} == {"key", "host", "pid", "tid", "program", "since",
                                        "held_ms", "lease_left_ms", "fence", "limit", "mode",
                                        "kept", "waiters"}, l
        assert l["limit"] == 1 and l["mode"] == "exclusive", l  # string locks here
        for f in ("host", "program", "since", "key"):
            assert isinstance(l[f], str), (f, l)
        for f in ("pid", "tid", "held_ms", "lease_left_ms", "fence"):
            assert isinstance(l[f], int) and not isinstance(l[f], bool), (f, l)
        assert isinstance(l["kept"], bool) and isinstance(l["waiters"], list), l
        assert RFC3339.match(l["since"]), l
        for w in l["waiters"]:
            assert set(w) == {"host", "pid", "program", "waited_ms"}, w
            assert isinstance(w["pid"], int) and isinstance(w["waited_ms"], int), w
    return locks


def holder(bg, worker_progs, cfg, *args):
    """A blocking program holding its lock (inside block_call)."""
    h = bg([worker_progs["block"]] + list(args), cfg)
    h.expect("enter")
    return h


def queued(node, key, n):
    wait_for(lambda: node.cmd("ZCARD", key + ":q") == n, timeout=20,
             what="%d waiter(s) queued on %s" % (n, key))


def since_ms(text):
    t = time.strptime(text[:19], "%Y-%m-%dT%H:%M:%S")
    return (time.mktime(t) - time.timezone) * 1000 + int(text[20:23])


# ---- 1. status ---------------------------------------------------------------------

def test_status_held_and_waited(redis, worker_progs, bg, tmp_path):
    cfg = write_config(tmp_path, redis, BLOCK % ("blk", 30000, ""))
    assert cli("status", "-c", cfg).stdout == ""  # nothing held yet
    t0 = time.time() * 1000
    h = holder(bg, worker_progs, cfg)
    w1 = bg([worker_progs["block"]], cfg)
    queued(redis, "lockshim:blk", 1)
    w2 = bg([worker_progs["block"]], cfg)
    queued(redis, "lockshim:blk", 2)
    redis.cmd("SET", "lockshim:junk", "not a lock value")  # skipped
    redis.cmd("SET", "elsewhere:blk", redis.cmd("GET", "lockshim:blk"))  # another namespace
    [l] = status_json(cfg)
    t1 = time.time() * 1000
    assert l["key"] == "blk" and l["host"] == HOST
    assert l["pid"] == h.p.pid and l["tid"] == h.p.pid and l["program"] == "block"
    assert t0 - 1000 <= since_ms(l["since"]) <= t1, l
    assert 0 <= l["held_ms"] <= t1 - t0 + 1000, l
    assert 20000 < l["lease_left_ms"] <= 30000, l
    assert l["fence"] >= 1 and l["kept"] is False, l
    assert [w["pid"] for w in l["waiters"]] == [w1.p.pid, w2.p.pid], l
    assert all(w["host"] == HOST and w["program"] == "block" for w in l["waiters"]), l
    assert l["waiters"][0]["waited_ms"] >= l["waiters"][1]["waited_ms"] >= 0, l
    assert l["waiters"][0]["waited_ms"] <= t1 - t0 + 1000, l

    text = cli("status", "-c", cfg)
    assert text.returncode == 0, text.stderr
    [line] = text.stdout.splitlines()
    assert re.match(r"^blk  held by %s pid %d tid %d \(block\) since \S+Z \([\d.]+ s\), "
                    r"lease [\d.]+ s left, fence \d+, 2 waiting, oldest %s pid %d \(block\) "
                    r"[\d.]+ s$" % (re.escape(HOST), h.p.pid, h.p.pid, re.escape(HOST),
                                    w1.p.pid), line), line

    for p, nxt in ((h, w1), (w1, w2), (w2, None)):  # each leaves, the next enters
        p.send()
        p.expect("call rc=42")
        if nxt:
            nxt.expect("enter")
    assert cli("status", "-c", cfg).stdout == ""


def test_status_kept(redis, worker_progs, bg, tmp_path):
    """A lock kept between calls (linger_ms, within handoff_ms of its
    acquisition) says kept once the renewal thread has marked it (parked
    100 ms, then a renewal: every 100 ms with a lease of 300 ms)."""
    cfg = write_config(tmp_path, redis, BLOCK % ("kept", 300, "linger_ms = 60000; "
                                                 "handoff_ms = 60000;"))
    h = holder(bg, worker_progs, cfg, "stay")
    [l] = status_json(cfg)
    assert l["kept"] is False and l["pid"] == h.p.pid  # inside the call: not kept
    h.send()
    h.expect("call rc=42")  # the call returned; the lock stays parked
    wait_for(lambda: redis.cmd("HGET", "lockshim:kept:f", "k"), timeout=10,
             what="the renewal thread marking the parked lock")
    [l] = status_json(cfg)
    assert l["kept"] is True and l["pid"] == h.p.pid, l
    assert "kept" in cli("status", "-c", cfg).stdout.strip().split(", ")
    h.send()
    assert h.wait() == 0


def test_status_pattern(redis, worker_progs, bg, tmp_path):
    """PATTERN is a glob on KEY (Redis MATCH syntax)."""
    cfgs = []
    for n in ("alpha-1", "beta-1"):
        os.makedirs(tmp_path / n)
        cfgs.append(write_config(tmp_path / n, redis, BLOCK % (n, 30000, "")))
    hs = [holder(bg, worker_progs, c) for c in cfgs]
    assert [l["key"] for l in status_json(cfgs[0])] == ["alpha-1", "beta-1"]
    [a] = status_json(cfgs[0], "alpha*")
    assert a["key"] == "alpha-1" and a["pid"] == hs[0].p.pid
    assert [l["key"] for l in status_json(cfgs[0], "b?ta-[0-9]")] == ["beta-1"]
    assert status_json(cfgs[0], "gamma*") == []
    for h in hs:
        h.send()
        h.expect("call rc=42")


def test_status_cost(redis, tmp_path):
    """Many locks among many other keys (and their fencing counters): SCAN
    pages (never KEYS), one read of each lock, every lock listed once, in
    key order."""
    n, other = 2500, 5000
    redis.cmd("EVAL", "for i = 1, tonumber(ARGV[1]) do "
              "local k = string.format('lockshim:k%05d', i) "
              "redis.call('set', k, string.format('%032x:h:%d:%d:b:1:1:1700000000000:p', "
              "i, i, i), 'PX', 600000) redis.call('hset', k .. ':f', 'n', i) end "
              "for i = 1, tonumber(ARGV[2]) do redis.call('set', 'other:' .. i, 'x') end",
              0, n, other)
    cfg = write_config(tmp_path, redis, "")
    redis.cmd("CONFIG", "RESETSTAT")
    locks = status_json(cfg)
    assert [l["key"] for l in locks] == ["k%05d" % i for i in range(1, n + 1)]
    assert [l["pid"] for l in locks] == list(range(1, n + 1))
    assert [l["fence"] for l in locks] == list(range(1, n + 1))
    assert calls(redis, "keys") == 0
    assert calls(redis, "get") == n and calls(redis, "zrange") == n
    assert 1 <= calls(redis, "scan") <= 3 * (n + other) // 1000 + 1


# ---- 2. unlock ---------------------------------------------------------------------

@pytest.mark.timing
def test_unlock_live_holder(redis, worker_progs, bg, tmp_path):
    """Refused without --force while the holder lives here; with --force
    the lock goes to the waiter at once and the former holder's on_lost
    fires at its next renewal."""
    cfg = write_config(tmp_path, redis, BLOCK % ("blk", 3000, ""))
    h = holder(bg, worker_progs, cfg)
    w = bg([worker_progs["block"]], cfg)
    queued(redis, "lockshim:blk", 1)
    value = redis.cmd("GET", "lockshim:blk")

    r = cli("unlock", "-c", cfg, "blk")
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "alive" in r.stderr and "pid %d" % h.p.pid in r.stderr, r.stderr
    assert r.stdout == ""
    assert redis.cmd("GET", "lockshim:blk") == value
    assert redis.cmd("ZCARD", "lockshim:blk:q") == 1  # the waiter still waits

    t0 = time.monotonic()
    r = cli("unlock", "-c", cfg, "--force", "blk")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("removed blk  held by %s pid %d tid %d (block)"
                               % (HOST, h.p.pid, h.p.pid)), r.stdout
    w.expect("enter")
    assert time.monotonic() - t0 < 2.5 * MULT  # the hand-off, before h's lease would end
    assert ":%d:" % w.p.pid in redis.cmd("GET", "lockshim:blk")
    wait_for(lambda: lost_lines(h.stderr()), timeout=10, what="the former holder's on_lost")
    assert_lost_format(h.stderr(), "block_call", "lockshim:blk")
    for p in (h, w):
        p.send()
        p.expect("call rc=42")


def test_unlock_json(redis, worker_progs, bg, tmp_path):
    cfg = write_config(tmp_path, redis, BLOCK % ("blk", 30000, ""))
    h = holder(bg, worker_progs, cfg)
    r = cli("unlock", "-c", cfg, "--force", "--json", "blk")
    assert r.returncode == 0, r.stderr
    l = json.loads(r.stdout)
    assert l["key"] == "blk" and l["pid"] == h.p.pid and l["program"] == "block"
    assert redis.cmd("EXISTS", "lockshim:blk") == 0
    h.send()
    h.expect("call rc=42")


def test_unlock_dead_holder(redis, worker_progs, bg, tmp_path):
    """A holder that is gone is no reason to refuse: no --force needed."""
    cfg = write_config(tmp_path, redis, BLOCK % ("blk", 30000, ""))
    h = holder(bg, worker_progs, cfg)
    os.kill(h.p.pid, signal.SIGKILL)
    h.wait()
    assert redis.cmd("EXISTS", "lockshim:blk") == 1  # the lease outlives it
    r = cli("unlock", "-c", cfg, "blk")
    assert r.returncode == 0, r.stderr
    assert redis.cmd("EXISTS", "lockshim:blk") == 0


def test_unlock_not_held(redis, tmp_path):
    cfg = write_config(tmp_path, redis, "")
    r = cli("unlock", "-c", cfg, "nobody")
    assert r.returncode == 1 and "not held" in r.stderr, r.stderr
    redis.cmd("SET", "lockshim:junk", "not a lock value")
    assert cli("unlock", "-c", cfg, "--force", "junk").returncode == 1
    assert redis.cmd("GET", "lockshim:junk") == "not a lock value"


# ---- 3. exit statuses --------------------------------------------------------------

def test_exit_statuses(redis, tmp_path):
    cfg = write_config(tmp_path, redis, "")  # no locks: fine for these verbs
    assert cli("status", "-c", cfg).returncode == 0
    assert cli("status", "-c", cfg, "--bogus").returncode == 64
    assert cli("status", "-c", cfg, "a", "b").returncode == 64
    assert cli("unlock", "-c", cfg).returncode == 64
    assert cli("unlock", "-c", cfg, "--json", "--bogus", "k").returncode == 64
    bad = tmp_path / "bad.cfg"
    bad.write_text("redis = { port = 0; };\n")
    assert cli("status", "-c", str(bad)).returncode == 78
    assert cli("unlock", "-c", str(bad), "k").returncode == 78
    assert cli("status", "-c", str(tmp_path / "missing.cfg")).returncode == 78
    redis.stop()
    r = cli("status", "-c", cfg)
    assert r.returncode == 69 and r.stderr, r.stderr
    assert cli("unlock", "-c", cfg, "--force", "k").returncode == 69


# ---- 4. topologies -----------------------------------------------------------------

@pytest.fixture
def topo(request):
    yield from started(request, Topology())


@pytest.fixture
def cluster(request):
    yield from started(request, Cluster(replicas=0))


def test_sentinel(topo, worker_progs, bg, tmp_path):
    cfg = topo.config(tmp_path, BLOCK % ("blk", 30000, ""))
    h = holder(bg, worker_progs, cfg)
    [l] = status_json(cfg)
    assert l["key"] == "blk" and l["pid"] == h.p.pid and "masters" not in l
    r = cli("unlock", "-c", cfg, "--force", "blk")
    assert r.returncode == 0, r.stderr
    assert status_json(cfg) == []
    h.send()
    h.expect("call rc=42")


def test_cluster(cluster, worker_progs, bg, tmp_path):
    """Locks on several primaries are all listed, by KEY as the config
    names it (no braces); unlock finds the primary of its slot."""
    keys = ["k%d" % i for i in range(6)]
    hs = []
    for k in keys:
        os.makedirs(tmp_path / k)
        hs.append(holder(bg, worker_progs, cluster.config(tmp_path / k, BLOCK % (k, 30000, ""))))
    held_on = {p: [k for k in ks if not k.endswith(":f")] for p, ks in cluster.keys().items()}
    assert sum(1 for ks in held_on.values() if ks) >= 2, held_on  # several primaries
    cfg = str(tmp_path / "k0" / "lockshim.cfg")
    locks = status_json(cfg)
    assert [l["key"] for l in locks] == keys
    assert [l["pid"] for l in locks] == [h.p.pid for h in hs]
    for k in keys:
        assert cli("unlock", "-c", cfg, "--force", k).returncode == 0
    assert status_json(cfg) == []
    for h in hs:
        h.send()
        h.expect("call rc=42")
    cluster.primaries()[0].kill()  # no replicas: its slots are not served
    r = cli("status", "-c", cfg)
    assert r.returncode == 69 and r.stderr, r


def test_redlock(masters, worker_progs, bg, tmp_path):
    """Shown when a quorum holds the value, with on how many masters;
    unlock removes it on every master."""
    cfg = masters.config(tmp_path, BLOCK % ("blk", 30000, ""))
    h = holder(bg, worker_progs, cfg)
    [l] = status_json(cfg)
    assert l["masters"] == 3 and l["pid"] == h.p.pid, l
    assert "on 3 masters" in cli("status", "-c", cfg).stdout
    masters.nodes[0].cmd("DEL", "lockshim:blk")  # one master lost it: still a quorum
    [l] = status_json(cfg)
    assert l["masters"] == 2, l
    masters.nodes[1].cmd("DEL", "lockshim:blk")  # one master left: no quorum
    assert status_json(cfg) == []
    for n in masters.nodes[:2]:  # back on all three
        n.cmd("SET", "lockshim:blk", masters.nodes[2].cmd("GET", "lockshim:blk"), "PX", 30000)
    r = cli("unlock", "-c", cfg, "--force", "blk")
    assert r.returncode == 0, r.stderr
    assert all(n.cmd("EXISTS", "lockshim:blk") == 0 for n in masters.nodes)
    h.send()
    h.expect("call rc=42")


def test_redlock_masters_down(masters, worker_progs, bg, tmp_path):
    """One master of three down: the quorum left still shows the lock (with
    a warning); two down: no quorum can be read, exit 69."""
    cfg = masters.config(tmp_path, BLOCK % ("blk", 30000, ""))
    h = holder(bg, worker_progs, cfg)
    masters.nodes[0].stop()
    r = cli("status", "-c", cfg, "--json")
    assert r.returncode == 0, r.stderr
    [l] = [json.loads(line) for line in r.stdout.splitlines()]
    assert l["masters"] == 2 and l["pid"] == h.p.pid, l
    assert "1 of 3 masters not read" in r.stderr, r.stderr
    masters.nodes[1].stop()
    r = cli("status", "-c", cfg)
    assert r.returncode == 69 and r.stdout == "", r
    assert cli("unlock", "-c", cfg, "--force", "blk").returncode == 69
    h.send()
    h.expect("call rc=42")


@pytest.fixture
def tls_server(request, pki):
    yield from start_servers(request, lambda: TlsServer(pki), lambda s: "redis-server (TLS)")


def test_tls(tls_server, pki, worker_progs, bg, tmp_path):
    s = tls_server()
    cfg = write_config(tmp_path, None, 'redis = { host = "127.0.0.1"; port = %d; '
                       'tls = { ca_file = "%s"; }; };\n%s'
                       % (s.port, pki["ca"], BLOCK % ("blk", 30000, "")))
    h = holder(bg, worker_progs, cfg)
    [l] = status_json(cfg)
    assert l["key"] == "blk" and l["pid"] == h.p.pid
    assert cli("unlock", "-c", cfg, "--force", "blk").returncode == 0
    assert status_json(cfg) == []
    h.send()
    h.expect("call rc=42")
