# SPDX-License-Identifier: MIT
"""The shim under every program of a machine: /etc/ld.so.preload in a
fresh Debian 12 root (support/debroot.py), never this machine's /etc.

The shim and the CLI are installed into the root with `make install
DESTDIR=<root>`. `lockshim enable` validates the config without a server
and adds the shim's absolute path to the root's /etc/ld.so.preload
(atomically, every other line and the mode kept, idempotent); `lockshim
disable` removes that line only; both 77 when not root. With the preload
in place and the implicit config (/etc/lockshim/lockshim.cfg) missing,
broken, or valid with a `rename` lock scoped to another program while its
Redis is down, `sh -c true`, `ls /` and `apt-get install ./small.deb` all
exit 0; broken, each process says one error line (stderr and syslog). An
explicit broken config (LOCKSHIM_CONFIG) still stops a program with 78."""
import os
import re
import socket
import subprocess

import pytest

from support.debroot import chroot, fresh_root
from support.util import ROOT, TIMEOUT

LIB = "/usr/local/lib/liblockshim.so"
CFG = "/etc/lockshim/lockshim.cfg"
OTHER = "/usr/lib/x86_64-linux-gnu/libgcc_s.so.1"  # another preloaded library
ERROR_LINE = re.compile(r"^lockshim\[\d+\] (\S+): error: config error: %s.*; nothing is "
                        r"guarded in this process$" % re.escape(CFG))

# Redis down: nothing listens on port 1. Scoped to mv: dpkg and apt-get,
# whose renames would be skipped, stay out of scope.
VALID = ('redis = { host = "127.0.0.1"; port = 1; connect_timeout_ms = 200; };\n'
         'programs = ["mv"];\n'
         'locks = ( { symbols = ["rename", "renameat", "renameat2"]; wait_ms = 500; } );\n')
BROKEN = 'locks = ( { symbol = "rename"; colour = 1; } );\n'


@pytest.fixture(scope="module")
def small_deb(tmp_path_factory):
    """A tiny package (one file under /usr/share), built with dpkg-deb."""
    d = tmp_path_factory.mktemp("deb")
    pkg = d / "small"
    (pkg / "DEBIAN").mkdir(parents=True)
    (pkg / "usr" / "share" / "small").mkdir(parents=True)
    (pkg / "usr" / "share" / "small" / "hello.txt").write_text("hello\n")
    (pkg / "DEBIAN" / "control").write_text(
        "Package: small\nVersion: 1.0\nArchitecture: all\nMaintainer: t <t@example.org>\n"
        "Description: a tiny package for test_systemwide\n")
    out = str(d / "small_1.0_all.deb")
    subprocess.run(["dpkg-deb", "--root-owner-group", "--build", str(pkg), out], check=True,
                   capture_output=True)
    return out


@pytest.fixture
def root(tmp_path):
    """A fresh root with the shim and the CLI installed by make install."""
    r = fresh_root(tmp_path / "root")
    subprocess.run(["make", "-s", "-C", ROOT, "install", "DESTDIR=" + r], check=True,
                   capture_output=True, timeout=TIMEOUT * 5)
    os.makedirs(os.path.join(r, "etc", "lockshim"), exist_ok=True)
    return r


def put(root, path, text, mode=0o644):
    p = os.path.join(root, path.lstrip("/"))
    with open(p, "w") as f:
        f.write(text)
    os.chmod(p, mode)
    return p


def read(root, path):
    with open(os.path.join(root, path.lstrip("/"))) as f:
        return f.read()


def cli(root, *args, user=None, env=None):
    cmd = ["/usr/local/bin/lockshim"] + list(args)
    if user:
        cmd = ["setpriv", "--reuid=" + user, "--regid=nogroup", "--clear-groups"] + cmd
    return chroot(root, cmd, env=env or {})


