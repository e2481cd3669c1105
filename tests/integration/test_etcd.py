# SPDX-License-Identifier: MIT
"""backend = "etcd" (issue 23, its first step): concurrency.Mutex's recipe
on a private etcd (support/etcd.py), through the module liblockshim-etcd.so
(libcurl, etcd's JSON gateway).

The waiter woken by the release through its watch (retry_max_ms and its
lease's third far longer), a SIGKILLed holder freed at its lease's end
(not before, not at wait_ms), a frozen holder past its lease: the loss
reported and the next holder's key left alone, wait_ms with on_timeout,
the lease rounded up to whole seconds (2 at least), keys with / kept
apart, refusals (78), and the command's check, lock, status and unlock.
Step 2: a 3-member cluster whose leader is SIGKILLed mid-run
(support/etcd.py's Cluster), and etcd_holders, the reader of status
(progs/etcd_holders.c). Step 4: limit (a semaphore) and mode = "shared"
(the mode in the key's name), and linger_ms. Step 6: the hosts' counts
(one key per host, no lease), exact under concurrent shipments, out of
status's and unlock's way, and past etcd's request limit. What every
module backend shares (exclusion and its control, fences increasing
(create revisions here), the module missing, what a Redis-guarded program
maps, locks on send/write/poll, `lockshim metrics`) is in test_modules.py.
"""
import base64
import errno
import json
import os
import platform
import random
import re
import signal
import subprocess
import threading
import time

import pytest

from support.etcd import Cluster, EtcdServer, skip_reason
from support.etcd_secure import ROOT_PASSWORD, SecureEtcd, make_certs
from support.process import cpu_ticks
from support.proxy import Proxy
from support.scenarios import (limit_bounds_the_holders, limit_mismatch_refused,
                                refused_setting, scrape, unlock_refuses_then_forces, val)
from support.secure import NOBODY, NOGROUP, Layout
from support.server import call_failed, serving
from support.sets import lock_cli, readers_overlap_writers_alone, replay, set_waiter_woken, \
    start as sets_start, writer_behind_readers
from support.util import (ASAN, CLI, MULT, ROOT, TSAN, cc, run, shim_env, status_by_key,
                          wait_for, write_config)
from support.workers import race

pytestmark = pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")

BLOCK_LOCK = ('locks = ( { symbol = "block_call"; key = "blk"; wait_ms = %d; '
              'on_timeout = "skip"; %s } );\n')
RACE_ETCD = ('locks = ( { symbol = "ledger_update"; key = "ledger:{arg0:str}"; '
             'wait_ms = 30000; } );\n')
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


# ---- a 3-member cluster whose leader is killed --------------------------------------
#
# The observed program of test_sets.py (support/sets.py): each guarded call
# of set_write appends "w+" to a log when it starts and "w-" when it ends;
# replaying the log counts who was inside at once.

CROWD = 4  # processes, 2 threads each, 20 ms calls
CLUSTER_LOCK = ('locks = ( { symbol = "set_write"; key = "k"; wait_ms = %d; lease_ms = 3000; '
                'on_error = "skip"; on_timeout = "skip"; } );\n')


# libcurl's words for a member that went away (refused, cut mid-reply)
CURL_MEMBER_GONE = ("Couldn't connect", "partial file", "Failure when receiving",
                    "Failed sending", "Server returned nothing")


@pytest.fixture
def cluster(request):
    c = Cluster()
    try:
        yield c.start()
        if call_failed(request):
            print(c.tail())
    finally:
        c.cleanup()


def sets_end(p, timeout):
    """Waits for the sets program p (at most timeout s); returns its fields
    (ok, failed, max_ms) and its stderr."""
    out, err = p.communicate(timeout=timeout)
    assert p.returncode == 0, err[-3000:]
    done = [l for l in out.splitlines() if l.startswith("done")]
    assert done, (out, err[-3000:])
    return {k: int(v) for k, v in (f.split("=") for f in done[0].split()[1:])}, err


def log_text(log):
    with open(log) as f:
        return f.read()


@pytest.mark.timing
def test_control_crowd_is_inside_together_unguarded(sets_prog, tmp_path):
    """The leader test's workload without the shim: writers overlap."""
    log = str(tmp_path / "log")
    ps = [sets_start(sets_prog, "w", None, log, 2, 5, 20) for _ in range(CROWD)]
    for p in ps:
        sets_end(p, 30)
    assert replay(log)[1] > 1


@pytest.mark.timing
@pytest.mark.parametrize("wait_ms", [8000, 1000], ids=["rides-over", "gives-up"])
def test_leader_killed_mid_run(sets_prog, cluster, tmp_path, wait_ms):
    """4 processes x 2 threads of guarded calls, endpoints = the three members
    with the leader first (every connection starts on it); SIGKILL of the
    leader once 20 calls entered, the run stopped once 20 more entered after
    the kill. Never two inside at once; every call entered or applied its
    on_error/on_timeout ("skip", one error line each); every process ends
    within wait_ms + 5 s of the stop; no line reports the dead member; no
    key is left and a try-lock (wait_ms = 0) gets the lock at once. The
    election takes about 2 s: wait_ms = 8000 rides over it, 1000 gives up
    during it (some calls skipped)."""
    leader = cluster.leader()
    head = 'backend = "etcd";\netcd = { endpoints = ( %s ); connect_timeout_ms = 500; ' \
           'command_timeout_ms = 1000; };\n' % ", ".join(
               '"%s"' % e for e in cluster.endpoints(first=leader))
    cfg = write_config(tmp_path, None, head + CLUSTER_LOCK % wait_ms)
    log, stop = str(tmp_path / "log"), str(tmp_path / "stop")
    open(log, "w").close()
    ps = [sets_start(sets_prog, "w", cfg, log, 2, 1, 20, stop) for _ in range(CROWD)]
    try:
        wait_for(lambda: log_text(log).count("w+") >= 20, timeout=20, what="20 calls")
        with open(log, "a") as f:
            f.write("K\n")
        cluster.kill(leader)
        wait_for(lambda: log_text(log).split("K\n", 1)[1].count("w+") >= 20, timeout=30,
                 what="20 calls after the kill")
        open(stop, "w").close()
        t0 = time.monotonic()
        ends = [sets_end(p, wait_ms / 1000 * 2 * MULT + 10) for p in ps]
        took = time.monotonic() - t0
    finally:
        open(stop, "w").close()
        for p in ps:
            if p.poll() is None:
                p.kill()
                p.wait()
    ok = sum(f["ok"] for f, _ in ends)
    failed = sum(f["failed"] for f, _ in ends)
    err = "".join(e for _, e in ends)
    gave_up = [l for l in err.splitlines() if " not taken: " in l or " still held by " in l]
    writers, mixed = replay(log)[1:]
    assert writers == 1 and not mixed, err[-3000:]
    assert ok == log_text(log).count("w+") and failed == len(gave_up), (ok, failed, err[-3000:])
    assert took < (wait_ms / 1000 + 5) * MULT, (took, err[-3000:])
    # the dead member is passed over within the request (the next endpoint),
    # never reported: what is left is the election (no leader: timeouts)
    gone = [l for l in err.splitlines() if any(m in l for m in CURL_MEMBER_GONE)]
    assert gone == [], gone
    assert max(f["max_ms"] for f, _ in ends) < wait_ms + 3000 * MULT, (ends, err[-3000:])
    print("ok %d failed %d, the stop took %.1f s; stderr:\n%s" % (ok, failed, took, err))
    live = cluster.alive()
    assert live.keys() == [], live.keys()
    (tmp_path / "try").mkdir()
    r = run([sets_prog, "w", "1", "1", "0"], write_config(tmp_path / "try", None,
                                                          head + CLUSTER_LOCK % 0))
    assert "done ok=1 failed=0" in r.stdout, (r.stdout, r.stderr)


LAPSED = "expired while etcd was unreachable"


