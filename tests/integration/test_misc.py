# SPDX-License-Identifier: MIT
"""Coexistence and life-cycle details: another hiredis, exec, NOSCRIPT, reports."""
import os

import pytest

from conftest import run, write_config

LOCK = 'log_level = "debug";\nlocks = ( { symbol = "hold_call"; lease_ms = 60000; } );\n'


def test_program_with_its_own_hiredis(progs, redis, tmp_path):
    cfg = write_config(tmp_path, redis, LOCK)
    r = run([progs["own_hiredis"], str(redis.port)], cfg)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["enter 0", "call rc=42", "get works"]
    assert "acquired lockshim:hold_call" in r.stderr
    assert redis.cmd("GET", "own-hiredis") == "works"


@pytest.mark.parametrize("step", ["exec", "execle"])
def test_exec_initialises_the_shim_afresh(progs, redis, tmp_path, step):
    cfg = write_config(tmp_path, redis, LOCK)
    r = run([progs["driver"], "call:0", step + ":call:0"], cfg)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("call rc=42 errno=0") == 2
    assert r.stderr.count("acquired lockshim:hold_call") == 2
    assert r.stderr.count("relocations: ") == 2  # two images, two scans


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


def test_symbol_defined_in_the_executable_is_reported(progs, redis, tmp_path):
    cfg = write_config(tmp_path, redis, 'locks = ( { symbol = "local_step"; } );\n')
    r = run([progs["local"]], cfg)
    assert r.returncode == 0 and r.stdout == "local 42\n"
    assert "local_step is defined in the executable" in r.stderr
    assert "cannot be caught" in r.stderr


def test_no_guarded_call_means_no_thread_and_no_connection(progs, redis, tmp_path, procs):
    """Locks configured, none called: the shim starts nothing (issue 3)."""
    cfg = write_config(tmp_path, redis, LOCK)
    p = procs([progs["driver"], "other:1", "stdin", "call:0", "stdin"], cfg)
    assert p.expect("other") == "other rc=2 errno=0"
    assert os.listdir("/proc/%d/task" % p.p.pid) == [str(p.p.pid)]  # one thread
    assert redis.cmd("CLIENT", "LIST").count("\n") == 1  # only this test's client
    p.send()
    assert p.expect("call") == "call rc=42 errno=0"  # and it works once called
    assert len(os.listdir("/proc/%d/task" % p.p.pid)) == 2  # + the renewal thread
    p.send()
    assert p.finish()[0] == 0
