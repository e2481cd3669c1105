# SPDX-License-Identifier: MIT
"""Holder sets: semaphores (`limit`) and shared locks (`mode = "shared"`).

The observed program (progs/sets_main.c on progs/sets_lib.c) appends a
line to a log file (O_APPEND, one order for every process and thread) when
a guarded call starts and when it ends; replaying the log counts who was
inside at once. Every claim has a control that shows what happens without
the setting: an unguarded run overlaps more than the limit, a writer
overlaps readers, a live permit holder keeps a waiter out.

1. limit: never more than `limit` inside, and `limit` reached, on one
   server, through Sentinel and on Cluster; limit 1 is a mutex.
2. dead and frozen permit holders: a SIGKILLed holder's permit goes at
   once for a waiter of this machine (break_dead_holders) or at its lease;
   a stopped one loses its own permit only, and learns it when it resumes.
3. shared and exclusive: readers overlap, a writer runs alone (one server,
   Sentinel, Cluster, Redlock); a writer is not starved by a stream of
   readers; a thread holding the key exclusively enters a shared call, one
   holding it shared is refused an exclusive call (an upgrade).
4. refusals: a limit that differs from the key's holders' (an error line
   naming both, on_error at once); `mode = "shared"` with `limit` > 1 and
   `limit` > 1 with Redlock masters (exit 78).
5. fair = true with limit = 2: waiters enter in arrival order, a holder
   calling again at once keeps no permit from a queued waiter (control:
   without fair it keeps the permit it lingers on); linger_ms with
   limit = 3: a kept permit taken back without a script (control:
   linger_ms = 0), and given up after linger_ms to a waiter (control:
   kept longer, the waiter times out);
   Redlock: a shared holder makes a plain caller wait, a semaphore of
   one-server configs on a quorum of the masters is a mismatch at once
   (control: on one master, the caller enters); keys (a, b) with shared
   readers and exclusive writers; limit, shared and keys over TLS.
"""
import errno
import os
import signal
import subprocess
import time

import pytest

from support.server import lock_keys, start_servers, started
from support.sets import finish, replay, run_all, start, writer_behind_readers
from support.tls import TlsServer
from support.topology import Cluster, Topology
from support.util import MULT, TIMEOUT, run, shim_env, wait_for, write_config

pytestmark = pytest.mark.timing  # time bounds and forced races

KEY = "lockshim:k"
OK_LINE = "call rc=42 errno=0"
EBUSY_LINE = "call rc=-1 errno=%d" % errno.EBUSY


@pytest.fixture
def cluster(request):
    """Three primaries, no replicas."""
    yield from started(request, Cluster(replicas=0))


@pytest.fixture
def topo(request):
    """A primary, its replicas and sentinels (support/topology.py)."""
    yield from started(request, Topology())


def said(r):
    """The last line a driver run printed (its call's report)."""
    lines = r.stdout.strip().splitlines()
    return lines[-1] if lines else ""


# ---- the locks (the observer and its replay: support/sets.py) ------------------------

def lock(symbol, settings):
    return '{ symbol = "%s"; key = "k"; lease_ms = 5000; wait_ms = 30000; %s }' % (
        symbol, settings)


def locks(*entries):
    return "locks = ( %s );\n" % ", ".join(entries)


def crowd(prog, cfg, log, kind="r", procs=8, threads=2, iters=4, ms=30):
    """procs processes x threads threads, iters calls of ms each; returns
    the calls made and the stderr of all."""
    return run_all([(prog, kind, cfg, log, threads, iters, ms)] * procs)


# ---- 1. limit ------------------------------------------------------------------------

def test_control_unguarded_crowd_exceeds_three(sets_prog, tmp_path):
    """Without the shim, 8 processes x 2 threads are inside together far
    more than 3 at once: the bounds below mean something."""
    log = str(tmp_path / "log")
    crowd(sets_prog, None, log)
    assert replay(log)[0] > 3


