# SPDX-License-Identifier: MIT
"""backend = "postgres" (issue 23, its first step): session advisory locks
in a private PostgreSQL cluster (support/postgres.py), through the module
liblockshim-postgres.so.

A SIGKILLed holder freeing the lock at once (control: a live holder
makes the waiter time out at wait_ms, on_timeout applied), the waiter
woken by the release and not by polling (no CPU over a 2 s wait, entering
right after the release), the server restarted and frozen mid-run (calls
bounded, on_error applied, nothing left held), leases (a frozen holder's
session ended by the server after lease_ms, on_lost when it runs again, no
double release; control: a long lease keeps it; a live holder kept over 3
leases by renewal; a terminated session is on_lost), the command without
its module (one line, 78), every refusal (78), and the command's check and
lock, the counts of `lockshim metrics` (two processes of one host add up,
a restart between shipments loses nothing) and `lockshim status` (holders
and waiters named through the names tables, written once per session and
key). What every module backend shares (exclusion and its control, fences
increasing, the module or its library missing, what a Redis-guarded
program maps, locks on send/write/poll, the verbs not built exiting 1,
metrics' shared scenario) is in test_modules.py.
"""
import json
import os
import re
import shutil
import signal
import subprocess
import time

import pytest

from support.postgres import PostgresServer, skip_reason
from support.process import cpu_ticks
from support.secure import NOBODY, NOGROUP, Layout
from support.scenarios import (METRICS_LOCK, assert_mismatch, limit_bounds_the_holders,
                                opposite_orders_finish, refused_setting, scrape,
                                unlock_refuses_then_forces, val)
from support.sets import readers_overlap_writers_alone, replay, writer_behind_readers
from support.sets import start as start_sets
from support.server import serving
from support.util import (CLI, MULT, SHIM, TSAN, cc, lib_program, run, shim_env, wait_for,
                          write_config)
from support.workers import killed_holder_frees

pytestmark = pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")

BLOCK_LOCK = ('locks = ( { symbol = "block_call"; key = "blk"; wait_ms = %d; '
              'on_timeout = "skip"; } );\n')
MODULE = os.path.join(os.path.dirname(SHIM), "liblockshim-postgres.so")


@pytest.fixture(scope="module")
def pg():
    yield from serving(PostgresServer())


@pytest.fixture
def own_pg(request):
    """A server of the test's own (it is restarted or frozen)."""
    yield from serving(PostgresServer(), request, "postgres")


def pg_config(tmp_path, pg, body, extra=""):
    """A config of backend "postgres" on pg plus body; returns its path."""
    return write_config(tmp_path, None, 'backend = "postgres";\npostgres = { conninfo = "%s"; '
                        '%s };\n%s' % (pg.conninfo(), extra, body))


def advisory(pg, granted=None):
    """How many advisory locks the server has (granted: only those, or only
    the waits)."""
    cond = "" if granted is None else " AND %s granted" % ("" if granted else "NOT")
    return int(pg.psql("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'" + cond))


def threads(pid):
    return len(os.listdir("/proc/%d/task" % pid))


# ---- exclusion ------------------------------------------------------------------

def test_psql_sees_the_lock_under_its_key_id(bg, worker_progs, pg, tmp_path):
    """The id is hashtextextended(key, 0): an operator's psql finds it."""
    cfg = pg_config(tmp_path, pg, BLOCK_LOCK % 30000)
    holder = bg([worker_progs["block"]], cfg)
    holder.expect("enter")
    assert pg.psql("SELECT pg_try_advisory_lock(hashtextextended('lockshim:blk', 0))") == "f"
    assert pg.psql("SELECT application_name FROM pg_stat_activity a JOIN pg_locks l "
                   "USING (pid) WHERE l.locktype = 'advisory'") == "lockshim:block"
    holder.send()
    holder.expect("call rc=42")


def keepalive_timer(pg, client_port):
    """The server-side socket's keepalive timer of the session from
    client_port, as ss(8) prints it ("9.5sec", "119min")."""
    def timer():
        out = subprocess.run(["ss", "-tnoH", "state", "established",
                              "( sport = :%d and dport = :%d )" % (pg.port, client_port)],
                             capture_output=True, text=True).stdout
        m = re.search(r"timer:\(keepalive,([^,]+),", out)  # else another timer runs now
        return m and m.group(1)
    return wait_for(timer, what="a keepalive timer on port %d" % client_port)


@pytest.mark.skipif(shutil.which("ss") is None, reason="no ss(8) (iproute2)")
def test_holders_session_has_a_short_tcp_keepalive(bg, worker_progs, pg, tmp_path):
    """A holder's host that dies without closing its connection is noticed
    by the server in about 30 s, not the system's 2 h; control: a psql
    session of the same server keeps the system's 2 h."""
    cfg = pg_config(tmp_path, pg, BLOCK_LOCK % 30000)
    holder = bg([worker_progs["block"]], cfg)
    holder.expect("enter")
    port = int(pg.psql("SELECT client_port FROM pg_stat_activity WHERE application_name = "
                       "'lockshim:block'"))
    timer = keepalive_timer(pg, port)
    assert "min" not in timer and float(re.match(r"[\d.]+", timer).group()) <= 10, timer
    control = subprocess.Popen(["psql", "-h", "127.0.0.1", "-p", str(pg.port), "-U", "postgres",
                                "-Atc", "SELECT pg_sleep(30)"], stdout=subprocess.DEVNULL)
    try:
        port = int(wait_for(lambda: pg.psql(
            "SELECT client_port FROM pg_stat_activity WHERE query LIKE '%pg_sleep(30)%' AND "
            "pid <> pg_backend_pid()") or None, what="the control session"))
        assert keepalive_timer(pg, port).endswith("min")
    finally:
        control.kill()
        control.wait()
    holder.send()
    holder.expect("call rc=42")


# ---- holders that die, waiters that wake ----------------------------------------

def test_killed_holder_frees_the_lock_at_once(bg, worker_progs, pg, tmp_path):
    cfg = pg_config(tmp_path, pg, BLOCK_LOCK % 30000)  # wait_ms is 30 s
    killed_holder_frees(bg, worker_progs["block"], cfg,
                        lambda w: advisory(pg, granted=False) == 1, "the waiter in the server", 3)


def test_control_live_holder_makes_the_waiter_time_out(bg, worker_progs, pg, tmp_path):
    """wait_ms bounds the wait; on_timeout "skip" applies."""
    cfg = pg_config(tmp_path, pg, BLOCK_LOCK % 1500)
    holder = bg([worker_progs["block"]], cfg)
    holder.expect("enter")
    t0 = time.monotonic()
    r = run([worker_progs["block"]], cfg)
    took = time.monotonic() - t0
    assert r.stdout.strip() == "call rc=-1 errno=16", (r.stdout, r.stderr)
    assert 1.4 <= took < 1.5 + 5 * MULT
    assert "still held by another owner after 1500 ms" in r.stderr
    holder.send()
    holder.expect("call rc=42")


@pytest.mark.timing
def test_waiter_is_woken_by_the_release_not_by_polling(bg, worker_progs, pg, tmp_path):
    """Over a 2 s wait the waiter has two threads (its own and the renewal
    thread, started before it queues) and spends (nearly) no CPU: its wait
    blocks in the server (one statement, not asked again); once the
    holder's call returns it enters at once."""
    cfg = pg_config(tmp_path, pg, BLOCK_LOCK % 60000)
    holder = bg([worker_progs["block"], "stay"], cfg)
    holder.expect("enter")
    waiter = bg([worker_progs["block"]], cfg)
    wait_for(lambda: advisory(pg, granted=False) == 1, what="the waiter in the server")
    before = cpu_ticks(waiter.p.pid)
    time.sleep(2)  # the span measured, not a synchronisation
    assert threads(waiter.p.pid) == 2 + TSAN  # (TSan's runtime has its own)
    assert cpu_ticks(waiter.p.pid) - before <= 2
    assert advisory(pg, granted=False) == 1  # one wait, not asked again
    holder.send()
    holder.expect("call rc=42")
    t0 = time.monotonic()
    waiter.expect("enter", timeout=5)
    assert time.monotonic() - t0 < 1 * MULT


# ---- leases: the session's idle_session_timeout, kept by the renewal's pings ----

LEASE_LOCK = ('locks = ( { symbol = "block_call"; key = "blk"; lease_ms = %d; wait_ms = %d; '
              'on_timeout = "skip"; } );\n')
LOST = "lease on lockshim:blk was lost"


def holder_pid(pg):
    """The server pid of the session that holds the (one) advisory lock."""
    return int(wait_for(lambda: pg.psql("SELECT pid FROM pg_locks WHERE locktype = 'advisory' "
                                        "AND granted") or None, what="a granted advisory lock"))


def stopped(bg_proc):
    """SIGSTOPs a Bg's process; returns a function that continues it."""
    os.kill(bg_proc.p.pid, signal.SIGSTOP)
    return lambda: os.kill(bg_proc.p.pid, signal.SIGCONT)


@pytest.mark.timing
def test_frozen_holder_is_bounded_by_its_lease(bg, worker_progs, pg, tmp_path):
    """A holder SIGSTOPped inside its call sends nothing: the server ends
    its idle session after lease_ms (1.5 s) and the waiter enters. Once
    continued, the holder's renewal finds its session gone: on_lost's line;
    its call's end then releases nothing (the waiter's lock is intact in
    pg_locks). Control: test_control_frozen_holder_with_a_long_lease."""
    cfg = pg_config(tmp_path, pg, LEASE_LOCK % (1500, 30000))
    holder = bg([worker_progs["block"]], cfg)
    holder.expect("enter")
    first = holder_pid(pg)
    waiter = bg([worker_progs["block"]], cfg)
    wait_for(lambda: advisory(pg, granted=False) == 1, what="the waiter in the server")
    cont = stopped(holder)
    try:
        t0 = time.monotonic()
        waiter.expect("enter", timeout=20)
        took = time.monotonic() - t0
    finally:
        cont()
    # idle since its last ping (at most lease/3 before the stop) for a lease
    assert 0.9 <= took < 1.5 + 3 * MULT, took
    second = holder_pid(pg)
    assert second != first
    wait_for(lambda: LOST in holder.stderr(), what="on_lost's line")
    assert "applying log" in holder.stderr(), holder.stderr()
    holder.send()
    holder.expect("call rc=42")
    holder.p.wait(timeout=10)
    # no double release: the waiter's lock is still its own
    assert advisory(pg, granted=True) == 1 and holder_pid(pg) == second
    assert pg.psql("SELECT pg_try_advisory_lock(hashtextextended('lockshim:blk', 0))") == "f"
    waiter.send()
    waiter.expect("call rc=42")
    wait_for(lambda: advisory(pg) == 0, what="no advisory lock left")


