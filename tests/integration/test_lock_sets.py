# SPDX-License-Identifier: MIT
"""`lockshim lock --limit N` and `lockshim lock --shared` (issue 22) against
a real server, with the backend's holder sets (the shim's scripts for
`limit` and `mode`), and `status` and `unlock` on the sets they make.

1. --limit 3: 6 shell loops of sections under `lock --limit 3`: never more
   than 3 inside, and 3 reached (an observer: every section appends "in"
   and "out" to one log, O_APPEND); controls: without lockshim more than 3
   are inside, with a plain `lock` never more than 1;
2. --shared: readers overlap, a writer (no --shared) is inside alone;
   control: without lockshim the writer meets readers;
3. permit holders: each its own fence; the fourth of --limit 3 is busy;
   another limit is refused (69, both numbers named); status shows each
   holder (limit 3); unlock refuses live holders here, --force removes
   each, and each lockshim then exits 75 (its lease lost);
4. a dead permit holder is removed by unlock without --force, a live one
   beside it kept (exit 1);
5. Redlock: --limit 3 refused (78), --shared holders together (status:
   on 3 masters); Cluster: --limit 2.
"""
import json
import os
import signal
import subprocess

import pytest

from support.server import lock_keys, started
from support.topology import Cluster
from support.util import CLI, MULT, TIMEOUT, run, shim_env, wait_for, write_config

# one section: "in" on entering, "out" on leaving, each one append
SECTION = 'echo "in $$ $2" >> "$1"; sleep 0.3; echo "out $$" >> "$1"'
HOLD = ["sh", "-c", 'echo "held $LOCKSHIM_LOCK_KEY $LOCKSHIM_FENCE"; read x']


def cli(*args):
    return run([CLI] + list(args))


def lock(cfg, *args):
    return [CLI, "lock", "-c", cfg] + list(args)


def sections(log, loops):
    """Runs loops ([(prefix, mode)]: a lockshim lock command line or [], and
    the mode written to the log) at once, each 3 sections; returns the log's
    events [(in/out, pid, mode)]."""
    open(log, "w").close()
    ps = [subprocess.Popen(["sh", "-c", 'for i in 1 2 3; do "$@" || exit $?; done', "sh"]
                           + prefix + ["sh", "-c", SECTION, "sh", log, mode],
                           env=shim_env(None, preload=False), stderr=subprocess.PIPE, text=True)
          for prefix, mode in loops]
    for p in ps:
        _, err = p.communicate(timeout=TIMEOUT)
        assert p.returncode == 0, err
    with open(log) as f:
        events = [tuple(line.split() + [""])[:3] for line in f]
    assert sum(1 for e in events if e[0] == "in") == 3 * len(loops), events
    return events


def most_inside(events, mode=None):
    """The most sections inside at once (of mode only, when given)."""
    inside, most = {}, 0
    for what, pid, m in events:
        if what == "in":
            inside[pid] = m
        else:
            inside.pop(pid)
        most = max(most, sum(1 for v in inside.values() if mode is None or v == mode))
    return most


def writer_alone(events):
    """Whether no section was inside beside an "x" one."""
    inside = {}
    for what, pid, m in events:
        if what == "in":
            inside[pid] = m
        else:
            inside.pop(pid)
        if "x" in inside.values() and len(inside) > 1:
            return False
    return True


def holder(bg, cfg, *args):
    """`lockshim lock ARGS -- HOLD` holding its lock; returns it and its fence."""
    h = bg(lock(cfg, *args, "--", *HOLD), None)
    return h, int(h.expect("held").split()[2])


def status_json(cfg):
    r = cli("status", "-c", cfg, "--json")
    assert r.returncode == 0, r.stderr
    return [json.loads(line) for line in r.stdout.splitlines()]


# ---- 1. --limit ------------------------------------------------------------------------

@pytest.mark.timing
def test_limit_3(redis, tmp_path):
    cfg = write_config(tmp_path, redis, "")
    log = str(tmp_path / "log")
    events = sections(log, [(lock(cfg, "-w", "60", "--limit", "3", "sem", "--"), "p")] * 6)
    assert most_inside(events) == 3, events  # never more, and reached
    assert lock_keys(redis) == []  # the last release deleted the set
    # controls: the observer sees more than 3 without a lock, 1 with a plain one
    assert most_inside(sections(log, [([], "p")] * 6)) > 3
    assert most_inside(sections(log, [(lock(cfg, "-w", "60", "sem", "--"), "p")] * 6)) == 1


# ---- 2. --shared -----------------------------------------------------------------------

@pytest.mark.timing
def test_shared_readers_together_writer_alone(redis, tmp_path):
    cfg = write_config(tmp_path, redis, "")
    log = str(tmp_path / "log")
    readers = [(lock(cfg, "-w", "60", "--shared", "rw", "--"), "s")] * 4
    events = sections(log, readers + [(lock(cfg, "-w", "60", "rw", "--"), "x")])
    assert most_inside(events, "s") >= 2, events  # readers overlap
    assert writer_alone(events), events
    assert lock_keys(redis) == []
    # control: unguarded, the writer meets the readers
    assert not writer_alone(sections(log, [([], "s")] * 4 + [([], "x")]))


