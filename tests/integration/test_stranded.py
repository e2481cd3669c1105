# SPDX-License-Identifier: MIT
"""The shim never leaves a lock behind for a whole lease.

1. Quick exits: `_exit`/`_Exit` (how forked workers end, also Python's
   `os._exit`) release every lock the process holds or keeps between calls,
   while a `vfork` child's `_exit` leaves its parent's locks alone.
2. Dead holders: a waiter on this machine and pid namespace breaks the lock
   of a holder that is gone (killed, aborted, crashed, a zombie, its pid
   reused) and enters at once, but never that of a live holder, of another
   machine or pid namespace, of a value it cannot read, nor with
   `break_dead_holders = false`.
3. Calls that gave up: when Redis is frozen, loses replies or is a black
   hole, a skipped call's SET may still run later; the renewal thread
   deletes that token well before its lease ends.

Leases are long (10-20 s) so that a stranded key is obvious; every check
that a key is gone is done at once or within a few seconds.
"""
import errno
import os
import signal
import socket
import subprocess
import time
import types

import pytest

from support.proxy import BLACK_HOLE, DROP_REPLIES, PASS, Proxy
from support.server import lock_keys
from support.util import ASAN, MULT, cc, run, wait_for, write_config

pytestmark = pytest.mark.timing  # time bounds and forced races: make test-repeat

KEY = "lockshim:k"
EBUSY_LINE = "call rc=-1 errno=%d" % errno.EBUSY
OK_LINE = "call rc=42 errno=0"
# The lock stays with its thread between calls for far longer than any test.
KEEP = "linger_ms = 30000; handoff_ms = 30000;"


@pytest.fixture(scope="module")
def quit_prog(progs, tmp_path_factory):
    d = progs["dir"]
    out = os.path.join(str(tmp_path_factory.mktemp("quit")), "quit")
    return cc(out, ["quit.c"], "-O2", "-L" + d, "-Wl,-rpath," + d, "-ltarget")


def lock_cfg(path, redis, settings, key="k", symbol="hold_call", head=""):
    """Writes a config guarding symbol with key into directory path (created)."""
    os.makedirs(str(path), exist_ok=True)
    return write_config(path, redis, '%slocks = ( { symbol = "%s"; key = "%s"; %s } );\n'
                        % (head, symbol, key, settings))


def sets_run(redis):
    """How many SET commands Redis has run since the last CONFIG RESETSTAT."""
    for line in redis.cmd("INFO", "commandstats").splitlines():
        if line.startswith("cmdstat_set:"):
            return int(line.split("calls=")[1].split(",")[0])
    return 0


def proc_stat(pid):
    """(state letter, start time in clock ticks) from /proc/PID/stat."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return fields[0], int(fields[19])


def held_by(redis, pid):
    """Whether KEY's value names process pid as its holder."""
    value = redis.cmd("GET", KEY)
    return value is not None and ":%d:" % pid in value


# ---- 1. quick exits -----------------------------------------------------------

@pytest.mark.parametrize("how", ["_exit", "_Exit"])
def test_quick_exit_releases_a_kept_lock(quit_prog, redis, tmp_path, how):
    """Three guarded calls leave the lock kept for the next one; _exit or
    _Exit right after must release it: the key is gone the moment the
    process has exited, not after its 10 s lease."""
    cfg = lock_cfg(tmp_path, redis, "lease_ms = 10000; " + KEEP)
    redis.cmd("CONFIG", "RESETSTAT")
    r = run([quit_prog, "call", "call", "call", how], cfg)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count(OK_LINE) == 3, r.stdout
    assert redis.cmd("EXISTS", KEY) == 0, "stranded, TTL %s ms" % redis.cmd("PTTL", KEY)
    assert sets_run(redis) == 1  # the lock was taken once and kept between the calls


