# SPDX-License-Identifier: MIT
"""Documentation matches behaviour: lockshim.cfg(5) against the settings
`lockshim settings` prints, lockshim(1) against `lockshim help` and the
environment the sources read, the man pages render cleanly, the README's
size and its two commands (the ones CI runs on a bare machine), the configs
shown and shipped parse, the install layout."""
import glob
import os
import re
import subprocess

import pytest

from support.util import ASAN, BUILD, CLI, ROOT, TIMEOUT, run, write_config


README = os.path.join(ROOT, "README.md")
MAN1 = os.path.join(ROOT, "doc", "lockshim.1.scd")
MAN5 = os.path.join(ROOT, "doc", "lockshim.cfg.5.scd")
README_MAX_BYTES = 15 * 1024

# lockshim.cfg(5): the section of each group `lockshim settings` prints.
MAN5_GROUPS = {"TOP LEVEL": "top", "REDIS": "redis", "TLS": "tls", "MASTERS": "master",
               "LOCAL": "local", "POSTGRES": "postgres", "ZOOKEEPER": "zookeeper",
               "ETCD": "etcd",
               "PER LOCK": "lock"}
# One setting in lockshim.cfg(5): "*name* (type, default X)" or "(type, required)".
SETTING_LINE = re.compile(r"\*(\w+)\* \((\S+), (.+)\)")


def read(path):
    with open(path) as f:
        return f.read()


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
    """The text under a markdown (or scdoc) heading, up to the next heading of
    the same or a higher level."""
    level = heading.split(" ")[0]
    start = text.index("\n" + heading + "\n") + len(heading) + 2
    ends = [m.start() for m in re.finditer(r"\n#{1,%d} " % len(level), text[start:])]
    return text[start:start + ends[0]] if ends else text[start:]


def code_blocks(text):
    """The contents of each ``` block of text."""
    return re.findall(r"(?ms)^```\n(.*?)^```$", text)


def table_rows(text):
    """The cells of each row of the first markdown table in text, header and
    separator excluded."""
    rows = [l for l in text.splitlines() if l.startswith("|")]
    return [[c.strip() for c in re.split(r"(?<!\\)\|", l)[1:-1]] for l in rows[2:]]


def plain(scd):
    """scdoc markup removed: *bold*, _underline_ and \\ escapes."""
    return re.sub(r"\\(.)", r"\1", re.sub(r"(?<![\w\\])[*_]|[*_](?!\w)", "", scd))


