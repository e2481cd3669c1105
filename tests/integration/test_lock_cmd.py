# SPDX-License-Identifier: MIT
"""`lockshim lock [-c FILE] [-w SECONDS] [-n] [-E CODE] [-l LEASE_MS] KEY --
COMMAND [ARG...]`: a distributed flock(1) on the shim's own locks.

1. exclusion: 4 shell loops doing a read-modify-write of a counter file
   with a pause, each step under `lockshim lock`, count exact; the control
   without it loses updates;
2. a busy lock: -n exits 1 (or -E CODE), -w SECONDS gives up after that
   long, COMMAND never started; a waiter is woken by the release;
3. COMMAND's exit status, 128 + signal, 126/127; its environment
   (LOCKSHIM_LOCK_KEY, LOCKSHIM_FENCE, LD_PRELOAD untouched); the lock value
   names lockshim's pid;
4. SIGINT, SIGTERM, SIGHUP, SIGQUIT passed to COMMAND, lock released after;
5. a lost lease: SIGTERM to the group, SIGKILL 5 s later to whatever of it
   ignores SIGTERM, exit 75;
6. lockshim SIGKILLed: COMMAND dies (PR_SET_PDEATHSIG) and a waiter on this
   machine enters at once (the dead-holder rule; control: with
   break_dead_holders = false it does not);
7. 69 server unreachable, 78 bad config, 64 usage;
8. a guarded function in a program and `lockshim lock` on one key exclude
   each other;
9. Sentinel, Cluster, Redlock and TLS;
10. in the foreground of a terminal, COMMAND can read it, and Ctrl-Z stops
    COMMAND and lockshim, which continues it when continued.
Synchronisation is by lines COMMAND prints, files it writes and Redis state.
"""
import os
import signal
import subprocess
import time

import pytest

from support.server import lock_keys, start_servers, started
from support.tls import TlsServer
from support.topology import Cluster, Topology
from support.util import CLI, MULT, TIMEOUT, run, shim_env, wait_for, write_config

# read, pause, write: two copies at once lose an update
RMW = 'v=$(cat "$1"); sleep 0.02; echo $((v + 1)) > "$1"'
# a COMMAND that holds the lock until told: prints "held", reads a line
HOLD = ["sh", "-c", 'echo "held $LOCKSHIM_LOCK_KEY $LOCKSHIM_FENCE"; read x']


def cli(*args, **env):
    """Runs `lockshim ARGS` to completion (no shim preloaded)."""
    return subprocess.run([CLI] + list(args), env=shim_env(None, preload=False, **env),
                          capture_output=True, text=True, timeout=TIMEOUT,
                          stdin=subprocess.DEVNULL)


def lock(cfg, *args):
    return [CLI, "lock", "-c", cfg] + list(args)


