# SPDX-License-Identifier: MIT
"""A call never runs on an unrenewed lease: when what keeps the lease cannot
be set up (the renewal thread, memory), the lock is released and on_error
applies. progs/failinj.c, preloaded ahead of the shim, makes pthread_create
or the allocator fail (from the start, or once a file exists)."""
import errno
import os
import shutil
import signal
import subprocess
import tempfile
import time

import pytest

from support.util import ASAN, MULT, PRELOAD, SHIM, others_can_read, run, write_config

KEY = "lockshim:hold_call"
EAGAIN_TEXT = os.strerror(errno.EAGAIN)


def cfg_for(tmp_path, redis, settings):
    return write_config(tmp_path, redis,
                        'locks = ( { symbol = "hold_call"; %s } );\n' % settings)


def inject(progs, mode, arm=None):
    """The environment that preloads failinj just ahead of the shim, failing
    mode. Under ASan its runtime stays first: its pthread_create
    interceptor calls the next definition, failinj's (but its allocator
    never calls the next malloc: see needs_libc_malloc)."""
    parts = PRELOAD.split(":")
    parts.insert(len(parts) - 1, progs["failinj"])
    env = {"LD_PRELOAD": ":".join(parts), "FAILINJ": mode}
    if arm:
        env["FAILINJ_ARM"] = arm
    return env


needs_libc_malloc = pytest.mark.skipif(ASAN, reason="ASan's allocator is the shim's")


def test_injection_control(progs, tmp_path):
    """failinj fails the program's own pthread_create and malloc when asked,
    and only then (a file arms it)."""
    probe, arm = progs["failinj_probe"], str(tmp_path / "arm")
    assert run([probe]).stdout == "thread rc=0 alloc=ok errno=0\n"
    pre = {"LD_PRELOAD": progs["failinj"]}
    assert run([probe], preload=False, **pre).stdout == "thread rc=0 alloc=ok errno=0\n"
    r = run([probe], preload=False, FAILINJ="thread", **pre)
    assert r.stdout == "thread rc=%d alloc=ok errno=0\n" % errno.EAGAIN
    r = run([probe], preload=False, FAILINJ="alloc", **pre)
    # glibc's pthread_create allocates too: memory pressure fails it as well
    assert r.stdout == "thread rc=%d alloc=null errno=%d\n" % (errno.EAGAIN, errno.ENOMEM)
    r = run([probe], preload=False, FAILINJ="thread,alloc", FAILINJ_ARM=arm, **pre)
    assert r.stdout == "thread rc=0 alloc=ok errno=0\n"
    open(arm, "w").close()
    r = run([probe], preload=False, FAILINJ="thread,alloc", FAILINJ_ARM=arm, **pre)
    assert r.stdout == "thread rc=%d alloc=null errno=%d\n" % (errno.EAGAIN, errno.ENOMEM)
    os.unlink(arm)
    r = run([probe], preload=False, FAILINJ="thread,alloc", FAILINJ_ARM=arm, **pre)
    assert r.stdout == "thread rc=0 alloc=ok errno=0\n"


def overlap_run(progs, redis, tmp_path, procs, env):
    """A holds hold_call for a call of `long` s (lease_ms 1000: renewed three
    times a second, expired long before the call ends without renewal);
    once A is inside, B calls it without injection. Returns (A's first
    line, B's output, whether B's call ended while A was still inside, A's
    stderr). A's call sleeps at least `long` s after it printed "enter", so
    B ending sooner than that after the line was read is an overlap for
    certain."""
    long = 4 * MULT
    cfg = cfg_for(tmp_path, redis, "lease_ms = 1000; wait_ms = %d;" % int(20000 * MULT))
    a = procs([progs["driver"], "call:%d" % int(long * 1000)], cfg, **env)
    first = a.expect("")
    t0 = time.monotonic()
    b = run([progs["driver"], "call:0"], cfg)
    overlap = first.startswith("enter") and time.monotonic() - t0 < long and \
        "call rc=42" in b.stdout
    _, _, a_err = a.finish()
    return first, b.stdout, overlap, a_err


def test_no_overlap_when_renewal_cannot_start(progs, redis, tmp_path, procs):
    """The bug: the renewal thread could not start, the call ran anyway, its
    lease expired and another process entered while it was still inside."""
    first, b_out, overlap, a_err = overlap_run(progs, redis, tmp_path, procs,
                                               inject(progs, "thread"))
    assert not overlap, "B entered while A ran on an unrenewed lease: %s" % a_err
    assert first == "call rc=-1 errno=%d" % errno.EBUSY, a_err
    assert b_out == "enter 0\ncall rc=42 errno=0\n"
    assert ("hold_call: lock %s released at once: its lease could not be kept (cannot "
            "start the renewal thread: %s)" % (KEY, EAGAIN_TEXT)) in a_err


