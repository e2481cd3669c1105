# SPDX-License-Identifier: MIT
"""Fencing tokens (doc/semantics.md, "Fencing tokens").

Every acquisition of a key increments its counter, the hash <key>:f field
n, in the round trip that takes the lock, and the debug line of the acquire
says "fence N". 4 processes take one key 1,000 times (linger_ms = 0: every
call acquires): in the shared log file, whose lines are written while the
lock is held (so in the order the lock was taken), the tokens are strictly
increasing, one per acquisition, and the counter ends at the last one; with
fair = true every contended grant is a hand-off by the release script, and
the same holds. The counter outlives the lock. Cluster and Redlock run the
same with fewer acquisitions (Redlock: the token is the largest of the
quorum's counters, written back to the quorum's masters, so it may skip
numbers but never goes back; without the write-back, 1 run in 5 saw a
token lower than the one before). A lease
kept between calls (linger_ms) for 100 ms or more is named in field k by
its renewal, and its release takes k away, as does the first renewal once
the lease is in use again. The value carries since_ms and the program.
"""
import re
import time

import pytest

from support.server import lock_keys, started
from support.topology import Cluster, keyslot, lock_key
from support.util import wait_for, write_config
from support.workers import counter

ACQ = re.compile(r"acquired (\S+) for ledger_update \((\d+) tries(, handed over)?\), "
                 r"fence (\d+)$")
TS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z ")
LOCK = ('log_level = "debug"; log_file = "%s";\n'
        'locks = ( { symbol = "ledger_update"; key = "ledger"; lease_ms = 10000; '
        'wait_ms = 120000; linger_ms = 0; %s } );\n')


@pytest.fixture
def cluster(request):
    yield from started(request, Cluster(replicas=0))


def run_workers(bg, worker_progs, cfg, tmp_path, procs, iters):
    """procs workers, one thread each, iters calls each; returns the counter."""
    path, stop = str(tmp_path / "counter"), str(tmp_path / "stop")
    with open(path, "w") as f:
        f.write("0\n")
    ws = [bg([worker_progs["worker"], path, "1", str(iters), stop], cfg) for _ in range(procs)]
    for w in ws:
        assert w.wait(timeout=300) == 0, w.stderr()[-3000:]
        assert w.expect("done").startswith("done ok=%d failed=0" % iters), w.stderr()[-3000:]
    return counter(path)


def tokens(log, key):
    """(tokens in log order, how many were hand-offs) of key's acquisitions."""
    out, handed = [], 0
    with open(log) as f:
        for line in f:
            m = ACQ.search(line.rstrip("\n"))
            if m and m.group(1) == key:
                assert TS.match(line), line
                out.append(int(m.group(4)))
                handed += m.group(3) is not None
    return out, handed


def assert_increasing(toks, n):
    assert len(toks) == n, (len(toks), toks[:20])
    bad = [(a, b) for a, b in zip(toks, toks[1:]) if b <= a]
    assert not bad and toks[0] >= 1, bad[:10]


@pytest.mark.parametrize("fair", [False, True], ids=["default", "fair"])
def test_tokens_strictly_increase_over_1000_acquisitions(redis, worker_progs, bg, tmp_path,
                                                        fair):
    log = str(tmp_path / "shim.log")
    cfg = write_config(tmp_path, redis, LOCK % (log, "fair = true;" if fair else ""))
    assert run_workers(bg, worker_progs, cfg, tmp_path, 4, 250) == 1000
    toks, handed = tokens(log, "lockshim:ledger")
    assert_increasing(toks, 1000)
    assert toks == list(range(1, 1001))  # one increment per grant, none for a refusal
    assert int(redis.cmd("HGET", "lockshim:ledger:f", "n")) == toks[-1]
    assert lock_keys(redis) == [] and redis.cmd("TTL", "lockshim:ledger:f") == -1
    if fair:  # fair: every contended grant is a hand-off ("g:<fence>")
        assert handed > 0, "no hand-off among 1000 fair acquisitions"
        g = redis.cmd("HGET", "lockshim:ledger:f", "g")
        m = re.fullmatch(r"([0-9a-f]{32}):(\d+)", g or "")
        assert m and abs(int(m.group(2)) - time.time() * 1000) < 600000, g


def test_cluster_tokens_strictly_increase(cluster, worker_progs, bg, tmp_path):
    log = str(tmp_path / "shim.log")
    cfg = cluster.config(tmp_path, LOCK % (log, "fair = true;"))
    assert run_workers(bg, worker_progs, cfg, tmp_path, 3, 60) == 180
    key = lock_key("ledger")
    toks, _ = tokens(log, key)
    assert_increasing(toks, 180)
    owner = cluster.owner(keyslot("ledger"))
    assert int(owner.cmd("HGET", key + ":f", "n")) == toks[-1] == 180


