# SPDX-License-Identifier: MIT
"""The shim says what it cannot guard, and agrees with itself.

- the start-up report: a typo, a function called only inside the executable
  (exported or not, stripped or not) are `warn` lines; a library function
  the program does not use is only `info`;
- `strict` (top level, `defaults`, per lock) turns an unguardable lock into
  exit 78 before main;
- `lockshim run` refuses programs the shim cannot be loaded into (static,
  set-user-ID, scripts with a static interpreter) instead of running them
  unguarded;
- `lockshim check` validates what the shim validates (log_file,
  LOCKSHIM_LOG_LEVEL) and tests the server with the commands the shim sends
  (ACL users without scripts, Cluster nodes, replicas, TLS-only ports fail
  with their cause);
- control characters from program data or the config never split or forge
  a log line;
- the setup checks: install-deps.sh names missing packages, and the link
  fails on an unresolved symbol.
"""
import os
import re
import shutil
import socket
import ssl
import stat
import subprocess

import pytest

from resp import free_port
from support.server import RedisServer, start_servers
from support.util import ASAN, CLI, ROOT, TIMEOUT, cc, run, shim_env, wait_for, write_config

HOLD = '{ symbol = "hold_call"; }'
FORGED = "lockshim[1] driver: error: forged"
LOG_LINE = re.compile(rb"lockshim\[\d+\] \S+: (error|warn|info|debug): [^\r]*")


# ---- helpers -----------------------------------------------------------------

def locks(*entries):
    return "locks = ( %s );\n" % ", ".join(entries)


def lines_at(level, stderr):
    """The shim's log lines of one level."""
    return [l for l in stderr.splitlines() if re.match(r"lockshim\[\d+\] \S+: %s: " % level, l)]


def cli(*args, **env):
    """Runs the lockshim command (not under the shim itself)."""
    return subprocess.run([CLI] + list(args), env=shim_env(None, preload=False, **env),
                          capture_output=True, text=True, timeout=TIMEOUT,
                          stdin=subprocess.DEVNULL)


def check(cfg, **env):
    return cli("check", "-c", cfg, **env)


def config_for(tmp_path, port, body=locks(HOLD)):
    """A config pointing at 127.0.0.1:port (any server, not only the fixture's)."""
    return write_config(tmp_path, None, 'redis = { port = %d; };\n%s' % (port, body))


@pytest.fixture(scope="module")
def mine(tmp_path_factory):
    """This file's programs: internal (its function internal_step neither
    exported nor called through a relocation), a stripped copy, a static
    copy."""
    d = str(tmp_path_factory.mktemp("reporting"))
    p = {"internal": cc(os.path.join(d, "internal"), ["internal.c"], "-O2")}
    p["stripped"] = os.path.join(d, "internal-stripped")
    shutil.copy(p["internal"], p["stripped"])
    subprocess.run(["strip", p["stripped"]], check=True)
    p["static"] = cc(os.path.join(d, "internal-static"), ["internal.c"], "-O2", "-static")
    return p


