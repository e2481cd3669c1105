# SPDX-License-Identifier: MIT
"""The shim's life cycle in a process: nothing is started (no renewal
thread, no Redis connection) until the first guarded call, and an exec'd
image loads and initialises the shim afresh."""
import os

import pytest

from support.util import run, write_config

LOCK = 'log_level = "debug";\nlocks = ( { symbol = "hold_call"; lease_ms = 60000; } );\n'


@pytest.mark.parametrize("step", ["exec", "execle"])
def test_exec_initialises_the_shim_afresh(progs, redis, tmp_path, step):
    cfg = write_config(tmp_path, redis, LOCK)
    r = run([progs["driver"], "call:0", step + ":call:0"], cfg)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("call rc=42 errno=0") == 2
    assert r.stderr.count("acquired lockshim:hold_call") == 2
    assert r.stderr.count("relocations: ") == 2  # two images, two scans


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