def test_redlock_tokens_strictly_increase(masters, worker_progs, bg, tmp_path):
    """The token is the largest counter of the masters that granted it,
    raised on each of them: every later quorum shares one."""
    log = str(tmp_path / "shim.log")
    cfg = masters.config(tmp_path, LOCK % (log, ""))
    assert run_workers(bg, worker_progs, cfg, tmp_path, 3, 60) == 180
    toks, _ = tokens(log, "lockshim:ledger")
    assert_increasing(toks, 180)
    ns = [int(m.cmd("HGET", "lockshim:ledger:f", "n") or 0) for m in masters.nodes]
    assert toks[-1] in ns and toks[-1] <= max(ns), (toks[-1], ns)


BLOCK = ('locks = ( { symbol = "block_call"; key = "blk"; lease_ms = 600; linger_ms = 20000; '
         'handoff_ms = 20000; } );\n')


def test_a_kept_lease_is_named_in_k_until_released(redis, worker_progs, bg, tmp_path):
    """block's call ends and its lock is kept (linger_ms): the renewal
    (every 200 ms) of a lease kept 100 ms or more writes k = its token;
    the release at exit deletes k. The value names the program and when
    it was made; n counts the one grant."""
    cfg = write_config(tmp_path, redis, BLOCK)
    t0 = time.time() * 1000
    b = bg([worker_progs["block"], "stay"], cfg)
    b.expect("enter")
    b.send()
    assert b.expect("call") == "call rc=42 errno=0"
    val = redis.cmd("GET", "lockshim:blk")
    head, since, prog = val.rsplit(":", 2)
    assert prog == "block" and t0 - 1000 <= int(since) <= time.time() * 1000 + 1000, val
    assert ":%d:" % b.p.pid in head, val
    wait_for(lambda: redis.cmd("HGET", "lockshim:blk:f", "k") == val[:32], timeout=10,
             what="the kept lease to be named in k")
    assert redis.cmd("HGET", "lockshim:blk:f", "n") == "1"
    b.send()
    assert b.wait() == 0, b.stderr()
    assert redis.cmd("EXISTS", "lockshim:blk") == 0
    assert redis.cmd("HEXISTS", "lockshim:blk:f", "k") == 0
    assert redis.cmd("HGET", "lockshim:blk:f", "n") == "1"  # the counter outlives the lock


def test_control_a_lease_not_kept_is_never_named(redis, worker_progs, bg, tmp_path):
    """The same with linger_ms = 0: the call ends, the lock goes, k never
    appears (so the test above can tell)."""
    cfg = write_config(tmp_path, redis, BLOCK.replace("linger_ms = 20000", "linger_ms = 0"))
    b = bg([worker_progs["block"], "stay"], cfg)
    b.expect("enter")
    b.send()
    assert b.expect("call") == "call rc=42 errno=0"
    assert redis.cmd("EXISTS", "lockshim:blk") == 0
    b.send()
    assert b.wait() == 0, b.stderr()
    assert redis.cmd("HEXISTS", "lockshim:blk:f", "k") == 0


@pytest.mark.timing  # the renewal comes within the 5 s call
def test_k_goes_once_the_kept_lease_is_in_use_again(progs, redis, tmp_path, procs):
    """driver's first call ends and its lock is kept (k appears); its second
    call (5 s) takes the kept lock back without asking Redis, and the first
    renewal while it runs takes k away: the key still holds the same value
    (not released, not taken again) and the call has not ended yet."""
    cfg = write_config(tmp_path, redis, 'locks = ( { symbol = "hold_call"; key = "kk"; '
                       'lease_ms = 600; linger_ms = 20000; handoff_ms = 20000; } );\n')
    p = procs([progs["driver"], "call:0", "stdin", "call:5000", "stdin"], cfg)
    assert p.expect("call") == "call rc=42 errno=0"
    val = redis.cmd("GET", "lockshim:kk")
    wait_for(lambda: redis.cmd("HGET", "lockshim:kk:f", "k") == val[:32], timeout=10,
             what="the kept lease to be named in k")
    p.send()
    wait_for(lambda: redis.cmd("HEXISTS", "lockshim:kk:f", "k") == 0, timeout=4,
             what="k to go while the second call runs")
    assert redis.cmd("GET", "lockshim:kk") == val
    assert redis.cmd("HGET", "lockshim:kk:f", "n") == "1"  # one acquisition for both calls
    assert p.expect("call") == "call rc=42 errno=0"
    p.send()
    rc, _, err = p.finish()
    assert rc == 0, err
