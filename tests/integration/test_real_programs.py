# SPDX-License-Identifier: MIT
"""lockshim inside real programs: what Debian's own binaries (python3,
sqlite3 through Python) and small programs reproducing their habits need.

- Canonical PLT entries: a non-PIE executable that takes a library
  function's address makes its own PLT entry the function's canonical
  address (what dlsym(RTLD_DEFAULT) returns and other objects' GOT slots
  hold). Every call must be wrapped exactly once: no self-call (SIGSEGV), no
  wait on the own lock (skip). Python's fsync and cos (through sqlite3), and
  canonical.c / canonical_lib.c.
- vfork children (Python's subprocess, vfork_main.c) never release or break
  the parent's kept lock, and leak no descriptor.
- dlopen("$ORIGIN/...") and "${ORIGIN}" expand to the calling object's
  directory (origin_main.c), also when the loaded function is guarded.
- A relative LOCKSHIM_CONFIG still works in a child started after a chdir.
- The exec family cannot be guarded: refused by the shim and `lockshim check`.

Guarded calls are counted by the shim's debug lines ("acquired <key> for"),
with linger_ms = 0 so that every call takes the lock from Redis.
"""
import json
import os
import subprocess

import pytest

from support.util import CLI, MULT, TIMEOUT, cc, run, shim_env, write_config

PY = "/usr/bin/python3"  # Debian's: a non-PIE executable with its sqlite3 module


@pytest.fixture(scope="module")
def real(progs, tmp_path_factory):
    """Builds this file's programs; returns their paths."""
    d = str(tmp_path_factory.mktemp("real"))
    target = ["-L" + progs["dir"], "-Wl,-rpath," + progs["dir"], "-ltarget"]
    p = {}
    cc(os.path.join(d, "libcanonical.so"), ["canonical_lib.c"], "-O2", "-shared", "-fPIC")
    p["canonical"] = cc(os.path.join(d, "canonical"), ["canonical.c"], "-O2", "-no-pie",
                        "-fno-pie", "-L" + d, "-Wl,-rpath," + d, "-lcanonical", "-ldl")
    p["vfork"] = cc(os.path.join(d, "vfork_main"), ["vfork_main.c"], "-O2", *target)
    # origin/origin_main            dlopen("$ORIGIN/plugins/liborigin.so")
    # origin/plugins/liborigin.so
    # origin/lib/liboriginload.so   dlopen("$ORIGIN/plugins/libinner.so")
    # origin/lib/plugins/libinner.so
    o = os.path.join(d, "origin")
    for sub in ("plugins", "lib/plugins"):
        os.makedirs(os.path.join(o, sub))
    cc(os.path.join(o, "plugins", "liborigin.so"), ["target.c"], "-O2", "-shared", "-fPIC")
    cc(os.path.join(o, "lib", "plugins", "libinner.so"), ["target.c"], "-O2", "-shared",
       "-fPIC")
    cc(os.path.join(o, "lib", "liboriginload.so"), ["origin_main.c"], "-O2", "-shared",
       "-fPIC", "-DORIGIN_LOADER")
    lib = os.path.join(o, "lib")
    p["origin"] = cc(os.path.join(o, "origin_main"), ["origin_main.c"], "-O2", "-L" + lib,
                     "-Wl,-rpath," + lib, "-loriginload", "-ldl")
    return p


def acquires(stderr, key):
    """How many times the shim took `key` from Redis (debug lines)."""
    return stderr.count("acquired lockshim:%s for" % key)


def lock_cfg(tmp_path, redis, symbol, settings="", debug=True):
    return write_config(tmp_path, redis, '%slocks = ( { symbol = "%s"; %s } );\n'
                        % ('log_level = "debug";\n' if debug else "", symbol, settings))


def sets_sent(redis):
    for line in redis.cmd("INFO", "commandstats").splitlines():
        if line.startswith("cmdstat_set:"):
            return int(line.split("calls=")[1].split(",")[0])
    return 0


# ---- canonical PLT entries ---------------------------------------------------

FSYNC_TWICE = """
import os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
os.write(fd, b"data")
os.fsync(fd)
os.fsync(fd)
print("fsynced twice")
"""


