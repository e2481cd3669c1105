# SPDX-License-Identifier: MIT
"""Production Redis: Sentinel, WAIT for replicas, passwords from a file or
the environment.

Each sentinel test gets its own topology on 127.0.0.1 free ports: a primary,
two replicas and three sentinels monitoring it as "locks" (quorum 2,
down-after 1 s). Every process is stopped by its pid when the test ends,
after a SIGCONT in case a test froze it. Failovers are started from the
test (`SENTINEL FAILOVER`, or SIGKILL of the primary) once the workers have
said they are running, and are waited for by polling the sentinels and the
nodes, never by sleeping.

1. exclusion holds through a `SENTINEL FAILOVER` (wait_replicas = 2) and
   through a SIGKILL of the primary (wait_replicas = 1): counters exact,
   nobody dies or hangs, the traffic moves to the new primary, where calls
   complete within 2 s of a sentinel naming it; a process idle through the
   failover takes its next lock on the new primary, not at the old
   primary's address answering again;
2. a lease lost by a failover is reported by on_lost, and the release
   leaves another owner's key alone; a lease kept through a failover is
   released on the new primary, where a waiter re-queued gets it at once;
3. a dead or frozen first sentinel is skipped;
4. `lockshim check` finds the primary through the sentinels, and fails
   (69) naming the sentinels when none answers;
5. wait_replicas: an acquire no replica acknowledges is released and is a
   Redis error (on_error); an unacknowledged renewal is a warning only;
6. password_file and LOCKSHIM_REDIS_PASSWORD, sentinel_password, and no
   password ever in a log line or in check's output.
"""
import errno
import os
import re
import secrets
import signal
import subprocess
import time

import pytest

from resp import free_port
from support.server import RedisServer, lock_keys, namespace_keys, started
from support.topology import FAST, MASTER, Node, Topology
from support.util import CLI, MULT, TIMEOUT, run, shim_env, wait_for, write_config
from support.workers import (PROCS, THREADS, WORK, assert_lost_format, calls, counter,
                             finish_workers, last, lost_lines, start_workers)

pytestmark = pytest.mark.timing  # time bounds and forced races: make test-repeat

OK_LINE = "call rc=42 errno=0"


# ---- the topology (support/topology.py) ---------------------------------------

def topology(request, **kw):
    yield from started(request, Topology(**kw))


@pytest.fixture
def topo(request):
    yield from topology(request)


@pytest.fixture
def secured_topo(request):
    """The same with a password on the data nodes and another on the sentinels."""
    yield from topology(request, password="Data-" + secrets.token_hex(8),
                        sentinel_password="Sent-" + secrets.token_hex(8))


# ---- 1. exclusion through failovers -------------------------------------------------

def traffic_reaches(node, path, before):
    """Polls until the workers run calls on node: its SET count grows and the
    counter moves on by a few more updates."""
    node.cmd("CONFIG", "RESETSTAT")
    start = counter(path)
    wait_for(lambda: calls(node, "set") >= 10 and counter(path) >= start + 10, timeout=40,
             what="lock traffic on the new primary (port %d)" % node.port)
    assert counter(path) > before


def test_control_workers_lose_updates(worker_progs, tmp_path):
    """Without the shim the worker loses updates: the exact counts below mean something."""
    path, stop = str(tmp_path / "c"), str(tmp_path / "stop")
    with open(path, "w") as f:
        f.write("0\n")
    env = shim_env(None, preload=False)
    ps = [subprocess.Popen([worker_progs["worker"], path, str(THREADS), "50", stop], env=env,
                           stdout=subprocess.PIPE, text=True) for _ in range(PROCS)]
    outs = [p.communicate(timeout=TIMEOUT)[0] for p in ps]
    assert all(p.returncode == 0 for p in ps), outs
    assert counter(path) < PROCS * THREADS * 50