@pytest.mark.parametrize("limit,most", [(3, 3), (None, 1)], ids=["limit3", "default"])
def test_limit_bounds_the_holders(sets_prog, redis, tmp_path, limit, most):
    """limit = 3: never more than 3 inside, and 3 reached; no limit (1):
    one at a time. Every call entered; no key is left."""
    log = str(tmp_path / "log")
    extra = "limit = %d;" % limit if limit else ""
    cfg = write_config(tmp_path, redis, locks(lock("set_read", extra)))
    total, err = crowd(sets_prog, cfg, log)
    assert total == 8 * 2 * 4
    assert replay(log)[0] == most, err[-3000:]
    assert "error" not in err and "lost" not in err, err[-3000:]
    wait_for(lambda: lock_keys(redis) == [], timeout=5, what="no key left")


def test_limit_on_cluster(sets_prog, cluster, tmp_path):
    """limit = 3 on a Redis Cluster: at most 3, and 3 reached."""
    log = str(tmp_path / "log")
    cfg = cluster.config(tmp_path, locks(lock("set_read", "limit = 3;")))
    total, err = crowd(sets_prog, cfg, log)
    assert total == 8 * 2 * 4
    assert replay(log)[0] == 3, err[-3000:]


# ---- 2. dead and frozen permit holders ---------------------------------------------------

def permit_cfg(path, redis, settings):
    os.makedirs(str(path), exist_ok=True)
    return write_config(path, redis, 'locks = ( { symbol = "hold_call"; key = "k"; '
                        'limit = 2; %s } );\n' % settings)


def holders_pids(redis):
    """The pids named by the entries of KEY's holder set."""
    return sorted(int(m.split(":")[2]) for m in redis.cmd("ZRANGE", KEY, "0", "-1"))


def live_and_dead(progs, procs, cfg):
    """Two holders of cfg's permits enter; the second is SIGKILLed. Returns
    (the live holder, the dead one)."""
    live = procs([progs["driver"], "call:60000"], cfg)
    live.expect("enter")
    dead = procs([progs["driver"], "call:60000"], cfg)
    dead.expect("enter")
    dead.signal(signal.SIGKILL)
    dead.finish()
    return live, dead


def test_killed_permit_holder(progs, redis, tmp_path, procs):
    """limit = 2, both permits held, one holder SIGKILLed: a waiter of this
    machine takes the dead one's permit at once, the live one keeps its
    own. Control: with break_dead_holders = false the waiter times out
    while the dead permit's 20 s lease runs; with a short lease it enters
    once that lease has passed."""
    cfg = permit_cfg(tmp_path / "h", redis, "lease_ms = 20000;")
    live, dead = live_and_dead(progs, procs, cfg)
    assert holders_pids(redis) == sorted([live.p.pid, dead.p.pid])
    # control: the dead permit is not broken, and the set is full
    r = run([progs["driver"], "call:0"],
            permit_cfg(tmp_path / "c", redis, "lease_ms = 20000; wait_ms = 1000; "
                       "break_dead_holders = false;"))
    assert said(r) == EBUSY_LINE, r.stderr
    t0 = time.monotonic()
    r = run([progs["driver"], "call:0"], permit_cfg(tmp_path / "w", redis,
                                                     "lease_ms = 20000; wait_ms = 15000;"))
    assert said(r) == OK_LINE, r.stderr
    assert time.monotonic() - t0 < 5 * MULT
    assert "held by process %d of this machine, which is gone" % dead.p.pid in r.stderr
    assert holders_pids(redis) == [live.p.pid]


def test_dead_permit_freed_at_its_lease(progs, redis, tmp_path, procs):
    """break_dead_holders = false and a 2 s lease: the dead holder's permit
    frees when its lease ends, not before, while the live one holds on."""
    cfg = permit_cfg(tmp_path / "h", redis, "lease_ms = 2000;")
    live, dead = live_and_dead(progs, procs, cfg)
    t0 = time.monotonic()
    r = run([progs["driver"], "call:0"], permit_cfg(tmp_path / "w", redis,
                                                     "lease_ms = 2000; wait_ms = 20000; "
                                                     "break_dead_holders = false;"))
    took = time.monotonic() - t0
    assert said(r) == OK_LINE, r.stderr
    assert 0.5 < took < 10 * MULT, took
    assert holders_pids(redis) == [live.p.pid]


