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
   nobody dies or hangs, the traffic moves to the new primary;
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
import queue
import re
import secrets
import shutil
import signal
import subprocess
import threading
import time

import pytest

from conftest import (CLI, MULT, TIMEOUT, RedisServer, Resp, RespError, free_port,
                      lock_keys, run, shim_env, started, wait_for, write_config)

MASTER = "locks"
FAST = "connect_timeout_ms = 500; command_timeout_ms = 500;"
OK_LINE = "call rc=42 errno=0"
LOST = re.compile(r"lockshim\[\d+\]: error: (\S+): lease on (\S+) (.+); applying (\w+)$")


# ---- the topology --------------------------------------------------------------

def stop_pid(proc):
    """Stops one process we started, by its pid: SIGCONT first (it may be
    frozen), then SIGTERM, then SIGKILL."""
    if proc is None or proc.poll() is not None:
        return
    try:
        os.kill(proc.pid, signal.SIGCONT)
        proc.terminate()
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    except OSError:
        pass


class Node(RedisServer):
    """A redis-server (data node or sentinel) on 127.0.0.1 with extra arguments."""

    def __init__(self, *extra, name="node", password=None):
        super().__init__(password=password)
        self.extra = list(extra)
        self.name = name

    def args(self):
        return ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                "--save", "", "--appendonly", "no", "--daemonize", "no",
                "--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0",
                "--logfile", self.log, "--dir", self.dir] + self.extra + \
            (["--requirepass", self.password, "--masterauth", self.password]
             if self.password else [])

    def start(self):
        self.proc = subprocess.Popen(self.args(), stdin=subprocess.DEVNULL)
        wait_for(self._ready, what="%s on port %d" % (self.name, self.port))
        return self

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def client(self, timeout=2):
        return Resp(port=self.port, timeout=timeout, password=self.password)

    def cmd(self, *args):
        c = self.client()
        try:
            return c.cmd(*args)
        finally:
            c.close()

    def info(self, section="replication"):
        return dict(l.split(":", 1) for l in self.cmd("INFO", section).splitlines()
                    if ":" in l)

    def role(self):
        return self.info()["role"]

    def freeze(self):
        os.kill(self.proc.pid, signal.SIGSTOP)

    def thaw(self):
        if self.alive():
            os.kill(self.proc.pid, signal.SIGCONT)

    def stop(self):
        stop_pid(self.proc)


class Sentinel(Node):
    """A sentinel; password: its own requirepass (the sentinels share it);
    data_password: the data nodes' (auth-pass)."""

    def __init__(self, primary_port, password=None, data_password=None):
        super().__init__(name="sentinel", password=password)
        self.conf = os.path.join(self.dir, "sentinel.conf")
        with open(self.conf, "w") as f:
            f.write("port %d\nbind 127.0.0.1\ndaemonize no\nlogfile %s\ndir %s\n"
                    "sentinel monitor %s 127.0.0.1 %d 2\n"
                    "sentinel down-after-milliseconds %s 1000\n"
                    "sentinel failover-timeout %s 5000\n"
                    "sentinel parallel-syncs %s 2\n"
                    % (self.port, self.log, self.dir, MASTER, primary_port, MASTER, MASTER,
                       MASTER))
            if password:
                f.write("requirepass %s\n" % password)
            if data_password:
                f.write("sentinel auth-pass %s %s\n" % (MASTER, data_password))

    def args(self):
        return ["redis-server", self.conf, "--sentinel"]

    def addr(self):
        return "127.0.0.1:%d" % self.port

    def master_addr(self):
        a = self.cmd("SENTINEL", "get-master-addr-by-name", MASTER)
        return (a[0], int(a[1])) if a else None


def pairs(flat):
    return dict(zip(flat[::2], flat[1::2]))