def run_through(topo, worker_progs, bg, tmp_path, wait_ms, redis_extra, disrupt):
    """Runs the counter workload against the topology, starts a failover
    with disrupt(old primary) once the workers run, waits for the new
    primary and for lock traffic there, stops the workers and checks that
    every call succeeded within wait_ms and the counter is exact. Returns
    the workers' stderr and the new primary."""
    cfg = topo.config(tmp_path, WORK % wait_ms, redis_extra)
    path, stop = str(tmp_path / "c"), str(tmp_path / "stop")
    old = topo.primary()
    try:
        ws = start_workers(bg, worker_progs, cfg, path, stop)
        before = counter(path)
        assert calls(old, "set") > 0  # the locks were taken at the primary
        disrupt(old)
        new = topo.wait_failover(old)
        traffic_reaches(new, path, before)
    finally:
        open(stop, "w").close()
    total, err = finish_workers(ws, wait_ms)
    assert counter(path) == total, err[-3000:]
    assert_lost_format(err, "ledger_update", "lockshim:ledger")
    return err, new


def test_exclusion_through_sentinel_failover(topo, worker_progs, bg, tmp_path):
    """SENTINEL FAILOVER while 3 processes x 2 threads update one counter, with
    wait_replicas = 2 (every lock is on both replicas before its call runs):
    every call succeeds within its bound, the counter is exact, and the
    calls go on at the new primary."""
    def failover(old):
        assert topo.sentinels[0].cmd("SENTINEL", "FAILOVER", MASTER) == "OK"
    _, new = run_through(topo, worker_progs, bg, tmp_path, 30000,
                         "wait_replicas = 2; wait_replicas_ms = 200;", failover)
    assert calls(new, "set") > 0


RESUME_S = 2  # guarded calls resume on the new primary within this of its announcement


def announced(topo, old):
    """The node a sentinel names as the primary, once one names another than
    old (the sentinels announce the promoted replica)."""
    for s in topo.asked():
        try:
            addr = s.master_addr()
        except (OSError, ConnectionError):
            continue
        if addr and addr[1] != old.port:
            return topo.by_port(addr[1])
    return None


def test_exclusion_through_sigkill_of_the_primary(topo, worker_progs, bg, tmp_path):
    """SIGKILL of the primary mid-run, wait_replicas = 1: the calls right after
    retry until the sentinels have promoted a replica (the one with the
    highest offset, holding every acknowledged lock); from the moment a
    sentinel names the new primary, guarded calls resume there (the counter
    moves on, SETs seen there) within 2 s; no program dies, no call fails, the counter is exact; a
    lease lost on the way is reported by on_lost."""
    cfg = topo.config(tmp_path, WORK % 40000, "wait_replicas = 1; wait_replicas_ms = 200;")
    path, stop = str(tmp_path / "c"), str(tmp_path / "stop")
    old = topo.primary()
    try:
        ws = start_workers(bg, worker_progs, cfg, path, stop)
        before = counter(path)
        assert calls(old, "set") > 0
        killed = time.monotonic()
        os.kill(old.proc.pid, signal.SIGKILL)
        old.proc.wait()
        new = wait_for(lambda: announced(topo, old), timeout=60, what="a new primary announced")
        seen = time.monotonic()
        new.cmd("CONFIG", "RESETSTAT")  # it is a primary now: no SET replicated from old
        at = counter(path)
        resumed = None
        while time.monotonic() < seen + RESUME_S * MULT:
            # a call completed (its lock acknowledged by a replica), at the new primary
            if counter(path) > at and calls(new, "set") > 0:
                resumed = time.monotonic()
                break
            time.sleep(0.01)
        print("announced %.2f s after the kill; calls resumed %s s after that"
              % (seen - killed, resumed and round(resumed - seen, 2)))
        assert resumed, ("no guarded call at the new primary (port %d) within %d s of its "
                         "announcement: %s" % (new.port, RESUME_S,
                                               "".join(w.stderr() for w in ws)[-3000:]))
        assert topo.wait_failover(old) is new
        traffic_reaches(new, path, before)
    finally:
        open(stop, "w").close()
    total, err = finish_workers(ws, 40000)
    assert counter(path) == total, err[-3000:]
    assert_lost_format(err, "ledger_update", "lockshim:ledger")


