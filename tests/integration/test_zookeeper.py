# SPDX-License-Identifier: MIT
"""backend = "zookeeper" (issue 23, its first step): ZooKeeper's lock recipe
(ephemeral sequential znodes, each waiter watching its predecessor) on a
private server (support/zookeeper.py), through the module
liblockshim-zookeeper.so.

What every module backend shares (exclusion and its control, fences
increasing, the module's library missing, what a Redis-guarded program
maps, locks on send/write/poll, unlock exiting 1, metrics) is in
test_modules.py. Here: a SIGKILLed holder freed when its session expires
(session_timeout_ms; control: a live holder makes the waiter time out at
wait_ms, on_timeout applied), the waiter woken by the release and not by
polling, waiters in their queue's order, keys in znode names, a frozen
holder, creates given up or lost with their connection, a fork child
making a session of its own as it inherits none of
the library's threads, every refusal (78), and the command's check and
lock. A 3-member ensemble (support/zookeeper.py) whose leader is SIGKILLed
while 3 x 2 writers take one lock in turn: never two inside (an observer
log; control: the writers overlap without the shim), every call entered
or applied its policy, the run goes on and ends, and nothing is left
held; a release cut by its member frozen is sent again through another
member; and a waiter that gives up after a connection loss leaves no
znode. A session's expiry (the holder's connection black-holed by a
proxy) reports its lock lost at once, while its call runs (on_lost
"log", "kill"), and its release sends nothing (control: held past the
session timeout without expiry, nothing is lost). Metrics: concurrent
shipments of one host add up, the 1 MB limit, a znode not lockshim's.
Step 5: linger_ms, max_hold_ms with on_overrun, mode = "shared" and limit
(readers together, writers alone, a reader never passing an earlier
writer, the limit bounding the holders, mismatches, status of sets).
Step 7: a presumed expiry closes the old handle before the next session
(TSan saw the two race), a member killed and restarted within the
session timeout keeps its holder's lock, and permit waiters are woken one
at a time (the server's per-session request counts).
"""
import json
import os
import re
import signal
import subprocess
import time

import pytest

from support.process import cpu_ticks
from support.proxy import BLACK_HOLE, DROP_REPLIES, PASS, Proxy
from support import sets
from support.scenarios import limit_bounds_the_holders, limit_mismatch_refused, \
    refused_setting, scrape, val
from support.server import serving
from support.util import CLI, MULT, cc, lib_program, run, status_by_key, wait_for, write_config
from support.zookeeper import Ensemble, ZookeeperServer, skip_reason

pytestmark = pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")

BLOCK_LOCK = ('locks = ( { symbol = "block_call"; key = "blk"; wait_ms = %d; '
              'on_timeout = "skip"; } );\n')
SESSION_MS = 4000
BLK = "/lockshim/lockshim%3Ablk"  # the key lockshim:blk, encoded
# the lost-lease line (support/workers.py's LOST) of a session's expiry, on_lost "log"
LOST_LINE = re.compile(r"error: block_call: lease on lockshim:blk was lost \(its ZooKeeper "
                       r"session expired\); applying (\w+)")


@pytest.fixture(scope="module")
def zk():
    yield from serving(ZookeeperServer())


def zk_config(tmp_path, zk, body, extra=""):
    """A config of backend "zookeeper" on zk plus body; returns its path."""
    return write_config(tmp_path, None, 'backend = "zookeeper";\nzookeeper = { hosts = "%s"; '
                        'session_timeout_ms = %d; %s };\n%s' % (zk.hosts(), SESSION_MS, extra,
                                                                 body))


# ---- holders that die, waiters that wake ----------------------------------------

def test_killed_holder_frees_the_lock_at_its_session_timeout(bg, worker_progs, zk, tmp_path):
    """The holder's znode is ephemeral: SIGKILLed, its session expires after
    session_timeout_ms (4 s here) and the waiter, watching it, enters."""
    cfg = zk_config(tmp_path, zk, BLOCK_LOCK % 60000)
    holder = bg([worker_progs["block"]], cfg)
    holder.expect("enter")
    waiter = bg([worker_progs["block"]], cfg)
    wait_for(lambda: len(zk.children(BLK)) == 2, timeout=30, what="the waiter's znode")
    t0 = time.monotonic()
    holder.p.kill()
    waiter.expect("enter", timeout=SESSION_MS / 1000 + 20 * MULT)
    took = time.monotonic() - t0
    assert SESSION_MS / 1000 * 0.5 <= took < SESSION_MS / 1000 + 5 * MULT, took
    waiter.send()
    assert waiter.expect("call").startswith("call rc=42")
    assert waiter.wait() == 0  # its exit flushes its release (not killed before it)


def test_control_live_holder_makes_the_waiter_time_out(bg, worker_progs, zk, tmp_path):
    """wait_ms bounds the wait; on_timeout "skip" applies; the waiter's
    znode is deleted when it gives up."""
    cfg = zk_config(tmp_path, zk, BLOCK_LOCK % 1500)
    holder = bg([worker_progs["block"]], cfg)
    holder.expect("enter")
    t0 = time.monotonic()
    r = run([worker_progs["block"]], cfg)
    took = time.monotonic() - t0
    assert r.stdout.strip() == "call rc=-1 errno=16", (r.stdout, r.stderr)
    assert 1.4 <= took < 1.5 + 5 * MULT
    assert "after 1500 ms" in r.stderr, r.stderr
    assert len(zk.children(BLK)) == 1
    holder.send()
    holder.expect("call rc=42")
    assert holder.wait() == 0


@pytest.mark.timing
def test_waiter_is_woken_by_the_release_not_by_polling(bg, worker_progs, zk, tmp_path):
    """Over a 2 s wait the waiter (its threads: the program's and the
    library's two) spends (nearly) no CPU and its znode stays the same one;
    once the holder's call returns it enters at once."""
    cfg = zk_config(tmp_path, zk, BLOCK_LOCK % 60000)
    holder = bg([worker_progs["block"], "stay"], cfg)
    holder.expect("enter")
    waiter = bg([worker_progs["block"]], cfg)
    wait_for(lambda: len(zk.children(BLK)) == 2, timeout=30, what="the waiter's znode")
    queued = zk.children(BLK)
    before = cpu_ticks(waiter.p.pid)
    time.sleep(2)  # the span measured, not a synchronisation
    assert cpu_ticks(waiter.p.pid) - before <= 3
    assert zk.children(BLK) == queued  # one znode, not made again
    holder.send()
    holder.expect("call rc=42")
    t0 = time.monotonic()
    waiter.expect("enter", timeout=5)
    assert time.monotonic() - t0 < 1 * MULT
    waiter.send()
    waiter.expect("call rc=42")
    assert waiter.wait() == 0
    holder.send("bye")
    assert holder.wait() == 0


def test_waiters_enter_in_the_order_they_queued(bg, worker_progs, zk, tmp_path):
    """FIFO by znode creation (fair = true is honoured): three waiters, each
    started once the previous one's znode is there, enter one by one in
    that order, never one behind the others' backs."""
    cfg = zk_config(tmp_path, zk, 'locks = ( { symbol = "block_call"; key = "blk"; '
                    'wait_ms = 60000; fair = true; } );\n')
    holder = bg([worker_progs["block"]], cfg)
    holder.expect("enter")
    waiters = []
    for i in range(3):
        waiters.append(bg([worker_progs["block"]], cfg))
        wait_for(lambda: len(zk.children(BLK)) == i + 2, timeout=30, what="waiter %d" % i)
    holder.send()
    holder.expect("call rc=42")
    for i, w in enumerate(waiters):
        w.expect("enter", timeout=10)
        assert all(o.lines.empty() for o in waiters[i + 1:]), i
        w.send()
        w.expect("call rc=42")
        assert w.wait() == 0
    assert holder.wait() == 0


# ---- key znodes -----------------------------------------------------------------

@pytest.mark.parametrize("key,znode", [
    ("a/b c", "lockshim%3Aa%2Fb%20c"),
    ("..", "lockshim%3A%2E%2E"),
])
def test_keys_are_encoded_into_znode_names(zk, tmp_path, key, znode):
    cfg = zk_config(tmp_path, zk, "")
    flag = tmp_path / "in"
    p = subprocess.Popen([CLI, "lock", "-c", cfg, key, "--", "sh", "-c",
                          "touch %s; read line" % flag], stdin=subprocess.PIPE,
                         env=dict(os.environ, LD_PRELOAD=""), text=True)
    try:
        wait_for(flag.exists, what="the command inside the lock")
        assert len(zk.children("/lockshim/" + znode)) == 1
    finally:
        p.communicate("go\n", timeout=30)
    assert p.returncode == 0


def test_long_key_is_shortened_with_its_sha1(zk, tmp_path):
    """Past 200 encoded bytes: the first 150, "~" and the SHA-1 (hex) of the
    whole stored key; two long keys that differ only at their end stay
    apart."""
    cfg = zk_config(tmp_path, zk, "", 'root = "/long";')
    for last in "ab":
        r = run([CLI, "lock", "-c", cfg, "k" * 300 + last, "--", "true"], LD_PRELOAD="")
        assert r.returncode == 0, r.stderr
    names = [n for n in zk.children("/long") if n != ".metrics"]  # the command's counts
    assert len(names) == 2, names
    for n in names:
        assert re.fullmatch(r"lockshim%3Ak{139}~[0-9a-f]{40}", n), n


# ---- refusals -------------------------------------------------------------------

@pytest.mark.parametrize("setting", [
    "lease_ms = 5000", "retry_max_ms = 50",
    "break_dead_holders = false", "handoff_ms = 5",
])
@pytest.mark.parametrize("where", ["lock", "defaults"])
def test_refused_settings(zk, tmp_path, setting, where):
    refused_setting(lambda body: zk_config(tmp_path, zk, body), setting, where, "zookeeper")