class Topology:
    """A primary, two replicas and three sentinels; processes are recorded as
    soon as they start, so teardown stops whatever was started."""

    def __init__(self, password=None, sentinel_password=None):
        self.nodes = []
        self.sentinels = []
        self.out = set()   # sentinels killed or frozen by the test: not asked
        self.password = password
        self.sentinel_password = sentinel_password

    def start(self):
        primary = Node(name="primary", password=self.password)
        self.nodes.append(primary)
        primary.start()
        for i in range(2):
            r = Node("--replicaof", "127.0.0.1", str(primary.port), name="replica%d" % i,
                     password=self.password)
            self.nodes.append(r)
            r.start()
        wait_for(lambda: all(r.info().get("master_link_status") == "up" for r in self.nodes[1:]),
                 timeout=30, what="both replicas linked to the primary")
        for _ in range(3):
            s = Sentinel(primary.port, self.sentinel_password, self.password)
            self.sentinels.append(s)
            s.start()
        wait_for(self.healthy, timeout=60, what="every sentinel to see 2 replicas and 2 sentinels")
        return self

    def healthy(self):
        for s in self.sentinels:
            replicas = [pairs(r) for r in s.cmd("SENTINEL", "REPLICAS", MASTER)]
            if len(replicas) != 2 or any(r["flags"] != "slave" for r in replicas):
                return False
            if len(s.cmd("SENTINEL", "SENTINELS", MASTER)) != 2:
                return False
        return all(r.info().get("master_link_status") == "up" for r in self.replicas())

    def asked(self):
        return [s for s in self.sentinels if s not in self.out and s.alive()]

    def by_port(self, port):
        return next(n for n in self.nodes if n.port == port)

    def primary(self):
        """The node the (first answering) sentinel names as the primary."""
        for s in self.asked():
            try:
                addr = s.master_addr()
            except (OSError, ConnectionError, RespError):
                continue
            if addr:
                return self.by_port(addr[1])
        raise AssertionError("no sentinel names a primary")

    def replicas(self):
        p = self.primary()
        return [n for n in self.nodes if n is not p and n.alive()]

    def failover_done(self, old):
        """The new primary once every asked sentinel names the same node
        other than old, it says role:master and old, if alive, is a replica."""
        try:
            addrs = {s.master_addr() for s in self.asked()}
            if len(addrs) != 1:
                return None
            port = addrs.pop()[1]
            if port == old.port:
                return None
            new = self.by_port(port)
            if new.role() != "master":
                return None
            if old.alive() and old.role() != "slave":
                return None
            return new
        except (OSError, ConnectionError, RespError):
            return None

    def wait_failover(self, old, timeout=60):
        return wait_for(lambda: self.failover_done(old), timeout=timeout,
                        what="the failover away from port %d to finish" % old.port)

    def sentinel_list(self, first=None):
        order = ([first] if first else []) + [s for s in self.sentinels if s is not first]
        return ", ".join('"%s"' % s.addr() for s in order)

    def config(self, tmp_path, body, extra="", first=None, name="lockshim.cfg"):
        path = os.path.join(str(tmp_path), name)
        with open(path, "w") as f:
            f.write('redis = { sentinels = ( %s ); master_name = "%s"; %s %s };\n%s'
                    % (self.sentinel_list(first), MASTER, FAST, extra, body))
        return path

    def logs(self):
        return "\n".join("---- %s %d ----\n%s" % (n.name, n.port, n.tail())
                         for n in self.nodes + self.sentinels)

    def stop(self):
        for n in self.sentinels + self.nodes:
            n.stop()
        for n in self.sentinels + self.nodes:
            shutil.rmtree(n.dir, ignore_errors=True)


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


# ---- programs of this file -------------------------------------------------------

