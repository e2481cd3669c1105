# SPDX-License-Identifier: MIT
"""backend = "etcd" (issue 23, its first step): concurrency.Mutex's recipe
on a private etcd (support/etcd.py), through the module liblockshim-etcd.so
(libcurl, etcd's JSON gateway).

The waiter woken by the release through its watch (retry_max_ms and its
lease's third far longer), a SIGKILLed holder freed at its lease's end
(not before, not at wait_ms), a frozen holder past its lease: the loss
reported and the next holder's key left alone, wait_ms with on_timeout,
the lease rounded up to whole seconds (2 at least), keys with / kept
apart, refusals (78), and the command's check and lock. What every module
backend shares (exclusion and its control, fences increasing (create
revisions here), the module missing, what a Redis-guarded program maps,
locks on send/write/poll, status/unlock/metrics exiting 1) is in
test_modules.py.
"""
import errno
import re
import signal
import time

import pytest

from support.etcd import EtcdServer, skip_reason
from support.process import cpu_ticks
from support.scenarios import refused_setting
from support.server import serving
from support.util import CLI, MULT, run, wait_for, write_config

pytestmark = pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")

BLOCK_LOCK = ('locks = ( { symbol = "block_call"; key = "blk"; wait_ms = %d; '
              'on_timeout = "skip"; %s } );\n')
HOLD_LOCK = 'locks = ( { symbol = "hold_call"; key = "hold"; %s } );\n'


@pytest.fixture(scope="module")
def etcd():
    yield from serving(EtcdServer())


@pytest.fixture
def own_etcd(request):
    """A server of the test's own (it is restarted or frozen)."""
    yield from serving(EtcdServer(), request, "etcd")


@pytest.fixture(autouse=True)
def nothing_left(etcd):
    """Every test starts, and must end, with no lock key in etcd."""
    wait_for(lambda: etcd.keys() == [], what="no key left by the previous test")
    yield
    try:
        wait_for(lambda: etcd.keys() == [], timeout=10 * MULT, what="no key left")
    finally:  # a failed test's keys must not fail the next ones
        for key in etcd.keys():
            etcd.call("/v3/lease/revoke", {"ID": str(key[3])})


def etcd_config(tmp_path, etcd, body, extra=""):
    """A config of backend "etcd" on etcd plus body; returns its path."""
    return write_config(tmp_path, None, 'backend = "etcd";\netcd = { endpoints = ( "%s" ); '
                        '%s };\n%s' % (etcd.endpoint(), extra, body))


# ---- keys -----------------------------------------------------------------------

def test_keys_with_slashes_are_kept_apart(etcd, tmp_path):
    """"a" and "a/b" are two locks: held at once (the key's / is escaped, so
    neither range of holders holds the other's key)."""
    cfg = etcd_config(tmp_path, etcd, "")
    inner = "%s lock -c %s -w 0 a/b -- sh -c 'echo inner=$LOCKSHIM_FENCE'" % (CLI, cfg)
    r = run([CLI, "lock", "-c", cfg, "-w", "0", "a", "--", "sh", "-c", inner], LD_PRELOAD="")
    assert r.returncode == 0 and "inner=" in r.stdout, (r.stdout, r.stderr)


# ---- waiting, leases ------------------------------------------------------------

@pytest.mark.timing
def test_waiter_is_woken_by_the_release(bg, worker_progs, etcd, tmp_path):
    """The waiter's key is queued behind the holder's and its wait is the
    watch: retry_max_ms (30 s) and a third of its lease (20 s) would wake
    it far later. Over 2 s it spends (nearly) no CPU; after the release it
    enters within 0.5 s."""
    cfg = etcd_config(tmp_path, etcd, BLOCK_LOCK % (60000, "lease_ms = 60000; "
                                                    "retry_max_ms = 30000;"))
    holder = bg([worker_progs["block"], "stay"], cfg)
    holder.expect("enter")
    waiter = bg([worker_progs["block"]], cfg)
    wait_for(lambda: len(etcd.keys()) == 2, what="the waiter's key")
    before = cpu_ticks(waiter.p.pid)
    time.sleep(2)  # the span measured, not a synchronisation
    assert cpu_ticks(waiter.p.pid) - before <= 2
    assert len(etcd.keys()) == 2
    holder.send()
    holder.expect("call rc=42")
    t0 = time.monotonic()
    waiter.expect("enter", timeout=5)
    assert time.monotonic() - t0 < 0.5 * MULT
    waiter.send()
    waiter.expect("call rc=42")
    holder.send()


