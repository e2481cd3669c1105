# SPDX-License-Identifier: MIT
"""Leases: renewal (of one key and of many nested ones), holder death, frozen
holders, lost leases, max hold time."""
import signal
import time

import pytest

from support.server import lock_keys
from support.util import MULT, run, wait_for, write_config

pytestmark = pytest.mark.timing  # time bounds and forced races: make test-repeat

KEY = "lockshim:hold_call"


def cfg_for(tmp_path, redis, settings):
    return write_config(tmp_path, redis,
                        'locks = ( { symbol = "hold_call"; %s } );\n' % settings)


def key_present_throughout(redis, seconds):
    """Samples the key for `seconds`; returns the fraction of samples it existed."""
    seen = total = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        total += 1
        seen += redis.cmd("EXISTS", KEY)
        time.sleep(0.05)
    return seen / total


def test_renewal_keeps_short_lease_alive(progs, redis, tmp_path, procs):
    cfg = cfg_for(tmp_path, redis, "lease_ms = 300;")
    p = procs([progs["driver"], "call:2000"], cfg)
    p.expect("enter")
    assert key_present_throughout(redis, 1.5) == 1.0
    assert p.expect("call") == "call rc=42 errno=0"
    rc, _, err = p.finish()
    assert rc == 0 and "lost" not in err, err
    assert redis.cmd("EXISTS", KEY) == 0


def test_renewal_keeps_many_keys_alive(progs, redis, tmp_path, procs):
    depth = 60
    c = write_config(tmp_path, redis,
                     'locks = ( { symbol = "nest"; key = "nest:{arg0}"; lease_ms = 300; } );\n')
    p = procs([progs["driver"], "nest:%d:1500" % depth], c)
    p.expect("bottom")
    end = time.monotonic() + 1.2
    while time.monotonic() < end:  # every level's lease is 300 ms: only renewal keeps them
        assert len(lock_keys(redis, "lockshim:nest:*")) == depth + 1
        time.sleep(0.05)
    assert p.expect("nest") == "nest rc=%d errno=0" % depth
    assert p.finish()[0] == 0
    assert lock_keys(redis, "lockshim:nest:*") == []


def test_control_without_renewal_the_lease_expires(progs, redis, tmp_path, procs):
    """Renewal stopped (max_hold_ms) under the same workload: the key goes."""
    cfg = cfg_for(tmp_path, redis, "lease_ms = 300; max_hold_ms = 50;")
    p = procs([progs["driver"], "call:2000"], cfg)
    p.expect("enter")
    wait_for(lambda: redis.cmd("EXISTS", KEY) == 0, timeout=1.8, what="key expiry")
    rc, _, err = p.finish()
    assert rc == 0
    assert "exceeded max_hold_ms" in err


def test_killed_holder_frees_the_lock_after_its_lease(progs, redis, tmp_path, procs):
    cfg = cfg_for(tmp_path, redis, "lease_ms = 1000; wait_ms = 20000;")
    holder = procs([progs["driver"], "call:60000"], cfg)
    holder.expect("enter")
    holder.signal(signal.SIGKILL)
    holder.finish()
    t0 = time.monotonic()
    waiter = run([progs["driver"], "call:0"], cfg)
    waited = time.monotonic() - t0
    assert waiter.stdout.strip().endswith("call rc=42 errno=0"), waiter.stderr
    assert waited < 5 * MULT  # the lease (1 s), not the 20 s wait


def test_frozen_holder_never_deletes_the_next_owners_key(progs, redis, tmp_path, procs):
    cfg = cfg_for(tmp_path, redis, "lease_ms = 300; wait_ms = 10000;")
    a = procs([progs["driver"], "call:1500"], cfg)
    a.expect("enter")
    a.signal(signal.SIGSTOP)
    wait_for(lambda: redis.cmd("EXISTS", KEY) == 0, what="A's lease to expire")
    b = procs([progs["driver"], "call:4000"], cfg)
    b.expect("enter")
    b_value = redis.cmd("GET", KEY)
    assert ":%d:" % b.p.pid in b_value
    a.signal(signal.SIGCONT)
    rc, out, err = a.finish()
    assert rc == 0 and "call rc=42" in out
    assert "was lost" in err  # A learned it lost the lock
    assert redis.cmd("GET", KEY) == b_value  # and did not delete B's key
    assert b.expect("call") == "call rc=42 errno=0"
    assert b.finish()[0] == 0
    assert redis.cmd("EXISTS", KEY) == 0


def steal(redis):
    redis.cmd("SET", KEY, "thief", "PX", "60000")


def test_on_lost_log(progs, redis, tmp_path, procs):
    cfg = cfg_for(tmp_path, redis, 'lease_ms = 300; on_lost = "log";')
    p = procs([progs["driver"], "call:1000"], cfg)
    p.expect("enter")
    steal(redis)
    rc, out, err = p.finish()
    assert rc == 0 and "call rc=42" in out
    assert "lease on %s was lost" % KEY in err
    assert redis.cmd("GET", KEY) == "thief"


@pytest.mark.parametrize("policy,settings,steps,status", [
    ("kill", 'kill_signal = "SIGTERM";', [], -signal.SIGTERM),
    ("kill", 'kill_signal = "SIGUSR1";', [], -signal.SIGUSR1),
    ("kill", 'kill_grace_ms = 300;', ["ignore-term"], -signal.SIGKILL),
    ("abort", "", [], -signal.SIGABRT),
])
def test_on_lost_stops_the_process(progs, redis, tmp_path, procs, policy, settings, steps,
                                   status):
    cfg = cfg_for(tmp_path, redis, 'lease_ms = 300; on_lost = "%s"; %s' % (policy, settings))
    p = procs([progs["driver"]] + steps + ["call:20000"], cfg)
    p.expect("enter")
    steal(redis)
    rc, out, err = p.finish()
    assert rc == status, err
    assert "call rc=" not in out
    assert "was lost" in err


def test_on_overrun_kill(progs, redis, tmp_path, procs):
    cfg = cfg_for(tmp_path, redis, 'lease_ms = 5000; max_hold_ms = 200; on_overrun = "kill";')
    p = procs([progs["driver"], "call:20000"], cfg)
    p.expect("enter")
    rc, _, err = p.finish()
    assert rc == -signal.SIGTERM
    assert "exceeded max_hold_ms" in err


def test_redis_unreachable_past_the_lease_is_a_loss(progs, redis, tmp_path, procs):
    cfg = cfg_for(tmp_path, redis, 'lease_ms = 300; on_lost = "log";')
    p = procs([progs["driver"], "call:1500"], cfg)
    p.expect("enter")
    redis.stop()
    rc, out, err = p.finish()
    assert rc == 0 and "call rc=42" in out
    assert "expired while Redis was unreachable" in err
