# SPDX-License-Identifier: MIT
"""Mutual exclusion across processes and threads, for every kind of call site.

Each workload is a read-modify-write of a counter file with a 1 ms window.
The control runs show that the workload loses updates without the shim, so
the exact counts under the shim mean something.
"""
import subprocess

import pytest

from support.server import lock_keys
from support.util import TIMEOUT, shim_env, write_config
from support.workers import RACE_ITER, RACE_LOCK, RACE_PROCS, counter, race

PROCS, ITER = RACE_PROCS, RACE_ITER  # race()'s defaults


@pytest.mark.timing
def test_control_processes_lose_updates(progs, tmp_path):
    assert race(progs["ledger"], "direct", str(tmp_path / "c"), None) < PROCS * ITER


@pytest.mark.timing
def test_control_threads_lose_updates(progs, tmp_path):
    assert race(progs["ledger"], "direct", str(tmp_path / "c"), None, procs=1,
                threads=4) < 4 * ITER


@pytest.mark.parametrize("prog,mode", [
    ("ledger", "direct"),        # PLT call (lazy binding)
    ("ledger_noplt", "direct"),  # -fno-plt: GOT call
    ("ledger_now", "direct"),    # full RELRO + BIND_NOW
    ("ledger", "fnptr"),         # function pointer stored in data
    ("ledger", "dlsym"),         # dlopen + dlsym at run time
    ("ledger", "plugin"),        # dlopen by bare name through the caller's RUNPATH
])
def test_processes_exclude_each_other(progs, redis, tmp_path, prog, mode):
    cfg = write_config(tmp_path, redis, RACE_LOCK)
    assert race(progs[prog], mode, str(tmp_path / "c"), cfg) == PROCS * ITER


def test_threads_exclude_each_other(progs, redis, tmp_path):
    cfg = write_config(tmp_path, redis, RACE_LOCK)
    assert race(progs["ledger"], "direct", str(tmp_path / "c"), cfg, procs=1,
                threads=4) == 4 * ITER


def test_processes_and_threads_together(progs, redis, tmp_path):
    cfg = write_config(tmp_path, redis, RACE_LOCK)
    assert race(progs["ledger"], "direct", str(tmp_path / "c"), cfg, procs=3,
                iters=10, threads=3) == 90


def test_distinct_keys_do_not_exclude(progs, redis, tmp_path):
    """Two counters guarded by per-argument keys: both exact, and both keys were used."""
    cfg = write_config(tmp_path, redis, RACE_LOCK)
    env = shim_env(cfg, LOCKSHIM_LOG_LEVEL="debug")
    paths = [str(tmp_path / "a"), str(tmp_path / "b")]
    for p in paths:
        with open(p, "w") as f:
            f.write("0\n")
    ps = [subprocess.Popen([progs["ledger"], "direct", paths[i % 2], "10"], env=env,
                           stderr=subprocess.PIPE, text=True) for i in range(4)]
    errs = [p.communicate(timeout=TIMEOUT)[1] for p in ps]
    assert [counter(p) for p in paths] == [20, 20]
    joined = "".join(errs)
    for p in paths:
        assert "acquired lockshim:ledger:%s " % p in joined
    assert lock_keys(redis, "lockshim:*") == []