@pytest.mark.parametrize("reentrant", ["true", "false"])
def test_python_fsync_through_its_canonical_plt_entry(redis, tmp_path, reentrant):
    """python3 takes fsync's address, so its PLT entry is canonical: both
    os.fsync calls run, each guarded exactly once (old shim: the wrapper
    called itself, SIGSEGV; with reentrant = false it waited on itself and
    the call failed with EBUSY)."""
    cfg = lock_cfg(tmp_path, redis, "fsync",
                   "linger_ms = 0; wait_ms = 2000; reentrant = %s;" % reentrant)
    r = run([PY, "-c", FSYNC_TWICE, str(tmp_path / "f")], cfg)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout == "fsynced twice\n"
    assert acquires(r.stderr, "fsync") == 2
    assert r.stderr.count("released lockshim:fsync") == 2
    assert "skipped" not in r.stderr


SQLITE_COS = """
import sqlite3
db = sqlite3.connect(":memory:")
print(db.execute("select cos(0.5)").fetchone()[0])
print(db.execute("select cos(0.25)").fetchone()[0])
"""


@pytest.mark.parametrize("bind_now", ["", "1"], ids=["lazy", "bind_now"])
def test_sqlite_cos_through_pythons_canonical_plt_entry(redis, tmp_path, bind_now):
    """libsqlite3's GOT holds python3's canonical PLT entry for cos: each SQL
    cos() is computed (not the skip value -1.0 of the old shim, which
    wrapped it twice and waited on itself) and guarded exactly once, lazily
    bound or with LD_BIND_NOW=1."""
    cfg = lock_cfg(tmp_path, redis, "cos", "linger_ms = 0; wait_ms = 2000; reentrant = false;")
    r = run([PY, "-c", SQLITE_COS], cfg, LD_BIND_NOW=bind_now)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == ["0.8775825618903728", "0.9689124217106447"]
    assert acquires(r.stderr, "cos") == 2
    assert "skipped" not in r.stderr


CANONICAL_OUT = ["direct 1001", "pointer 1002", "lib-plt 11003", "lib-got 21004",
                 "dlsym 1005"]


def test_canonical_program_without_the_shim(real):
    """Control: the toy's five calls and their results, unguarded."""
    r = run([real["canonical"]])
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == CANONICAL_OUT


@pytest.mark.parametrize("bind_now", ["", "1"], ids=["lazy", "bind_now"])
@pytest.mark.parametrize("reentrant", ["true", "false"])
def test_canonical_plt_entry_wrapped_once(real, redis, tmp_path, reentrant, bind_now):
    """A non-PIE executable storing canon_add's address, calling it directly,
    through that pointer, through dlsym, and its library calling it through
    its GOT: five calls, five right results, five acquires. (Old shim:
    SIGSEGV lazily with reentrant = true; calls skipped with reentrant =
    false. Lazy-bound or not.)"""
    cfg = lock_cfg(tmp_path, redis, "canon_add",
                   "linger_ms = 0; wait_ms = 2000; reentrant = %s;" % reentrant)
    r = run([real["canonical"]], cfg, LD_BIND_NOW=bind_now)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.splitlines() == CANONICAL_OUT
    assert acquires(r.stderr, "canon_add") == 5
    assert "skipped" not in r.stderr


# ---- vfork children ----------------------------------------------------------

# A kept lock (long linger_ms and handoff_ms) is certain to be held while the
# child is spawned; a skipped call sets EBUSY. "Fast" is under half of
# wait_ms: a call that waited was skipped after it. The long lease puts the
# first renewal (which opens the renewal thread's connection, one more
# descriptor) far past the end of the run.
WAIT_MS = int(2000 * MULT)
KEPT = 'wait_ms = %d; lease_ms = 60000; errno = "EBUSY"; return = %%d; ' \
       'linger_ms = 30000; handoff_ms = 30000;' % WAIT_MS