def test_overlap_control_with_renewal(progs, redis, tmp_path, procs):
    """Control: the same two processes without injection never overlap (the
    lease is renewed while A runs), so the check above can tell."""
    first, b_out, overlap, a_err = overlap_run(progs, redis, tmp_path, procs, {})
    assert first.startswith("enter"), a_err
    assert not overlap
    assert b_out == "enter 0\ncall rc=42 errno=0\n"


@pytest.mark.parametrize("settings,out,status", [
    ('on_error = "skip"; return = 9; errno = "ENOLCK";', "call rc=9 errno=%d" % errno.ENOLCK, 0),
    ('on_error = "exit"; exit_code = 71;', "", 71),
    ('on_error = "abort";', "", -signal.SIGABRT),
    ('on_error = "proceed";', "enter 0\ncall rc=42 errno=0", 0),
])
def test_on_error_applies_and_key_released(progs, redis, tmp_path, settings, out, status):
    """on_error (not on_timeout) applies, and the key is deleted at once,
    not left for its 60 s lease."""
    cfg = cfg_for(tmp_path, redis, 'lease_ms = 60000; on_timeout = "exit"; '
                  + settings)
    r = run([progs["driver"], "call:0"], cfg, **inject(progs, "thread"))
    assert r.returncode == status, r.stderr
    assert r.stdout.strip() == out
    assert ("lock %s released at once: its lease could not be kept (cannot start the "
            "renewal thread: %s)" % (KEY, EAGAIN_TEXT)) in r.stderr
    assert redis.cmd("EXISTS", KEY) == 0


def test_next_call_tries_again(progs, redis, tmp_path, procs):
    """A process recovers: once threads can be created again, the next call
    starts the renewal thread and runs guarded."""
    arm = str(tmp_path / "arm")
    cfg = cfg_for(tmp_path, redis, 'lease_ms = 60000; on_error = "skip"; errno = "ENOLCK";')
    p = procs([progs["driver"], "stdin", "call:0", "stdin", "call:0"], cfg,
              **inject(progs, "thread", arm))
    open(arm, "w").close()
    p.send()
    assert p.expect("call") == "call rc=-1 errno=%d" % errno.ENOLCK
    assert redis.cmd("EXISTS", KEY) == 0
    os.unlink(arm)
    p.send()
    assert p.expect("enter") == "enter 0"
    assert p.expect("call") == "call rc=42 errno=0"
    status, _, err = p.finish()
    assert status == 0 and err.count("its lease could not be kept") == 1, err


def test_waiter_gives_up_when_renewal_cannot_start(progs, redis, tmp_path):
    """A caller that finds the lock busy starts the renewal thread before it
    queues; when that fails it does not wait for a lock it could not keep."""
    redis.cmd("SET", KEY, "other-owner", "PX", "1500")
    cfg = cfg_for(tmp_path, redis, 'lease_ms = 60000; wait_ms = 10000; on_timeout = "exit"; '
                  'on_error = "skip"; errno = "ENOLCK";')
    r = run([progs["driver"], "call:0"], cfg, timeout=5 * MULT, **inject(progs, "thread"))
    assert r.stdout.strip() == "call rc=-1 errno=%d" % errno.ENOLCK, r.stderr
    assert ("hold_call: lock %s not taken: its lease could not be kept (cannot start the "
            "renewal thread: %s)" % (KEY, EAGAIN_TEXT)) in r.stderr
    assert redis.cmd("GET", KEY) == "other-owner"
    assert redis.cmd("EXISTS", KEY + ":q") == 0 or redis.cmd("LLEN", KEY + ":q") == 0


@needs_libc_malloc
def test_allocation_failure_after_startup(progs, redis, tmp_path, procs):
    """Allocation fails once the program runs (the first guarded call's
    lock state cannot be made): on_error applies, nothing is taken."""
    arm = str(tmp_path / "arm")
    cfg = cfg_for(tmp_path, redis, 'lease_ms = 60000; on_error = "skip"; return = 7; '
                  'errno = "ENOMEM";')
    p = procs([progs["driver"], "other:1", "stdin", "call:0"], cfg,
              **inject(progs, "alloc", arm))
    assert p.expect("other") == "other rc=2 errno=0"
    open(arm, "w").close()
    p.send()
    assert p.expect("call") == "call rc=7 errno=%d" % errno.ENOMEM
    status, rest, err = p.finish()
    assert status == 0 and "enter" not in rest, err
    assert ("hold_call: lock %s not taken: its lease could not be kept (out of memory for "
            "the thread's lock state)" % KEY) in err
    assert redis.cmd("EXISTS", KEY) == 0


