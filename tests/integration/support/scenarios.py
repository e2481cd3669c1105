# SPDX-License-Identifier: MIT
"""Test bodies and checks that several test files run, each against its
own server or build of a program.

- The hostile program (progs/hostile.c, its library progs/hostile_lib.c):
  build_hostile, and dropped_during_a_call, Redis closing the shim's
  connection while a guarded call holds the lock (test_hostile.py over a
  plain server, test_tls.py over TLS), with the checks it is made of.
- jumped_out_and_released: the jump program (progs/jump_main.c) left its
  guarded call by longjmp and its hold was released (test_abi.py for the
  PLT/GOT methods, test_entry.py for entry patching).
- refused_setting: a lock setting a backend cannot honour, in a lock or in
  defaults, is refused by `lockshim check` (78) naming the setting and the
  backend (test_postgres.py, test_zookeeper.py, test_etcd.py).
- limit_bounds_the_holders and limit_mismatch_refused: a semaphore of a
  backend other than Redis lets exactly its limit in, and a caller of
  another limit gets the mismatch error at once (test_local.py,
  test_postgres.py, test_etcd.py).
- scrape, parse and val read `lockshim metrics` (test_metrics.py);
  metrics_counts_and_gauges runs it over a backend that keeps the counts
  its own way (test_modules.py for each module, test_local.py).
- opposite_orders_finish: two processes keeping one key each (linger_ms)
  ask for the other's and both finish (test_linger.py, test_postgres.py).
- unlock_refuses_then_forces: `lockshim unlock` keeps a live holder of
  this host without --force and removes it with it (test_etcd.py,
  test_postgres.py).
"""
import json
import os
import signal
import subprocess
import time

from prometheus_client.parser import text_string_to_metric_families

from support.server import lock_keys
from support.sets import replay, run_all
from support.util import CLI, MULT, TIMEOUT, cc, run, wait_for


# ---- the hostile program -------------------------------------------------------

def build_hostile(d):
    """Builds d/hostile and its d/libhostile.so; returns the program's path."""
    cc(os.path.join(d, "libhostile.so"), ["hostile_lib.c"], "-O2", "-shared", "-fPIC")
    return cc(os.path.join(d, "hostile"), ["hostile.c"], "-O2", "-L" + d,
              "-Wl,-rpath," + d, "-lhostile")


def expect(p, prefix):
    """p.expect(prefix), naming the exit status when the program died first."""
    try:
        return p.expect(prefix)
    except AssertionError as e:
        raise AssertionError("%s\nexit status %s" % (e, p.p.wait(TIMEOUT))) from None


def acquisitions(stderr, key):
    """How many times the shim's debug log says it took key in Redis."""
    return stderr.count("acquired %s for " % key)


def shim_clients(redis):
    """Ids of the clients connected to redis, but for the one asking."""
    ids = set()
    for line in redis.cmd("CLIENT", "LIST").splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        if not fields.get("cmd", "").startswith("client"):
            ids.add(fields["id"])
    return ids


def assert_held_by(redis, key, proc):
    """The lock key exists in Redis and its value names proc's pid."""
    value = redis.cmd("GET", key)
    assert value is not None and ":%d:" % proc.p.pid in value, value


def drop_shim_connections(redis, how):
    """Makes Redis close every connection of the program, and waits until
    CLIENT LIST shows none of them."""
    ids = shim_clients(redis)
    assert ids, "the program holds a lock, so it is connected"
    if how == "client-kill":
        redis.cmd("CLIENT", "KILL", "TYPE", "normal")  # SKIPME yes: not this client
    else:
        redis.cmd("CONFIG", "SET", "timeout", "1")
    wait_for(lambda: not ids & shim_clients(redis), timeout=15,
             what="Redis to close the program's connections")
    redis.cmd("CONFIG", "SET", "timeout", "0")