def killed_holder(bg, block, etcd, cfg):
    """Kills a holder of cfg's lock while a second one waits; returns how
    long the waiter took to enter."""
    holder = bg([block], cfg)
    holder.expect("enter")
    waiter = bg([block], cfg)
    wait_for(lambda: len(etcd.keys()) == 2, what="the waiter's key")
    t0 = time.monotonic()
    holder.p.kill()
    holder.p.wait()  # reaped, as a dead process is by its parent
    waiter.expect("enter", timeout=25 * MULT)
    took = time.monotonic() - t0
    waiter.send()
    assert waiter.expect("call").startswith("call rc=42")
    return took


def test_killed_holder_frees_the_lock_at_its_lease_end(bg, worker_progs, etcd, tmp_path):
    """lease_ms 2000, break_dead_holders off (a holder on another host): the
    waiter enters once the lease ends (its last renewal at most a third of
    it before the kill), not at once, and far before wait_ms (30 s)."""
    cfg = etcd_config(tmp_path, etcd, BLOCK_LOCK % (30000, "lease_ms = 2000; "
                                                    "break_dead_holders = false;"))
    took = killed_holder(bg, worker_progs["block"], etcd, cfg)
    assert 1.2 <= took < 4 * MULT, took


def test_killed_holder_of_this_machine_is_broken(bg, worker_progs, etcd, tmp_path):
    """break_dead_holders (the default): the waiter, at its next ask (a
    third of its lease: 10 s here), sees the holder's process gone and
    revokes its lease (the ID comes from the holder's value), where the
    lease would end 20 to 30 s after the kill."""
    cfg = etcd_config(tmp_path, etcd, BLOCK_LOCK % (60000, "lease_ms = 30000;"))
    took = killed_holder(bg, worker_progs["block"], etcd, cfg)
    assert took < 10 + 5 * MULT, took


def test_live_holder_makes_the_waiter_time_out(bg, worker_progs, etcd, tmp_path):
    """wait_ms bounds the wait; on_timeout "skip" applies; the waiter's key
    is gone with it."""
    cfg = etcd_config(tmp_path, etcd, BLOCK_LOCK % (1500, ""))
    holder = bg([worker_progs["block"]], cfg)
    holder.expect("enter")
    t0 = time.monotonic()
    r = run([worker_progs["block"]], cfg)
    took = time.monotonic() - t0
    assert r.stdout.strip() == "call rc=-1 errno=16", (r.stdout, r.stderr)
    assert 1.4 <= took < 1.5 + 5 * MULT
    assert "still held by another owner after 1500 ms" in r.stderr
    assert len(etcd.keys()) == 1
    holder.send()
    holder.expect("call rc=42")


def test_try_lock_leaves_no_key(bg, worker_progs, etcd, tmp_path):
    """wait_ms = 0 against a holder: refused at once, its key gone with its
    lease (it never waits, so it must not stay queued)."""
    cfg = etcd_config(tmp_path, etcd, BLOCK_LOCK % (0, ""))
    holder = bg([worker_progs["block"]], cfg)
    holder.expect("enter")
    r = run([worker_progs["block"]], cfg)
    assert r.stdout.strip() == "call rc=-1 errno=16", (r.stdout, r.stderr)
    assert len(etcd.keys()) == 1
    holder.send()
    holder.expect("call rc=42")


def test_frozen_holder_loses_its_lease_and_spares_the_next(procs, progs, etcd, tmp_path):
    """A frozen past its lease (2 s): its key goes, B enters; A, thawed,
    reports the loss (its keepalive answered TTL 0) and its release leaves
    B's key alone."""
    cfg = etcd_config(tmp_path, etcd, HOLD_LOCK % "lease_ms = 2000; wait_ms = 20000;")
    a = procs([progs["driver"], "call:3000"], cfg)
    a.expect("enter")
    a.signal(signal.SIGSTOP)
    wait_for(lambda: etcd.keys() == [], what="A's lease to end")
    b = procs([progs["driver"], "call:4000"], cfg)
    b.expect("enter")
    (bkey, bval, _, _), = etcd.keys()
    assert ":%d:" % b.p.pid in bval
    a.signal(signal.SIGCONT)
    rc, out, err = a.finish()
    assert rc == 0 and "call rc=42" in out
    assert "was lost" in err, err
    assert [k[0] for k in etcd.keys()] == [bkey]
    assert b.expect("call") == "call rc=42 errno=0"
    assert b.finish()[0] == 0


