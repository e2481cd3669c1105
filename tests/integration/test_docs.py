# SPDX-License-Identifier: MIT
"""Documentation matches behaviour: settings, shipped configs, install layout."""
import glob
import os
import re
import subprocess

import pytest

from conftest import ASAN, BUILD, CLI, ROOT, TIMEOUT, run, write_config


def lock_settings():
    src = open(os.path.join(ROOT, "shim", "config.c")).read()
    table = src[src.index("lock_fields[] = {"):]
    table = table[:table.index("};")]
    names = re.findall(r'LOCK_FIELD\((\w+),', table) + re.findall(r'\{ "(\w+)",', table)
    assert len(names) >= 17
    return names


def test_every_setting_is_documented():
    readme = open(os.path.join(ROOT, "README.md")).read()
    ref = open(os.path.join(ROOT, "config", "lockshim.cfg")).read()
    for name in lock_settings() + ["host", "port", "socket", "password", "username", "db",
                                   "connect_timeout_ms", "command_timeout_ms",
                                   "namespace", "log_level", "log_file", "defaults", "strict"]:
        assert "| `%s` |" % name in readme, name
        assert re.search(r"\b%s\s*=" % name, ref), name


def test_shipped_configs_are_valid():
    paths = glob.glob(os.path.join(ROOT, "config", "**", "*.cfg"), recursive=True) + \
        glob.glob(os.path.join(ROOT, "examples", "*.cfg"))
    assert len(paths) >= 4
    for p in paths:
        r = subprocess.run([CLI, "check", "-c", p], capture_output=True, text=True,
                           timeout=TIMEOUT)
        assert r.returncode in (0, 69), (p, r.stderr)  # 69: its Redis is not here
        assert "ok, " in r.stdout


def test_reference_config_defaults_match_builtin_defaults(progs, redis, tmp_path):
    """The reference config's values are the defaults: a lock with no settings
    and the reference lock behave the same in `lockshim check`'s summary."""
    ref = open(os.path.join(ROOT, "config", "lockshim.cfg")).read()
    lock = ref[ref.index("locks = ("):]
    bare = write_config(tmp_path, None, 'locks = ( { symbol = "transfer"; key = "account:{arg0}"; } );')
    a = subprocess.run([CLI, "check", "-c", bare], capture_output=True, text=True)
    ref_only_lock = os.path.join(str(tmp_path), "ref.cfg")
    with open(ref_only_lock, "w") as f:
        f.write(lock)
    b = subprocess.run([CLI, "check", "-c", ref_only_lock], capture_output=True, text=True)
    assert a.stdout.splitlines()[1] == b.stdout.splitlines()[1]


@pytest.mark.skipif(ASAN, reason="installs the plain build")
def test_make_install_layout(progs, redis, tmp_path):
    dest = str(tmp_path / "root")
    subprocess.run(["make", "-s", "-C", ROOT, "install", "DESTDIR=" + dest, "PREFIX=/opt/ls",
                    "BUILD=" + os.path.relpath(BUILD, ROOT)], check=True, timeout=300,
                   capture_output=True)
    cli = os.path.join(dest, "opt/ls/bin/lockshim")
    assert os.path.exists(os.path.join(dest, "opt/ls/lib/liblockshim.so"))
    assert os.path.exists(os.path.join(dest, "opt/ls/share/doc/lockshim/lockshim.cfg"))
    cfg = write_config(tmp_path, redis, 'log_level = "debug";\nlocks = ( { symbol = "hold_call"; } );\n')
    r = run([cli, "run", "-c", cfg, "--", progs["driver"], "call:0"], None)
    assert r.returncode == 0 and "call rc=42" in r.stdout, r.stderr
    assert "acquired lockshim:hold_call" in r.stderr