# ---- real-world triggers: RLIMIT_NPROC and RLIMIT_AS -------------------------

def free_uid():
    """A uid no process of this machine runs as (RLIMIT_NPROC counts the
    processes and threads of the real uid)."""
    used = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open("/proc/%s/status" % pid) as f:
                used.update(int(l.split()[1]) for l in f if l.startswith("Uid:"))
        except OSError:
            pass
    uid = 200000 + os.getpid() % 100000
    while uid in used:
        uid += 1
    return uid


@pytest.fixture
def public_dir(progs):
    """A directory any uid can read, holding the driver and its library (the
    session's build directories are root's alone)."""
    d = tempfile.mkdtemp(prefix="lockshim-nproc-")
    os.chmod(d, 0o755)
    for name in ("driver", "libtarget.so"):
        shutil.copy(os.path.join(progs["dir"], name), d)
    yield d
    shutil.rmtree(d)


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv") or
                    not shutil.which("prlimit"), reason="needs root, setpriv and prlimit")
@pytest.mark.skipif(not others_can_read(SHIM), reason="a fresh uid cannot read the shim here "
                    "(a directory above the build is not searchable by others)")
def test_rlimit_nproc(redis, public_dir):
    """RLIMIT_NPROC, as a user meets it: an unprivileged uid limited to one
    task cannot start the renewal thread (root is exempt from the limit,
    capabilities or not, so the program runs as a uid of its own). The
    control: with two tasks allowed the same call runs, guarded."""
    cfg = os.path.join(public_dir, "lockshim.cfg")
    with open(cfg, "w") as f:
        f.write('redis = { host = "127.0.0.1"; port = %d; };\n'
                'locks = ( { symbol = "hold_call"; lease_ms = 60000; on_error = "skip"; '
                'errno = "ENOLCK"; } );\n' % redis.port)
    os.chmod(cfg, 0o644)
    uid = free_uid()

    def as_user(nproc):
        return run(["prlimit", "--nproc=%d:%d" % (nproc, nproc), "setpriv", "--reuid=%d" % uid,
                    "--regid=%d" % uid, "--clear-groups", "env", "LD_PRELOAD=" + PRELOAD,
                    os.path.join(public_dir, "driver"), "call:0"], preload=False,
                   LOCKSHIM_CONFIG=cfg, LD_LIBRARY_PATH=public_dir)
    r = as_user(1)
    assert r.stdout == "call rc=-1 errno=%d\n" % errno.ENOLCK, r.stderr
    assert ("lock %s released at once: its lease could not be kept (cannot start the "
            "renewal thread: %s)" % (KEY, EAGAIN_TEXT)) in r.stderr
    assert redis.cmd("EXISTS", KEY) == 0
    r = as_user(2)
    assert r.stdout == "enter 0\ncall rc=42 errno=0\n", r.stderr
    assert "could not be kept" not in r.stderr


@pytest.mark.skipif(ASAN, reason="ASan reserves terabytes of address space")
@pytest.mark.parametrize("limited", [True, False])
def test_rlimit_as_after_startup(progs, redis, tmp_path, procs, limited):
    """Memory pressure, as RLIMIT_AS makes it: once the program runs, its
    address space may grow by 1 MiB only: small allocations succeed, a
    thread's stack does not, so the renewal thread cannot start. The
    control (limited False) runs the same steps without the limit."""
    cfg = cfg_for(tmp_path, redis, 'lease_ms = 60000; on_error = "skip"; errno = "ENOLCK";')
    p = procs([progs["driver"], "other:1", "stdin", "call:0"], cfg)
    assert p.expect("other") == "other rc=2 errno=0"
    if limited:
        with open("/proc/%d/status" % p.p.pid) as f:
            vm_kib = next(int(l.split()[1]) for l in f if l.startswith("VmSize:"))
        subprocess.run(["prlimit", "--pid", str(p.p.pid), "--as=%d:" % ((vm_kib + 1024) * 1024)],
                       check=True)
    p.send()
    status, out, err = p.finish()
    assert status == 0, err
    if not limited:
        assert out == "enter 0\ncall rc=42 errno=0\n", err
        return
    assert out == "call rc=-1 errno=%d\n" % errno.ENOLCK, err
    assert ("lock %s released at once: its lease could not be kept (cannot start the "
            "renewal thread: %s)" % (KEY, EAGAIN_TEXT)) in err
    assert redis.cmd("EXISTS", KEY) == 0
