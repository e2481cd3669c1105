# SPDX-License-Identifier: MIT
"""Redlock: `redis.masters`, one lock over 3 or 5 independent masters.

Every master is a redis-server of its own on a free 127.0.0.1 port (no
persistence), stopped by its pid when the test ends (after a SIGCONT in
case a test froze it): support/topology.py's Masters. The counter
workload and the blocking program are support/workers.py's; disruptions
(SIGKILL, SIGSTOP, a restart with no data, a black-holing proxy) start
once the workers have said they run, and their effects are waited for by
polling the masters and the counter file.

1. exclusion with 3 and with 5 masters (3 processes x 2 threads, counter
   exact; the same workload without the shim loses updates), and with
   masters given as unix sockets;
2. one master SIGKILLed, SIGSTOPped, restarted empty, or behind a proxy
   that black-holes its traffic, mid-run: the counter stays exact, no call
   fails, and the locks keep coming (a frozen master costs its command
   timeout about once per quarantine period, not per call);
3. a waiter is woken by the release, well before retry_max_ms, and a
   caller that releases and takes again at once cannot starve a farther
   waiter (a control run against one server with the hand-off put off
   starves it); a waiter never busy-loops: with the lock held (also when
   the key is gone from one master, which the waiter then takes and gives
   back each time) or a quorum killed or frozen mid-wait, each master gets
   about one attempt per retry_max_ms (INFO commandstats);
4. a renewal confirmed by less than a quorum is a lost lease (on_lost);
5. fair = true is refused at config load (78);
6. `lockshim check` names every master (0) and a dead one (69).
"""
import os
import re
import subprocess
import time

import pytest

from support.proxy import BLACK_HOLE, PASS, Proxy
from support.server import RedisServer, call_failed, connections, lock_keys, start_servers
from support.topology import FAST, Masters
from support.util import CLI, MULT, TIMEOUT, cc, run, shim_env, wait_for
from support.workers import (RACE_LOCK, WORK, build_worker, calls, counter, finish_workers,
                             lost_lines, race, start_workers)

pytestmark = pytest.mark.timing  # time bounds and forced races: make test-repeat

BLOCK = ('locks = ( { symbol = "block_call"; key = "blk"; lease_ms = %d; wait_ms = %d; '
         'retry_max_ms = %d; on_timeout = "skip"; return = -7; %s } );\n')


@pytest.fixture
def masters(request):
    started = []

    def start(n):
        ms = Masters()
        started.append(ms)
        return ms.start(n)
    yield start
    failed = call_failed(request)
    for ms in started:
        if failed:
            print(ms.logs())
        ms.stop()


def progress(path, n, timeout, what):
    """Polls until the counter has moved n updates past its value now;
    returns how long that took (s)."""
    start, t0 = counter(path), time.monotonic()
    wait_for(lambda: counter(path) >= start + n, timeout=timeout, what=what)
    return time.monotonic() - t0


def run_with(ms, worker_progs, bg, tmp_path, disrupt, cfg=None, wait_ms=10000, after=100,
             within=30):
    """Runs the counter workload on ms, calls disrupt() once it runs, then
    waits for `after` more updates (within `within` s) and checks that every
    call succeeded within wait_ms and the counter is exact. Returns (the
    time those updates took, the workers' stderr)."""
    cfg = cfg or ms.config(tmp_path, WORK % wait_ms)
    path, stop = str(tmp_path / "c"), str(tmp_path / "stop")
    try:
        ws = start_workers(bg, worker_progs, cfg, path, stop)
        progress(path, 20, 30, "the workers to update the counter")
        disrupt()
        took = progress(path, after, within, "%d updates after the disruption" % after)
    finally:
        open(stop, "w").close()
    total, err = finish_workers(ws, wait_ms)
    assert counter(path) == total, err[-3000:]
    return took, err


# ---- 1. exclusion -------------------------------------------------------------------