def test_frozen_permit_holder_loses_only_its_own(progs, redis, tmp_path, procs):
    """limit = 2, lease 1.5 s: a holder stopped (SIGSTOP) loses its permit
    to a waiter once its lease passes; the other holder keeps renewing its
    own. Resumed, the frozen one learns it lost the lease (on_lost: log).
    Control: while both holders run, the waiter times out."""
    cfg = permit_cfg(tmp_path / "h", redis, "lease_ms = 1500;")
    frozen = procs([progs["driver"], "call:6000"], cfg)
    frozen.expect("enter")
    other = procs([progs["driver"], "call:6000"], cfg)
    other.expect("enter")
    r = run([progs["driver"], "call:0"],
            permit_cfg(tmp_path / "c", redis, "lease_ms = 1500; wait_ms = 1000;"))
    assert said(r) == EBUSY_LINE, r.stderr  # control: both permits kept
    frozen.signal(signal.SIGSTOP)
    w = procs([progs["driver"], "call:2000"],
              permit_cfg(tmp_path / "w", redis, "lease_ms = 1500; wait_ms = 10000;"))
    w.expect("enter")
    assert holders_pids(redis) == sorted([other.p.pid, w.p.pid])
    frozen.signal(signal.SIGCONT)
    rc, _, err = frozen.finish()
    assert rc == 0 and "lease on %s" % KEY in err and "lost" in err, err
    rc, _, err = other.finish()
    assert rc == 0 and "lease on" not in err, err
    assert w.finish()[0] == 0


# ---- 3. shared and exclusive ---------------------------------------------------------------

RW = locks(lock("set_read", 'mode = "shared";'), lock("set_write", ""))


def readers_and_writers(prog, cfg, log):
    runs = [(prog, "r", cfg, log, 2, 6, 40)] * 4 + [(prog, "w", cfg, log, 1, 6, 20)] * 2
    return run_all(runs)[1]


def test_control_unguarded_writers_overlap_readers(sets_prog, tmp_path):
    log = str(tmp_path / "log")
    readers_and_writers(sets_prog, None, log)
    assert replay(log)[2]


def check_rw(prog, cfg, log):
    err = readers_and_writers(prog, cfg, log)
    readers, writers, mixed = replay(log)
    assert readers > 1, err[-3000:]  # shared holders overlap
    assert writers == 1 and not mixed, err[-3000:]  # an exclusive one runs alone
    assert "error" not in err and "lost" not in err, err[-3000:]


def test_shared_overlap_exclusive_alone(sets_prog, redis, tmp_path):
    check_rw(sets_prog, write_config(tmp_path, redis, RW), str(tmp_path / "log"))
    wait_for(lambda: lock_keys(redis) == [], timeout=5, what="no key left")


def test_shared_and_exclusive_on_cluster(sets_prog, cluster, tmp_path):
    check_rw(sets_prog, cluster.config(tmp_path, RW), str(tmp_path / "log"))


def test_sets_through_sentinel(sets_prog, topo, tmp_path):
    """Through Sentinel: limit = 3 (at most 3, 3 reached), and readers
    overlapping with writers alone."""
    log = str(tmp_path / "log")
    total, err = crowd(sets_prog, topo.config(tmp_path, locks(lock("set_read", "limit = 3;"))),
                       log)
    assert total == 8 * 2 * 4 and replay(log)[0] == 3, err[-3000:]
    os.makedirs(str(tmp_path / "rw"))
    check_rw(sets_prog, topo.config(tmp_path / "rw", RW), str(tmp_path / "rw" / "log"))


def test_shared_and_exclusive_on_redlock(sets_prog, masters, tmp_path):
    check_rw(sets_prog, masters.config(tmp_path, RW), str(tmp_path / "log"))


def test_writer_not_starved_by_readers(sets_prog, redis, tmp_path):
    """Readers (4 processes x 2 threads, 100 ms calls) keep the key held
    without a gap (control: from the mark "x" to "y" in the log someone is
    always inside, so a writer waiting for a free key would wait for the
    whole stream); a writer arriving meanwhile enters within a few calls'
    time, alone, and the readers go on afterwards."""
    log = str(tmp_path / "log")
    cfg = write_config(tmp_path, redis, RW)
    writer_behind_readers(sets_prog, cfg, log, str(tmp_path / "stop"), 2000)
    assert replay(log)[1:] == (1, False)