def test_enable_and_disable(root):
    put(root, CFG, VALID)
    preload = os.path.join(root, "etc", "ld.so.preload")
    put(root, "/etc/ld.so.preload", OTHER + "\n", 0o640)
    before = os.stat(preload).st_ino
    r = cli(root, "enable")  # Redis is down: enable needs no server
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("\n") == 1 and "added %s to /etc/ld.so.preload" % LIB in r.stdout
    assert read(root, "/etc/ld.so.preload") == OTHER + "\n" + LIB + "\n"
    st = os.stat(preload)
    assert st.st_mode & 0o7777 == 0o640, oct(st.st_mode)
    assert st.st_ino != before, "rewritten in place, not renamed over"
    assert [f for f in os.listdir(os.path.join(root, "etc")) if "ld.so.preload." in f] == []
    # idempotent
    r = cli(root, "enable")
    assert r.returncode == 0 and "already in /etc/ld.so.preload" in r.stdout
    assert read(root, "/etc/ld.so.preload") == OTHER + "\n" + LIB + "\n"
    # every program of the root now loads the shim (out of scope here: ls)
    r = chroot(root, "grep -c liblockshim /proc/self/maps")
    assert r.returncode == 0 and int(r.stdout) > 0, r.stdout + r.stderr
    # disable: that line only
    r = cli(root, "disable")
    assert r.returncode == 0 and "removed %s" % LIB in r.stdout, r.stdout + r.stderr
    assert read(root, "/etc/ld.so.preload") == OTHER + "\n"
    assert os.stat(preload).st_mode & 0o7777 == 0o640
    r = cli(root, "disable")
    assert r.returncode == 0 and "nothing changed" in r.stdout
    assert read(root, "/etc/ld.so.preload") == OTHER + "\n"
    # alone in the file: disable removes the file
    os.unlink(preload)
    assert cli(root, "enable").returncode == 0
    assert read(root, "/etc/ld.so.preload") == LIB + "\n"
    assert os.stat(preload).st_mode & 0o7777 == 0o644
    assert cli(root, "disable").returncode == 0
    assert not os.path.exists(preload)


def test_enable_refuses_a_config_the_shim_could_not_use(root):
    put(root, CFG, BROKEN)
    r = cli(root, "enable")
    assert r.returncode == 78 and "colour: unknown setting" in r.stderr, r.stderr
    assert not os.path.exists(os.path.join(root, "etc", "ld.so.preload"))
    os.unlink(os.path.join(root, CFG.lstrip("/")))
    r = cli(root, "enable")
    assert r.returncode == 78 and CFG in r.stderr
    # -c names the file validated, nothing is copied
    put(root, "/root/other.cfg", VALID)
    r = cli(root, "enable", "-c", "/root/other.cfg")
    assert r.returncode == 0, r.stderr
    assert not os.path.exists(os.path.join(root, CFG.lstrip("/")))
    r = cli(root, "enable", "-c", "/root/missing.cfg")
    assert r.returncode == 78


@pytest.mark.parametrize("verb", ["enable", "disable"])
def test_not_root(root, verb):
    put(root, CFG, VALID)
    r = cli(root, verb, user="nobody")
    assert r.returncode == 77, r.stdout + r.stderr
    assert "only root" in r.stderr
    assert not os.path.exists(os.path.join(root, "etc", "ld.so.preload"))


def _enable(root):
    put(root, CFG, VALID)
    r = cli(root, "enable")
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("state", ["missing", "broken", "valid_redis_down"])
def test_programs_keep_running(root, small_deb, state):
    _enable(root)
    if state == "missing":
        os.unlink(os.path.join(root, CFG.lstrip("/")))
    elif state == "broken":
        put(root, CFG, BROKEN)
    subprocess.run(["cp", small_deb, os.path.join(root, "root", "small.deb")], check=True)
    for cmd, progs in [(["sh", "-c", "true"], ["env", "dash"]), (["ls", "/"], ["env", "ls"])]:
        r = chroot(root, cmd)
        assert r.returncode == 0, (cmd, r.stdout, r.stderr)
        if state == "broken":
            # one line per process (env, which chroot runs first, then cmd)
            lines = r.stderr.splitlines()
            assert [ERROR_LINE.match(l).group(1) if ERROR_LINE.match(l) else l
                    for l in lines] == progs, r.stderr
        else:
            assert r.stderr == "", (cmd, r.stderr)
    r = chroot(root, "cd /root && apt-get install -y ./small.deb")
    assert r.returncode == 0, r.stdout + r.stderr
    assert os.path.exists(os.path.join(root, "usr", "share", "small", "hello.txt"))
    assert chroot(root, "dpkg -s small").returncode == 0
    if state != "broken":
        assert "lockshim" not in r.stderr, r.stderr
    if state == "valid_redis_down":
        # control: mv is in scope; its rename's lock cannot be taken with
        # Redis down, so it is skipped (on_error follows on_timeout: skip)
        r = chroot(root, "touch /root/a && mv /root/a /root/b")
        assert r.returncode != 0 and "lockshim" in r.stderr, r.stdout + r.stderr
        assert os.path.exists(os.path.join(root, "root", "a"))


def test_broken_implicit_config_also_goes_to_syslog(root):
    _enable(root)
    put(root, CFG, BROKEN)
    path = os.path.join(root, "run", "test-syslog.sock")
    d = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    d.bind(path)
    d.settimeout(TIMEOUT)
    try:
        r = chroot(root, ["ls", "/"], env={"LOCKSHIM_TEST_SYSLOG_PATH": "/run/test-syslog.sock"})
        assert r.returncode == 0
        msg = d.recv(4096).decode()
        assert msg.startswith("<27>lockshim[") and ": ls: error: config error: " in msg, msg
        assert "colour: unknown setting" in msg
        # the shim kept no socket: ls ran, then nothing more came
        d.settimeout(0.2)
        with pytest.raises(socket.timeout):
            d.recv(4096)
    finally:
        d.close()