def test_forked_child_exit_releases_its_own_locks_only(quit_prog, redis, tmp_path, procs):
    """A forked worker takes its own lock and ends with _exit while its parent
    lives on: the child's key is gone as soon as it has exited, and the lock
    the parent keeps (inherited by the child) is still the parent's."""
    cfg = lock_cfg(tmp_path, redis, "lease_ms = 10000; " + KEEP, key="{pid}")
    p = procs([quit_prog, "call", "fork", "stdin"], cfg)
    assert p.expect("call") == OK_LINE
    parent_key = "lockshim:%d" % p.p.pid
    parent_value = redis.cmd("GET", parent_key)
    assert parent_value is not None
    child = p.expect("child").split()  # "child pid=P calls=N"
    assert child[2] == "calls=3", child
    child_pid = int(child[1].split("=")[1])
    assert p.expect("reaped") == "reaped pid=%d status=0" % child_pid
    child_key = "lockshim:%d" % child_pid
    assert redis.cmd("EXISTS", child_key) == 0, \
        "stranded, TTL %s ms" % redis.cmd("PTTL", child_key)
    assert redis.cmd("GET", parent_key) == parent_value
    p.send()
    rc, _, err = p.finish()
    assert rc == 0, err
    assert lock_keys(redis) == []


def plt_value(binary, symbol):
    """The value readelf gives the undefined dynamic symbol (0 unless the
    executable has a canonical PLT entry for it, i.e. takes its address)."""
    out = subprocess.run(["readelf", "--dyn-syms", "-W", binary], capture_output=True,
                         text=True, check=True).stdout
    for line in out.splitlines():
        f = line.split()
        if len(f) >= 8 and f[6] == "UND" and f[7].split("@")[0] == symbol:
            return int(f[1], 16)
    raise AssertionError("%s does not import %s" % (binary, symbol))


def test_python_os_exit_releases_a_kept_lock(redis, tmp_path):
    """Debian's python3 guarding umask (called through its PLT): after guarded
    os.umask calls, os._exit(0) leaves no key behind."""
    python = os.path.realpath("/usr/bin/python3")
    assert plt_value(python, "umask") == 0  # an ordinary PLT call, redirectable
    cfg = lock_cfg(tmp_path, redis, "lease_ms = 10000; " + KEEP, key="umask",
                   symbol="umask", head='log_level = "debug";\n')
    code = ("import os\nfor _ in range(3): os.umask(0o22)\n"
            "print('called', flush=True)\nos._exit(0)\n")
    r = run([python, "-c", code], cfg)
    assert r.returncode == 0 and r.stdout == "called\n", r.stderr
    assert r.stderr.count("acquired lockshim:umask for umask") == 1, r.stderr
    assert redis.cmd("EXISTS", "lockshim:umask") == 0, \
        "stranded, TTL %s ms" % redis.cmd("PTTL", "lockshim:umask")


def test_vfork_child_exit_leaves_the_parents_lock_alone(quit_prog, redis, tmp_path, procs):
    """A vfork child shares its parent's memory; its _exit must not release
    the parent's kept lock: the parent still holds the same value, and its
    next call reuses the kept lock (guarded, no new SET)."""
    cfg = lock_cfg(tmp_path, redis, "lease_ms = 10000; " + KEEP)
    redis.cmd("CONFIG", "RESETSTAT")
    p = procs([quit_prog, "call", "vfork", "stdin", "call", "stdin"], cfg)
    assert p.expect("call") == OK_LINE
    value = redis.cmd("GET", KEY)
    assert value is not None and ":%d:" % p.p.pid in value
    assert p.expect("vfork reaped").endswith(" status=0")
    assert redis.cmd("GET", KEY) == value
    p.send()
    assert p.expect("call") == OK_LINE
    assert redis.cmd("GET", KEY) == value
    assert sets_run(redis) == 1  # the second call took the kept lock back
    p.send()
    rc, _, err = p.finish()
    assert rc == 0, err
    assert "lost" not in err, err
    assert redis.cmd("EXISTS", KEY) == 0


# ---- 2. dead holders ------------------------------------------------------------

DEAD_HOLDER = "lease_ms = 20000; wait_ms = 15000; " + KEEP


def kill_in_call(progs, quit_prog, cfg, procs):
    h = procs([progs["driver"], "call:60000"], cfg)
    h.expect("enter")
    h.signal(signal.SIGKILL)
    return h, [-signal.SIGKILL]


def kill_while_kept(progs, quit_prog, cfg, procs):
    h = procs([progs["driver"], "call:0", "stdin"], cfg)
    assert h.expect("call") == OK_LINE  # the lock is now kept, no call runs
    h.signal(signal.SIGKILL)
    return h, [-signal.SIGKILL]


def abort_while_kept(progs, quit_prog, cfg, procs):
    return procs([quit_prog, "call", "call", "abort"], cfg), [-signal.SIGABRT]