NESTED = "locks = ( %s );\n" % ", ".join(
    '{ symbol = "%s"; key = "k"; wait_ms = 1500; %s %%s }' % (sym, mode)
    for sym, mode in [("set_read_then", 'mode = "shared";'), ("set_read", 'mode = "shared";'),
                      ("set_write_then", ""), ("set_write", "")])


def nested(prog, cfg, log, order):
    t0 = time.monotonic()
    r = subprocess.run([prog, order, "10"], env=shim_env(cfg, SETS_LOG=log),
                       capture_output=True, text=True, timeout=TIMEOUT)
    return r, time.monotonic() - t0


def test_exclusive_holder_enters_a_shared_call(sets_prog, redis, tmp_path):
    """Holding the key exclusively, a thread enters a shared call on it
    (reentrant, at once). Control: with reentrant = false it waits for
    itself until wait_ms and the inner call is skipped."""
    log = str(tmp_path / "log")
    cfg = write_config(tmp_path, redis, NESTED.replace("%s", ""))
    r, took = nested(sets_prog, cfg, log, "wr")
    assert r.stdout.strip() == "nested rc=1 errno=0", r.stderr
    assert took < 1.0 * MULT and "error" not in r.stderr, r.stderr
    cfg = write_config(tmp_path, redis, NESTED.replace("%s", "reentrant = false;"))
    r, took = nested(sets_prog, cfg, log, "wr")
    assert r.stdout.strip() == "nested rc=-1 errno=%d" % errno.EBUSY, r.stderr
    assert took >= 1.4, took


def test_shared_holder_entering_an_exclusive_call_is_refused(sets_prog, redis, tmp_path):
    """Holding the key shared, a thread's exclusive call on it is refused at
    once: one error line saying why, on_error (skip). Control: with
    reentrant = false nothing refuses it, and the upgrade waits for the
    thread's own shared entry until wait_ms (two threads doing this
    would wait for each other the same way)."""
    log = str(tmp_path / "log")
    cfg = write_config(tmp_path, redis, NESTED.replace("%s", ""))
    r, took = nested(sets_prog, cfg, log, "rw")
    assert r.stdout.strip() == "nested rc=-1 errno=%d" % errno.EBUSY, r.stderr
    assert took < 1.0 * MULT, took
    lines = [l for l in r.stderr.splitlines() if ": error: " in l]
    assert len(lines) == 1 and "upgrade" in lines[0] and KEY in lines[0], r.stderr
    cfg = write_config(tmp_path, redis, NESTED.replace("%s", "reentrant = false;"))
    r, took = nested(sets_prog, cfg, log, "rw")
    assert r.stdout.strip() == "nested rc=-1 errno=%d" % errno.EBUSY, r.stderr
    assert took >= 1.4 and "upgrade" not in r.stderr, (took, r.stderr)


# ---- 4. refusals ----------------------------------------------------------------------

def test_limit_mismatch_is_an_error_at_once(progs, redis, tmp_path, procs):
    """A holder took the key with limit = 3; callers with limit 2 and with
    no limit (1) get one error line naming both numbers and on_error at
    once (skip), well before wait_ms. Control: limit 3 enters."""
    cfg3 = write_config(tmp_path, redis, 'locks = ( { symbol = "hold_call"; key = "k"; '
                        'limit = 3; } );\n')
    holder = procs([progs["driver"], "call:60000"], cfg3)
    holder.expect("enter")
    for limit, setting in [(2, "limit = 2;"), (1, "")]:
        os.makedirs(str(tmp_path / str(limit)), exist_ok=True)
        cfg = write_config(tmp_path / str(limit), redis,
                           'locks = ( { symbol = "hold_call"; key = "k"; wait_ms = 20000; '
                           '%s } );\n' % setting)
        t0 = time.monotonic()
        r = run([progs["driver"], "call:0"], cfg)
        assert time.monotonic() - t0 < 5 * MULT
        assert said(r) == EBUSY_LINE, r.stderr
        lines = [l for l in r.stderr.splitlines() if ": error: " in l]
        assert len(lines) == 1, r.stderr
        assert "limit %d here, 3 for the key's holders" % limit in lines[0], lines
        assert KEY in lines[0], lines
        assert "Redis unavailable" not in r.stderr, r.stderr
    r = run([progs["driver"], "call:0"], cfg, LOCKSHIM_LOG_LEVEL="info")
    assert "hold_call: lock refused; call skipped" in r.stderr, r.stderr
    r = run([progs["driver"], "call:0"], cfg3)
    assert said(r) == OK_LINE, r.stderr