def test_control_frozen_holder_with_a_long_lease(bg, worker_progs, pg, tmp_path):
    """The same frozen holder with a 10-minute lease keeps the lock: a
    waiter of wait_ms 2 s times out (on_timeout "skip")."""
    cfg = pg_config(tmp_path, pg, LEASE_LOCK % (600000, 2000))
    holder = bg([worker_progs["block"]], cfg)
    holder.expect("enter")
    cont = stopped(holder)
    try:
        r = run([worker_progs["block"]], cfg)
    finally:
        cont()
    assert r.stdout.strip() == "call rc=-1 errno=16", (r.stdout, r.stderr)
    assert "still held by another owner after 2000 ms" in r.stderr, r.stderr
    holder.send()
    holder.expect("call rc=42")
    assert LOST not in holder.stderr(), holder.stderr()


@pytest.mark.timing
def test_live_holder_keeps_its_lock_by_renewal(bg, worker_progs, pg, tmp_path):
    """A holder whose call lasts over 3 leases (lease_ms 1 s) keeps its lock
    and its session: the renewal pings it every lease/3. A waiter of
    wait_ms 2.5 s (shorter than the call) times out; no loss is reported.
    Control: test_frozen_holder_is_bounded_by_its_lease (no pings: gone
    after a lease)."""
    cfg = pg_config(tmp_path, pg, LEASE_LOCK % (1000, 2500))
    holder = bg([worker_progs["block"]], cfg)
    holder.expect("enter")
    t0 = time.monotonic()
    first = holder_pid(pg)
    r = run([worker_progs["block"]], cfg)
    assert r.stdout.strip() == "call rc=-1 errno=16", (r.stdout, r.stderr)
    time.sleep(max(0, 3.2 - (time.monotonic() - t0)))  # the span measured: 3 leases
    assert holder_pid(pg) == first and advisory(pg, granted=True) == 1
    holder.send()
    holder.expect("call rc=42")
    assert LOST not in holder.stderr(), holder.stderr()
    wait_for(lambda: advisory(pg) == 0, what="the release")


@pytest.mark.timing
def test_terminated_session_is_on_lost(bg, worker_progs, pg, tmp_path):
    """pg_terminate_backend of the holder's session mid-call: the next
    renewal (within lease/3) finds it gone and applies on_lost; a second
    caller enters meanwhile (the lock was the session's)."""
    cfg = pg_config(tmp_path, pg, LEASE_LOCK % (1500, 5000))
    holder = bg([worker_progs["block"]], cfg)
    holder.expect("enter")
    assert pg.psql("SELECT pg_terminate_backend(%d)" % holder_pid(pg)) == "t"
    t0 = time.monotonic()
    wait_for(lambda: LOST in holder.stderr(), what="on_lost's line")
    assert time.monotonic() - t0 < 0.5 + 2 * MULT
    assert "applying log" in holder.stderr(), holder.stderr()
    other = bg([worker_progs["block"]], cfg)
    other.expect("enter")
    other.send()
    other.expect("call rc=42")
    holder.send()
    holder.expect("call rc=42")
    wait_for(lambda: advisory(pg) == 0, what="no advisory lock left")


TWICE_MAIN_C = r"""
#include <stdio.h>
int block_call(int x);
/* Two guarded calls in a row, each until a line on stdin. */
int main(void)
{
	int a = block_call(1), b = block_call(2);

	printf("calls rc=%d,%d\n", a, b);
	return 0;
}
"""


def test_call_after_a_lost_lease_reconnects_quietly(bg, worker_progs, pg, tmp_path):
    """The session of a holder is terminated: on_lost, and its next call on
    the same thread opens a new session and takes the lock without an
    error line; control: the loss itself is reported (on_lost's line)."""
    d = os.path.dirname(worker_progs["block"])
    (tmp_path / "twice.c").write_text(TWICE_MAIN_C)
    prog = cc(str(tmp_path / "twice"), [str(tmp_path / "twice.c")], "-O2", "-L" + d,
              "-Wl,-rpath," + d, "-lblock")
    cfg = pg_config(tmp_path, pg, LEASE_LOCK % (1500, 5000))
    holder = bg([prog], cfg)
    holder.expect("enter 1")
    first = holder_pid(pg)
    assert pg.psql("SELECT pg_terminate_backend(%d)" % first) == "t"
    wait_for(lambda: LOST in holder.stderr(), what="on_lost's line")
    holder.send()
    holder.expect("enter 2")
    assert holder_pid(pg) != first
    holder.send()
    assert holder.expect("calls").startswith("calls rc=42,42")
    err = holder.stderr()
    assert "retrying" not in err and err.count("lease on") == 1, err
    wait_for(lambda: advisory(pg) == 0, what="the release")


FORK_LIB_C = r"""
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>
/* Another thread forks a child that outlives the process (it waits for its
 * stdin to close) while this one holds the lock; then waits for a line. */
static void *forker(void *arg)
{
	char c;
	pid_t pid = fork();

	(void)arg;
	if (pid == 0) {
		while (read(0, &c, 1) == 1)
			;
		_exit(0);
	}
	printf("enter child=%d\n", (int)pid);
	fflush(stdout);
	return NULL;
}
int held_call(int x)
{
	pthread_t t;
	char c;

	pthread_create(&t, NULL, forker, NULL);
	pthread_join(t, NULL);
	while (read(0, &c, 1) == 1 && c != '\n')
		;
	return x;
}
"""


def test_fork_child_of_another_thread_does_not_keep_the_lock(bg, worker_progs, pg, tmp_path):
    """A thread forks while another holds the lock; the holder is
    SIGKILLed: its session ends (the child's inherited copy of the socket
    is /dev/null) and the waiter enters at once, the child still running.
    Without pg_atfork_child the child kept the session, and the lock, until
    it exited (checked by disabling it)."""
    prog = lib_program(tmp_path / "fork", "held", FORK_LIB_C, "int held_call(int x);",
                       "held_call(0)", "-pthread")
    cfg = pg_config(tmp_path, pg, 'locks = ( { symbol = "held_call"; key = "blk"; }, '
                    '{ symbol = "block_call"; key = "blk"; wait_ms = 30000; } );\n')
    holder = bg([prog], cfg)
    child = int(holder.expect("enter child=").split("=")[1])
    waiter = bg([worker_progs["block"]], cfg)
    wait_for(lambda: advisory(pg, granted=False) == 1, what="the waiter in the server")
    t0 = time.monotonic()
    holder.p.kill()
    waiter.expect("enter", timeout=10)
    assert time.monotonic() - t0 < 3 * MULT
    assert os.path.exists("/proc/%d" % child)
    holder.p.stdin.close()  # the child's stdin: it exits
    waiter.send()
    waiter.expect("call rc=42")


EXEC_LIB_C = r"""
#include <unistd.h>
/* Execs a shell that says so and waits for a line, inside the guarded call. */
int exec_call(int x)
{
	execl("/bin/sh", "sh", "-c", "echo execd; read line", (char *)0);
	return x;
}
"""


def test_exec_inside_a_guarded_call_frees_the_lock(bg, worker_progs, pg, tmp_path):
    """libpq's socket is close-on-exec: the exec ends the session, so the
    waiter enters while the exec'd program runs; control: the live holder
    before it (test_control_live_holder_makes_the_waiter_time_out)."""
    prog = lib_program(tmp_path / "exec", "exec", EXEC_LIB_C,
                       "int exec_call(int x);", "exec_call(0)")
    cfg = pg_config(tmp_path, pg, 'locks = ( { symbol = "exec_call"; key = "blk"; }, '
                    '{ symbol = "block_call"; key = "blk"; wait_ms = 30000; } );\n')
    holder = bg([prog], cfg)
    holder.expect("execd")
    waiter = bg([worker_progs["block"]], cfg)
    waiter.expect("enter", timeout=10)
    assert holder.p.poll() is None  # the exec'd shell still runs
    holder.send()
    waiter.send()
    waiter.expect("call rc=42")


# ---- the server restarted or frozen ---------------------------------------------

def test_server_restarted_mid_run(bg, worker_progs, own_pg, tmp_path):
    """Down: the call gives up within wait_ms (on_error "skip", an error
    line); back: calls work again and nothing is left held. The holder of
    the restart lost its lock: its renewal (lease 1.5 s) tells it (on_lost)."""
    cfg = pg_config(tmp_path, own_pg, 'locks = ( { symbol = "block_call"; key = "blk"; '
                    'wait_ms = 1500; on_error = "skip"; lease_ms = 1500; } );\n',
                    "connect_timeout_ms = 300; command_timeout_ms = 300;")
    holder = bg([worker_progs["block"]], cfg)
    holder.expect("enter")
    own_pg.stop()
    t0 = time.monotonic()
    r = run([worker_progs["block"]], cfg)
    assert r.stdout.startswith("call rc=-1"), (r.stdout, r.stderr)
    assert time.monotonic() - t0 < 1.5 + 3 * MULT
    assert "PostgreSQL unavailable for 1500 ms" in r.stderr, r.stderr
    own_pg.start()
    # the restart ended the holder's session: its lock is gone while it is
    # still inside its call, and its next renewal says so
    r = run([worker_progs["block"]], cfg, timeout=20)
    assert "call rc=42" in r.stdout, (r.stdout, r.stderr)
    # (while the server was down the renewal could not connect: the lease
    # ran out first, "expired while ... unreachable"; else "was lost")
    wait_for(lambda: "lease on lockshim:blk" in holder.stderr(), what="on_lost's line")
    assert "applying log" in holder.stderr(), holder.stderr()
    holder.send()
    holder.expect("call rc=42")
    holder.p.wait(timeout=10)
    r = run([worker_progs["block"]], cfg, timeout=20)
    assert "call rc=42" in r.stdout, (r.stdout, r.stderr)
    assert advisory(own_pg) == 0