def test_a_restarted_old_primary_is_not_trusted_after_the_failover(topo, progs, procs, tmp_path):
    """D makes a guarded call on the primary, then stays idle while that
    primary is SIGKILLed and the sentinels promote a replica; a
    redis-server then answers on the old primary's address as a primary (an
    old primary restarted by its supervisor, empty, before the sentinels
    turn it into a replica; here it ignores REPLICAOF, so they cannot).
    D's next call takes its lock on the new primary, the one the sentinels
    name, not at the address D found last."""
    cfg = topo.config(tmp_path, 'locks = ( { symbol = "hold_call"; key = "k"; lease_ms = 5000; '
                      'wait_ms = 10000; linger_ms = 0; } );\n')
    old = topo.primary()
    d = procs([progs["driver"], "call:0", "stdin", "call:3000"], cfg)
    assert d.expect("call") == "call rc=42 errno=0"
    # the first lock's release reached the replicas: a key at the new primary is the second's
    wait_for(lambda: all(r.cmd("EXISTS", "lockshim:k") == 0 for r in topo.replicas()),
             what="the release replicated")
    os.kill(old.proc.pid, signal.SIGKILL)
    old.proc.wait()
    new = topo.wait_failover(old)
    imp = Node("--rename-command", "REPLICAOF", "replicaof-off-" + secrets.token_hex(4),
               "--rename-command", "SLAVEOF", "slaveof-off-" + secrets.token_hex(4),
               name="restarted")
    imp.port = old.port
    try:
        imp.start()
        assert imp.role() == "master"
        d.send()
        wait_for(lambda: new.cmd("GET", "lockshim:k") or imp.cmd("GET", "lockshim:k"),
                 what="D's second lock")
        assert ":%d:" % d.p.pid in (new.cmd("GET", "lockshim:k") or ""), \
            "taken at the restarted old primary (port %d)" % imp.port
        assert namespace_keys(imp) == []
    finally:
        imp.cleanup()
    rc, out, err = d.finish()
    assert rc == 0 and last(out) == "call rc=42 errno=0", (out, err)


# ---- 2. a lease lost in a failover --------------------------------------------------

def test_lease_lost_in_a_failover_is_reported(topo, worker_progs, bg, tmp_path):
    """A call holds lockshim:blk through a failover; on the new primary the
    key then belongs to another owner. The renewal reports the lost lease
    (on_lost = log: an error line, the program goes on), the call returns
    normally, and its release leaves the other owner's key alone."""
    cfg = topo.config(tmp_path, 'locks = ( { symbol = "block_call"; key = "blk"; '
                      'lease_ms = 3000; wait_ms = 5000; on_lost = "log"; } );\n')
    old = topo.primary()
    b = bg([worker_progs["block"]], cfg)
    b.expect("enter")
    assert ":%d:" % b.p.pid in old.cmd("GET", "lockshim:blk")
    assert topo.sentinels[0].cmd("SENTINEL", "FAILOVER", MASTER) == "OK"
    new = topo.wait_failover(old)
    other = "0123456789abcdef0123456789abcdef:elsewhere:1:1:x:1:1"
    new.cmd("SET", "lockshim:blk", other, "PX", 60000)
    wait_for(lambda: lost_lines(b.stderr()), timeout=30, what="the lost lease to be reported")
    assert b.p.poll() is None  # on_lost = log: not killed
    b.send()
    assert b.expect("call") == OK_LINE
    assert b.wait() == 0
    err = b.stderr()
    assert_lost_format(err, "block_call", "lockshim:blk")
    assert new.cmd("GET", "lockshim:blk") == other
    assert new.cmd("PTTL", "lockshim:blk") > 0