def test_string_holder_mismatches_a_semaphore(progs, redis, tmp_path, procs):
    """A plain lock (limit 1) held: a limit = 3 caller gets the error at
    once; a shared caller waits instead (shared and exclusive exclude each
    other), and enters once the exclusive holder is gone."""
    plain = write_config(tmp_path, redis, 'locks = ( { symbol = "hold_call"; key = "k"; } );\n')
    holder = procs([progs["driver"], "call:1500"], plain)
    holder.expect("enter")
    os.makedirs(str(tmp_path / "s"), exist_ok=True)
    cfg = write_config(tmp_path / "s", redis, 'locks = ( { symbol = "hold_call"; key = "k"; '
                       'limit = 3; wait_ms = 20000; } );\n')
    r = run([progs["driver"], "call:0"], cfg)
    assert said(r) == EBUSY_LINE
    assert "limit 3 here, 1 for the key's holders" in r.stderr, r.stderr
    os.makedirs(str(tmp_path / "r"), exist_ok=True)
    cfg = write_config(tmp_path / "r", redis, 'locks = ( { symbol = "hold_call"; key = "k"; '
                       'mode = "shared"; wait_ms = 20000; } );\n')
    r = run([progs["driver"], "call:0"], cfg)
    assert said(r) == OK_LINE, r.stderr
    assert holder.finish()[0] == 0


def refused_before_main(r, ok, *words):
    """The driver's run r: a control (ok) that ran its call guarded, or a
    config refused with exit 78 before main, in one line with every word."""
    if ok:
        assert r.returncode == 0 and said(r) == OK_LINE, r.stderr
        return
    assert r.returncode == 78 and r.stdout == "", r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert all(w in r.stderr for w in words), r.stderr


@pytest.mark.parametrize("settings,ok", [('mode = "shared"; limit = 3;', False),
                                         ('mode = "shared";', True),
                                         ("limit = 3;", True)])
def test_shared_with_limit_is_refused(progs, redis, tmp_path, settings, ok):
    """mode = "shared" with limit > 1: exit 78 before main, one line naming
    the setting. Control: each alone runs."""
    cfg = write_config(tmp_path, redis, 'locks = ( { symbol = "hold_call"; key = "k"; %s } );\n'
                       % settings)
    refused_before_main(run([progs["driver"], "call:0"], cfg), ok, "locks[0].mode", "limit = 3")


@pytest.mark.parametrize("settings,ok", [("limit = 3;", False), ('mode = "shared";', True)])
def test_redlock_refuses_a_semaphore(progs, masters, tmp_path, settings, ok):
    """limit > 1 with Redlock masters: exit 78, naming limit and Redlock.
    Control: a shared lock on the same masters runs."""
    cfg = masters.config(tmp_path, 'locks = ( { symbol = "hold_call"; key = "k"; %s } );\n'
                         % settings)
    refused_before_main(run([progs["driver"], "call:0"], cfg), ok, "limit = 3", "Redlock")


# ---- 5. fair, linger, TLS, Redlock, keys with shared ---------------------------------------

def fair_cfg(path, redis, settings):
    """hold_call and log_call on one key with limit = 2."""
    os.makedirs(str(path), exist_ok=True)
    return write_config(path, redis, "locks = ( %s );\n" % ", ".join(
        '{ symbol = "%s"; key = "k"; limit = 2; wait_ms = 30000; lease_ms = 20000; %s }'
        % (sym, settings) for sym in ("hold_call", "log_call")))