@pytest.mark.timing
@pytest.mark.parametrize("reach", ["all", "frozen-only"])
def test_frozen_member_is_passed_over(sets_prog, cluster, tmp_path, reach):
    """A holder of lease_ms = 3000 inside a 6 s call, its endpoints a
    follower first (every connection starts there), which is frozen
    (SIGSTOP) once the call entered: a keep-alive times out at
    command_timeout_ms, the connection is made again through the next
    member that answers, so the lease lives, no loss is reported, and a
    second process (endpoints: a live member first) enters only after the
    holder left. Control ("frozen-only": the holder's endpoints are the
    frozen member alone): the lease lapses about 3 s in, and the second
    process enters beside the holder. (The request that
    timed out is not sent elsewhere: the next attempt opens a connection,
    which passes over the frozen member at connect_timeout_ms.)"""
    leader = cluster.leader()
    frozen = next(m for m in cluster.members if m is not leader)
    other = next(m for m in cluster.members if m is not leader and m is not frozen)
    lock = ('locks = ( { symbol = "set_write"; key = "k"; wait_ms = 30000; lease_ms = 3000; '
            '} );\n')

    def config(endpoints, where):
        (tmp_path / where).mkdir()
        return write_config(tmp_path / where, None, 'backend = "etcd";\netcd = { endpoints = '
                            '( %s ); connect_timeout_ms = 500; command_timeout_ms = 500; };\n'
                            % ", ".join('"%s"' % e for e in endpoints) + lock)
    mine = cluster.endpoints(first=frozen)[:1 if reach == "frozen-only" else 3]
    log = str(tmp_path / "log")
    open(log, "w").close()
    holder = sets_start(sets_prog, "w", config(mine, "holder"), log, 1, 1, 6000)
    second = None
    try:
        wait_for(lambda: "w+" in log_text(log), timeout=20, what="the holder inside")
        os.kill(frozen.proc.pid, signal.SIGSTOP)
        second = sets_start(sets_prog, "w", config(cluster.endpoints(first=other), "second"),
                            log, 1, 1, 10)
        first_end = sets_end(holder, 30)
        second_end = sets_end(second, 40)
    finally:
        os.kill(frozen.proc.pid, signal.SIGCONT)
        for p in (holder, second):
            if p and p.poll() is None:
                p.kill()
                p.wait()
    err = first_end[1] + second_end[1]
    assert first_end[0]["ok"] == 1 and second_end[0]["ok"] == 1, (first_end, second_end)
    if reach == "frozen-only":
        # the overlap is the proof; the holder's line of the lapse may come
        # after its call ended (TSan: not within the 6 s)
        assert replay(log)[1] == 2, (log_text(log), err[-3000:])
        return
    assert replay(log)[1] == 1, (log_text(log), err[-3000:])
    assert LAPSED not in first_end[1] and " lost" not in first_end[1], first_end[1][-3000:]


# ---- refusals -------------------------------------------------------------------