def usage_lines():
    """The usage lines `lockshim help` prints (from cli.c's command table),
    and the verbs it describes."""
    r = subprocess.run([CLI, "help"], capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 0 and r.stderr == ""
    usage, verbs = [], []
    for line in r.stdout.splitlines():
        m = re.fullmatch(r"(?:usage:| {6}) (lockshim .*)", line)
        if m:
            usage.append(m.group(1))
        m = re.fullmatch(r"  (\w+)  +\S.*", line)
        if m:
            verbs.append(m.group(1))
    assert len(usage) >= 5 and usage[0].startswith("lockshim run ")
    assert [u.split(" ")[1] for u in usage] == verbs
    return usage


def documented():
    """lockshim.cfg(5)'s settings: {(group, name): (type, default text)}."""
    text = read(MAN5)
    docs = {}
    for heading, group in MAN5_GROUPS.items():
        for line in section(text, "# " + heading).splitlines():
            m = SETTING_LINE.fullmatch(line)
            if m:
                assert (group, m.group(1)) not in docs, line
                docs[(group, m.group(1))] = (m.group(2), m.group(3))
            else:  # a setting's line that does not parse would go unchecked
                assert not re.match(r"\*\w+\* \(", line), line
    return docs


def test_man5_documents_exactly_the_settings_the_code_knows():
    """Both ways: every setting `lockshim settings` prints is in lockshim.cfg(5),
    in its group's section, with its type and default; nothing else is."""
    known, docs = settings(), documented()
    assert sorted(set(known) - set(docs)) == [], "known to the code, not in lockshim.cfg(5)"
    assert sorted(set(docs) - set(known)) == [], "in lockshim.cfg(5), unknown to the code"
    for key, (type_, default) in known.items():
        doc_type, text = docs[key]
        assert doc_type == type_, (key, type_, doc_type)
        if default == "required":
            assert text == "required", (key, text)
        elif default.startswith("="):  # follows another setting
            group, name = default[1:].split(".")
            assert re.fullmatch(r"default the value of (top-level )?\*(%s\.)?%s\*"
                                % (group, name), text), (key, default, text)
        elif default == "none":
            assert text == "default none", (key, text)
        else:
            assert text == "default " + default, (key, default, text)


def test_every_setting_is_in_the_reference_config():
    ref = read(os.path.join(ROOT, "config", "lockshim.cfg"))
    for group, name in settings():
        assert re.search(r"\b%s\s*=" % name, ref), name


def test_man1_settings_example_is_real_output():
    """The sample output of `lockshim settings` in lockshim(1) is lines it prints."""
    sample = [b for b in code_blocks(read(MAN1)) if b.startswith("$ lockshim settings\n")]
    assert len(sample) == 1
    known = settings()
    lines = [l for l in sample[0].splitlines()[1:] if l != "..."]
    assert len(lines) >= 5
    for line in lines:
        group, name, type_, default = line.split(" ")
        assert known.get((group, name)) == (type_, default), line


def test_man1_documents_every_command():
    """Both ways: lockshim(1)'s SYNOPSIS and COMMANDS give exactly the usage
    lines of `lockshim help` (cli.c's command table), in its order."""
    usage = usage_lines()
    text = read(MAN1)
    synopsis = [plain(l) for l in section(text, "# SYNOPSIS").splitlines()
                if l.startswith("*lockshim ")]
    assert synopsis == usage
    commands = [plain(l) for l in section(text, "# COMMANDS").splitlines()
                if l.startswith("*lockshim ")]
    assert commands == usage


def test_help_gives_each_command_its_exit_statuses():
    """`lockshim help` has an "exit:" line under each command's description,
    and each status it names for a verb is in lockshim(1)'s EXIT STATUS
    section."""
    out = subprocess.run([CLI, "help"], capture_output=True, text=True,
                         timeout=TIMEOUT).stdout
    exits = re.findall(r"^ {2}(\w+) +.*\n +exit: (.*)$", out, re.M)
    assert [v for v, _ in exits] == [u.split()[1] for u in usage_lines()]
    man = section(read(MAN1), "# EXIT STATUS")
    for verb, line in exits:
        for code in re.findall(r"\b(\d+)\b", line):
            if code != "0" and int(code) < 128:
                assert "*%s*" % code in man, (verb, code)


def test_readme_cli_table_is_the_command_table():
    """Each row of the README's CLI table is a usage line of `lockshim help`,
    and each usage line has a row."""
    rows = table_rows(section(read(README), "## The CLI in brief"))
    documented_usage = []
    for cells in rows:
        m = re.fullmatch(r"`(lockshim [^`]+)`", cells[0])
        assert m, cells
        documented_usage.append(m.group(1))
    assert documented_usage == usage_lines()


def test_man1_environment_is_what_the_sources_read():
    """Both ways: every LOCKSHIM_ variable the sources read or set is in
    lockshim(1)'s ENVIRONMENT, and every one there is read or set."""
    used = set()
    for path in [p for folder in ("shim", "backend", "common", "arch", "cli")
                 for p in glob.glob(os.path.join(ROOT, folder, "**", "*.c"), recursive=True)]:
        used |= set(re.findall(r'(?:getenv|setenv)\("(LOCKSHIM_\w+)"', read(path)))
    env = section(read(MAN1), "# ENVIRONMENT")
    documented_vars = set(re.findall(r"(?m)^\*(LOCKSHIM_\w+)\*$", env))
    assert len(used) >= 4
    assert sorted(used - documented_vars) == [], "read by the code, not in lockshim(1)"
    assert sorted(documented_vars - used) == [], "in lockshim(1), not read by the code"


@pytest.mark.parametrize("page", ["lockshim.1", "lockshim.cfg.5"])
def test_man_page_renders_without_warnings(page):
    """The page make built renders with groff and every warning on, as man
    -l does, without a word on standard error."""
    path = os.path.join(BUILD, "man", page)
    assert os.path.exists(path), "make builds " + path
    src = os.path.join(ROOT, "doc", page + ".scd")
    assert os.path.getmtime(path) >= os.path.getmtime(src), "run make: %s is older" % path
    r = subprocess.run(["groff", "-wall", "-man", "-Tutf8", "-z", path], capture_output=True,
                       text=True, timeout=TIMEOUT)
    assert (r.returncode, r.stderr) == (0, ""), r.stderr
    r = subprocess.run(["groff", "-man", "-Tutf8", "-P-c", "-P-b", "-P-u", path],
                       capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 0 and "NAME" in r.stdout and "SEE ALSO" in r.stdout


def test_readme_is_at_most_15_kib():
    size = os.path.getsize(README)
    assert size <= README_MAX_BYTES, "README.md is %d bytes; move detail to doc/" % size


def ci_bare_machine_commands():
    """The commands .ci/run gives fresh-debian.sh: "$fresh" 'A && B'."""
    m = re.search(r"""(?m)^"\$fresh" '([^']+)'$""", read(os.path.join(ROOT, ".ci", "run")))
    assert m, "no fresh-debian.sh run in .ci/run"
    return [c.strip() for c in m.group(1).split("&&")]


def test_readme_two_commands_are_the_ones_ci_runs_on_a_bare_machine():
    """The README's two commands are, in order, the ones .ci/run runs through
    fresh-debian.sh in a clean clone on a Debian 12 with only make and git;
    both install the packages first (their target depends on deps)."""
    block = code_blocks(section(read(README), "## The two commands"))[0]
    commands = [l.split("#")[0].strip() for l in block.splitlines() if l.strip()]
    assert len(commands) == 2
    assert commands == ci_bare_machine_commands()
    makefile = read(os.path.join(ROOT, "Makefile"))
    for c in commands:
        target = re.fullmatch(r"make (\w+)", c).group(1)
        assert re.search(r"(?m)^%s: deps$" % target, makefile), target
    fresh = [os.path.join(ROOT, "scripts", "fresh-debian.sh"),
             os.path.join(ROOT, "..", "shared", "fresh-debian.sh")]
    for path in [p for p in fresh if os.path.exists(p)]:
        text = read(path)
        assert "--variant=minbase --include=make,git,ca-certificates bookworm" in text, path
        assert 'git clone -q "$repo"' in text, path


def test_configs_shown_in_the_docs_are_valid():
    """The walkthrough's config in the README and the example of
    lockshim.cfg(5) parse (69: their Redis is not here)."""
    shown = [b for b in code_blocks(read(README)) if b.startswith("$ cat counter.cfg\n")]
    shown = [shown[0].split("\n", 1)[1]] if shown else []
    shown += [b for b in code_blocks(read(MAN5)) if b.startswith("redis = ")]
    assert len(shown) == 2
    for i, text in enumerate(shown):
        path = os.path.join(BUILD, "docs-shown-%d.cfg" % i)
        with open(path, "w") as f:
            f.write(text)
        r = subprocess.run([CLI, "check", "-c", path], capture_output=True, text=True,
                           timeout=TIMEOUT)
        os.unlink(path)
        assert r.returncode in (0, 69), (text, r.stderr)
        assert "ok, " in r.stdout


def test_shipped_configs_are_valid():
    paths = glob.glob(os.path.join(ROOT, "config", "**", "*.cfg"), recursive=True) + \
        glob.glob(os.path.join(ROOT, "examples", "*.cfg"))
    assert len(paths) >= 4
    for p in paths:
        r = subprocess.run([CLI, "check", "-c", p], capture_output=True, text=True,
                           timeout=TIMEOUT)
        assert r.returncode in (0, 69), (p, r.stderr)  # 69: its Redis is not here
        assert "ok, " in r.stdout


def test_reference_config_defaults_match_builtin_defaults(tmp_path):
    """The reference config's values are the defaults: `lockshim check`
    prints every setting that differs from its default, and for the whole
    reference file it prints none (no `settings:` line, nothing after the
    lock's key). A control file with one changed value shows it."""
    ref = os.path.join(ROOT, "config", "lockshim.cfg")
    r = subprocess.run([CLI, "check", "-c", ref], capture_output=True, text=True,
                       timeout=TIMEOUT)
    lines = r.stdout.splitlines()
    assert lines[0] == ref + ": ok, 1 lock(s)", r.stdout
    assert lines[1] == "  transfer: key lockshim:account:{arg0}", r.stdout
    changed = os.path.join(str(tmp_path), "changed.cfg")
    with open(changed, "w") as f:
        f.write(open(ref).read().replace("port = 6379;", "port = 6380;", 1)
                .replace("lease_ms = 30000;", "lease_ms = 30001;"))
    c = subprocess.run([CLI, "check", "-c", changed], capture_output=True, text=True,
                       timeout=TIMEOUT)
    assert c.stdout.splitlines()[1:3] == [
        "settings: redis.port 6380",
        "  transfer: key lockshim:account:{arg0}, lease_ms 30001"], c.stdout


@pytest.mark.skipif(ASAN, reason="installs the plain build")
def test_make_install_layout(progs, redis, tmp_path):
    dest = str(tmp_path / "root")
    build = os.path.relpath(BUILD, ROOT)
    subprocess.run(["make", "-s", "-C", ROOT, "install", "DESTDIR=" + dest, "PREFIX=/opt/ls",
                    "BUILD=" + build], check=True, timeout=300, capture_output=True)
    cli = os.path.join(dest, "opt/ls/bin/lockshim")
    assert os.path.exists(os.path.join(dest, "opt/ls/lib/liblockshim.so"))
    assert os.path.exists(os.path.join(dest, "opt/ls/share/doc/lockshim/lockshim.cfg"))
    assert os.path.exists(os.path.join(dest, "opt/ls/share/man/man1/lockshim.1"))
    assert os.path.exists(os.path.join(dest, "opt/ls/share/man/man5/lockshim.cfg.5"))
    with open(os.path.join(dest, "etc/lockshim/lockshim.cfg")) as f, \
            open(os.path.join(ROOT, "config/lockshim.etc.cfg")) as g:
        assert f.read() == g.read()
    cfg = write_config(tmp_path, redis, 'log_level = "debug";\nlocks = ( { symbol = "hold_call"; } );\n')
    r = run([cli, "run", "-c", cfg, "--", progs["driver"], "call:0"], None)
    assert r.returncode == 0 and "call rc=42" in r.stdout, r.stderr
    assert "acquired lockshim:hold_call" in r.stderr
    subprocess.run(["make", "-s", "-C", ROOT, "uninstall", "DESTDIR=" + dest, "PREFIX=/opt/ls",
                    "BUILD=" + build], check=True, timeout=300, capture_output=True)
    left = [os.path.relpath(os.path.join(d, f), dest) for d, _, fs in os.walk(dest) for f in fs]
    assert left == ["etc/lockshim/lockshim.cfg"], left  # the operator's config stays