def test_control_loses_updates(worker_progs, tmp_path):
    """Without the shim the workload loses updates: the exact counts below mean something."""
    path, stop = str(tmp_path / "c"), str(tmp_path / "stop")
    with open(path, "w") as f:
        f.write("0\n")
    env = shim_env(None, preload=False)
    ps = [subprocess.Popen([worker_progs["worker"], path, "2", "50", stop], env=env,
                           stdout=subprocess.PIPE, text=True) for _ in range(3)]
    outs = [p.communicate(timeout=TIMEOUT)[0] for p in ps]
    assert all(p.returncode == 0 for p in ps), outs
    assert counter(path) < 3 * 2 * 50


@pytest.mark.parametrize("n", [3, 5])
def test_exclusion(masters, worker_progs, bg, tmp_path, n):
    """3 processes x 2 threads, 60 updates each: exact, and the lock was
    taken on every master (the same token: one SET NX each)."""
    ms = masters(n)
    cfg = ms.config(tmp_path, WORK % 10000)
    path, stop = str(tmp_path / "c"), str(tmp_path / "stop")
    ws = start_workers(bg, worker_progs, cfg, path, stop, maxiter=60)
    total, err = finish_workers(ws, 10000)
    assert total == 3 * 2 * 60
    assert counter(path) == total, err[-3000:]
    assert all(calls(m, "set") >= total for m in ms.nodes)
    assert not lost_lines(err), err[-3000:]
    assert all(not lock_keys(m) for m in ms.nodes)


@pytest.fixture
def socket_masters(request):
    """Starts conftest's redis-servers (each also on a unix socket),
    stopped by pid when the test ends."""
    yield from start_servers(request, RedisServer, lambda s: "redis-server %d" % s.port)


def test_exclusion_over_unix_sockets(progs, socket_masters, tmp_path):
    """Masters given by `socket`: 3 processes x 2 threads on one counter,
    exact, every master reached through its socket, and `lockshim check`
    names each socket."""
    servers = [socket_masters() for _ in range(3)]
    cfg = str(tmp_path / "lockshim.cfg")
    with open(cfg, "w") as f:
        f.write('redis = { masters = ( %s ); %s };\n%s'
                % (", ".join('{ socket = "%s"; }' % s.sock for s in servers), FAST, RACE_LOCK))
    assert race(progs["ledger"], "direct", str(tmp_path / "c"), cfg, procs=3, iters=10,
                threads=2) == 60
    for s in servers:  # the config names no TCP address: these came by the socket
        assert connections(s) > 3
    p = run([CLI, "check", "-c", cfg])
    assert p.returncode == 0, p.stdout + p.stderr
    # check's settings line names the masters too: look at the rest
    said = "\n".join(x for x in p.stdout.splitlines()
                     if not x.startswith("settings: "))
    for s in servers:
        assert s.sock in said, p.stdout


# ---- 2. a master down, frozen, restarted, partitioned ---------------------------------


@pytest.mark.parametrize("n", [3, 5])
def test_master_killed(masters, worker_progs, bg, tmp_path, n):
    """SIGKILL of the first master (every waiter's home) mid-run."""
    ms = masters(n)
    _, err = run_with(ms, worker_progs, bg, tmp_path, lambda: ms.nodes[0].proc.kill())
    assert "redlock master %s failed" % ms.addr(0) in err


def test_master_frozen(masters, worker_progs, bg, tmp_path):
    """SIGSTOP of the first master mid-run: no call hangs, and 300 updates
    take far less than the 300 command timeouts (150 s) they would cost if
    the frozen master were asked every call."""
    ms = masters(3)
    took, err = run_with(ms, worker_progs, bg, tmp_path, ms.nodes[0].freeze, after=300, within=60)
    assert took < 30 * MULT, took
    assert "redlock master %s failed" % ms.addr(0) in err
    assert "timed out" in err