UMASK_AND_SPAWN = """
import ctypes, json, os, subprocess, time
errno_loc = ctypes.CDLL(None).__errno_location
errno_loc.restype = ctypes.POINTER(ctypes.c_int)
rows = []
for i in range(4):
    errno_loc()[0] = 0
    t0 = time.monotonic()
    old = os.umask(0o22)
    ms = (time.monotonic() - t0) * 1000
    rows.append({"errno": errno_loc()[0], "ms": ms, "old": old,
                 "fds": len(os.listdir("/proc/self/fd"))})
    subprocess.run(["/bin/true"], check=True)
print(json.dumps(rows))
"""


@pytest.mark.timing
def test_python_subprocess_keeps_the_parents_lock(redis, tmp_path):
    """Python's subprocess spawns with vfork: after each spawn os.umask still
    enters at once with its kept lock (errno 0, the real old mask, far under
    wait_ms) and no descriptor leaks. Old shim: the child's execve released
    the parent's lock over a closed descriptor; every later call waited for
    its own key and was skipped (EBUSY), one socket leaked per spawn."""
    cfg = lock_cfg(tmp_path, redis, "umask", KEPT % 0, debug=False)
    r = run([PY, "-c", UMASK_AND_SPAWN], cfg)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = json.loads(r.stdout)
    assert [row["errno"] for row in rows] == [0, 0, 0, 0], r.stderr
    assert [row["old"] for row in rows[1:]] == [0o22] * 3
    assert max(row["ms"] for row in rows) < WAIT_MS / 2, rows
    assert len({row["fds"] for row in rows[1:]}) == 1, rows
    assert "release" not in r.stderr and "still held" not in r.stderr


@pytest.mark.timing
@pytest.mark.parametrize("mode", ["close_range", "syscall", "none"])
def test_vfork_child_keeps_the_parents_lock(real, redis, tmp_path, mode):
    """vfork_main holds a kept lock, vforks a child that closes its
    descriptors (through libc, by raw syscall, or not at all) and execs
    /bin/true, then calls again, four times: every call runs (rc = x+1,
    errno 0, far under wait_ms), the lock is taken once and stays the
    parent's, and the descriptor count is stable. Old shim: the child
    released the parent's lock (over a closed descriptor: later calls
    skipped with EBUSY and a socket leaked per spawn; or for real, costing
    a new acquire per call)."""
    cfg = lock_cfg(tmp_path, redis, "other_call", KEPT % -7, debug=False)
    redis.cmd("CONFIG", "RESETSTAT")
    r = run([real["vfork"], "4", mode], cfg)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [dict(kv.split("=") for kv in line.split()[2:]) for line in r.stdout.splitlines()]
    assert [(row["rc"], row["errno"]) for row in rows] == \
        [(str(i + 1), "0") for i in range(5)], r.stdout + r.stderr
    assert max(int(row["us"]) for row in rows) < WAIT_MS / 2 * 1000, rows
    assert len({row["fds"] for row in rows}) == 1, rows
    assert sets_sent(redis) == 1  # one acquire; no child gave the lock away
    assert "release" not in r.stderr and "still held" not in r.stderr


# ---- dlopen("$ORIGIN/...") ---------------------------------------------------

@pytest.mark.parametrize("who,name", [
    ("exe", "$ORIGIN/plugins/liborigin.so"),
    ("exe", "${ORIGIN}/plugins/liborigin.so"),
    ("lib", "$ORIGIN/plugins/libinner.so"),
    ("lib", "${ORIGIN}/plugins/libinner.so"),
])
def test_dlopen_origin_with_an_unrelated_lock(real, redis, tmp_path, who, name):
    """With any lock configured, $ORIGIN in a dlopen name is the calling
    object's directory: the executable's, or a library's own (old shim: the
    shim's directory, so the load failed)."""
    cfg = lock_cfg(tmp_path, redis, "fsync", debug=False)
    r = run([real["origin"], who, name, "other_call", "41"], cfg)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout == "other_call rc=42\n"


def test_dlopen_origin_is_the_callers_directory(real, redis, tmp_path):
    """The library's plugin is not found from the executable: $ORIGIN is the
    caller's directory, not some fixed one, and the load fails as without
    the shim."""
    cfg = lock_cfg(tmp_path, redis, "fsync", debug=False)
    name = "$ORIGIN/plugins/libinner.so"
    plain = run([real["origin"], "exe", name, "other_call", "41"])
    shimmed = run([real["origin"], "exe", name, "other_call", "41"], cfg)
    assert plain.returncode == shimmed.returncode == 2
    assert "cannot open shared object file" in plain.stdout
    assert "cannot open shared object file" in shimmed.stdout