def queue_order(progs, redis, tmp_path, procs, settings):
    """limit = 2: two holders (one for 1 s, one for 4 s), then four waiters
    started one after another, each seen queued before the next starts;
    each appends its pid to a file inside its call. Returns (the pids in
    arrival order, the pids in entry order)."""
    c = fair_cfg(tmp_path, redis, settings)
    order = str(tmp_path / "order")
    holders = [procs([progs["driver"], "call:%d" % ms], c) for ms in (1000, 4000)]
    for h in holders:
        h.expect("enter")
    waiters = []
    for n in range(1, 5):
        waiters.append(procs([progs["driver"], "log:" + order], c))
        wait_for(lambda: redis.cmd("ZCARD", KEY + ":q") == n, what="waiter %d queued" % n)
    for w in waiters:
        assert w.expect("log") == "log rc=1 errno=0"
        assert w.finish()[0] == 0
    for h in holders:
        assert h.finish()[0] == 0
    return [str(w.p.pid) for w in waiters], open(order).read().split()


def test_fair_permits_in_arrival_order(progs, redis, tmp_path, procs):
    """fair = true with limit = 2: waiters enter in arrival order, and a
    holder calling again the moment it returns does not keep its permit
    from a queued waiter for the 2 s of its wait_ms. Control: the same
    barging run without fair (handoff_ms 30 s, linger_ms 60 s) keeps the
    waiter out for its whole wait_ms (10 of 10 runs; with fair it enters
    10 of 10).
    What fair changes for holder sets is exactly that: no permit is kept
    between calls (lock.c's lingers). Queued callers enter in arrival
    order with or without it (queue_order without fair: 3 of 3 in order),
    since a set's release only wakes the head and a new caller never
    enters past a queue. With the default linger_ms (1 ms) the looping
    holder loses its kept permit only when something delays it more than
    1 ms between two calls (the renewal thread then releases it): about 2
    runs of 3 on a loaded machine, hence linger_ms 60 s here."""
    arrived, entered = queue_order(progs, redis, tmp_path / "order", procs, "fair = true;")
    assert entered == arrived
    for fair, said_ in [("", "log rc=-1 errno=%d" % errno.EBUSY),
                        ("fair = true;", "log rc=1 errno=0")]:
        assert barging(progs, redis, tmp_path / ("barge" + fair[:4]), procs,
                       "linger_ms = 60000; " + fair) == (said_, True), fair


def barging(progs, redis, tmp_path, procs, settings):
    """limit = 2: one permit held by a long call, the other by a process
    that calls again the moment it returns (ledger_update in a loop); a
    waiter (log_call, wait_ms 2 s) arrives. Returns (the waiter's report,
    whether the looping holder was still calling when the waiter ended)."""
    os.makedirs(str(tmp_path), exist_ok=True)
    c = write_config(tmp_path, redis, "locks = ( %s );\n" % ", ".join(
        '{ symbol = "%s"; key = "k"; limit = 2; wait_ms = %d; lease_ms = 20000; '
        'handoff_ms = 30000; %s }' % (sym, wait, settings)
        for sym, wait in (("hold_call", 30000), ("ledger_update", 30000), ("log_call", 2000))))
    counter = str(tmp_path / "counter")
    with open(counter, "w") as f:
        f.write("0\n")
    long = procs([progs["driver"], "call:60000"], c)
    long.expect("enter")
    loop = procs([progs["ledger"], "direct", counter, "1000000"], c)
    wait_for(lambda: int(open(counter).read() or 0) > 100, what="the loop calling")
    r = run([progs["driver"], "log:" + str(tmp_path / "o")], c)
    running = loop.p.poll() is None
    for p in (loop, long):
        p.signal(signal.SIGKILL)
        p.finish()
    redis.cmd("FLUSHALL")  # the killed holders' permits
    return said(r), running



def scripts_run(redis):
    """The scripts Redis ran since the last CONFIG RESETSTAT (EVAL and
    EVALSHA: every holder-set acquire and release is one)."""
    n = 0
    for line in redis.cmd("INFO", "commandstats").splitlines():
        if line.startswith(("cmdstat_eval:", "cmdstat_evalsha:")):
            n += int(line.split("calls=")[1].split(",")[0])
    return n



def sem_cfg(path, redis, settings):
    """hold_call on KEY with limit = 3 and settings."""
    os.makedirs(str(path), exist_ok=True)
    return write_config(path, redis, 'locks = ( { symbol = "hold_call"; key = "k"; '
                        'limit = 3; handoff_ms = 30000; %s } );\n' % settings)


