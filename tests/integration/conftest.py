# SPDX-License-Identifier: MIT
"""Fixtures for lockshim's integration tests.

Every test gets its own redis-server on a free 127.0.0.1 port and a unix
socket, started and stopped by the fixture (the log is printed when a test
fails). The legacy programs under progs/ are built once per session into a
temporary directory. Programs run under the shim as separate processes with
timeouts scaled by LOCKSHIM_TEST_TIMEOUT_MULTIPLIER. LOCKSHIM_BUILD selects
the build directory (build/asan for the sanitizer run).
"""
import os
import shutil
import signal
import subprocess
import tempfile
import time

import pytest

from resp import Resp, RespError, free_port  # noqa: F401 (used by tests)

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BUILD = os.path.join(ROOT, os.environ.get("LOCKSHIM_BUILD", "build"))
SHIM = os.path.join(BUILD, "liblockshim.so")
CLI = os.path.join(BUILD, "lockshim")
PROGS = os.path.join(os.path.dirname(__file__), "progs")
MULT = float(os.environ.get("LOCKSHIM_TEST_TIMEOUT_MULTIPLIER", "1"))
ASAN = bool(os.environ.get("LOCKSHIM_TEST_ASAN"))
TIMEOUT = 60 * MULT


def _asan_runtime():
    out = subprocess.run(["gcc", "-print-file-name=libasan.so"], capture_output=True,
                         text=True, check=True).stdout.strip()
    return os.path.realpath(out)


PRELOAD = (_asan_runtime() + ":" if ASAN else "") + SHIM


def wait_for(pred, timeout=10.0, what="condition"):
    """Polls an external observable (Redis state, a file) until pred() holds."""
    deadline = time.monotonic() + timeout * MULT
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.01)
    raise AssertionError("timed out waiting for " + what)


class RedisServer:
    def __init__(self, password=None):
        self.dir = tempfile.mkdtemp(prefix="lsr")
        self.sock = os.path.join(self.dir, "redis.sock")
        self.log = os.path.join(self.dir, "redis.log")
        self.port = free_port()
        self.password = password
        self.proc = None

    def start(self):
        args = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                "--unixsocket", self.sock, "--unixsocketperm", "700",
                "--save", "", "--appendonly", "no", "--daemonize", "no",
                "--logfile", self.log, "--dir", self.dir]
        if self.password:
            args += ["--requirepass", self.password]
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL)
        wait_for(self._ready, what="redis-server on port %d" % self.port)
        return self

    def _ready(self):
        if self.proc.poll() is not None:
            raise AssertionError("redis-server exited: %s" % self.tail())
        try:
            c = self.client()
            ok = c.cmd("PING") == "PONG"
            c.close()
            return ok
        except (OSError, ConnectionError):
            return False

    def client(self):
        return Resp(port=self.port, password=self.password)

    def cmd(self, *args):
        c = self.client()
        try:
            return c.cmd(*args)
        finally:
            c.close()

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def tail(self):
        try:
            with open(self.log) as f:
                return f.read()[-2000:]
        except OSError:
            return ""

    def cleanup(self):
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def connections(server):
    """How many connections server (anything with cmd()) has accepted."""
    stats = server.cmd("INFO", "stats")
    return int(stats.split("total_connections_received:")[1].split()[0])


def call_failed(request):
    """Whether the test of a fixture's request failed in its call phase."""
    return bool(getattr(request.node, "rep_call", None) and request.node.rep_call.failed)


def started(request, thing):
    """The body of a fixture around thing (start(), logs(), stop()): yields
    it once started; prints its logs if the test failed; stops it, also
    when start() failed half-way."""
    try:
        thing.start()
        yield thing
        if call_failed(request):
            print(thing.logs())
    finally:
        thing.stop()


def start_servers(request, make, label):
    """The body of a fixture starting servers: yields start(*args, **kw),
    which starts make(*args, **kw) and returns it; each one is stopped (by
    pid) when the test ends, with its log, headed label(server), printed
    if the test failed."""
    started = []

    def start(*args, **kw):
        s = make(*args, **kw)
        started.append(s)
        return s.start()
    yield start
    failed = call_failed(request)
    for s in started:
        if failed:
            print("---- %s log ----\n%s" % (label(s), s.tail()))
        s.cleanup()


@pytest.fixture
def redis(request):
    r = RedisServer().start()
    yield r
    if call_failed(request):
        print("---- redis-server log ----\n" + r.tail())
    r.cleanup()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, "rep_" + rep.when, rep)


# ---- legacy programs ---------------------------------------------------------

def cc(out, srcs, *flags, cxx=False):
    cmd = ["g++" if cxx else "gcc", "-g", "-o", out] + \
          [os.path.join(PROGS, s) for s in srcs] + list(flags)
    subprocess.run(cmd, check=True)
    return out


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
    return p


# ---- running programs under the shim ----------------------------------------

AUX_SUFFIXES = (":q", ":qx", ":due")


def lock_keys(redis, pattern="lockshim:*"):
    """Lock keys matching pattern, without the short-lived auxiliary keys
    (waiter queues and signal lists) that hang off them."""
    return sorted(k for k in redis.cmd("KEYS", pattern)
                  if not k.endswith(AUX_SUFFIXES) and ":w:" not in k)


def write_config(tmp_path, redis, body, redis_extra=""):
    """Writes a config for redis (a RedisServer or None) plus body; returns its path."""
    path = os.path.join(str(tmp_path), "lockshim.cfg")
    head = ""
    if redis is not None:
        head = 'redis = { host = "127.0.0.1"; port = %d; %s };\n' % (redis.port, redis_extra)
    with open(path, "w") as f:
        f.write(head + body)
    return path


def shim_env(cfg, preload=True, **extra):
    env = dict(os.environ)
    env.pop("LOCKSHIM_LOG_LEVEL", None)
    env.pop("LD_PRELOAD", None)
    if preload:
        env["LD_PRELOAD"] = PRELOAD
        env["LOCKSHIM_CONFIG"] = cfg
    if ASAN:
        env["ASAN_OPTIONS"] = "detect_leaks=0:verify_asan_link_order=0:abort_on_error=0"
    env.update({k: str(v) for k, v in extra.items()})
    return env


def run(argv, cfg=None, preload=True, timeout=None, **extra):
    """Runs argv to completion; returns the CompletedProcess (text mode)."""
    return subprocess.run(argv, env=shim_env(cfg, preload and cfg is not None, **extra),
                           capture_output=True, text=True, timeout=timeout or TIMEOUT,
                           stdin=subprocess.DEVNULL)


class Proc:
    """A program running in the background, read line by line."""

    def __init__(self, argv, cfg=None, preload=True, **extra):
        self.p = subprocess.Popen(argv, env=shim_env(cfg, preload and cfg is not None, **extra),
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)

    def expect(self, prefix):
        """Reads stdout lines until one starts with prefix; returns it."""
        seen = []
        while True:
            line = self.p.stdout.readline()
            if not line:
                raise AssertionError("EOF before %r; saw %r; stderr: %s"
                                     % (prefix, seen, self.p.stderr.read()))
            if line.startswith(prefix):
                return line.strip()
            seen.append(line)

    def send(self, line="go"):
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()

    def signal(self, sig):
        os.kill(self.p.pid, sig)

    def finish(self, timeout=None):
        """Waits for exit; returns (returncode, rest of stdout, stderr)."""
        out, err = self.p.communicate(timeout=timeout or TIMEOUT)
        return self.p.returncode, out, err

    def kill(self):
        if self.p.poll() is None:
            self.p.kill()
            self.p.communicate()


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