def test_waiter_queued_on_the_old_primary_gets_the_lock_after_the_failover(topo, worker_progs, bg,
                                                                          tmp_path):
    """H holds lockshim:blk (20 s lease, wait_replicas = 1, so the promoted
    replica has it) and W waits for it in the queue on the old primary. After
    a SENTINEL FAILOVER, once H's renewal has reached the new primary, H's
    call ends while H lives on: W re-queued on the new primary and enters
    within a few seconds, not after H's remaining lease (H's release must
    reach the new primary, not the connection the failover closed)."""
    cfg = topo.config(tmp_path, 'locks = ( { symbol = "block_call"; key = "blk"; '
                      'lease_ms = 20000; wait_ms = 60000; } );\n', "wait_replicas = 1;")
    old = topo.primary()
    h = bg([worker_progs["block"], "stay"], cfg)
    h.expect("enter")
    value = old.cmd("GET", "lockshim:blk")
    w = bg([worker_progs["block"], "stay"], cfg)
    wait_for(lambda: old.cmd("ZCARD", "lockshim:blk:q") == 1, what="W queued on the old primary")
    assert topo.sentinels[0].cmd("SENTINEL", "FAILOVER", MASTER) == "OK"
    new = topo.wait_failover(old)
    # H's renewal (every 6.7 s) refreshed the lease on the new primary.
    wait_for(lambda: new.cmd("GET", "lockshim:blk") == value and
             new.cmd("PTTL", "lockshim:blk") > 14000, timeout=30,
             what="H's lease renewed on the new primary")
    assert w.lines.empty()  # W has not entered: H still holds the lock
    h.send()
    assert h.expect("call") == OK_LINE
    t0 = time.monotonic()
    try:
        w.expect("enter", timeout=5)
    except AssertionError as e:
        raise AssertionError("W did not enter within 5 s of H's release; on the new primary "
                             "the key is %r with %s ms left; H's log:\n%s\n%s"
                             % (new.cmd("GET", "lockshim:blk"), new.cmd("PTTL", "lockshim:blk"),
                                h.stderr()[-2000:], e))
    assert time.monotonic() - t0 < 5 * MULT
    w.send()
    assert w.expect("call") == OK_LINE
    for p in (h, w):
        p.send()
        assert p.wait() == 0, p.stderr()
        assert lost_lines(p.stderr()) == [], p.stderr()
    assert lock_keys(new) == []


# ---- 3. sentinels that do not answer ------------------------------------------------

@pytest.mark.parametrize("how", ["killed", "frozen"])
def test_unanswering_first_sentinel_is_skipped(topo, progs, tmp_path, how):
    """The first sentinel listed is dead (SIGKILL) or frozen (SIGSTOP): the
    shim asks the next one, and the call is guarded within about one
    connect plus one command timeout."""
    first = topo.sentinels[0]
    cfg = topo.config(tmp_path, 'locks = ( { symbol = "hold_call"; key = "k"; '
                      'wait_ms = 10000; } );\n', first=first)
    topo.out.add(first)
    try:
        if how == "killed":
            first.proc.kill()
            first.proc.wait()
        else:
            first.freeze()
        t0 = time.monotonic()
        r = run([progs["driver"], "call:0"], cfg)
        took = time.monotonic() - t0
    finally:
        first.thaw()
    assert r.returncode == 0 and last(r.stdout) == OK_LINE, r.stderr
    assert took < (0.5 + 0.5 + 2) * MULT, took
    assert lock_keys(topo.primary()) == []


# ---- 4. lockshim check --------------------------------------------------------------

def check(cfg, **env):
    return subprocess.run([CLI, "check", "-c", cfg], env=shim_env(None, preload=False, **env),
                          capture_output=True, text=True, timeout=TIMEOUT,
                          stdin=subprocess.DEVNULL)


HOLD = 'locks = ( { symbol = "hold_call"; } );\n'


def test_check_finds_the_primary_through_the_sentinels(topo, tmp_path):
    p = topo.primary()
    r = check(topo.config(tmp_path, HOLD))
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert re.search(r"primary.*127\.0\.0\.1:%d\b" % p.port, r.stdout), r.stdout
    assert p.cmd("KEYS", "*") == []  # the probe key was cleaned up