def test_master_restarted_empty(masters, worker_progs, bg, tmp_path):
    """The second master restarted with no data mid-run: the locks it lost
    are still held on a quorum, and it takes locks again once back."""
    ms = masters(3)
    m = ms.nodes[1]

    def restart():
        ms.restart(1)
        wait_for(lambda: calls(m, "set") >= 10, timeout=30, what="locks on the restarted master")
    run_with(ms, worker_progs, bg, tmp_path, restart)


def test_minority_partition(masters, worker_progs, bg, tmp_path):
    """The third master behind a proxy that starts black-holing every byte
    mid-run (connections stay open, nothing answers): no call blocks."""
    ms = masters(3)
    with Proxy(ms.nodes[2].port) as px:
        ports = [ms.nodes[0].port, ms.nodes[1].port, px.port]
        cfg = ms.config(tmp_path, WORK % 10000, ports=ports)
        took, err = run_with(ms, worker_progs, bg, tmp_path, lambda: px.set_mode(BLACK_HOLE),
                             cfg=cfg, after=300, within=60)
        px.set_mode(PASS)
    assert took < 30 * MULT, took
    assert "redlock master 127.0.0.1:%d failed" % px.port in err


# ---- 3. waiting ------------------------------------------------------------------------


def test_waiter_woken_by_release(masters, worker_progs, bg, tmp_path):
    """A waiter queued on the masters gets the lock soon after the holder's
    release, not at its next ask (retry_max_ms = 5000, the lease 30 s)."""
    ms = masters(3)
    cfg = ms.config(tmp_path, BLOCK % (30000, 20000, 5000, ""))
    holder = bg([worker_progs["block"]], cfg)
    holder.expect("enter")
    waiter = bg([worker_progs["block"]], cfg)
    home = ms.nodes[0]
    wait_for(lambda: home.cmd("ZCARD", "lockshim:blk:q") == 1, timeout=10,
             what="the waiter queued at the first master")
    t0 = time.monotonic()
    holder.send()
    holder.expect("call rc=42")
    waiter.expect("enter")
    woken = time.monotonic() - t0
    waiter.send()
    waiter.expect("call rc=42")
    assert holder.wait() == 0 and waiter.wait() == 0
    assert woken < 2.0 * MULT, woken


def test_waiter_without_home(masters, worker_progs, bg, tmp_path):
    """The first master (the waiters' home) killed while a waiter waits: it
    still gets the lock after the release, within a capped backoff."""
    ms = masters(3)
    cfg = ms.config(tmp_path, BLOCK % (30000, 20000, 1000, ""))
    holder = bg([worker_progs["block"]], cfg)
    holder.expect("enter")
    waiter = bg([worker_progs["block"]], cfg)
    wait_for(lambda: ms.nodes[0].cmd("ZCARD", "lockshim:blk:q") == 1, timeout=10,
             what="the waiter queued at the first master")
    ms.nodes[0].proc.kill()
    t0 = time.monotonic()
    holder.send()
    holder.expect("call rc=42")
    waiter.expect("enter", timeout=10)
    assert time.monotonic() - t0 < 5.0 * MULT
    waiter.send()
    waiter.expect("call rc=42")


STARVE = ('locks = ( { symbol = "ledger_update"; key = "ledger"; lease_ms = 5000; '
          'wait_ms = %d; on_timeout = "skip"; return = -7; linger_ms = 0; %s } );\n')
WINDOW_US = 50000   # the starvation pair's ledger_update: 50 ms inside the lock
REPLY_DELAY = 0.015  # what the farther caller's proxies add to every reply (s)


@pytest.fixture(scope="module")
def slow_worker(tmp_path_factory):
    """support/workers.py's worker on a ledger_update that keeps the lock
    WINDOW_US (progs/ledger.c built with -DLEDGER_WINDOW_US)."""
    d = str(tmp_path_factory.mktemp("slow"))
    cc(os.path.join(d, "libledger.so"), ["ledger.c"], "-O2", "-shared", "-fPIC",
       "-DLEDGER_WINDOW_US=%d" % WINDOW_US)
    return build_worker(d, d)