def test_linger_takes_a_kept_permit_back_without_a_round_trip(progs, redis, tmp_path):
    """limit = 3, linger_ms: three calls in a row by one thread run one
    acquire script and one release (at exit): the later calls take the
    kept permit back without a round trip. Control: linger_ms = 0 runs a
    script per acquire and per release."""
    for n, linger in [(2, 30000), (6, 0)]:
        c = sem_cfg(tmp_path / str(linger), redis, "linger_ms = %d;" % linger)
        run([progs["driver"], "call:0"], c)  # scripts cached
        redis.cmd("CONFIG", "RESETSTAT")
        r = run([progs["driver"], "call:0", "call:0", "call:0"], c)
        assert r.stdout.split().count("rc=42") == 3, r.stderr
        assert scripts_run(redis) == n, (linger, redis.cmd("INFO", "commandstats"))
        assert lock_keys(redis) == []  # released at exit


def test_a_kept_permit_goes_to_a_waiter(progs, redis, tmp_path, procs):
    """limit = 3: two permits held by long calls, the third kept by an
    idle thread (linger_ms = 200, blocked on stdin after its call): a
    waiter enters while the idler still idles, and the kept permit is gone
    from the set. Control: kept for 60 s, the waiter times out."""
    for linger, ok in [(60000, False), (200, True)]:
        redis.cmd("FLUSHALL")
        c = sem_cfg(tmp_path / str(linger), redis, "lease_ms = 60000; linger_ms = %d;" % linger)
        longs = [procs([progs["driver"], "call:60000"], c) for _ in range(2)]
        for p in longs:
            p.expect("enter")
        idler = procs([progs["driver"], "call:0", "stdin"], c)
        assert idler.expect("call") == OK_LINE
        w = sem_cfg(tmp_path / ("w%d" % linger), redis,
                    "lease_ms = 60000; linger_ms = 0; wait_ms = %d;" % (10000 if ok else 1000))
        r = run([progs["driver"], "call:0"], w)
        assert said(r) == (OK_LINE if ok else EBUSY_LINE), r.stderr
        assert idler.p.poll() is None
        if ok:
            assert idler.p.pid not in holders_pids(redis)
        for p in longs + [idler]:
            p.signal(signal.SIGKILL)
            p.finish()


def keys_lock(symbol, settings):
    return ('{ symbol = "%s"; keys = ( "b", "a" ); lease_ms = 5000; wait_ms = 30000; %s }'
            % (symbol, settings))


KEYS_RW = locks(keys_lock("set_read", 'mode = "shared";'), keys_lock("set_write", ""))


def test_keys_with_shared_readers_and_an_exclusive_writer(sets_prog, redis, tmp_path):
    """keys (a, b) with mode = "shared" on the readers and exclusive on the
    writers: readers overlap, a writer runs alone, both keys are holder
    sets while readers hold them and nothing is left at the end. Control:
    test_control_unguarded_writers_overlap_readers (no lock: a writer
    overlaps readers)."""
    log, stop = str(tmp_path / "log"), str(tmp_path / "stop")
    cfg = write_config(tmp_path, redis, KEYS_RW)
    reader = start(sets_prog, "r", cfg, log, 1, 1, 300, stop)
    try:
        assert reader.stdout.readline().startswith("started")
        wait_for(lambda: all(redis.cmd("TYPE", "lockshim:" + k) == "zset" for k in "ab"),
                 what="both keys held shared")
    finally:
        open(stop, "w").close()
    finish(reader)
    os.makedirs(str(tmp_path / "rw"))
    check_rw(sets_prog, write_config(tmp_path / "rw", redis, KEYS_RW), str(tmp_path / "rw" / "log"))
    wait_for(lambda: lock_keys(redis) == [], timeout=5, what="no key left")



def redlock_call(progs, masters, path, settings):
    """One hold_call on KEY through the Redlock masters; returns (its run,
    seconds taken)."""
    os.makedirs(str(path), exist_ok=True)
    cfg = masters.config(path, 'locks = ( { symbol = "hold_call"; key = "k"; %s } );\n'
                         % settings)
    t0 = time.monotonic()
    r = run([progs["driver"], "call:0"], cfg)
    return r, time.monotonic() - t0