def test_explicit_broken_config_still_stops_the_program(root):
    _enable(root)
    put(root, "/etc/lockshim/broken.cfg", BROKEN)
    r = chroot(root, ["ls", "/"], env={"LOCKSHIM_CONFIG": "/etc/lockshim/broken.cfg"})
    assert r.returncode == 78, r.stdout + r.stderr
    assert "colour: unknown setting" in r.stderr


def test_check_reads_the_implicit_config(root):
    put(root, CFG, BROKEN)
    r = cli(root, "check")
    assert r.returncode == 78 and CFG in r.stderr and "colour" in r.stderr


def test_strict_lock_unguarded_under_the_implicit_config(root):
    """A strict lock that cannot be guarded: explicit, exit 78 (control);
    implicit, one error line and the program runs."""
    _enable(root)
    put(root, CFG, 'redis = { host = "127.0.0.1"; port = 1; };\nprograms = ["ls"];\n'
        'locks = ( { symbol = "no_such_function_here"; strict = true; } );\n')
    r = chroot(root, ["ls", "/"])
    assert r.returncode == 0 and "usr" in r.stdout.split(), r.stdout + r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and "] ls: error: config error: " in lines[0], r.stderr
    assert "no_such_function_here" in lines[0] and "nothing is guarded" in lines[0]
    r = chroot(root, ["ls", "/"], env={"LOCKSHIM_CONFIG": CFG})
    assert r.returncode == 78, r.stdout + r.stderr


def test_enable_disable_faults(root):
    put(root, CFG, VALID)
    preload = os.path.join(root, "etc", "ld.so.preload")
    # the path among other names on one line (ld.so splits at blanks and
    # colons): already there; disable leaves a line it did not write
    put(root, "/etc/ld.so.preload", "%s %s\n" % (OTHER, LIB))
    r = cli(root, "enable")
    assert r.returncode == 0 and "already" in r.stdout, r.stdout + r.stderr
    r = cli(root, "disable")
    assert r.returncode == 0 and "nothing changed" in r.stdout
    assert read(root, "/etc/ld.so.preload") == "%s %s\n" % (OTHER, LIB)
    # no final newline: the line goes on a line of its own
    put(root, "/etc/ld.so.preload", OTHER)
    assert cli(root, "enable").returncode == 0
    assert read(root, "/etc/ld.so.preload") == OTHER + "\n" + LIB + "\n"
    # unreadable (a directory): 74, nothing written
    os.unlink(preload)
    os.mkdir(preload)
    for verb in ("enable", "disable"):
        r = cli(root, verb)
        assert r.returncode == 74 and "/etc/ld.so.preload" in r.stderr, r.stdout + r.stderr
    assert os.listdir(preload) == []
    assert [f for f in os.listdir(os.path.join(root, "etc")) if "ld.so.preload." in f] == []
    # usage
    assert cli(root, "enable", "extra").returncode == 64
    assert cli(root, "disable", "extra").returncode == 64
    assert cli(root, "enable", "-c").returncode == 64


@pytest.mark.parametrize("on_error,rc,moved", [("skip", 1, False), ("proceed", 0, True),
                                               ("exit", 75, False)])
def test_in_scope_program_follows_on_error_while_redis_is_down(root, on_error, rc, moved):
    """Under the preload, a program a lock applies to, with its server
    down, does what the lock's on_error says; the others run untouched."""
    _enable(root)
    put(root, CFG, VALID.replace("wait_ms = 500;", 'wait_ms = 500; on_error = "%s";' % on_error))
    r = chroot(root, "touch /root/a && mv /root/a /root/b")
    assert r.returncode == rc, (r.returncode, r.stdout, r.stderr)
    assert os.path.exists(os.path.join(root, "root", "b")) == moved
    r = chroot(root, "touch /root/c && ls /root")
    assert r.returncode == 0 and r.stderr == "", r.stderr


def test_disable_works_when_every_program_is_guarded_and_redis_is_down(root):
    """lockshim's own command is never in scope: with a `rename` lock on
    every program and the server down, disable still renames the preload
    file into place (control: mv, in scope, has its rename skipped)."""
    put(root, "/etc/ld.so.preload", OTHER + "\n")  # disable will rename, not unlink
    _enable(root)
    put(root, CFG, VALID.replace('programs = ["mv"];\n', ""))
    r = chroot(root, "touch /root/a && mv /root/a /root/b")
    assert r.returncode == 1 and os.path.exists(os.path.join(root, "root", "a")), r.stderr
    r = cli(root, "disable")
    assert r.returncode == 0 and "removed" in r.stdout, r.stdout + r.stderr
    assert read(root, "/etc/ld.so.preload") == OTHER + "\n"
