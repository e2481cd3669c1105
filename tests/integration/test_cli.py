# SPDX-License-Identifier: MIT
"""The lockshim command: run, check, exit statuses, LD_PRELOAD handling."""
import os
import subprocess

from conftest import CLI, SHIM, RedisServer, TIMEOUT, shim_env, write_config

LOCK = 'locks = ( { symbol = "hold_call"; } );\n'


def cli(*args, **env):
    e = shim_env(None, preload=False, **env)
    return subprocess.run([CLI] + list(args), env=e, capture_output=True, text=True,
                          timeout=TIMEOUT, stdin=subprocess.DEVNULL)


def test_run_guards_the_program(progs, redis, tmp_path):
    cfg = write_config(tmp_path, redis, 'log_level = "debug";\n' + LOCK)
    r = cli("run", "-c", cfg, "--", progs["driver"], "call:0")
    assert r.returncode == 0, r.stderr
    assert "call rc=42" in r.stdout
    assert "acquired lockshim:hold_call" in r.stderr


def test_run_keeps_the_exit_status_and_existing_preload(progs, redis, tmp_path):
    cfg = write_config(tmp_path, redis, LOCK)
    r = cli("run", "-c", cfg, "sh", "-c", 'echo "$LD_PRELOAD|$LOCKSHIM_CONFIG"; exit 7',
            LD_PRELOAD="libfoo-does-not-exist.so")
    assert r.returncode == 7
    preload, config = r.stdout.strip().split("|")
    assert preload == os.path.realpath(SHIM) + ":libfoo-does-not-exist.so"
    assert config == os.path.realpath(cfg)


def test_run_rejects_a_bad_config(progs, tmp_path):
    cfg = write_config(tmp_path, None, 'locks = ( { symbol = "x"; wait_ms = "soon"; } );')
    r = cli("run", "-c", cfg, "--", progs["driver"], "call:0")
    assert r.returncode == 78 and r.stdout == ""
    assert "locks[0].wait_ms" in r.stderr


def test_run_missing_program_and_usage():
    assert cli("run").returncode == 64
    assert cli("frobnicate").returncode == 64
    assert cli("help").returncode == 0


def test_run_program_not_found(redis, tmp_path):
    cfg = write_config(tmp_path, redis, LOCK)
    assert cli("run", "-c", cfg, "--", "/nonexistent/prog").returncode == 127


def test_check(redis, tmp_path):
    cfg = write_config(tmp_path, redis, LOCK)
    r = cli("check", "-c", cfg)
    assert r.returncode == 0, r.stderr
    assert "1 lock(s)" in r.stdout and "redis: ok" in r.stdout


def test_check_redis_down(tmp_path):
    cfg = write_config(tmp_path, None, "redis = { port = %d; };\n" % RedisServer().port + LOCK)
    r = cli("check", "-c", cfg)
    assert r.returncode == 69 and "Connection refused" in r.stderr


def test_check_uses_lockshim_config(tmp_path):
    cfg = write_config(tmp_path, None, "oops = 1;")
    r = cli("check", LOCKSHIM_CONFIG=cfg)
    assert r.returncode == 78 and "oops" in r.stderr