# subprocess starts programs with SIGPIPE at SIG_DFL and an empty signal mask
SIGPIPE_AS_STARTED = "sigpipe handler=default blocked=no"
# the lock dropped_during_a_call's cfg must take on block_call
DROPPED_LOCK = ('{ symbol = "block_call"; key = "k"; linger_ms = 0; lease_ms = 60000; '
                'wait_ms = 60000; }')


def dropped_during_a_call(hostile, redis, cfg, procs, how):
    """Redis closes the shim's connection (how: "client-kill" or
    "idle-timeout") while a guarded call of the hostile program holds the
    lock: the program finishes both its calls, the second one guarded at
    once, with SIGPIPE still at SIG_DFL and unblocked. redis: a RedisServer
    or a TlsServer; cfg locks block_call as DROPPED_LOCK does."""
    key = "lockshim:k"
    p = procs([hostile, "sigpipe", "block", "block", "sigpipe"], cfg)
    assert expect(p, "sigpipe") == SIGPIPE_AS_STARTED
    expect(p, "inside")
    assert_held_by(redis, key, p)
    drop_shim_connections(redis, how)
    p.send()
    assert expect(p, "block") == "block rc=7"
    t0 = time.monotonic()
    expect(p, "inside")
    assert time.monotonic() - t0 < 5 * MULT  # well under the 60 s lease
    assert_held_by(redis, key, p)
    p.send()
    assert expect(p, "block") == "block rc=7"
    assert expect(p, "sigpipe") == SIGPIPE_AS_STARTED
    rc, _, err = p.finish()
    assert rc == 0, err
    assert acquisitions(err, key) == 2, err
    assert lock_keys(redis) == []


# ---- the jump program ------------------------------------------------------------

def jumped_out_and_released(p, redis):
    """Asserts that the jump program p (jump_main.c), whose lock on through
    is not reentrant and has wait_ms = 0, jumped out of the guarded call and
    called again: "again 1" proves the hold was released, and the key is
    gone while it still runs. Returns its stderr."""
    assert p.expect("jumped") == "jumped"
    assert p.expect("again") == "again 1"
    assert redis.cmd("EXISTS", "lockshim:through") == 0
    p.send()
    rc, _, err = p.finish()
    assert rc == 0, err
    return err


# ---- a backend's refusals --------------------------------------------------------

def refused_setting(write, setting, where, backend):
    """setting ("name = value") in lock 0 (where "lock") or in defaults
    (where "defaults") of a config that write(body) makes (its path) is
    refused by check: 78, one error naming the setting and the backend."""
    name = setting.split()[0]
    if where == "lock":
        body = 'locks = ( { symbol = "rename"; key = "k"; %s; } );\n' % setting
    else:
        body = 'defaults = { %s; };\nlocks = ( { symbol = "rename"; key = "k"; } );\n' % setting
    r = run([CLI, "check", "-c", write(body)])
    assert r.returncode == 78, (r.stdout, r.stderr)
    what = "locks[0].%s" % name if where == "lock" else "defaults.%s" % name
    assert what in r.stderr and "backend \"%s\"" % backend in r.stderr, r.stderr


# ---- a backend's semaphores ------------------------------------------------------

def limit_bounds_the_holders(sets_prog, cfg, log, most):
    """8 processes x 2 threads of sets_prog's 30 ms guarded reads under cfg
    (None: unguarded, the control, where more than 3 are inside at once):
    every call entered, never more than most inside and most reached, no
    error line."""
    total, err = run_all([(sets_prog, "r", cfg, log, 2, 4, 30)] * 8)
    assert total == 8 * 2 * 4
    if cfg is None:
        assert replay(log)[0] > 3
        return
    assert replay(log)[0] == most, err[-3000:]
    assert "error" not in err, err[-3000:]