@pytest.mark.parametrize("extra,refused", [
    ('method = "entry";', True),
    ('method = "entry"; object = "libc.so.6";', True),
    ('method = "entry"; object = "main";', False),
    ('method = "reloc";', False),
])
def test_entry_method_on_a_libc_function_is_refused(zk, tmp_path, extra, refused):
    """An entry patch of libc's poll would catch libzookeeper's own threads
    (outside the guard: the session could not connect, checked by hand);
    the program's own functions (object "main") and reloc are fine."""
    cfg = zk_config(tmp_path, zk, 'locks = ( { symbol = "poll"; key = "p"; %s } );\n' % extra)
    r = run([CLI, "check", "-c", cfg])
    if refused:
        assert r.returncode == 78 and "locks[0].method" in r.stderr and \
            'backend "zookeeper"' in r.stderr, r.stderr
    else:
        assert r.returncode == 0, r.stderr


def test_fair_is_accepted(zk, tmp_path):
    """The recipe is FIFO by creation: fair = true is honoured, not refused."""
    cfg = zk_config(tmp_path, zk, 'locks = ( { symbol = "rename"; key = "k"; fair = true; } );\n')
    r = run([CLI, "check", "-c", cfg])
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("root", ["lockshim", "/a/", "/a//b", "/a/../b"])
def test_bad_root_is_refused(zk, tmp_path, root):
    cfg = zk_config(tmp_path, zk, 'locks = ( { symbol = "rename"; key = "k"; } );\n',
                    'root = "%s";' % root)
    r = run([CLI, "check", "-c", cfg])
    assert r.returncode == 78 and "zookeeper.root" in r.stderr, r.stderr


# ---- the command ----------------------------------------------------------------

def test_check_probes_the_server(zk, tmp_path):
    cfg = zk_config(tmp_path, zk, 'locks = ( { symbol = "rename"; key = "k"; } );\n',
                    'root = "/ls/check";')
    r = run([CLI, "check", "-c", cfg])
    assert r.returncode == 0, r.stderr
    assert re.search(r"^zookeeper: ok \(.* at 127\.0\.0\.1:%d, session timeout \d+ ms, "
                     r"root /ls/check\)$" % zk.port, r.stdout, re.M), r.stdout
    assert zk.children("/ls/check") != []  # made as needed, nested


def test_check_reports_a_server_that_is_down(tmp_path):
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    cfg = write_config(tmp_path, None, 'backend = "zookeeper";\nzookeeper = { hosts = '
                       '"127.0.0.1:%d"; connect_timeout_ms = 500; };\n'
                       'locks = ( { symbol = "rename"; key = "k"; } );\n' % port)
    r = run([CLI, "check", "-c", cfg])
    assert r.returncode == 69 and "connect_timeout_ms" in r.stdout + r.stderr, (r.stdout,
                                                                               r.stderr)


def test_lock_command_holds_and_fences(zk, tmp_path):
    """LOCKSHIM_FENCE is the znode's czxid; while the command runs its
    znode is under the key; afterwards it is gone."""
    cfg = zk_config(tmp_path, zk, "")
    flag = tmp_path / "in"
    go = tmp_path / "go"
    p = __import__("subprocess").Popen(
        [CLI, "lock", "-c", cfg, "job", "--", "sh", "-c",
         "echo fence=$LOCKSHIM_FENCE; touch %s; while [ ! -e %s ]; do sleep 0.05; done"
         % (flag, go)], stdout=__import__("subprocess").PIPE, text=True,
        env=dict(os.environ, LD_PRELOAD=""))
    wait_for(flag.exists, what="the command inside the lock")
    assert len(zk.children("/lockshim/lockshim%3Ajob")) == 1
    go.touch()
    out, _ = p.communicate(timeout=30)
    assert p.returncode == 0
    assert int(out.split("=")[1]) > 0, out
    assert zk.children("/lockshim/lockshim%3Ajob") == []


@pytest.mark.parametrize("opts,says", [
    (["-l", "5000"], "-l: not available with backend \"zookeeper\""),
])
def test_lock_command_refuses_what_the_backend_cannot_honour(zk, tmp_path, opts, says):
    cfg = zk_config(tmp_path, zk, "")
    r = run([CLI, "lock", "-c", cfg] + opts + ["k", "--", "true"], LD_PRELOAD="")
    assert r.returncode == 78 and says in r.stderr, r.stderr


def test_frozen_holder_loses_the_lock_at_its_session_timeout(bg, worker_progs, zk, tmp_path):
    """A holder stopped (SIGSTOP) past session_timeout_ms: its session
    expires, its znode vanishes and the waiter enters; resumed, the holder
    says its session expired and reports its lock lost (on_lost "log"), once:
    its release sends nothing and says nothing more."""
    cfg = zk_config(tmp_path, zk, BLOCK_LOCK % 60000)
    holder = bg([worker_progs["block"]], cfg)
    holder.expect("enter")
    waiter = bg([worker_progs["block"]], cfg)
    wait_for(lambda: len(zk.children(BLK)) == 2, timeout=30, what="the waiter's znode")
    t0 = time.monotonic()
    os.kill(holder.p.pid, signal.SIGSTOP)
    try:
        waiter.expect("enter", timeout=SESSION_MS / 1000 + 20 * MULT)
        took = time.monotonic() - t0
    finally:
        os.kill(holder.p.pid, signal.SIGCONT)
    assert SESSION_MS / 1000 * 0.5 <= took < SESSION_MS / 1000 + 5 * MULT, took
    wait_for(lambda: "session expired" in holder.stderr(), what="the holder's expiry line")
    holder.send()
    assert holder.expect("call").startswith("call rc=42")
    assert holder.wait() == 0
    err = holder.stderr()
    assert "every lock of this process is lost" in err, err
    assert len(LOST_LINE.findall(err)) == 1, err
    assert "was gone at its release" not in err, err
    waiter.send()
    assert waiter.expect("call").startswith("call rc=42")
    assert waiter.wait() == 0
    assert zk.children(BLK) == []


FORK_LIB_C = r"""
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>
int lib_call(int x)
{
	return x;
}
/* A guarded call (the process's session made), then a fork whose child
 * makes a guarded call of its own, then one more in the parent. */
int fork_calls(void)
{
	int st;
	pid_t pid;

	if (lib_call(1) != 1)
		return 1;
	pid = fork();
	if (pid == 0)
		_exit(lib_call(7) == 7 ? 0 : 2);
	if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
		return 3;
	return lib_call(1) == 1 ? 0 : 4;
}
"""


def test_fork_child_makes_a_session_of_its_own(zk, tmp_path):
    """The parent's session is not the child's (its library threads are not
    there): the child's guarded call makes a new session, and its fence is
    a znode of its own; the parent goes on with its session."""
    prog = lib_program(tmp_path / "fork", "fk", FORK_LIB_C,
                       "int fork_calls(void);", "fork_calls()")
    cfg = zk_config(tmp_path, zk, 'locks = ( { symbol = "lib_call"; key = "fk"; '
                    'wait_ms = 10000; } );\n')
    r = run([prog], cfg, LOCKSHIM_LOG_LEVEL="debug", timeout=60)
    assert r.returncode == 0, r.stderr[-3000:]
    fences = [int(l.rsplit("fence ", 1)[1]) for l in r.stderr.splitlines() if " acquired " in l]
    assert len(fences) == 3 and len(set(fences)) == 3, r.stderr[-3000:]
    assert zk.children("/lockshim/lockshim%3Afk") == []


TWO_CALLS_LIB_C = r"""
#include <errno.h>
#include <stdio.h>
int lib_call(int x)
{
	return x;
}
/* A guarded call (the session made), a line, a second one (its rc said),
 * a line. */
int two_calls(void)
{
	char line[16];
	int rc;

	printf("one rc=%d\n", lib_call(1));
	fflush(stdout);
	if (!fgets(line, sizeof(line), stdin))
		return 1;
	errno = 0;
	rc = lib_call(2);
	printf("two rc=%d errno=%d\n", rc, errno);
	fflush(stdout);
	return fgets(line, sizeof(line), stdin) ? 0 : 1;
}
"""


@pytest.fixture
def own_zk():
    """A server of the test's own (it is frozen)."""
    s = ZookeeperServer()
    try:
        yield s.start()
    finally:
        if s.proc:
            os.kill(s.proc.pid, signal.SIGCONT)
        s.cleanup()


def test_create_given_up_is_deleted_when_its_reply_comes(bg, own_zk, tmp_path):
    """The server frozen (SIGSTOP) past command_timeout_ms: the call gives up
    (on_error "skip") while its creates are still in flight; resumed, the
    server makes them, and their late replies delete them: the key is free
    while the process (and its session) lives on."""
    zk = own_zk
    prog = lib_program(tmp_path / "two", "two", TWO_CALLS_LIB_C,
                       "int two_calls(void);", "two_calls()")
    cfg = write_config(tmp_path, None, 'backend = "zookeeper";\nzookeeper = { hosts = "%s"; '
                       'session_timeout_ms = 20000; command_timeout_ms = 300; };\n'
                       'locks = ( { symbol = "lib_call"; key = "frz"; wait_ms = 1000; '
                       'on_error = "skip"; errno = "EAGAIN"; } );\n' % zk.hosts())
    p = bg([prog], cfg)
    p.expect("one rc=1")
    os.kill(zk.proc.pid, signal.SIGSTOP)
    try:
        p.send()
        assert p.expect("two").startswith("two rc=-1 errno=11"), p.stderr()
    finally:
        os.kill(zk.proc.pid, signal.SIGCONT)
    wait_for(lambda: zk.children("/lockshim/lockshim%3Afrz") == [], timeout=30,
             what="the given-up creates deleted")
    assert p.p.poll() is None  # its session lives: only the deletes freed the key
    r = run([CLI, "lock", "-c", cfg, "frz", "--", "true"], LD_PRELOAD="")
    assert r.returncode == 0, r.stderr
    p.send()
    assert p.wait() == 0