def test_check_follows_a_failover(topo, tmp_path):
    old = topo.primary()
    assert topo.sentinels[0].cmd("SENTINEL", "FAILOVER", MASTER) == "OK"
    new = topo.wait_failover(old)
    r = check(topo.config(tmp_path, HOLD))
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert re.search(r"primary.*127\.0\.0\.1:%d\b" % new.port, r.stdout), r.stdout


def dead_sentinels_cfg(tmp_path, master=MASTER, ports=None):
    ports = ports or [free_port(), free_port()]
    listed = ", ".join('"127.0.0.1:%d"' % p for p in ports)
    path = write_config(tmp_path, None, 'redis = { sentinels = ( %s ); master_name = "%s"; '
                        '%s };\n%s' % (listed, master, FAST, HOLD))
    return path, ports


def test_check_with_only_dead_sentinels_fails_naming_them(tmp_path):
    cfg, ports = dead_sentinels_cfg(tmp_path)
    r = check(cfg)
    assert r.returncode == 69, (r.stdout, r.stderr)
    # check's settings line names the sentinels too: look at the rest
    out = "\n".join(x for x in r.stdout.splitlines()
                    if not x.startswith("settings: ")) + r.stderr
    for p in ports:
        assert "127.0.0.1:%d" % p in out, out
    assert "redis: ok" not in r.stdout


def test_check_with_an_unknown_master_fails_naming_the_sentinels(topo, tmp_path):
    ports = [s.port for s in topo.sentinels]
    cfg, _ = dead_sentinels_cfg(tmp_path, master="nosuchmaster", ports=ports)
    r = check(cfg)
    assert r.returncode == 69, (r.stdout, r.stderr)
    # check's settings line names the sentinels too: look at the rest
    out = "\n".join(x for x in r.stdout.splitlines()
                    if not x.startswith("settings: ")) + r.stderr
    for p in ports:
        assert "127.0.0.1:%d" % p in out, out


# ---- 5. wait_replicas -----------------------------------------------------------------

@pytest.mark.parametrize("policy,expect", [
    ('on_error = "skip"; return = 7;', ("call rc=7 errno=%d" % errno.EBUSY, 0)),
    ('on_error = "exit"; exit_code = 9;', ("", 9)),
])
def test_unacknowledged_acquire_is_a_redis_error(topo, progs, tmp_path, policy, expect):
    """wait_replicas = 1 with both replicas frozen: no acquire is acknowledged,
    so each is released and counts as a Redis error; after wait_ms on_error
    applies (on_timeout would abort). Once the replicas run again, calls are
    guarded."""
    p = topo.primary()
    reps = topo.replicas()
    body = ('locks = ( { symbol = "hold_call"; key = "k"; lease_ms = 20000; wait_ms = 300; '
            'on_timeout = "abort"; %s } );\n' % policy)
    cfg = topo.config(tmp_path, body, "wait_replicas = 1; wait_replicas_ms = 100;")
    try:
        for r in reps:
            r.freeze()
        t0 = time.monotonic()
        res = run([progs["driver"], "call:0"], cfg)
        took = time.monotonic() - t0
        assert (last(res.stdout), res.returncode) == expect, res.stderr
        assert took < 5 * MULT, took
        # The unacknowledged lock was released, not left for its 20 s lease.
        wait_for(lambda: lock_keys(p) == [], timeout=5, what="the unacknowledged lock to go")
    finally:
        for r in reps:
            r.thaw()
    res = run([progs["driver"], "call:0"], topo.config(
        tmp_path, body.replace("wait_ms = 300", "wait_ms = 10000"),
        "wait_replicas = 1; wait_replicas_ms = 100;", name="after.cfg"))
    assert (last(res.stdout), res.returncode) == (OK_LINE, 0), res.stderr
    assert lock_keys(p) == []


