# SPDX-License-Identifier: MIT
"""Entry patching: the first instructions of a configured function are
replaced by a jump to its wrapper, so every call is guarded, also the calls
no relocation carries (from inside the executable, through a pointer stored
before start-up, recursion, inside a -Bsymbolic library, inside a dlopened
library).

- awkward entries (progs/entry_asm.S): a RIP-relative first instruction, a
  jcc rel8 out of the first 5 bytes and endbr64 are patched; a 3-byte
  function and loops branching back into the first 5 bytes are refused
  (method = "entry": exit 78 and one line) or fall back to relocations
  (method = "auto": a warn line, the program runs);
- post_ledger (progs/entry_ledger.c) built -O0, -O2, -fcf-protection,
  -pg -mfentry, PIE and -no-pie: exact counts from processes x 8 threads,
  direct, through a stored pointer and recursive, where the control runs
  without the shim lose updates; recursion takes the lock once (reentrant)
  or once per level (one key per level);
- every ABI shape of abi.c linked into the executable, C++ exceptions
  through a member function, longjmp out of a patched function, a static
  function, and the registers a -fipa-ra caller keeps across a call of a
  local function; a function reached by entry and by relocations is
  wrapped once;
- stripped executables: the debug file found by build-id under debug_dirs
  or by .gnu_debuglink; the function named by offset, with build_id; a
  debug file not found (absent, or another build's): the refusal, auto's
  warning and check's line name the objects searched and the paths tried,
  capped with "and N more";
- object = a library: a -Bsymbolic library's internal call, a dlopened
  library's static function;
- compiler clones (.constprop.0, .cold) are warned about;
- refusals that are not about the code: another thread already running
  (a library's constructor started it), a function the shim wraps itself;
- `lockshim check -c FILE -- PROGRAM` says per lock entry / reloc /
  unguarded / deferred (`object` a library not loaded yet: exit 0), with
  its exit status, and never runs the program's main.

Counting tests use linger_ms = 0, so that every call takes the lock from
Redis and logs "acquired <key> for <symbol> (" at debug.
"""
import os
import re
import shutil
import subprocess

import pytest

from resp import free_port
from support.scenarios import jumped_out_and_released
from support.server import lock_keys
from support.util import CLI, PRELOAD, TIMEOUT, TSAN, cc, shim_env, write_config

DEBUG = 'log_level = "debug";\n'
NO_LINGER = "defaults = { linger_ms = 0; };\n"
ASM_PATCHABLE = ["rip_first", "early_exit", "endbr_first", "call_first", "jmp_first"]
ASM_REFUSED = {"tiny": "3 bytes long", "loop_back": "branches back into",
               "loop_mid": "branches back into"}
LEDGER_VARIANTS = {
    "O0": ["-O0"],
    "O2": ["-O2"],
    "cet": ["-O2", "-fcf-protection=full"],
    "pg": ["-O2", "-pg", "-mfentry"],
    "nopie": ["-O2", "-no-pie"],
    "O0-nopie": ["-O0", "-no-pie"],
}
ABI_CALLS = {"many_ints": 2, "many_doubles": 1, "mixed_args": 1, "vmix": 1, "make_big": 1,
             "take_big": 1, "make_pair": 1, "make_dpair": 1, "make_mixed": 1, "ld_mul": 1,
             "ld_stack": 1, "fsum": 1, "set_errno": 1, "deep": 1}
CXX_POST = "_ZN7Account4postEi"
STATIC_OUT = "scale 42\nscale 23\nscale 3\n"


# ---- helpers -----------------------------------------------------------------

def tool(*argv, cwd=None):
    return subprocess.run(list(argv), check=True, capture_output=True, text=True,
                          cwd=cwd).stdout


def build_id(path):
    m = re.search(r"Build ID: ([0-9a-f]+)", tool("readelf", "-n", path))
    assert m, path
    return m.group(1)


def wrong_id(path):
    """path's build-id with its first digit changed."""
    bid = build_id(path)
    return ("f" if bid[0] != "f" else "e") + bid[1:]


def st_value(path, symbol):
    """The symbol's st_value as nm prints it."""
    for line in tool("nm", path).splitlines():
        f = line.split()
        if len(f) == 3 and f[2] == symbol:
            return f[0]
    raise AssertionError("%s not in nm %s" % (symbol, path))


def lock(symbol, **settings):
    parts = ['symbol = "%s";' % symbol]
    for k, v in settings.items():
        if isinstance(v, bool):
            v = "true" if v else "false"
        elif isinstance(v, str):
            v = '"%s"' % v
        parts.append("%s = %s;" % (k, v))
    return "{ %s }" % " ".join(parts)


def locks(*entries):
    return "locks = ( %s );\n" % ", ".join(entries)


def lines_at(level, stderr):
    return [l for l in stderr.splitlines() if re.match(r"lockshim\[\d+\] \S+: %s: " % level, l)]


def acquires(stderr, symbol, key=None):
    """How many times the shim took lockshim:<key> from Redis for symbol."""
    return len(re.findall(r"acquired lockshim:%s for %s \(" % (re.escape(key or symbol),
                                                                re.escape(symbol)), stderr))


def patched(stderr, symbol):
    return any("entry patched" in l and symbol in l for l in lines_at("debug", stderr))


def go(argv, cfg=None, cwd=None, **env):
    """Runs argv (under the shim when cfg is given) in cwd."""
    return subprocess.run(argv, env=shim_env(cfg, preload=cfg is not None, **env), cwd=cwd,
                          capture_output=True, text=True, timeout=TIMEOUT,
                          stdin=subprocess.DEVNULL)


def refused(r, symbol, words):
    """Stopped before main: exit 78, nothing on stdout, one line naming symbol."""
    assert r.returncode == 78, (r.returncode, r.stdout, r.stderr)
    assert r.stdout == ""
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    assert symbol in lines[0] and words in lines[0], lines[0]


def fell_back(r, plain, symbol):
    """method = "auto": the program ran as without the shim, one warn line says
    the entry was not patched, and no call was guarded."""
    assert r.returncode == 0, r.stderr
    assert r.stdout == plain
    assert any(symbol in l and "falling back to relocations" in l
               for l in lines_at("warn", r.stderr)), r.stderr
    assert acquires(r.stderr, symbol) == 0, r.stderr


def counter(path):
    with open(path) as f:
        return int(f.read())