def test_create_whose_connection_was_lost_is_swept(bg, own_zk, tmp_path):
    """The server's replies dropped (a proxy) while a call's creates go out:
    ZooKeeper makes the znodes, the client loses its connection (no reply
    for 2/3 of the session) and reconnects with the session alive. Each
    znode's name carries its token, so the client finds its own znodes once
    reconnected and deletes them: the key is free while the process (and its
    session) lives on."""
    zk = own_zk
    prog = lib_program(tmp_path / "two", "two", TWO_CALLS_LIB_C,
                       "int two_calls(void);", "two_calls()")
    with Proxy(zk.port) as px:
        cfg = write_config(tmp_path, None, 'backend = "zookeeper";\nzookeeper = { hosts = '
                           '"127.0.0.1:%d"; session_timeout_ms = 6000; command_timeout_ms = '
                           '500; };\nlocks = ( { symbol = "lib_call"; key = "frz"; wait_ms = '
                           '1000; on_error = "skip"; errno = "EAGAIN"; } );\n' % px.port)
        p = bg([prog], cfg)
        p.expect("one rc=1")
        px.set_mode(DROP_REPLIES)
        p.send()
        assert p.expect("two").startswith("two rc=-1 errno=11"), p.stderr()
        assert zk.children("/lockshim/lockshim%3Afrz") != []  # made, unanswered
        px.set_mode(PASS)
        wait_for(lambda: px.accepted >= 2, timeout=30, what="the client's reconnection")
        wait_for(lambda: zk.children("/lockshim/lockshim%3Afrz") == [], timeout=30,
                 what="the unanswered creates swept")
        assert p.p.poll() is None and "ZooKeeper session expired" not in p.stderr()
        r = run([CLI, "lock", "-c", cfg, "frz", "--", "true"], LD_PRELOAD="")
        assert r.returncode == 0, r.stderr
        p.send()
        assert p.wait() == 0


# ---- status: the key znodes and their lock znodes ---------------------------------

def test_status_lists_each_lock_with_its_holder_and_waiters(bg, worker_progs, zk, tmp_path):
    """Two locks ("blk": a holder and two waiters; "x/%y", its znode name
    escaped): each key once, decoded, its holder, its fence (the lowest lock
    znode's czxid), no lease (the session is the lease), the waiters in
    queue order; nothing once all are released."""
    cfg = zk_config(tmp_path, zk, 'locks = ( { symbol = "block_call"; key = "blk"; '
                    'wait_ms = 60000; } );\n')
    (tmp_path / "2").mkdir()
    cfg2 = zk_config(tmp_path / "2", zk, 'locks = ( { symbol = "block_call"; '
                     'key = "x/%y"; } );\n')
    holder = bg([worker_progs["block"]], cfg)
    holder.expect("enter")
    other = bg([worker_progs["block"]], cfg2)
    other.expect("enter")
    waiters = []
    for i in range(2):
        waiters.append(bg([worker_progs["block"]], cfg))
        wait_for(lambda: len(zk.children(BLK)) == i + 2, timeout=30, what="waiter %d" % i)
    got = status_by_key(cfg)
    assert sorted(got) == ["blk", "x/%y"], got
    blk = got["blk"]
    lowest = min(zk.children(BLK), key=lambda n: int(n.rsplit("-", 1)[1]))
    czxid = re.search(r"cZxid = (0x[0-9a-f]+)", zk.cli("stat", BLK + "/" + lowest)).group(1)
    assert blk["fence"] == int(czxid, 16), (blk, czxid)
    assert (blk["pid"], blk["lease_left_ms"], blk["limit"]) == (holder.p.pid, None, 1)
    assert [w["pid"] for w in blk["waiters"]] == [w.p.pid for w in waiters]
    assert got["x/%y"]["pid"] == other.p.pid and got["x/%y"]["waiters"] == []
    assert list(status_by_key(cfg, "x*")) == ["x/%y"]
    for p in [holder, other] + waiters:
        p.send()
        p.expect("call rc=42")
    assert status_by_key(cfg) == {}


def test_status_of_a_server_that_is_down_is_69(tmp_path):
    cfg = write_config(tmp_path, None, 'backend = "zookeeper";\nzookeeper = { hosts = '
                       '"127.0.0.1:1"; connect_timeout_ms = 500; };\n')
    r = run([CLI, "status", "-c", cfg])
    assert r.returncode == 69 and "ZooKeeper" in r.stderr, (r.returncode, r.stderr)


# ---- a 3-member ensemble whose leader is killed ---------------------------------

ENS_LOCK = ('locks = ( { symbol = "set_write"; key = "ens"; wait_ms = %d; '
            'on_timeout = "skip"; on_error = "skip"; return = -5; errno = "EAGAIN"; } );\n')
ENS_SESSION_MS = 10000  # longer than an election (under 1 s here): sessions survive it


@pytest.fixture
def ensemble():
    s = Ensemble()
    try:
        yield s.start()
    finally:
        s.cleanup()


def listed(ensemble, path):
    """path's children, from a member that answers."""
    names = []
    wait_for(lambda: names.append(ensemble.children(path)) or names[-1] is not None,
             what="a listing of " + path)
    return names[-1]


def ens_run(sets_prog, cfg, log, stop, during):
    """3 processes x 2 threads of set_write (20-60 ms each) on one key until
    stop exists; during() runs once every process made a call. Returns
    (calls that entered, calls that applied a policy, the joined stderr)."""
    ps = [sets.start(sets_prog, "w", cfg, log, 2, 1, 40, stop) for _ in range(3)]
    ok = failed = 0
    errs = ""
    try:
        try:
            for p in ps:
                assert p.stdout.readline().startswith("started")
            during()
        finally:
            open(stop, "w").close()
        for p in ps:
            out, err = p.communicate(timeout=60 * MULT)  # bounded: no call hangs
            assert p.returncode == 0, err[-3000:]
            done = [l for l in out.splitlines() if l.startswith("done")]
            assert done, (out, err[-3000:])
            fields = {k: int(v) for k, v in (f.split("=") for f in done[0].split()[1:])}
            ok += fields["ok"]
            failed += fields["failed"]
            errs += err
    finally:
        for p in ps:
            if p.poll() is None:
                p.kill()
                p.wait()
    return ok, failed, errs


@pytest.mark.timing
def test_control_writers_overlap_without_the_shim(sets_prog, tmp_path):
    log, stop = str(tmp_path / "log"), str(tmp_path / "stop")
    ok, failed, _ = ens_run(sets_prog, None, log, stop, lambda: time.sleep(1))
    assert failed == 0 and ok > 0
    assert sets.replay(log)[1] > 1  # two writers inside at once


@pytest.mark.timing
def test_leader_killed_mid_run_keeps_exclusion(sets_prog, ensemble, tmp_path):
    """hosts = the 3 members; the leader SIGKILLed while 3 x 2 writers take
    the lock in turn: never two inside at once; every call either entered
    or applied its policy (one line each); the run goes on under the new
    leader and ends; afterwards a fresh call takes the lock at once (no
    znode left behind by a request the election cut)."""
    log, stop = str(tmp_path / "log"), str(tmp_path / "stop")
    cfg = write_config(tmp_path, None, 'backend = "zookeeper";\nzookeeper = { hosts = "%s"; '
                       'session_timeout_ms = %d; command_timeout_ms = 3000; };\n%s'
                       % (ensemble.hosts(), ENS_SESSION_MS, ENS_LOCK % 20000))
    killed = []

    def kill_the_leader():
        wait_for(lambda: open(log).read().count("w+") >= 10, what="calls before the kill")
        leader = ensemble.leader()
        assert leader is not None
        ensemble.kill(leader)
        killed.append(len(open(log).read()))
        wait_for(lambda: ensemble.leader() is not None, timeout=30, what="a new leader")
        # the writers go on under the new leader
        wait_for(lambda: open(log).read()[killed[0]:].count("w+") >= 10, timeout=30,
                 what="calls after the kill")
    t0 = time.monotonic()
    ok, failed, err = ens_run(sets_prog, cfg, log, stop, kill_the_leader)
    assert time.monotonic() - t0 < 60 * MULT
    most_r, most_w, mixed = sets.replay(log)
    assert most_w == 1 and not mixed, err[-3000:]
    assert open(log).read().count("w+") == ok  # a failed call never entered
    policy = [l for l in err.splitlines() if " not taken" in l or " still held by " in l]
    assert len(policy) == failed, (failed, err[-3000:])
    assert "session expired" not in err, err[-3000:]
    # nothing left held: a first try (wait_ms = 0) gets the lock at once
    (tmp_path / "after").mkdir()
    cfg0 = write_config(tmp_path / "after", None, 'backend = "zookeeper";\nzookeeper = { '
                        'hosts = "%s"; };\n%s' % (ensemble.hosts(), ENS_LOCK % 0))
    fields, err0 = sets.finish(sets.start(sets_prog, "w", cfg0, str(tmp_path / "log0"), 1, 1,
                                          0))
    assert fields["ok"] == 1, err0
    assert listed(ensemble, "/lockshim/lockshim%3Aens") == []


def connected_member(ensemble, pid):
    """The member pid has a TCP connection to (its sockets' inodes looked
    up in /proc/net/tcp), or None."""
    inodes = set()
    for fd in os.listdir("/proc/%d/fd" % pid):
        try:
            link = os.readlink("/proc/%d/fd/%s" % (pid, fd))
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    with open("/proc/%d/net/tcp" % pid) as f:
        ports = {int(l.split()[2].split(":")[1], 16) for l in f.readlines()[1:]
                 if l.split()[9] in inodes and l.split()[3] == "01"}  # ESTABLISHED
    return next((m for m in ensemble.members if m.port in ports), None)


