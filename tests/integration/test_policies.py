# SPDX-License-Identifier: MIT
"""on_timeout and on_error policies, Redis down and Redis restarted."""
import errno
import os
import signal
import time

import pytest

from support.server import RedisServer
from support.util import MULT, run, write_config

pytestmark = pytest.mark.timing  # time bounds and forced races: make test-repeat

BUSY = "lockshim:hold_call"


def cfg_for(tmp_path, redis, settings):
    return write_config(tmp_path, redis,
                        'locks = ( { symbol = "hold_call"; %s } );\n' % settings)


@pytest.mark.parametrize("settings,out,status", [
    ('on_timeout = "skip";', "call rc=-1 errno=%d" % errno.EBUSY, 0),
    ('on_timeout = "skip"; return = 9; errno = "EAGAIN";', "call rc=9 errno=%d" % errno.EAGAIN, 0),
    ('on_timeout = "skip"; errno = 5;', "call rc=-1 errno=5", 0),
    ('on_timeout = "exit";', "", 75),
    ('on_timeout = "exit"; exit_code = 3;', "", 3),
    ('on_timeout = "abort";', "", -signal.SIGABRT),
    ('on_timeout = "proceed";', "call rc=42 errno=0", 0),
])
def test_on_timeout(progs, redis, tmp_path, settings, out, status):
    redis.cmd("SET", BUSY, "other-owner", "PX", "60000")
    cfg = cfg_for(tmp_path, redis, "wait_ms = 100; " + settings)
    r = run([progs["driver"], "call:0"], cfg)
    assert r.returncode == status, r.stderr
    assert r.stdout.strip() == ("enter 0\n" + out if "rc=42" in out else out)
    assert "still held by another owner after 100 ms" in r.stderr
    assert redis.cmd("GET", BUSY) == "other-owner"


def test_wait_gives_up_in_time(progs, redis, tmp_path):
    redis.cmd("SET", BUSY, "other-owner", "PX", "60000")
    cfg = cfg_for(tmp_path, redis, "wait_ms = 700;")
    t0 = time.monotonic()
    r = run([progs["driver"], "call:0"], cfg)
    took = time.monotonic() - t0
    assert "rc=-1" in r.stdout
    assert 0.7 <= took < 0.7 + 2 * MULT


def dead_port_cfg(tmp_path, settings):
    down = RedisServer()  # a free port with nothing listening
    return write_config(tmp_path, None,
                        'redis = { port = %d; };\nlocks = ( { symbol = "hold_call"; %s } );\n'
                        % (down.port, settings))


@pytest.mark.parametrize("settings,out,status", [
    ("", "call rc=-1 errno=%d" % errno.EBUSY, 0),                 # on_error follows on_timeout
    ('on_timeout = "exit"; on_error = "skip";', "call rc=-1 errno=%d" % errno.EBUSY, 0),
    ('on_error = "exit"; exit_code = 70;', "", 70),
    ('on_error = "abort";', "", -signal.SIGABRT),
    ('on_error = "proceed";', "enter 0\ncall rc=42 errno=0", 0),
])
def test_on_error_with_redis_down(progs, tmp_path, settings, out, status):
    cfg = dead_port_cfg(tmp_path, "wait_ms = 200; " + settings)
    r = run([progs["driver"], "call:0"], cfg)
    assert r.returncode == status, r.stderr
    assert r.stdout.strip() == out
    assert "Redis unavailable for 200 ms" in r.stderr
    assert "Connection refused" in r.stderr


def test_redis_restart_mid_run(progs, redis, tmp_path, procs):
    cfg = cfg_for(tmp_path, redis, "wait_ms = 300; lease_ms = 3000;")
    p = procs([progs["driver"], "call:0", "stdin", "call:0", "stdin", "call:0"], cfg)
    assert p.expect("call") == "call rc=42 errno=0"
    redis.stop()
    p.send()
    assert p.expect("call") == "call rc=-1 errno=%d" % errno.EBUSY
    redis.start()
    p.send()
    assert p.expect("call") == "call rc=42 errno=0"
    rc, _, err = p.finish()
    assert rc == 0
    assert "Redis unavailable" in err


def test_hung_redis_bounds_the_wait(progs, redis, tmp_path):
    """A stopped (not dead) server: the call returns after wait_ms plus at
    most about one command timeout, and the policy applies."""
    cfg = write_config(tmp_path, redis, 'locks = ( { symbol = "hold_call"; wait_ms = 300; } );\n',
                       redis_extra="command_timeout_ms = 200; connect_timeout_ms = 200;")
    os.kill(redis.proc.pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        r = run([progs["driver"], "call:0"], cfg)
        took = time.monotonic() - t0
    finally:
        os.kill(redis.proc.pid, signal.SIGCONT)
    assert r.stdout.strip() == "call rc=-1 errno=%d" % errno.EBUSY, r.stderr
    assert "timed out" in r.stderr or "Resource temporarily unavailable" in r.stderr
    assert took < 0.3 + 0.2 + 1.0 * MULT


def test_exit_inside_a_guarded_call_releases_the_lock(progs, redis, tmp_path):
    cfg = write_config(tmp_path, redis, 'locks = ( { symbol = "exit_call"; lease_ms = 60000; } );\n')
    r = run([progs["driver"], "exit:9"], cfg)
    assert r.returncode == 9, r.stderr
    assert redis.cmd("EXISTS", "lockshim:exit_call") == 0


def test_wait_forever_rides_out_an_outage(progs, tmp_path, procs):
    """wait_ms = -1: the call waits through a Redis outage, enters once Redis
    is back, and the retries are reported once, not on every attempt."""
    server = RedisServer()
    try:
        cfg = write_config(tmp_path, server,
                           'locks = ( { symbol = "hold_call"; wait_ms = -1; } );\n')
        p = procs([progs["driver"], "call:0"], cfg)
        time.sleep(1.5)  # the outage the test is about, not synchronisation
        assert p.p.poll() is None  # still waiting
        server.start()
        assert p.expect("call") == "call rc=42 errno=0"
        rc, _, err = p.finish()
        assert rc == 0
        assert err.count("Redis error, retrying") == 1, err
    finally:
        server.cleanup()


def test_exit_policy_keeps_atexit_handlers_guarded(progs, redis, tmp_path):
    redis.cmd("SET", BUSY, "other-owner", "PX", "60000")
    cfg = write_config(tmp_path, redis, """log_level = "debug";
locks = ( { symbol = "hold_call"; wait_ms = 0; on_timeout = "exit"; },
          { symbol = "other_call"; key = "atexit"; } );
""")
    r = run([progs["driver"], "atexit", "call:0"], cfg)
    assert r.returncode == 75
    assert r.stdout.strip() == "atexit other rc=6"
    assert "acquired lockshim:atexit for other_call" in r.stderr