def test_unacknowledged_renewal_is_a_warning_and_keeps_the_lease(topo, worker_progs, bg, tmp_path):
    """wait_replicas = 1, a 600 ms lease held while both replicas are frozen:
    renewals go on at the primary unacknowledged, each a warn line "not
    acknowledged"; the lease is kept (the key stays ours, no on_lost) and the
    call ends normally."""
    p = topo.primary()
    reps = topo.replicas()
    cfg = topo.config(tmp_path, 'locks = ( { symbol = "block_call"; key = "blk"; '
                      'lease_ms = 600; wait_ms = 5000; on_lost = "log"; } );\n',
                      "wait_replicas = 1; wait_replicas_ms = 100;")
    b = bg([worker_progs["block"]], cfg)
    b.expect("enter")
    value = p.cmd("GET", "lockshim:blk")
    assert ":%d:" % b.p.pid in value
    try:
        for r in reps:
            r.freeze()
        wait_for(lambda: "not acknowledged" in b.stderr(), timeout=10,
                 what="an unacknowledged renewal to be logged")
        # A few more renewal periods (the 600 ms lease would have ended).
        end = time.monotonic() + 1.5
        while time.monotonic() < end:
            assert p.cmd("GET", "lockshim:blk") == value
            time.sleep(0.05)
    finally:
        for r in reps:
            r.thaw()
    b.send()
    assert b.expect("call") == OK_LINE
    assert b.wait() == 0
    err = b.stderr()
    warns = [l for l in err.splitlines() if "not acknowledged" in l]
    assert warns and all(re.match(r"lockshim\[\d+\] \S+: warn: ", l) for l in warns), err
    assert lost_lines(err) == [], err
    wait_for(lambda: lock_keys(p) == [], timeout=5, what="the release")


# ---- 6. passwords ---------------------------------------------------------------------

@pytest.fixture
def secured():
    pw = "Pw-" + secrets.token_hex(8)
    r = RedisServer(password=pw).start()
    yield r
    r.cleanup()


def pw_file(tmp_path, pw, name="pw"):
    path = str(tmp_path / name)
    with open(path, "w") as f:
        f.write(pw + "\nsecond line is not the password\n")
    os.chmod(path, 0o600)
    return path


def secured_cfg(tmp_path, redis, extra):
    return write_config(tmp_path, redis, 'log_level = "debug";\n'
                        'locks = ( { symbol = "hold_call"; key = "k"; wait_ms = 200; } );\n',
                        redis_extra=extra)


def no_secret(secrets_, *texts):
    for s in secrets_:
        for t in texts:
            assert s not in t, "password %r logged:\n%s" % (s, t)


EBUSY_LINE = "call rc=-1 errno=%d" % errno.EBUSY


def test_password_file(progs, secured, tmp_path):
    cfg = secured_cfg(tmp_path, secured, 'password_file = "%s";'
                      % pw_file(tmp_path, secured.password))
    r = run([progs["driver"], "call:0"], cfg)
    assert r.returncode == 0 and last(r.stdout) == OK_LINE, r.stderr
    assert "acquired lockshim:k" in r.stderr  # debug lines were written
    c = check(cfg, LOCKSHIM_LOG_LEVEL="debug")
    assert c.returncode == 0 and "redis: ok" in c.stdout, (c.stdout, c.stderr)
    no_secret([secured.password], r.stderr, r.stdout, c.stdout, c.stderr)


@pytest.mark.parametrize("where", ["password_file", "password"])
def test_environment_overrides_a_wrong_password(progs, secured, tmp_path, where):
    wrong = "Wrong-" + secrets.token_hex(8)
    extra = ('password_file = "%s";' % pw_file(tmp_path, wrong) if where == "password_file"
             else 'password = "%s";' % wrong)
    cfg = secured_cfg(tmp_path, secured, extra)
    r = run([progs["driver"], "call:0"], cfg, LOCKSHIM_REDIS_PASSWORD=secured.password)
    assert r.returncode == 0 and last(r.stdout) == OK_LINE, r.stderr
    c = check(cfg, LOCKSHIM_LOG_LEVEL="debug", LOCKSHIM_REDIS_PASSWORD=secured.password)
    assert c.returncode == 0 and "redis: ok" in c.stdout, (c.stdout, c.stderr)
    no_secret([secured.password, wrong], r.stderr, r.stdout, c.stdout, c.stderr)


