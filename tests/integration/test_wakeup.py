# SPDX-License-Identifier: MIT
"""Waiting: wake on release, missed wake-ups, fair order (also for waiters
queued in the same millisecond), bounded starvation in default mode, dead
and impatient waiters leaving the queue."""
import signal
import time

import pytest

from support.util import MULT, run, wait_for, write_config

pytestmark = pytest.mark.timing  # time bounds and forced races: make test-repeat

KEY = "lockshim:f"


def cfg(tmp_path, redis, settings):
    return write_config(tmp_path, redis, """locks = (
  { symbol = "hold_call"; key = "f"; %s },
  { symbol = "log_call"; key = "f"; %s } );
""" % (settings, settings))


def test_waiter_is_woken_by_the_release_not_by_polling(progs, redis, tmp_path, procs):
    # Fallback re-check interval one minute: only the release can wake it in time.
    c = cfg(tmp_path, redis, "lease_ms = 30000; wait_ms = 60000; retry_max_ms = 60000;")
    holder = procs([progs["driver"], "call:700"], c)
    holder.expect("enter")
    waiter = procs([progs["driver"], "log:" + str(tmp_path / "order")], c)
    wait_for(lambda: redis.cmd("CLIENT", "LIST").count("cmd=blpop") == 1, what="waiter blocked")
    holder.expect("call")
    released = time.monotonic()
    assert waiter.expect("log") == "log rc=1 errno=0"
    assert time.monotonic() - released < 1.0 * MULT  # not the 30 s lease, not 60 s
    assert waiter.finish()[0] == 0 and holder.finish()[0] == 0


def test_missed_wakeup_costs_at_most_the_remaining_lease(progs, redis, tmp_path, procs):
    # A holder that vanished without releasing: no wake-up will ever come.
    redis.cmd("SET", KEY, "ghost", "PX", "800")
    c = cfg(tmp_path, redis, "wait_ms = 60000; retry_max_ms = 60000;")
    t0 = time.monotonic()
    r = run([progs["driver"], "call:0"], c)
    took = time.monotonic() - t0
    assert r.stdout.splitlines()[-1] == "call rc=42 errno=0"
    assert 0.6 <= took < 0.8 + 2.0 * MULT


def test_fair_mode_orders_waiters_by_arrival(progs, redis, tmp_path, procs):
    c = cfg(tmp_path, redis, "fair = true; wait_ms = 30000;")
    order = str(tmp_path / "order")
    holder = procs([progs["driver"], "call:1500"], c)
    holder.expect("enter")
    waiters = []
    for n in range(1, 4):
        waiters.append(procs([progs["driver"], "log:" + order], c))
        wait_for(lambda: redis.cmd("ZCARD", KEY + ":q") == n, what="waiter %d queued" % n)
    for w in waiters:
        assert w.expect("log") == "log rc=1 errno=0"
        assert w.finish()[0] == 0
    assert open(order).read().split() == [str(w.p.pid) for w in waiters]


def test_fair_mode_orders_waiters_that_join_within_one_millisecond(progs, redis, tmp_path,
                                                                 procs):
    """Arrival order, not token order, even when Redis queues every waiter in
    the same millisecond: their enqueue commands are held back with CLIENT
    PAUSE, one waiter at a time, and then run back to back."""
    c = cfg(tmp_path, redis, "fair = true; wait_ms = 30000;")
    order = str(tmp_path / "order")
    run([progs["driver"], "log:" + str(tmp_path / "warm-up")], c)  # scripts cached
    redis.cmd("CLIENT", "PAUSE", str(int(60000 * MULT)), "WRITE")
    try:
        waiters = []
        for n in range(1, 6):
            waiters.append(procs([progs["driver"], "log:" + order], c))
            wait_for(lambda: redis.cmd("CLIENT", "LIST").count("cmd=evalsha") == n,
                     what="waiter %d held back" % n)
    finally:
        redis.cmd("CLIENT", "UNPAUSE")
    for w in waiters:
        assert w.expect("log") == "log rc=1 errno=0"
        assert w.finish()[0] == 0
    assert open(order).read().split() == [str(w.p.pid) for w in waiters]


def test_default_mode_bounds_starvation_by_a_barging_holder(progs, redis, tmp_path, procs):
    """A holder that calls again the moment it releases would win every race;
    after handoff_ms the release hands the lock to the queued waiter instead."""
    c = write_config(tmp_path, redis, """locks = (
  { symbol = "ledger_update"; key = "shared"; wait_ms = 30000; },
  { symbol = "log_call"; key = "shared"; wait_ms = 30000; } );
""")
    counter = str(tmp_path / "counter")
    with open(counter, "w") as f:
        f.write("0\n")
    holder = procs([progs["ledger"], "direct", counter, "4000"], c)
    wait_for(lambda: redis.cmd("EXISTS", "lockshim:shared") == 1, what="holder running")
    t0 = time.monotonic()
    r = run([progs["driver"], "log:" + str(tmp_path / "o")], c)
    assert r.stdout.strip() == "log rc=1 errno=0", r.stderr
    assert time.monotonic() - t0 < 1.0 * MULT
    assert holder.p.poll() is None  # the holder was still calling all along
    holder.finish()


def test_fair_waiter_killed_while_queued_does_not_block_the_next(progs, redis, tmp_path, procs):
    c = cfg(tmp_path, redis, "fair = true; wait_ms = 30000;")
    holder = procs([progs["driver"], "call:1000"], c)
    holder.expect("enter")
    doomed = procs([progs["driver"], "log:" + str(tmp_path / "o")], c)
    wait_for(lambda: redis.cmd("ZCARD", KEY + ":q") == 1, what="first waiter queued")
    nxt = procs([progs["driver"], "log:" + str(tmp_path / "o")], c)
    wait_for(lambda: redis.cmd("ZCARD", KEY + ":q") == 2, what="second waiter queued")
    doomed.signal(signal.SIGKILL)
    doomed.finish()
    holder.expect("call")
    released = time.monotonic()
    assert nxt.expect("log") == "log rc=1 errno=0"
    # The dead head leaves the queue after the waiter TTL (2 x retry_max_ms +
    # command timeout = 0.7 s here), not after the 30 s wait.
    assert time.monotonic() - released < 0.7 + 2.0 * MULT
    assert nxt.finish()[0] == 0


def test_fair_waiter_that_gives_up_leaves_the_queue(progs, redis, tmp_path, procs):
    c = cfg(tmp_path, redis, "fair = true; wait_ms = 300;")
    holder = procs([progs["driver"], "call:1500"], c)
    holder.expect("enter")
    r = run([progs["driver"], "call:0"], c)
    assert r.stdout.strip() == "call rc=-1 errno=16"
    assert redis.cmd("ZCARD", KEY + ":q") == 0
    assert holder.finish()[0] == 0