def segv_while_kept(progs, quit_prog, cfg, procs):
    # Under ASan its SEGV handler reports the crash and exits with status 1.
    statuses = [-signal.SIGSEGV] + ([1] if ASAN else [])
    return procs([quit_prog, "call", "call", "segv"], cfg), statuses


def start_waiter(progs, cfg, procs):
    """A waiter that takes the lock, reports, and keeps it while it waits on
    stdin. Returns (proc, its first report line, seconds it took)."""
    t0 = time.monotonic()
    w = procs([progs["driver"], "call:0", "stdin"], cfg)
    line = w.expect("call")
    return w, line, time.monotonic() - t0


def assert_broken_for(redis, progs, cfg, procs, dead_pid):
    """A waiter enters well under the 20 s lease, holds the key afterwards,
    and says whose lock it broke."""
    w, line, took = start_waiter(progs, cfg, procs)
    assert line == OK_LINE, w.p.stderr.read() if w.p.poll() is not None else line
    assert took < 5 * MULT, took
    assert held_by(redis, w.p.pid), redis.cmd("GET", KEY)
    w.send()
    rc, _, err = w.finish()
    assert rc == 0, err
    assert "%s was held by process %d of this machine, which is gone" % (KEY, dead_pid) in err, err


@pytest.mark.parametrize("die", [kill_in_call, kill_while_kept, abort_while_kept,
                                 segv_while_kept],
                         ids=["sigkill-in-call", "sigkill-while-kept", "abort", "sigsegv"])
def test_dead_holders_lock_is_broken(progs, quit_prog, redis, tmp_path, procs, die):
    """A holder that died without releasing (its key still holds its value)
    does not make a waiter on the same machine wait out the lease."""
    cfg = lock_cfg(tmp_path, redis, DEAD_HOLDER)
    holder, statuses = die(progs, quit_prog, cfg, procs)
    rc, _, err = holder.finish()
    assert rc in statuses, (rc, err)
    assert held_by(redis, holder.p.pid)  # stranded
    assert_broken_for(redis, progs, cfg, procs, holder.p.pid)


def test_zombie_holder_is_gone(progs, redis, tmp_path, procs):
    """A holder killed but not yet reaped by its parent (a zombie) counts as
    gone: its pid still exists, but it will never release."""
    cfg = lock_cfg(tmp_path, redis, DEAD_HOLDER)
    holder = procs([progs["driver"], "call:60000"], cfg)
    holder.expect("enter")
    holder.signal(signal.SIGKILL)
    wait_for(lambda: proc_stat(holder.p.pid)[0] == "Z", what="the holder to be a zombie")
    assert held_by(redis, holder.p.pid)
    assert_broken_for(redis, progs, cfg, procs, holder.p.pid)
    assert proc_stat(holder.p.pid)[0] == "Z"  # judged while still a zombie


def test_frozen_holder_keeps_its_lock(progs, redis, tmp_path, procs):
    """A live holder, even one that is stopped (SIGSTOP) and does not renew,
    is never broken: the waiter times out and the value is unchanged."""
    holder = procs([progs["driver"], "call:60000"], lock_cfg(tmp_path / "h", redis, DEAD_HOLDER))
    holder.expect("enter")
    holder.signal(signal.SIGSTOP)
    wait_for(lambda: proc_stat(holder.p.pid)[0] == "T", what="the holder to stop")
    value = redis.cmd("GET", KEY)
    assert ":%d:" % holder.p.pid in value
    cfg = lock_cfg(tmp_path / "w", redis, "lease_ms = 20000; wait_ms = 500;")
    r = run([progs["driver"], "call:0"], cfg)
    assert r.stdout.strip() == EBUSY_LINE, r.stderr
    assert "which is gone" not in r.stderr
    assert redis.cmd("GET", KEY) == value
    holder.signal(signal.SIGCONT)


def test_break_dead_holders_false_leaves_a_dead_holders_lock(progs, redis, tmp_path, procs):
    """break_dead_holders = false: a dead holder's lock expires with its
    lease only; the waiter times out and the dead value stays."""
    holder = procs([progs["driver"], "call:60000"], lock_cfg(tmp_path / "h", redis, DEAD_HOLDER))
    holder.expect("enter")
    holder.signal(signal.SIGKILL)
    holder.finish()
    value = redis.cmd("GET", KEY)
    assert ":%d:" % holder.p.pid in value
    cfg = lock_cfg(tmp_path / "w", redis,
                   "lease_ms = 20000; wait_ms = 1000; break_dead_holders = false;")
    r = run([progs["driver"], "call:0"], cfg)
    assert r.returncode == 0 and r.stdout.strip() == EBUSY_LINE, r.stderr
    assert "which is gone" not in r.stderr
    assert redis.cmd("GET", KEY) == value