def test_wrong_password_from_the_environment_fails_clearly(progs, secured, tmp_path):
    """The environment wins over a right password_file: with a wrong one the
    call is skipped, the error names WRONGPASS, and neither password is logged
    (by the shim or by check, which exits 69)."""
    wrong = "Wrong-" + secrets.token_hex(8)
    cfg = secured_cfg(tmp_path, secured, 'password_file = "%s";'
                      % pw_file(tmp_path, secured.password))
    r = run([progs["driver"], "call:0"], cfg, LOCKSHIM_REDIS_PASSWORD=wrong)
    assert r.returncode == 0 and last(r.stdout) == EBUSY_LINE, r.stderr
    assert "WRONGPASS" in r.stderr, r.stderr
    c = check(cfg, LOCKSHIM_LOG_LEVEL="debug", LOCKSHIM_REDIS_PASSWORD=wrong)
    assert c.returncode == 69 and "WRONGPASS" in c.stderr, (c.stdout, c.stderr)
    no_secret([secured.password, wrong], r.stderr, r.stdout, c.stdout, c.stderr)


def test_no_password_fails_with_noauth(progs, secured, tmp_path):
    cfg = secured_cfg(tmp_path, secured, "")
    r = run([progs["driver"], "call:0"], cfg)
    assert r.returncode == 0 and last(r.stdout) == EBUSY_LINE, r.stderr
    assert "NOAUTH" in r.stderr, r.stderr
    c = check(cfg)
    assert c.returncode == 69 and "NOAUTH" in c.stderr, (c.stdout, c.stderr)


SECURED_BODY = ('log_level = "debug";\n'
                'locks = ( { symbol = "hold_call"; key = "k"; wait_ms = 500; } );\n')


def secured_extra(t, tmp_path, sentinel_password):
    return 'sentinel_password = "%s"; password_file = "%s";' % (
        sentinel_password, pw_file(tmp_path, t.password))


def test_passwords_for_sentinels_and_data_nodes(secured_topo, progs, tmp_path):
    """sentinel_password for the sentinels, password_file for the data nodes:
    calls are guarded and check finds the primary; at debug level neither
    password is in any output."""
    t = secured_topo
    cfg = t.config(tmp_path, SECURED_BODY, secured_extra(t, tmp_path, t.sentinel_password))
    r = run([progs["driver"], "call:0"], cfg)
    assert r.returncode == 0 and last(r.stdout) == OK_LINE, r.stderr
    assert "acquired lockshim:k" in r.stderr  # debug lines were written
    c = check(cfg, LOCKSHIM_LOG_LEVEL="debug")
    assert c.returncode == 0, (c.stdout, c.stderr)
    assert re.search(r"primary.*127\.0\.0\.1:%d\b" % t.primary().port, c.stdout), c.stdout
    no_secret([t.password, t.sentinel_password], r.stdout, r.stderr, c.stdout, c.stderr)


def test_wrong_sentinel_password_fails_naming_every_sentinel(secured_topo, progs, tmp_path):
    """A wrong sentinel_password: the call is skipped, check exits 69 with
    WRONGPASS and names every sentinel it tried; no password is logged."""
    t = secured_topo
    wrong = "Wrong-" + secrets.token_hex(8)
    cfg = t.config(tmp_path, SECURED_BODY, secured_extra(t, tmp_path, wrong))
    r = run([progs["driver"], "call:0"], cfg)
    assert r.returncode == 0 and last(r.stdout) == EBUSY_LINE, r.stderr
    c = check(cfg, LOCKSHIM_LOG_LEVEL="debug")
    assert c.returncode == 69, (c.stdout, c.stderr)
    assert "WRONGPASS" in c.stderr, c.stderr
    no_secret([t.password, t.sentinel_password, wrong], r.stdout, r.stderr, c.stdout, c.stderr)
    for s in t.sentinels:
        assert s.addr() in c.stderr, c.stderr