WORKER_C = r"""
/* worker PATH THREADS MAXITER STOPFILE: THREADS threads call ledger_update(PATH)
 * until MAXITER calls each (0: no limit) or until STOPFILE exists. Prints
 * "started" after the first call, and at the end "done ok=N failed=N max_ms=N"
 * (calls that returned the new count, calls that did not, longest call). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

int ledger_update(const char *path);
static const char *path, *stop;
static long maxiter, ok, failed;
static double max_ms;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static double now_ms(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static void *work(void *arg)
{
	long my_ok = 0, my_failed = 0;
	double my_max = 0;

	for (long i = 0; maxiter == 0 || i < maxiter; i++) {
		double t0, d;
		int rc;

		if (access(stop, F_OK) == 0)
			break;
		t0 = now_ms();
		rc = ledger_update(path);
		d = now_ms() - t0;
		if (d > my_max)
			my_max = d;
		if (rc > 0)
			my_ok++;
		else
			my_failed++;
		if (i == 0 && arg == NULL) {
			printf("started\n");
			fflush(stdout);
		}
	}
	pthread_mutex_lock(&mu);
	ok += my_ok;
	failed += my_failed;
	if (my_max > max_ms)
		max_ms = my_max;
	pthread_mutex_unlock(&mu);
	return NULL;
}

int main(int argc, char **argv)
{
	pthread_t th[16];
	int n;

	if (argc != 5)
		return 2;
	path = argv[1];
	n = atoi(argv[2]);
	maxiter = atol(argv[3]);
	stop = argv[4];
	if (n < 1 || n > 16)
		return 2;
	for (long i = 0; i < n; i++)
		pthread_create(&th[i], NULL, work, (void *)i);
	for (int i = 0; i < n; i++)
		pthread_join(th[i], NULL);
	printf("done ok=%ld failed=%ld max_ms=%.0f\n", ok, failed, max_ms);
	return 0;
}
"""

BLOCK_LIB_C = r"""
/* A legacy function that works until it is told to stop: prints "enter",
 * then reads one line from standard input. */
#include <errno.h>
#include <stdio.h>
#include <unistd.h>

int block_call(int x)
{
	char c;

	printf("enter %d\n", x);
	fflush(stdout);
	while (read(0, &c, 1) == 1 && c != '\n')
		;
	errno = 0;
	return 42;
}
"""

BLOCK_MAIN_C = r"""
#include <errno.h>
#include <stdio.h>

int block_call(int x);

/* block [stay]: one guarded call; with stay, then waits for a line before
 * exiting. */
int main(int argc, char **argv)
{
	char line[64];
	int rc;

	(void)argv;
	errno = 0;
	rc = block_call(1);
	printf("call rc=%d errno=%d\n", rc, errno);
	fflush(stdout);
	if (argc > 1 && !fgets(line, sizeof(line), stdin))
		return 4;
	return 0;
}
"""


@pytest.fixture(scope="module")
def mine(progs, tmp_path_factory):
    d = str(tmp_path_factory.mktemp("sentinel"))
    srcs = {"worker.c": WORKER_C, "block_lib.c": BLOCK_LIB_C, "block_main.c": BLOCK_MAIN_C}
    for name, text in srcs.items():
        with open(os.path.join(d, name), "w") as f:
            f.write(text)

    def gcc(*args):
        subprocess.run(["gcc", "-g", "-O2"] + list(args), cwd=d, check=True)
    gcc("-o", "worker", "worker.c", "-L" + progs["dir"], "-Wl,-rpath," + progs["dir"],
        "-lledger", "-lpthread")
    gcc("-shared", "-fPIC", "-o", "libblock.so", "block_lib.c")
    gcc("-o", "block", "block_main.c", "-L" + d, "-Wl,-rpath," + d, "-lblock")
    return {"worker": os.path.join(d, "worker"), "block": os.path.join(d, "block")}


class Bg:
    """A program in the background: stdout read line by line by a thread
    (so expect() has a deadline), stderr into a file (so a chatty shim can
    never block on a full pipe)."""

    def __init__(self, argv, cfg, errfile, **env):
        self.errfile = errfile
        self.err = open(errfile, "w")
        self.p = subprocess.Popen(argv, env=shim_env(cfg, cfg is not None, **env),
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=self.err, text=True)
        self.lines = queue.Queue()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.p.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def expect(self, prefix, timeout=TIMEOUT):
        deadline = time.monotonic() + timeout * MULT
        seen = []
        while True:
            try:
                line = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError("no %r within %s s; saw %r; stderr: %s"
                                     % (prefix, timeout, seen, self.stderr()[-3000:]))
            if line is None:
                raise AssertionError("EOF before %r; saw %r; stderr: %s"
                                     % (prefix, seen, self.stderr()[-3000:]))
            if line.startswith(prefix):
                return line
            seen.append(line)

    def send(self, line="go"):
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()

    def stderr(self):
        with open(self.errfile) as f:
            return f.read()

    def wait(self, timeout=TIMEOUT):
        return self.p.wait(timeout=timeout)

    def stop(self):
        stop_pid(self.p)
        self.err.close()


