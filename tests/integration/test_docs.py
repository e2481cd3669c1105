# SPDX-License-Identifier: MIT
"""Documentation matches behaviour: settings (as `lockshim settings` prints
them), the CLI's commands, shipped configs, install layout."""
import glob
import os
import re
import subprocess

import pytest

from conftest import ASAN, BUILD, CLI, ROOT, TIMEOUT, run, write_config


README = os.path.join(ROOT, "README.md")

# The README's configuration reference: heading of each table -> the group
# `lockshim settings` prints.
REFERENCE_GROUPS = {"Top level": "top", "`redis`": "redis", "`redis.tls`": "tls",
                    "`redis.masters` entries": "master",
                    "Per lock (in `locks` entries and in `defaults`)": "lock"}


def settings():
    """`lockshim settings`: {(group, name): (type, default)}, from the tables
    the parser reads the file with."""
    r = subprocess.run([CLI, "settings"], capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    known = {}
    for line in r.stdout.splitlines():
        group, name, type_, default = line.split(" ")
        assert (group, name) not in known, line
        known[(group, name)] = (type_, default)
    assert len(known) >= 30
    return known


def section(text, heading):
    """The text under a markdown heading, up to the next heading of the same
    or a higher level."""
    level = heading.split(" ")[0]
    start = text.index("\n" + heading + "\n") + len(heading) + 2
    ends = [m.start() for m in re.finditer(r"\n#{1,%d} " % len(level), text[start:])]
    return text[start:start + ends[0]] if ends else text[start:]


def table_rows(text):
    """The cells of each row of the first markdown table in text, header and
    separator excluded."""
    rows = [l for l in text.splitlines() if l.startswith("|")]
    return [[c.strip() for c in re.split(r"(?<!\\)\|", l)[1:-1]] for l in rows[2:]]


def documented():
    """The README's configuration reference: {(group, name): default cell}."""
    ref = section(open(README).read(), "## Configuration reference")
    docs = {}
    for heading, group in REFERENCE_GROUPS.items():
        for cells in table_rows(section(ref, "### " + heading)):
            m = re.fullmatch(r"`(\w+)`", cells[0])
            assert m, (heading, cells)
            assert (group, m.group(1)) not in docs, cells
            docs[(group, m.group(1))] = cells[1]
    return docs


def test_readme_reference_matches_the_settings_the_code_knows():
    known, docs = settings(), documented()
    assert sorted(set(known) - set(docs)) == [], "known to the code, not in the README"
    assert sorted(set(docs) - set(known)) == [], "in the README, unknown to the code"
    for key, (type_, default) in known.items():
        cell = docs[key]
        literal = re.match(r"`([^`]+)`", cell)
        if default == "required":
            assert cell == "required", (key, cell)
        elif default.startswith("="):  # follows another setting
            assert "`%s`" % default.split(".")[-1] in cell, (key, default, cell)
        elif default == "none":
            assert "`" not in cell, (key, cell)
        elif type_ in ("group", "list") and not literal:
            pass  # "see below", "none": prose for an empty group
        else:
            assert literal and literal.group(1) == default, (key, default, cell)


def test_every_setting_is_in_the_reference_config():
    ref = open(os.path.join(ROOT, "config", "lockshim.cfg")).read()
    for group, name in settings():
        assert re.search(r"\b%s\s*=" % name, ref), name


def test_readme_settings_example_is_real_output():
    """The sample output under "The CLI" is lines `lockshim settings` prints."""
    cli = section(open(README).read(), "## The CLI")
    sample = cli[cli.index("$ lockshim settings\n"):]
    sample = sample[:sample.index("```")].splitlines()[1:]
    known = settings()
    lines = [l for l in sample if l != "..."]
    assert len(lines) >= 5
    for line in lines:
        group, name, type_, default = line.split(" ")
        assert known.get((group, name)) == (type_, default), line


def test_readme_cli_table_is_the_command_table():
    """Each row of the README's CLI table is a usage line of `lockshim help`
    (which prints cli.c's command table), and each usage line has a row."""
    r = subprocess.run([CLI, "help"], capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 0
    usage = []
    for line in r.stdout.splitlines():
        m = re.fullmatch(r"(?:usage:| {6}) (lockshim .*)", line)
        if m:
            usage.append(m.group(1))
    assert len(usage) >= 5 and usage[0].startswith("lockshim run ")
    rows = table_rows(section(open(README).read(), "## The CLI"))
    documented_usage = []
    for cells in rows:
        m = re.fullmatch(r"`(lockshim [^`]+)`", cells[0])
        assert m, cells
        documented_usage.append(m.group(1))
    assert documented_usage == usage


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