@pytest.mark.parametrize("who,name", [
    ("exe", "$ORIGIN/plugins/liborigin.so"),
    ("lib", "${ORIGIN}/plugins/libinner.so"),
])
def test_dlopen_origin_plugin_function_is_guarded(real, redis, tmp_path, procs, who, name):
    """The function of a plugin loaded through $ORIGIN is guarded after the
    dlopen: its lock is in Redis, held by this process (kept, long linger),
    and released at exit."""
    cfg = lock_cfg(tmp_path, redis, "other_call",
                   "lease_ms = 20000; linger_ms = 30000; handoff_ms = 30000;")
    p = procs([real["origin"], who, name, "other_call", "41", "stdin"], cfg)
    assert p.expect("other_call") == "other_call rc=42"
    assert ":%d:" % p.p.pid in (redis.cmd("GET", "lockshim:other_call") or "")
    p.send()
    rc, _, err = p.finish()
    assert rc == 0, err
    assert acquires(err, "other_call") == 1
    assert redis.cmd("EXISTS", "lockshim:other_call") == 0


# ---- relative LOCKSHIM_CONFIG ------------------------------------------------

CHDIR_AND_SPAWN = """
import os, subprocess, sys
os.chdir("/")
sys.exit(subprocess.run([sys.argv[1], "call:0"]).returncode)
"""


def test_relative_config_survives_chdir_in_a_child(progs, redis, tmp_path):
    """LOCKSHIM_CONFIG=conf/lockshim.cfg, resolved from the start directory;
    the program chdirs to / and starts a child under the same environment:
    the child finds the config and its call is guarded (old shim: the child
    stopped with exit 78, config not found)."""
    os.mkdir(str(tmp_path / "conf"))
    cfg = lock_cfg(tmp_path / "conf", redis, "hold_call", "linger_ms = 0;")
    env = shim_env(cfg)
    env["LOCKSHIM_CONFIG"] = os.path.join("conf", os.path.basename(cfg))
    r = subprocess.run([PY, "-c", CHDIR_AND_SPAWN, progs["driver"]], env=env,
                       cwd=str(tmp_path), capture_output=True, text=True, timeout=TIMEOUT,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.splitlines() == ["enter 0", "call rc=42 errno=0"]
    assert acquires(r.stderr, "hold_call") == 1
    assert "config error" not in r.stderr


# ---- exec family refused -----------------------------------------------------

EXEC_FAMILY = ["execve", "execvp", "execl", "fexecve"]


@pytest.mark.parametrize("symbol", EXEC_FAMILY)
def test_exec_family_refused_before_main(progs, redis, tmp_path, symbol):
    """A lock on an exec function stops the program before main with exit
    78 and one line naming the setting and why (old shim: accepted, the
    program ran)."""
    cfg = write_config(tmp_path, redis, 'locks = ( { symbol = "hold_call"; },\n'
                                        '          { symbol = "%s"; } );\n' % symbol)
    r = run([progs["driver"], "write"], cfg)
    assert r.returncode == 78, r.stdout + r.stderr
    assert r.stdout == ""
    assert 'locks[1].symbol: "%s" cannot be guarded' % symbol in r.stderr
    assert "does not return" in r.stderr
    assert len(r.stderr.splitlines()) == 1


@pytest.mark.parametrize("symbol", EXEC_FAMILY)
def test_exec_family_refused_by_check(redis, tmp_path, symbol):
    """`lockshim check` refuses the same config with exit 78 and the same
    reason (old CLI: "ok", exit 0)."""
    cfg = write_config(tmp_path, redis, 'locks = ( { symbol = "%s"; } );\n' % symbol)
    r = subprocess.run([CLI, "check", "-c", cfg], env=shim_env(None, preload=False),
                       capture_output=True, text=True, timeout=TIMEOUT,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 78, r.stdout + r.stderr
    assert 'locks[0].symbol: "%s" cannot be guarded' % symbol in r.stderr
    assert "ok" not in r.stdout