def errors(r):
    return [l for l in r.stderr.splitlines() if ": error: " in l]


def test_redlock_shared_holder_and_a_plain_caller(progs, masters, tmp_path, procs):
    """Redlock: a shared holder on the masters; a plain exclusive caller
    waits (no error: shared and exclusive exclude each other, a string
    holder counts as limit 1 like a shared one), times out with a short
    wait_ms and enters once the holder is gone. Control: a second shared
    caller enters at once."""
    h = procs([progs["driver"], "call:2000"],
              masters.config(tmp_path, 'locks = ( { symbol = "hold_call"; key = "k"; '
                             'mode = "shared"; } );\n'))
    h.expect("enter")
    r, took = redlock_call(progs, masters, tmp_path / "s", 'mode = "shared"; wait_ms = 20000;')
    assert said(r) == OK_LINE and took < 1.0 * MULT, (took, r.stderr)  # control
    r, took = redlock_call(progs, masters, tmp_path / "x1", "wait_ms = 300;")
    assert said(r) == EBUSY_LINE and not errors(r), r.stderr
    assert took >= 0.25, took
    r, took = redlock_call(progs, masters, tmp_path / "x2", "wait_ms = 20000;")
    assert said(r) == OK_LINE and not errors(r), r.stderr
    assert took >= 0.5, took  # it waited for the shared holder's 2 s call
    assert h.finish()[0] == 0


def test_redlock_caller_meets_a_semaphore_on_a_quorum(progs, masters, tmp_path, procs):
    """limit > 1 is refused with Redlock (78), so a limit mismatch there
    comes only from a semaphore taken through a one-server config on some
    of the masters: held (limit = 3) on a quorum (2 of 3), a Redlock
    caller, plain or shared, gets the error naming both numbers at once,
    not after wait_ms. Control: held on one master only (no quorum), the
    Redlock caller takes the other two and enters."""
    holders = []
    for i in range(2):
        os.makedirs(str(tmp_path / ("m%d" % i)))
        cfg = write_config(tmp_path / ("m%d" % i), masters.nodes[i],
                           'locks = ( { symbol = "hold_call"; key = "k"; limit = 3; } );\n')
        holders.append(procs([progs["driver"], "call:60000"], cfg))
        holders[-1].expect("enter")
        for st in ("", 'mode = "shared";'):
            r, took = redlock_call(progs, masters, tmp_path / ("c%d%d" % (i, len(st))),
                                   "wait_ms = 20000; %s" % st)
            if i == 0:  # the control: one master of three
                assert said(r) == OK_LINE and not errors(r), r.stderr
                continue
            assert said(r) == EBUSY_LINE and took < 5 * MULT, (took, r.stderr)
            assert len(errors(r)) == 1, r.stderr
            assert "limit 1 here, 3 for the key's holders" in errors(r)[0], r.stderr
    for h in holders:
        h.signal(signal.SIGKILL)
        h.finish()


@pytest.fixture
def tls_server(request, pki):
    """A redis-server whose only port speaks TLS (support/tls.py)."""
    yield from start_servers(request, lambda: TlsServer(pki), lambda s: "redis-server (TLS)")


def test_sets_over_tls(sets_prog, tls_server, pki, tmp_path):
    """Over a TLS-only port: limit = 3 (at most 3, and 3 reached), shared
    readers beside exclusive writers, and the same with keys (a, b).
    Controls: the unguarded runs above (more than 3 inside; a writer
    overlapping readers)."""
    srv = tls_server()
    head = ('redis = { host = "127.0.0.1"; port = %d; tls = { ca_file = "%s"; }; };\n'
            % (srv.port, pki["ca"]))

    def config(name, body):
        os.makedirs(str(tmp_path / name))
        return write_config(tmp_path / name, None, head + body), str(tmp_path / name / "log")

    cfg, log = config("limit", locks(lock("set_read", "limit = 3;")))
    total, err = crowd(sets_prog, cfg, log)
    assert total == 8 * 2 * 4 and replay(log)[0] == 3, err[-3000:]
    check_rw(sets_prog, *config("rw", RW))
    check_rw(sets_prog, *config("keys", KEYS_RW))
    wait_for(lambda: lock_keys(srv) == [], timeout=5, what="no key left")