class Server(RedisServer):
    """A redis-server with extra arguments (cluster node, replica, TLS port),
    on 127.0.0.1 only."""

    def __init__(self, *extra, tls_ca=None):
        super().__init__()
        self.extra = list(extra)
        self.tls_ca = tls_ca  # set: the port speaks TLS only, with this CA

    def start(self):
        args = ["redis-server", "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                "--daemonize", "no", "--logfile", self.log, "--dir", self.dir]
        if self.tls_ca:
            args += ["--port", "0", "--tls-port", str(self.port)]
        else:
            args += ["--port", str(self.port)]
        return self.launch(args + self.extra, "redis-server %s" % " ".join(self.extra))

    def _ready(self):
        if not self.tls_ca:
            return super()._ready()
        if self.proc.poll() is not None:
            raise AssertionError("redis-server exited: %s" % self.tail())
        return tls_ping(self.port, self.tls_ca)


def tls_ping(port, cafile):
    """PINGs a TLS port, verifying the server against cafile."""
    ctx = ssl.create_default_context(cafile=cafile)
    ctx.check_hostname = False
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
            with ctx.wrap_socket(raw) as s:
                s.sendall(b"*1\r\n$4\r\nPING\r\n")
                return s.recv(16).startswith(b"+PONG")
    except (OSError, ssl.SSLError):
        return False


@pytest.fixture
def servers(request):
    """Starts extra redis-servers; each is stopped (by pid) when the test ends."""
    yield from start_servers(request, Server, lambda s: "redis-server " + " ".join(s.extra))


# ---- 1. the start-up report --------------------------------------------------

def test_typo_symbol_is_a_warning(progs, redis, tmp_path):
    """A configured symbol no loaded object calls or defines is a warn line at
    the default level; the guarded symbol next to it is not reported and works."""
    cfg = write_config(tmp_path, redis, locks(HOLD, '{ symbol = "hold_calll"; }'))
    r = run([progs["driver"], "call:0"], cfg)
    assert r.returncode == 0 and "call rc=42 errno=0" in r.stdout, r.stderr
    warns = lines_at("warn", r.stderr)
    assert len(warns) == 1, r.stderr
    assert "hold_calll: no loaded object calls or defines it" in warns[0]


@pytest.mark.parametrize("method", ["reloc", "auto"])
def test_function_inside_the_executable_is_a_warning(mine, redis, tmp_path, method):
    """A function of the executable that is not exported and only called from
    inside it: with method "reloc" the shim says at warn that its calls
    cannot be caught; with "auto" it first says that its entry (4 bytes:
    lea; ret) is too short for a jump and that it falls back to relocations.
    The program runs."""
    cfg = write_config(tmp_path, redis, locks('{ symbol = "internal_step"; method = "%s"; }'
                                              % method))
    r = run([mine["internal"]], cfg)
    assert r.returncode == 0 and r.stdout == "internal 42\n", r.stderr
    warns = lines_at("warn", r.stderr)
    if method == "auto":
        assert "cannot patch the entry of internal_step" in warns[0]
        assert "function is 4 bytes long" in warns[0]
        assert "falling back to relocations" in warns.pop(0)
    assert len(warns) == 1, r.stderr
    assert "internal_step is defined in the executable" in warns[0]
    assert "cannot be caught" in warns[0]


def test_function_of_a_stripped_executable_is_still_a_warning(mine, redis, tmp_path):
    """The same executable stripped: the symbol is found nowhere, still a warn line."""
    cfg = write_config(tmp_path, redis, locks('{ symbol = "internal_step"; }'))
    r = run([mine["stripped"]], cfg)
    assert r.returncode == 0 and r.stdout == "internal 42\n", r.stderr
    warns = lines_at("warn", r.stderr)
    assert len(warns) == 1, r.stderr
    assert "internal_step: no loaded object calls or defines it" in warns[0]


def test_symbol_defined_in_the_executable_is_reported(progs, redis, tmp_path):
    cfg = write_config(tmp_path, redis, 'locks = ( { symbol = "local_step"; } );\n')
    r = run([progs["local"]], cfg)
    assert r.returncode == 0 and r.stdout == "local 42\n"
    assert "local_step is defined in the executable" in r.stderr
    assert "cannot be caught" in r.stderr


def test_unused_library_function_is_only_info(progs, redis, tmp_path):
    """A library function the program does not call (fsync for driver) is
    silent at the default level and an info line naming its library at info."""
    cfg = write_config(tmp_path, redis, locks(HOLD, '{ symbol = "fsync"; }'))
    r = run([progs["driver"], "call:0"], cfg)
    assert r.returncode == 0 and "call rc=42 errno=0" in r.stdout
    assert r.stderr == ""
    r = run([progs["driver"], "call:0"], cfg, LOCKSHIM_LOG_LEVEL="info")
    assert r.returncode == 0 and lines_at("warn", r.stderr) == [], r.stderr
    info = [l for l in lines_at("info", r.stderr) if "fsync" in l]
    assert len(info) == 1 and "fsync is defined in" in info[0] and "libc.so" in info[0]


# ---- 2. strict ---------------------------------------------------------------

STRICT_FATAL = [
    ("top level", "strict = true;\n", '{ symbol = "fsync"; }', 0),
    ("per lock", "", '{ symbol = "fsync"; strict = true; }', 0),
    ("per lock over top level", "strict = false;\n", '{ symbol = "fsync"; strict = true; }', 0),
    ("defaults", "defaults = { strict = true; };\n", '{ symbol = "fsync"; }', 1),
]


@pytest.mark.parametrize("how,top,lock,index", STRICT_FATAL, ids=[c[0] for c in STRICT_FATAL])
def test_strict_lock_that_cannot_be_guarded_stops_before_main(progs, redis, tmp_path,
                                                              how, top, lock, index):
    """A strict lock with no call site stops the program before main with exit
    78 and one line naming the lock, its symbol and why."""
    entries = [HOLD, lock] if index else [lock]
    cfg = write_config(tmp_path, redis, top + locks(*entries))
    r = run([progs["driver"], "call:0"], cfg)
    assert r.returncode == 78, r.stderr
    assert r.stdout == ""  # main never ran
    assert len(r.stderr.splitlines()) == 1, r.stderr
    assert "locks[%d] (fsync)" % index in r.stderr and "strict" in r.stderr
    assert "no loaded object calls it through a relocation" in r.stderr


def test_strict_typo_names_the_missing_symbol(progs, redis, tmp_path):
    """A strict lock on a symbol nothing defines says so, before main."""
    cfg = write_config(tmp_path, redis, "strict = true;\n" + locks('{ symbol = "hold_calll"; }'))
    r = run([progs["driver"], "call:0"], cfg)
    assert r.returncode == 78 and r.stdout == ""
    assert len(r.stderr.splitlines()) == 1, r.stderr
    assert "locks[0] (hold_calll)" in r.stderr
    assert "no loaded object calls or defines it" in r.stderr


def test_strict_lock_that_is_guarded_runs_normally(progs, redis, tmp_path):
    """strict = true on a lock that has call sites: the program runs guarded;
    a per-lock strict = false overrides the top level for an unused symbol."""
    cfg = write_config(tmp_path, redis, "strict = true;\n" +
                       locks(HOLD, '{ symbol = "fsync"; strict = false; }'))
    r = run([progs["driver"], "call:0"], cfg, LOCKSHIM_LOG_LEVEL="debug")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "enter 0\ncall rc=42 errno=0\n"
    assert "acquired lockshim:hold_call" in r.stderr


def test_defaults_strict_false_overrides_the_top_level(progs, redis, tmp_path):
    """defaults.strict = false wins over the top-level strict = true."""
    cfg = write_config(tmp_path, redis, "strict = true;\ndefaults = { strict = false; };\n" +
                       locks(HOLD, '{ symbol = "fsync"; }'))
    r = run([progs["driver"], "call:0"], cfg)
    assert r.returncode == 0 and r.stdout.endswith("call rc=42 errno=0\n"), r.stderr


def test_check_accepts_strict(redis, tmp_path):
    """lockshim check accepts strict at the top level, in defaults and per lock."""
    cfg = write_config(tmp_path, redis, "strict = true;\ndefaults = { strict = false; };\n" +
                       locks('{ symbol = "hold_call"; strict = true; }'))
    r = check(cfg)
    assert r.returncode == 0, r.stderr
    assert "1 lock(s)" in r.stdout and "redis: ok" in r.stdout


# ---- 3. lockshim run refuses programs the shim cannot be loaded into ---------

def setuid_copy(program, tmp_path):
    """A set-user-ID copy of program owned by nobody (65534)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to chown a program to another user")
    path = str(tmp_path / "setuid-prog")
    shutil.copy(program, path)
    os.chown(path, 65534, -1)
    os.chmod(path, 0o755 | stat.S_ISUID)
    return path


def script(tmp_path, name, text):
    path = str(tmp_path / name)
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, 0o755)
    return path


UNLOADABLE = {
    "static": (lambda mine, tmp: mine["static"], "statically linked"),
    "setuid": (lambda mine, tmp: setuid_copy(mine["internal"], tmp), "set-user-ID"),
    "script with a static interpreter": (
        lambda mine, tmp: script(tmp, "s", "#!%s\n" % mine["static"]), "statically linked"),
}


@pytest.mark.parametrize("kind", list(UNLOADABLE))
def test_run_refuses_a_program_the_shim_cannot_enter(mine, redis, tmp_path, kind):
    """lockshim run does not run unguarded what the dynamic linker would not
    load the shim into: exit 69 and why, and the program never runs."""
    make, why = UNLOADABLE[kind]
    program = make(mine, tmp_path)
    cfg = write_config(tmp_path, redis, locks('{ symbol = "internal_step"; }'))
    r = cli("run", "-c", cfg, "--", program)
    assert r.returncode == 69, (r.stdout, r.stderr)
    assert r.stdout == ""  # "internal 42" never printed
    assert why in r.stderr and "not running it unguarded" in r.stderr


def test_run_still_runs_dynamic_programs_and_sh_scripts(progs, redis, tmp_path):
    """A dynamic program and a #!/bin/sh script run under lockshim run, with
    their own exit status; the dynamic one is guarded."""
    cfg = write_config(tmp_path, redis, 'log_level = "debug";\n' + locks(HOLD))
    r = cli("run", "-c", cfg, "--", progs["driver"], "call:0", "exit:3")
    assert r.returncode == 3, r.stderr
    assert "call rc=42 errno=0" in r.stdout
    assert "acquired lockshim:hold_call" in r.stderr
    sh = script(tmp_path, "s.sh", "#!/bin/sh\necho script ran\nexit 5\n")
    r = cli("run", "-c", cfg, "--", sh)
    assert r.returncode == 5 and r.stdout == "script ran\n", r.stderr


# ---- 4. check validates what the shim validates ------------------------------

def test_unwritable_log_file_is_refused_by_check_and_shim(progs, redis, tmp_path):
    """A log_file that cannot be opened: check exits 78 like the shim does."""
    log = str(tmp_path / "no-such-dir" / "shim.log")
    cfg = write_config(tmp_path, redis, 'log_file = "%s";\n' % log + locks(HOLD))
    c = check(cfg)
    assert c.returncode == 78, (c.stdout, c.stderr)
    assert "log_file" in c.stderr and log in c.stderr
    r = run([progs["driver"], "call:0"], cfg)
    assert r.returncode == 78 and r.stdout == ""
    assert "log_file" in r.stderr and log in r.stderr
    assert not os.path.exists(os.path.dirname(log))


@pytest.mark.parametrize("level", ["DEBUG", "Debug"])
def test_log_level_env_in_any_case_is_accepted_by_both(progs, redis, tmp_path, level):
    """LOCKSHIM_LOG_LEVEL=DEBUG (any case): check accepts it, the shim logs at debug."""
    cfg = write_config(tmp_path, redis, locks(HOLD))
    c = check(cfg, LOCKSHIM_LOG_LEVEL=level)
    assert c.returncode == 0 and "redis: ok" in c.stdout, c.stderr
    r = run([progs["driver"], "call:0"], cfg, LOCKSHIM_LOG_LEVEL=level)
    assert r.returncode == 0 and "call rc=42 errno=0" in r.stdout, r.stderr
    assert any("acquired lockshim:hold_call" in l for l in lines_at("debug", r.stderr))


def test_unknown_log_level_env_is_refused_by_both(progs, redis, tmp_path):
    """LOCKSHIM_LOG_LEVEL=loud: check and the shim both exit 78 and name it."""
    cfg = write_config(tmp_path, redis, locks(HOLD))
    c = check(cfg, LOCKSHIM_LOG_LEVEL="loud")
    assert c.returncode == 78 and "LOCKSHIM_LOG_LEVEL" in c.stderr, (c.stdout, c.stderr)
    r = run([progs["driver"], "call:0"], cfg, LOCKSHIM_LOG_LEVEL="loud")
    assert r.returncode == 78 and r.stdout == "" and "LOCKSHIM_LOG_LEVEL" in r.stderr


# ---- 5. check tests the server with the shim's own commands ------------------

def calls(stats, command):
    m = re.search(r"^cmdstat_%s:calls=(\d+)," % command, stats, re.M)
    return int(m.group(1)) if m else 0


def test_check_exercises_a_healthy_server(redis, tmp_path):
    """check sends what the shim sends (SET, scripts, BLPOP) on a probe key of
    its own, says "redis: ok" and leaves no key behind."""
    cfg = write_config(tmp_path, redis, locks(HOLD))
    redis.cmd("CONFIG", "RESETSTAT")
    r = check(cfg)
    assert r.returncode == 0 and "redis: ok" in r.stdout, r.stderr
    stats = redis.cmd("INFO", "commandstats")
    assert calls(stats, "set") >= 1 and calls(stats, "blpop") >= 1, stats
    assert calls(stats, "evalsha") + calls(stats, "eval") >= 1, stats
    assert redis.cmd("KEYS", "*") == []


@pytest.fixture
def no_scripts_user(redis, tmp_path):
    """A config logging in as an ACL user who may not run EVAL/EVALSHA."""
    redis.cmd("ACL", "SETUSER", "lim", "on", ">pw", "~*", "+@all", "-eval", "-evalsha")
    return write_config(tmp_path, redis, locks(HOLD), 'username = "lim"; password = "pw";')


def test_check_fails_for_an_acl_user_without_scripts(no_scripts_user):
    """An ACL user without EVAL/EVALSHA can SET and PING but not lock: 69."""
    r = check(no_scripts_user)
    assert r.returncode == 69, (r.stdout, r.stderr)
    assert "redis: ok" not in r.stdout and "redis: " in r.stderr


def test_check_explains_an_acl_user_without_scripts(no_scripts_user):
    """The failure names Redis's NOPERM and the likely cause (the ACL)."""
    r = check(no_scripts_user)
    assert r.returncode == 69
    assert "NOPERM" in r.stderr and "likely cause" in r.stderr and "ACL" in r.stderr


def test_check_fails_on_a_cluster_node(servers, tmp_path):
    """A Redis Cluster node answers MOVED: 69, with Cluster as the cause."""
    def node(bus_port):
        # nodes.conf is relative to --dir: each node's own temporary directory.
        return servers("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                       "--cluster-port", str(bus_port))

    a_bus = free_port()
    a, b = node(a_bus), node(free_port())
    a.cmd("CLUSTER", "ADDSLOTSRANGE", 0, 16383)
    b.cmd("CLUSTER", "MEET", "127.0.0.1", a.port, a_bus)

    def b_sends_to_a():
        slots = b.cmd("CLUSTER", "SLOTS")
        return (any(s[0] == 0 and s[1] == 16383 and s[2][1] == a.port for s in slots)
                and "cluster_state:ok" in b.cmd("CLUSTER", "INFO"))
    wait_for(b_sends_to_a, what="node B serving A's slots")
    r = check(config_for(tmp_path, b.port))
    assert r.returncode == 69, (r.stdout, r.stderr)
    assert "MOVED" in r.stderr and "Cluster" in r.stderr


def test_check_fails_on_a_read_only_replica(redis, servers, tmp_path):
    """A read-only replica answers READONLY: 69, with the replica as the cause."""
    redis.cmd("CONFIG", "SET", "repl-diskless-sync-delay", "0")
    replica = servers("--replicaof", "127.0.0.1", str(redis.port))
    wait_for(lambda: "master_link_status:up" in replica.cmd("INFO", "replication"),
             what="replica linked to its primary")
    r = check(config_for(tmp_path, replica.port))
    assert r.returncode == 69, (r.stdout, r.stderr)
    assert "READONLY" in r.stderr and "replica" in r.stderr


def make_certs(d):
    """A CA and a server certificate signed by it; returns (cert, key, ca)."""
    def openssl(*args):
        subprocess.run(["openssl"] + list(args), cwd=d, check=True, capture_output=True)
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key",
            "-out", "ca.crt", "-days", "1", "-subj", "/CN=lockshim test CA")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key",
            "-out", "server.csr", "-subj", "/CN=127.0.0.1")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", "server.crt", "-days", "1")
    return [os.path.join(d, f) for f in ("server.crt", "server.key", "ca.crt")]