def this_machine():
    """(boot id, pid namespace inode, this process's start time)."""
    with open("/proc/sys/kernel/random/boot_id") as f:
        boot = f.read().strip()
    ns = int(os.readlink("/proc/self/ns/pid").split("[")[1].rstrip("]"))
    return boot, ns, proc_stat(os.getpid())[1]


def dead_pid():
    """The pid of a process that has exited and been reaped."""
    p = subprocess.Popen(["true"])
    p.wait()
    assert not os.path.exists("/proc/%d" % p.pid)
    return p.pid


def other_boot(boot):
    return ("0" if boot[0] != "0" else "1") + boot[1:]


def forged(pid, boot, ns, start):
    return "%s:%s:%d:%d:%s:%d:%d:%d:forged" % ("0123456789abcdef" * 2, socket.gethostname(),
                                               pid, pid, boot, ns, start,
                                               int(time.time() * 1000))


FORGED = {
    "own-pid-alive": (lambda b, n, s: forged(os.getpid(), b, n, s), False),
    "own-pid-reused": (lambda b, n, s: forged(os.getpid(), b, n, s + 1), True),
    "no-such-pid": (lambda b, n, s: forged(dead_pid(), b, n, s), True),
    "dead-pid-other-boot": (lambda b, n, s: forged(dead_pid(), other_boot(b), n, s), False),
    "dead-pid-other-pid-ns": (lambda b, n, s: forged(dead_pid(), b, n + 1, s), False),
    "unparsable": (lambda b, n, s: "someone", False),
}


@pytest.mark.parametrize("case", list(FORGED))
def test_forged_holder_values(progs, redis, tmp_path, procs, case):
    """Values written by the test: only a holder of this boot and pid
    namespace whose pid is gone or belongs to a process started at another
    time is broken; a live one, another machine's or namespace's, or a value
    that does not parse is waited for."""
    make, broken = FORGED[case]
    value = make(*this_machine())
    redis.cmd("SET", KEY, value, "PX", "20000")
    if broken:
        pid = int(value.split(":")[2])
        assert_broken_for(redis, progs, lock_cfg(tmp_path, redis, DEAD_HOLDER), procs, pid)
    else:
        cfg = lock_cfg(tmp_path, redis, "lease_ms = 20000; wait_ms = 1000;")
        r = run([progs["driver"], "call:0"], cfg)
        assert r.returncode == 0 and r.stdout.strip() == EBUSY_LINE, r.stderr
        assert "which is gone" not in r.stderr
        assert redis.cmd("GET", KEY) == value


# ---- 3. calls that gave up ------------------------------------------------------

class Monitor:
    """A MONITOR connection: the commands Redis runs, one line each."""

    def __init__(self, port):
        self.s = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.buf = b""
        self.s.sendall(b"*1\r\n$7\r\nMONITOR\r\n")
        assert self._line(time.monotonic() + 5) == "+OK"

    def _line(self, deadline):
        while b"\r\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError("MONITOR: nothing more within the time")
            self.s.settimeout(left)
            try:
                data = self.s.recv(65536)
            except socket.timeout:
                continue
            if not data:
                raise AssertionError("MONITOR connection closed")
            self.buf += data
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line.decode(errors="replace")

    def wait_for(self, needle, timeout=5.0):
        """Returns the first command line containing needle (any case)."""
        deadline = time.monotonic() + timeout * MULT
        while True:
            line = self._line(deadline)
            if needle.lower() in line.lower():
                return line

    def close(self):
        self.s.close()


@pytest.fixture
def monitor(redis):
    m = Monitor(redis.port)
    yield m
    m.close()


@pytest.fixture
def proxy(redis):
    p = Proxy(redis.port).start()
    yield p
    p.stop()