def assert_mismatch(progs, cfg, here, theirs):
    """A caller of cfg (lock hold_call on key "k") gets one error line naming
    both limits and on_error at once (skip: rc -1, EBUSY), well before its
    wait_ms."""
    t0 = time.monotonic()
    r = run([progs["driver"], "call:0"], cfg)
    assert time.monotonic() - t0 < 5 * MULT
    assert r.stdout.strip().splitlines()[-1] == "call rc=-1 errno=16", r.stderr
    lines = [l for l in r.stderr.splitlines() if ": error: " in l]
    assert len(lines) == 1, r.stderr
    assert "limit %d here, %d for the key's holders" % (here, theirs) in lines[0], lines
    assert "lockshim:k" in lines[0], lines


def limit_mismatch_refused(progs, procs, config, check=lambda: None, hold_ms=60000):
    """A holder takes key "k" with limit = 3 for hold_ms (config(setting,
    name): the path of a config whose lock hold_call on "k" has setting,
    made in its own directory name); callers with limit 2, no limit (1) and
    shared (1) each get one error line naming both numbers and on_error
    (skip) at once, well before their wait_ms; check() runs after each
    (nothing left behind). Control: limit 3 enters beside the holder.
    Returns the holder (procs's)."""
    cfg3 = config("limit = 3;", "3")
    holder = procs([progs["driver"], "call:%d" % hold_ms], cfg3)
    holder.expect("enter")
    for i, (limit, setting) in enumerate([(2, "limit = 2;"), (1, ""),
                                          (1, 'mode = "shared";')]):
        assert_mismatch(progs, config(setting, "c%d" % i), limit, 3)
        check()
    r = run([progs["driver"], "call:0"], cfg3)
    assert r.stdout.strip().splitlines()[-1] == "call rc=42 errno=0", r.stderr
    return holder


# ---- `lockshim metrics` ---------------------------------------------------------