def test_check_fails_on_a_tls_only_port(servers, tmp_path):
    """A port that speaks TLS only: 69, and the message suggests TLS."""
    cert, key, ca = make_certs(str(tmp_path))
    tls = servers("--tls-cert-file", cert, "--tls-key-file", key, "--tls-ca-cert-file", ca,
                  "--tls-auth-clients", "no", tls_ca=ca)
    r = check(config_for(tmp_path, tls.port))
    assert r.returncode == 69, (r.stdout, r.stderr)
    assert "TLS" in r.stderr


# ---- 6. control characters ---------------------------------------------------

def test_control_characters_in_a_key_cannot_forge_log_lines(progs, redis, tmp_path):
    """A key built from program data holding CR/LF is logged escaped: every
    stderr line is one well-formed lockshim line, none starts with the
    forged text, and the escaped form \\r\\n appears instead."""
    cfg = write_config(tmp_path, redis, 'log_level = "debug";\n' +
                       locks('{ symbol = "log_call"; key = "{arg0:str}"; }'))
    path = str(tmp_path / ("x\r\n%s\r\ny" % FORGED))
    r = subprocess.run([progs["driver"], "log:" + path], env=shim_env(cfg),
                       capture_output=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL)
    assert r.returncode == 0 and r.stdout == b"log rc=1 errno=0\n", r.stderr
    assert os.path.exists(path)  # the program saw the raw name
    assert b"\r" not in r.stderr
    for line in r.stderr.splitlines():
        assert LOG_LINE.fullmatch(line), line
        assert not line.startswith(FORGED.encode())
    escaped = ("acquired lockshim:%s" % path.replace(":", "%3A")  # the key's encoding
               ).replace("\r", "\\r").replace("\n", "\\n")
    assert escaped.encode() in r.stderr


