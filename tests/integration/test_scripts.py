# SPDX-License-Identifier: MIT
"""Lua scripts: the shim names them by their SHA-1 itself (EVALSHA without
SCRIPT LOAD) and falls back to EVAL when Redis lost them (SCRIPT FLUSH).
An asynchronous release goes as EVALSHA once its connection has seen the
script cached (its first release there goes as EVAL), and one answered
NOSCRIPT is sent again as EVAL when its reply is read."""
import re

import pytest

from support.util import run, write_config

LOCK = 'log_level = "debug";\nlocks = ( { symbol = "hold_call"; lease_ms = 60000; } );\n'
KEY = "lockshim:hold_call"


def calls(redis):
    """Calls of each command since the last CONFIG RESETSTAT (INFO commandstats)."""
    return {name: int(n) for name, n in
            re.findall(r"^cmdstat_([^:]+):calls=(\d+),", redis.cmd("INFO", "commandstats"), re.M)}


def test_release_falls_back_to_eval_after_script_flush(progs, redis, tmp_path, procs):
    cfg = write_config(tmp_path, redis, LOCK.replace("60000;", "60000; linger_ms = 0;"))
    p = procs([progs["driver"], "call:0", "stdin", "call:0", "stdin"], cfg)
    assert p.expect("call") == "call rc=42 errno=0"
    redis.cmd("SCRIPT", "FLUSH")
    p.send()
    assert p.expect("call") == "call rc=42 errno=0"
    assert redis.cmd("EXISTS", "lockshim:hold_call") == 0  # released through EVAL
    p.send()
    rc, _, err = p.finish()
    assert rc == 0 and "release of" not in err, err


def test_scripts_are_named_without_script_load(progs, redis, tmp_path):
    """The shim names its scripts by their SHA-1 itself: no SCRIPT LOAD on
    connect, and once a script is cached, another process's EVALSHA finds it."""
    cfg = write_config(tmp_path, redis, 'locks = ( { symbol = "hold_call"; fair = true; } );\n')
    redis.cmd("CONFIG", "RESETSTAT")
    for _ in range(2):
        r = run([progs["driver"], "call:0"], cfg)
        assert "call rc=42 errno=0" in r.stdout, r.stderr
    stats = redis.cmd("INFO", "commandstats") + redis.cmd("INFO", "errorstats")
    assert "cmdstat_script:" not in stats
    assert "cmdstat_evalsha:calls=2," in stats  # the fair acquire, once per process
    # Only the first process met an empty script cache.
    assert "errorstat_NOSCRIPT:count=1\r" in stats


# A plain lock; a holder set (its own release script); two keys, whose
# releases go in one write and both meet NOSCRIPT.
FLUSHED = [("", [KEY]), ("limit = 3;", [KEY]),
           ('keys = ( "g:a", "g:b" );', ["lockshim:g:a", "lockshim:g:b"])]


def flushed_inside_a_call(p, redis):
    """The driver's first call (its release, as EVAL, caches the script),
    then its second (call:3000) with SCRIPT FLUSH while it is inside;
    returns once that call has returned: its release written as EVALSHA,
    the NOSCRIPT reply unread."""
    assert p.expect("call") == "call rc=42 errno=0"
    p.send()
    assert p.expect("enter") == "enter 3000"
    redis.cmd("CONFIG", "RESETSTAT")
    redis.cmd("SCRIPT", "FLUSH")
    assert p.expect("call") == "call rc=42 errno=0"