def test_frozen_server_bounds_every_call(worker_progs, own_pg, tmp_path):
    """The server's processes stopped (SIGSTOP): the call gives up by
    command_timeout_ms and wait_ms, on_error applied."""
    cfg = pg_config(tmp_path, own_pg, 'locks = ( { symbol = "block_call"; key = "blk"; '
                    'wait_ms = 1000; on_error = "skip"; } );\n',
                    "connect_timeout_ms = 300; command_timeout_ms = 300;")
    master = own_pg.pid()
    kids = [int(p) for p in open("/proc/%d/task/%d/children" % (master, master)).read().split()]
    def signal_all(sig):
        for p in [master] + kids:
            try:
                os.kill(p, sig)
            except ProcessLookupError:  # a session that was ending
                pass
    signal_all(signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        r = run([worker_progs["block"]], cfg, timeout=30)
        took = time.monotonic() - t0
    finally:
        signal_all(signal.SIGCONT)
    assert r.stdout.startswith("call rc=-1"), (r.stdout, r.stderr)
    assert took < 1.0 + 3 * MULT, took
    assert "connect_timeout_ms" in r.stderr, r.stderr


# ---- refusals -------------------------------------------------------------------

@pytest.mark.parametrize("setting", [
    "retry_max_ms = 50", "break_dead_holders = false",
])
@pytest.mark.parametrize("where", ["lock", "defaults"])
def test_refused_settings(pg, tmp_path, setting, where):
    refused_setting(lambda body: pg_config(tmp_path, pg, body), setting, where, "postgres")


@pytest.mark.parametrize("where", ["lock", "defaults"])
@pytest.mark.parametrize("setting", ['lease_ms = 5000; on_lost = "kill"',
                                     'max_hold_ms = 5000; on_overrun = "kill"'],
                         ids=["lease_ms-on_lost", "max_hold_ms-on_overrun"])
def test_lease_and_overrun_settings_are_accepted(pg, tmp_path, where, setting):
    """The lease is the holder session's idle_session_timeout: lease_ms and
    on_lost are honoured, and so are max_hold_ms and on_overrun (no longer
    refused: control, test_refused_settings)."""
    if where == "lock":
        body = 'locks = ( { symbol = "rename"; key = "k"; %s; } );\n' % setting
    else:
        body = 'defaults = { %s; };\nlocks = ( { symbol = "rename"; key = "k"; } );\n' % setting
    r = run([CLI, "check", "-c", pg_config(tmp_path, pg, body)])
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert "acquire, renew," in r.stdout, r.stdout


def test_wait_replicas_is_refused_with_the_redis_group(pg, tmp_path):
    cfg = pg_config(tmp_path, pg, 'redis = { wait_replicas = 1; };\n'
                    'locks = ( { symbol = "rename"; key = "k"; } );\n')
    r = run([CLI, "check", "-c", cfg])
    assert r.returncode == 78 and "redis" in r.stderr, r.stderr


# ---- the command ----------------------------------------------------------------

def test_check_probes_the_server(pg, tmp_path):
    cfg = pg_config(tmp_path, pg, 'locks = ( { symbol = "rename"; key = "k"; } );\n')
    r = run([CLI, "check", "-c", cfg])
    assert r.returncode == 0, r.stderr
    assert re.search(r"^postgres: ok \(.* at PostgreSQL 127\.0\.0\.1:%d database postgres "
                     r"\(session advisory locks\)\)$" % pg.port, r.stdout, re.M), r.stdout
    assert advisory(pg) == 0
    assert pg.psql("SELECT to_regclass('lockshim_fence') IS NOT NULL") == "t"


def test_passwords_from_the_file_the_setting_and_the_variable(own_pg, tmp_path):
    """password_file, password and LOCKSHIM_POSTGRES_PASSWORD (which
    overrides both) reach the server; control: a wrong one is refused,
    and the password is never printed."""
    own_pg.add_password_user("locker", "s3cret")
    own_pg.psql("GRANT USAGE ON SCHEMA public TO locker")
    (tmp_path / "pw").write_text("s3cret\n")
    (tmp_path / "bad").write_text("wrong\n")
    conninfo = "host=127.0.0.1 port=%d user=locker dbname=postgres" % own_pg.port
    lock = 'locks = ( { symbol = "rename"; key = "k"; } );\n'

    def check(extra, **env):
        cfg = write_config(tmp_path, None, 'backend = "postgres";\npostgres = { conninfo = '
                           '"%s"; %s };\n%s' % (conninfo, extra, lock))
        return run([CLI, "check", "-c", cfg], **env)
    r = check('password_file = "%s";' % (tmp_path / "pw"))
    assert r.returncode == 0 and "postgres: ok" in r.stdout, r.stderr
    # PostgreSQL 15: no CREATE on schema public for locker, so no sequence:
    # fences are 0, one warn line; once made and granted, no line
    warned = [l for l in r.stderr.splitlines() if "fencing tokens are 0" in l]
    assert len(warned) == 1 and "lockshim_fence" in warned[0], r.stderr
    cfg = str(tmp_path / "lockshim.cfg")
    r = run([CLI, "lock", "-c", cfg, "job", "--", "sh", "-c", "echo $LOCKSHIM_FENCE"])
    assert r.returncode == 0 and r.stdout == "0\n", (r.stdout, r.stderr)
    own_pg.psql("CREATE SEQUENCE lockshim_fence; GRANT USAGE ON SEQUENCE lockshim_fence TO locker")
    r = check('password = "s3cret";')
    assert "fencing tokens are 0" not in r.stderr, r.stderr
    assert r.returncode == 0 and "s3cret" not in r.stdout + r.stderr, (r.stdout, r.stderr)
    r = check('password_file = "%s";' % (tmp_path / "bad"))
    assert r.returncode == 69 and "password authentication failed" in r.stderr, r.stderr
    r = check('password_file = "%s";' % (tmp_path / "bad"), LOCKSHIM_POSTGRES_PASSWORD="s3cret")
    assert r.returncode == 0, r.stderr
    r = check('password = "s3cret"; password_file = "%s";' % (tmp_path / "pw"))
    assert r.returncode == 78 and "give password or password_file" in r.stderr, r.stderr


def test_check_reports_a_server_that_is_down(tmp_path):
    cfg = write_config(tmp_path, None, 'backend = "postgres";\npostgres = { conninfo = '
                       '"host=127.0.0.1 port=1 user=postgres"; };\n'
                       'locks = ( { symbol = "rename"; key = "k"; } );\n')
    r = run([CLI, "check", "-c", cfg])
    assert r.returncode not in (0, 78) and "postgres: connect:" in r.stderr, r.stderr


def test_lock_command_holds_and_fences(pg, tmp_path):
    cfg = pg_config(tmp_path, pg, "")
    r = run([CLI, "lock", "-c", cfg, "job", "--", "sh", "-c",
             "echo fence=$LOCKSHIM_FENCE; psql -h 127.0.0.1 -p %d -U postgres -Atc "
             "\"SELECT pg_try_advisory_lock(hashtextextended('lockshim:job', 0))\"" % pg.port],
            LD_PRELOAD="")
    assert r.returncode == 0, r.stderr
    fence, taken = r.stdout.split()
    assert int(fence.split("=")[1]) > 0 and taken == "f", r.stdout
    assert advisory(pg) == 0


def test_lock_command_keeps_its_lease(pg, tmp_path):
    """lockshim lock -l 1000 (no longer refused): the command's lock
    outlives 2.5 leases, kept by the renewal's pings (a frozen one would be
    gone: test_frozen_holder_is_bounded_by_its_lease)."""
    cfg = pg_config(tmp_path, pg, "")
    r = run([CLI, "lock", "-c", cfg, "-l", "1000", "job", "--", "sh", "-c",
             "sleep 2.5; psql -h 127.0.0.1 -p %d -U postgres -Atc "  # the span measured
             "\"SELECT pg_try_advisory_lock(hashtextextended('lockshim:job', 0))\"" % pg.port],
            LD_PRELOAD="")
    assert r.returncode == 0 and r.stdout.strip() == "f", (r.stdout, r.stderr)
    assert "lost" not in r.stderr, r.stderr
    assert advisory(pg) == 0


def test_key_that_is_not_utf8_is_hashed_as_its_hex(pg, tmp_path):
    """A key PostgreSQL would refuse as text (here a byte 0xff) locks the id
    of "\\x" and its hex; control: a UTF-8 key locks its own text's id."""
    cfg = pg_config(tmp_path, pg, "")
    key = b"job\xff"
    hexed = "\\x" + (b"lockshim:" + key).hex()
    sql = ("SELECT pg_try_advisory_lock(hashtextextended('%s', 0)), "
           "pg_try_advisory_lock(hashtextextended('lockshim:job', 0))" % hexed)
    cmd = "psql -h 127.0.0.1 -p %d -U postgres -Atc \"%s\"" % (pg.port, sql)
    r = subprocess.run([CLI.encode(), b"lock", b"-c", cfg.encode(), key, b"--", b"sh", b"-c",
                        cmd.encode()], env=shim_env(cfg, preload=False), capture_output=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.decode().strip() == "f|t", r.stdout  # ours taken; the other free
    r = run([CLI, "lock", "-c", cfg, "job", "--", "sh", "-c", cmd])
    assert r.returncode == 0 and r.stdout.strip() == "t|f", (r.stdout, r.stderr)
    assert advisory(pg) == 0


@pytest.mark.parametrize("verb", [["check"], ["lock", "k", "--", "true"], ["status"]])
def test_command_without_the_module_is_one_line_and_78(pg, tmp_path, verb):
    """A copy of the command with no module beside it (nor in ../lib or
    the install dir)."""
    d = tmp_path / "bin"
    d.mkdir()
    shutil.copy(CLI, str(d / "lockshim"))
    for where in ("/usr/local/lib", "/usr/lib/x86_64-linux-gnu/lockshim"):
        if os.path.exists(os.path.join(where, "liblockshim-postgres.so")):
            pytest.skip("a module is installed in %s" % where)
    cfg = pg_config(tmp_path, pg, 'locks = ( { symbol = "rename"; key = "k"; } );\n')
    r = run([str(d / "lockshim")] + verb[:1] + ["-c", cfg] + verb[1:])
    assert r.returncode == 78, (r.stdout, r.stderr)
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and "liblockshim-postgres.so is not installed" in lines[0], r.stderr


def test_setuid_program_refuses_the_users_libpq_variables(pg):
    """libpq obeys its PG* variables (getenv): in a set-user-ID program run
    by nobody, one of them set (here the user's own CA) refuses the backend,
    one line, and the program runs unguarded as with any untrusted setting;
    control: without it the same program is guarded (its lock in pg_locks)."""
    lay = Layout(1, 1)
    try:
        lay._write(lay.cfg, 'backend = "postgres";\npostgres = { conninfo = "%s"; };\n'
                   'locks = ( { symbol = "secure_work"; key = "secure"; } );\n'
                   % pg.conninfo(), 0o644)

        def go(**user_env):
            env = {k: v for k, v in shim_env(None, preload=False).items()
                   if not k.startswith(("LOCKSHIM_", "PG"))}
            env.update(user_env)
            p = subprocess.Popen([lay.launch, lay.upper, lay.work, str(NOBODY), str(NOGROUP),
                                  lay.secure], env=env,
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
            first = p.stdout.readline()
            held = None
            if first.startswith("enter"):  # else the launcher has exited: no one reads
                held = advisory(pg)
                p.stdin.write("go\n")
                p.stdin.flush()
            out, err = p.communicate(timeout=30)
            if p.returncode == 2 and err.startswith("secure_launch: namespace:"):
                # a chroot (CI's bare-Debian proof) cannot make the namespace
                pytest.skip("no private mount namespace here: " + err.strip())
            return first + out, err, held

        out, err, held = go()
        # guarded: the renewal thread keeps the lease (and TSan's runtime has a thread)
        assert "enter threads=%d euid=0" % (2 + TSAN) in out and held == 1 and err == "", \
            (out, err)
        out, err, held = go(PGSSLROOTCERT="/tmp/users-own-ca.crt")
        assert "enter threads=1 euid=0" in out and held == 0, (out, err)
        lines = [l for l in err.splitlines() if l.strip()]
        assert len(lines) == 1 and "PGSSLROOTCERT is set in a set-ID program" in lines[0], err
    finally:
        lay.cleanup()


# ---- mode = "shared" and fair (issue 23, step 3) -----------------------------------
#
# The observed program of test_sets.py (support/sets.py): each guarded call
# appends "r+"/"w+" to a log when it starts and "r-"/"w-" when it ends;
# replaying the log counts who was inside at once.

def set_lock(symbol, settings):
    return '{ symbol = "%s"; key = "k"; wait_ms = 30000; %s }' % (symbol, settings)


RW_PG = "locks = ( %s, %s );\n" % (set_lock("set_read", 'mode = "shared";'),
                                   set_lock("set_write", ""))


@pytest.mark.parametrize("where", ["lock", "defaults"])
@pytest.mark.parametrize("setting", ['mode = "shared"', "fair = true"])
def test_shared_and_fair_are_accepted(pg, tmp_path, where, setting):
    """mode = "shared" and fair = true are honoured (no longer refused;
    the control: what still is, test_refused_settings)."""
    body = ('defaults = { %s; };\nlocks = ( { symbol = "rename"; key = "k"; } );\n' % setting
            if where == "defaults" else
            'locks = ( { symbol = "rename"; key = "k"; %s; } );\n' % setting)
    r = run([CLI, "check", "-c", pg_config(tmp_path, pg, body)])
    assert r.returncode == 0 and "postgres: ok" in r.stdout, (r.stdout, r.stderr)


@pytest.mark.timing
@pytest.mark.parametrize("guarded", [True, False], ids=["shared", "control-unguarded"])
def test_shared_readers_overlap_writers_alone(sets_prog, pg, tmp_path, guarded):
    """Shared readers (pg_advisory_lock_shared) are inside together, a
    writer (pg_advisory_lock on the same id) is always alone, every call
    entered, no error. Control: unguarded, a writer is inside beside
    others."""
    log = str(tmp_path / "log")
    cfg = pg_config(tmp_path, pg, RW_PG) if guarded else None
    readers_overlap_writers_alone(sets_prog, cfg, log)
    if guarded:
        assert advisory(pg) == 0


@pytest.mark.parametrize("mode", ["shared", "exclusive"], ids=["shared", "control-exclusive"])
def test_shared_holder_is_a_shared_advisory_lock(bg, worker_progs, pg, tmp_path, mode):
    """A shared holder's lock is pg_advisory_lock_shared on the key's id:
    another session's shared try succeeds, an exclusive try fails, and
    pg_locks says ShareLock (on the key's id; a shared holder also holds
    (hashtext(key), 1) shared, postgres_sql.h). Control: an exclusive
    holder refuses both."""
    setting = 'mode = "shared";' if mode == "shared" else ""
    cfg = pg_config(tmp_path, pg, 'locks = ( { symbol = "block_call"; key = "blk"; '
                    'wait_ms = 30000; %s } );\n' % setting)
    holder = bg([worker_progs["block"]], cfg)
    holder.expect("enter")
    kid = "hashtextextended('lockshim:blk', 0)"
    assert pg.psql("SELECT pg_try_advisory_lock(%s)" % kid) == "f"
    assert pg.psql("SELECT pg_try_advisory_lock_shared(%s)" % kid) == \
        ("t" if mode == "shared" else "f")
    assert pg.psql("SELECT mode FROM pg_locks WHERE locktype = 'advisory' AND granted "
                   "AND objsubid = 1") == \
        ("ShareLock" if mode == "shared" else "ExclusiveLock")
    holder.send()
    holder.expect("call rc=42")


@pytest.mark.timing
def test_writer_not_starved_by_readers(sets_prog, pg, tmp_path):
    """Readers (4 processes x 2 threads, 100 ms calls) keep the key held
    without a gap between the marks x and y (the control: a writer waiting
    for a free key would wait for the whole stream); a writer arriving
    meanwhile enters within a few calls' time (the server queues a new
    shared request behind a waiting exclusive one: its lock queue's
    waitMask), alone, and the readers go on after."""
    log = str(tmp_path / "log")
    writer_behind_readers(sets_prog, pg_config(tmp_path, pg, RW_PG), log,
                          str(tmp_path / "stop"), 1000)
    assert replay(log)[1:] == (1, False)


def test_fair_waiters_enter_in_arrival_order(bg, worker_progs, pg, tmp_path):
    """fair = true: three waiters queued one after the other (each seen
    waiting in pg_locks before the next starts) behind a holder enter in
    that order, one at a time: the server hands the lock over at the
    release to its first waiter, and a try never passes a queued one. (No
    control shows them out of order: the server has no other order; a
    grant to another would leave the expected one waiting, and its expect
    would time out.)"""
    cfg = pg_config(tmp_path, pg, 'locks = ( { symbol = "block_call"; key = "blk"; '
                    'wait_ms = 30000; fair = true; } );\n')
    holder = bg([worker_progs["block"]], cfg)
    holder.expect("enter")
    waiters = []
    for i in range(3):
        waiters.append(bg([worker_progs["block"]], cfg))
        wait_for(lambda: advisory(pg, granted=False) == i + 1, what="waiter %d queued" % i)
    holder.send()
    holder.expect("call rc=42")
    for i, w in enumerate(waiters):
        w.expect("enter")
        assert advisory(pg, granted=False) == 2 - i
        w.send()
        w.expect("call rc=42")


def test_shared_try_does_not_pass_a_waiting_exclusive(bg, worker_progs, pg, tmp_path):
    """A shared holder inside: a shared caller (wait_ms 500) enters beside
    it (the control); once an exclusive caller waits behind the holder, a
    new shared caller's first try is refused and it times out instead of
    entering ahead of the waiter; the waiter enters after the holder."""
    lock = ('locks = ( { symbol = "block_call"; key = "blk"; wait_ms = %d; '
            'on_timeout = "skip"; %s } );\n')
    for d in "stx":
        (tmp_path / d).mkdir()
    shared = pg_config(tmp_path / "s", pg, lock % (30000, 'mode = "shared";'))
    shared_short = pg_config(tmp_path / "t", pg, lock % (500, 'mode = "shared";'))
    holder = bg([worker_progs["block"]], shared)
    holder.expect("enter")
    r = run([worker_progs["block"]], shared_short)
    assert "call rc=42" in r.stdout, (r.stdout, r.stderr)  # control: beside the holder
    waiter = bg([worker_progs["block"]], pg_config(tmp_path / "x", pg, lock % (30000, "")))
    wait_for(lambda: advisory(pg, granted=False) == 1, what="the exclusive waiter queued")
    t0 = time.monotonic()
    r = run([worker_progs["block"]], shared_short)
    assert r.stdout.startswith("call rc=-1"), (r.stdout, r.stderr)
    assert time.monotonic() - t0 >= 0.45
    holder.send()
    holder.expect("call rc=42")
    waiter.expect("enter")
    waiter.send()
    waiter.expect("call rc=42")


# ---- limit = N (issue 23, step 3) --------------------------------------------------

@pytest.mark.timing
@pytest.mark.parametrize("limit,most", [(3, 3), (None, 1), ("control", None)],
                         ids=["limit3", "default", "control-unguarded"])
def test_limit_bounds_the_holders(sets_prog, pg, tmp_path, limit, most):
    """8 processes x 2 threads: limit 3 (permits hashtextextended(key, 1..3))
    lets never more than 3 in, and 3 are reached; no limit, one at a time.
    Control: unguarded, more than 3. Nothing is left held."""
    extra = "limit = %d;" % limit if limit != "control" and limit else ""
    cfg = None if limit == "control" else pg_config(
        tmp_path, pg, "locks = ( %s );\n" % set_lock("set_read", extra))
    limit_bounds_the_holders(sets_prog, cfg, str(tmp_path / "log"), most)
    assert advisory(pg) == 0


def mismatch_cfg(tmp_path, pg, name, setting):
    d = tmp_path / name
    d.mkdir()
    return pg_config(d, pg, 'locks = ( { symbol = "hold_call"; key = "k"; wait_ms = 20000; '
                     '%s } );\n' % setting)


def test_limit_mismatch_is_an_error_at_once(progs, procs, pg, tmp_path):
    """Two holders took the key with limit = 3 (permits 1 and 2): callers
    with limit 2 (no permit free of theirs), with no limit (exclusive) and
    shared get the mismatch at once. Control: limit 3 enters beside them
    (permit 3). Nothing is left held by the refused callers."""
    cfg3 = mismatch_cfg(tmp_path, pg, "3", "limit = 3;")
    holders = [procs([progs["driver"], "call:60000"], cfg3) for _ in range(2)]
    for h in holders:
        h.expect("enter")
    before = advisory(pg)
    for i, (limit, setting) in enumerate([(2, "limit = 2;"), (1, ""),
                                          (1, 'mode = "shared";')]):
        assert_mismatch(progs, mismatch_cfg(tmp_path, pg, "c%d" % i, setting), limit, 3)
        assert advisory(pg) == before
    r = run([progs["driver"], "call:0"], cfg3)
    assert r.stdout.strip().splitlines()[-1] == "call rc=42 errno=0", r.stderr


@pytest.mark.parametrize("mode", ["exclusive", "shared"])
def test_limit_one_holder_mismatches_a_semaphore(progs, procs, pg, tmp_path, mode):
    """An exclusive (or shared) holder: a limit = 3 caller gets the mismatch
    at once (limit 1 for the holders); a shared caller waits for the
    exclusive holder (or enters beside the shared one). Control: the
    exclusive holder's own kind of caller waits and enters after it."""
    setting = 'mode = "shared";' if mode == "shared" else ""
    holder = procs([progs["driver"], "call:3000"], mismatch_cfg(tmp_path, pg, "h", setting))
    holder.expect("enter")
    assert_mismatch(progs, mismatch_cfg(tmp_path, pg, "p", "limit = 3;"), 3, 1)
    t0 = time.monotonic()
    r = run([progs["driver"], "call:0"], mismatch_cfg(tmp_path, pg, "s", 'mode = "shared";'))
    assert r.stdout.strip().splitlines()[-1] == "call rc=42 errno=0", r.stderr
    if mode == "exclusive":
        assert time.monotonic() - t0 > 0.3  # waited for the holder (3 s from its start)
    else:
        assert time.monotonic() - t0 < 2.5
    assert holder.finish()[0] == 0


def test_permit_waiter_enters_when_a_permit_is_given_back(progs, procs, pg, tmp_path):
    """Both permits of limit 2 held (1.5 s calls): a third caller blocks
    and enters when one is given back; an exclusive caller after the
    permits are gone enters (nothing of the set is left: the mark, the
    family and id0 are given back with the permit)."""
    cfg1 = mismatch_cfg(tmp_path, pg, "a", "limit = 2;")
    holders = [procs([progs["driver"], "call:1500"], cfg1) for _ in range(2)]
    for h in holders:
        h.expect("enter")
    t0 = time.monotonic()
    r = run([progs["driver"], "call:0"], cfg1)
    took = time.monotonic() - t0
    assert r.stdout.strip().splitlines()[-1] == "call rc=42 errno=0", r.stderr
    assert 0.3 < took < 1.5 + 2 * MULT, took  # waited for a permit
    for h in holders:
        assert h.finish()[0] == 0
    assert advisory(pg) == 0
    r = run([progs["driver"], "call:0"], mismatch_cfg(tmp_path, pg, "x", ""))
    assert r.stdout.strip().splitlines()[-1] == "call rc=42 errno=0", r.stderr


def test_limit_mismatch_seen_only_without_a_free_permit(progs, procs, pg, tmp_path):
    """What is not detected (lockshim.cfg(5) POSTGRES): one holder of limit
    3 (permit 1), a caller of limit 2 finds its permit 2 free and enters
    (at most 3, the larger limit, are inside); the mismatch is told once
    no permit of the caller's is free (test_limit_mismatch_is_an_error_at_once)."""
    holder = procs([progs["driver"], "call:60000"], mismatch_cfg(tmp_path, pg, "3", "limit = 3;"))
    holder.expect("enter")
    r = run([progs["driver"], "call:0"], mismatch_cfg(tmp_path, pg, "2", "limit = 2;"))
    assert r.stdout.strip().splitlines()[-1] == "call rc=42 errno=0", r.stderr


@pytest.mark.parametrize("where", ["lock", "defaults"])
def test_fair_with_limit_is_refused(pg, tmp_path, where):
    """fair = true with limit > 1: a permit's waiters poll, their order is
    not kept: one line naming the setting, exit 78 (control: each alone is
    accepted, test_shared_and_fair_are_accepted and the limit tests)."""
    body = ('defaults = { fair = true; };\nlocks = ( { symbol = "rename"; key = "k"; '
            'limit = 2; } );\n' if where == "defaults" else
            'locks = ( { symbol = "rename"; key = "k"; limit = 2; fair = true; } );\n')
    r = run([CLI, "check", "-c", pg_config(tmp_path, pg, body)])
    assert r.returncode == 78, (r.stdout, r.stderr)
    assert "fair = true with limit > 1 is not built yet" in r.stderr, r.stderr


@pytest.mark.timing
@pytest.mark.parametrize("guarded", [True, False], ids=["mixed-kinds", "control-unguarded"])
def test_shared_and_permit_callers_never_inside_together(sets_prog, pg, tmp_path, guarded):
    """Rounds of a shared reader and a limit = 2 writer started together
    (one 50 ms call each, the order alternating): a reader and a writer are
    never inside at once (each kind's momentary check of the other's family
    lock); the one that comes second gets the mismatch line (on_error
    skip), and each kind wins some rounds. Control: unguarded, they
    overlap."""
    log = str(tmp_path / "log")
    cfg = pg_config(tmp_path, pg, "locks = ( %s, %s );\n" % (
        set_lock("set_read", 'mode = "shared"; on_error = "skip";'),
        set_lock("set_write", 'limit = 2; on_error = "skip";'))) if guarded else None
    err, won = "", {"r": 0, "w": 0}
    for i in range(24):
        before = open(log).read() if os.path.exists(log) else ""
        ps = [start_sets(sets_prog, k, cfg, log, 1, 1, 50) for k in ("rw" if i % 2 else "wr")]
        err += "".join(p.communicate(timeout=60)[1] for p in ps)
        for k in won:
            won[k] += (k + "+") in open(log).read()[len(before):]
    inside, mixed = {"r": 0, "w": 0}, False
    with open(log) as f:
        for line in f:
            inside[line[0]] += 1 if line[1] == "+" else -1
            mixed |= inside["r"] > 0 and inside["w"] > 0
    if not guarded:
        assert mixed
        return
    assert not mixed, err[-3000:]
    assert won["r"] and won["w"], (won, err[-3000:])
    assert "for the key's holders" in err, err[-3000:]
    assert advisory(pg) == 0


# ---- metrics: the counts table lockshim_metrics -------------------------------------

def test_counts_of_one_host_add_up_and_survive_a_restart(procs, progs, own_pg, tmp_path):
    """Two processes of one host (LOCKSHIM_TEST_HOST) ship their counts into
    one key while both run (the renewal thread ships about once a second):
    `lockshim metrics` shows their sum; the server restarted between
    shipments, their later calls add to it and nothing is lost; the table
    keeps one row per field of a host (its primary key: not one per
    process or shipment). Control: another host's counts are kept apart."""
    cfg = pg_config(tmp_path, own_pg, METRICS_LOCK)
    ps = [procs([progs["driver"]] + ["call:0"] * 3 + ["stdin"] + ["call:0"] * 2, cfg,
                LOCKSHIM_TEST_HOST="h") for _ in range(2)]
    for p in ps:
        for _ in range(3):
            assert p.expect("call").startswith("call rc=42")
    wait_for(lambda: val(scrape(cfg), "lockshim_calls_total", "hold_call", "h") == 6,
             what="both processes' shipments")
    fields = int(own_pg.psql("SELECT count(DISTINCT field) FROM lockshim_metrics"))
    own_pg.restart()
    for p in ps:
        p.send()
    for p in ps:
        assert p.finish()[0] == 0
    r = run([progs["driver"], "call:0"], cfg, LOCKSHIM_TEST_HOST="other")
    assert r.returncode == 0, r.stderr
    m = scrape(cfg)
    assert val(m, "lockshim_calls_total", "hold_call", "h") == 10, m
    assert val(m, "lockshim_calls_total", "hold_call", "other") == 1, m
    assert int(own_pg.psql("SELECT count(*) FROM lockshim_metrics WHERE key = "
                           "'lockshim:metrics:{h}'::bytea")) >= fields
    assert own_pg.psql("SELECT count(*) FROM (SELECT key, field FROM lockshim_metrics "
                       "GROUP BY key, field HAVING count(*) > 1) d") == "0"


# ---- status: pg_locks joined with the names tables -------------------------------------

def status_objects(cfg, *args):
    """`lockshim status --json` of cfg (args: more of its arguments): its
    objects, in its order."""
    r = run([CLI, "status", "-c", cfg, "--json"] + list(args))
    assert r.returncode == 0, r.stderr
    return [json.loads(l) for l in r.stdout.splitlines()]


def test_status_lists_holders_and_waiters_by_key(bg, worker_progs, pg, tmp_path):
    """`lockshim status` names the advisory locks by key (lockshim_keys,
    written once per session and key) and their holders and waiters by
    owner record (lockshim_sessions): "blk" its holder and its waiter (JSON
    and text), "sh" two shared holders, "pm" a permit holder of limit 3; a
    pattern selects; nothing once all are released. Control: the key table
    emptied, the same locks held are not listed."""
    lock = ('locks = ( { symbol = "block_call"; key = "%s"; lease_ms = 60000; '
            'wait_ms = 60000; %s } );\n')
    cfgs = {}
    for key, extra in (("blk", ""), ("sh", 'mode = "shared";'), ("pm", "limit = 3;")):
        (tmp_path / key).mkdir()
        cfgs[key] = pg_config(tmp_path / key, pg, lock % (key, extra))
    cfg = cfgs["blk"]
    holder = bg([worker_progs["block"]], cfg)
    holder.expect("enter")
    waiter = bg([worker_progs["block"]], cfg)
    wait_for(lambda: advisory(pg, granted=False) == 1, what="the waiter queued")
    readers = [bg([worker_progs["block"]], cfgs["sh"]) for _ in range(2)]
    permit = bg([worker_progs["block"]], cfgs["pm"])
    for p in readers + [permit]:
        p.expect("enter")
    got = status_objects(cfg)
    assert [o["key"] for o in got] == ["blk", "pm", "sh", "sh"], got
    blk, pm, sh = got[0], got[1], got[2:]
    assert (blk["pid"], blk["program"], blk["mode"], blk["limit"]) == (
        holder.p.pid, "block", "exclusive", 1), blk
    assert blk["held_ms"] is not None and blk["fence"] is None, blk
    assert [w["pid"] for w in blk["waiters"]] == [waiter.p.pid], blk
    assert blk["waiters"][0]["waited_ms"] is not None, blk
    assert (pm["pid"], pm["limit"], pm["waiters"]) == (permit.p.pid, 3, []), pm
    assert sorted(o["pid"] for o in sh) == sorted(p.p.pid for p in readers), sh
    assert all(o["mode"] == "shared" and o["limit"] == 1 for o in sh), sh
    r = run([CLI, "status", "-c", cfg])
    assert r.returncode == 0, r.stderr
    line = [l for l in r.stdout.splitlines() if l.startswith("blk  held by")]
    assert len(line) == 1 and "pid %d " % holder.p.pid in line[0], r.stdout
    assert "1 waiting" in line[0] and "pid %d " % waiter.p.pid in line[0], r.stdout
    assert [o["key"] for o in status_objects(cfg, "b*")] == ["blk"]
    # control: without the key's name, a lock held is not listed
    pg.psql("TRUNCATE lockshim_keys")
    assert status_objects(cfg) == [] and advisory(pg, granted=True) > 0
    for p in [holder, waiter] + readers + [permit]:
        if p is waiter:
            p.expect("enter")
        p.send()
        p.expect("call rc=42")
    wait_for(lambda: advisory(pg) == 0, what="every lock released")
    assert status_objects(cfg) == []


def test_names_are_written_once_per_session_and_key(progs, own_pg, tmp_path):
    """The server's statement log (log_statement = all) of one process's
    six calls of two keys (one session): each key's name and the session's
    owner record written once, by the first call of each key; control: the
    try, one statement per call, is there six times."""
    own_pg.psql("ALTER SYSTEM SET log_statement = 'all'")
    own_pg.psql("SELECT pg_reload_conf()")
    cfg = pg_config(tmp_path, own_pg, 'locks = ( { symbol = "hold_call"; key = "a"; }, '
                    '{ symbol = "other_call"; key = "b"; } );\n')
    with open(own_pg.log) as f:
        start = len(f.read())
    r = run([progs["driver"]] + ["call:0", "other:1"] * 3, cfg)
    assert r.returncode == 0, r.stderr
    with open(own_pg.log) as f:
        log = f.read()[start:]
    assert log.count("INSERT INTO lockshim_keys") == 2, log[-3000:]
    assert log.count("INSERT INTO lockshim_sessions") == 1, log[-3000:]
    assert log.count("execute lockshim_try:") == 6, log[-3000:]


def test_status_lists_a_permits_waiter(bg, worker_progs, own_pg, tmp_path):
    """limit = 2, both permits held and a third caller waiting (it blocks on
    one permit at a time, 200 ms each, then tries all again): status lists
    the two holders, limit 2, and the waiter with the first (listed while
    it blocks on a permit: most of its time); metrics' lockshim_waiting
    counts it (a server of its own: the shared one keeps other tests'
    counts). Nothing once all are released."""
    cfg = pg_config(tmp_path, own_pg, 'locks = ( { symbol = "block_call"; key = "pm2"; '
                    'limit = 2; wait_ms = 60000; } );\n')
    holders = [bg([worker_progs["block"]], cfg) for _ in range(2)]
    for p in holders:
        p.expect("enter")
    waiter = bg([worker_progs["block"]], cfg)
    got = wait_for(lambda: [o for o in status_objects(cfg) if o["waiters"]] and
                   status_objects(cfg), what="the permit waiter listed")
    assert sorted(o["pid"] for o in got) == sorted(p.p.pid for p in holders), got
    assert all(o["limit"] == 2 and o["key"] == "pm2" for o in got), got
    assert [w["pid"] for o in got for w in o["waiters"]] == [waiter.p.pid], got
    wait_for(lambda: val(scrape(cfg), "lockshim_waiting", "block_call") == 1,
             what="the waiter counted")
    holders[0].send()
    holders[0].expect("call rc=42")
    waiter.expect("enter")
    for p in (holders[1], waiter):
        p.send()
        p.expect("call rc=42")
    wait_for(lambda: advisory(own_pg) == 0, what="every lock released")
    assert status_objects(cfg) == []


@pytest.mark.timing
def test_status_held_time_survives_the_renewal_pings(bg, worker_progs, pg, tmp_path):
    """A holder of lease_ms = 600 held 2 s, its session pinged by the
    renewal every lease/3 (a bare Sync message: no statement): its session
    kept (the lock still held past three leases), and status's held_ms
    still counts from the lock statement (pg_stat_activity's query_start,
    which a SELECT 1 ping would move: held time unknown)."""
    cfg = pg_config(tmp_path, pg, 'locks = ( { symbol = "block_call"; key = "lz"; '
                    'lease_ms = 600; } );\n')
    holder = bg([worker_progs["block"]], cfg)
    holder.expect("enter")
    time.sleep(2)  # the hold being measured, over three leases
    got = status_objects(cfg)
    assert advisory(pg, granted=True) == 1
    assert len(got) == 1 and got[0]["pid"] == holder.p.pid, got
    assert got[0]["held_ms"] is not None and got[0]["held_ms"] >= 1800, got
    holder.send()
    holder.expect("call rc=42")


def test_stale_names_are_pruned_unless_locked(bg, worker_progs, own_pg, tmp_path):
    """A name not written for 2 h (a session names a key again after 1 h of
    use) is deleted by the next name written, unless its key is locked now:
    of two rows made 3 h old, the one of a key nobody holds goes, the one of
    a held key stays (and status still lists its holder); the new name is
    there."""
    cfg = pg_config(tmp_path, own_pg, 'locks = ( { symbol = "block_call"; key = "kept"; '
                    'wait_ms = 60000; } );\n')
    holder = bg([worker_progs["block"]], cfg)
    holder.expect("enter")
    own_pg.psql("INSERT INTO lockshim_keys VALUES (hashtextextended('lockshim:gone', 0), "
                "'lockshim:gone', now() - interval '3 hours'); UPDATE lockshim_keys SET "
                "seen = now() - interval '3 hours'")
    assert own_pg.psql("SELECT key FROM lockshim_keys ORDER BY 1").split() == [
        "lockshim:gone", "lockshim:kept"]
    r = run([CLI, "lock", "-c", cfg, "fresh", "--", "true"])
    assert r.returncode == 0, r.stderr
    assert own_pg.psql("SELECT key FROM lockshim_keys ORDER BY 1").split() == [
        "lockshim:fresh", "lockshim:kept"]
    assert [o["pid"] for o in status_objects(cfg)] == [holder.p.pid]
    holder.send()
    holder.expect("call rc=42")


def test_status_of_a_role_that_cannot_see_other_sessions(bg, worker_progs, own_pg, tmp_path):
    """A role without pg_read_all_stats (SELECT on the names tables only)
    runs status: the holder of another role (postgres) is listed, its held
    time unknown (pg_stat_activity hides its times from that role);
    control: the holder's own role sees the held time."""
    cfg = pg_config(tmp_path, own_pg, 'locks = ( { symbol = "block_call"; key = "v"; } );\n')
    holder = bg([worker_progs["block"]], cfg)
    holder.expect("enter")
    own_pg.psql("CREATE ROLE viewer LOGIN; GRANT SELECT ON lockshim_keys, lockshim_sessions "
                "TO viewer")
    (tmp_path / "viewer").mkdir()
    cfg_viewer = write_config(tmp_path / "viewer", None, 'backend = "postgres";\npostgres = { '
                              'conninfo = "host=127.0.0.1 port=%d user=viewer dbname=postgres"; '
                              '};\n' % own_pg.port)
    got = status_objects(cfg_viewer)
    assert [(o["key"], o["pid"], o["held_ms"]) for o in got] == [("v", holder.p.pid, None)], got
    got = status_objects(cfg)
    assert got[0]["held_ms"] is not None, got
    holder.send()
    holder.expect("call rc=42")


def test_counts_of_processes_exiting_together_add_up(procs, progs, own_pg, tmp_path):
    """Eight processes of one host, five calls each, let go at once: their
    shipments at exit (one upsert each into the same rows, all at the same
    moment) add up to 40 exactly, and none fails (no deadlock: rows are
    taken in field order). It can fail: with the update reading the value
    in the statement's snapshot (SET value = (SELECT ...) + excluded.value)
    5 runs of 5 counted 15 or 35 (checked out of the tree)."""
    cfg = pg_config(tmp_path, own_pg, METRICS_LOCK)
    ps = [procs([progs["driver"]] + ["call:0"] * 5 + ["stdin"], cfg, LOCKSHIM_TEST_HOST="h")
          for _ in range(8)]
    for p in ps:
        for _ in range(5):
            assert p.expect("call").startswith("call rc=42")
    for p in ps:
        p.send()
    for p in ps:
        rc, _, err = p.finish()
        assert rc == 0 and "counts not sent" not in err, err
    m = scrape(cfg)
    assert val(m, "lockshim_calls_total", "hold_call", "h") == 40, m
    assert sum(val(m, "lockshim_acquired_total", "hold_call", "h", how=how)
               for how in ("fast", "waited")) == 40, m


# ---- max_hold_ms and on_overrun (step 5) ------------------------------------------

OVERRUN_LOCK = ('locks = ( { symbol = "block_call"; key = "blk"; lease_ms = %d; wait_ms = %d; '
                'on_timeout = "skip"; %s } );\n')
OVERRUN = "lease on lockshim:blk exceeded max_hold_ms; renewal stopped; applying"


@pytest.mark.timing
def test_overrun_log_frees_the_lock_to_a_waiter(bg, worker_progs, pg, tmp_path):
    """A holder past max_hold_ms (500 ms) with on_overrun "log": its line,
    and its lock released at once on its session (.overrun_release), which
    lives on: a waiter (blocked in the server) enters about max_hold_ms
    after the grant, not a lease (20 s) later as when the session was left
    to end (the build before, checked). The holder's call runs on and its
    end releases nothing of the waiter's (no max_hold_ms), and says
    nothing. Control:
    test_control_without_max_hold_ms_the_waiter_waits."""
    cfg = pg_config(tmp_path, pg, OVERRUN_LOCK % (20000, 30000, "max_hold_ms = 500;"))
    (tmp_path / "w").mkdir()
    cfg_waiter = pg_config(tmp_path / "w", pg, OVERRUN_LOCK % (20000, 30000, ""))
    holder = bg([worker_progs["block"]], cfg)
    holder.expect("enter")
    t0 = time.monotonic()
    first = holder_pid(pg)
    waiter = bg([worker_progs["block"]], cfg_waiter)
    waiter.expect("enter", timeout=30)
    took = time.monotonic() - t0
    assert 0.45 <= took < 0.5 + 5 * MULT, took
    assert OVERRUN + " log" in holder.stderr(), holder.stderr()
    second = holder_pid(pg)
    assert second != first
    assert pg.psql("SELECT count(*) FROM pg_stat_activity WHERE pid = %d" % first) == "1"
    holder.send()
    holder.expect("call rc=42")
    holder.p.wait(timeout=10)
    # the holder's end released nothing: the waiter's lock is intact
    assert advisory(pg, granted=True) == 1 and holder_pid(pg) == second
    assert LOST not in holder.stderr() and "failed" not in holder.stderr(), holder.stderr()
    waiter.send()
    waiter.expect("call rc=42")
    wait_for(lambda: advisory(pg) == 0, what="no advisory lock left")


@pytest.mark.timing
def test_control_without_max_hold_ms_the_waiter_waits(bg, worker_progs, pg, tmp_path):
    """The same holder without max_hold_ms keeps its lock by renewal: a
    waiter of wait_ms 2.5 s times out, and nothing is said of an overrun."""
    cfg = pg_config(tmp_path, pg, OVERRUN_LOCK % (1000, 2500, ""))
    holder = bg([worker_progs["block"]], cfg)
    holder.expect("enter")
    r = run([worker_progs["block"]], cfg)
    assert r.stdout.strip() == "call rc=-1 errno=16", (r.stdout, r.stderr)
    holder.send()
    holder.expect("call rc=42")
    assert "max_hold_ms" not in holder.stderr(), holder.stderr()


@pytest.mark.parametrize("settings,status", [
    ('on_overrun = "kill";', -signal.SIGTERM),
    ('on_overrun = "kill"; kill_signal = "SIGUSR1";', -signal.SIGUSR1),
    ('on_overrun = "abort";', -signal.SIGABRT),
])
def test_overrun_kill_and_abort_end_the_holder(bg, worker_progs, pg, tmp_path, settings, status):
    """on_overrun "kill" (its kill_signal) and "abort" end the holder past
    max_hold_ms (200 ms, with a 60 s lease: the server would keep its
    session that long): its death ends its session, and a waiter (of no
    max_hold_ms) enters."""
    cfg = pg_config(tmp_path, pg, OVERRUN_LOCK % (60000, 30000, "max_hold_ms = 200; " + settings))
    (tmp_path / "w").mkdir()
    cfg_waiter = pg_config(tmp_path / "w", pg, OVERRUN_LOCK % (60000, 30000, ""))
    holder = bg([worker_progs["block"]], cfg)
    holder.expect("enter")
    waiter = bg([worker_progs["block"]], cfg_waiter)
    assert holder.p.wait(timeout=10 * MULT) == status, holder.stderr()
    assert "exceeded max_hold_ms" in holder.stderr(), holder.stderr()
    waiter.expect("enter", timeout=10)
    waiter.send()
    waiter.expect("call rc=42")


@pytest.mark.timing
def test_overrun_lock_is_not_kept_by_another_lock_of_its_session(procs, progs, pg, tmp_path):
    """One thread holds "outer" (hold_call, max_hold_ms 500) and, inside
    it, "inner" (the usleep it calls, no max_hold_ms): one session holds
    both, and inner's renewals ping it for the whole 6 s call. The overrun
    lock is released on that session at once: a waiter on "outer" enters
    long before the call ends, and inner, whose session lives, is not lost.
    Control (the build before, checked): the session, pinged no more, was
    ended by the server, and inner was told lost with it."""
    cfg = pg_config(tmp_path, pg, 'locks = ( { symbol = "hold_call"; key = "outer"; '
                    'lease_ms = 1000; max_hold_ms = 500; wait_ms = 30000; },\n'
                    '  { symbol = "usleep"; key = "inner"; lease_ms = 1000; } );\n')
    holder = procs([progs["driver"], "call:6000"], cfg)
    holder.expect("enter")
    t0 = time.monotonic()
    waiter = procs([progs["driver"], "call:0"], cfg)
    waiter.expect("enter")
    took = time.monotonic() - t0
    assert took < 4.5, took
    assert waiter.expect("call") == "call rc=42 errno=0"
    assert waiter.finish()[0] == 0
    rc, out, err = holder.finish()
    assert rc == 0 and "call rc=42" in out, (out, err)
    assert "lease on lockshim:outer exceeded max_hold_ms" in err, err
    assert " was lost" not in err and "failed" not in err, err
    wait_for(lambda: advisory(pg) == 0, what="no advisory lock left")


# ---- linger_ms (step 5) ---------------------------------------------------------

def linger_config(tmp_path, pg, settings):
    return pg_config(tmp_path, pg, 'locks = ( { symbol = "hold_call"; key = "f"; %s } );\n'
                     % settings)


def tries_logged(pg, argv, cfg):
    """Runs argv under cfg; returns how many lock statements the server's
    statement log shows (log_statement = all) and the run."""
    pg.psql("ALTER SYSTEM SET log_statement = 'all'")
    pg.psql("SELECT pg_reload_conf()")
    with open(pg.log) as f:
        start = len(f.read())
    r = run(argv, cfg)
    with open(pg.log) as f:
        log = f.read()[start:]
    return log.count("execute lockshim_try:"), r


def test_linger_a_burst_of_calls_takes_the_lock_once(progs, own_pg, tmp_path):
    """Five quick calls with linger_ms = 30000 (and handoff_ms, which caps
    it, as long): one lock statement (the kept lock taken back without a
    round trip), released at exit. Control: linger_ms = 0 (the default)
    sends one per call."""
    calls = [progs["driver"]] + ["call:0"] * 5
    n, r = tries_logged(own_pg, calls, linger_config(tmp_path, own_pg,
                                                     "handoff_ms = 30000; linger_ms = 30000;"))
    assert r.stdout.split().count("rc=42") == 5, r.stderr
    assert n == 1, n
    wait_for(lambda: advisory(own_pg) == 0, what="released at exit")
    (tmp_path / "c").mkdir()
    n, r = tries_logged(own_pg, calls, linger_config(tmp_path / "c", own_pg, ""))
    assert r.stdout.split().count("rc=42") == 5, r.stderr
    assert n == 5, n


@pytest.mark.timing
def test_linger_kept_lock_goes_to_a_waiter_while_its_holder_idles(procs, progs, pg, tmp_path):
    """A kept lock (linger_ms 300, lease 60 s) whose thread does not call
    again is released by the renewal thread on that thread's session
    (the only one that can): a waiter of another process enters about
    linger_ms after the last call, while the holder still runs (blocked on
    stdin). Without it (the release sent on the renewal thread's own
    session, which holds nothing: checked) the waiter timed out."""
    cfg = linger_config(tmp_path, pg, "lease_ms = 60000; wait_ms = 5000; linger_ms = 300;")
    holder = procs([progs["driver"], "call:0", "stdin"], cfg)
    assert holder.expect("call") == "call rc=42 errno=0"
    t0 = time.monotonic()
    r = run([progs["driver"], "call:0"], cfg)
    took = time.monotonic() - t0
    assert "call rc=42 errno=0" in r.stdout, r.stderr
    assert took < 0.3 + 2 * MULT, took
    assert holder.p.poll() is None
    assert advisory(pg) == 0
    holder.send()
    rc, _, err = holder.finish()
    assert rc == 0 and "lost" not in err and "failed" not in err, err


class PsqlHolder:
    """A psql session holding key's advisory lock until free()."""

    def __init__(self, pg, key):
        self.id = "hashtextextended('lockshim:%s', 0)" % key
        self.p = subprocess.Popen(["psql", "-h", "127.0.0.1", "-p", str(pg.port), "-U",
                                   "postgres", "-Atq"], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        self.sql("SELECT pg_advisory_lock(%s);" % self.id)

    def sql(self, line):
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()

    def free(self):
        self.sql("SELECT pg_advisory_unlock(%s);" % self.id)

    def close(self):
        self.p.stdin.close()
        self.p.wait(timeout=10)


@pytest.mark.timing
def test_linger_kept_lock_is_given_up_before_its_thread_waits(procs, progs, pg, tmp_path):
    """A thread keeps "a" (linger_ms and handoff_ms 30 s) and then waits,
    in the server, for "b" (held by a psql session). That wait keeps its
    session busy, and only that session can unlock "a"; so the thread gives
    "a" up before it waits (lock.c, give_up_kept). A waiter for "a" enters
    while the holder still waits for "b". With the kept lock held through
    the wait (the build before give_up_kept: checked) the waiter timed out
    at its wait_ms (8 s)."""
    cfg = pg_config(tmp_path, pg, 'locks = ( { symbol = "hold_call"; key = "a"; lease_ms = 60000; '
                    'linger_ms = 30000; handoff_ms = 30000; wait_ms = 8000; },\n'
                    '  { symbol = "other_call"; key = "b"; wait_ms = 20000; } );\n')
    psql = PsqlHolder(pg, "b")
    try:
        wait_for(lambda: advisory(pg, granted=True) == 1, what="psql holding b")
        holder = procs([progs["driver"], "call:0", "other:1", "stdin"], cfg)
        assert holder.expect("call") == "call rc=42 errno=0"
        wait_for(lambda: advisory(pg, granted=False) == 1, what="the holder waiting for b")
        r = run([progs["driver"], "call:0"], cfg)
        assert "call rc=42 errno=0" in r.stdout, r.stderr
        assert advisory(pg, granted=False) == 1  # the holder still waits for b
        assert holder.p.poll() is None
        psql.free()
        assert holder.expect("other") == "other rc=2 errno=0"
    finally:
        psql.close()
    holder.send()
    rc, _, err = holder.finish()
    assert rc == 0 and "lost" not in err and "failed" not in err, err


def test_linger_kept_lock_is_released_before_exec(procs, progs, pg, tmp_path):
    """A kept lock (linger_ms and handoff_ms 30 s) is gone once its program execs a
    program that waits (nobody exits, linger_ms is long); control: before
    the exec, after its call, the lock is still kept (granted in
    pg_locks)."""
    cfg = linger_config(tmp_path, pg, "lease_ms = 60000; handoff_ms = 30000; linger_ms = 30000;")
    p = procs([progs["driver"], "call:0", "stdin", "exec:stdin"], cfg)
    assert p.expect("call") == "call rc=42 errno=0"
    assert advisory(pg, granted=True) == 1
    p.send()
    wait_for(lambda: open("/proc/%d/cmdline" % p.p.pid).read().split("\0")[1:2] == ["stdin"],
             what="exec")
    wait_for(lambda: advisory(pg) == 0, what="the kept lock released")
    p.send()
    assert p.finish()[0] == 0


@pytest.mark.timing
def test_linger_is_capped_by_handoff_ms(procs, progs, pg, tmp_path):
    """handoff_ms (accepted now: it only caps linger_ms) 300 with linger_ms
    30 s: the idle holder's kept lock goes to a waiter about 300 ms after
    it was taken. Control: test_linger_kept_lock_is_released_before_exec
    (handoff_ms 30 s: still kept after the call)."""
    cfg = linger_config(tmp_path, pg, "lease_ms = 60000; wait_ms = 5000; handoff_ms = 300; "
                        "linger_ms = 30000;")
    holder = procs([progs["driver"], "call:0", "stdin"], cfg)
    t0 = time.monotonic()
    assert holder.expect("call") == "call rc=42 errno=0"
    r = run([progs["driver"], "call:0"], cfg)
    took = time.monotonic() - t0
    assert "call rc=42 errno=0" in r.stdout, r.stderr
    assert took < 0.3 + 2 * MULT, took
    assert holder.p.poll() is None
    holder.send()
    assert holder.finish()[0] == 0


# ---- kept locks given up before a wait (step 6) -----------------------------------

ORDERS_LOCKS = ('locks = ( { symbol = "hold_call"; key = "k1"; %s },\n'
                '  { symbol = "other_call"; key = "k2"; %s } );\n')


@pytest.mark.timing
@pytest.mark.parametrize("detector", ["60s", "1s"], ids=["no-detector", "server-default"])
def test_linger_opposite_orders_do_not_wait_for_each_other(procs, progs, own_pg, tmp_path,
                                                           detector):
    """Process A calls k1 then k2, B k2 then k1, each keeping its first
    key (linger_ms and handoff_ms 5 s) when it asks for its second (both
    kept: granted in pg_locks). Each would wait in the server on its
    session, which alone could unlock its kept key; each gives its kept key
    up before it waits, so both finish at once, far below wait_ms (20 s),
    with no error. The server's deadlock detector (deadlock_timeout) is
    set out of reach (60 s), then left at its default (1 s). Control (the
    build before give_up_kept, checked): with 60 s both waited until
    wait_ms (20 s, on_timeout); with 1 s the detector failed one wait after
    1 s ("deadlock detected", a warn line, that session dropped with its
    locks) and the other then entered."""
    own_pg.psql("ALTER SYSTEM SET deadlock_timeout = '%s'" % detector)
    own_pg.psql("SELECT pg_reload_conf()")
    settings = "linger_ms = 5000; handoff_ms = 5000; wait_ms = 20000;"
    cfg = pg_config(tmp_path, own_pg, ORDERS_LOCKS % (settings, settings))
    # k1 kept by A, k2 by B
    for err in opposite_orders_finish(progs, procs, cfg,
                                      lambda: advisory(own_pg, granted=True) == 2):
        assert "deadlock detected" not in err, err
    wait_for(lambda: advisory(own_pg) == 0, what="released at exit")


@pytest.mark.timing
def test_linger_outer_lock_of_a_running_call_stays_while_it_waits(procs, progs, pg, tmp_path):
    """A thread keeps "c" (other_call, linger_ms 5 s), then calls hold_call
    ("a"), inside which usleep ("b", held by a psql session) waits. Before
    that wait the thread gives up "c" (kept only for linger_ms) but not
    "a", which a running call holds: a waiter for "a" of another process
    waits (not granted in pg_locks) until the holder's call has ended,
    after psql frees "b". Control: "c" is given up, the same moment."""
    settings = "linger_ms = 5000; handoff_ms = 5000; wait_ms = 20000;"
    cfg = pg_config(tmp_path, pg, 'locks = ( { symbol = "hold_call"; key = "a"; %s },\n'
                    '  { symbol = "usleep"; key = "b"; %s },\n'
                    '  { symbol = "other_call"; key = "c"; %s } );\n'
                    % (settings, settings, settings))
    psql = PsqlHolder(pg, "b")
    try:
        wait_for(lambda: advisory(pg, granted=True) == 1, what="psql holding b")
        holder = procs([progs["driver"], "other:1", "call:100"], cfg)
        assert holder.expect("other") == "other rc=2 errno=0"
        assert holder.expect("enter") == "enter 100"
        wait_for(lambda: advisory(pg, granted=False) == 1, what="the holder waiting for b")
        # c given up: granted are a (the holder's call) and b (psql)
        wait_for(lambda: advisory(pg, granted=True) == 2, what="c given up")
        waiter = procs([progs["driver"], "call:0"], cfg)
        wait_for(lambda: advisory(pg, granted=False) == 2, what="the waiter waiting for a")
        assert advisory(pg, granted=True) == 2
        r = run([progs["driver"], "other:1"], cfg)  # c is free
        assert "other rc=2 errno=0" in r.stdout, r.stderr
        assert holder.p.poll() is None and waiter.p.poll() is None
        psql.free()
        assert holder.expect("call") == "call rc=42 errno=0"
        assert waiter.expect("enter") == "enter 0"
    finally:
        psql.close()
    for p in (holder, waiter):
        rc, _, err = p.finish()
        assert rc == 0 and "still held" not in err and "failed" not in err, err


@pytest.mark.timing
def test_deadlock_of_nested_calls_keeps_the_running_calls_locks(procs, progs, pg, tmp_path):
    """Process A's hold_call holds "a" and its usleep asks for "b"; B's
    holds "b" and asks for "a" (two configs, the keys swapped), both let in
    at once when a psql session holding both keys ends. The server's
    deadlock detector (deadlock_timeout, 1 s) fails one of the inner waits:
    a refusal, not an error, so that session and its outer lock stay (a
    warn line names the deadlock) and the cycle lasts until wait_ms (4 s),
    as with Redis: an inner call times out (on_timeout "skip"), no lock is
    lost. Control (the build before, checked): the victim's session was
    dropped with its outer lock, which its running call lost."""
    def config(outer, inner):
        (tmp_path / outer).mkdir()
        return pg_config(tmp_path / outer, pg, 'locks = ( { symbol = "hold_call"; key = "%s"; '
                         'wait_ms = 20000; },\n  { symbol = "usleep"; key = "%s"; '
                         'wait_ms = 4000; on_timeout = "skip"; } );\n' % (outer, inner))
    psql = PsqlHolder(pg, "a")
    try:
        psql.sql("SELECT pg_advisory_lock(hashtextextended('lockshim:b', 0));")
        wait_for(lambda: advisory(pg, granted=True) == 2, what="psql holding a and b")
        a = procs([progs["driver"], "call:300"], config("a", "b"))
        b = procs([progs["driver"], "call:300"], config("b", "a"))
        wait_for(lambda: advisory(pg, granted=False) == 2, what="both waiting")
    finally:
        psql.close()
    for p in (a, b):
        assert p.expect("enter") == "enter 300"
    assert a.expect("call") == "call rc=42 errno=0"
    assert b.expect("call") == "call rc=42 errno=0"
    errs = [p.finish()[2] for p in (a, b)]
    both = "".join(errs)
    assert "found a deadlock waiting for lockshim:" in both, both
    assert "still held by another owner" in both, both
    assert " lost" not in both and "was not held any more" not in both, both
    # an inner key is had only once the other side's timeout ended its call
    # (the control: at the detector's 1 s, from the dropped session)
    waited = [int(m) for m in re.findall(r"taken after waiting (\d+) ms", both)]
    assert all(w >= 3000 for w in waited), both
    wait_for(lambda: advisory(pg) == 0, what="released at exit")


# ---- unlock: the holder's session ended (pg_remove) -------------------------------

def test_unlock_refuses_a_live_holder_then_ends_its_session(bg, worker_progs, pg, tmp_path):
    """Without --force a holder alive on this host is kept (exit 1, its lock
    untouched); with --force its session is ended (only a session can give
    its advisory lock back): the waiter enters at once, and the holder,
    whose renewal pings that session, reports the loss. Control: a second
    unlock finds nothing held (1)."""
    cfg = pg_config(tmp_path, pg, 'locks = ( { symbol = "block_call"; key = "ublk"; '
                    'lease_ms = 6000; wait_ms = 60000; } );\n')
    unlock_refuses_then_forces(
        bg, worker_progs, cfg, "ublk", lambda: advisory(pg, granted=False) == 1,
        lambda: (advisory(pg, granted=True), advisory(pg, granted=False)) == (1, 1))


def test_unlock_names_the_locks_that_go_with_the_session(procs, progs, pg, tmp_path):
    """hold_call ("ua") is inside usleep ("ub"): one session holds both, so
    `unlock --force ua` frees ub too, and says so; nothing is left held."""
    cfg = pg_config(tmp_path, pg, 'locks = ( { symbol = "hold_call"; key = "ua"; },\n'
                    '  { symbol = "usleep"; key = "ub"; } );\n')
    h = procs([progs["driver"], "call:30000"], cfg)
    assert h.expect("enter") == "enter 30000"
    wait_for(lambda: advisory(pg, granted=True) == 2, what="ua and ub held")
    r = run([CLI, "unlock", "-c", cfg, "--force", "ua"])
    assert r.returncode == 0 and r.stdout.startswith("removed ua  held by "), \
        (r.stdout, r.stderr)
    assert "lockshim:ua: these locks of the same holder went with it: lockshim:ub" \
        in r.stderr, r.stderr
    wait_for(lambda: advisory(pg) == 0, what="both freed")
    h.kill()