def starve_run(ms, worker, bg, tmp_path, wait_ms, calls, extra="", single=False):
    """A near caller that takes the lock again the moment it releases it (one
    thread, linger_ms = 0, each call WINDOW_US long), for as long as a
    farther caller makes `calls` calls, on every master or (single) on the
    first one as a single server. The farther caller reaches its servers
    through proxy.py, which holds every reply REPLY_DELAY: it hears of a
    release that much after the near caller, whose next SET NX follows its
    release at once, so each try it makes on being woken reaches the server
    in the middle of the near caller's next call (15 ms into 50), and its
    next wait is queued (30 ms in) before that call's release wakes it
    again. Only a hand-off can give it the lock; the race a try could win
    is the microseconds between a release and the near caller's next SET
    NX (its first try of a call, at a random moment, or a near caller
    stalled 15 ms between two of its calls). Returns the farther caller's
    "done" fields and how many tries each of its calls took (from its debug
    log)."""
    body = STARVE % (wait_ms, extra)
    path, stop = str(tmp_path / "c"), str(tmp_path / "stop")
    nodes = ms.nodes[:1] if single else ms.nodes
    pxs = [Proxy(m.port, reply_delay=REPLY_DELAY).start() for m in nodes]

    def config(ports, name):
        if not single:
            return ms.config(tmp_path, body, ports=ports, name=name)
        cfg = str(tmp_path / name)
        with open(cfg, "w") as f:
            f.write('redis = { host = "127.0.0.1"; port = %d; %s };\n%s' % (ports[0], FAST, body))
        return cfg
    try:
        near = config([m.port for m in nodes], "near.cfg")
        far = config([px.port for px in pxs], "far.cfg")
        hogs = start_workers(bg, {"worker": worker}, near, path, stop, procs=1, threads=1)
        w = bg([worker, path, "1", str(calls), str(tmp_path / "never")], far,
               LOCKSHIM_LOG_LEVEL="debug")
        assert w.wait(timeout=calls * wait_ms / 1000 + 60) == 0, w.stderr()[-3000:]
    finally:
        open(stop, "w").close()
        for px in pxs:
            px.stop()
    for h in hogs:
        assert h.wait() == 0, h.stderr()[-3000:]
    done = w.expect("done")
    tries = [int(n) for n in re.findall(r"acquired lockshim:ledger for ledger_update "
                                        r"\((\d+) tries", w.stderr())]
    return dict(f.split("=") for f in done.split()[1:]), tries


def test_waiter_not_starved(masters, slow_worker, bg, tmp_path):
    """A near caller that releases and takes again at once cannot starve a
    farther waiter: every master's queue orders the waiter alike, and a
    release with waiters hands the key to the head on every master, so
    each of the waiter's 20 calls takes a few tries (plain SET NX, queued,
    handed over). handoff_ms = 60000 changes nothing: with several masters
    a release with waiters always hands over."""
    ms = masters(3)
    fields, tries = starve_run(ms, slow_worker, bg, tmp_path, 20000, 20, "handoff_ms = 60000;")
    assert int(fields["failed"]) == 0 and int(fields["ok"]) == 20, fields
    assert len(tries) == 20 and max(tries) <= 10, tries
    assert int(fields["max_ms"]) < 5000 * MULT, fields


def test_waiter_starved_without_handoff(masters, slow_worker, bg, tmp_path):
    """Control: the same run against one server, where handoff_ms = 60000
    does put the hand-off off, has the farther waiter woken by each release
    and finding the key taken again every time (starve_run says why this
    is by construction): the bound above is the hand-off's doing."""
    ms = masters(1)
    fields, tries = starve_run(ms, slow_worker, bg, tmp_path, 3000, 3, "handoff_ms = 60000;",
                               single=True)
    assert int(fields["failed"]) > 0 or max(tries, default=0) >= 50, (fields, tries)