GAVE_UP = 'lease_ms = 20000; wait_ms = 300; on_error = "skip"; linger_ms = 0;'
FAST_REDIS = "command_timeout_ms = 200; connect_timeout_ms = 200;"
SET_OF_KEY = '"set" "%s" ' % KEY  # how MONITOR shows the acquire's SET


def assert_gone_within(redis, seconds):
    """The key disappears well before its 20 s lease would end."""
    deadline = time.monotonic() + seconds * MULT
    while redis.cmd("EXISTS", KEY):
        assert time.monotonic() < deadline, \
            "%s still there with %s ms left" % (KEY, redis.cmd("PTTL", KEY))
        time.sleep(0.02)


def finish_alive(p, redis):
    """The program outlived the shim's clean-up; told to end, it exits 0 and
    leaves no key."""
    assert p.p.poll() is None
    p.send()
    rc, _, err = p.finish()
    assert rc == 0, err
    assert lock_keys(redis) == []


def test_call_skipped_on_a_frozen_redis_leaves_no_key(progs, redis, tmp_path, procs, monitor):
    """Redis frozen (SIGSTOP) while a call asks for the lock: the call is
    skipped, yet its SET runs once Redis resumes; that token is deleted by
    the renewal thread, not left for the whole lease."""
    cfg = write_config(tmp_path, redis, 'defaults = { %s };\nlocks = ( { symbol = "hold_call"; '
                       'key = "k"; }, { symbol = "other_call"; key = "warm"; } );\n' % GAVE_UP,
                       redis_extra=FAST_REDIS)
    p = procs([progs["driver"], "other:1", "stdin", "call:0", "stdin"], cfg)
    assert p.expect("other") == "other rc=2 errno=0"  # connected, Redis answered
    os.kill(redis.proc.pid, signal.SIGSTOP)
    try:
        p.send()
        assert p.expect("call") == EBUSY_LINE
    finally:
        os.kill(redis.proc.pid, signal.SIGCONT)
    monitor.wait_for(SET_OF_KEY)  # the skipped call's SET ran after all
    assert_gone_within(redis, 8)
    finish_alive(p, redis)


def proxied_cfg(tmp_path, proxy):
    return write_config(tmp_path, types.SimpleNamespace(port=proxy.port),
                        'locks = ( { symbol = "hold_call"; key = "k"; %s } );\n' % GAVE_UP,
                        redis_extra=FAST_REDIS)


def test_call_whose_reply_was_lost_leaves_no_key(progs, redis, tmp_path, procs, monitor, proxy):
    """Redis runs the SET but its reply is lost (the proxy drops replies): the
    call is skipped, and once replies flow again the token is gone well
    before its lease ends (deleted by the renewal thread, which retries
    until Redis answers). A call on another key first loads the acquire
    script into Redis (else the dropped reply would be EVALSHA's NOSCRIPT,
    and nothing would have run)."""
    warm = run([progs["driver"], "call:0"], lock_cfg(tmp_path / "warm", redis, "", key="warm"))
    assert warm.returncode == 0 and warm.stdout.endswith(OK_LINE + "\n"), warm.stderr
    proxy.set_mode(DROP_REPLIES)
    p = procs([progs["driver"], "call:0", "stdin"], proxied_cfg(tmp_path, proxy))
    assert p.expect("call") == EBUSY_LINE
    monitor.wait_for(SET_OF_KEY)  # Redis ran it
    assert proxy.dropped["reply"] > 0
    proxy.set_mode(PASS)
    assert_gone_within(redis, 8)
    finish_alive(p, redis)


def test_call_into_a_black_hole_leaves_no_key(progs, redis, tmp_path, procs, proxy):
    """Nothing comes back and nothing gets through (black hole): the call is
    skipped within its bounds and no key is left; once the way is clear the
    next call takes and releases the lock normally."""
    proxy.set_mode(BLACK_HOLE)
    p = procs([progs["driver"], "call:0", "stdin", "call:0", "stdin"],
              proxied_cfg(tmp_path, proxy))
    t0 = time.monotonic()
    assert p.expect("call") == EBUSY_LINE
    assert time.monotonic() - t0 < 5 * MULT
    assert proxy.dropped["request"] > 0  # the SET went into the hole
    assert lock_keys(redis) == []
    proxy.set_mode(PASS)
    p.send()
    assert p.expect("call") == OK_LINE
    p.send()
    rc, _, err = p.finish()
    assert rc == 0, err
    assert lock_keys(redis) == []
