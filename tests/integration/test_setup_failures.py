# SPDX-License-Identifier: MIT
"""A call never runs on an unrenewed lease: when what keeps the lease cannot
be set up (the renewal thread, memory), the lock is released and on_error
applies. progs/failinj.c, preloaded ahead of the shim, makes pthread_create
or the allocator fail (from the start, or once a file exists)."""
import errno
import os
import signal
import time

import pytest

from support.util import MULT, PRELOAD, run, write_config

KEY = "lockshim:hold_call"
EAGAIN_TEXT = os.strerror(errno.EAGAIN)


def cfg_for(tmp_path, redis, settings):
    return write_config(tmp_path, redis,
                        'locks = ( { symbol = "hold_call"; %s } );\n' % settings)


def inject(progs, mode, arm=None):
    """The environment that preloads failinj ahead of the shim, failing mode."""
    env = {"LD_PRELOAD": progs["failinj"] + ":" + PRELOAD, "FAILINJ": mode}
    if arm:
        env["FAILINJ_ARM"] = arm
    return env


def test_injection_control(progs, tmp_path):
    """failinj fails the program's own pthread_create and malloc when asked,
    and only then (a file arms it)."""
    probe, arm = progs["failinj_probe"], str(tmp_path / "arm")
    assert run([probe]).stdout == "thread rc=0 alloc=ok errno=0\n"
    pre = {"LD_PRELOAD": progs["failinj"]}
    assert run([probe], preload=False, **pre).stdout == "thread rc=0 alloc=ok errno=0\n"
    r = run([probe], preload=False, FAILINJ="thread", **pre)
    assert r.stdout == "thread rc=%d alloc=ok errno=0\n" % errno.EAGAIN
    r = run([probe], preload=False, FAILINJ="alloc", **pre)
    # glibc's pthread_create allocates too: memory pressure fails it as well
    assert r.stdout == "thread rc=%d alloc=null errno=%d\n" % (errno.EAGAIN, errno.ENOMEM)
    r = run([probe], preload=False, FAILINJ="thread,alloc", FAILINJ_ARM=arm, **pre)
    assert r.stdout == "thread rc=0 alloc=ok errno=0\n"
    open(arm, "w").close()
    r = run([probe], preload=False, FAILINJ="thread,alloc", FAILINJ_ARM=arm, **pre)
    assert r.stdout == "thread rc=%d alloc=null errno=%d\n" % (errno.EAGAIN, errno.ENOMEM)


def overlap_run(progs, redis, tmp_path, procs, env):
    """A holds hold_call for a call of `long` s (lease_ms 200); once it is
    inside, B calls it without injection. Returns (A's first line, B's
    output, whether B's call ended while A was still inside, A's stderr).
    A's call sleeps at least `long` s after it printed "enter", so B ending
    sooner than that after the line was read is an overlap for certain."""
    long = 4 * MULT
    cfg = cfg_for(tmp_path, redis, "lease_ms = 200; wait_ms = %d;" % int(20000 * MULT))
    a = procs([progs["driver"], "call:%d" % int(long * 1000)], cfg, **env)
    first = a.expect("")
    t0 = time.monotonic()
    b = run([progs["driver"], "call:0"], cfg)
    overlap = first.startswith("enter") and time.monotonic() - t0 < long and \
        "call rc=42" in b.stdout
    _, _, a_err = a.finish()
    return first, b.stdout, overlap, a_err


def test_no_overlap_when_renewal_cannot_start(progs, redis, tmp_path, procs):
    """The bug: the renewal thread could not start, the call ran anyway, its
    lease expired and another process entered while it was still inside."""
    first, b_out, overlap, a_err = overlap_run(progs, redis, tmp_path, procs,
                                               inject(progs, "thread"))
    assert not overlap, "B entered while A ran on an unrenewed lease: %s" % a_err
    assert first == "call rc=-1 errno=%d" % errno.EBUSY, a_err
    assert b_out == "enter 0\ncall rc=42 errno=0\n"
    assert ("hold_call: lock %s released at once: its lease could not be kept (cannot "
            "start the renewal thread: %s)" % (KEY, EAGAIN_TEXT)) in a_err