def gone(pid):
    """Whether pid has ended (no such process, or a zombie nobody reaped yet)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def waiters(server, key="lockshim:k"):
    return server.cmd("ZCARD", key + ":q")


def holder(bg, cfg, *args):
    """Starts `lockshim lock ARGS k -- HOLD` and waits until it holds k;
    returns the Bg and the line HOLD printed."""
    h = bg(lock(cfg, *args, "k", "--", *HOLD), None)
    return h, h.expect("held")


# ---- 1. exclusion -------------------------------------------------------------------

def count_with(prefix, path, procs=4, iters=5):
    """procs shell loops, each running RMW iters times (prefixed by prefix:
    the lockshim lock command line, or nothing); returns the counter."""
    with open(path, "w") as f:
        f.write("0\n")
    loop = 'for i in $(seq %d); do "$@" || exit $?; done' % iters
    ps = [subprocess.Popen(["sh", "-c", loop, "sh"] + prefix + ["sh", "-c", RMW, "sh", path],
                           env=shim_env(None, preload=False), stderr=subprocess.PIPE, text=True)
          for _ in range(procs)]
    for p in ps:
        _, err = p.communicate(timeout=TIMEOUT)
        assert p.returncode == 0, err
    with open(path) as f:
        return int(f.read())


@pytest.mark.timing
def test_exclusion_and_control(redis, tmp_path):
    """A config without `locks` is enough; 20 increments under the lock are
    20, the same without it lose some."""
    cfg = write_config(tmp_path, redis, "")
    path = str(tmp_path / "counter")
    assert count_with(lock(cfg, "-w", "60", "ctr", "--"), path) == 20
    assert lock_keys(redis) == []
    assert count_with([], path) < 20  # control: the race is real


# ---- 2. a busy lock -----------------------------------------------------------------

def test_busy_lock_exit_codes_and_wakeup(redis, bg, tmp_path):
    cfg = write_config(tmp_path, redis, "")
    mark = str(tmp_path / "started")
    h, _ = holder(bg, cfg)
    r = cli("lock", "-c", cfg, "-n", "k", "--", "touch", mark)
    assert r.returncode == 1 and "still held by another owner" in r.stderr, r.stderr
    assert cli("lock", "-c", cfg, "-n", "-E", "42", "k", "--", "touch", mark).returncode == 42
    t0 = time.monotonic()
    assert cli("lock", "-c", cfg, "-w", "0.3", "k", "--", "touch", mark).returncode == 1
    took = time.monotonic() - t0
    assert 0.3 <= took < 10 * MULT, took
    assert not os.path.exists(mark)  # COMMAND never started
    # a waiter without -w waits for ever, queued, and the release wakes it
    w = bg(lock(cfg, "k", "--", "sh", "-c", "echo entered"), None)
    wait_for(lambda: waiters(redis) == 1, what="the waiter queued")
    h.send()
    assert h.wait() == 0
    w.expect("entered", timeout=5)
    assert w.wait() == 0
    assert lock_keys(redis) == []


def test_fair_hand_off(redis, bg, tmp_path):
    """defaults.fair: the waiter stays queued for its waiter TTL (derived
    for lockshim lock's lock too: 2 * retry_max_ms + command_timeout_ms)
    and the release hands it the lock."""
    cfg = write_config(tmp_path, redis, "defaults = { fair = true; };\n")
    h, _ = holder(bg, cfg)
    w = bg(lock(cfg, "k", "--", "sh", "-c", "echo entered; read x"), None)
    wait_for(lambda: waiters(redis) == 1, what="the waiter queued")
    _, expiry = redis.cmd("ZRANGE", "lockshim:k:qx", 0, 0, "WITHSCORES")
    sec, usec = redis.cmd("TIME")
    assert float(expiry) - (int(sec) * 1000 + int(usec) // 1000) > 300  # 700 ms TTL
    h.send()
    assert h.wait() == 0
    w.expect("entered", timeout=5)
    assert int(redis.cmd("GET", "lockshim:k").split(":")[2]) == w.p.pid
    w.send()
    assert w.wait() == 0
    assert lock_keys(redis) == []


# ---- 3. exit status and environment --------------------------------------------------

def test_exit_status_passthrough(redis, tmp_path):
    cfg = write_config(tmp_path, redis, "")
    noexec = str(tmp_path / "noexec")
    with open(noexec, "w") as f:
        f.write("#!/bin/sh\n")
    for argv, want in [(["sh", "-c", "exit 7"], 7), (["true"], 0),
                       (["sh", "-c", "kill -KILL $$"], 128 + signal.SIGKILL),
                       (["sh", "-c", "kill -TERM $$"], 128 + signal.SIGTERM),
                       (["/nonexistent/cmd"], 127), ([noexec], 126)]:
        r = cli("lock", "-c", cfg, "k", "--", *argv)
        assert r.returncode == want, (argv, r.stderr)
        assert lock_keys(redis) == []  # released after COMMAND, however it ended


def test_environment_and_lock_value(redis, bg, tmp_path):
    """LOCKSHIM_LOCK_KEY is the key as stored (namespace included), the
    fence an integer, LD_PRELOAD as the caller had it; the value names the
    lockshim process."""
    cfg = write_config(tmp_path, redis, 'namespace = "ns1";\n')
    h = bg(lock(cfg, "k", "--", "sh", "-c",
                'echo "env $LOCKSHIM_LOCK_KEY|$LOCKSHIM_FENCE|${LD_PRELOAD-unset}|'
                '$(ls -l /proc/$$/fd | grep -c -e socket: -e anon_inode)"; read x'), None)
    key, fence, preload, sockets = h.expect("env ")[4:].split("|")
    assert key == "ns1:k" and preload == "unset"
    assert sockets == "0"  # lockshim's connections are not COMMAND's
    assert int(fence) >= 0
    fields = redis.cmd("GET", "ns1:k").split(":")
    assert int(fields[2]) == h.p.pid  # owner.h: token, host, pid, ...
    if len(fields) >= 9:  # since_ms and program (engineer A's value format)
        assert fields[-1] == "sh"
        assert int(fence) > 0
    h.send()
    assert h.wait() == 0
    r = cli("lock", "-c", cfg, "k", "--", "sh", "-c", 'echo "$LD_PRELOAD"',
            LD_PRELOAD="libnothere-lockshim.so")
    assert r.returncode == 0 and r.stdout.strip() == "libnothere-lockshim.so"


# ---- 4. signals -----------------------------------------------------------------------

@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT])
def test_signals_passed_to_command(redis, bg, tmp_path, sig):
    """Without passing them on, lockshim would die of sig (returncode -sig)."""
    cfg = write_config(tmp_path, redis, "")
    got = str(tmp_path / "got")
    name = signal.Signals(sig).name[3:]
    h = bg(lock(cfg, "k", "--", "sh", "-c",
                'trap "echo %s > %s; exit 5" %s; echo ready; '
                'while :; do sleep 0.05; done' % (name, got, name)), None)
    h.expect("ready")
    os.kill(h.p.pid, sig)
    assert h.wait() == 5
    with open(got) as f:
        assert f.read().strip() == name
    assert lock_keys(redis) == []


# ---- 5. a lost lease ----------------------------------------------------------------

def test_lease_lost_terminates_command(redis, bg, tmp_path):
    """The line goes to standard error, also with a log_file (the shim's)."""
    log = str(tmp_path / "shim.log")
    cfg = write_config(tmp_path, redis, 'log_file = "%s";\n' % log)
    h = bg(lock(cfg, "-l", "300", "k", "--", "sh", "-c", "echo ready $$; exec sleep 60"),
           None)
    child = int(h.expect("ready").split()[1])
    redis.cmd("SET", "lockshim:k", "someone-else", "PX", "60000")
    assert h.wait() == 75
    assert gone(child)
    err = h.stderr()
    assert "error: lease on lockshim:k was lost" in err and "exiting 75" in err, err
    with open(log) as f:
        assert f.read() == ""


@pytest.mark.timing
def test_lease_lost_when_server_frozen(redis, bg, tmp_path):
    """The server unreachable for a whole lease (frozen) is a loss too."""
    cfg = write_config(tmp_path, redis, "", "command_timeout_ms = 200;")
    h = bg(lock(cfg, "-l", "600", "k", "--", "sh", "-c", "echo ready $$; exec sleep 60"),
           None)
    child = int(h.expect("ready").split()[1])
    os.kill(redis.proc.pid, signal.SIGSTOP)
    try:
        assert h.wait(timeout=20 * MULT) == 75
    finally:
        os.kill(redis.proc.pid, signal.SIGCONT)
    assert gone(child)
    assert "expired while Redis was unreachable" in h.stderr()


@pytest.mark.timing
def test_lease_lost_sigkill_after_grace(redis, bg, tmp_path):
    """COMMAND traps SIGTERM and goes on, its background child ignores it:
    both get SIGKILL 5 s later, and lockshim exits 75."""
    cfg = write_config(tmp_path, redis, "")
    term = str(tmp_path / "term")
    h = bg(lock(cfg, "-l", "300", "k", "--", "sh", "-c",
                'trap "echo TERM >> %s" TERM; (trap "" TERM; exec sleep 60) & '
                'echo ready $$ $!; while :; do sleep 0.05; done' % term), None)
    sh, bgchild = map(int, h.expect("ready").split()[1:])
    t0 = time.monotonic()
    redis.cmd("DEL", "lockshim:k")
    wait_for(lambda: os.path.exists(term), what="the command's SIGTERM")
    assert not gone(sh) and not gone(bgchild)
    assert h.wait() == 75
    took = time.monotonic() - t0
    assert 4.5 <= took < 20 * MULT, took
    wait_for(lambda: gone(sh) and gone(bgchild), what="the process group killed")
    assert "sending SIGKILL" in h.stderr()


# ---- 6. lockshim killed -----------------------------------------------------------------

@pytest.mark.timing
@pytest.mark.parametrize("break_dead", [True, False])
def test_sigkill_kills_command_and_waiter_enters(redis, bg, tmp_path, break_dead):
    """The lease is 20 s; a waiter on this machine enters at once when the
    holder dies, because the dead-holder rule breaks the lock (control:
    break_dead_holders = false, and the waiter gives up after 2 s)."""
    cfg = write_config(tmp_path, redis, "" if break_dead else
                       "defaults = { break_dead_holders = false; };\n")
    h = bg(lock(cfg, "-l", "20000", "k", "--", "sh", "-c", "echo ready $$; exec sleep 60"),
           None)
    child = int(h.expect("ready").split()[1])
    w = bg(lock(cfg, "-w", "2", "k", "--", "sh", "-c", "echo entered"), None)
    wait_for(lambda: waiters(redis) == 1, what="the waiter queued")
    t0 = time.monotonic()
    h.p.kill()
    h.p.wait()
    wait_for(lambda: gone(child), timeout=5, what="the command killed with lockshim")
    if break_dead:
        w.expect("entered", timeout=2)
        assert w.wait() == 0
        assert time.monotonic() - t0 < 2 * MULT
        assert "which is gone; lock broken" in w.stderr()
    else:
        assert w.wait() == 1


# ---- 7. exit statuses of lockshim itself -------------------------------------------------

def test_server_unreachable(redis, tmp_path):
    cfg = write_config(tmp_path, redis, "")
    mark = str(tmp_path / "started")
    redis.stop()
    for args in (["-w", "0.5"], ["-n"]):
        r = cli("lock", "-c", cfg, *args, "k", "--", "touch", mark)
        assert r.returncode == 69, r.stderr
        assert "unavailable" in r.stderr
    assert not os.path.exists(mark)


def test_bad_config(tmp_path):
    mark = str(tmp_path / "started")
    cfg = write_config(tmp_path, None, "nonsense = 1;\n")
    r = cli("lock", "-c", cfg, "k", "--", "touch", mark)
    assert r.returncode == 78 and "nonsense" in r.stderr
    assert cli("lock", "-c", str(tmp_path / "none.cfg"), "k", "--", "touch", mark).returncode == 78
    assert cli("lock", "k", "--", "touch", mark,
               LOCKSHIM_CONFIG=str(tmp_path / "none.cfg")).returncode == 78
    assert not os.path.exists(mark)


@pytest.mark.parametrize("args", [[], ["k"], ["k", "--"], ["-w"], ["-w", "soon", "k", "true"],
                                  ["-w", "-1", "k", "true"], ["-E", "256", "k", "true"],
                                  ["-l", "5", "k", "true"], ["-x", "k", "true"],
                                  ["k:q", "--", "true"], ["", "--", "true"]])
def test_usage(args, tmp_path):
    cfg = write_config(tmp_path, None, "")
    r = cli("lock", "-c", cfg, *args)
    assert r.returncode == 64, (args, r.stderr)
    assert "usage:" in r.stderr


# ---- 8. with the shim ------------------------------------------------------------------

def test_shim_and_lock_exclude_each_other(redis, bg, worker_progs, tmp_path):
    """block_call guarded on key "k" in a program, `lockshim lock k` outside."""
    cfg = write_config(tmp_path, redis, 'locks = ( { symbol = "block_call"; key = "k"; '
                       'wait_ms = 300; on_timeout = "skip"; return = -7; } );\n')
    b = bg([worker_progs["block"]], cfg)
    b.expect("enter")
    assert cli("lock", "-c", cfg, "-n", "k", "--", "true").returncode == 1
    b.send()
    assert b.wait() == 0
    assert cli("lock", "-c", cfg, "-n", "k", "--", "true").returncode == 0
    h, _ = holder(bg, cfg)
    r = run([worker_progs["block"]], cfg)
    assert "call rc=-7" in r.stdout, r.stdout + r.stderr  # skipped: lockshim lock holds k
    h.send()
    assert h.wait() == 0
    r = run([worker_progs["block"]], cfg)
    assert "call rc=42" in r.stdout, r.stdout + r.stderr


# ---- 9. topologies ----------------------------------------------------------------------

def busy_then_free(bg, cfg, key):
    """A holder of k makes -n exit 1; once it releases, -n takes k."""
    h, line = holder(bg, cfg)
    assert line.split()[1] == key
    assert cli("lock", "-c", cfg, "-n", "k", "--", "true").returncode == 1
    h.send()
    assert h.wait() == 0
    r = cli("lock", "-c", cfg, "-n", "k", "--", "sh", "-c", 'echo "$LOCKSHIM_LOCK_KEY"')
    assert r.returncode == 0 and r.stdout.strip() == key, r.stderr


@pytest.fixture
def sentinel_topo(request):
    yield from started(request, Topology())


@pytest.fixture
def cluster(request):
    yield from started(request, Cluster())


@pytest.fixture
def tls_servers(request, pki):
    """Starts TLS-only redis-servers (support/tls.py), each stopped by pid."""
    yield from start_servers(request, lambda **kw: TlsServer(pki, **kw),
                             lambda s: "redis-server (TLS, %s)" % s.cert)


def test_tls(tls_servers, pki, bg, tmp_path):
    server = tls_servers()
    cfg = write_config(tmp_path, None, 'redis = { host = "127.0.0.1"; port = %d; '
                       'tls = { ca_file = "%s"; }; };\n' % (server.port, pki["ca"]))
    busy_then_free(bg, cfg, "lockshim:k")
    assert server.cmd("EXISTS", "lockshim:k") == 0


def test_sentinel(sentinel_topo, bg, tmp_path):
    cfg = sentinel_topo.config(tmp_path, "")
    busy_then_free(bg, cfg, "lockshim:k")


def test_cluster(cluster, bg, tmp_path):
    cfg = cluster.config(tmp_path, "")
    busy_then_free(bg, cfg, "lockshim:{k}")


def test_redlock(masters, bg, tmp_path):
    cfg = masters.config(tmp_path, "")
    h, _ = holder(bg, cfg)
    assert all(m.cmd("EXISTS", "lockshim:k") == 1 for m in masters.nodes)
    h.send()
    assert h.wait() == 0
    busy_then_free(bg, cfg, "lockshim:k")


# ---- 10. a terminal -------------------------------------------------------------------

def read_until(fd, text, timeout):
    """Reads the pty master fd until text shows; returns what was read."""
    import select
    out, deadline = b"", time.monotonic() + timeout * MULT
    while text.encode() not in out:
        left = deadline - time.monotonic()
        assert left > 0, "no %r on the terminal; got %r" % (text, out)
        r, _, _ = select.select([fd], [], [], left)
        if r:
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # EIO: the terminal's last user is gone
                break
            if not chunk:
                break
            out += chunk
    return out.decode(errors="replace")


@pytest.mark.parametrize("suspend", [False, True])
def test_command_reads_the_terminal(redis, tmp_path, suspend):
    """lockshim in the foreground of a terminal hands the terminal to
    COMMAND's process group, so COMMAND can read it (a prompt such as
    apt-get's) instead of being stopped by SIGTTIN. suspend: a Ctrl-Z stops
    COMMAND and then lockshim itself (the shell's job), and continuing
    lockshim continues COMMAND in the foreground."""
    import pty
    cfg = write_config(tmp_path, redis, "")
    pid, fd = pty.fork()
    if pid == 0:  # a session leader with the pty as its controlling terminal
        try:
            env = shim_env(None, preload=False)
            os.execve(CLI, lock(cfg, "k", "--", "sh", "-c",
                                'echo ask; read x; echo "got $x"'), env)
        finally:
            os._exit(99)
    try:
        read_until(fd, "ask", 10)
        if suspend:
            os.write(fd, b"\x1a")  # VSUSP: SIGTSTP to the foreground group
            _, status = os.waitpid(pid, os.WUNTRACED)
            assert os.WIFSTOPPED(status), status
            assert redis.cmd("EXISTS", "lockshim:k") == 1
            os.kill(pid, signal.SIGCONT)
        os.write(fd, b"yes\n")
        assert "got yes" in read_until(fd, "got yes", 10)
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
        pid = 0
    finally:
        if pid:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        os.close(fd)