@pytest.fixture
def bg(tmp_path):
    started = []

    def start(argv, cfg, **env):
        b = Bg(argv, cfg, str(tmp_path / ("stderr%d" % len(started))), **env)
        started.append(b)
        return b
    yield start
    for b in started:
        b.stop()


def last(stdout):
    """The last line a program printed ("" for none)."""
    lines = stdout.strip().splitlines()
    return lines[-1] if lines else ""


def counter(path):
    """The counter's value. A worker rewrites the file (truncate, then
    write) outside any lock the reader holds, so an empty read means "being
    written": read again."""
    for _ in range(1000):
        with open(path) as f:
            text = f.read()
        if text:
            return int(text)
        time.sleep(0.001)
    return 0


def calls(node, command):
    m = re.search(r"^cmdstat_%s:calls=(\d+)," % command, node.cmd("INFO", "commandstats"), re.M)
    return int(m.group(1)) if m else 0


def lost_lines(stderr):
    return [l for l in stderr.splitlines() if ": lease on " in l]


def assert_lost_format(stderr, symbol, key, policy="log"):
    """Every lost-lease line is on_lost's: error level, symbol, key, policy."""
    for line in lost_lines(stderr):
        m = LOST.match(line)
        assert m, line
        assert m.group(1) == symbol and m.group(2) == key and m.group(4) == policy, line


# ---- 1. exclusion through failovers -------------------------------------------------

WORK = ('locks = ( { symbol = "ledger_update"; key = "ledger"; lease_ms = 5000; '
        'wait_ms = %d; on_timeout = "skip"; return = -7; } );\n')
PROCS, THREADS = 3, 2


def start_workers(bg, mine, cfg, path, stop, procs=PROCS, threads=THREADS, maxiter=0):
    with open(path, "w") as f:
        f.write("0\n")
    ws = [bg([mine["worker"], path, str(threads), str(maxiter), stop], cfg)
          for _ in range(procs)]
    for w in ws:
        w.expect("started")
    return ws


def finish_workers(ws, wait_ms):
    """Every worker exits 0 with no failed call and no call longer than
    wait_ms plus a wide margin; returns (calls made, joined stderr)."""
    total, errs = 0, []
    for w in ws:
        assert w.wait() == 0, w.stderr()[-3000:]
        done = w.expect("done")
        fields = dict(f.split("=") for f in done.split()[1:])
        err = w.stderr()
        errs.append(err)
        assert int(fields["failed"]) == 0, (done, err[-3000:])
        assert int(fields["max_ms"]) < wait_ms + 5000 * MULT, (done, err[-3000:])
        total += int(fields["ok"])
    return total, "".join(errs)


def traffic_reaches(node, path, before):
    """Polls until the workers run calls on node: its SET count grows and the
    counter moves on by a few more updates."""
    node.cmd("CONFIG", "RESETSTAT")
    start = counter(path)
    wait_for(lambda: calls(node, "set") >= 10 and counter(path) >= start + 10, timeout=40,
             what="lock traffic on the new primary (port %d)" % node.port)
    assert counter(path) > before


def test_control_workers_lose_updates(mine, tmp_path):
    """Without the shim the worker loses updates: the exact counts below mean something."""
    path, stop = str(tmp_path / "c"), str(tmp_path / "stop")
    with open(path, "w") as f:
        f.write("0\n")
    env = shim_env(None, preload=False)
    ps = [subprocess.Popen([mine["worker"], path, str(THREADS), "50", stop], env=env,
                           stdout=subprocess.PIPE, text=True) for _ in range(PROCS)]
    outs = [p.communicate(timeout=TIMEOUT)[0] for p in ps]
    assert all(p.returncode == 0 for p in ps), outs
    assert counter(path) < PROCS * THREADS * 50


