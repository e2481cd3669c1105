# SPDX-License-Identifier: MIT
"""What every integration test uses: where the build is, the knobs read
from the environment, running programs under the shim, polling.

LOCKSHIM_BUILD selects the build directory (build/asan, build/tsan for the
sanitizer runs); LOCKSHIM_TEST_ASAN=1 preloads the ASan runtime ahead of the
shim, LOCKSHIM_TEST_TSAN=1 the TSan runtime, with every report written to
TSAN_LOG_DIR (conftest.py fails the test that left one);
LOCKSHIM_TEST_TIMEOUT_MULTIPLIER scales every timeout and time bound.
"""
import json
import os
import subprocess
import time

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/integration
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
BUILD = os.path.join(ROOT, os.environ.get("LOCKSHIM_BUILD", "build"))
SHIM = os.path.join(BUILD, "liblockshim.so")
CLI = os.path.join(BUILD, "lockshim")
PROGS = os.path.join(HERE, "progs")
MULT = float(os.environ.get("LOCKSHIM_TEST_TIMEOUT_MULTIPLIER", "1"))
ASAN = bool(os.environ.get("LOCKSHIM_TEST_ASAN"))
TSAN = bool(os.environ.get("LOCKSHIM_TEST_TSAN"))
TIMEOUT = 60 * MULT
# Where the TSan runtime writes its reports (tsan.<pid>), one directory per
# pytest process.
TSAN_LOG_DIR = os.path.join(BUILD, "tsan-reports.%d" % os.getpid())


def _runtime(name):
    out = subprocess.run(["gcc", "-print-file-name=" + name], capture_output=True,
                         text=True, check=True).stdout.strip()
    return os.path.realpath(out)


PRELOAD = (_runtime("libasan.so") + ":" if ASAN else "") + \
          (_runtime("libtsan.so") + ":" if TSAN else "") + SHIM


def others_can_read(*paths):
    """Whether a user with no rights of its own (nobody, a fresh uid) can
    open each of paths: every directory above it searchable by others, the
    file readable by others. A clone under a 0700 directory (mktemp -d)
    hides the shim from such a user; the tests that run one skip there."""
    for p in paths:
        p = os.path.realpath(p)
        if not os.stat(p).st_mode & 0o004:
            return False
        d = os.path.dirname(p)
        while d != "/":
            if not os.stat(d).st_mode & 0o001:
                return False
            d = os.path.dirname(d)
    return True


def wait_for(pred, timeout=10.0, what="condition"):
    """Polls an external observable (Redis state, a file) until pred() holds."""
    deadline = time.monotonic() + timeout * MULT
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.01)
    raise AssertionError("timed out waiting for " + what)


# ---- legacy programs ---------------------------------------------------------

def cc(out, srcs, *flags, cxx=False):
    cmd = ["g++" if cxx else "gcc", "-g", "-o", out] + \
          [os.path.join(PROGS, s) for s in srcs] + list(flags)
    subprocess.run(cmd, check=True)
    return out


# ---- running programs under the shim ----------------------------------------

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
    if TSAN:
        env["TSAN_OPTIONS"] = tsan_options()
    env.update({k: str(v) for k, v in extra.items()})
    return env


def preload_only(shim):
    """LD_PRELOAD with shim instead of the build's (the sanitizer runtime kept)."""
    return PRELOAD.replace(SHIM, shim)


def tsan_options():
    """TSAN_OPTIONS for a program under the TSan build: every report goes
    to a file in TSAN_LOG_DIR and makes the program exit with status 66. A
    child forked by a multi-threaded process may start threads (TSan checks
    nothing in such a child; it would die by default), an exit does not
    wait a second for the threads still running (atexit_sleep_ms), and a
    crash a test injects stays a crash (handle_segv)."""
    os.makedirs(TSAN_LOG_DIR, exist_ok=True)
    return "log_path=%s:exitcode=66:halt_on_error=0:second_deadlock_stack=1:" \
        "die_after_fork=0:atexit_sleep_ms=0:handle_segv=0" \
        % os.path.join(TSAN_LOG_DIR, "tsan")


def run(argv, cfg=None, preload=True, timeout=None, encoding="utf-8", **extra):
    """Runs argv to completion; returns the CompletedProcess, its output
    decoded (a byte that is not UTF-8 as \\xNN: the test sees it, the
    harness does not fail on it; encoding="latin-1" keeps every byte)."""
    return subprocess.run(argv, env=shim_env(cfg, preload and cfg is not None, **extra),
                           capture_output=True, encoding=encoding, errors="backslashreplace",
                           timeout=timeout or TIMEOUT, stdin=subprocess.DEVNULL)


class Proc:
    """A program running in the background, read line by line."""

    def __init__(self, argv, cfg=None, preload=True, **extra):
        self.p = subprocess.Popen(argv, env=shim_env(cfg, preload and cfg is not None, **extra),
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True,
                                  errors="backslashreplace")

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


def status_by_key(cfg, *args):
    """`lockshim status --json` of cfg (args: more of its arguments), which
    must succeed: {key: its holder's object}."""
    r = run([CLI, "status", "-c", cfg, "--json"] + list(args))
    assert r.returncode == 0, r.stderr
    return {o["key"]: o for o in map(json.loads, r.stdout.splitlines())}


def lib_program(d, name, lib_c, decl, call, *lib_flags):
    """Builds, in the new directory d, lib<name>.so from the C text lib_c
    (with lib_flags) and the program <name> linked with it (rpath d),
    whose main is `decl` then `return call;` (decl declares the library's
    function, e.g. "int exec_call(int x);"). Returns the program's path."""
    d.mkdir()
    (d / "lib.c").write_text(lib_c)
    (d / "main.c").write_text("%s\nint main(void) { return %s; }\n" % (decl, call))
    cc(str(d / ("lib%s.so" % name)), [str(d / "lib.c")], "-O2", "-shared", "-fPIC", *lib_flags)
    return cc(str(d / name), [str(d / "main.c")], "-O2", "-L" + str(d),
              "-Wl,-rpath," + str(d), "-l" + name)