def test_release_cut_by_a_frozen_member_is_sent_again(bg, worker_progs, ensemble, tmp_path):
    """A holder's member frozen (SIGSTOP) just before its release: the
    delete sits unread in that member's socket; the client declares the
    connection lost (2/3 of the session), reconnects to another member
    with its session, and sends the delete again: the key is free while
    the holder, and its session, live on (without the resend, its znode
    stayed with the live session)."""
    cfg = write_config(tmp_path, None, 'backend = "zookeeper";\nzookeeper = { hosts = "%s"; '
                       'session_timeout_ms = %d; };\n%s'
                       % (ensemble.hosts(), ENS_SESSION_MS, BLOCK_LOCK % 60000))
    holder = bg([worker_progs["block"], "stay"], cfg)
    holder.expect("enter")
    member = wait_for(lambda: connected_member(ensemble, holder.p.pid),
                      what="the holder's member")
    assert len(listed(ensemble, BLK)) == 1
    os.kill(member.proc.pid, signal.SIGSTOP)
    try:
        holder.send()
        holder.expect("call rc=42")
        wait_for(lambda: ensemble.children(BLK, but=member) == [],
                 timeout=ENS_SESSION_MS / 1000 + 20, what="the release sent again")
        assert holder.p.poll() is None and "session expired" not in holder.stderr(), \
            holder.stderr()
    finally:
        os.kill(member.proc.pid, signal.SIGCONT)
    holder.send("bye")
    assert holder.wait() == 0


def proxied_waiter(bg, worker_progs, zk, tmp_path, px, wait_ms, more):
    """A holder of "blk" on a session of its own (direct), inside its call,
    and a waiter whose session goes through px (wait_ms; zookeeper
    settings more, command_timeout_ms 500), once its znode is queued.
    Returns (holder, waiter)."""
    d = tmp_path / "direct"
    d.mkdir()
    body = ('locks = ( { symbol = "block_call"; key = "blk"; wait_ms = %d; '
            'on_timeout = "skip"; on_error = "skip"; } );\n' % wait_ms)
    holder = bg([worker_progs["block"], "stay"], zk_config(d, zk, body))
    holder.expect("enter")
    cfg = write_config(tmp_path, None, 'backend = "zookeeper";\nzookeeper = { hosts = '
                       '"127.0.0.1:%d"; command_timeout_ms = 500; %s };\n%s'
                       % (px.port, more, body))
    waiter = bg([worker_progs["block"], "stay"], cfg)
    wait_for(lambda: len(zk.children(BLK)) == 2, timeout=30, what="the waiter's znode")
    return holder, waiter


def reopen(px):
    """Lets px pass again and closes every connection it made so far, so
    that the client's attempt whose bytes were dropped fails at once and
    its next one goes through."""
    import socket

    px.set_mode(PASS)
    with px._lock:
        socks = list(px._socks)
    for s in socks:
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def test_waiter_that_gives_up_after_a_connection_loss_leaves_no_znode(bg, worker_progs, own_zk,
                                                                     tmp_path):
    """A waiter whose connection is lost while it waits (a proxy drops the
    server's replies until the client gives the connection up) and whose
    wait_ms then runs out: lock.c, having seen an error, does not leave;
    the module deletes the znode at the waiter's deadline itself, so the
    holder's release frees the key while the waiter (and its session) lives
    on. Without that, the waiter's znode stayed with its live session."""
    zk = own_zk
    with Proxy(zk.port) as px:
        holder, waiter = proxied_waiter(bg, worker_progs, zk, tmp_path, px, 9000,
                                        "session_timeout_ms = 6000;")
        px.set_mode(DROP_REPLIES)
        wait_for(lambda: px.accepted >= 2, timeout=30, what="the client's reconnection")
        reopen(px)  # the session answers again well before it would be presumed expired
        assert waiter.expect("call", timeout=30).startswith("call rc=-1"), waiter.stderr()
        wait_for(lambda: len(zk.children(BLK)) == 1, timeout=10,
                 what="the waiter's znode deleted")
        err = waiter.stderr()
        assert waiter.p.poll() is None and "session expired" not in err and \
            "presumed expired" not in err, err
        holder.send()
        holder.expect("call rc=42")
        wait_for(lambda: zk.children(BLK) == [], timeout=10, what="the key free")
        waiter.send("bye")
        assert waiter.wait() == 0
    holder.send("bye")
    assert holder.wait() == 0


# ---- on_lost: a session's expiry loses every lock of the process ------------------

def expiring_holder(bg, worker_progs, zk, tmp_path, px, on_lost, session_ms=SESSION_MS,
                    wait_ms=60000, more=""):
    """A holder whose session goes through px (on_lost, session_timeout_ms,
    wait_ms and zookeeper settings more as given) inside its call, and a
    waiter of a session of its own (direct) queued behind it. Returns
    (holder, waiter, the waiter's znode name)."""
    body = ('locks = ( { symbol = "block_call"; key = "blk"; wait_ms = %d; '
            'on_timeout = "skip"; %s } );\n' % (wait_ms, on_lost))
    d = tmp_path / "direct"
    d.mkdir()
    cfg = write_config(tmp_path, None, 'backend = "zookeeper";\nzookeeper = { hosts = '
                       '"127.0.0.1:%d"; session_timeout_ms = %d; %s };\n%s'
                       % (px.port, session_ms, more, body))
    holder = bg([worker_progs["block"]], cfg)
    holder.expect("enter")
    mine = zk.children(BLK)
    assert len(mine) == 1, mine
    waiter = bg([worker_progs["block"]], zk_config(d, zk, body))
    wait_for(lambda: len(zk.children(BLK)) == 2, timeout=30, what="the waiter's znode")
    theirs = [n for n in zk.children(BLK) if n not in mine]
    return holder, waiter, theirs[0]


def expire_through(px, waiter, what):
    """Black-holes px until the server has expired the holder's session
    (the waiter enters: the holder's znode is gone), then lets it through,
    so that the holder's client reconnects and hears of the expiry."""
    t0 = time.monotonic()
    px.set_mode(BLACK_HOLE)
    try:
        waiter.expect("enter", timeout=SESSION_MS / 1000 + 20 * MULT)
        took = time.monotonic() - t0
    finally:
        px.set_mode(PASS)
    assert SESSION_MS / 1000 * 0.5 <= took < SESSION_MS / 1000 + 10 * MULT, (what, took)


def test_session_expiry_reports_each_lock_lost_while_its_call_runs(bg, worker_progs, zk,
                                                                   tmp_path):
    """The holder's connection black-holed (a proxy) past session_timeout_ms:
    the server ends its session, the waiter (another session) enters; the
    proxy passing again, the holder's client hears of the expiry and the
    holder reports its lock lost at once (on_lost "log": the lost-lease
    line), while its call still runs. Its release then sends nothing: the
    waiter's znode, the only one, is untouched."""
    with Proxy(zk.port) as px:
        holder, waiter, theirs = expiring_holder(bg, worker_progs, zk, tmp_path, px, "")
        expire_through(px, waiter, "log")
        wait_for(lambda: LOST_LINE.search(holder.stderr()), timeout=30 * MULT,
                 what="the holder's lost-lease line")
        assert holder.p.poll() is None  # inside its call still: no "call" line yet
        assert LOST_LINE.search(holder.stderr()).group(1) == "log"
        holder.send()
        assert holder.expect("call").startswith("call rc=42")
        assert holder.wait() == 0
        err = holder.stderr()
        assert len(LOST_LINE.findall(err)) == 1, err
        assert "was gone at its release" not in err, err
        assert zk.children(BLK) == [theirs]  # no double release
        waiter.send()
        assert waiter.expect("call").startswith("call rc=42")
        assert waiter.wait() == 0
        assert zk.children(BLK) == []


def test_session_expiry_applies_on_lost_kill(bg, worker_progs, zk, tmp_path):
    """The same expiry under on_lost = "kill" (kill_signal SIGUSR1): the
    holder dies by its signal inside its call, and the waiter's znode is
    untouched by its death."""
    with Proxy(zk.port) as px:
        holder, waiter, theirs = expiring_holder(bg, worker_progs, zk, tmp_path, px,
                                                 'on_lost = "kill"; kill_signal = "SIGUSR1";')
        expire_through(px, waiter, "kill")
        assert holder.wait(timeout=30 * MULT) == -signal.SIGUSR1, holder.stderr()
        m = LOST_LINE.search(holder.stderr())
        assert m and m.group(1) == "kill", holder.stderr()
        assert zk.children(BLK) == [theirs]
        waiter.send()
        assert waiter.expect("call").startswith("call rc=42")
        assert waiter.wait() == 0
        assert zk.children(BLK) == []


