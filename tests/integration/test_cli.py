# SPDX-License-Identifier: MIT
"""The lockshim command: run, check, settings, help, exit statuses, LD_PRELOAD
handling."""
import os
import subprocess

from support.server import RedisServer
from support.util import CLI, SHIM, TIMEOUT, shim_env, write_config

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


def settings():
    r = cli("settings")
    assert r.returncode == 0 and r.stderr == ""
    return [line.split(" ") for line in r.stdout.splitlines()]


def test_settings_format():
    rows = settings()
    assert all(len(row) == 4 for row in rows)
    groups = [g for g, _, _, _ in rows]
    assert set(groups) == {"top", "redis", "tls", "master", "local", "postgres", "zookeeper",
                           "etcd", "lock"}
    assert groups == sorted(groups, key=["top", "redis", "tls", "master", "local",
                                         "postgres", "zookeeper", "etcd", "lock"].index)
    assert ["lock", "lease_ms", "integer:30..2147483647", "30000"] in rows
    assert ["redis", "port", "integer:1..65535", "6379"] in rows
    assert ["lock", "symbol", "string", "required"] in rows
    assert ["lock", "strict", "boolean", "=top.strict"] in rows


def test_settings_defaults_are_what_a_missing_setting_gets(redis, tmp_path):
    """Every default `settings` prints as a value, written into a config,
    gives the same lock as leaving it out (redis's host and port aside:
    they point at the test's server; the tls group's defaults apply only
    when the group is there, which turns TLS on; the local group is refused
    with the redis backend: test_local.py covers it, and so are the
    postgres, zookeeper and etcd groups: test_postgres.py, test_zookeeper.py,
    test_etcd.py)."""
    given = {"top": [], "redis": [], "lock": []}
    for group, name, type_, default in settings():
        if group in ("tls", "master", "local", "postgres", "zookeeper", "etcd") or \
                default in ("none", "required") or default.startswith("=") or \
                type_ in ("group", "list") or (group, name) in (("redis", "host"),
                                                                ("redis", "port")):
            continue
        given[group].append("%s = %s;" % (name, default))
    assert len(given["lock"]) >= 18 and len(given["redis"]) >= 3 and len(given["top"]) >= 3
    lock = 'locks = ( { symbol = "transfer"; %s } );\n'
    full = write_config(tmp_path, redis, "\n".join(given["top"]) + "\n" +
                        lock % " ".join(given["lock"]), redis_extra=" ".join(given["redis"]))
    a = cli("check", "-c", full)
    (tmp_path / "bare").mkdir()
    bare = write_config(tmp_path / "bare", redis, lock % "")
    b = cli("check", "-c", bare)
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr
    # check prints what differs from the defaults: the test server's port,
    # then nothing after the lock's key
    assert a.stdout.splitlines()[1:3] == b.stdout.splitlines()[1:3]
    assert a.stdout.splitlines()[1:3] == ["settings: redis.port %d" % redis.port,
                                          "  transfer: key lockshim:{symbol}"], a.stdout


def test_check_prints_the_settings_that_differ_from_their_defaults(redis, tmp_path):
    """check's summary: after the first line, the top-level and redis
    settings that differ from their defaults on a line of their own, then
    one line per lock, its key then its settings that differ from the
    built-in defaults (`defaults` included), in `settings`' syntax. What
    is left at (or set to) its default is not there; a default that is
    another setting's value (on_error, strict) is that value."""
    cfg = write_config(tmp_path, redis,
                       'namespace = "app";\nstrict = true;\nlog_level = "warn";\n'
                       'defaults = { lease_ms = 5000; };\n'
                       'locks = ( { symbol = "transfer"; key = "account:{arg0}"; '
                       'on_timeout = "exit"; wait_ms = 10000; handoff_ms = 2; strict = true; },\n'
                       '  { symbol = "audit"; lease_ms = 30000; return = 1.5; '
                       'errno = "EAGAIN"; on_error = "skip"; strict = false; } );\n',
                       redis_extra="command_timeout_ms = 500; connect_timeout_ms = 700;")
    r = cli("check", "-c", cfg)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "%s: ok, 2 lock(s)" % cfg
    assert lines[1] == ('settings: redis.port %d, redis.connect_timeout_ms 700, '
                        'namespace "app", strict true' % redis.port)
    assert lines[2] == '  transfer: key app:account:{arg0}, lease_ms 5000, on_timeout "exit", ' \
                       'handoff_ms 2'
    assert lines[3] == '  audit: key app:{symbol}, return 1.5, errno "EAGAIN", strict false'
    assert lines[4].startswith("redis: ok (") and len(lines) == 5, r.stdout


def test_settings_takes_no_operand():
    for args in (["settings", "x"], ["settings", "-c", "f.cfg"]):
        r = cli(*args)
        assert r.returncode == 64 and r.stdout == ""
        assert r.stderr.startswith("lockshim: ") and "usage: lockshim run" in r.stderr


def test_help_version_and_usage_errors():
    for spelling in ("help", "--help", "-h"):
        r = cli(spelling)
        assert r.returncode == 0 and r.stderr == ""
        for verb in ("run", "check", "settings", "version", "help"):
            assert "lockshim %s" % verb in r.stdout
    for spelling in ("version", "--version"):
        r = cli(spelling)
        assert r.returncode == 0 and r.stdout.startswith("lockshim ")
    r = cli()
    assert r.returncode == 64 and r.stdout == "" and r.stderr.startswith("usage: lockshim")
    r = cli("frobnicate")
    assert r.returncode == 64 and r.stderr.startswith('lockshim: unknown command "frobnicate"')