NEWLINE_CONFIGS = {
    "log_level": 'log_level = "x\\n%s";\n' % FORGED,
    "symbol": 'locks = ( { symbol = "hold\\n%s"; } );\n' % FORGED,
}


@pytest.mark.parametrize("setting", list(NEWLINE_CONFIGS))
def test_config_error_with_a_newline_is_one_line(progs, tmp_path, setting):
    """A config value holding a newline is reported on one line, escaped, by
    the shim (78) and by lockshim check (78)."""
    cfg = write_config(tmp_path, None, NEWLINE_CONFIGS[setting])
    r = run([progs["driver"], "call:0"], cfg)
    c = check(cfg)
    for what, rc, err in [("shim", r.returncode, r.stderr), ("check", c.returncode, c.stderr)]:
        assert rc == 78, (what, err)
        assert len(err.splitlines()) == 1, (what, err)
        assert "config error" in err and setting in err and "\\n" + FORGED in err, (what, err)
    assert r.stdout == ""


# ---- 7. setup checks ---------------------------------------------------------

BUILD_PKGS = ["gcc", "make", "libc6-dev", "libhiredis-dev", "libconfig-dev"]


def install_deps_check(tmp_path, fake_dpkg_query):
    """Runs install-deps.sh --check --build with a fake dpkg-query first on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script(bin_dir, "dpkg-query", "#!/bin/sh\n" + fake_dpkg_query)
    env = dict(os.environ, PATH="%s:%s" % (bin_dir, os.environ["PATH"]))
    return subprocess.run([os.path.join(ROOT, "scripts", "install-deps.sh"), "--check",
                           "--build"], env=env, capture_output=True, text=True,
                          timeout=TIMEOUT, stdin=subprocess.DEVNULL)


def test_install_deps_names_every_missing_build_package(tmp_path):
    """Nothing installed: exit 1, every build package named, and the apt-get line."""
    r = install_deps_check(tmp_path, "exit 1\n")
    assert r.returncode == 1 and r.stdout == ""
    missing = r.stderr.split("apt-get install -y", 1)
    assert len(missing) == 2, r.stderr
    for pkg in BUILD_PKGS:
        assert re.search(r"\b%s\b" % re.escape(pkg), missing[1]), (pkg, r.stderr)
        assert re.search(r"\b%s\b" % re.escape(pkg), missing[0]), (pkg, r.stderr)


def test_install_deps_is_silent_when_all_is_installed(tmp_path):
    """Everything installed: exit 0 and no output."""
    r = install_deps_check(tmp_path, 'shift 2\nfor p in "$@"; do\n'
                                     '\techo "$p install ok installed"\ndone\n')
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "")


@pytest.mark.skipif(ASAN, reason="builds the plain shim")
def test_link_fails_when_a_symbol_stays_unresolved(tmp_path):
    """The shim's link uses -z defs: without hiredis (HIREDIS_A empty) it fails
    with "undefined reference" instead of producing a shim that cannot load."""
    build = str(tmp_path / "build")
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    r = subprocess.run(["make", "-C", ROOT, "BUILD=" + build, "HIREDIS_A=",
                        build + "/liblockshim.so"], env=env, capture_output=True, text=True,
                       timeout=max(TIMEOUT, 600), stdin=subprocess.DEVNULL)
    out = r.stdout + r.stderr
    assert r.returncode != 0, out[-2000:]
    assert "undefined reference" in out and "redisReader" in out, out[-2000:]
    assert not os.path.exists(build + "/liblockshim.so")
