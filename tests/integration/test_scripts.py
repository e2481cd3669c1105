# SPDX-License-Identifier: MIT
"""Lua scripts: the shim names them by their SHA-1 itself (EVALSHA without
SCRIPT LOAD) and falls back to EVAL when Redis lost them (SCRIPT FLUSH)."""
from support.util import run, write_config

LOCK = 'log_level = "debug";\nlocks = ( { symbol = "hold_call"; lease_ms = 60000; } );\n'


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