# ---- 3. permit holders: fences, busy, mismatch, status, unlock --------------------------

@pytest.mark.timing
def test_permit_holders_status_unlock(redis, bg, tmp_path):
    cfg = write_config(tmp_path, redis, "")
    mark = str(tmp_path / "ran")
    hs = [holder(bg, cfg, "-l", "600", "--limit", "3", "sem") for _ in range(3)]
    fences = [f for _, f in hs]
    assert len(set(fences)) == 3 and min(fences) > 0, fences  # each grant its own token
    r = cli("lock", "-c", cfg, "-n", "--limit", "3", "sem", "--", "touch", mark)
    assert r.returncode == 1 and not os.path.exists(mark), r  # the 4th: busy
    r = cli("lock", "-c", cfg, "-n", "--limit", "2", "sem", "--", "touch", mark)
    assert r.returncode == 69 and not os.path.exists(mark), r  # another limit
    assert "2" in r.stderr and "3" in r.stderr and "sem" in r.stderr, r.stderr

    locks = status_json(cfg)
    assert sorted(l["pid"] for l in locks) == sorted(h.p.pid for h, _ in hs), locks
    assert all(l["key"] == "sem" and l["limit"] == 3 and l["mode"] == "exclusive"
               and l["program"] == "sh" and 0 <= l["lease_left_ms"] <= 600 for l in locks), locks
    text = cli("status", "-c", cfg).stdout.splitlines()
    assert len(text) == 3 and all(", limit 3" in line for line in text), text

    r = cli("unlock", "-c", cfg, "sem")
    assert r.returncode == 1 and r.stdout == "", r
    assert r.stderr.count("alive on this host") == 3, r.stderr
    assert redis.cmd("ZCARD", "lockshim:sem") == 3
    r = cli("unlock", "-c", cfg, "--force", "sem")
    assert r.returncode == 0, r.stderr
    assert len([l for l in r.stdout.splitlines() if l.startswith("removed sem  held by")]) == 3
    for h, _ in hs:  # each finds its permit gone at its next renewal
        assert h.wait(timeout=20 * MULT) == 75
    assert lock_keys(redis) == []


def test_unlock_dead_permit_holder(redis, bg, tmp_path):
    cfg = write_config(tmp_path, redis, "")
    dead, _ = holder(bg, cfg, "--limit", "2", "sem")
    live, _ = holder(bg, cfg, "--limit", "2", "sem")
    os.kill(dead.p.pid, signal.SIGKILL)
    dead.wait()
    assert redis.cmd("ZCARD", "lockshim:sem") == 2  # its lease outlives it
    r = cli("unlock", "-c", cfg, "sem")
    assert r.returncode == 1, r  # the live one refused ...
    assert r.stdout.startswith("removed sem  held by ") and len(r.stdout.splitlines()) == 1
    assert "pid %d" % dead.p.pid in r.stdout and "pid %d" % live.p.pid in r.stderr, r
    members = redis.cmd("ZRANGE", "lockshim:sem", 0, -1)  # ... and kept
    assert len(members) == 1 and ":%d:" % live.p.pid in members[0], members
    live.send()
    assert live.wait() == 0
    assert lock_keys(redis) == []


# ---- 5. topologies ---------------------------------------------------------------------

def test_redlock(masters, bg, tmp_path):
    cfg = masters.config(tmp_path, "")
    mark = str(tmp_path / "ran")
    r = cli("lock", "-c", cfg, "--limit", "3", "sem", "--", "touch", mark)
    assert r.returncode == 78 and not os.path.exists(mark), r
    assert len(r.stderr.splitlines()) == 1 and "limit" in r.stderr, r.stderr
    hs = [holder(bg, cfg, "--shared", "rw")[0] for _ in range(2)]  # together
    locks = status_json(cfg)
    assert sorted(l["pid"] for l in locks) == sorted(h.p.pid for h in hs), locks
    assert all(l["mode"] == "shared" and l["masters"] == 3 for l in locks), locks
    for h in hs:
        h.send()
        assert h.wait() == 0


@pytest.fixture
def cluster(request):
    yield from started(request, Cluster(replicas=0))


def test_cluster(cluster, bg, tmp_path):
    cfg = cluster.config(tmp_path, "")
    hs = [holder(bg, cfg, "--limit", "2", "sem")[0] for _ in range(2)]
    locks = status_json(cfg)
    assert sorted(l["pid"] for l in locks) == sorted(h.p.pid for h in hs), locks
    assert all(l["key"] == "sem" and l["limit"] == 2 for l in locks), locks
    assert cli("lock", "-c", cfg, "-n", "--limit", "2", "sem", "--", "true").returncode == 1
    for h in hs:
        h.send()
        assert h.wait() == 0
    wait_for(lambda: status_json(cfg) == [], what="the set gone")