@pytest.mark.parametrize("setting", [
    "handoff_ms = 5",
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


# ---- status: etcd_holders (backend/etcd/etcd.h) -----------------------------------

@pytest.fixture(scope="module")
def holders_prog(tmp_path_factory):
    """progs/etcd_holders.c: etcd.c compiled in, etcd_holders' report printed
    (under LOCKSHIM_TEST_ASAN, with ASan and UBSan)."""
    inc = ["-iquote" + os.path.join(ROOT, d) for d in (
        "backend", "backend/etcd", "common", "arch", "arch/" + platform.machine())]
    san = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer"] if ASAN else []
    return cc(str(tmp_path_factory.mktemp("eh") / "etcd_holders"), ["etcd_holders.c"], "-O2",
              "-D_GNU_SOURCE", *inc, *san, "-lcurl", "-ljson-c")


def holders(prog, etcd):
    """etcd_holders' report: {key: (fence, lease_left_ms, holder, [waiters])}."""
    r = run([prog, etcd.endpoint(), "/lockshim/"])
    assert r.returncode == 0, r.stderr
    out = {}
    for line in r.stdout.splitlines():
        head, *waiters = line.split(" | ")
        m = re.match(r"lock (\S+) fence=(\d+) lease_left_ms=(-?\d+) holder=(.*) waiters=(\d+)$",
                     head)
        assert m and int(m.group(5)) == len(waiters), line
        out[m.group(1)] = (int(m.group(2)), int(m.group(3)), m.group(4), waiters)
    return out


def test_status_lists_each_lock_with_its_holder_and_waiters(bg, worker_progs, holders_prog,
                                                            etcd, tmp_path):
    """Two locks ("blk": a holder and two waiters; "x/%y", escaped in etcd):
    `lockshim status` shows each key once, unescaped, its holder, its fence
    (the lowest create revision of its keys), its lease's time left, the
    waiters in arrival order; etcd_holders reads the same values."""
    cfg = etcd_config(tmp_path, etcd, BLOCK_LOCK % (30000, "lease_ms = 10000;"))
    (tmp_path / "2").mkdir()
    cfg2 = etcd_config(tmp_path / "2", etcd, 'locks = ( { symbol = "block_call"; '
                       'key = "x/%y"; } );\n')
    holder = bg([worker_progs["block"]], cfg)
    holder.expect("enter")
    other = bg([worker_progs["block"]], cfg2)
    other.expect("enter")
    waiters = []
    for n in (3, 4):
        waiters.append(bg([worker_progs["block"]], cfg))
        wait_for(lambda: len(etcd.keys()) == n, what="waiter %d's key" % (n - 2))
    got = status_by_key(cfg)
    assert sorted(got) == ["blk", "x/%y"], got
    blk = got["blk"]
    assert blk["fence"] == min(k[2] for k in etcd.keys() if "lockshim:blk/" in k[0])
    assert 0 < blk["lease_left_ms"] <= 10000 and blk["since"] is None
    assert (blk["pid"], blk["limit"], blk["mode"]) == (holder.p.pid, 1, "exclusive")
    assert [w["pid"] for w in blk["waiters"]] == [w.p.pid for w in waiters]
    xy = got["x/%y"]
    assert xy["pid"] == other.p.pid and xy["waiters"] == [] and xy["lease_left_ms"] > 0
    assert [k for k in etcd.keys() if "x%2F%25y/" in k[0]][0][2] == xy["fence"]
    assert list(status_by_key(cfg, "x*")) == ["x/%y"]
    text = run([CLI, "status", "-c", cfg, "blk"])
    assert text.returncode == 0 and text.stdout.startswith("blk  held by ") and \
        "2 waiting, oldest" in text.stdout, (text.stdout, text.stderr)
    raw = holders(holders_prog, etcd)
    assert raw["lockshim:blk"][0] == blk["fence"] and len(raw["lockshim:blk"][3]) == 2
    for p in [holder, other] + waiters:
        p.send()
        p.expect("call rc=42")
    assert status_by_key(cfg) == {} and holders(holders_prog, etcd) == {}


def test_status_of_an_unreachable_server_is_69(tmp_path):
    cfg = write_config(tmp_path, None, 'backend = "etcd";\netcd = { endpoints = '
                       '( "127.0.0.1:1" ); };\n')
    r = run([CLI, "status", "-c", cfg])
    assert r.returncode == 69 and r.stderr, (r.returncode, r.stderr)


def test_holders_reads_the_prefix_in_pages(holders_prog, etcd):
    """75 keys of 3 locks, 400-byte values, put in an order unlike their key
    order: read in pages (64 keys overflow the 16 KiB reply buffer: 32, then
    16), each lock once with its first-put key holding and the others
    waiting in put order."""
    lease = etcd.call("/v3/lease/grant", {"TTL": "60"})["ID"]
    b64 = lambda s: base64.b64encode(s.encode()).decode()  # noqa: E731
    order = {g: [] for g in range(3)}
    try:
        for j in range(25):
            for g in range(3):
                val = "g%d-%02d-" % (g, j) + "v" * 400
                etcd.call("/v3/kv/put", {"key": b64("/lockshim/lockshim:pg%d/%x" % (
                    g, random.getrandbits(60))), "value": b64(val), "lease": lease})
                order[g].append(val)
        got = holders(holders_prog, etcd)
        assert sorted(got) == ["lockshim:pg0", "lockshim:pg1", "lockshim:pg2"], sorted(got)
        for g in range(3):
            _, left, val, queued = got["lockshim:pg%d" % g]
            assert [val] + queued == order[g] and 0 < left <= 60000
    finally:
        etcd.call("/v3/lease/revoke", {"ID": lease})


# ---- unlock: the holder's lease revoked, as its release would -------------------------

def test_unlock_refuses_a_live_holder_then_forces_it(bg, worker_progs, etcd, tmp_path):
    """Without --force a holder alive on this host is kept (exit 1, its key
    untouched); with --force its lease is revoked: the waiter enters before
    the holder's lease would have ended, and the holder reports the loss at
    its next keepalive. Control: a second unlock finds nothing held (1)."""
    cfg = etcd_config(tmp_path, etcd, BLOCK_LOCK % (30000, "lease_ms = 10000;"))
    took = unlock_refuses_then_forces(bg, worker_progs, cfg, "blk",
                                      lambda: len(etcd.keys()) == 2,
                                      lambda: len(etcd.keys()) == 2)
    assert took < 5 * MULT  # the release's watch, not the 10 s lease


def test_unlock_of_a_dead_holder_needs_no_force(bg, worker_progs, etcd, tmp_path):
    cfg = etcd_config(tmp_path, etcd, BLOCK_LOCK % (30000, "lease_ms = 30000;"))
    h = bg([worker_progs["block"]], cfg)
    h.expect("enter")
    os.kill(h.p.pid, signal.SIGKILL)
    h.wait()
    r = run([CLI, "unlock", "-c", cfg, "blk"])
    assert r.returncode == 0 and r.stdout.startswith("removed blk  held by "), \
        (r.stdout, r.stderr)
    assert etcd.keys() == []


# ---- step 3: user/password and TLS (support/etcd_secure.py) -------------------------
#
# An etcd with auth on (user root) and etcds serving https (certificates of
# make_certs); each is the tests' own, so the autouse check above still
# reads the plain server. etcd 3.4's gateway refuses a request that carries
# a client certificate once auth is on ("CommonName of client ... will be
# ignored"), so auth and client certificates are tested apart.


WRONG_PASSWORD = "wrong-Pw-4417"


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certs(str(tmp_path_factory.mktemp("certs")))


@pytest.fixture(scope="module")
def auth_etcd():
    s = SecureEtcd()
    try:
        yield s.start().enable_auth()
    finally:
        s.cleanup()


@pytest.fixture(scope="module")
def tls_etcd(certs):
    s = SecureEtcd(certs)
    try:
        yield s.start()
    finally:
        s.cleanup()


@pytest.fixture(scope="module")
def mtls_etcd(certs):
    s = SecureEtcd(certs, client_auth=True)
    try:
        yield s.start()
    finally:
        s.cleanup()


def password_file(tmp_path, password=ROOT_PASSWORD):
    path = str(tmp_path / "etcd.pass")
    with open(path, "w") as f:
        f.write(password + "\n")
    return path


def tls_group(certs, ca="ca.crt", client=False, more=""):
    cert = ('cert_file = "%s"; key_file = "%s"; ' % (certs["client.crt"], certs["client.key"])
            if client else "")
    return 'tls = { ca_file = "%s"; %s%s};' % (certs[ca], cert, more)


def test_auth_password_file_guards_a_race_and_the_variable_overrides(
        progs, auth_etcd, tmp_path, monkeypatch):
    """password_file: 2 processes x 2 threads exact, no key left.
    LOCKSHIM_ETCD_PASSWORD overrides a wrong password of the file: the same
    race exact. Control: no password at all, etcd refuses every call
    ("user name is empty")."""
    cfg = etcd_config(tmp_path, auth_etcd, RACE_ETCD,
                      'username = "root"; password_file = "%s";' % password_file(tmp_path))
    assert race(progs["ledger"], "direct", str(tmp_path / "c"), cfg, procs=2, iters=10,
                threads=2) == 40
    assert auth_etcd.keys() == []
    cfg = etcd_config(tmp_path, auth_etcd, RACE_ETCD,
                      'username = "root"; password = "%s";' % WRONG_PASSWORD)
    monkeypatch.setenv("LOCKSHIM_ETCD_PASSWORD", ROOT_PASSWORD)
    assert race(progs["ledger"], "direct", str(tmp_path / "c"), cfg, procs=2, iters=10,
                threads=2) == 40
    assert auth_etcd.keys() == []
    monkeypatch.delenv("LOCKSHIM_ETCD_PASSWORD")
    cfg = etcd_config(tmp_path, auth_etcd, 'locks = ( { symbol = "ledger_update"; key = "l"; '
                      'wait_ms = 500; on_error = "skip"; } );\n')
    r = run([progs["ledger"], "direct", str(tmp_path / "c"), "1"], cfg)
    assert "user name is empty" in r.stderr, r.stderr


def test_auth_wrong_password_is_one_error_and_on_error(worker_progs, auth_etcd, tmp_path):
    """A wrong password: the call applies on_error ("skip") after wait_ms,
    with one warning and one error naming the authentication, never the
    password (not even at log level debug); `check` fails the same way."""
    cfg = etcd_config(tmp_path, auth_etcd, 'locks = ( { symbol = "block_call"; key = "blk"; '
                      'wait_ms = 1000; on_error = "skip"; } );\n',
                      'username = "root"; password = "%s";' % WRONG_PASSWORD)
    r = run([worker_progs["block"]], cfg, LOCKSHIM_LOG_LEVEL="debug")
    assert r.stdout.startswith("call rc=-1"), (r.stdout, r.stderr)
    bad = [l for l in r.stderr.splitlines() if ": warn: " in l or ": error: " in l]
    assert len(bad) == 2 and all("authenticate: etcdserver: authentication failed" in l
                                 for l in bad), r.stderr
    assert WRONG_PASSWORD not in r.stderr and ROOT_PASSWORD not in r.stderr
    r = run([CLI, "check", "-c", cfg])
    assert r.returncode not in (0, 78) and "authentication failed" in r.stderr, r.stderr
    assert WRONG_PASSWORD not in r.stdout + r.stderr
    assert auth_etcd.keys() == []


def test_auth_check_and_lock_with_the_right_password(auth_etcd, tmp_path):
    cfg = etcd_config(tmp_path, auth_etcd, 'locks = ( { symbol = "rename"; key = "k"; } );\n',
                      'username = "root"; password = "%s";'
                      % ROOT_PASSWORD.replace('"', '\\"'))
    r = run([CLI, "check", "-c", cfg])
    assert r.returncode == 0 and ", user root, prefix" in r.stdout, (r.stdout, r.stderr)
    assert ROOT_PASSWORD not in r.stdout + r.stderr
    r = run([CLI, "lock", "-c", cfg, "job", "--", "sh", "-c", "echo fence=$LOCKSHIM_FENCE"],
            LD_PRELOAD="")
    assert r.returncode == 0 and int(r.stdout.split("=")[1]) > 0, (r.stdout, r.stderr)


def test_auth_expired_token_is_renewed(bg, worker_progs, tmp_path):
    """Tokens live 1 s unused (--auth-token-ttl 1): a holder of a 6 s lease
    renews every 2 s and releases after two renewals, each time with an
    expired token: it authenticates again and nothing fails; a second
    caller then gets the lock. Control: a token of the test's, unused
    since the holder entered, is refused by then."""
    s = SecureEtcd(extra=["--auth-token-ttl", "1"])
    try:
        s.start().enable_auth()
        cfg = etcd_config(tmp_path, s, 'locks = ( { symbol = "block_call"; key = "blk"; '
                          'lease_ms = 6000; wait_ms = 2000; on_error = "skip"; } );\n',
                          'username = "root"; password_file = "%s";' % password_file(tmp_path))
        holder = bg([worker_progs["block"]], cfg)
        holder.expect("enter")
        stale = s.call("/v3/auth/authenticate", {"name": "root",
                                                  "password": ROOT_PASSWORD})["token"]
        (key, _, _, lease), = s.keys()
        for _ in range(2):
            low = [s.lease_ttl(lease)[1]]
            wait_for(lambda: low.append(s.lease_ttl(lease)[1]) or low[-1] > min(low),
                     timeout=10, what="the holder's lease renewed")
        assert "invalid auth token" in refused(s, stale)
        holder.send()
        assert holder.expect("call").startswith("call rc=42")
        holder.p.wait(timeout=10)
        assert "error" not in holder.stderr() and "warn" not in holder.stderr(), holder.stderr()
        r = run([worker_progs["block"]], cfg, timeout=20)
        assert "call rc=42" in r.stdout and r.stderr == "", (r.stdout, r.stderr)
        assert s.keys() == []
    finally:
        s.cleanup()


def refused(server, token):
    """The error a range read with token gets ("" when it is accepted)."""
    keep, server.token = server.token, token
    try:
        server._post("/v3/kv/range", {"key": "eA=="}, 10)
        return ""
    except OSError as e:
        return e.read().decode(errors="replace") if hasattr(e, "read") else str(e)
    finally:
        server.token = keep


def test_tls_guards_a_race_with_ca_file_and_check_says_tls(progs, tls_etcd, certs, tmp_path):
    """https with ca_file: 2 processes x 2 threads exact, no key left;
    `check` probes it and says TLS. Control: the same server spoken to
    without a tls group (plain HTTP) fails."""
    cfg = etcd_config(tmp_path, tls_etcd, RACE_ETCD, tls_group(certs))
    assert race(progs["ledger"], "direct", str(tmp_path / "c"), cfg, procs=2, iters=10,
                threads=2) == 40
    assert tls_etcd.keys() == []
    r = run([CLI, "check", "-c", cfg])
    assert r.returncode == 0 and ":%d, TLS, prefix" % tls_etcd.port in r.stdout, \
        (r.stdout, r.stderr)
    plain = etcd_config(tmp_path, tls_etcd, "", "connect_timeout_ms = 1000;")
    r = run([CLI, "check", "-c", plain])
    assert r.returncode not in (0, 78) and "etcd: connect:" in r.stderr, r.stderr


@pytest.mark.parametrize("tls, ok", [
    ('ca="other-ca.crt"', "unable to get local issuer certificate"),  # another CA's
    ('more="server_name = \\"wrong.test\\"; "',  # a name not in it
     "no alternative certificate subject name matches target host name 'wrong.test'"),
    ('more="server_name = \\"etcd.test\\"; "', None),  # a name in it (not the host)
    ('ca="other-ca.crt", more="verify = false; "', None),  # not verified: any CA
])
def test_tls_server_verification(worker_progs, tls_etcd, certs, tmp_path, tls, ok):
    """A server certificate that does not verify fails, one clear error
    (libcurl's detail: the CA, the name) then on_error; server_name is the
    name verified (and sent), verify = false accepts any certificate."""
    group = eval("tls_group(certs, %s)" % tls)
    cfg = etcd_config(tmp_path, tls_etcd, 'locks = ( { symbol = "block_call"; key = "blk"; '
                      'wait_ms = 500; on_error = "skip"; } );\n', group)
    r = run([worker_progs["block"]], cfg)
    if ok is None:
        assert "call rc=42" in r.stdout and r.stderr == "", (r.stdout, r.stderr)
        return
    assert r.stdout.startswith("call rc=-1"), (r.stdout, r.stderr)
    bad = [l for l in r.stderr.splitlines() if ": warn: " in l or ": error: " in l]
    assert len(bad) == 2 and all(ok in l for l in bad), r.stderr
    r = run([CLI, "check", "-c", cfg])
    assert r.returncode not in (0, 78) and ok in r.stderr, r.stderr


def test_tls_client_certificate(progs, mtls_etcd, certs, tmp_path):
    """A server that wants client certificates (--client-cert-auth):
    cert_file and key_file guard a race, and `check` passes. Control: the
    same without them fails."""
    cfg = etcd_config(tmp_path, mtls_etcd, RACE_ETCD, tls_group(certs, client=True))
    assert race(progs["ledger"], "direct", str(tmp_path / "c"), cfg, procs=2, iters=10,
                threads=2) == 40
    assert mtls_etcd.keys() == []
    r = run([CLI, "check", "-c", cfg])
    assert r.returncode == 0, r.stderr
    cfg = etcd_config(tmp_path, mtls_etcd, "", tls_group(certs))
    r = run([CLI, "check", "-c", cfg])
    assert r.returncode not in (0, 78) and "etcd: connect:" in r.stderr, r.stderr


def setuid_run(lay, cfg_text, **user_env):
    """Runs lay's set-user-ID program as nobody with root's config cfg_text
    and user_env; inside the call, count() is taken. Returns (stdout,
    stderr, what count() gave inside or None)."""
    lay._write(lay.cfg, cfg_text, 0o644)
    env = {k: v for k, v in shim_env(None, preload=False).items()
           if not k.startswith("LOCKSHIM_") and k != "SSLKEYLOGFILE"}
    env.update(user_env)
    p = subprocess.Popen([lay.launch, lay.upper, lay.work, str(NOBODY), str(NOGROUP),
                          lay.secure], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        first = p.stdout.readline()
        inside = None
        if first.startswith("enter"):  # else the launcher has exited: no one reads
            inside = lay.count()
            p.stdin.write("go\n")
            p.stdin.flush()
        out, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    if p.returncode == 2 and err.startswith("secure_launch: namespace:"):
        pytest.skip("no private mount namespace here: " + err.strip())
    return first + out, err, inside


def test_setuid_program_refuses_sslkeylogfile(tls_etcd, certs, tmp_path):
    """libcurl reads SSLKEYLOGFILE (getenv) at its init, creates that file
    and appends every TLS session's secrets to it. A set-user-ID program run
    by nobody with it set refuses the backend (one line) and runs
    unguarded, the file never created; without it the same program is
    guarded over TLS (its key in etcd while it runs). Control: the same
    program not set-ID, with the variable, writes the secrets there."""
    cfg_text = ('backend = "etcd";\netcd = { endpoints = ( "%s" ); %s };\n'
                'locks = ( { symbol = "secure_work"; key = "secure"; } );\n'
                % (tls_etcd.endpoint(), tls_group(certs)))
    lay = Layout(1, 1)
    lay.count = lambda: len(tls_etcd.keys())
    keylog = os.path.join(lay.base, "user", "keylog")
    try:
        out, err, inside = setuid_run(lay, cfg_text)
        assert "enter threads=%d euid=0" % (2 + TSAN) in out and inside == 1 and err == "", \
            (out, err)
        out, err, inside = setuid_run(lay, cfg_text, SSLKEYLOGFILE=keylog)
        # refused: no session, and no TSan runtime thread either
        assert "enter threads=1 euid=0" in out and inside == 0, (out, err)
        lines = [l for l in err.splitlines() if l.strip()]
        assert len(lines) == 1 and "SSLKEYLOGFILE is set in a set-ID program" in lines[0], err
        assert not os.path.exists(keylog)
        cfg = str(tmp_path / "plain.cfg")
        with open(cfg, "w") as f:
            f.write(cfg_text)
        mine = str(tmp_path / "keylog")
        r = subprocess.run([lay.plain], env=shim_env(cfg, SSLKEYLOGFILE=mine), input="go\n",
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 0 and "enter threads=%d" % (2 + TSAN) in r.stdout, \
            (r.stdout, r.stderr)
        with open(mine) as f:
            assert re.search(r"^(CLIENT_RANDOM|CLIENT_HANDSHAKE_TRAFFIC_SECRET) ", f.read(),
                             re.M)
    finally:
        lay.cleanup()


def test_setuid_program_ignores_the_users_password_variable(auth_etcd, tmp_path):
    """LOCKSHIM_ETCD_PASSWORD is not read in a set-ID program: root's
    password_file (in /etc/lockshim, root's) is used, so a user's wrong
    value changes nothing: the call is guarded. Control: the same variable
    given to the program not set-ID overrides the file and fails."""
    lay = Layout(1, 1)
    lay.count = lambda: len(auth_etcd.keys())
    try:
        lay._write(os.path.join(lay.etc, "etcd.pass"), ROOT_PASSWORD + "\n", 0o600)
        cfg_text = ('backend = "etcd";\netcd = { endpoints = ( "%s" ); username = "root"; '
                    'password_file = "/etc/lockshim/etcd.pass"; };\n'
                    'locks = ( { symbol = "secure_work"; key = "secure"; wait_ms = 500; '
                    'on_error = "skip"; } );\n' % auth_etcd.endpoint())
        out, err, inside = setuid_run(lay, cfg_text, LOCKSHIM_ETCD_PASSWORD=WRONG_PASSWORD)
        assert "enter threads=%d euid=0" % (2 + TSAN) in out and inside == 1 and err == "", \
            (out, err)
        cfg = str(tmp_path / "plain.cfg")
        with open(cfg, "w") as f:
            f.write(cfg_text.replace("/etc/lockshim/etcd.pass", password_file(tmp_path)))
        r = subprocess.run([lay.plain], env=shim_env(cfg, LOCKSHIM_ETCD_PASSWORD=WRONG_PASSWORD),
                           input="go\n", capture_output=True, text=True, timeout=30)
        assert "authentication failed" in r.stderr and WRONG_PASSWORD not in r.stderr, r.stderr
    finally:
        lay.cleanup()


@pytest.mark.parametrize("extra, said", [
    ('password = "p";', "etcd.password: needs etcd.username"),
    ('username = "u";', "etcd.username: needs etcd.password"),
    ('username = "u"; password = "p"; password_file = "/nonexistent";',
     "etcd.password_file: give password or password_file, not both"),
    ('username = "u"; password_file = "/nonexistent";', "etcd.password_file: cannot open"),
    ('tls = { cert_file = "/c.pem"; };', "etcd.tls: cert_file and key_file go together"),
    ('tls = { verify = 2; };', "etcd.tls"),
])
def test_auth_and_tls_settings_refused(etcd, tmp_path, extra, said):
    """One line naming the setting, exit 78; no password in it."""
    cfg = etcd_config(tmp_path, etcd, "", extra)
    r = run([CLI, "check", "-c", cfg])
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    assert r.returncode == 78 and len(lines) == 1 and said in lines[0], r.stderr
    assert '"p"' not in r.stderr


# ---- limit and mode = "shared" (issue 23, b23-etcd4) ----------------------------
#
# The holders' mode is in their keys' names: <key>/<lease hex> exclusive,
# <key>/r<lease hex> shared, <key>/p<limit>.<lease hex> a permit. The
# observed program is support/sets.py's (each guarded call appends
# "r+"/"w+" when it starts, "r-"/"w-" when it ends; replay counts who was
# inside at once).

def set_lock(symbol, settings):
    return '{ symbol = "%s"; key = "k"; wait_ms = 30000; %s }' % (symbol, settings)


RW_ETCD = "locks = ( %s, %s );\n" % (set_lock("set_read", 'mode = "shared";'),
                                     set_lock("set_write", ""))
MODE_LOCK = 'locks = ( { symbol = "hold_call"; key = "k"; wait_ms = 20000; %s } );\n'


def etcd_config_in(tmp_path, name, etcd, body):
    """etcd_config in tmp_path's subdirectory name (several configs)."""
    d = tmp_path / name
    d.mkdir(exist_ok=True)
    return etcd_config(d, etcd, body)


@pytest.mark.timing
@pytest.mark.parametrize("guarded", [True, False], ids=["shared", "control-unguarded"])
def test_shared_readers_overlap_writers_alone(sets_prog, etcd, tmp_path, guarded):
    """4 reader processes x 2 threads (40 ms calls), 2 writers (20 ms): the
    readers are inside together (more than one at once), a writer always
    alone, every call entered, each grant with its own fence (a create
    revision). Control: unguarded, a writer is inside beside others."""
    log = str(tmp_path / "log")
    cfg = etcd_config(tmp_path, etcd, RW_ETCD) if guarded else None
    readers_overlap_writers_alone(sets_prog, cfg, log)


@pytest.mark.timing
@pytest.mark.parametrize("limit,most", [(3, 3), (None, 1), ("control", None)],
                         ids=["limit3", "default", "control-unguarded"])
def test_limit_bounds_the_holders(sets_prog, etcd, tmp_path, limit, most):
    """8 processes x 2 threads (30 ms calls): limit 3 lets never more than 3
    in, and 3 are reached; no limit, one at a time. Control: unguarded,
    more than 3."""
    extra = "limit = %d;" % limit if limit != "control" and limit else ""
    cfg = None if limit == "control" else etcd_config(
        tmp_path, etcd, "locks = ( %s );\n" % set_lock("set_read", extra))
    limit_bounds_the_holders(sets_prog, cfg, str(tmp_path / "log"), most)


def test_limit_mismatch_is_an_error_at_once(progs, procs, etcd, tmp_path):
    """A holder took the key with limit = 3; callers with limit 2, with no
    limit (1) and shared (1) get one error line naming both numbers and
    on_error at once (well before wait_ms), and leave no key behind.
    Control: limit 3 enters beside the holder."""
    def one_key():
        assert len(etcd.keys()) == 1, etcd.keys()

    holder = limit_mismatch_refused(progs, procs, lambda setting, name: etcd_config_in(
        tmp_path, name, etcd, MODE_LOCK % setting), one_key, hold_ms=8000)
    assert holder.finish()[0] == 0  # its release: no key left


def test_exclusive_holder_mismatches_a_semaphore_and_waits_shared(progs, procs, etcd,
                                                                   tmp_path):
    """A plain lock (limit 1) held for 3 s: a limit = 3 caller gets the
    mismatch at once; a shared caller waits instead (its key queued behind
    the holder's), and enters once the holder is gone."""
    holder = procs([progs["driver"], "call:3000"], etcd_config_in(tmp_path, "x", etcd,
                                                                  MODE_LOCK % ""))
    holder.expect("enter")
    r = run([progs["driver"], "call:0"], etcd_config_in(tmp_path, "p", etcd,
                                                        MODE_LOCK % "limit = 3;"))
    assert r.stdout.strip().splitlines()[-1] == "call rc=-1 errno=16", r.stderr
    assert "limit 3 here, 1 for the key's holders" in r.stderr, r.stderr
    t0 = time.monotonic()
    r = run([progs["driver"], "call:0"], etcd_config_in(tmp_path, "s", etcd,
                                                        MODE_LOCK % 'mode = "shared";'))
    assert r.stdout.strip().splitlines()[-1] == "call rc=42 errno=0", r.stderr
    assert time.monotonic() - t0 > 0.3  # waited for the exclusive holder (3 s from its start)
    assert holder.finish()[0] == 0


@pytest.mark.timing
def test_writer_not_starved_by_readers(sets_prog, etcd, tmp_path):
    """Readers (4 processes x 2 threads, 100 ms calls) keep the key held
    without a gap between the marks x and y (the control: a writer waiting
    for a free key would wait for the whole stream); a writer arriving
    meanwhile enters within 1 s (its key is older than the readers' that
    come after it, and a reader waits for every older writer), alone, and
    the readers go on after."""
    log = str(tmp_path / "log")
    cfg = etcd_config(tmp_path, etcd, RW_ETCD)
    writer_behind_readers(sets_prog, cfg, log, str(tmp_path / "stop"), 1000)
    assert replay(log)[1:] == (1, False)


@pytest.mark.timing
@pytest.mark.parametrize("holder_opts, waiter", [
    ([], 'mode = "shared";'), (["--limit", "2"], "limit = 2;"),
], ids=["shared-behind-writer", "permit"])
def test_set_waiter_is_woken_by_the_release(bg, worker_progs, etcd, tmp_path, holder_opts,
                                            waiter):
    """A shared caller behind an exclusive holder, and a third permit of
    limit 2 behind two holders, wait by a watch: retry_max_ms (30 s) and a
    third of the lease (20 s) would wake them far later. Over 2 s the
    waiter spends (nearly) no CPU; after a release it enters within 0.5 s."""
    cfg = etcd_config(tmp_path, etcd, 'locks = ( { symbol = "block_call"; key = "k"; '
                      'wait_ms = 60000; lease_ms = 60000; retry_max_ms = 30000; %s } );\n'
                      % waiter)
    set_waiter_woken(bg, worker_progs["block"], cfg, holder_opts, -1,
                     lambda: len(etcd.keys()), 2, 0.5)


def test_status_shows_shared_and_permit_holders(bg, etcd, tmp_path):
    """Two shared holders of "r" and a waiting exclusive caller: two lines,
    mode shared, each its own fence (create revision), the writer as the
    first's waiter; a permit holder of limit 3: limit 3, exclusive.
    Control: once they return, nothing is listed."""
    cfg = etcd_config(tmp_path, etcd, "")

    def status():
        r = run([CLI, "status", "-c", cfg, "--json"])
        assert r.returncode == 0, r.stderr
        return [json.loads(l) for l in r.stdout.splitlines()]

    def hold(*opts):
        h = bg([CLI, "lock", "-c", cfg] + list(opts) + ["--", "sh", "-c", "echo in; read x"],
               None)
        return h
    held = [hold("--shared", "r") for _ in range(2)] + [hold("--limit", "3", "p")]
    for h in held:
        h.expect("in")
    writer = hold("-w", "30000", "r")
    wait_for(lambda: len(etcd.keys()) == 4, what="the writer's key")
    objs = status()
    assert sorted((o["key"], o["mode"], o["limit"]) for o in objs) == [
        ("p", "exclusive", 3), ("r", "shared", 1), ("r", "shared", 1)], objs
    revs = sorted(k[2] for k in etcd.keys() if "lockshim:r/" in k[0])
    assert sorted(o["fence"] for o in objs if o["key"] == "r") == revs[:2]
    assert sum(len(o["waiters"]) for o in objs if o["key"] == "r") == 1, objs
    for h in held:
        h.send()
    writer.expect("in")
    writer.send()
    wait_for(lambda: status() == [], what="the holders gone from status")


@pytest.mark.timing
def test_permit_counts_more_older_keys_than_a_reply_holds(bg, worker_progs, etcd, tmp_path):
    """150 permits of limit 150 held (keys put here, one lease, long names):
    the 151st caller waits; its count of the older keys (etcd's own count
    ignores the create revision's bound) reads 150 keys, about 30 KiB,
    more than the 16 KiB reply buffer, counted as they stream in. Once one
    of them is deleted, it enters within 0.5 s. Control: before that, its
    key stays queued for 2 s and it does not enter."""
    lease = etcd.call("/v3/lease/grant", {"TTL": "60"})["ID"]
    key = "lockshim:" + "k" * 60
    b64 = lambda s: base64.b64encode(s.encode()).decode()  # noqa: E731
    fakes = ["/lockshim/%s/p150.%x" % (key, random.getrandbits(60)) for _ in range(150)]
    try:
        for k in fakes:
            etcd.call("/v3/kv/put", {"key": b64(k), "value": b64("x"), "lease": lease})
        cfg = etcd_config(tmp_path, etcd, 'locks = ( { symbol = "block_call"; key = "%s"; '
                          'wait_ms = 60000; lease_ms = 60000; retry_max_ms = 30000; '
                          'limit = 150; break_dead_holders = false; } );\n' % key[9:])
        w = bg([worker_progs["block"]], cfg)
        wait_for(lambda: len(etcd.keys()) == 151, what="the waiter's key")
        time.sleep(2)  # the span of the control, not a synchronisation
        assert len(etcd.keys()) == 151 and w.lines.empty(), w.stderr()
        etcd.call("/v3/kv/deleterange", {"key": b64(fakes[77])})
        t0 = time.monotonic()
        w.expect("enter", timeout=5)
        assert time.monotonic() - t0 < 0.5 * MULT
        w.send()
        w.expect("call rc=42")
    finally:
        etcd.call("/v3/lease/revoke", {"ID": lease})


# ---- linger_ms: a kept lock is its key and its lease (b23-etcd4) ----------------

def etcd_revision(etcd):
    """The cluster's revision: each put and each delete of a key adds 1."""
    return int(etcd.call("/v3/kv/range", {"key": "AA=="})["header"]["revision"])


@pytest.mark.timing
@pytest.mark.parametrize("linger, writes", [(300, 2), (0, 10)],
                         ids=["linger", "control-linger-0"])
def test_linger_keeps_the_key_between_calls(procs, progs, etcd, tmp_path, linger, writes):
    """After a first call (the connection opened, its key gone), 5 calls in
    a row of one thread, linger_ms = 300 (inside the 500 ms of handoff_ms's
    default, the reuse window from the taking): the lock is taken once
    (one put) and kept between the calls; the renewal thread releases it
    (its lease revoked: one delete) about linger_ms after the last call
    while the program still runs. Control: linger_ms = 0, a put and a
    delete per call."""
    cfg = etcd_config(tmp_path, etcd, HOLD_LOCK % ("linger_ms = %d;" % linger))
    p = procs([progs["driver"], "call:0", "stdin"] + ["call:0"] * 5 + ["stdin"], cfg)
    p.expect("call rc=42")
    wait_for(lambda: etcd.keys() == [], what="the first call's key released")
    before = etcd_revision(etcd)
    p.send()
    for _ in range(5):
        p.expect("call rc=42")
    t0 = time.monotonic()
    wait_for(lambda: etcd.keys() == [], what="the kept key released")
    took = time.monotonic() - t0
    assert etcd_revision(etcd) - before == writes
    assert took < (linger / 1000 + 2) * MULT, took
    p.send()
    assert p.finish()[0] == 0


@pytest.mark.parametrize("opts", [[], ["--shared"], ["--limit", "2"]],
                         ids=["exclusive", "shared", "permit"])
def test_longest_prefix_and_key_fit_every_mode(etcd, tmp_path, opts):
    """A 1024-byte prefix, a 128-byte namespace and a key of 256 bytes, all
    "/" (each written %2F): `lock` takes it in every mode (a shared
    caller's transaction names its key three times and two ranges, nine
    base64 keys in all), and leaves no key. Checked by making the body
    room for eight keys again: the shared case fails."""
    prefix = "/" + "p" * 1022 + "/"
    cfg = write_config(tmp_path, None, 'backend = "etcd";\nnamespace = "%s";\netcd = { '
                       'endpoints = ( "%s" ); prefix = "%s"; };\n'
                       % ("/" * 128, etcd.endpoint(), prefix))
    r = run([CLI, "lock", "-c", cfg, "-w", "0"] + opts + ["/" * 256, "--", "sh", "-c",
                                                         "echo in=$LOCKSHIM_FENCE"],
            LD_PRELOAD="")
    assert r.returncode == 0 and "in=" in r.stdout, (r.stdout, r.stderr)
    assert etcd.keys(prefix) == []


# ---- a hostile gateway ----------------------------------------------------------

HUGE = "9" * 40
HOSTILE = {  # what the gateway answers, by the reply's flaw
    "malformed": b'{"header":{"revision":"7"},"ID":"1","TTL":"5",',
    "array": b'[{"header":{"revision":"7"}},{"succeeded":true}]',
    "wrong-types": b'{"header":{"revision":{}},"ID":[],"TTL":"five","succeeded":"yes",'
                   b'"responses":{"response_range":7},"kvs":"none","count":true}',
    "huge-number": ('{"header":{"revision":"%s"},"ID":"%s","TTL":%s,"succeeded":true,'
                    '"responses":[{"response_put":{}},{"response_range":{"count":%s,"kvs":'
                    '[{"key":"a2V5","create_revision":%s}]}}]}'
                    % ((HUGE,) * 5)).encode(),
    "too-long": b'{"header":{"revision":"7"},"pad":"' + b"x" * 100000 + b'"}',
    # the control: a reply of each request that grants ("x/1": an exclusive key)
    "control-well-formed": b'{"header":{"revision":"7"},"ID":"%(ID)s","TTL":"5",'
                           b'"succeeded":true,"responses":[{"response_put":{}},'
                           b'{"response_range":{"count":"1","kvs":[{"key":"eC8x",'
                           b'"create_revision":"7"}]}}]}',
}


class HostileGateway:
    """An HTTP server on a free loopback port answering /v3/maintenance/status
    well (with grant_ok lease grant and revoke too) and every other /v3/*
    path with body (%(ID)s: the lease asked for), HTTP 200."""

    def __init__(self, body, grant_ok):
        import http.server
        import threading

        gateway = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                asked = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                good = self.path == "/v3/maintenance/status" or \
                    (grant_ok and self.path in ("/v3/lease/grant", "/v3/lease/revoke"))
                gateway.paths.add(self.path)
                out = b'{"header":{"revision":"7"},"ID":"%(ID)s","TTL":"5"}' if good else body
                if b"%(ID)s" in out:  # the lease asked for
                    out = out.replace(b"%(ID)s", str(asked.get("ID", "1")).encode())
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args):
                pass

        self.paths = set()
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def endpoint(self):
        return "127.0.0.1:%d" % self.server.server_address[1]

    def stop(self):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


@pytest.mark.parametrize("grant_ok", [True, False], ids=["txn", "grant"])
@pytest.mark.parametrize("flaw", sorted(HOSTILE))
def test_hostile_gateway_is_an_error_of_each_request(worker_progs, tmp_path, flaw, grant_ok):
    """Replies that are not JSON, an array, fields of the wrong type, numbers
    beyond int64, a reply too long: each is an error of its request (never a
    crash or a misread grant): the guarded call applies on_error within
    wait_ms and the program exits normally (ASan clean under
    LOCKSHIM_TEST_ASAN); the flawed request did reach the server. Control:
    the same server answering each request well grants the call."""
    gw = HostileGateway(HOSTILE[flaw], grant_ok)
    try:
        cfg = etcd_config(tmp_path, gw, 'locks = ( { symbol = "block_call"; key = "blk"; '
                          'wait_ms = 1000; on_error = "skip"; on_timeout = "skip"; } );\n',
                          "connect_timeout_ms = 300; command_timeout_ms = 300;")
        t0 = time.monotonic()
        r = run([worker_progs["block"]], cfg, timeout=30)
        took = time.monotonic() - t0
    finally:
        gw.stop()
    assert "ERROR: AddressSanitizer" not in r.stderr
    if flaw.startswith("control"):
        assert r.returncode == 0 and "call rc=42" in r.stdout, (r.stdout, r.stderr)
        return
    assert r.returncode == 0 and r.stdout.startswith("call rc=-1"), (r.returncode, r.stdout,
                                                                     r.stderr)
    assert "etcd unavailable for 1000 ms" in r.stderr, r.stderr
    assert took < 1.0 + 3 * MULT, took
    assert ("/v3/kv/txn" if grant_ok else "/v3/lease/grant") in gw.paths, gw.paths


# ---- step 6: metrics, one count key per host (<prefix>%metrics/<escaped key>) ---------

COUNT_LOCK = 'locks = ( { symbol = "other_call"; key = "m{arg0}"; wait_ms = 30000; } );\n'
HAMMER_FIELD = b"hammer\x1fcalls\x1f"


def metrics_key(host, prefix="/lockshim/", ns="lockshim"):
    """The count key of host: its "<ns>:metrics:{<host>}" escaped (% and /)."""
    key = "%s:metrics:{%s}" % (ns, host)
    return prefix + "%metrics/" + key.replace("%", "%25").replace("/", "%2F")


def counts_of(value):
    """{field: value} of a count key's value, as etcd.c's header defines it:
    "<flen>:<field>=<value>\\n" per field, fields in increasing byte order."""
    out, at, last = {}, 0, None
    while at < len(value):
        colon = value.index(b":", at)
        end = colon + 1 + int(value[at:colon])
        field = value[colon + 1:end]
        assert value[end:end + 1] == b"=" and (last is None or field > last), value
        nl = value.index(b"\n", end)
        out[field], last, at = int(value[end + 1:nl]), field, nl + 1
    return out


def counts_value(counts):
    return b"".join(b"%d:%s=%d\n" % (len(f), f, v) for f, v in sorted(counts.items()))


def count_key_read(etcd, key):
    """(value bytes, mod_revision) of key (b"", 0 when absent)."""
    kvs = etcd.call("/v3/kv/range", {"key": base64.b64encode(key.encode()).decode()}).get(
        "kvs", [])
    if not kvs:
        return b"", 0
    return base64.b64decode(kvs[0].get("value", "")), int(kvs[0]["mod_revision"])


def hammer(etcd, key, stop, compare, done):
    """Adds 1 to HAMMER_FIELD of key until stop, a read and a put 5 ms apart
    (the window another writer's put falls into): the put conditional on
    the key's mod_revision when compare (as etcd.c's), else blind (the
    control: a put that overwrites what came in between). Appends the
    number of its puts that went through to done."""
    k = base64.b64encode(key.encode()).decode()
    n = 0
    while not stop.is_set():
        value, rev = count_key_read(etcd, key)
        counts = counts_of(value)
        counts[HAMMER_FIELD] = counts.get(HAMMER_FIELD, 0) + 1
        time.sleep(0.005)
        put = [{"request_put": {"key": k, "value": base64.b64encode(
            counts_value(counts)).decode()}}]
        cmp = [{"target": "MOD", "key": k, "mod_revision": str(rev), "result": "EQUAL"}]
        r = etcd.call("/v3/kv/txn", {"compare": cmp if compare else [], "success": put})
        n += bool(r.get("succeeded"))
    done.append(n)


@pytest.mark.timing
@pytest.mark.parametrize("compare", [True, False], ids=["txn", "control-blind-writer"])
def test_counts_of_one_host_add_up_under_concurrent_shipments(progs, etcd, tmp_path, compare):
    """4 processes x 400 guarded calls of one host (each ships about once a
    second and at exit) while a writer of the test's own adds 1 to a field
    of that host's key every few ms, read and put apart: every process's
    compare is lost again and again, and yet `lockshim metrics` counts
    4 x 400 calls exactly, and the writer's field counts its puts. Control:
    the same writer putting blindly (no compare) loses the processes'
    counts, which is what the compare on mod_revision prevents."""
    host, n = "e6-%s" % ("txn" if compare else "blind"), 400
    cfg = etcd_config(tmp_path, etcd, COUNT_LOCK)
    key = metrics_key(host)
    stop, done = threading.Event(), []
    t = threading.Thread(target=hammer, args=(etcd, key, stop, compare, done))
    t.start()
    try:
        wait_for(lambda: count_key_read(etcd, key)[1] > 0, what="the writer's first put")
        ps = [subprocess.Popen([progs["driver"]] + ["other:%d" % i] * n, env=shim_env(
            cfg, LOCKSHIM_TEST_HOST=host), stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE) for i in range(4)]
        errs = [p.communicate(timeout=120 * MULT)[1] for p in ps]
    finally:
        stop.set()
        t.join()
    assert [p.returncode for p in ps] == [0] * 4, errs
    m = scrape(cfg)
    calls = val(m, "lockshim_calls_total", "other_call", host)
    if not compare:
        assert calls < 4 * n, "the blind writer lost nothing: the test shows no race"
        return
    assert not any(errs), errs  # no shipment failed (16 tries each)
    assert calls == 4 * n and \
        val(m, "lockshim_acquired_total", "other_call", host, how="fast") == 4 * n
    assert counts_of(count_key_read(etcd, key)[0])[HAMMER_FIELD] == done[0]
    assert [k[0] for k in etcd.keys(metrics=True) if host in k[0]] == [key]
    assert [k[3] for k in etcd.keys(metrics=True)] == [0] * len(etcd.keys(metrics=True))


def test_status_and_unlock_leave_the_count_keys_alone(bg, worker_progs, holders_prog, etcd,
                                                      tmp_path):
    """A host's count key of about 75 KB (a status reply holds 16 KiB) and a
    holder's own shipment under the prefix status reads: status, and the
    module's reader of it, list the holder only (the listing reads around
    <prefix>%metrics/); unlock --force revokes the holder's lease, and
    unlock of the count key's name finds nothing held; neither changes a
    count key (value and mod_revision); metrics reads the big key's 2000
    fields. Control: the count keys are there, with no lease."""
    cfg = etcd_config(tmp_path, etcd, BLOCK_LOCK % (30000, ""))
    big = metrics_key("e6-big")
    value = counts_value({b"blk%04d\x1flockshim_calls_total\x1f" % i: i + 1
                          for i in range(2000)})
    assert len(value) > 65536
    etcd.call("/v3/kv/put", {"key": base64.b64encode(big.encode()).decode(),
                             "value": base64.b64encode(value).decode()})
    h = bg([worker_progs["block"]], cfg, LOCKSHIM_TEST_HOST="e6-holder")
    h.expect("enter")
    wait_for(lambda: count_key_read(etcd, metrics_key("e6-holder"))[1] > 0,
             what="the holder's shipment")
    counted = {k[0]: k[3] for k in etcd.keys(metrics=True)}
    assert counted.get(big) == 0 and counted.get(metrics_key("e6-holder")) == 0, counted
    before = count_key_read(etcd, big)
    assert list(status_by_key(cfg)) == ["blk"]
    text = run([CLI, "status", "-c", cfg])
    assert text.returncode == 0 and text.stdout.startswith("blk  held by ") and \
        len(text.stdout.splitlines()) == 1, (text.stdout, text.stderr)
    assert list(holders(holders_prog, etcd)) == ["lockshim:blk"]
    r = run([CLI, "unlock", "-c", cfg, "--force", "metrics:{e6-big}"])
    assert r.returncode == 1 and "is not held" in r.stderr, r.stderr
    r = run([CLI, "unlock", "-c", cfg, "--force", "blk"])
    assert r.returncode == 0, r.stderr
    wait_for(lambda: "was lost" in h.stderr(), timeout=10 * MULT,
             what="the former holder's on_lost")
    assert status_by_key(cfg) == {} and count_key_read(etcd, big) == before
    m = scrape(cfg)
    assert [val(m, "lockshim_calls_total", "blk%04d" % i, "e6-big") for i in (0, 1999)] == \
        [1, 2000]
    h.send()
    h.expect("call rc=42")


def test_counts_past_etcds_request_limit_stay_in_the_process(progs, etcd, tmp_path):
    """A host whose count key is nearly etcd's request limit (1.5 MiB by
    default): its process's shipment is refused by etcd ("request is too
    large"), said in its log, and the key is left as it was; metrics still
    reads it (one reply of about 2 MiB). Control: another host's shipment
    of the same calls goes through."""
    log = str(tmp_path / "shim.log")
    cfg = etcd_config(tmp_path, etcd, 'log_file = "%s"; log_level = "debug";\n%s'
                      % (log, COUNT_LOCK))
    full = metrics_key("e6-full")
    counts = {b"f%06d\x1fpad\x1f" % i: 1 for i in range(87360)}  # 18 bytes each, not
    counts[b"big\x1flockshim_calls_total\x1f"] = 7                  # series metrics shows
    value = counts_value(counts)
    assert 1572864 - 400 < len(value) < 1572864 - 250, len(value)
    k = base64.b64encode(full.encode()).decode()
    etcd.call("/v3/kv/put", {"key": k, "value": base64.b64encode(value).decode()})
    try:
        before = count_key_read(etcd, full)
        r = run([progs["driver"], "other:1", "other:1"], cfg, LOCKSHIM_TEST_HOST="e6-full")
        said = open(log).read()
        assert r.returncode == 0 and "counts not sent" in said and \
            "request is too large" in said, said
        assert count_key_read(etcd, full) == before
        r = run([progs["driver"], "other:1", "other:1"], cfg, LOCKSHIM_TEST_HOST="e6-ok")
        said = open(log).read()
        assert r.returncode == 0 and said.count("counts not sent") == 1, said
        m = scrape(cfg)
        assert val(m, "lockshim_calls_total", "other_call", "e6-ok") == 2
        assert val(m, "lockshim_calls_total", "other_call", "e6-full") == 0
        assert val(m, "lockshim_calls_total", "big", "e6-full") == 7
    finally:
        etcd.call("/v3/kv/deleterange", {"key": k})


def test_count_key_of_a_host_with_slash_and_percent(progs, etcd, tmp_path):
    """A host named "e6/x%y": its count key escapes both (one key, no / after
    <prefix>%metrics/), metrics reads its counts back under that name, and
    status lists no lock."""
    cfg = etcd_config(tmp_path, etcd, COUNT_LOCK)
    r = run([progs["driver"], "other:1", "other:1"], cfg, LOCKSHIM_TEST_HOST="e6/x%y")
    assert r.returncode == 0, r.stderr
    assert metrics_key("e6/x%y") == "/lockshim/%metrics/lockshim:metrics:{e6%2Fx%25y}"
    assert metrics_key("e6/x%y") in [k[0] for k in etcd.keys(metrics=True)]
    assert val(scrape(cfg), "lockshim_calls_total", "other_call", "e6/x%y") == 2
    assert status_by_key(cfg) == {}


# ---- step 7: one token per process ---------------------------------------------

ROUNDS_C = r"""
/* rounds THREADS PATH [fork]: THREADS threads each call ledger_update(PATH)
 * once, all let go together; "round1" printed, a line read; then each once
 * more, together again; "round2". With fork: then a child calls it once
 * and exits, the parent prints "forked status=S". */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

int ledger_update(const char *path);
static pthread_barrier_t bar;
static const char *path;

static void *work(void *arg)
{
	(void)arg;
	for (int round = 0; round < 2; round++) {
		pthread_barrier_wait(&bar);
		if (ledger_update(path) < 0)
			abort();
		pthread_barrier_wait(&bar);
	}
	return NULL;
}

int main(int argc, char **argv)
{
	int n = argc >= 3 ? atoi(argv[1]) : 0, st = -1;
	pid_t pid;
	pthread_t th[64];
	char line[16];

	if (n < 1 || n > 64)
		return 2;
	path = argv[2];
	pthread_barrier_init(&bar, NULL, (unsigned)n + 1);
	for (int i = 0; i < n; i++)
		pthread_create(&th[i], NULL, work, NULL);
	pthread_barrier_wait(&bar);
	pthread_barrier_wait(&bar);
	printf("round1\n");
	fflush(stdout);
	if (!fgets(line, sizeof(line), stdin))
		return 3;
	pthread_barrier_wait(&bar);
	pthread_barrier_wait(&bar);
	for (int i = 0; i < n; i++)
		pthread_join(th[i], NULL);
	printf("round2\n");
	fflush(stdout);
	if (argc < 4)
		return 0;
	if ((pid = fork()) == 0)
		_exit(ledger_update(path) < 0);
	waitpid(pid, &st, 0);
	printf("forked status=%d\n", st);
	return 0;
}
"""


@pytest.fixture(scope="module")
def rounds_prog(progs, tmp_path_factory):
    d = tmp_path_factory.mktemp("rounds")
    src, out = str(d / "rounds.c"), str(d / "rounds")
    with open(src, "w") as f:
        f.write(ROUNDS_C)
    subprocess.run(["gcc", "-g", "-O2", "-o", out, src, "-L" + progs["dir"],
                    "-Wl,-rpath," + progs["dir"], "-lledger", "-lpthread"], check=True)
    return out


class _Tap:
    """A socket's recv() that reports each match of pattern in what it
    reads (a match cut across two reads counted once)."""

    def __init__(self, sock, pattern, seen):
        self.sock, self.pattern, self.seen, self.tail = sock, pattern, seen, b""

    def recv(self, n):
        data = self.sock.recv(n)
        buf, last = self.tail + data, 0
        for m in self.pattern.finditer(buf):
            self.seen(m.group(1).decode())
            last = m.end()
        self.tail = buf[max(last, len(buf) - 64):]
        return data

    def __getattr__(self, name):
        return getattr(self.sock, name)


class CountingProxy(Proxy):
    """support/proxy.py's Proxy (PASS) that counts the HTTP requests by path
    ("/v3/auth/authenticate": n) and the replies by status ("401": n), and
    keeps the time of the last bytes the shim sent (last)."""
    REQUEST = re.compile(rb"POST (/v3/[a-z_/]+) HTTP/1\.1\r\n")
    REPLY = re.compile(rb"HTTP/1\.1 (\d{3}) ")

    def __init__(self, upstream_port):
        super().__init__(upstream_port)
        self.counts = {}
        self.last = time.monotonic()

    def _seen(self, what):
        with self._lock:
            self.counts[what] = self.counts.get(what, 0) + 1
            self.last = time.monotonic()

    def endpoint(self):
        return "127.0.0.1:%d" % self.port

    def count(self, what):
        with self._lock:
            return self.counts.get(what, 0)

    def _pump(self, src, dst, direction):
        pattern = self.REQUEST if direction == "request" else self.REPLY
        super()._pump(_Tap(src, pattern, self._seen), dst, direction)


def auth_config(tmp_path, endpoint, extra=""):
    return write_config(tmp_path, None, 'backend = "etcd";\netcd = { endpoints = ( "%s" ); '
                        'username = "root"; password_file = "%s"; %s };\n%s'
                        % (endpoint, password_file(tmp_path), extra, RACE_ETCD))


AUTH = "/v3/auth/authenticate"
PROBE = "/v3/maintenance/status"  # one per connection opened


def test_threads_of_a_process_share_one_token(bg, rounds_prog, auth_etcd, tmp_path):
    """8 threads' first guarded calls (all at once, each on a connection of
    its own): one /v3/auth/authenticate, counted by a proxy in front of
    etcd, for at least 8 connections (their status probes: the control,
    each authenticated before step 7). A second process makes its own
    (one per process); the counter is exact (16 + 16)."""
    with CountingProxy(auth_etcd.port) as px:
        cfg = auth_config(tmp_path, "127.0.0.1:%d" % px.port)
        path = str(tmp_path / "c")
        for nth in (1, 2):
            p = bg([rounds_prog, "8", path], cfg)
            p.expect("round1")
            assert px.count(AUTH) == nth, px.counts
            assert px.count(PROBE) >= 8 * nth, px.counts
            p.send()
            p.expect("round2")
            assert p.wait() == 0 and ": warn: " not in p.stderr() and \
                ": error: " not in p.stderr(), p.stderr()
            assert px.count(AUTH) == nth, px.counts
        assert int(open(path).read()) == 32
    assert auth_etcd.keys() == []


def test_expired_token_is_replaced_once_for_every_connection(bg, rounds_prog, tmp_path):
    """Tokens live 1 s unused (--auth-token-ttl 1). 8 threads call once (one
    authentication), then the process is idle until its token has expired
    (the control: a token of the test's, taken after the first round, is
    refused by then); the 8 threads call again at once: their requests are
    refused (401) and one authentication more serves them all; every call
    is made (the counter exact), no warning."""
    s = SecureEtcd(extra=["--auth-token-ttl", "1"])
    try:
        s.start().enable_auth()
        with CountingProxy(s.port) as px:
            cfg = auth_config(tmp_path, "127.0.0.1:%d" % px.port)
            path = str(tmp_path / "c")
            p = bg([rounds_prog, "8", path], cfg)
            p.expect("round1")
            assert px.count(AUTH) == 1, px.counts
            stale = s.call(AUTH, {"name": "root", "password": ROOT_PASSWORD})["token"]
            wait_for(lambda: time.monotonic() - px.last > 3, timeout=30,
                     what="the process idle for 3 s (its token past its TTL)")
            assert "invalid auth token" in refused(s, stale)
            refusals = px.count("401")
            p.send()
            p.expect("round2")
            assert p.wait() == 0, p.stderr()
            assert px.count("401") > refusals, px.counts
            assert px.count(AUTH) == 2, px.counts
            assert ": warn: " not in p.stderr() and ": error: " not in p.stderr(), p.stderr()
            assert int(open(path).read()) == 16
        assert s.keys() == []
    finally:
        s.cleanup()


def test_fork_child_keeps_the_token(bg, rounds_prog, auth_etcd, tmp_path):
    """A process of 2 threads authenticates once; its fork child's guarded
    call opens a connection of its own (a status probe more, and its lease
    grant: the control that it did speak to etcd) with the parent's token:
    still one /v3/auth/authenticate. The counter is exact (2 + 2 + 1)."""
    with CountingProxy(auth_etcd.port) as px:
        cfg = auth_config(tmp_path, "127.0.0.1:%d" % px.port)
        path = str(tmp_path / "c")
        p = bg([rounds_prog, "2", path, "fork"], cfg)
        p.expect("round1")
        p.send()
        p.expect("round2")
        probes, grants = px.count(PROBE), px.count("/v3/lease/grant")
        assert p.expect("forked") == "forked status=0"
        assert p.wait() == 0 and ": warn: " not in p.stderr(), p.stderr()
        assert px.count(PROBE) > probes and px.count("/v3/lease/grant") == grants + 1, \
            px.counts
        assert px.count(AUTH) == 1, px.counts
        assert int(open(path).read()) == 5
    assert auth_etcd.keys() == []


# ---- step 7: permit waiters without a herd ----------------------------------------

def entered(waiters, seen):
    """Adds to seen the indexes of waiters that printed "enter" by now."""
    for i, w in enumerate(waiters):
        while not w.lines.empty():
            if (w.lines.get_nowait() or "").startswith("enter"):
                seen.add(i)
    return seen


def quiet(px, s):
    wait_for(lambda: time.monotonic() - px.last > s, timeout=30 * MULT,
             what="no request for %s s" % s)


@pytest.mark.timing
def test_permit_release_wakes_one_waiter_not_the_herd(bg, worker_progs, etcd, tmp_path):
    """limit 2: two holders, then 6 permit waiters (processes), each waiting
    by a watch (a proxy counts them: 6). One release lets one waiter in;
    the watches made after it (a waiter woken looks again and watches
    again) are at most 2: the next waiter, woken by that entry, is the
    first waiter now. The herd (every waiter watching the whole lock)
    made 5, one per waiter left. Then all are let go: each enters in
    turn, none is left behind, no key stays."""
    with CountingProxy(etcd.port) as px:
        cfg = etcd_config(tmp_path, px, 'locks = ( { symbol = "block_call"; key = "k"; '
                          'limit = 2; wait_ms = 60000; lease_ms = 60000; '
                          'retry_max_ms = 30000; } );\n')
        held = [lock_cli(bg, cfg, "--limit", "2") for _ in range(2)]
        waiters = []
        for i in range(6):  # one at a time: their order is their index
            waiters.append(bg([worker_progs["block"]], cfg))
            wait_for(lambda: px.count("/v3/watch") == i + 1, what="waiter %d's watch" % i)
        quiet(px, 1)
        watches = px.count("/v3/watch")
        assert watches == 6 and entered(waiters, set()) == set(), px.counts
        held[-1].send()
        assert held[-1].wait() == 0
        waiters[0].expect("enter")
        quiet(px, 1)
        assert px.count("/v3/watch") - watches <= 2, px.counts
        assert entered(waiters, set()) == set() and len(etcd.keys()) == 7
        for w in [held[0]] + waiters:
            w.send()
        for w in waiters:
            assert w.expect("call rc=42", timeout=60)
        for w in held + waiters:
            assert w.wait(timeout=60) == 0
