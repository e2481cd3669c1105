# SPDX-License-Identifier: MIT
"""Fixtures for lockshim's integration tests (the plain helpers they use
are in support/; tests/README.md describes both).

Every test gets its own redis-server on a free 127.0.0.1 port and a unix
socket, started and stopped by the fixture (the log is printed when a test
fails). The legacy programs under progs/ and support/'s programs (the
counter worker, the blocking holder, the hostile program, the TLS PKI) are
built once per session into temporary directories. Programs run under the
shim as separate processes with timeouts scaled by
LOCKSHIM_TEST_TIMEOUT_MULTIPLIER. LOCKSHIM_BUILD selects the build
directory (build/asan, build/tsan for the sanitizer runs),
LOCKSHIM_TEST_ASAN=1 preloads the ASan runtime with the shim,
LOCKSHIM_TEST_TSAN=1 the TSan runtime; then a test during which any
program wrote a ThreadSanitizer report fails with the report.
"""
import os
import signal

import pytest

from support.scenarios import build_hostile
from support.server import RedisServer, call_failed, started
from support.sets import build as build_sets
from support.topology import Masters
from support.tls import make_pki
from support.util import TSAN, TSAN_LOG_DIR, Proc, cc
from support.workers import Bg, build_block, build_worker


@pytest.fixture
def masters(request):
    """Three Redlock masters (support.topology.Masters), stopped at the end;
    their logs printed when the test failed."""
    yield from started(request, Masters())


@pytest.fixture
def redis(request):
    r = RedisServer().start()
    yield r
    if call_failed(request):
        print("---- redis-server log ----\n" + r.tail())
    r.cleanup()


@pytest.fixture(autouse=True)
def tsan_reports():
    """Under LOCKSHIM_TEST_TSAN: fails the test if a program it ran wrote a
    ThreadSanitizer report (support.util.tsan_options sends them to
    TSAN_LOG_DIR), with the reports; each is then moved aside."""
    yield
    if not TSAN or not os.path.isdir(TSAN_LOG_DIR):
        return
    reports = []
    for name in sorted(os.listdir(TSAN_LOG_DIR)):
        if name.endswith(".seen"):
            continue
        path = os.path.join(TSAN_LOG_DIR, name)
        with open(path, errors="replace") as f:
            reports.append(f.read())
        os.rename(path, path + ".seen")
    reports = [r for r in reports if r]
    if reports:
        pytest.fail("ThreadSanitizer reported:\n" + "\n".join(reports), pytrace=False)


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "timing: the test asserts a time bound or forces a race; "
        "`make test-repeat` runs these RUNS times in a row")
    # The programs under test start with the default action for the signals
    # the tests send, whatever started pytest: under nohup (SIGHUP ignored)
    # or as a shell's background job (SIGINT, SIGQUIT ignored) they would
    # inherit SIG_IGN, which a shell's trap cannot undo.
    for sig in (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGTERM):
        if signal.getsignal(sig) == signal.SIG_IGN:
            signal.signal(sig, signal.SIG_DFL)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, "rep_" + rep.when, rep)


# ---- legacy programs ---------------------------------------------------------

@pytest.fixture(scope="session")
def progs(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("progs"))
    rp = "-Wl,-rpath," + d
    lib = ["-L" + d, rp]
    p = {"dir": d}
    cc(os.path.join(d, "libledger.so"), ["ledger.c"], "-O2", "-shared", "-fPIC")
    os.mkdir(os.path.join(d, "plugins"))
    cc(os.path.join(d, "plugins", "libplugin.so"), ["ledger.c"], "-O2", "-shared", "-fPIC")
    for name, extra in [("ledger", ["-Wl,-rpath,$ORIGIN/plugins"]), ("ledger_noplt", ["-fno-plt"]),
                        ("ledger_now", ["-Wl,-z,relro,-z,now"])]:
        p[name] = cc(os.path.join(d, name), ["ledger_main.c"], "-O2", *extra, *lib,
                     "-lledger", "-ldl", "-lpthread")
    cc(os.path.join(d, "libtarget.so"), ["target.c"], "-O2", "-shared", "-fPIC")
    p["driver"] = cc(os.path.join(d, "driver"), ["driver.c"], "-O2", *lib, "-ltarget")
    p["own_hiredis"] = cc(os.path.join(d, "own_hiredis"), ["own_hiredis.c"], "-O2", *lib,
                          "-ltarget", "-lhiredis")
    p["local"] = cc(os.path.join(d, "local"), ["local.c"], "-O2", "-rdynamic")
    cc(os.path.join(d, "libabi.so"), ["abi.c"], "-O0", "-shared", "-fPIC")
    p["abi"] = cc(os.path.join(d, "abi"), ["abi_main.c"], "-O2", *lib, "-labi")
    cc(os.path.join(d, "libthrow.so"), ["throw.cc"], "-O2", "-shared", "-fPIC", cxx=True)
    p["throw"] = cc(os.path.join(d, "throw"), ["throw_main.cc"], "-O2", *lib, "-lthrow",
                    cxx=True)
    cc(os.path.join(d, "libjump.so"), ["jump.c"], "-O2", "-shared", "-fPIC")
    p["jump"] = cc(os.path.join(d, "jump"), ["jump_main.c"], "-O0", *lib, "-ljump")
    p["jump_fortify"] = cc(os.path.join(d, "jump_fortify"), ["jump_main.c"], "-O2",
                           "-D_FORTIFY_SOURCE=2", *lib, "-ljump")
    p["failinj"] = cc(os.path.join(d, "libfailinj.so"), ["failinj.c"], "-O2", "-shared",
                      "-fPIC", "-ldl")
    p["failinj_probe"] = cc(os.path.join(d, "failinj_probe"), ["failinj_probe.c"], "-O2",
                            "-lpthread")
    return p


@pytest.fixture(scope="session")
def worker_progs(progs, tmp_path_factory):
    """support/workers.py's programs, by name: "worker" (on progs'
    libledger.so) and "block"."""
    d = str(tmp_path_factory.mktemp("workers"))
    return {"worker": build_worker(d, progs["dir"]), "block": build_block(d)}


@pytest.fixture(scope="session")
def sets_prog(tmp_path_factory):
    """support/sets.py's observed program (test_sets.py, test_local.py)."""
    return build_sets(str(tmp_path_factory.mktemp("sets")))


@pytest.fixture(scope="session")
def hostile(tmp_path_factory):
    """progs/hostile.c on its library (support/scenarios.py)."""
    return build_hostile(str(tmp_path_factory.mktemp("hostile")))


@pytest.fixture(scope="session")
def pki(tmp_path_factory):
    """Paths of the test PKI's certificates and keys, by name (support/tls.py)."""
    return make_pki(str(tmp_path_factory.mktemp("pki")))


# ---- running programs under the shim ----------------------------------------

@pytest.fixture
def procs():
    """Tracks background programs so each one is stopped when the test ends."""
    started = []

    def start(*a, **kw):
        p = Proc(*a, **kw)
        started.append(p)
        return p
    yield start
    for p in started:
        if p.p.poll() is None:
            try:
                os.kill(p.p.pid, signal.SIGCONT)
            except OSError:
                pass
        p.kill()


@pytest.fixture
def bg(tmp_path):
    """Starts programs in the background: start(argv, cfg, **env) returns a
    support.workers.Bg (stderr into a file of tmp_path); each is stopped
    when the test ends."""
    started_ = []

    def start(argv, cfg, **env):
        b = Bg(argv, cfg, str(tmp_path / ("stderr%d" % len(started_))), **env)
        started_.append(b)
        return b
    yield start
    for b in started_:
        b.stop()