def test_renewal_keeps_the_lease_and_rounds_it_up(procs, progs, etcd, tmp_path):
    """lease_ms = 300 is a 2 s etcd lease, kept by the renewal thread for a
    4 s call (control: the same call with renewal stopped by max_hold_ms
    loses the key)."""
    cfg = etcd_config(tmp_path, etcd, HOLD_LOCK % "lease_ms = 300;")
    p = procs([progs["driver"], "call:4000"], cfg)
    p.expect("enter")
    (_, _, _, lease), = etcd.keys()
    assert etcd.lease_ttl(lease)[0] == 2
    end = time.monotonic() + 3
    while time.monotonic() < end:
        assert len(etcd.keys()) == 1
        time.sleep(0.1)
    assert p.expect("call") == "call rc=42 errno=0"
    rc, _, err = p.finish()
    assert rc == 0 and "lost" not in err, err
    (tmp_path / "c").mkdir()
    cfg = etcd_config(tmp_path / "c", etcd, HOLD_LOCK % "lease_ms = 300; max_hold_ms = 50;")
    p = procs([progs["driver"], "call:4000"], cfg)
    p.expect("enter")
    wait_for(lambda: etcd.keys() == [], timeout=3.5 * MULT, what="the key's expiry")
    rc, _, err = p.finish()
    assert rc == 0 and "exceeded max_hold_ms" in err, err


def test_exit_inside_a_guarded_call_releases_the_lock(progs, etcd, tmp_path):
    """exit(3) from inside the call: the lease is revoked at exit (control:
    its lease, 60 s, would keep the key long after)."""
    cfg = etcd_config(tmp_path, etcd, 'locks = ( { symbol = "exit_call"; lease_ms = 60000; '
                      '} );\n')
    r = run([progs["driver"], "exit:9"], cfg)
    assert r.returncode == 9, r.stderr
    assert etcd.keys() == []


def test_fork_inside_a_guarded_call(progs, etcd, tmp_path):
    """test_fork's case with etcd: the child returns through the wrapper
    without releasing "fk" (its probe of that key is refused, not entered),
    a lock the child takes itself works, and "fk" is released once, by the
    parent."""
    cfg = etcd_config(tmp_path, etcd, 'log_level = "debug";\n'
                      'locks = ( { symbol = "fork_call"; key = "fk"; lease_ms = 2000; },\n'
                      '  { symbol = "other_call"; key = "fk"; wait_ms = 0; },\n'
                      '  { symbol = "hold_call"; key = "child-own"; } );\n')
    r = run([progs["driver"], "fork"], cfg)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert "child-other rc=-1 errno=%d" % errno.EBUSY in lines, r.stdout
    assert "child-own rc=42 errno=0" in lines, r.stdout
    assert "parent-fork rc=1 errno=0" in lines, r.stdout
    assert r.stderr.count("released lockshim:fk") == 1, r.stderr
    assert r.stderr.count("released lockshim:child-own") == 1, r.stderr
    assert "no longer ours" not in r.stderr
    assert etcd.keys() == []


# ---- the server down, restarted, frozen ---------------------------------------------

def test_server_restarted_mid_run(bg, worker_progs, own_etcd, tmp_path):
    """Down: a call gives up within wait_ms (on_error "skip", an error
    line). Back within the holder's lease: the lease survived (etcd keeps
    leases across a restart), so the holder keeps its lock and is not told
    of a loss; a caller waits for it; then calls work and nothing is left."""
    cfg = etcd_config(tmp_path, own_etcd, 'locks = ( { symbol = "block_call"; key = "blk"; '
                      'wait_ms = 1500; on_error = "skip"; on_timeout = "skip"; '
                      'lease_ms = 10000; } );\n',
                      "connect_timeout_ms = 300; command_timeout_ms = 300;")
    holder = bg([worker_progs["block"]], cfg)
    holder.expect("enter")
    own_etcd.stop()
    t0 = time.monotonic()
    r = run([worker_progs["block"]], cfg)
    assert r.stdout.startswith("call rc=-1"), (r.stdout, r.stderr)
    assert time.monotonic() - t0 < 1.5 + 3 * MULT
    assert "etcd unavailable for 1500 ms" in r.stderr, r.stderr
    own_etcd.start()
    r = run([worker_progs["block"]], cfg, timeout=20)
    assert r.stdout.startswith("call rc=-1") and "still held by another owner" in r.stderr, \
        (r.stdout, r.stderr)
    holder.send()
    holder.expect("call rc=42")
    holder.p.wait(timeout=10)
    assert "lost" not in holder.stderr(), holder.stderr()
    r = run([worker_progs["block"]], cfg, timeout=20)
    assert "call rc=42" in r.stdout, (r.stdout, r.stderr)
    assert own_etcd.keys() == []


