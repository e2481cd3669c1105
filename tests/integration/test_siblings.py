# SPDX-License-Identifier: MIT
"""Siblings: one lock of several functions (`symbols`), and the report that
names the libc sibling a program calls instead of the guarded function.

progs/sibling_mv.c is built twice: one program renames with rename(2), the
other with renameat2(2) only, as mv does. progs/sibling_slow.c, preloaded
after the shim, makes both calls take a while and journals them ("E pid" on
entry, "L pid" on leaving, appended in call order): interleaved lines are
two processes inside at once. With SIB_MEET its first call waits inside
for the other process to enter, which forces the overlap when nothing
excludes them. Each exclusion test has its control.
"""
import os
import re
import shutil
import subprocess

import pytest

from support.server import lock_keys
from support.util import ASAN, CLI, TIMEOUT, cc, run, shim_env, write_config

N = 15  # renames each way per program


@pytest.fixture(scope="module")
def sib(tmp_path_factory):
    """This file's programs: "rename", "renameat2" and "fdatasync" (the
    rename program calling fdatasync too) of sibling_mv.c, and "slow", the
    preloaded library of rename and renameat2 (sibling_slow.c)."""
    d = str(tmp_path_factory.mktemp("siblings"))
    return {
        "rename": cc(os.path.join(d, "sib_rename"), ["sibling_mv.c"], "-O2"),
        "renameat2": cc(os.path.join(d, "sib_renameat2"), ["sibling_mv.c"], "-O2",
                        "-DCALL_RENAMEAT2"),
        "fdatasync": cc(os.path.join(d, "sib_fdatasync"), ["sibling_mv.c"], "-O2",
                        "-DCALL_FDATASYNC"),
        "slow": cc(os.path.join(d, "libsibling_slow.so"), ["sibling_slow.c"], "-O2",
                   "-shared", "-fPIC", "-ldl"),
    }


def locks(*entries):
    return "locks = ( %s );\n" % ", ".join(entries)


def slow_env(sib, cfg, tmp_path, **extra):
    """The environment of a program under the shim (cfg None: without it),
    with sibling_slow.c's library preloaded after it."""
    env = shim_env(cfg, preload=cfg is not None, SIB_JOURNAL=str(tmp_path / "journal"),
                   **extra)
    env["LD_PRELOAD"] = ":".join(p for p in (env.get("LD_PRELOAD"), sib["slow"]) if p)
    return env