def run_through(topo, mine, bg, tmp_path, wait_ms, redis_extra, disrupt):
    """Runs the counter workload against the topology, starts a failover
    with disrupt(old primary) once the workers run, waits for the new
    primary and for lock traffic there, stops the workers and checks that
    every call succeeded within wait_ms and the counter is exact. Returns
    the workers' stderr and the new primary."""
    cfg = topo.config(tmp_path, WORK % wait_ms, redis_extra)
    path, stop = str(tmp_path / "c"), str(tmp_path / "stop")
    old = topo.primary()
    try:
        ws = start_workers(bg, mine, cfg, path, stop)
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


def test_exclusion_through_sentinel_failover(topo, mine, bg, tmp_path):
    """SENTINEL FAILOVER while 3 processes x 2 threads update one counter, with
    wait_replicas = 2 (every lock is on both replicas before its call runs):
    every call succeeds within its bound, the counter is exact, and the
    calls go on at the new primary."""
    def failover(old):
        assert topo.sentinels[0].cmd("SENTINEL", "FAILOVER", MASTER) == "OK"
    _, new = run_through(topo, mine, bg, tmp_path, 30000,
                         "wait_replicas = 2; wait_replicas_ms = 200;", failover)
    assert calls(new, "set") > 0


def test_exclusion_through_sigkill_of_the_primary(topo, mine, bg, tmp_path):
    """SIGKILL of the primary mid-run, wait_replicas = 1: the calls right after
    retry until the sentinels have promoted a replica (the one with the
    highest offset, holding every acknowledged lock); no program dies, no
    call fails, the counter is exact; a lease lost on the way is reported
    by on_lost."""
    def kill(old):
        os.kill(old.proc.pid, signal.SIGKILL)
        old.proc.wait()
    run_through(topo, mine, bg, tmp_path, 40000, "wait_replicas = 1; wait_replicas_ms = 200;",
                kill)


# ---- 2. a lease lost in a failover --------------------------------------------------

def test_lease_lost_in_a_failover_is_reported(topo, mine, bg, tmp_path):
    """A call holds lockshim:blk through a failover; on the new primary the
    key then belongs to another owner. The renewal reports the lost lease
    (on_lost = log: an error line, the program goes on), the call returns
    normally, and its release leaves the other owner's key alone."""
    cfg = topo.config(tmp_path, 'locks = ( { symbol = "block_call"; key = "blk"; '
                      'lease_ms = 3000; wait_ms = 5000; on_lost = "log"; } );\n')
    old = topo.primary()
    b = bg([mine["block"]], cfg)
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


def test_waiter_queued_on_the_old_primary_gets_the_lock_after_the_failover(topo, mine, bg,
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
    h = bg([mine["block"], "stay"], cfg)
    h.expect("enter")
    value = old.cmd("GET", "lockshim:blk")
    w = bg([mine["block"], "stay"], cfg)
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


def test_unacknowledged_renewal_is_a_warning_and_keeps_the_lease(topo, mine, bg, tmp_path):
    """wait_replicas = 1, a 600 ms lease held while both replicas are frozen:
    renewals go on at the primary unacknowledged, each a warn line "not
    acknowledged"; the lease is kept (the key stays ours, no on_lost) and the
    call ends normally."""
    p = topo.primary()
    reps = topo.replicas()
    cfg = topo.config(tmp_path, 'locks = ( { symbol = "block_call"; key = "blk"; '
                      'lease_ms = 600; wait_ms = 5000; on_lost = "log"; } );\n',
                      "wait_replicas = 1; wait_replicas_ms = 100;")
    b = bg([mine["block"]], cfg)
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
    assert warns and all(re.match(r"lockshim\[\d+\]: warn: ", l) for l in warns), err
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