@pytest.mark.timing  # the SCRIPT FLUSH must come within the call's 3 s
@pytest.mark.parametrize("extra,keys", FLUSHED, ids=["plain", "limit3", "keys2"])
def test_release_meeting_noscript_is_sent_again_by_the_exit_flush(progs, redis, tmp_path, procs,
                                                                 extra, keys):
    """SCRIPT FLUSH while a call is inside: its release goes as EVALSHA (the
    connection's first release, as EVAL, cached the script) and meets
    NOSCRIPT, a reply read only at the thread's next command or at exit, so
    the key stays held until then (never shorter); the exit's flush sends it
    again as EVAL and the key is gone. Control (the resend disabled): the
    exit logs "release of ... failed: NOSCRIPT" and the key stays until its
    lease (60 s)."""
    cfg = write_config(tmp_path, redis, LOCK.replace("60000;", "60000; linger_ms = 0; " + extra))
    p = procs([progs["driver"], "call:0", "stdin", "call:3000", "stdin"], cfg)
    flushed_inside_a_call(p, redis)
    # the release is written (the call has returned); its NOSCRIPT unread
    assert redis.cmd("EXISTS", *keys) == len(keys)
    p.send()
    rc, _, err = p.finish()
    assert rc == 0, err
    assert redis.cmd("EXISTS", *keys) == 0, err  # sent again as EVAL, at exit
    stats = redis.cmd("INFO", "errorstats")
    # the EVALSHA path was taken, once per key
    assert "errorstat_NOSCRIPT:count=%d\r" % len(keys) in stats, stats
    assert calls(redis).get("eval") == len(keys), calls(redis)
    assert "NOSCRIPT (SCRIPT FLUSH); sent again as EVAL" in err and "failed" not in err, err


def test_releases_after_the_first_go_as_evalsha(progs, redis, tmp_path):
    """N calls of one thread (linger_ms = 0: an acquire and a release each):
    EVAL once per script (the first acquire after NOSCRIPT, the first
    release), then EVALSHA only, so Redis hashes no script text per call.
    Control (every release sent as EVAL): N + 1 EVALs and N EVALSHAs."""
    n = 40
    cfg = write_config(tmp_path, redis, 'locks = ( { symbol = "hold_call"; linger_ms = 0; } );\n')
    redis.cmd("CONFIG", "RESETSTAT")
    r = run([progs["driver"]] + ["call:0"] * n, cfg)
    assert r.stdout.count("call rc=42 errno=0") == n, r.stderr
    assert redis.cmd("EXISTS", KEY) == 0
    stats = calls(redis)
    assert stats.get("eval", 0) <= 3, stats
    assert stats.get("evalsha", 0) >= 2 * n - 1, stats


@pytest.mark.timing  # the SCRIPT FLUSH must come within the call's 3 s
def test_release_meeting_noscript_is_sent_again_behind_the_next_acquire(progs, redis, tmp_path,
                                                                       procs):
    """As above, but the thread calls again: its acquire is written first,
    the release's NOSCRIPT read in front of the acquire's reply, and the
    EVAL sent again behind the acquire (whose own EVALSHA meets NOSCRIPT
    too, and whose EVAL comes after the resent release): the call gets the
    key, and its own release (EVALSHA again: the resend cached the script)
    deletes it. Control (the resend disabled): the third call is refused
    its own stale key: EBUSY after wait_ms (10 s)."""
    cfg = write_config(tmp_path, redis, LOCK.replace("60000;", "60000; linger_ms = 0; "
                                                     "wait_ms = 10000;"))
    p = procs([progs["driver"], "call:0", "stdin", "call:3000", "stdin", "call:0", "stdin"], cfg)
    flushed_inside_a_call(p, redis)
    assert redis.cmd("EXISTS", KEY) == 1  # the release's NOSCRIPT unread
    p.send()
    assert p.expect("call") == "call rc=42 errno=0"
    assert redis.cmd("EXISTS", KEY) == 0
    stats = calls(redis)
    assert stats.get("eval") == 2, stats  # the release resent, the acquire
    assert "errorstat_NOSCRIPT:count=2\r" in redis.cmd("INFO", "errorstats")
    p.send()
    rc, _, err = p.finish()
    assert rc == 0 and "failed" not in err and "no longer ours" not in err, err
    assert calls(redis).get("eval") == 2