def test_overlap_control_with_renewal(progs, redis, tmp_path, procs):
    """Control: the same two processes without injection never overlap (the
    lease is renewed while A runs), so the check above can tell."""
    first, b_out, overlap, a_err = overlap_run(progs, redis, tmp_path, procs, {})
    assert first.startswith("enter"), a_err
    assert not overlap
    assert b_out == "enter 0\ncall rc=42 errno=0\n"


@pytest.mark.parametrize("settings,out,status", [
    ('on_error = "skip"; return = 9; errno = "ENOLCK";', "call rc=9 errno=%d" % errno.ENOLCK, 0),
    ('on_error = "exit"; exit_code = 71;', "", 71),
    ('on_error = "abort";', "", -signal.SIGABRT),
    ('on_error = "proceed";', "enter 0\ncall rc=42 errno=0", 0),
])
def test_on_error_applies_and_key_released(progs, redis, tmp_path, settings, out, status):
    """on_error (not on_timeout) applies, and the key is deleted at once,
    not left for its 60 s lease."""
    cfg = cfg_for(tmp_path, redis, 'lease_ms = 60000; on_timeout = "exit"; '
                  + settings)
    r = run([progs["driver"], "call:0"], cfg, **inject(progs, "thread"))
    assert r.returncode == status, r.stderr
    assert r.stdout.strip() == out
    assert ("lock %s released at once: its lease could not be kept (cannot start the "
            "renewal thread: %s)" % (KEY, EAGAIN_TEXT)) in r.stderr
    assert redis.cmd("EXISTS", KEY) == 0


def test_waiter_gives_up_when_renewal_cannot_start(progs, redis, tmp_path):
    """A caller that finds the lock busy starts the renewal thread before it
    queues; when that fails it does not wait for a lock it could not keep."""
    redis.cmd("SET", KEY, "other-owner", "PX", "1500")
    cfg = cfg_for(tmp_path, redis, 'lease_ms = 60000; wait_ms = 10000; on_timeout = "exit"; '
                  'on_error = "skip"; errno = "ENOLCK";')
    r = run([progs["driver"], "call:0"], cfg, timeout=5 * MULT, **inject(progs, "thread"))
    assert r.stdout.strip() == "call rc=-1 errno=%d" % errno.ENOLCK, r.stderr
    assert ("hold_call: lock %s not taken: its lease could not be kept (cannot start the "
            "renewal thread: %s)" % (KEY, EAGAIN_TEXT)) in r.stderr
    assert redis.cmd("GET", KEY) == "other-owner"
    assert redis.cmd("EXISTS", KEY + ":q") == 0 or redis.cmd("LLEN", KEY + ":q") == 0


def test_allocation_failure_after_startup(progs, redis, tmp_path, procs):
    """Allocation fails once the program runs (the first guarded call's
    lock state cannot be made): on_error applies, nothing is taken."""
    arm = str(tmp_path / "arm")
    cfg = cfg_for(tmp_path, redis, 'lease_ms = 60000; on_error = "skip"; return = 7; '
                  'errno = "ENOMEM";')
    p = procs([progs["driver"], "other:1", "stdin", "call:0"], cfg,
              **inject(progs, "alloc", arm))
    assert p.expect("other") == "other rc=2 errno=0"
    open(arm, "w").close()
    p.send()
    assert p.expect("call") == "call rc=7 errno=%d" % errno.ENOMEM
    status, rest, err = p.finish()
    assert status == 0 and "enter" not in rest, err
    assert "hold_call: lock not taken: its lease could not be kept (out of memory" in err
    assert redis.cmd("EXISTS", KEY) == 0
