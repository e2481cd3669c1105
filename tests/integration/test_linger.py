# SPDX-License-Identifier: MIT
"""Locks kept between calls (linger_ms): a burst of calls costs one acquire,
a kept lock not called again is released by the renewal thread and handed to
a waiter, kept locks are released before exec, and a thread gives its kept
locks up before it waits for another key (two processes taking keys in
opposite orders do not wait for each other)."""

import pytest

from support.scenarios import opposite_orders_finish
from support.server import lock_keys
from support.util import run, wait_for, write_config

pytestmark = pytest.mark.timing  # time bounds and forced races: make test-repeat

KEY = "lockshim:f"


def cfg(tmp_path, redis, settings):
    return write_config(tmp_path, redis, 'locks = ( { symbol = "hold_call"; key = "f"; %s } );\n'
                        % settings)


def sets_sent(redis):
    stats = redis.cmd("INFO", "commandstats")
    for line in stats.splitlines():
        if line.startswith("cmdstat_set:"):
            return int(line.split("calls=")[1].split(",")[0])
    return 0


def test_a_burst_of_calls_takes_the_lock_once(progs, redis, tmp_path):
    # Wide windows: the three calls always fall inside them.
    c = cfg(tmp_path, redis, "handoff_ms = 30000; linger_ms = 30000;")
    redis.cmd("CONFIG", "RESETSTAT")
    r = run([progs["driver"], "call:0", "call:0", "call:0"], c)
    assert r.stdout.split().count("rc=42") == 3, r.stderr
    assert sets_sent(redis) == 1
    assert lock_keys(redis) == []  # released at exit
    # Control: linger_ms = 0 asks Redis on every call.
    c0 = cfg(tmp_path, redis, "handoff_ms = 30000; linger_ms = 0;")
    redis.cmd("CONFIG", "RESETSTAT")
    run([progs["driver"], "call:0", "call:0", "call:0"], c0)
    assert sets_sent(redis) == 3


def test_a_kept_lock_not_called_again_is_released_in_the_background(progs, redis, tmp_path,
                                                                      procs):
    c = cfg(tmp_path, redis, "lease_ms = 60000; handoff_ms = 30000; linger_ms = 50;")
    p = procs([progs["driver"], "call:0", "stdin"], c)
    assert p.expect("call") == "call rc=42 errno=0"
    # The program now blocks reading stdin; only the renewal thread can act.
    wait_for(lambda: redis.cmd("EXISTS", KEY) == 0, what="the kept lock's release")
    assert p.p.poll() is None
    p.send()
    assert p.finish()[0] == 0


def test_a_kept_lock_goes_to_a_waiter_while_its_holder_idles(progs, redis, tmp_path, procs):
    c = cfg(tmp_path, redis, "lease_ms = 60000; wait_ms = 60000; handoff_ms = 30000; "
                             "linger_ms = 200;")
    holder = procs([progs["driver"], "call:0", "stdin"], c)
    assert holder.expect("call") == "call rc=42 errno=0"
    # The waiter enters while the holder still runs (blocked on stdin):
    # the idle holder's lock was released and handed over, not freed at exit.
    r = run([progs["driver"], "call:0"], c)
    assert "call rc=42 errno=0" in r.stdout, r.stderr
    assert holder.p.poll() is None
    holder.send()
    assert holder.finish()[0] == 0
    assert lock_keys(redis) == []


def test_kept_locks_are_released_before_exec(progs, redis, tmp_path, procs):
    c = cfg(tmp_path, redis, "lease_ms = 60000; handoff_ms = 30000; linger_ms = 30000;")
    # exec replaces the image with a program that waits on stdin: the kept
    # lock must be gone although nobody exits and linger_ms is long.
    p = procs([progs["driver"], "call:0", "exec:stdin"], c)
    assert p.expect("call") == "call rc=42 errno=0"
    wait_for(lambda: open("/proc/%d/cmdline" % p.p.pid).read().split("\0")[1:2] == ["stdin"],
             what="exec")
    assert redis.cmd("EXISTS", KEY) == 0
    p.send()
    assert p.finish()[0] == 0


def test_opposite_orders_do_not_wait_for_each_other(progs, redis, tmp_path, procs):
    # A calls f then g, B g then f, each keeping its first key (linger_ms
    # and handoff_ms 30 s) when it asks for its second. A thread gives its
    # kept locks up before it waits (lock.c, give_up_kept), so both finish
    # at once. Control (the build before it, checked): both waited until
    # the renewal threads released the kept keys at linger_ms's end, 30 s.
    settings = "lease_ms = 60000; handoff_ms = 30000; linger_ms = 30000; wait_ms = 60000;"
    c = write_config(tmp_path, redis, 'locks = ( { symbol = "hold_call"; key = "f"; %s },\n'
                     '  { symbol = "other_call"; key = "g"; %s } );\n' % (settings, settings))
    opposite_orders_finish(progs, procs, c,
                           lambda: redis.cmd("EXISTS", KEY, "lockshim:g") == 2)  # both kept
    assert redis.cmd("EXISTS", KEY, "lockshim:g") == 0