def test_frozen_server_bounds_every_call(worker_progs, own_etcd, tmp_path):
    """The server stopped (SIGSTOP): its kernel still accepts connections,
    nothing answers; the call gives up by command_timeout_ms and wait_ms,
    on_error applied."""
    cfg = etcd_config(tmp_path, own_etcd, 'locks = ( { symbol = "block_call"; key = "blk"; '
                      'wait_ms = 1000; on_error = "skip"; } );\n',
                      "connect_timeout_ms = 300; command_timeout_ms = 300;")
    own_etcd.proc.send_signal(signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        r = run([worker_progs["block"]], cfg, timeout=30)
        took = time.monotonic() - t0
    finally:
        own_etcd.proc.send_signal(signal.SIGCONT)
    assert r.stdout.startswith("call rc=-1"), (r.stdout, r.stderr)
    assert took < 1.0 + 3 * MULT, took
    assert "etcd unavailable for 1000 ms" in r.stderr, r.stderr


# ---- refusals -------------------------------------------------------------------

@pytest.mark.parametrize("setting", [
    "handoff_ms = 5", "limit = 2", "mode = \"shared\"", "linger_ms = 10",
])
@pytest.mark.parametrize("where", ["lock", "defaults"])
def test_refused_settings(etcd, tmp_path, setting, where):
    refused_setting(lambda body: etcd_config(tmp_path, etcd, body), setting, where, "etcd")


@pytest.mark.parametrize("endpoints,says", [
    ('( )', "is empty"), ('( "http://127.0.0.1:2379" )', "without a scheme"),
    ('( "127.0.0.1" )', "is not host:port"),
])
def test_bad_endpoints_are_refused(tmp_path, endpoints, says):
    cfg = write_config(tmp_path, None, 'backend = "etcd";\netcd = { endpoints = %s; };\n'
                       'locks = ( { symbol = "rename"; key = "k"; } );\n' % endpoints)
    r = run([CLI, "check", "-c", cfg])
    assert r.returncode == 78 and "etcd.endpoints" in r.stderr and says in r.stderr, r.stderr


def test_settings_accepted_where_the_lease_gives_them_meaning(etcd, tmp_path):
    """Control of the refusals: lease_ms, on_lost, fair, retry_max_ms and
    max_hold_ms are honoured."""
    cfg = etcd_config(tmp_path, etcd, HOLD_LOCK % 'lease_ms = 5000; on_lost = "kill"; '
                      'fair = true; retry_max_ms = 50; max_hold_ms = 100000;')
    r = run([CLI, "check", "-c", cfg])
    assert r.returncode == 0, r.stderr


# ---- the command ----------------------------------------------------------------

def test_check_probes_the_server(etcd, tmp_path):
    cfg = etcd_config(tmp_path, etcd, 'locks = ( { symbol = "rename"; key = "k"; } );\n')
    r = run([CLI, "check", "-c", cfg])
    assert r.returncode == 0, r.stderr
    assert re.search(r"^etcd: ok \(.* at etcd 127\.0\.0\.1:%d, prefix /lockshim/ " % etcd.port,
                     r.stdout, re.M), r.stdout


def test_check_reports_a_server_that_is_down(tmp_path):
    cfg = write_config(tmp_path, None, 'backend = "etcd";\netcd = { endpoints = '
                       '( "127.0.0.1:1" ); };\nlocks = ( { symbol = "rename"; key = "k"; } );\n')
    r = run([CLI, "check", "-c", cfg])
    assert r.returncode not in (0, 78) and "etcd: connect:" in r.stderr, r.stderr


def test_second_endpoint_is_used_when_the_first_is_down(etcd, tmp_path):
    cfg = write_config(tmp_path, None, 'backend = "etcd";\netcd = { endpoints = '
                       '( "127.0.0.1:1", "%s" ); };\n' % etcd.endpoint())
    r = run([CLI, "lock", "-c", cfg, "job", "--", "true"], LD_PRELOAD="")
    assert r.returncode == 0, r.stderr


def test_lock_command_holds_and_fences(procs, etcd, tmp_path):
    """LOCKSHIM_FENCE is the create revision of the key seen in etcd while
    the command runs; the key goes at its end."""
    cfg = etcd_config(tmp_path, etcd, "")
    p = procs([CLI, "lock", "-c", cfg, "job", "--", "sh", "-c",
               "echo fence=$LOCKSHIM_FENCE; read x"], cfg, preload=False)
    fence = int(p.expect("fence=").split("=")[1])
    (key, _, rev, _), = etcd.keys()
    assert key.startswith("/lockshim/lockshim:job/") and fence == rev > 0
    p.send()
    assert p.finish()[0] == 0