def test_control_held_past_the_session_timeout_without_expiry_is_not_lost(bg, worker_progs,
                                                                          zk, tmp_path):
    """Control: the same holder through the proxy, never cut, holds longer
    than session_timeout_ms (the library heartbeats): on_lost "kill" never
    fires, the waiter times out at wait_ms, and the holder's call ends."""
    body = ('locks = ( { symbol = "block_call"; key = "blk"; wait_ms = %d; '
            'on_timeout = "skip"; on_lost = "kill"; kill_signal = "SIGUSR1"; } );\n'
            % (SESSION_MS * 3 // 2))
    d = tmp_path / "direct"
    d.mkdir()
    with Proxy(zk.port) as px:
        cfg = write_config(tmp_path, None, 'backend = "zookeeper";\nzookeeper = { hosts = '
                           '"127.0.0.1:%d"; session_timeout_ms = %d; };\n%s'
                           % (px.port, SESSION_MS, body))
        holder = bg([worker_progs["block"]], cfg)
        holder.expect("enter")
        waiter = bg([worker_progs["block"]], zk_config(d, zk, body))
        assert waiter.expect("call", timeout=SESSION_MS / 1000 + 20 * MULT) \
            .startswith("call rc=-1"), waiter.stderr()
        assert waiter.wait() == 0
        assert holder.p.poll() is None and "lease on" not in holder.stderr(), holder.stderr()
        holder.send()
        assert holder.expect("call").startswith("call rc=42")
        assert holder.wait() == 0
        assert "lease on" not in holder.stderr() and "session expired" not in holder.stderr()
        assert zk.children(BLK) == []


def test_lock_command_whose_session_expires_stops_its_command_and_exits_75(bg, worker_progs,
                                                                          zk, tmp_path):
    """lockshim lock through the black-holed proxy: once its session has
    expired (a waiter of another session enters) and the proxy passes
    again, it says the lease is lost, stops the command's group and exits
    75, as for a Redis lease lost; the waiter's znode is untouched."""
    body = ('locks = ( { symbol = "block_call"; key = "blk"; wait_ms = 60000; '
            'on_timeout = "skip"; } );\n')
    d = tmp_path / "direct"
    d.mkdir()
    flag = tmp_path / "in"
    with Proxy(zk.port) as px:
        cfg = write_config(tmp_path, None, 'backend = "zookeeper";\nzookeeper = { hosts = '
                           '"127.0.0.1:%d"; session_timeout_ms = %d; };\n%s'
                           % (px.port, SESSION_MS, body))
        p = subprocess.Popen([CLI, "lock", "-c", cfg, "blk", "--", "sh", "-c",
                              "touch %s; exec sleep 120" % flag], stderr=subprocess.PIPE,
                             text=True, env=dict(os.environ, LD_PRELOAD=""))
        try:
            wait_for(flag.exists, what="the command inside the lock")
            mine = zk.children(BLK)
            waiter = bg([worker_progs["block"]], zk_config(d, zk, body))
            wait_for(lambda: len(zk.children(BLK)) == 2, timeout=30, what="the waiter's znode")
            theirs = [n for n in zk.children(BLK) if n not in mine][0]
            expire_through(px, waiter, "lock")
            _, err = p.communicate(timeout=30 * MULT)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        assert p.returncode == 75, err
        assert "lease on lockshim:blk was lost (its ZooKeeper session expired)" in err, err
        assert zk.children(BLK) == [theirs]
        waiter.send()
        assert waiter.expect("call").startswith("call rc=42")
        assert waiter.wait() == 0


# ---- metrics: one persistent znode per host under <root>/.metrics ----------------

METRICS_LOCK = 'locks = ( { symbol = "hold_call"; key = "f"; wait_ms = 60000; } );\n'
METRICS_DIR = "/ship/.metrics"  # the test's root alone: other tests' hosts ship too
SHIP_PROCS, SHIP_CALLS, SHIP_ROUNDS = 4, 20, 3
SHIP_DELAY = 0.2  # s, each reply of the server to the shipping processes


def test_concurrent_shipments_of_one_host_add_up_exactly(progs, procs, zk, tmp_path):
    """SHIP_ROUNDS x SHIP_PROCS processes of one host (LOCKSHIM_TEST_HOST),
    through a proxy, make SHIP_CALLS guarded calls each, then exit together
    (let go through their stdin) once the proxy holds each reply SHIP_DELAY:
    their shipments at exit (a read, then a write at the version read) all
    read the same version before any writes, so all but one are refused
    and read again, every round. The counts add up exactly (checked to
    fail with the write at any version: the plan file); one znode for the
    host; `lockshim status` lists the lock alone, never the metrics znode."""
    with Proxy(zk.port) as px:
        cfg = write_config(tmp_path, None, 'backend = "zookeeper";\nzookeeper = { hosts = '
                           '"127.0.0.1:%d"; session_timeout_ms = %d; root = "/ship"; '
                           'command_timeout_ms = 30000; };\n%s'
                           % (px.port, SESSION_MS, METRICS_LOCK))
        for _ in range(SHIP_ROUNDS):
            px.reply_delay = 0.0
            ps = [procs([progs["driver"]] + ["call:0"] * SHIP_CALLS + ["stdin"], cfg,
                        LOCKSHIM_TEST_HOST="same") for _ in range(SHIP_PROCS)]
            for p in ps:
                for _ in range(SHIP_CALLS):
                    assert p.expect("call") == "call rc=42 errno=0"
            px.reply_delay = SHIP_DELAY
            for p in ps:
                p.send()
            for p in ps:
                rc, _, err = p.finish()
                assert rc == 0 and "counts not sent" not in err, err
        px.reply_delay = 0.0
        m = scrape(cfg)
    total = SHIP_ROUNDS * SHIP_PROCS * SHIP_CALLS
    assert val(m, "lockshim_calls_total", "hold_call", "same") == total
    assert sum(v for (name, labels), v in m.items() if name == "lockshim_acquired_total" and
               ("host", "same") in labels) == total  # fast or waited: they contend
    assert val(m, "lockshim_hold_seconds_count", "hold_call", "same") == total
    assert zk.children(METRICS_DIR) == ["lockshim%3Ametrics%3A%7Bsame%7D"]
    (tmp_path / "direct").mkdir()
    cfg = zk_config(tmp_path / "direct", zk, METRICS_LOCK, 'root = "/ship";')
    assert status_by_key(cfg) == {}
    holder = procs([progs["driver"], "call:60000"], cfg, LOCKSHIM_TEST_HOST="same")
    assert holder.expect("enter") == "enter 60000"
    assert list(status_by_key(cfg)) == ["f"]
    r = run([CLI, "status", "-c", cfg])
    assert r.returncode == 0 and "metrics" not in r.stdout, (r.stdout, r.stderr)


# writes a metrics znode in the module's format (backend/zookeeper/zookeeper.c's
# header) whose one field is argv[4] bytes long: a host's counts near the 1 MB limit
BIG_NODE_C = r'''
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zookeeper.h>

static void watch(zhandle_t *zh, int type, int state, const char *path, void *ctx)
{
	(void)zh; (void)type; (void)state; (void)path; (void)ctx;
}

int main(int argc, char **argv)
{
	const char *key = argv[3];
	size_t flen = (size_t)atol(argv[4]), cap = flen + strlen(key) + 100, n;
	char *d = malloc(cap);
	zhandle_t *zh;

	zoo_set_debug_level(ZOO_LOG_LEVEL_ERROR);
	zh = zookeeper_init(argv[1], watch, 10000, NULL, NULL, 0);
	for (int i = 0; i < 100 && zoo_state(zh) != ZOO_CONNECTED_STATE; i++)
		usleep(100000);
	n = (size_t)snprintf(d, cap, "lockshim-metrics 1\n%zu\n%s\n%zu 1\n", strlen(key), key,
			     flen);
	memset(d + n, 'x', flen);
	d[n + flen] = '\n';
	printf("%s\n", zerror(zoo_set(zh, argv[2], d, (int)(n + flen + 1), -1)));
	zookeeper_close(zh);
	return 0;
}
'''


def metrics_stat(zk, path):
    """(dataVersion, dataLength) of the znode path."""
    st = zk.cli("stat", path)
    return (re.search(r"dataVersion = (\d+)", st).group(1),
            re.search(r"dataLength = (\d+)", st).group(1))


def test_metrics_znode_past_its_limit_or_not_ours_is_left_as_it_is(progs, zk, tmp_path):
    """A host's znode grown near 1 MB (ZooKeeper drops the connection of a
    request past jute.maxbuffer, 1 MB less a byte): the shipment that would
    pass 1000000 bytes is refused with its reason and the znode is left as
    it was (same version, same length); data that is not lockshim's counts
    is left as it is too, and `lockshim metrics` names it. Control: the
    same host's first shipment, before the znode grew, is kept."""
    src = tmp_path / "big.c"
    src.write_text(BIG_NODE_C)
    big = cc(str(tmp_path / "big"), [str(src)], "-O2", "-I/usr/include/zookeeper",
             "-lzookeeper_mt")
    cfg = zk_config(tmp_path, zk, 'log_level = "info";\n' + METRICS_LOCK, 'root = "/big";')
    node = "/big/.metrics/lockshim%3Ametrics%3A%7Bbig%7D"
    r = run([progs["driver"], "call:0"], cfg, LOCKSHIM_TEST_HOST="big")
    assert r.returncode == 0 and "counts not sent" not in r.stderr, r.stderr
    assert val(scrape(cfg), "lockshim_calls_total", "hold_call", "big") == 1
    out = subprocess.run([big, zk.hosts(), node, "lockshim:metrics:{big}", "999900"],
                         capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "ok", (out.stdout, out.stderr)
    before = metrics_stat(zk, node)
    assert int(before[1]) > 999900, before
    r = run([progs["driver"], "call:0"], cfg, LOCKSHIM_TEST_HOST="big")
    assert r.returncode == 0, r.stderr
    assert re.search(r"exit: counts not sent \(kept for the next shipment\): metrics znode "
                     r"\S+ would hold 1\d{6} bytes, past the 1000000 a znode may hold", r.stderr), \
        r.stderr
    assert metrics_stat(zk, node) == before
    (tmp_path / "junk").mkdir()
    cfg = zk_config(tmp_path / "junk", zk, 'log_level = "info";\n' + METRICS_LOCK,
                    'root = "/junk";')
    node = "/junk/.metrics/lockshim%3Ametrics%3A%7Bj%7D"
    for path in ("/junk", "/junk/.metrics"):
        zk.cli("create", path)
    zk.cli("create", node, "hello")
    r = run([progs["driver"], "call:0"], cfg, LOCKSHIM_TEST_HOST="j")
    assert r.returncode == 0, r.stderr
    assert "metrics znode %s holds no counts of lockshim's (left as it is)" % node in r.stderr, \
        r.stderr
    assert "hello" in zk.cli("get", node).splitlines()
    r = run([CLI, "metrics", "-c", cfg])
    assert r.returncode != 0 and "holds no counts of lockshim's" in r.stderr, (r.returncode,
                                                                               r.stderr)


# ---- limit and shared (Z5) ------------------------------------------------------
# Step 5 (b23-zk5): linger_ms, max_hold_ms with on_overrun (the shim's renewal
# thread keeps and releases a leaseless lock, as for the local backend), then
# mode = "shared" and limit = N.

HOLD_ZK = 'locks = ( { symbol = "hold_call"; key = "%s"; wait_ms = 30000; %s } );\n'
OVERRUN_SAID = "hold_call: lease on lockshim:%s exceeded max_hold_ms; renewal stopped; applying "


def hold_dir(key):
    return "/lockshim/lockshim%3A" + key


def cversion(zk, path):
    """path's cversion: how many times its children changed (each create
    and each delete of a lock znode counts one)."""
    m = re.search(r"cversion = (\d+)", zk.cli("stat", path))
    assert m, path
    return int(m.group(1))


def plain_config(tmp_path, zk, key):
    """A config of lock hold_call on key without max_hold_ms or linger_ms
    (a waiter's, in its own directory)."""
    d = tmp_path / "plain"
    d.mkdir(exist_ok=True)
    return zk_config(d, zk, HOLD_ZK % (key, ""))


def driver_enters(bg, progs, cfg, holder, after):
    """Starts a second driver of cfg's lock once holder printed `after`;
    returns the waiter and the seconds from then until it entered."""
    holder.expect(after)
    t0 = time.monotonic()
    waiter = bg([progs["driver"], "call:0"], cfg)
    waiter.expect("enter", timeout=30 * MULT)
    return waiter, time.monotonic() - t0


@pytest.mark.parametrize("setting", [
    "linger_ms = 10", "max_hold_ms = 100", 'max_hold_ms = 100; on_overrun = "log"',
    'max_hold_ms = 100; on_overrun = "kill"', 'max_hold_ms = 100; on_overrun = "abort"'])
def test_linger_max_hold_and_on_overrun_are_accepted(zk, tmp_path, setting):
    cfg = zk_config(tmp_path, zk, HOLD_ZK % ("acc", setting))
    r = run([CLI, "check", "-c", cfg])
    assert r.returncode == 0, r.stderr


@pytest.mark.timing
@pytest.mark.parametrize("linger", [3000, 0], ids=["linger", "control-no-linger"])
def test_linger_keeps_the_znode_until_linger_ms_after_the_last_call(bg, progs, zk, tmp_path,
                                                                   linger):
    """The holder's only call returns and its program lives on: its znode
    stays (kept), and a waiter in another process enters linger_ms (3 s)
    later, when the holder's renewal thread deletes it. Control linger_ms =
    0: the znode is gone when the call returns; the waiter enters at once."""
    key = "linger%d" % linger
    cfg = zk_config(tmp_path, zk, HOLD_ZK % (key, "linger_ms = %d;" % linger))
    holder = bg([progs["driver"], "call:0", "stdin"], cfg)
    holder.expect("call rc=42")
    t0 = time.monotonic()
    assert len(zk.children(hold_dir(key))) == (1 if linger else 0)
    waiter = bg([progs["driver"], "call:0"], cfg)
    waiter.expect("enter", timeout=30 * MULT)
    entered = time.monotonic() - t0
    if linger:
        assert 2.5 <= entered < 3.0 + 3.0 * MULT, entered
    else:
        assert entered < 3.0 * MULT, entered  # the listing (a JVM) takes about 1 s
    assert holder.p.poll() is None and waiter.wait() == 0
    holder.send()
    assert holder.wait() == 0


@pytest.mark.parametrize("linger,changes", [(60000, 2), (0, 2 * 40)],
                         ids=["linger", "control-no-linger"])
def test_linger_takes_the_znode_once_for_many_calls(progs, zk, tmp_path, linger, changes):
    """40 calls in a row with linger_ms: one create and one delete (at
    exit) under the key (its cversion); control linger_ms = 0: a create and
    a delete per call."""
    key = "many%d" % linger
    cfg = zk_config(tmp_path, zk, HOLD_ZK % (key, "linger_ms = %d;" % linger))
    r = run([progs["driver"]] + ["call:0"] * 40, cfg)
    assert r.returncode == 0 and r.stdout.count("call rc=42") == 40, r.stderr
    assert cversion(zk, hold_dir(key)) == changes
    assert zk.children(hold_dir(key)) == []


@pytest.mark.timing
@pytest.mark.parametrize("max_hold", [300, None], ids=["max_hold", "control-none"])
def test_overrun_log_deletes_the_znode_at_the_deadline(bg, progs, zk, tmp_path, max_hold):
    """on_overrun "log" (what a Redis lock does when its renewal stops and
    it expires): at max_hold_ms the holder's renewal thread deletes its
    znode, so a waiter enters while the 4 s call runs on; the call's own
    release then finds nothing and says nothing of a lost lock. Control
    without max_hold_ms: the waiter enters when the call returns."""
    key = "over%s" % max_hold
    cfg = zk_config(tmp_path, zk, HOLD_ZK % (key, "max_hold_ms = %d;" % max_hold
                                             if max_hold else ""))
    holder = bg([progs["driver"], "call:4000"], cfg)
    waiter, entered = driver_enters(bg, progs, plain_config(tmp_path, zk, key), holder, "enter")
    if max_hold:
        assert entered < 3.0 and holder.p.poll() is None, entered  # the call runs on
    else:
        assert entered >= 2.0, entered
    holder.expect("call rc=42")
    assert holder.wait() == 0 and waiter.wait() == 0
    err = holder.stderr()
    assert (OVERRUN_SAID % key + "log" in err) == bool(max_hold), err
    assert "lost" not in err and "gone" not in err, err
    assert zk.children(hold_dir(key)) == []


@pytest.mark.timing
def test_overrun_kill_kills_and_the_znode_goes_with_the_session(bg, progs, zk, tmp_path):
    """on_overrun "kill" at max_hold_ms (300): the holder dies by SIGTERM
    inside its 20 s call; its znode stays until its session expires (a
    kill keeps the lock until death, and ZooKeeper frees it at the session
    timeout), then the waiter enters. (The control is the "log" case
    above: there the waiter enters at the deadline, the holder alive.)"""
    cfg = zk_config(tmp_path, zk, HOLD_ZK % ("kill", 'max_hold_ms = 300; on_overrun = "kill";'))
    holder = bg([progs["driver"], "call:20000"], cfg)
    waiter, entered = driver_enters(bg, progs, plain_config(tmp_path, zk, "kill"), holder,
                                    "enter")
    assert holder.wait() == -signal.SIGTERM
    assert OVERRUN_SAID % "kill" + "kill" in holder.stderr(), holder.stderr()
    assert entered < SESSION_MS / 1000 + 10 * MULT, entered
    assert waiter.wait() == 0


# Holder sets (mode = "shared", limit = N): the holder's mode is in its
# znode's name (its mark ends "r" shared, "p<limit>" a permit). The observed
# program is support/sets.py's (each guarded call appends "r+"/"w+" when it
# starts, "r-"/"w-" when it ends; replay counts who was inside at once).
# Each test has a root of its own (the sets' key is "k").

def set_lock(symbol, settings):
    return '{ symbol = "%s"; key = "k"; wait_ms = 30000; %s }' % (symbol, settings)


RW_ZK = "locks = ( %s, %s );\n" % (set_lock("set_read", 'mode = "shared";'),
                                   set_lock("set_write", ""))
MODE_ZK = 'locks = ( { symbol = "hold_call"; key = "k"; wait_ms = 20000; %s } );\n'


def zk_set_config(tmp_path, zk, name, root, body):
    """zk_config in tmp_path's subdirectory name, under root."""
    d = tmp_path / name
    d.mkdir(exist_ok=True)
    return zk_config(d, zk, body, 'root = "%s";' % root)


@pytest.mark.timing
@pytest.mark.parametrize("guarded", [True, False], ids=["shared", "control-unguarded"])
def test_shared_readers_overlap_writers_alone(sets_prog, zk, tmp_path, guarded):
    """4 reader processes x 2 threads (40 ms calls), 2 writers (20 ms): the
    readers are inside together (more than one at once), a writer always
    alone, every call entered, no error. Control: unguarded, a writer is
    inside beside others."""
    log = str(tmp_path / "log")
    cfg = zk_set_config(tmp_path, zk, "c", "/rw", RW_ZK) if guarded else None
    sets.readers_overlap_writers_alone(sets_prog, cfg, log)


@pytest.mark.timing
def test_reader_never_passes_an_earlier_writer(sets_prog, zk, tmp_path):
    """Readers (4 processes x 2 threads, 100 ms calls) keep the key held
    without a gap between the marks x and y (the control: a writer waiting
    for a free key would wait for the whole stream); a writer arriving
    meanwhile enters within 2 s (a reader whose znode comes after the
    writer's waits for it), alone, and the readers go on after."""
    log = str(tmp_path / "log")
    cfg = zk_set_config(tmp_path, zk, "c", "/starve", RW_ZK)
    sets.writer_behind_readers(sets_prog, cfg, log, str(tmp_path / "stop"), 2000)
    assert sets.replay(log)[1:] == (1, False)


@pytest.mark.timing
@pytest.mark.parametrize("limit,most", [(3, 3), (None, 1), ("control", None)],
                         ids=["limit3", "default", "control-unguarded"])
def test_limit_bounds_the_holders(sets_prog, zk, tmp_path, limit, most):
    """8 processes x 2 threads (30 ms calls): limit 3 lets never more than 3
    in, and 3 are reached; no limit, one at a time. Control: unguarded,
    more than 3."""
    extra = "limit = %d;" % limit if limit != "control" and limit else ""
    cfg = None if limit == "control" else zk_set_config(
        tmp_path, zk, "c", "/lim%s" % limit, "locks = ( %s );\n" % set_lock("set_read", extra))
    limit_bounds_the_holders(sets_prog, cfg, str(tmp_path / "log"), most)


def test_limit_mismatch_is_an_error_at_once(progs, procs, zk, tmp_path):
    """A holder took the key with limit = 3; callers with limit 2, with no
    limit (1) and shared (1) get one error line naming both numbers and
    on_error at once (well before wait_ms), and leave no znode behind.
    Control: limit 3 enters beside the holder."""
    def one_znode():
        assert len(zk.children("/mism/lockshim%3Ak")) == 1

    holder = limit_mismatch_refused(progs, procs, lambda setting, name: zk_set_config(
        tmp_path, zk, name, "/mism", MODE_ZK % setting), one_znode, hold_ms=15000)
    assert holder.finish()[0] == 0
    assert zk.children("/mism/lockshim%3Ak") == []


def test_exclusive_holder_mismatches_a_semaphore_and_waits_shared(progs, procs, zk, tmp_path):
    """A plain lock (limit 1) held for 3 s: a limit = 3 caller gets the
    mismatch at once; a shared caller waits instead (its znode queued
    behind the holder's), and enters once the holder is gone."""
    holder = procs([progs["driver"], "call:3000"],
                   zk_set_config(tmp_path, zk, "x", "/xs", MODE_ZK % ""))
    holder.expect("enter")
    t0 = time.monotonic()
    r = run([progs["driver"], "call:0"], zk_set_config(tmp_path, zk, "p", "/xs",
                                                       MODE_ZK % "limit = 3;"))
    assert r.stdout.strip().splitlines()[-1] == "call rc=-1 errno=16", r.stderr
    assert "limit 3 here, 1 for the key's holders" in r.stderr, r.stderr
    r = run([progs["driver"], "call:0"], zk_set_config(tmp_path, zk, "s", "/xs",
                                                       MODE_ZK % 'mode = "shared";'))
    assert r.stdout.strip().splitlines()[-1] == "call rc=42 errno=0", r.stderr
    assert time.monotonic() - t0 > 2.5  # waited for the exclusive holder (3 s from its start)
    assert holder.finish()[0] == 0


def test_status_shows_shared_and_permit_holders(bg, zk, tmp_path):
    """Two shared holders of "r" and a waiting exclusive caller: two lines,
    mode shared, each its own fence (its znode's czxid), the writer as the
    first's waiter; a permit holder of limit 3: limit 3, exclusive.
    Control: once they return, nothing is listed."""
    cfg = zk_set_config(tmp_path, zk, "c", "/st", "")

    def status():
        r = run([CLI, "status", "-c", cfg, "--json"])
        assert r.returncode == 0, r.stderr
        return [json.loads(l) for l in r.stdout.splitlines()]

    def hold(*opts):
        return bg([CLI, "lock", "-c", cfg] + list(opts) + ["--", "sh", "-c", "echo in; read x"],
                  None)
    held = [hold("--shared", "r") for _ in range(2)] + [hold("--limit", "3", "p")]
    for h in held:
        h.expect("in")
    writer = hold("-w", "30000", "r")
    wait_for(lambda: len(zk.children("/st/lockshim%3Ar")) == 3, what="the writer's znode")
    objs = status()
    assert sorted((o["key"], o["mode"], o["limit"]) for o in objs) == [
        ("p", "exclusive", 3), ("r", "shared", 1), ("r", "shared", 1)], objs
    assert len({o["fence"] for o in objs}) == 3, objs
    assert sum(len(o["waiters"]) for o in objs if o["key"] == "r") == 1, objs
    for h in held:
        h.send()
    writer.expect("in")
    writer.send()
    wait_for(lambda: status() == [], what="the holders gone from status")


@pytest.mark.timing
@pytest.mark.parametrize("holder_opts,waiter,release", [
    ([], 'mode = "shared";', 0), (["--limit", "2"], "limit = 2;", 1),
    (["--limit", "2"], "limit = 2;", 0),
], ids=["shared-behind-writer", "permit-later-holder-leaves", "permit-first-holder-leaves"])
def test_set_waiter_is_woken_by_the_release(bg, worker_progs, zk, tmp_path, holder_opts,
                                            waiter, release):
    """A shared caller behind an exclusive holder, and a third permit of
    limit 2 behind two holders, wait by a watch: over 2 s the waiter spends
    (nearly) no CPU and does not enter (the control: the holders are
    there); once one holder leaves (for the permit, either of the two: they
    leave in any order, and watching only the first would miss the
    second's) it enters within 1 s."""
    root = "/wake%d%s" % (release, "s" if not holder_opts else "p")
    cfg = zk_set_config(tmp_path, zk, "c", root, 'locks = ( { symbol = "block_call"; '
                        'key = "k"; wait_ms = 60000; %s } );\n' % waiter)
    path = root + "/lockshim%3Ak"
    sets.set_waiter_woken(bg, worker_progs["block"], cfg, holder_opts, release,
                          lambda: len(zk.children(path)), 3, 1.0)


# ---- a holder cut off from every member learns of its loss by itself (Z6) --------

PRESUMED = "ZooKeeper session presumed expired: no member answered for %d ms"


def cut_holder(bg, worker_progs, zk, tmp_path, px, on_lost, session_ms, wait_ms=60000):
    """expiring_holder with connect_timeout_ms 1000, so that the holder's
    exit's shipment, which makes a new session, gives up soon while cut off."""
    return expiring_holder(bg, worker_progs, zk, tmp_path, px, on_lost, session_ms, wait_ms,
                           "connect_timeout_ms = 1000;")


def threads(pid):
    return len(os.listdir("/proc/%d/task" % pid))


@pytest.mark.timing
def test_holder_cut_off_reports_its_lock_lost_while_still_cut_off(bg, worker_progs, zk,
                                                                   tmp_path):
    """The holder's connection black-holed and left so: its client gives the
    connection up (2/3 of the session timeout without a reply) and, the
    session timeout after its last reply, presumes the session expired: the
    holder logs the lost-lease line (on_lost "log") while its call runs and
    the proxy still drops everything. The waiter (another session, direct)
    enters once the server has expired the holder's session. The holder's
    release, still cut off, sends nothing: the waiter's znode is the only
    one. Without the presumed expiry the line comes only when the proxy
    passes again (test_session_expiry_reports_each_lock_lost_while_its_call_runs)."""
    with Proxy(zk.port) as px:
        holder, waiter, theirs = cut_holder(bg, worker_progs, zk, tmp_path, px, "", SESSION_MS)
        t0 = time.monotonic()
        px.set_mode(BLACK_HOLE)
        wait_for(lambda: LOST_LINE.search(holder.stderr()),
                 timeout=SESSION_MS / 1000 + 10, what="the holder's lost-lease line")
        took = time.monotonic() - t0
        assert SESSION_MS / 1000 * 0.5 <= took < SESSION_MS / 1000 + 3 * MULT, took
        err = holder.stderr()
        assert LOST_LINE.search(err).group(1) == "log"
        assert PRESUMED % SESSION_MS in err, err
        assert holder.p.poll() is None  # inside its call still
        waiter.expect("enter", timeout=SESSION_MS / 1000 + 20 * MULT)
        holder.send()
        assert holder.expect("call").startswith("call rc=42")
        assert holder.wait(timeout=30 * MULT) == 0
        assert px.mode == BLACK_HOLE  # all of it while cut off
        err = holder.stderr()
        assert len(LOST_LINE.findall(err)) == 1, err
        assert err.count(PRESUMED % SESSION_MS) == 1, err
        assert "ZooKeeper session expired:" not in err, err  # nor the server's word after
        assert zk.children(BLK) == [theirs]  # no double release
        px.set_mode(PASS)
        waiter.send()
        assert waiter.expect("call").startswith("call rc=42")
        assert waiter.wait() == 0
        assert zk.children(BLK) == []


@pytest.mark.timing
def test_holder_cut_off_applies_on_lost_kill_while_still_cut_off(bg, worker_progs, zk,
                                                                  tmp_path):
    """The same cut under on_lost = "kill" (kill_signal SIGUSR1): the holder
    dies by its signal inside its call within about the session timeout,
    the proxy still dropping everything; the waiter then enters when the
    server expires the session."""
    with Proxy(zk.port) as px:
        holder, waiter, theirs = cut_holder(bg, worker_progs, zk, tmp_path, px,
                                            'on_lost = "kill"; kill_signal = "SIGUSR1";',
                                            SESSION_MS)
        t0 = time.monotonic()
        px.set_mode(BLACK_HOLE)
        assert holder.wait(timeout=SESSION_MS / 1000 + 10 * MULT) == -signal.SIGUSR1, \
            holder.stderr()
        took = time.monotonic() - t0
        assert SESSION_MS / 1000 * 0.5 <= took < SESSION_MS / 1000 + 3 * MULT, took
        assert px.mode == BLACK_HOLE
        m = LOST_LINE.search(holder.stderr())
        assert m and m.group(1) == "kill", holder.stderr()
        waiter.expect("enter", timeout=SESSION_MS / 1000 + 20 * MULT)
        assert zk.children(BLK) == [theirs]
        px.set_mode(PASS)
        waiter.send()
        assert waiter.expect("call").startswith("call rc=42")
        assert waiter.wait() == 0


@pytest.mark.timing
def test_control_cut_off_shorter_than_the_session_timeout_is_not_lost(bg, worker_progs, zk,
                                                                      tmp_path):
    """Control: the holder cut off until its client gives the connection up
    (it connects again: the proxy's second accept; a thread, the deadline's,
    appears), then let through at once, well before its session timeout:
    the client reconnects with its session, the thread ends, nothing is
    reported lost (on_lost "kill" never fires) and the holder keeps its
    lock past the presumed deadline (the waiter, queued before the cut,
    times out at wait_ms, 4 s past the session timeout); its release then
    frees the key. A 9 s session: the client reconnects within a few
    hundred ms of giving up, 3 s before the deadline."""
    session_ms = 9000
    with Proxy(zk.port) as px:
        holder, waiter, _ = cut_holder(bg, worker_progs, zk, tmp_path, px,
                                       'on_lost = "kill"; kill_signal = "SIGUSR1";', session_ms,
                                       wait_ms=session_ms + 4000)
        n = threads(holder.p.pid)
        accepted = px.accepted
        px.set_mode(BLACK_HOLE)
        wait_for(lambda: px.accepted > accepted, timeout=session_ms / 1000 + 10,
                 what="the holder's client connecting again")
        wait_for(lambda: threads(holder.p.pid) == n + 1, what="the deadline's thread")
        reopen(px)
        wait_for(lambda: threads(holder.p.pid) == n, what="the deadline's thread ended")
        assert waiter.expect("call", timeout=(session_ms + 4000) / 1000 + 20 * MULT) \
            .startswith("call rc=-1"), waiter.stderr()
        assert waiter.wait() == 0
        assert holder.p.poll() is None, holder.stderr()
        assert "lease on" not in holder.stderr(), holder.stderr()
        holder.send()
        assert holder.expect("call").startswith("call rc=42")
        assert holder.wait() == 0
        assert "lease on" not in holder.stderr() and "ZooKeeper session" not in holder.stderr()
        assert zk.children(BLK) == []


# ---- one handle at a time (Z7) -----------------------------------------------------

def test_presumed_expiry_closes_the_old_handle_before_the_next_session(bg, worker_progs, zk,
                                                                       tmp_path):
    """A waiter cut off from its member (a proxy black-holes its connection)
    presumes its session expired (the session timeout after its last reply)
    while it waits; woken by that, it tries new sessions, still cut off,
    each failing at connect_timeout_ms (lock.c retries the error). Let
    through, it makes one, queues again and enters at the holder's release.
    The old handle is closed before the new one is made: libzookeeper-mt
    formats its endpoint text in a static buffer, which two live handles'
    threads race on (under LOCKSHIM_TEST_TSAN a build that makes the new
    session first and closes the old one afterwards reports that race
    here)."""
    with Proxy(zk.port) as px:
        holder, waiter = proxied_waiter(bg, worker_progs, zk, tmp_path, px, 60000,
                                        "session_timeout_ms = 3000; "
                                        "connect_timeout_ms = 1500;")
        px.set_mode(BLACK_HOLE)
        wait_for(lambda: "no ZooKeeper session with" in waiter.stderr(), timeout=30,
                 what="a new session tried after the presumed expiry")
        err = waiter.stderr()
        assert "presumed expired" in err and waiter.p.poll() is None, err
        wait_for(lambda: len(zk.children(BLK)) == 1, timeout=10 * MULT,
                 what="the waiter's znode gone with its session")
        px.set_mode(PASS)
        wait_for(lambda: len(zk.children(BLK)) == 2, timeout=30,
                 what="the waiter queued again in its new session")
        holder.send()
        holder.expect("call rc=42")
        waiter.expect("enter", timeout=30)
        waiter.send()
        assert waiter.expect("call").startswith("call rc=42"), waiter.stderr()
        waiter.send("bye")
        assert waiter.wait(timeout=30 * MULT) == 0, waiter.stderr()
    holder.send("bye")
    assert holder.wait() == 0
    assert zk.children(BLK) == []


# ---- a connection broken by an error is not a silent one (Z7) ----------------------

@pytest.mark.timing
def test_member_restarted_before_the_session_timeout_keeps_the_lock(bg, worker_progs, own_zk,
                                                                    tmp_path):
    """The holder's only member SIGKILLed while the lock is held (the
    connection ends at once: an error, not a silence) and restarted after
    more than a third of the session timeout T (its data kept: it loads the
    session again): the client reconnects with its session, nothing is
    reported lost (on_lost "kill" never fires), and the holder keeps its
    znode, released at its call's end. Its last reply came at most T/3
    (the library's ping) before the break, so its session could not expire
    before 2/3 T after it; the deadline of a silent connection (T/3 after
    the break, 2/3 T after its last reply) reported it lost while the
    member restarted (the control: the build before this step)."""
    zk = own_zk
    session_ms = 24000  # T/3 = 8 s: the member's restart (up to 5 s here) ends before 2/3 T
    body = ('locks = ( { symbol = "block_call"; key = "blk"; wait_ms = 60000; '
            'on_lost = "kill"; kill_signal = "SIGUSR1"; } );\n')
    cfg = write_config(tmp_path, None, 'backend = "zookeeper";\nzookeeper = { hosts = "%s"; '
                       'session_timeout_ms = %d; };\n%s' % (zk.hosts(), session_ms, body))
    holder = bg([worker_progs["block"]], cfg)
    holder.expect("enter")
    mine = zk.children(BLK)
    assert len(mine) == 1, mine
    n = threads(holder.p.pid)
    t0 = time.monotonic()
    zk.proc.kill()
    zk.proc.wait()
    wait_for(lambda: threads(holder.p.pid) == n + 1, what="the deadline's thread")
    # past the deadline a silent connection would have had (T/3 after the break)
    time.sleep(max(0.0, t0 + session_ms / 3000 + 0.5 - time.monotonic()))
    assert holder.p.poll() is None, holder.stderr()
    zk.start()
    wait_for(lambda: threads(holder.p.pid) == n, timeout=session_ms / 1000,
             what="the client reconnected with its session (the deadline's thread ended)")
    took = time.monotonic() - t0
    assert took < session_ms / 1000 * 2 / 3, \
        "reconnected too late to tell %.1f s: %s" % (took, holder.stderr())
    err = holder.stderr()
    assert holder.p.poll() is None and "lease on" not in err and "ZooKeeper session" not in err, \
        err
    assert zk.children(BLK) == mine
    holder.send()
    assert holder.expect("call").startswith("call rc=42")
    assert holder.wait() == 0
    err = holder.stderr()
    assert "lease on" not in err and "was gone at its release" not in err, err
    assert zk.children(BLK) == []


# ---- permit waiters woken one at a time (Z7) ---------------------------------------

def cons_recved(zk):
    """The requests the server received, by session id (its cons word)."""
    out = {}
    for line in zk.four("cons").splitlines():
        m = re.search(r"recved=(\d+).*sid=(0x[0-9a-f]+)", line)
        if m:
            out[m.group(2)] = int(m.group(1))
    return out


def settled(zk, timeout=30):
    """cons_recved once two readings 0.5 s apart agree (the wake-ups of the
    last change are over), within timeout s."""
    last, end = cons_recved(zk), time.monotonic() + timeout * MULT
    while time.monotonic() < end:
        time.sleep(0.5)
        now = cons_recved(zk)
        if now == last:
            return now
        last = now
    raise AssertionError("the servers' request counts still move after %d s" % timeout)


def woken(before, after):
    """The sessions of before that sent requests since."""
    return [s for s in before if after.get(s, 0) > before[s]]


def test_permit_waiters_are_woken_one_at_a_time(bg, worker_progs, zk, tmp_path):
    """Limit 2, two holders, six waiters queued, each a process (a session)
    of its own, a 60 s session (no ping meanwhile): a seventh arrival sends
    requests from no waiter's session but the first's (the key's children,
    which only the first waiter watches; the others watch the waiter right
    before them), and a holder's release from those of the first two waiters
    only (the first enters and writes its znode's data again, which wakes
    the second, now first). Then every waiter enters in its queue's order,
    each released in turn. Control (the children watched by every permit
    waiter, the build before this step): every waiter sends at each change."""
    root = "/herd"
    path = root + "/lockshim%3Ak"
    cfg = write_config(tmp_path, None, 'backend = "zookeeper";\nzookeeper = { hosts = "%s"; '
                       'session_timeout_ms = 60000; root = "%s"; };\nlocks = ( { symbol = '
                       '"block_call"; key = "k"; wait_ms = 60000; limit = 2; } );\n'
                       % (zk.hosts(), root))
    holders = [bg([worker_progs["block"]], cfg) for _ in range(2)]
    for h in holders:
        h.expect("enter")
    waiters = []
    for i in range(6):
        waiters.append(bg([worker_progs["block"]], cfg))
        wait_for(lambda: len(zk.children(path)) == 3 + i, timeout=30, what="waiter %d" % i)
    before = settled(zk)
    late = bg([worker_progs["block"]], cfg)
    wait_for(lambda: len(zk.children(path)) == 9, timeout=30, what="the seventh waiter")
    after = settled(zk)
    arrival = woken(before, after)
    holders[0].send()
    assert holders[0].expect("call").startswith("call rc=42")
    waiters[0].expect("enter", timeout=30)
    release = woken(after, settled(zk))
    assert len(arrival) <= 1 and len(release) <= 2, (arrival, release)
    inside, queue = [holders[1], waiters[0]], waiters[1:] + [late]
    while inside:
        p = inside.pop(0)
        p.send()
        assert p.expect("call").startswith("call rc=42")
        if queue:
            queue[0].expect("enter", timeout=30)
            inside.append(queue.pop(0))
    for p in holders + waiters + [late]:
        assert p.wait() == 0, p.stderr()
    assert zk.children(path) == []