def race(prog, path, cfg, procs, threads, iters, mode="direct", depth=1, cwd=None):
    """procs copies of entry_ledger at once, each with threads threads making
    iters calls of depth; returns the final counter."""
    with open(path, "w") as f:
        f.write("0\n")
    env = shim_env(cfg, preload=cfg is not None)
    ps = [subprocess.Popen([prog, mode, path, str(iters), str(threads), str(depth)], env=env,
                           cwd=cwd, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
          for _ in range(procs)]
    for p in ps:
        _, err = p.communicate(timeout=TIMEOUT)
        assert p.returncode == 0, err
        assert "error" not in err and "warn" not in err, err
    return counter(path)


def cli(*args, **env):
    return subprocess.run([CLI] + list(args), env=shim_env(None, preload=False, **env),
                          capture_output=True, text=True, timeout=TIMEOUT,
                          stdin=subprocess.DEVNULL)


def check_prog(tmp_path, cfg, *argv):
    """lockshim check -c cfg -- argv, with ENTRY_MARK set; asserts the
    program's main never ran (the mark file is not there)."""
    mark = str(tmp_path / "main-ran")
    r = cli("check", "-c", cfg, "--", *argv, ENTRY_MARK=mark)
    assert not os.path.exists(mark), "the program's main ran: %r" % (r.stdout,)
    return r


def verdict(stdout, symbol, words="entry|reloc|unguarded"):
    """check's one line for symbol: "SYMBOL: entry|reloc|unguarded ..."."""
    found = re.findall(r"^%s: (?:%s)\b.*$" % (re.escape(symbol), words), stdout, re.M)
    assert len(found) == 1, stdout
    return found[0]


# ---- the programs ------------------------------------------------------------

@pytest.fixture(scope="module")
def ent(tmp_path_factory):
    """Builds this file's programs, libraries, stripped copies and debug files."""
    d = os.path.realpath(str(tmp_path_factory.mktemp("entry")))
    j = lambda *a: os.path.join(d, *a)  # noqa: E731
    p = {"dir": d}
    p["asm"] = cc(j("entry_asm"), ["entry_asm.S", "entry_asm_main.c"], "-O2")
    for v, flags in LEDGER_VARIANTS.items():
        p["ledger-" + v] = cc(j("entry_ledger-" + v), ["entry_ledger.c"], *flags, "-lpthread")
    for o in ("O0", "O2"):
        p["abi-" + o] = cc(j("entry_abi-" + o), ["abi.c", "abi_main.c"], "-" + o)
    p["cxx"] = cc(j("entry_cxx"), ["entry_cxx.cc"], "-O2", cxx=True)
    p["clone"] = cc(j("entry_clone"), ["entry_clone.c"], "-O2", "-fipa-cp-clone")
    p["static"] = cc(j("entry_static"), ["entry_static.c"], "-O2", "-Wl,--build-id=sha1")
    p["static-nopie"] = cc(j("entry_static-nopie"), ["entry_static.c"], "-O2", "-no-pie",
                           "-Wl,--build-id=sha1")
    p["libsym"] = cc(j("libentry_sym.so"), ["entry_sym.c"], "-O2", "-shared", "-fPIC",
                     "-Wl,-Bsymbolic", "-Wl,--build-id=sha1")
    p["sym"] = cc(j("entry_sym_main"), ["entry_sym_main.c"], "-O2", "-L" + d,
                  "-Wl,-rpath," + d, "-lentry_sym")
    p["libplug"] = cc(j("libentry_plug.so"), ["entry_plug.c"], "-O2", "-shared", "-fPIC")
    p["libthread"] = cc(j("libentry_thread.so"), ["entry_thread_lib.c"], "-O2", "-shared",
                        "-fPIC", "-lpthread")
    p["threaded"] = cc(j("entry_threaded"), ["entry_static.c"], "-O2", "-L" + d,
                       "-Wl,-rpath," + d, "-Wl,--no-as-needed", "-lentry_thread")
    p["ipara"] = cc(j("entry_ipara"), ["entry_ipara.c"], "-O2")
    p["ipara-sysv"] = cc(j("entry_ipara-sysv"), ["entry_ipara.c"], "-O2", "-rdynamic",
                         "-Wl,--hash-style=sysv")
    p["libonce"] = cc(j("libentry_once.so"), ["entry_once_lib.c"], "-O2", "-shared", "-fPIC")
    p["once"] = cc(j("entry_once"), ["entry_once_main.c"], "-O2", "-rdynamic", "-L" + d,
                   "-Wl,-rpath," + d, "-lentry_once")
    # jump.c and jump_main.c (test_abi's longjmp programs; support/scenarios.py checks them) in one executable.
    p["jump-O0"] = cc(j("entry_jump-O0"), ["jump.c", "jump_main.c"], "-O0")
    p["jump-fortify"] = cc(j("entry_jump-fortify"), ["jump.c", "jump_main.c"], "-O2",
                           "-D_FORTIFY_SOURCE=2")
    p["plug"] = cc(j("entry_plug_main"), ["entry_plug_main.c"], "-O2", "-ldl")
    p["opentrace"] = cc(j("libopentrace.so"), ["opentrace.c"], "-O2", "-shared", "-fPIC")

    # Stripped copies of entry_static (strip keeps the build-id note).
    for name, src in (("stripped", p["static"]), ("stripped-nopie", p["static-nopie"])):
        os.mkdir(j(name))
        p[name] = j(name, "entry_static")
        tool("strip", "-o", p[name], src)
    bid = build_id(p["static"])
    # 1. by build-id: <debug dir>/.build-id/NN/REST.debug
    p["dbg-buildid"] = j("dbg-buildid")
    os.makedirs(j("dbg-buildid", ".build-id", bid[:2]))
    tool("objcopy", "--only-keep-debug", p["static"],
         j("dbg-buildid", ".build-id", bid[:2], bid[2:] + ".debug"))
    # 2. by .gnu_debuglink: next to the object, in its .debug/, under a debug
    # dir + the object's directory.
    os.mkdir(j("link-next"))
    debug = j("link-next", "entry_static.debug")
    tool("objcopy", "--only-keep-debug", p["static"], debug)
    p["link-next"] = j("link-next", "entry_static")
    tool("strip", "-o", p["link-next"], p["static"])
    tool("objcopy", "--add-gnu-debuglink=" + debug, p["link-next"])
    os.makedirs(j("link-sub", ".debug"))
    p["link-sub"] = shutil.copy(p["link-next"], j("link-sub", "entry_static"))
    shutil.copy(debug, j("link-sub", ".debug", "entry_static.debug"))
    os.mkdir(j("link-root-obj"))
    p["link-root-obj"] = shutil.copy(p["link-next"], j("link-root-obj", "entry_static"))
    p["link-root"] = j("link-root")
    os.makedirs(p["link-root"] + j("link-root-obj"))
    shutil.copy(debug, p["link-root"] + j("link-root-obj", "entry_static.debug"))
    p["no-debug"] = j("no-debug")  # an empty debug dir
    os.mkdir(p["no-debug"])
    # 3. a .gnu_debuglink to a file that is nowhere, and one whose debug file
    # is another build's.
    os.mkdir(j("link-absent"))
    p["link-absent"] = shutil.copy(p["link-next"], j("link-absent", "entry_static"))
    os.mkdir(j("link-other"))
    p["link-other"] = shutil.copy(p["link-next"], j("link-other", "entry_static"))
    tool("objcopy", "--only-keep-debug", p["static-nopie"], j("link-other", "entry_static.debug"))
    return p


@pytest.fixture(scope="module")
def plain(ent):
    """Each program's output without the shim."""
    out = {}
    for name, argv in [("asm", [ent["asm"]]), ("static", [ent["static"]]),
                       ("sym", [ent["sym"]]), ("plug", [ent["plug"], ent["libplug"]]),
                       ("clone", [ent["clone"]]), ("ipara", [ent["ipara"]]),
                       ("once", [ent["once"]]), ("abi-O0", [ent["abi-O0"]]),
                       ("abi-O2", [ent["abi-O2"]])]:
        r = go(argv)
        assert r.returncode == 0 and r.stderr == "", (name, r.stderr)
        out[name] = r.stdout
    return out


# ---- 0. the programs are what the tests say they are ----------------------------

def insns(path, symbol):
    """[(offset from symbol, hex bytes, text)] of symbol's instructions."""
    dump = tool("objdump", "-d", path)
    m = re.search(r"^([0-9a-f]+) <%s>:\n(.*?)(?:\n\n|\Z)" % re.escape(symbol), dump, re.M | re.S)
    assert m, symbol
    base = int(m.group(1), 16)
    res = []
    for line in m.group(2).splitlines():
        f = line.split("\t")
        if len(f) >= 3:
            res.append((int(f[0].strip().rstrip(":"), 16) - base, f[1].strip(), f[2].strip()))
    return base, res


def test_asm_encodings_are_the_awkward_ones(ent, plain):
    """objdump: each hand-written function really starts as its test says."""
    path = ent["asm"]
    _, rip = insns(path, "rip_first")
    assert rip[0][0] == 0 and rip[0][1].startswith("8b 05") and "(%rip)" in rip[0][2]
    base, early = insns(path, "early_exit")
    jz = [i for i in early if i[1].split()[0] == "74"]  # je rel8
    assert len(jz) == 1 and jz[0][0] < 5, early
    target = int(jz[0][2].split()[1], 16) - base
    assert target >= 5, early  # out of the 5 bytes to be replaced
    _, endbr = insns(path, "endbr_first")
    assert endbr[0][0] == 0 and endbr[0][1] == "f3 0f 1e fa" and endbr[0][2] == "endbr64"
    _, tiny = insns(path, "tiny")
    assert [i[1] for i in tiny[:2]] == ["89 f8", "c3"]
    sizes = {l.split()[3]: int(l.split()[1], 16) for l in tool("nm", "-S", path).splitlines()
             if len(l.split()) == 4}
    assert sizes["tiny"] == 3
    for sym, head in (("loop_back", 0), ("loop_mid", 2)):
        base, loop = insns(path, sym)
        jnz = [i for i in loop if i[1].split()[0] == "75"]  # jne rel8
        assert len(jnz) == 1 and int(jnz[0][2].split()[1], 16) - base == head, loop
    _, call = insns(path, "call_first")
    assert call[0][0] == 0 and call[0][1].startswith("e8 ") and "<add_two>" in call[0][2]
    _, jmp = insns(path, "jmp_first")
    assert jmp[0][1].startswith("e9 ") and "<add_two>" in jmp[0][2]
    assert sizes["jmp_first"] == 5
    # Called directly from main, not exported: nothing but the entry reaches them.
    assert "rip_first" not in tool("nm", "-D", path)
    assert plain["asm"] == ("rip_first 8 12\nearly_exit -1 105\nendbr_first 7 22\n"
                            "tiny 9 11\nloop_back 14 1\nloop_mid 6 2\n"
                            "call_first 12 0\njmp_first 6 2\n")


def test_ledger_variants_are_what_they_claim(ent):
    """post_ledger: not exported, no relocation names it, no clone of it; its
    entry is endbr64 (cet), the __fentry__ call (pg), a frame set-up (-O0);
    the -no-pie builds are ET_EXEC."""
    for v in LEDGER_VARIANTS:
        path = ent["ledger-" + v]
        assert "post_ledger" not in tool("nm", "-D", path), v
        assert "post_ledger" not in tool("readelf", "-rW", path), v
        assert [l for l in tool("nm", path).splitlines() if "post_ledger." in l] == [], v
        _, code = insns(path, "post_ledger")
        first = code[0][2]
        want = {"cet": "endbr64", "pg": "__fentry__", "O0": "push   %rbp",
                "O0-nopie": "push   %rbp"}.get(v)
        if want:
            assert want in first, (v, first)
        else:
            assert "endbr64" not in first and "__fentry__" not in first, (v, first)
        etype = re.search(r"Type:\s+(\w+)", tool("readelf", "-h", path)).group(1)
        assert etype == ("EXEC" if "nopie" in v else "DYN"), (v, etype)


def test_bsymbolic_library_calls_its_inner_function_directly(ent):
    """libentry_sym.so: lib_outer calls lib_inner without a relocation."""
    assert "lib_inner" not in tool("readelf", "-rW", ent["libsym"])
    _, outer = insns(ent["libsym"], "lib_outer")
    assert sum(1 for i in outer if i[2].startswith("call") and "<lib_inner>" in i[2]) == 2


def test_clone_program_has_a_constprop_clone(ent, plain):
    syms = tool("nm", ent["clone"])
    assert re.search(r" t weigh\.constprop\.0$", syms, re.M), syms
    assert re.search(r" T weigh$", syms, re.M), syms
    assert plain["clone"] == "weigh 20320\nweigh 16660\nweigh 13468\nweigh 42656\n"


@pytest.mark.timing
@pytest.mark.parametrize("v", ["O2", "pg"])
def test_control_ledger_loses_updates(ent, tmp_path, v):
    """Without the shim, 3 processes x 8 threads lose updates (threads alone too)."""
    c = str(tmp_path / "c")
    assert race(ent["ledger-" + v], c, None, 3, 8, 4, cwd=str(tmp_path)) < 96
    assert race(ent["ledger-" + v], c, None, 1, 8, 6, cwd=str(tmp_path)) < 48
    assert race(ent["ledger-" + v], c, None, 2, 8, 2, mode="fnptr", depth=3,
                cwd=str(tmp_path)) < 96


# ---- 1. awkward entries ------------------------------------------------------

@pytest.mark.parametrize("method", ["entry", "auto"])
@pytest.mark.parametrize("symbol", ASM_PATCHABLE)
def test_awkward_entry_is_patched(ent, plain, redis, tmp_path, symbol, method):
    """RIP-relative first instruction, jcc rel8 out of the 5 bytes, endbr64,
    a call rel32, a function that is one jmp rel32: patched; the results are those of the unpatched program, both calls
    took the lock."""
    cfg = write_config(tmp_path, redis, DEBUG + NO_LINGER + locks(lock(symbol, method=method)))
    r = go([ent["asm"]], cfg)
    assert r.returncode == 0, r.stderr
    assert r.stdout == plain["asm"]
    assert acquires(r.stderr, symbol) == 2, r.stderr
    assert patched(r.stderr, symbol), r.stderr
    assert lines_at("warn", r.stderr) == [] and lines_at("error", r.stderr) == []


def test_awkward_entries_patched_together(ent, plain, redis, tmp_path):
    cfg = write_config(tmp_path, redis, DEBUG + NO_LINGER +
                       locks(*[lock(s, method="entry") for s in ASM_PATCHABLE]))
    r = go([ent["asm"]], cfg)
    assert r.returncode == 0 and r.stdout == plain["asm"], r.stderr
    for s in ASM_PATCHABLE:
        assert acquires(r.stderr, s) == 2, (s, r.stderr)
    assert lock_keys(redis) == []


@pytest.mark.parametrize("symbol", list(ASM_REFUSED))
def test_unpatchable_entry_is_refused_with_method_entry(ent, redis, tmp_path, symbol):
    """method = "entry" on a 3-byte function or a loop back into the first 5
    bytes: exit 78 before main, one line naming the symbol and why."""
    cfg = write_config(tmp_path, redis, locks(lock("rip_first", method="entry"),
                                              lock(symbol, method="entry")))
    r = go([ent["asm"]], cfg)
    refused(r, symbol, ASM_REFUSED[symbol])
    assert "locks[1]" in r.stderr


@pytest.mark.parametrize("symbol", list(ASM_REFUSED))
def test_unpatchable_entry_falls_back_with_auto(ent, plain, redis, tmp_path, symbol):
    """The same with method = "auto" (and with no method): a warn line, the
    program runs unchanged; the patchable lock beside it is still guarded."""
    for how in ({"method": "auto"}, {}):
        cfg = write_config(tmp_path, redis, DEBUG + NO_LINGER +
                           locks(lock("early_exit"), lock(symbol, **how)))
        r = go([ent["asm"]], cfg)
        fell_back(r, plain["asm"], symbol)
        assert acquires(r.stderr, "early_exit") == 2, r.stderr


# ---- 2. post_ledger: every kind of call, every build -------------------------

@pytest.mark.parametrize("v", list(LEDGER_VARIANTS))
def test_ledger_calls_inside_the_executable_are_guarded(ent, redis, tmp_path, v):
    """Direct calls and calls through the stored pointer each take the lock."""
    cfg = write_config(tmp_path, redis, DEBUG + NO_LINGER + locks(lock("post_ledger")))
    c = str(tmp_path / "c")
    with open(c, "w") as f:
        f.write("0\n")
    for mode in ("direct", "fnptr"):
        r = go([ent["ledger-" + v], mode, c, "3"], cfg, cwd=str(tmp_path))
        assert r.returncode == 0, r.stderr
        assert acquires(r.stderr, "post_ledger") == 3, (mode, r.stderr)
        assert patched(r.stderr, "post_ledger"), r.stderr
    assert counter(c) == 6
    assert lock_keys(redis) == []


EXCL = 'locks = ( { symbol = "post_ledger"; key = "ledger:{arg0:str}"; lease_ms = 5000; ' \
       'wait_ms = 30000; method = "%s"; } );\n'


@pytest.mark.parametrize("mode", ["direct", "fnptr"])
@pytest.mark.parametrize("v", list(LEDGER_VARIANTS))
def test_ledger_processes_and_threads_exclude_each_other(ent, redis, tmp_path, v, mode):
    """3 processes x 8 threads x 4 calls: exact (the control loses updates)."""
    cfg = write_config(tmp_path, redis, EXCL % "entry")
    assert race(ent["ledger-" + v], str(tmp_path / "c"), cfg, 3, 8, 4, mode=mode,
                cwd=str(tmp_path)) == 96


def test_ledger_threads_exclude_each_other_with_auto(ent, redis, tmp_path):
    """method = "auto" (a definition in the executable: entry) does the same."""
    cfg = write_config(tmp_path, redis, EXCL % "auto")
    assert race(ent["ledger-O2"], str(tmp_path / "c"), cfg, 1, 8, 6,
                cwd=str(tmp_path)) == 48


@pytest.mark.parametrize("v", ["O0", "O2", "cet", "pg"])
def test_recursive_calls_exclude_each_other(ent, redis, tmp_path, v):
    """post_ledger calling itself (depth 3) from 2 processes x 8 threads,
    half through the stored pointer: exact."""
    cfg = write_config(tmp_path, redis, EXCL % "entry")
    c = str(tmp_path / "c")
    assert race(ent["ledger-" + v], c, cfg, 1, 8, 2, depth=3, cwd=str(tmp_path)) == 48
    assert race(ent["ledger-" + v], c, cfg, 2, 8, 2, mode="fnptr", depth=3,
                cwd=str(tmp_path)) == 96


@pytest.mark.parametrize("v", ["O0", "O2", "nopie"])
def test_recursion_is_reentrant(ent, redis, tmp_path, v):
    """Same key at every level: one acquire per outermost call; the inner
    calls enter again without asking Redis."""
    cfg = write_config(tmp_path, redis, DEBUG + NO_LINGER + locks(lock("post_ledger")))
    c = str(tmp_path / "c")
    r = go([ent["ledger-" + v], "direct", c, "2", "1", "4"], cfg, cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert counter(c) == 8
    assert acquires(r.stderr, "post_ledger") == 2, r.stderr


@pytest.mark.parametrize("v", ["O0", "O2", "nopie"])
def test_each_recursive_call_goes_through_the_wrapper(ent, redis, tmp_path, v):
    """One key per level ({arg1} is the depth): every level, reached by a
    direct call of the function to itself, takes its own lock."""
    cfg = write_config(tmp_path, redis, DEBUG + NO_LINGER +
                       locks(lock("post_ledger", key="rec:{arg1}")))
    c = str(tmp_path / "c")
    r = go([ent["ledger-" + v], "direct", c, "1", "1", "4"], cfg, cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert counter(c) == 4
    for depth in (4, 3, 2, 1):
        assert acquires(r.stderr, "post_ledger", "rec:%d" % depth) == 1, (depth, r.stderr)
    assert lock_keys(redis) == []


# ---- 3. ABI shapes, C++ exceptions, static functions -------------------------

@pytest.mark.parametrize("method", ["entry", "auto"])
@pytest.mark.parametrize("opt", ["O0", "O2"])
def test_every_abi_shape_inside_the_executable(ent, plain, redis, tmp_path, opt, method):
    """abi.c and abi_main.c in one executable: output byte for byte the
    same under the shim, errno included, every call took its lock."""
    cfg = write_config(tmp_path, redis, DEBUG + NO_LINGER +
                       locks(*[lock(s, method=method) for s in ABI_CALLS]))
    r = go([ent["abi-" + opt]], cfg)
    assert r.returncode == 0, r.stderr
    assert r.stdout == plain["abi-" + opt]
    assert "set_errno -1 Numerical result out of range" in r.stdout
    assert "errno kept 0 Interrupted system call" in r.stdout
    for sym, n in ABI_CALLS.items():
        assert acquires(r.stderr, sym) == n, (sym, r.stderr)


@pytest.mark.parametrize("method", ["entry", "auto"])
def test_exception_through_a_member_function_releases_the_lock(ent, redis, tmp_path,
                                                                procs, method):
    """Account::post throws through its patched entry; while the program
    still runs the key is gone, and the next call (not reentrant, wait_ms 0:
    it would be skipped if the lock were still held) takes it again."""
    cfg = write_config(tmp_path, redis, DEBUG + locks(lock(
        CXX_POST, method=method, lease_ms=60000, linger_ms=0, reentrant=False, wait_ms=0)))
    p = procs([ent["cxx"]], cfg)
    assert p.expect("caught") == "caught overdrawn"
    assert p.expect("again") == "again 15"
    assert redis.cmd("EXISTS", "lockshim:" + CXX_POST) == 0
    p.send()
    rc, _, err = p.finish()
    assert rc == 0, err
    assert acquires(err, CXX_POST) == 2, err


@pytest.mark.parametrize("prog,kind", [("jump-O0", "longjmp"), ("jump-O0", "siglongjmp"),
                                       ("jump-fortify", "longjmp")])
def test_longjmp_out_of_a_patched_function_releases_the_lock(ent, redis, tmp_path, procs,
                                                             prog, kind):
    """through() (in the executable) calls back, and the callback longjmps
    out of it: "again 1" with reentrant = false and wait_ms = 0 proves the
    hold was released; the key is gone while the program still runs."""
    cfg = write_config(tmp_path, redis, DEBUG + locks(lock(
        "through", method="entry", lease_ms=60000, reentrant=False, wait_ms=0, linger_ms=0)))
    err = jumped_out_and_released(procs([ent[prog], kind], cfg), redis)
    assert acquires(err, "through") == 2, err


@pytest.mark.parametrize("lib_method", ["entry", "auto"])
def test_each_call_is_wrapped_once(ent, plain, redis, tmp_path, lib_method):
    """exe_cb (entry: defined in the executable) is also called from a library
    through the PLT; lib_twice (entry or relocations) through the PLT and a
    stored pointer. Not reentrant and wait_ms = 0: a call wrapped twice
    would be skipped by its inner wrapper and change the output."""
    assert re.search(r"JUMP_SLOT\s.*\bexe_cb\b", tool("readelf", "-rW", ent["libonce"]))
    relocs = tool("readelf", "-rW", ent["once"])
    assert re.search(r"R_X86_64_64\s.*\blib_twice\b", relocs), relocs
    once = dict(reentrant=False, wait_ms=0, linger_ms=0)
    where = {"object": "libentry_once.so"} if lib_method == "entry" else {}
    cfg = write_config(tmp_path, redis, DEBUG + locks(
        lock("exe_cb", **once), lock("lib_twice", method=lib_method, **where, **once)))
    r = go([ent["once"]], cfg)
    assert r.returncode == 0, r.stderr
    assert r.stdout == plain["once"] == "once 5 11 7 9\n"
    assert acquires(r.stderr, "exe_cb") == 2, r.stderr
    assert acquires(r.stderr, "lib_twice") == 2, r.stderr
    assert lines_at("info", r.stderr) == [] and lines_at("warn", r.stderr) == []


def test_guarding_a_function_the_shim_uses_by_its_entry(progs, redis, tmp_path):
    """libc's write patched at its entry: the shim's own writes (its debug
    lines) reach the patched entry too and must not re-enter a wrapper; the
    program's write(2) is guarded."""
    cfg = write_config(tmp_path, redis, DEBUG + locks(
        lock("write", method="entry", object="libc.so.6", key="own:{symbol}"),
        lock("hold_call", key="own:{symbol}")))
    r = go([progs["driver"], "call:0", "write", "call:0"], cfg)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("call rc=42 errno=0") == 2 and "written\n" in r.stdout, r.stdout
    assert patched(r.stderr, "write"), r.stderr
    assert acquires(r.stderr, "hold_call", "own:hold_call") >= 1, r.stderr
    assert acquires(r.stderr, "write", "own:write") >= 1, r.stderr


def traced(ent):
    """The environment that preloads progs/opentrace.c just ahead of the shim
    (after a sanitizer's runtime): every open() the shim makes is written
    to stderr as "opentrace: PATH"."""
    parts = PRELOAD.split(":")
    parts.insert(len(parts) - 1, ent["opentrace"])
    return {"LD_PRELOAD": ":".join(parts)}


def opened(stderr):
    return [l.split(": ", 1)[1] for l in stderr.splitlines() if l.startswith("opentrace: ")]


def test_executable_not_read_for_a_function_it_imports(ent, redis, tmp_path):
    """Start-up that does not grow with the symbol table: with method auto,
    a lock on a library function the executable imports (printf, an
    undefined dynamic symbol of entry_static: it cannot define it) does not
    open the executable's file to walk its .symtab; its calls are guarded
    through relocations. Control: a lock on its static function opens it
    (and the tracer sees the shim's opens at all)."""
    prog = ent["static"]
    assert re.search(r" UND printf@", tool("readelf", "--dyn-syms", "-W", prog))
    cfg = write_config(tmp_path, redis, DEBUG + NO_LINGER + locks(lock("printf")))
    r = go([prog], cfg, **traced(ent))
    assert r.returncode == 0 and r.stdout == STATIC_OUT, r.stderr
    assert acquires(r.stderr, "printf") == 3, r.stderr
    files = opened(r.stderr)
    assert "/proc/self/exe" not in files and prog not in files, files
    cfg = write_config(tmp_path, redis, DEBUG + NO_LINGER + locks(lock("scale")))
    r = go([prog], cfg, **traced(ent))
    assert r.returncode == 0 and r.stdout == STATIC_OUT, r.stderr
    assert acquires(r.stderr, "scale") == 3, r.stderr
    assert "/proc/self/exe" in opened(r.stderr), r.stderr


def test_executable_with_only_a_sysv_hash_table(ent, plain, redis, tmp_path):
    """An executable with DT_HASH and no DT_GNU_HASH (--hash-style=sysv,
    -rdynamic): its exported gmix is found through DT_HASH, its static mix
    in its .symtab, both patched and guarded; printf, which it imports (an
    undefined symbol in a DT_HASH chain), is guarded without its file being
    opened."""
    prog = ent["ipara-sysv"]
    dyn = tool("readelf", "-d", prog)
    assert "(HASH)" in dyn and "GNU_HASH" not in dyn, dyn
    for symbol, source in (("gmix", "dynamic symbols"), ("mix", "symbol table")):
        cfg = write_config(tmp_path, redis, DEBUG + NO_LINGER + locks(lock(symbol)))
        r = go([prog], cfg)
        assert r.returncode == 0 and r.stdout == plain["ipara"], r.stderr
        assert re.search(r"%s: defined in %s at 0x[0-9a-f]+ \(%s\)" % (
            symbol, re.escape(prog), source), r.stderr), r.stderr
        assert acquires(r.stderr, symbol) == 6, r.stderr
    cfg = write_config(tmp_path, redis, DEBUG + NO_LINGER + locks(lock("printf")))
    r = go([prog], cfg, **traced(ent))
    assert r.returncode == 0 and r.stdout == plain["ipara"], r.stderr
    assert acquires(r.stderr, "printf") == 2, r.stderr
    files = opened(r.stderr)
    assert "/proc/self/exe" not in files and prog not in files, files


def test_entry_of_an_imported_function_in_main_is_refused_saying_so(ent, redis, tmp_path):
    """method = "entry" with object = "main" on a function the executable
    imports: refused, and the object searched is marked "(imports it)"
    (its static tables and debug files were not read for it), with no
    debug-file clause."""
    cfg = write_config(tmp_path, redis, locks(lock("printf", method="entry", object="main")))
    r = go([ent["static"]], cfg)
    refused(r, "printf", "not defined")
    assert "(searched %s (imports it))" % ent["static"] in r.stderr, r.stderr
    assert "debug file" not in r.stderr, r.stderr


@pytest.mark.parametrize("method", ["entry", "auto"])
def test_static_function(ent, plain, redis, tmp_path, method):
    """A static function (.symtab only) of the executable is guarded."""
    cfg = write_config(tmp_path, redis, DEBUG + NO_LINGER + locks(lock("scale", method=method)))
    r = go([ent["static"]], cfg)
    assert r.returncode == 0 and r.stdout == plain["static"] == STATIC_OUT, r.stderr
    assert acquires(r.stderr, "scale") == 3, r.stderr


def test_entry_is_not_patched_while_another_thread_runs(ent, plain, redis, tmp_path):
    """A library's constructor started a thread before the shim's ran: the
    entry could be executing in it, so method "entry" stops the program
    (78, one line) and "auto" falls back to relocations with a warn line."""
    cfg = write_config(tmp_path, redis, locks(lock("scale", method="entry")))
    r = go([ent["threaded"]], cfg)
    assert r.returncode == 78 and r.stdout == "", r.stderr
    assert len(r.stderr.splitlines()) == 1 and "scale" in r.stderr, r.stderr
    # (TSan starts a thread of its own with the constructor's.)
    assert "%d threads are running already" % (2 + TSAN) in r.stderr, r.stderr
    cfg = write_config(tmp_path, redis, locks(lock("scale")))
    r = go([ent["threaded"]], cfg)
    assert r.returncode == 0 and r.stdout == STATIC_OUT, r.stderr
    warns = lines_at("warn", r.stderr)
    assert "threads are running already" in warns[0] and "falling back" in warns[0], r.stderr


def test_a_function_the_shim_wraps_is_refused_with_method_entry(progs, redis, tmp_path):
    """close has a wrapper of the shim's (which runs inside the lock when
    close is guarded): patching its entry too is refused, with the way out."""
    cfg = write_config(tmp_path, redis, locks(lock("close", method="entry")))
    r = go([progs["driver"], "call:0"], cfg)
    assert r.returncode == 78 and r.stdout == "", r.stderr
    assert "the shim wraps it itself" in r.stderr and 'method = "reloc"' in r.stderr


@pytest.mark.parametrize("method", ["entry", "auto"])
@pytest.mark.parametrize("symbol", ["mix", "gmix"])
def test_caller_registers_survive_a_local_function(ent, plain, redis, tmp_path, symbol, method):
    """-fipa-ra (gcc -O2): sum_mix / sum_gmix keep values in call-clobbered
    registers that mix (static) / gmix (global in the executable) are known
    not to touch; through the patched entry they must survive as well (the
    sums are those of the plain run)."""
    _, caller = insns(ent["ipara"], "sum_" + symbol)
    after_call = [i for k, i in enumerate(caller) if k and caller[k - 1][2].startswith("call")]
    assert any(re.search(r"%r(8|9|10|11)|%[re]?(cx|dx|si)", i[2]) for i in after_call), caller
    assert plain["ipara"] == "sum_mix 412 23180\nsum_gmix 427 23240\n"
    cfg = write_config(tmp_path, redis, DEBUG + NO_LINGER + locks(lock(symbol, method=method)))
    r = go([ent["ipara"]], cfg)
    assert r.returncode == 0, r.stderr
    assert r.stdout == plain["ipara"]
    assert acquires(r.stderr, symbol) == 6, r.stderr


# ---- 4. stripped executables ---------------------------------------------------

def test_stripped_without_debug_file_is_refused_with_method_entry(ent, redis, tmp_path):
    cfg = write_config(tmp_path, redis, 'debug_dirs = ( "%s" );\n' % ent["no-debug"] +
                       locks(lock("scale", method="entry")))
    refused(go([ent["stripped"]], cfg), "scale", "not defined")


def test_stripped_without_debug_file_runs_unguarded_with_auto(ent, redis, tmp_path):
    cfg = write_config(tmp_path, redis, DEBUG + 'debug_dirs = ( "%s" );\n' % ent["no-debug"] +
                       locks(lock("scale")))
    r = go([ent["stripped"]], cfg)
    assert r.returncode == 0 and r.stdout == STATIC_OUT, r.stderr
    assert acquires(r.stderr, "scale") == 0
    assert any("scale" in l for l in lines_at("warn", r.stderr)), r.stderr


def tried_paths(ent, prog):
    """The debug-file paths the shim tries for prog (a copy of link-next)
    with debug_dirs = ( no-debug ), in its order."""
    bid, d = build_id(prog), os.path.dirname(prog)
    return [os.path.join(ent["no-debug"], ".build-id", bid[:2], bid[2:] + ".debug"),
            os.path.join(d, "entry_static.debug"),
            os.path.join(d, ".debug", "entry_static.debug"),
            ent["no-debug"] + os.path.join(d, "entry_static.debug")]


@pytest.mark.parametrize("prog", ["link-absent", "link-other"])
def test_debug_file_not_found_names_the_objects_and_paths_tried(ent, redis, tmp_path, prog):
    """A stripped executable whose debug file is not found: the refusal
    (method = "entry"), auto's warn line and check's unguarded line name the
    executable, libc (the other object searched for "entry") and each
    debug-file path tried; one that is there but of another build says so."""
    prog = ent[prog]
    paths = tried_paths(ent, prog)
    other = prog == ent["link-other"]
    libc = re.search(r"(/\S*libc\.so\.6)", tool("ldd", prog)).group(1)
    cfg = write_config(tmp_path, redis, 'debug_dirs = ( "%s" );\n' % ent["no-debug"] +
                       locks(lock("scale", method="entry")))
    r = go([prog], cfg)
    refused(r, "scale", "not defined")
    check = check_prog(tmp_path, cfg, prog)
    assert check.returncode == 1, (check.stdout, check.stderr)
    line = verdict(check.stdout, "scale")
    for text in (r.stderr.splitlines()[0], line):
        assert "searched" in text and prog + " (no symbol table)" in text, text
        assert os.path.basename(libc) in text, text
        for p in paths:
            assert p in text, (p, text)
        assert (paths[1] + " (not its debug file)" in text) == other, text
    cfg = write_config(tmp_path, redis, 'debug_dirs = ( "%s" );\n' % ent["no-debug"] +
                       locks(lock("scale", method="entry", object="main")))
    r = go([prog], cfg)
    refused(r, "scale", "not defined")
    assert prog + " (no symbol table)" in r.stderr and "libc" not in r.stderr, r.stderr
    assert all(p in r.stderr for p in paths), r.stderr
    cfg = write_config(tmp_path, redis, 'debug_dirs = ( "%s" );\n' % ent["no-debug"] +
                       locks(lock("scale")))
    r = go([prog], cfg)
    assert r.returncode == 0 and r.stdout == STATIC_OUT, r.stderr
    warn = [l for l in lines_at("warn", r.stderr) if "scale" in l]
    assert len(warn) == 1, r.stderr
    assert prog + " (no symbol table)" in warn[0] and "libc" not in warn[0], warn[0]
    for p in paths:
        assert p in warn[0], (p, warn[0])
    line = verdict(check_prog(tmp_path, cfg, prog).stdout, "scale")
    assert all(p in line for p in paths), line


def test_debug_paths_tried_are_capped(ent, redis, tmp_path):
    """40 long debug_dirs: the first paths tried are named, the rest counted
    ("and N more"), and the refusal and check's line stay one whole line."""
    dirs = [os.path.join(str(tmp_path), "d%02d-" % i + "x" * 60) for i in range(40)]
    cfg = write_config(tmp_path, redis, "debug_dirs = ( %s );\n" % ", ".join(
        '"%s"' % d for d in dirs) + locks(lock("scale", method="entry")))
    prog = ent["link-absent"]
    r = go([prog], cfg)
    refused(r, "scale", "not defined")
    line = verdict(check_prog(tmp_path, cfg, prog).stdout, "scale")
    bid = build_id(prog)
    for text in (r.stderr.splitlines()[0], line):
        assert len(text) < 1024, len(text)
        assert prog + " (no symbol table)" in text, text
        assert os.path.join(dirs[0], ".build-id", bid[:2], bid[2:] + ".debug") in text, text
        assert dirs[-1] not in text, text
        m = re.search(r" and (\d+) more; name the library in `object` if it is loaded later "
                      r"with dlopen\)", text)
        assert m and int(m.group(1)) > 40, text
    assert line.endswith("(the program would stop with status 78)"), line


DEBUG_FILES = {
    # prog key, debug_dirs key (None: the default)
    "build-id": ("stripped", "dbg-buildid"),
    "debuglink next to it": ("link-next", "no-debug"),
    "debuglink in .debug/": ("link-sub", "no-debug"),
    "debuglink under debug dir + its directory": ("link-root-obj", "link-root"),
}


@pytest.mark.parametrize("how", list(DEBUG_FILES))
@pytest.mark.parametrize("method", ["entry", "auto"])
def test_stripped_with_a_separate_debug_file(ent, redis, tmp_path, how, method):
    prog, dirs = DEBUG_FILES[how]
    cfg = write_config(tmp_path, redis, DEBUG + NO_LINGER +
                       'debug_dirs = ( "%s" );\n' % ent[dirs] +
                       locks(lock("scale", method=method)))
    r = go([ent[prog]], cfg)
    assert r.returncode == 0 and r.stdout == STATIC_OUT, r.stderr
    assert acquires(r.stderr, "scale") == 3, r.stderr


def test_stripped_copies_have_no_symbols(ent):
    for prog in ("stripped", "link-next", "link-sub", "link-root-obj", "stripped-nopie"):
        r = subprocess.run(["nm", ent[prog]], capture_output=True, text=True)
        assert "scale" not in r.stdout, prog
        assert build_id(ent[prog]) == build_id(ent["static-nopie" if "nopie" in prog
                                                   else "static"])
    link = subprocess.run(["readelf", "-p", ".gnu_debuglink", ent["link-next"]],
                          capture_output=True, check=True).stdout
    assert b"entry_static.debug" in link


@pytest.mark.parametrize("form", ["string", "integer"])
@pytest.mark.parametrize("pie", ["", "-nopie"])
def test_offset_with_the_right_build_id(ent, redis, tmp_path, pie, form):
    value = st_value(ent["static" + pie], "scale")
    offset = "0x" + value if form == "string" else int(value, 16)
    for extra in ({"build_id": build_id(ent["static" + pie])}, {}):
        cfg = write_config(tmp_path, redis, DEBUG + NO_LINGER + locks(lock(
            "scale", method="entry", object="main", offset=offset, **extra)))
        r = go([ent["stripped" + pie]], cfg)
        assert r.returncode == 0 and r.stdout == STATIC_OUT, (extra, r.stderr)
        assert acquires(r.stderr, "scale") == 3, (extra, r.stderr)


@pytest.mark.parametrize("pie", ["", "-nopie"])
def test_offset_with_a_wrong_build_id_is_refused(ent, redis, tmp_path, pie):
    for method in ("entry", "auto"):
        cfg = write_config(tmp_path, redis, locks(lock(
            "scale", method=method, object="main",
            offset="0x" + st_value(ent["static" + pie], "scale"),
            build_id=wrong_id(ent["static" + pie]))))
        refused(go([ent["stripped" + pie]], cfg), "scale", "build-id")


# ---- 5. object = a library -----------------------------------------------------

@pytest.mark.parametrize("obj", ["file name", "path", "default"])
def test_bsymbolic_inner_call_is_guarded(ent, plain, redis, tmp_path, obj):
    """lib_outer's direct calls of lib_inner go through lib_inner's patched
    entry: 2 calls of lib_outer, 4 acquires. object is the library's file
    name, its path, or not set (the executable, then the libraries)."""
    where = {"file name": {"object": "libentry_sym.so"}, "path": {"object": ent["libsym"]},
             "default": {}}[obj]
    cfg = write_config(tmp_path, redis, DEBUG + NO_LINGER +
                       locks(lock("lib_inner", method="entry", **where)))
    r = go([ent["sym"]], cfg)
    assert r.returncode == 0 and r.stdout == plain["sym"] == "lib_outer 23 149\n", r.stderr
    assert acquires(r.stderr, "lib_inner") == 4, r.stderr
    assert patched(r.stderr, "lib_inner"), r.stderr


def test_bsymbolic_inner_call_is_not_guarded_by_auto(ent, plain, redis, tmp_path):
    """auto: a library's definition is guarded by relocations, and no
    relocation reaches lib_inner: no acquire."""
    cfg = write_config(tmp_path, redis, DEBUG + NO_LINGER + locks(lock("lib_inner")))
    r = go([ent["sym"]], cfg)
    assert r.returncode == 0 and r.stdout == plain["sym"], r.stderr
    assert acquires(r.stderr, "lib_inner") == 0, r.stderr
    assert not patched(r.stderr, "lib_inner")


def test_library_build_id(ent, plain, redis, tmp_path):
    """build_id of a library object: right, guarded; wrong, refused."""
    bid = build_id(ent["libsym"])
    cfg = write_config(tmp_path, redis, DEBUG + NO_LINGER + locks(lock(
        "lib_inner", method="entry", object="libentry_sym.so", build_id=bid)))
    r = go([ent["sym"]], cfg)
    assert r.returncode == 0 and r.stdout == plain["sym"], r.stderr
    assert acquires(r.stderr, "lib_inner") == 4, r.stderr
    for method in ("entry", "auto"):
        cfg = write_config(tmp_path, redis, locks(lock(
            "lib_inner", method=method, object="libentry_sym.so",
            build_id=wrong_id(ent["libsym"]))))
        refused(go([ent["sym"]], cfg), "lib_inner", "build-id")


def test_dlopened_library_internal_function(ent, plain, redis, tmp_path):
    """plug_step, static in a library dlopened after start-up, called by the
    library itself: guarded once the library is loaded."""
    cfg = write_config(tmp_path, redis, DEBUG + NO_LINGER + locks(
        lock("plug_step", method="entry", object="libentry_plug.so")))
    r = go([ent["plug"], ent["libplug"]], cfg)
    assert r.returncode == 0 and r.stdout == plain["plug"] == "plug_run 20\n", r.stderr
    assert acquires(r.stderr, "plug_step") == 3, r.stderr
    assert lines_at("error", r.stderr) == []


# ---- 6. compiler clones --------------------------------------------------------

def test_constprop_clone_is_warned_about(ent, plain, redis, tmp_path):
    """weigh.constprop.0 (main's calls with step 4) is not guarded, and the
    shim says so; weigh itself is (the one call with a run-time step)."""
    cfg = write_config(tmp_path, redis, DEBUG + NO_LINGER + locks(lock("weigh")))
    r = go([ent["clone"]], cfg)
    assert r.returncode == 0 and r.stdout == plain["clone"], r.stderr
    warns = [l for l in lines_at("warn", r.stderr) if "weigh.constprop.0" in l]
    assert len(warns) == 1 and "not guarded" in warns[0], r.stderr
    assert acquires(r.stderr, "weigh") == 1, r.stderr


def test_cold_clone_is_warned_about(ent, redis, tmp_path, procs):
    assert CXX_POST + ".cold" in tool("nm", ent["cxx"])
    cfg = write_config(tmp_path, redis, locks(lock(CXX_POST)))
    p = procs([ent["cxx"]], cfg)
    assert p.expect("again") == "again 15"
    p.send()
    rc, _, err = p.finish()
    assert rc == 0, err
    warns = [l for l in lines_at("warn", err) if CXX_POST + ".cold" in l]
    assert len(warns) == 1 and "not guarded" in warns[0], err


# ---- 7. lockshim check -c FILE -- PROGRAM --------------------------------------

def test_the_mark_shows_that_main_ran(ent, tmp_path):
    """Control for check's tests: run normally, each program makes its mark."""
    for argv in ([ent["asm"]], [ent["ledger-O2"], "direct", str(tmp_path / "c"), "1"],
                 [ent["static"]], [ent["sym"]], [ent["stripped"]],
                 [ent["plug"], ent["libplug"]]):
        mark = str(tmp_path / "main-ran")
        r = go(argv, cwd=str(tmp_path), ENTRY_MARK=mark)
        assert r.returncode == 0 and os.path.exists(mark), argv
        os.unlink(mark)


def test_check_program_entry_locks(ent, redis, tmp_path):
    cfg = write_config(tmp_path, redis, locks(*[lock(s, method="entry")
                                                for s in ASM_PATCHABLE]))
    r = check_prog(tmp_path, cfg, ent["asm"])
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert "%d lock(s)" % len(ASM_PATCHABLE) in r.stdout and "redis: ok" in r.stdout
    for s in ASM_PATCHABLE:
        assert re.match(r"%s: entry in .*entry_asm" % s, verdict(r.stdout, s)), r.stdout


@pytest.mark.parametrize("v", ["O2", "pg", "nopie"])
def test_check_program_ledger(ent, redis, tmp_path, v):
    cfg = write_config(tmp_path, redis, locks(lock("post_ledger")))
    r = check_prog(tmp_path, cfg, ent["ledger-" + v], "direct", str(tmp_path / "c"), "1")
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert re.match(r"post_ledger: entry in .*entry_ledger-" + v, verdict(r.stdout,
                                                                            "post_ledger"))
    assert not os.path.exists(str(tmp_path / "c"))


def test_check_program_refused_entry(ent, redis, tmp_path):
    """method = "entry" on a 3-byte function: check reports it unguarded with
    the reason and exits 1 (README: where a real run would stop with 78)."""
    cfg = write_config(tmp_path, redis, locks(lock("tiny", method="entry")))
    r = check_prog(tmp_path, cfg, ent["asm"])
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert re.match(r"tiny: unguarded: .*3 bytes long", verdict(r.stdout, "tiny")), r.stdout


def test_check_program_auto_fallback_is_unguarded(ent, redis, tmp_path):
    """tiny falls back to relocations, and no relocation reaches it: not
    guarded, exit 1; rip_first beside it is an entry."""
    cfg = write_config(tmp_path, redis, locks(lock("rip_first"), lock("tiny")))
    r = check_prog(tmp_path, cfg, ent["asm"])
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert re.match(r"tiny: (unguarded|reloc \(0 call sites\))", verdict(r.stdout, "tiny"))
    assert re.match(r"rip_first: entry in .*entry_asm", verdict(r.stdout, "rip_first"))


def test_check_program_reloc_and_entry_in_a_library(ent, redis, tmp_path):
    cfg = write_config(tmp_path, redis, locks(
        lock("lib_inner", method="entry", object="libentry_sym.so"), lock("lib_outer")))
    r = check_prog(tmp_path, cfg, ent["sym"])
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert re.match(r"lib_inner: entry in .*libentry_sym\.so", verdict(r.stdout, "lib_inner"))
    m = re.match(r"lib_outer: reloc \((\d+) call sites?\) in ", verdict(r.stdout, "lib_outer"))
    assert m and int(m.group(1)) >= 1, r.stdout


def test_check_program_library_function_auto_without_call_sites(ent, redis, tmp_path):
    cfg = write_config(tmp_path, redis, locks(lock("lib_inner")))
    r = check_prog(tmp_path, cfg, ent["sym"])
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert re.match(r"lib_inner: (unguarded|reloc \(0 call sites\))",
                    verdict(r.stdout, "lib_inner"))


@pytest.mark.parametrize("method", ["entry", "reloc", "auto"])
def test_check_program_dlopened_library_is_deferred(ent, plain, redis, tmp_path, method):
    """The library plug_step lives in is dlopened by main, which check never
    runs: "deferred" naming the library, not "unguarded", and exit 0 (with
    "entry" a real run guards it: test_dlopened_library_internal_function),
    and a real run warns about nothing at start-up. Controls: the
    same name as a path to no file, and a lock in an object loaded at
    start-up that does not define it, are unguarded (exit 1)."""
    cfg = write_config(tmp_path, redis, locks(
        lock("plug_step", method=method, object="libentry_plug.so")))
    r = check_prog(tmp_path, cfg, ent["plug"], ent["libplug"])
    assert r.returncode == 0, (r.stdout, r.stderr)
    line = verdict(r.stdout, "plug_step", "deferred")
    assert line.startswith("plug_step: deferred: libentry_plug.so is not loaded"), line
    r = go([ent["plug"], ent["libplug"]], cfg)
    assert r.returncode == 0 and r.stdout == plain["plug"], r.stderr
    assert lines_at("warn", r.stderr) == [] and lines_at("error", r.stderr) == [], r.stderr
    for obj in (str(tmp_path / "libentry_plug.so"), "libc.so.6"):
        cfg = write_config(tmp_path, redis, locks(
            lock("plug_step", method=method, object=obj)))
        r = check_prog(tmp_path, cfg, ent["plug"], ent["libplug"])
        assert r.returncode == 1, (obj, r.stdout, r.stderr)
        assert verdict(r.stdout, "plug_step").startswith("plug_step: unguarded"), r.stdout


def test_check_program_typo_is_unguarded(ent, redis, tmp_path):
    cfg = write_config(tmp_path, redis, locks(lock("scale"), lock("scalee")))
    r = check_prog(tmp_path, cfg, ent["static"])
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert re.match(r"scale: entry in .*entry_static", verdict(r.stdout, "scale"))
    assert verdict(r.stdout, "scalee").startswith("scalee: unguarded: ")


def test_check_program_stripped_with_debug_file_and_offset(ent, redis, tmp_path):
    cfg = write_config(tmp_path, redis, 'debug_dirs = ( "%s" );\n' % ent["dbg-buildid"] +
                       locks(lock("scale", method="entry")))
    r = check_prog(tmp_path, cfg, ent["stripped"])
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert re.match(r"scale: entry in .*entry_static", verdict(r.stdout, "scale"))
    cfg = write_config(tmp_path, redis, locks(lock(
        "scale", method="entry", object="main", offset="0x" + st_value(ent["static"], "scale"),
        build_id=build_id(ent["static"]))))
    r = check_prog(tmp_path, cfg, ent["stripped"])
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert re.match(r"scale: entry in .*entry_static", verdict(r.stdout, "scale"))


@pytest.mark.parametrize("method", ["entry", "auto"])
def test_check_program_wrong_build_id(ent, redis, tmp_path, method):
    """A build_id that does not match: unguarded, saying build-id; exit 1."""
    cfg = write_config(tmp_path, redis, locks(lock(
        "scale", method=method, object="main", offset="0x" + st_value(ent["static"], "scale"),
        build_id=wrong_id(ent["static"]))))
    r = check_prog(tmp_path, cfg, ent["stripped"])
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert re.match(r"scale: unguarded: .*build-id", verdict(r.stdout, "scale")), r.stdout


def test_check_program_redis_unreachable(ent, tmp_path):
    cfg = write_config(tmp_path, None, 'redis = { port = %d; };\n' % free_port() +
                       locks(lock("scale")))
    r = check_prog(tmp_path, cfg, ent["static"])
    assert r.returncode == 69, (r.stdout, r.stderr)


def test_check_program_usage(ent, redis, tmp_path):
    """A program without -- before it is a usage error (64); it never runs."""
    cfg = write_config(tmp_path, redis, locks(lock("scale")))
    mark = str(tmp_path / "main-ran")
    r = cli("check", "-c", cfg, ent["static"], ENTRY_MARK=mark)
    assert r.returncode == 64, (r.stdout, r.stderr)
    assert not os.path.exists(mark)