def scrape(config):
    """Runs `lockshim metrics`; returns {(name, labels as a sorted tuple): value}."""
    r = subprocess.run([CLI, "metrics", "-c", config], capture_output=True, text=True,
                       timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
    return parse(r.stdout)


def parse(text):
    samples = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def val(samples, name, lock, host=None, **labels):
    """The value of one sample (0 when absent)."""
    lab = dict(labels, lock=lock)
    if host is not None:
        lab["host"] = host
    return samples.get((name, tuple(sorted(lab.items()))), 0)


METRICS_LOCK = 'locks = ( { symbol = "hold_call"; key = "f"; wait_ms = 60000; } );\n'


def metrics_counts_and_gauges(progs, procs, config, waiters=True):
    """`lockshim metrics` of a backend other than Redis (config: the path of
    a config of it with METRICS_LOCK): the counts of exited processes, per
    host (LOCKSHIM_TEST_HOST), kept by the backend; lockshim_held and
    lockshim_waiting (waiters: whether the backend lists waiters) while a
    holder and a waiter exist; the waiter, let in by the holder's death,
    counted as waited; the gauges back at 0; a process still running
    ships its counts within about a second, and not twice at its exit."""
    def driver(host, *steps):
        r = run([progs["driver"]] + list(steps), config, LOCKSHIM_TEST_HOST=host)
        assert r.returncode == 0, r.stderr

    driver("h1", "call:0", "call:0")
    driver("h2", "call:0")
    m = scrape(config)
    assert val(m, "lockshim_calls_total", "hold_call", "h1") == 2
    assert val(m, "lockshim_acquired_total", "hold_call", "h1", how="fast") == 2
    assert val(m, "lockshim_hold_seconds_count", "hold_call", "h1") == 2
    assert val(m, "lockshim_wait_seconds_count", "hold_call", "h1") == 2
    assert val(m, "lockshim_calls_total", "hold_call", "h2") == 1
    assert val(m, "lockshim_timeouts_total", "hold_call", "h1") == 0
    assert val(m, "lockshim_held", "hold_call") == 0
    holder = procs([progs["driver"], "call:60000"], config, LOCKSHIM_TEST_HOST="holder")
    assert holder.expect("enter") == "enter 60000"
    waiter = procs([progs["driver"], "call:0"], config, LOCKSHIM_TEST_HOST="waiter")
    if waiters:
        wait_for(lambda: val(scrape(config), "lockshim_waiting", "hold_call") == 1,
                 what="the waiter counted")
    assert val(scrape(config), "lockshim_held", "hold_call") == 1
    holder.p.send_signal(signal.SIGKILL)
    holder.p.wait()
    assert waiter.finish()[0] == 0
    m = scrape(config)
    assert val(m, "lockshim_acquired_total", "hold_call", "waiter", how="waited") == 1
    wait_for(lambda: val(scrape(config), "lockshim_held", "hold_call") == 0,
             what="nothing held")  # a release may be asynchronous
    assert val(scrape(config), "lockshim_waiting", "hold_call") == 0
    # a process that goes on running ships within about a second, once
    live = procs([progs["driver"], "call:0", "call:1100", "stdin"], config,
                 LOCKSHIM_TEST_HOST="live")
    assert live.expect("call") == live.expect("call") == "call rc=42 errno=0"
    wait_for(lambda: val(scrape(config), "lockshim_calls_total", "hold_call", "live") == 2,
             what="a running process's counts")
    live.send()
    assert live.finish()[0] == 0
    assert val(scrape(config), "lockshim_calls_total", "hold_call", "live") == 2


# ---- kept locks, unlock --------------------------------------------------------

def opposite_orders_finish(progs, procs, cfg, kept):
    """Process A calls hold_call then other_call, B the reverse (the
    driver), each keeping its first key (cfg's linger_ms) when it asks for
    its second; kept() says both are kept, as the store shows them. Both
    must end within 10 s (far below their wait_ms), neither timed out.
    Returns their stderr texts."""
    a = procs([progs["driver"], "call:0", "stdin", "other:1"], cfg)
    assert a.expect("call") == "call rc=42 errno=0"
    b = procs([progs["driver"], "other:1", "stdin", "call:0"], cfg)
    assert b.expect("other") == "other rc=2 errno=0"
    assert kept()
    t0 = time.monotonic()
    a.send()
    b.send()
    assert a.expect("other") == "other rc=2 errno=0"
    assert b.expect("call") == "call rc=42 errno=0"
    took = time.monotonic() - t0
    assert took < 10, took
    errs = []
    for p in (a, b):
        rc, _, err = p.finish()
        assert rc == 0 and "still held" not in err, err
        errs.append(err)
    return errs


def unlock_refuses_then_forces(bg, worker_progs, cfg, key, queued, untouched):
    """A holder of key (worker_progs' block) and a waiter (queued() once it
    waits): `unlock` without --force keeps the holder alive on this host
    (exit 1, naming its pid; untouched() checks the store), with --force
    removes it (its JSON object: the holder's pid): the waiter enters, and
    the holder reports the loss at its next renewal. Control: a second
    unlock finds nothing held (1). Both calls then end."""
    h = bg([worker_progs["block"]], cfg)
    h.expect("enter")
    w = bg([worker_progs["block"]], cfg)
    wait_for(queued, what="the waiter queued")
    r = run([CLI, "unlock", "-c", cfg, key])
    assert r.returncode == 1 and "alive" in r.stderr and "pid %d" % h.p.pid in r.stderr, \
        r.stderr
    assert untouched()
    r = run([CLI, "unlock", "-c", cfg, "--force", "--json", key])
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["pid"] == h.p.pid
    t0 = time.monotonic()
    w.expect("enter")
    took = time.monotonic() - t0
    wait_for(lambda: "was lost" in h.stderr(), timeout=10 * MULT,
             what="the former holder's on_lost")
    r = run([CLI, "unlock", "-c", cfg, "--force", "nothing-here"])
    assert r.returncode == 1 and "is not held" in r.stderr, r.stderr
    for p in (h, w):
        p.send()
        p.expect("call rc=42")
    return took