def pair(sib, cfg, tmp_path, **extra):
    """Runs the rename and the renameat2 program at once on one directory,
    meeting inside their first call. Returns their CompletedProcess-like
    (returncode, stdout, stderr) and the journal's lines."""
    work, meet = tmp_path / "work", tmp_path / "meet"
    work.mkdir()
    meet.mkdir()
    env = slow_env(sib, cfg, tmp_path, SIB_MEET=str(meet), **extra)
    ps = [subprocess.Popen([sib[name], str(work), str(N)], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
          for name in ("rename", "renameat2")]
    outs = []
    for p in ps:
        out, err = p.communicate(timeout=TIMEOUT)
        outs.append((p.returncode, out, err))
    with open(tmp_path / "journal") as f:
        return outs, f.read().split("\n")[:-1]


def overlapped(journal):
    """Whether a process entered while another was inside (the file's order)."""
    inside = set()
    for line in journal:
        what, pid = line.split()
        if what == "E":
            if inside - {pid}:
                return True
            inside.add(pid)
        else:
            inside.discard(pid)
    return False


def all_done(outs):
    return all(rc == 0 and out == "done %d\n" % N for rc, out, _ in outs)


def cli(*args):
    return subprocess.run([CLI] + list(args), env=shim_env(None, preload=False),
                          capture_output=True, text=True, timeout=TIMEOUT,
                          stdin=subprocess.DEVNULL)


def lines_at(level, stderr):
    return [l for l in stderr.splitlines() if re.match(r"lockshim\[\d+\] \S+: %s: " % level, l)]


MV_LOCK = '{ symbols = ( "rename", "renameat2" ); key = "mv"; wait_ms = 30000; }'
HINT = ('rename is defined in %s and no loaded object calls it through a relocation')
SUFFIX = ('; the program calls renameat2 (a sibling): guard it too with '
          'symbols = ( "rename", "renameat2" )')


# ---- one lock, several functions -------------------------------------------

def test_control_the_two_programs_overlap_without_the_shim(sib, tmp_path):
    outs, journal = pair(sib, None, tmp_path)
    assert all_done(outs), outs
    assert len(journal) == 2 * 2 * 2 * N and overlapped(journal)


def test_control_a_lock_on_rename_alone_lets_renameat2_in(sib, redis, tmp_path):
    """The bug: mv's renameat2 passes a lock on rename."""
    cfg = write_config(tmp_path, redis, locks('{ symbol = "rename"; key = "mv"; '
                                              'wait_ms = 30000; }'))
    outs, journal = pair(sib, cfg, tmp_path)
    assert all_done(outs), outs
    assert overlapped(journal)


def test_one_lock_of_two_symbols_excludes_across_programs(sib, redis, tmp_path):
    """rename in one process and renameat2 in another take the same key:
    the first one in waits inside for the other (SIB_MEET_MS), which never
    comes in; no line of the journal interleaves."""
    cfg = write_config(tmp_path, redis, locks(MV_LOCK))
    outs, journal = pair(sib, cfg, tmp_path, SIB_MEET_MS=1000)
    assert all_done(outs), outs
    assert len(journal) == 2 * 2 * 2 * N and not overlapped(journal), journal
    assert lock_keys(redis, "lockshim:*") == []


def test_symbol_placeholder_is_the_function_called(sib, redis, tmp_path):
    """key = "mv:{symbol}": each function its own key, which do not exclude."""
    cfg = write_config(tmp_path, redis, locks(
        '{ symbols = ( "rename", "renameat2" ); key = "mv:{symbol}"; wait_ms = 30000; }'))
    outs, journal = pair(sib, cfg, tmp_path, LOCKSHIM_LOG_LEVEL="debug")
    assert all_done(outs), outs
    assert re.search(r"acquired lockshim:mv:rename for rename\b", outs[0][2]), outs[0][2]
    assert re.search(r"acquired lockshim:mv:renameat2 for renameat2\b", outs[1][2]), outs[1][2]
    assert "lockshim:mv\n" not in outs[0][2] + outs[1][2]
    assert overlapped(journal)


@pytest.mark.parametrize("reentrant", [True, False])
def test_reentrancy_counts_across_the_symbols(sib, redis, tmp_path, reentrant):
    """rename (guarded) calls renameat2 through its PLT slot (guarded, the
    same key): a reentrant entry; with reentrant = false (the control) the
    inner call waits for its own thread and is skipped with EBUSY."""
    cfg = write_config(tmp_path, redis, locks(
        '{ symbols = ( "rename", "renameat2" ); key = "mv"; wait_ms = 300; '
        'reentrant = %s; }' % ("true" if reentrant else "false")))
    work = tmp_path / "work"
    work.mkdir()
    r = subprocess.run([sib["rename"], str(work), "2"], env=slow_env(sib, cfg, tmp_path),
                       capture_output=True, text=True, timeout=TIMEOUT)
    if reentrant:
        assert r.returncode == 0 and r.stdout == "done 2\n", r.stderr
    else:
        assert r.returncode == 1 and "Device or resource busy" in r.stdout, r.stdout
        assert "renameat2: lock lockshim:mv still held by another owner after 300 ms" in \
            r.stderr, r.stderr


def test_check_prints_the_lock_once_with_its_symbols(redis, tmp_path):
    cfg = write_config(tmp_path, redis, locks(MV_LOCK, '{ symbol = "unlink"; }'))
    r = cli("check", "-c", cfg)
    assert r.returncode == 0, r.stderr
    assert "ok, 2 lock(s)" in r.stdout
    assert "  rename, renameat2: key lockshim:mv, wait_ms 30000\n" in r.stdout
    assert "  unlink: key lockshim:{symbol}\n" in r.stdout


@pytest.mark.parametrize("body,where,message", [
    ('{ symbol = "rename"; symbols = ( "renameat2" ); }', "locks[0]",
     "symbol and symbols together"),
    ('{ key = "k"; }', "locks[0]", 'missing required setting "symbol" (or "symbols"'),
    ('{ symbols = ( ); }', "locks[0].symbols", "is empty"),
    ('{ symbols = ( "rename", "renameat2", "rename" ); }', "locks[0].symbols",
     'symbol "rename" is named twice'),
    ('{ symbol = "renameat2"; }, { symbols = ( "rename", "renameat2" ); }',
     "locks[1].symbols", 'symbol "renameat2" is already guarded by locks[0]'),
    ('{ symbols = ( "rename", "setjmp" ); }', "locks[0].symbols", '"setjmp" cannot be guarded'),
])
def test_bad_symbols_are_config_errors(sib, tmp_path, body, where, message):
    """Refused by check and by the shim alike, exit 78, one line naming the
    file, the line, the setting and the problem."""
    cfg = write_config(tmp_path, None, locks(body))
    c = cli("check", "-c", cfg)
    assert c.returncode == 78 and "%s:1: %s: %s" % (cfg, where, message) in c.stderr, c.stderr
    r = run([sib["rename"], str(tmp_path), "1"], cfg)
    assert r.returncode == 78 and "%s:1: %s: %s" % (cfg, where, message) in r.stderr, r.stderr


# ---- the report names the sibling -------------------------------------------

# The ASan build loads libstdc++, which calls rename itself: rename is then
# caught in every program, and the tests that need it called by nobody but
# the program cannot hold. test_check_names_fdatasync_for_fsync runs there.
NEEDS_RENAME_UNCALLED = pytest.mark.skipif(ASAN, reason="libstdc++ (loaded with ASan) calls "
                                           "rename")

def libc_of(program):
    out = subprocess.run(["ldd", program], capture_output=True, text=True).stdout
    return re.search(r"libc\.so\.6 => (\S+)", out).group(1)


@NEEDS_RENAME_UNCALLED
def test_check_names_the_sibling_the_program_calls(sib, redis, tmp_path):
    cfg = write_config(tmp_path, redis, locks('{ symbol = "rename"; }'))
    r = cli("check", "-c", cfg, "--", sib["renameat2"], str(tmp_path), "1")
    assert r.returncode == 1, r.stdout + r.stderr
    line = [l for l in r.stdout.splitlines() if l.startswith("rename: ")]
    assert len(line) == 1 and line[0].startswith("rename: unguarded: " + HINT % libc_of(sib["renameat2"])), r.stdout
    assert line[0].endswith(SUFFIX), line[0]
    # control: the program that calls rename itself is guarded, no sibling named
    r = cli("check", "-c", cfg, "--", sib["rename"], str(tmp_path), "1")
    assert r.returncode == 0 and "rename: reloc (1 call site) in " in r.stdout, r.stdout
    assert "the program calls" not in r.stdout


@NEEDS_RENAME_UNCALLED
def test_check_names_renameat2_for_real_mv(redis, tmp_path):
    mv = shutil.which("mv")
    if not mv or "renameat2" not in subprocess.run(["nm", "-D", mv], capture_output=True,
                                                   text=True).stdout:
        pytest.skip("no mv calling renameat2 here")
    cfg = write_config(tmp_path, redis, locks('{ symbol = "rename"; key = "mv"; }'))
    r = cli("check", "-c", cfg, "--", mv, "a", "b")
    assert r.returncode == 1, r.stdout + r.stderr
    line = [l for l in r.stdout.splitlines() if l.startswith("rename: unguarded: ")]
    assert len(line) == 1, r.stdout
    m = re.search(r"; the program calls (.+) \((a sibling|siblings)\): guard (it|them) too "
                  r"with symbols = \( \"rename\", (.+) \)$", line[0])
    assert m and "renameat2" in m.group(1) and '"renameat2"' in m.group(4), line[0]
    # guarding what it named: every symbol guarded or covered by its lock
    named = m.group(4)
    cfg = write_config(tmp_path, redis, locks('{ symbols = ( "rename", %s ); key = "mv"; '
                                              'strict = true; }' % named))
    r = cli("check", "-c", cfg, "--", mv, "a", "b")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "renameat2: reloc (" in r.stdout
    assert re.search(r"^rename: unguarded: .*; the lock guards renameat2?, which the program "
                     r"calls$", r.stdout, re.M), r.stdout


@NEEDS_RENAME_UNCALLED
def test_lock_with_the_sibling_is_not_a_failure(sib, redis, tmp_path):
    """symbols = ( rename, renameat2 ) against the renameat2 program: check
    passes and a strict lock runs; rename's line says the lock is covered."""
    cfg = write_config(tmp_path, redis, locks(
        '{ symbols = ( "rename", "renameat2" ); key = "mv"; strict = true; }'))
    r = cli("check", "-c", cfg, "--", sib["renameat2"], str(tmp_path), "1")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "renameat2: reloc (1 call site) in " in r.stdout
    assert re.search(r"^rename: unguarded: .*; the lock guards renameat2, which the program "
                     r"calls$", r.stdout, re.M), r.stdout
    work = tmp_path / "work"
    work.mkdir()
    r = run([sib["renameat2"], str(work), "2"], cfg)
    assert r.returncode == 0 and r.stdout == "done 2\n" and lines_at("warn", r.stderr) == [], \
        r.stderr


@NEEDS_RENAME_UNCALLED
def test_startup_warning_names_the_sibling(sib, redis, tmp_path):
    cfg = write_config(tmp_path, redis, locks('{ symbol = "rename"; }'))
    work = tmp_path / "work"
    work.mkdir()
    r = run([sib["renameat2"], str(work), "2"], cfg)
    assert r.returncode == 0 and r.stdout == "done 2\n", r.stderr
    warns = lines_at("warn", r.stderr)
    assert len(warns) == 1 and warns[0].endswith(SUFFIX), r.stderr
    assert (HINT % libc_of(sib["renameat2"])) in warns[0]
    # control: the program calling rename is guarded and warned about nothing
    r = run([sib["rename"], str(work), "2"], cfg)
    assert r.returncode == 0 and lines_at("warn", r.stderr) == [], r.stderr


@NEEDS_RENAME_UNCALLED
def test_a_key_with_arguments_says_they_differ(sib, redis, tmp_path):
    cfg = write_config(tmp_path, redis, locks('{ symbol = "rename"; key = "{arg0:str}"; }'))
    r = cli("check", "-c", cfg, "--", sib["renameat2"], str(tmp_path), "1")
    assert r.returncode == 1
    assert r.stdout.rstrip("\n").split("\n")[-1].endswith(
        SUFFIX + " (their arguments differ: check that the key's {argN} names the same "
        "value in each)"), r.stdout


def test_check_names_fdatasync_for_fsync(sib, redis, tmp_path):
    """Another family, in every build: a lock on fsync, a program that
    calls fdatasync; the control program calls neither."""
    cfg = write_config(tmp_path, redis, locks('{ symbol = "fsync"; }'))
    r = cli("check", "-c", cfg, "--", sib["fdatasync"], str(tmp_path), "1")
    assert r.returncode == 1, r.stdout + r.stderr
    assert re.search(r'^fsync: unguarded: .*; the program calls fdatasync \(a sibling\): guard '
                     r'it too with symbols = \( "fsync", "fdatasync" \)$', r.stdout, re.M), \
        r.stdout
    r = cli("check", "-c", cfg, "--", sib["rename"], str(tmp_path), "1")
    assert r.returncode == 1 and "fsync: unguarded: " in r.stdout, r.stdout
    assert "the program calls" not in r.stdout
    cfg = write_config(tmp_path, redis, locks('{ symbols = ( "fsync", "fdatasync" ); }'))
    r = cli("check", "-c", cfg, "--", sib["fdatasync"], str(tmp_path), "1")
    assert r.returncode == 0 and "fdatasync: reloc (1 call site) in " in r.stdout, r.stdout