# ---- 3b. no busy loop -------------------------------------------------------------------

PACE_WAIT_MS, PACE_RETRY_MS = 2000, 200
# the rule: about one attempt per master per retry_max_ms; an attempt is at
# most 3 commands at the home master (the queue script, the BLPOP that pops
# the signal of its own give-back, the BLPOP that waits): generous
PACE_BOUND = 4 * (PACE_WAIT_MS // PACE_RETRY_MS) + 10


# what the shim sends itself and a script never runs (commandstats counts
# the commands inside a script too)
TOP_LEVEL = ("evalsha", "eval", "blpop", "ping", "script", "hello", "auth", "select")


def commands(node):
    """The commands clients sent node so far (TOP_LEVEL's: the waiter's
    plain SET NX, once, is not counted)."""
    stats = dict(re.findall(r"^cmdstat_([^:]+):calls=(\d+),", node.cmd("INFO", "commandstats"),
                            re.M))
    return sum(int(stats.get(c, 0)) for c in TOP_LEVEL)


def paced_wait(ms, worker_progs, bg, cfg, nodes, disrupt=None):
    """Runs one waiter that times out after PACE_WAIT_MS; once it has queued
    on the second master, calls disrupt(). Returns the commands each of
    nodes was sent from then on, and the waiter's stderr."""
    waiter = bg([worker_progs["block"]], cfg)
    wait_for(lambda: ms.nodes[1].cmd("ZCARD", "lockshim:blk:q") == 1, timeout=10,
             what="the waiter queued at the second master")
    if disrupt:
        disrupt()
    before = [commands(m) for m in nodes]
    waiter.expect("call rc=-7", timeout=PACE_WAIT_MS / 1000 + 10)
    assert waiter.wait() == 0
    sent = [commands(m) - b for m, b in zip(nodes, before)]
    print("commands sent to each master:", sent)
    return sent, waiter.stderr()


def test_waiter_paced_while_held(masters, worker_progs, bg, tmp_path):
    """The lock held by another process for the whole wait: the waiter asks
    each master about once per retry_max_ms, not in a loop (37,506
    commands to one master in a second were seen)."""
    ms = masters(3)
    cfg = ms.config(tmp_path, BLOCK % (30000, PACE_WAIT_MS, PACE_RETRY_MS, ""))
    holder = bg([worker_progs["block"]], cfg)
    holder.expect("enter")
    sent, err = paced_wait(ms, worker_progs, bg, cfg, ms.nodes)
    assert "still held by another owner" in err, err[-2000:]
    assert max(sent) <= PACE_BOUND, (sent, err[-2000:])
    holder.send()
    holder.expect("call rc=42")


@pytest.mark.parametrize("gone", [0, 2])
def test_waiter_paced_while_held_by_a_quorum(masters, worker_progs, bg, tmp_path, gone):
    """The holder's key gone from one master (the waiters' home, or
    another) while a quorum still holds it: the waiter takes that master,
    gives it back and waits again, about once per retry_max_ms."""
    ms = masters(3)
    cfg = ms.config(tmp_path, BLOCK % (30000, PACE_WAIT_MS, PACE_RETRY_MS, ""))
    holder = bg([worker_progs["block"]], cfg)
    holder.expect("enter")
    assert ms.nodes[gone].cmd("DEL", "lockshim:blk") == 1
    sent, err = paced_wait(ms, worker_progs, bg, cfg, ms.nodes)
    assert "still held by another owner" in err, err[-2000:]
    assert max(sent) <= PACE_BOUND, (sent, err[-2000:])
    holder.send()
    holder.expect("call rc=42")


@pytest.mark.parametrize("fault", ["killed", "frozen"])
def test_waiter_paced_without_quorum(masters, worker_progs, bg, tmp_path, fault):
    """The lock held, then 2 of 3 masters killed or frozen (SIGSTOP) while a
    waiter waits: no quorum for the rest of the wait; the waiter's commands
    to the live master stay paced."""
    ms = masters(3)
    cfg = ms.config(tmp_path, BLOCK % (30000, PACE_WAIT_MS, PACE_RETRY_MS, ""))
    holder = bg([worker_progs["block"]], cfg)
    holder.expect("enter")

    def disrupt():
        for m in ms.nodes[1:]:
            if fault == "killed":
                m.proc.kill()
                m.proc.wait()
            else:
                m.freeze()
    sent, err = paced_wait(ms, worker_progs, bg, cfg, ms.nodes[:1], disrupt)
    assert sent[0] <= PACE_BOUND, (sent, err[-2000:])


# ---- 4. renewal -----------------------------------------------------------------------


def test_renewal_refused_by_quorum_is_lost(masters, worker_progs, bg, tmp_path):
    """The key deleted on 2 of 3 masters while the call runs: the next
    renewal is confirmed by one master only, and on_lost reports it."""
    ms = masters(3)
    cfg = ms.config(tmp_path, BLOCK % (600, 1000, 100, ""))
    holder = bg([worker_progs["block"]], cfg)
    holder.expect("enter")
    for m in ms.nodes[:2]:
        assert m.cmd("DEL", "lockshim:blk") == 1
    wait_for(lambda: lost_lines(holder.stderr()), timeout=10, what="the lost lease reported")
    assert "lockshim:blk was lost" in holder.stderr() or "lease on lockshim:blk" in \
        holder.stderr()
    holder.send()
    holder.expect("call rc=42")


def test_renewal_with_quorum_down_is_lost(masters, worker_progs, bg, tmp_path):
    """2 of 3 masters killed while the call runs: the lease cannot be
    confirmed by a quorum and is reported lost within about a lease."""
    ms = masters(3)
    cfg = ms.config(tmp_path, BLOCK % (600, 1000, 100, ""))
    holder = bg([worker_progs["block"]], cfg)
    holder.expect("enter")
    for m in ms.nodes[1:]:
        m.proc.kill()
    wait_for(lambda: lost_lines(holder.stderr()), timeout=10, what="the lost lease reported")
    holder.send()
    holder.expect("call rc=42")


# ---- 5. config ---------------------------------------------------------------------------


def test_fair_refused(masters, worker_progs, tmp_path):
    ms = masters(3)
    cfg = ms.config(tmp_path, BLOCK % (5000, 1000, 100, "fair = true;"))
    p = run([worker_progs["block"]], cfg)
    assert p.returncode == 78, p.stderr
    assert "fair" in p.stderr and "masters" in p.stderr, p.stderr


# ---- 6. lockshim check -------------------------------------------------------------------


def test_check_names_every_master(masters, tmp_path):
    ms = masters(3)
    cfg = ms.config(tmp_path, BLOCK % (5000, 1000, 100, ""))
    p = run([CLI, "check", "-c", cfg])
    assert p.returncode == 0, p.stdout + p.stderr
    # check's settings line names the masters too: look at the rest
    said = "\n".join(x for x in p.stdout.splitlines()
                     if not x.startswith("settings: "))
    for i in range(3):
        assert ms.addr(i) in said, p.stdout


def test_check_names_a_dead_master(masters, tmp_path):
    ms = masters(3)
    cfg = ms.config(tmp_path, BLOCK % (5000, 1000, 100, ""))
    ms.nodes[1].proc.kill()
    ms.nodes[1].proc.wait()
    p = run([CLI, "check", "-c", cfg])
    assert p.returncode == 69, p.stdout + p.stderr
    # check's settings line names the masters too: look at the rest
    said = "\n".join(x for x in p.stdout.splitlines()
                     if not x.startswith("settings: ")) + p.stderr
    assert ms.addr(1) in said
