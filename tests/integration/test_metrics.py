# SPDX-License-Identifier: MIT
"""`lockshim metrics`: the shim's counts, shipped to the server by each
process, summed per lock and host, and the gauges read from the lock keys.

Every output is parsed with prometheus_client's text parser (the real one,
python3-prometheus-client). Hosts are told apart by LOCKSHIM_TEST_HOST (the
host name a process files its counts under).

1. processes that have exited are counted, per host, and their counts match
   the calls made: calls (a nested reentrant call is one), acquired fast,
   kept and reentrant, the wait and hold histograms' counts;
2. a process still running ships its counts within about a second (the
   renewal thread), without exiting;
3. a call timing out under on_timeout = "skip" counts one timeout and one
   skip; lockshim_held and lockshim_waiting while a holder and a waiter
   exist (and 0 once they are gone);
4. a lease lost, a call past max_hold_ms, a dead holder broken; a fork
   child ships its own counts only; counts the server refused go with a
   later shipment, none twice;
5. --listen serves GET /metrics (200, version 0.0.4) and 404 elsewhere,
   reads the server afresh at each scrape, and exits 0 on SIGTERM;
6. exit statuses: 69 server unreachable, 78 bad config, 64 usage; a config
   without locks is fine;
7. the same counts and gauges through Sentinel, a Redis Cluster and Redlock
   masters.
"""
import os
import signal
import subprocess
import urllib.error
import urllib.request

import pytest

from support.scenarios import parse, scrape, val
from support.server import started
from support.topology import Cluster, Topology
from support.util import CLI, TIMEOUT, run, wait_for, write_config

LOCKS = ('locks = ( { symbol = "hold_call"; key = "f"; %s },\n'
         '          { symbol = "nest"; key = "n"; } );\n')


def cfg(tmp_path, redis, settings="", name="lockshim.cfg"):
    """A config of the two locks (settings: hold_call's), as tmp_path/name."""
    d = os.path.join(str(tmp_path), name[:-4])
    os.makedirs(d, exist_ok=True)
    return write_config(d, redis, LOCKS % settings)


def driver(progs, config, *steps, host="h1", **env):
    r = run([progs["driver"]] + list(steps), config, LOCKSHIM_TEST_HOST=host, **env)
    assert r.returncode == 0, r.stderr
    return r


def test_exited_processes_are_counted_per_host(progs, redis, tmp_path):
    c = cfg(tmp_path, redis, "handoff_ms = 30000; linger_ms = 30000;")
    # host h1: 3 calls of hold_call (1 fast, 2 taken back while kept) and
    # nest(3), 4 nested calls on one key (1 fast, 3 reentrant)
    driver(progs, c, "call:0", "call:0", "call:0", "nest:3:0", host="h1")
    # host h2: 2 processes of 1 call each
    driver(progs, c, "call:0", host="h2")
    driver(progs, c, "call:0", host="h2")
    m = scrape(c)
    assert val(m, "lockshim_calls_total", "hold_call", "h1") == 3
    assert val(m, "lockshim_acquired_total", "hold_call", "h1", how="fast") == 1
    assert val(m, "lockshim_acquired_total", "hold_call", "h1", how="kept") == 2
    assert val(m, "lockshim_acquired_total", "hold_call", "h1", how="waited") == 0
    assert val(m, "lockshim_wait_seconds_count", "hold_call", "h1") == 1
    assert val(m, "lockshim_hold_seconds_count", "hold_call", "h1") == 3
    assert val(m, "lockshim_calls_total", "nest", "h1") == 4
    assert val(m, "lockshim_acquired_total", "nest", "h1", how="fast") == 1
    assert val(m, "lockshim_acquired_total", "nest", "h1", how="reentrant") == 3
    assert val(m, "lockshim_hold_seconds_count", "nest", "h1") == 1  # the outermost call
    assert val(m, "lockshim_calls_total", "hold_call", "h2") == 2
    assert val(m, "lockshim_acquired_total", "hold_call", "h2", how="fast") == 2
    assert val(m, "lockshim_hold_seconds_bucket", "hold_call", "h2", le="+Inf") == 2
    assert val(m, "lockshim_timeouts_total", "hold_call", "h1") == 0
    assert val(m, "lockshim_held", "hold_call") == 0
    # where the counts live: one hash per host, kept after the processes
    assert sorted(redis.cmd("KEYS", "lockshim:metrics:*")) == ["lockshim:metrics:{h1}",
                                                                "lockshim:metrics:{h2}"]
    assert redis.cmd("TTL", "lockshim:metrics:{h1}") == -1


@pytest.mark.timing
def test_a_running_process_ships_its_counts_within_a_second(progs, redis, tmp_path, procs):
    c = cfg(tmp_path, redis)
    p = procs([progs["driver"], "call:0", "stdin"], c, LOCKSHIM_TEST_HOST="live")
    assert p.expect("call") == "call rc=42 errno=0"
    wait_for(lambda: val(scrape(c), "lockshim_calls_total", "hold_call", "live") == 1,
             timeout=5, what="the renewal thread's shipment")
    assert p.p.poll() is None  # not the exit's
    p.send()
    assert p.finish()[0] == 0
    assert val(scrape(c), "lockshim_calls_total", "hold_call", "live") == 1  # not twice


@pytest.mark.timing
def test_timeout_skip_and_the_gauges(progs, redis, tmp_path, procs):
    c = cfg(tmp_path, redis, "wait_ms = 60000;")
    holder = procs([progs["driver"], "call:60000"], c, LOCKSHIM_TEST_HOST="holder")
    assert holder.expect("enter") == "enter 60000"
    waiter = procs([progs["driver"], "call:0"], c, LOCKSHIM_TEST_HOST="waiter")
    wait_for(lambda: val(scrape(c), "lockshim_waiting", "hold_call") == 1,
             what="the waiter in the queue")
    m = scrape(c)
    assert val(m, "lockshim_held", "hold_call") == 1
    assert val(m, "lockshim_held", "nest") == 0
    # a caller giving up after 100 ms, skipping the call
    skip = cfg(tmp_path, redis, 'wait_ms = 100; on_timeout = "skip"; return = -7;',
               name="skip.cfg")
    r = driver(progs, skip, "call:0", host="skipper")
    assert "call rc=-7" in r.stdout
    m = scrape(c)
    assert val(m, "lockshim_calls_total", "hold_call", "skipper") == 1
    assert val(m, "lockshim_timeouts_total", "hold_call", "skipper") == 1
    assert val(m, "lockshim_skipped_total", "hold_call", "skipper") == 1
    assert val(m, "lockshim_errors_total", "hold_call", "skipper") == 0
    assert val(m, "lockshim_acquired_total", "hold_call", "skipper", how="fast") == 0
    assert val(m, "lockshim_wait_seconds_count", "hold_call", "skipper") == 0
    # the holder ends; the waiter takes the lock (waited) and exits
    holder.p.send_signal(signal.SIGKILL)
    holder.p.wait()
    assert waiter.finish()[0] == 0
    m = scrape(c)
    assert val(m, "lockshim_acquired_total", "hold_call", "waiter", how="waited") == 1
    assert val(m, "lockshim_dead_holders_broken_total", "hold_call", "waiter") == 1
    assert val(m, "lockshim_wait_seconds_count", "hold_call", "waiter") == 1
    assert val(m, "lockshim_held", "hold_call") == 0
    assert val(m, "lockshim_waiting", "hold_call") == 0


@pytest.mark.timing
def test_lost_and_overrun_leases_are_counted(progs, redis, tmp_path, procs):
    c = cfg(tmp_path, redis, "lease_ms = 600; max_hold_ms = 60000;")
    p = procs([progs["driver"], "call:1500"], c, LOCKSHIM_TEST_HOST="lost")
    assert p.expect("enter") == "enter 1500"
    assert redis.cmd("DEL", "lockshim:f") == 1  # the next renewal finds it gone
    assert p.finish()[0] == 0
    over = cfg(tmp_path, redis, "max_hold_ms = 100;", name="over.cfg")
    driver(progs, over, "call:600", host="over")
    # control: the same calls with nothing lost nor overrun
    driver(progs, c, "call:0", host="fine")
    m = scrape(c)
    assert val(m, "lockshim_lost_total", "hold_call", "lost") == 1
    assert val(m, "lockshim_overruns_total", "hold_call", "over") == 1
    assert val(m, "lockshim_lost_total", "hold_call", "over") == 0
    assert val(m, "lockshim_lost_total", "hold_call", "fine") == 0
    assert val(m, "lockshim_overruns_total", "hold_call", "fine") == 0


def test_a_fork_child_ships_only_its_own_counts(progs, redis, tmp_path):
    c = cfg(tmp_path, redis)
    # one call before the fork (the parent's), one in the child
    r = driver(progs, c, "call:0", "fork", host="f")
    assert "child-own rc=42" in r.stdout, r.stdout
    m = scrape(c)
    assert val(m, "lockshim_calls_total", "hold_call", "f") == 2  # 3 if the child re-sent
    assert val(m, "lockshim_hold_seconds_count", "hold_call", "f") == 2


@pytest.mark.timing
def test_counts_refused_by_the_server_go_with_a_later_shipment(progs, redis, tmp_path,
                                                                  procs):
    log = os.path.join(str(tmp_path), "shim.log")
    c = write_config(tmp_path, redis, 'log_file = "%s"; log_level = "debug";\n%s'
                     % (log, LOCKS % ""))
    # the count hashes read-only, the locks' keys (their fencing counters
    # too, HINCRBY'd by the acquire) writable
    redis.cmd("ACL", "SETUSER", "default", "resetkeys", "~lockshim:[^m]*",
              "%R~lockshim:metrics:*")
    p = procs([progs["driver"], "call:0", "stdin", "call:0"], c, LOCKSHIM_TEST_HOST="r")
    assert p.expect("call") == "call rc=42 errno=0"
    wait_for(lambda: os.path.exists(log) and "counts not sent" in open(log).read(),
             what="a shipment refused (NOPERM)")
    assert val(scrape(c), "lockshim_calls_total", "hold_call", "r") == 0
    redis.cmd("ACL", "SETUSER", "default", "resetkeys", "~*")
    wait_for(lambda: val(scrape(c), "lockshim_calls_total", "hold_call", "r") == 1,
             timeout=5, what="the counts kept, sent by the next shipment")
    p.send()
    assert p.expect("call") == "call rc=42 errno=0"
    assert p.finish()[0] == 0
    m = scrape(c)
    assert val(m, "lockshim_calls_total", "hold_call", "r") == 2  # none twice, none lost
    assert val(m, "lockshim_acquired_total", "hold_call", "r", how="fast") == 2


def get(url):
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT) as r:
            return r.status, r.headers.get("Content-Type"), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type"), e.read().decode()


def test_listen_serves_metrics_and_404(progs, redis, tmp_path, procs):
    c = cfg(tmp_path, redis)
    srv = procs([CLI, "metrics", "-c", c, "--listen", "127.0.0.1:0"])
    addr = srv.expect("listening on").split()[-1]
    status, ctype, body = get("http://%s/metrics" % addr)
    assert status == 200 and ctype == "text/plain; version=0.0.4"
    assert val(parse(body), "lockshim_calls_total", "hold_call", "h1") == 0
    driver(progs, c, "call:0", host="h1")
    status, _, body = get("http://%s/metrics" % addr)  # read afresh
    assert status == 200
    assert val(parse(body), "lockshim_calls_total", "hold_call", "h1") == 1
    assert get("http://%s/other" % addr)[0] == 404
    assert get("http://%s/" % addr)[0] == 404
    srv.p.send_signal(signal.SIGTERM)
    assert srv.p.wait(timeout=TIMEOUT) == 0


def test_exit_statuses(redis, tmp_path):
    nolocks = write_config(tmp_path, redis, "")
    r = subprocess.run([CLI, "metrics", "-c", nolocks], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "# TYPE lockshim_calls_total counter" in r.stdout
    port = redis.port
    down = os.path.join(str(tmp_path), "down.cfg")
    with open(down, "w") as f:
        f.write('redis = { host = "127.0.0.1"; port = 1; };\n')
    r = subprocess.run([CLI, "metrics", "-c", down], capture_output=True, text=True)
    assert r.returncode == 69, r.stderr
    bad = os.path.join(str(tmp_path), "bad.cfg")
    with open(bad, "w") as f:
        f.write('redis = { host = "127.0.0.1"; port = %d; nonsense = 1; };\n' % port)
    assert subprocess.run([CLI, "metrics", "-c", bad], capture_output=True).returncode == 78
    for argv in (["--listen"], ["--bogus"], ["extra"], ["--listen", "nocolon"]):
        r = subprocess.run([CLI, "metrics", "-c", nolocks] + argv, capture_output=True)
        assert r.returncode == 64, argv


# ---- topologies --------------------------------------------------------------------

@pytest.fixture
def cluster(request):
    """Three primaries, no replicas."""
    yield from started(request, Cluster(replicas=0))


@pytest.fixture
def sentinel(request):
    """A primary, two replicas, three sentinels."""
    yield from started(request, Topology())


def counted_on(config, progs):
    driver(progs, config, "call:0", "call:0", host="a")
    driver(progs, config, "call:0", host="b")
    m = scrape(config)
    assert val(m, "lockshim_calls_total", "hold_call", "a") == 2
    assert val(m, "lockshim_calls_total", "hold_call", "b") == 1
    assert val(m, "lockshim_hold_seconds_count", "hold_call", "a") == 2
    assert val(m, "lockshim_held", "hold_call") == 0
    return m


def test_cluster(cluster, progs, tmp_path, procs):
    c = cluster.config(tmp_path, LOCKS % "")
    counted_on(c, progs)
    # the hash of each host lives in its own slot; the gauges see a held lock
    p = procs([progs["driver"], "call:60000"], c, LOCKSHIM_TEST_HOST="a")
    assert p.expect("enter") == "enter 60000"
    assert val(scrape(c), "lockshim_held", "hold_call") == 1


def test_redlock(masters, progs, tmp_path, procs):
    c = masters.config(tmp_path, LOCKS % "")
    counted_on(c, progs)
    # each count is on one master: a key held on every master counts once
    p = procs([progs["driver"], "call:60000"], c, LOCKSHIM_TEST_HOST="a")
    assert p.expect("enter") == "enter 60000"
    assert val(scrape(c), "lockshim_held", "hold_call") == 1
    # the counts went to the first master: with the last one down they are
    # all there, and the master left out is said
    m = masters.nodes[2]
    m.proc.kill()
    m.proc.wait()
    r = subprocess.run([CLI, "metrics", "-c", c], capture_output=True, text=True,
                       timeout=TIMEOUT)
    assert r.returncode == 0 and "left out" in r.stderr, r.stderr
    assert val(parse(r.stdout), "lockshim_calls_total", "hold_call", "b") == 1
    assert val(parse(r.stdout), "lockshim_held", "hold_call") == 1


def test_sentinel(sentinel, progs, tmp_path, procs):
    c = sentinel.config(tmp_path, LOCKS % "")
    counted_on(c, progs)
    p = procs([progs["driver"], "call:60000"], c, LOCKSHIM_TEST_HOST="a")
    assert p.expect("enter") == "enter 60000"
    assert val(scrape(c), "lockshim_held", "hold_call") == 1


def test_holders_of_a_set_are_each_held(progs, redis, tmp_path, procs):
    """limit = 3: two permit holders are two locks held (the queue's :qx,
    also a zset, is no holder); control: the plain lock counts its one
    holder."""
    c = cfg(tmp_path, redis, "limit = 3; wait_ms = 60000;")
    holders = [procs([progs["driver"], "call:60000"], c) for _ in range(2)]
    for h in holders:
        assert h.expect("enter") == "enter 60000"
    m = scrape(c)
    assert val(m, "lockshim_held", "hold_call") == 2
    assert val(m, "lockshim_waiting", "hold_call") == 0
    for h in holders:
        h.p.send_signal(signal.SIGKILL)
        h.p.wait()
    assert redis.cmd("DEL", "lockshim:f") == 1  # the dead holders' set
    plain = cfg(tmp_path, redis, name="plain.cfg")
    p = procs([progs["driver"], "call:60000"], plain)
    assert p.expect("enter") == "enter 60000"
    assert val(scrape(plain), "lockshim_held", "hold_call") == 1


def test_a_lock_name_that_is_not_utf8_is_escaped(redis, tmp_path):
    """`lockshim lock` counts under its key, which may be any bytes: the
    label stays UTF-8 (the format's rule; the real parser refuses other
    bytes), a byte that is not written as the text \\xNN, UTF-8 kept."""
    c = cfg(tmp_path, redis)
    r = subprocess.run([CLI.encode(), b"lock", b"-c", c.encode(), b"job\xff\xc3\xa9", b"--",
                        b"true"], capture_output=True, timeout=TIMEOUT,
                       env=dict(os.environ, LOCKSHIM_TEST_HOST="bytes"))
    assert r.returncode == 0, r.stderr
    assert val(scrape(c), "lockshim_calls_total", "job\\xFF\u00e9", "bytes") == 1


def test_the_counts_of_thousands_of_locks_are_summed_exactly(redis, tmp_path):
    """Thousands of (lock, host) rows and held keys, written in the shim's
    format: every row's values are its own (rows are found through a hash
    table, not a walk of every row), and the rows come out sorted by lock,
    then host. Not a timing test: the sums only."""
    locks, hosts = 2000, ("h0", "h1", "h2")
    sep = "\x1f"
    want = {}
    for k, host in enumerate(hosts):
        args = []
        for i in range(locks):
            if i % 3 == k:  # each lock on two hosts of three
                continue
            lock = "L%d" % i
            fast, kept = i + k + 1, (i * 7 + k) % 5
            want[(lock, host)] = (fast, kept)
            for series, label, value in (("lockshim_calls_total", "", fast + kept),
                                         ("lockshim_acquired_total", "fast", fast),
                                         ("lockshim_acquired_total", "kept", kept),
                                         ("lockshim_hold_seconds", "0.001", fast),
                                         ("lockshim_hold_seconds", "+Inf", kept),
                                         ("lockshim_hold_seconds", "sum_us", 1000 * i)):
                if value:
                    args += [lock + sep + series + sep + label, str(value)]
        assert redis.cmd("HSET", "lockshim:metrics:{%s}" % host, *args) == len(args) // 2
    for i in range(0, locks, 4):  # held: a string lock key each
        assert redis.cmd("SET", "lockshim:L%d" % i, "v") == "OK"
    c = write_config(tmp_path, redis, "")
    r = subprocess.run([CLI, "metrics", "-c", c], capture_output=True, text=True,
                       timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
    m = parse(r.stdout)
    for (lock, host), (fast, kept) in want.items():
        assert val(m, "lockshim_calls_total", lock, host) == fast + kept, (lock, host)
        assert val(m, "lockshim_acquired_total", lock, host, how="fast") == fast
        assert val(m, "lockshim_acquired_total", lock, host, how="kept") == kept
        assert val(m, "lockshim_hold_seconds_count", lock, host) == fast + kept
        assert val(m, "lockshim_hold_seconds_bucket", lock, host, le="0.001") == fast
        assert val(m, "lockshim_hold_seconds_sum", lock, host) == int(lock[1:]) / 1000
    for i in range(locks):
        assert val(m, "lockshim_held", "L%d" % i) == (1 if i % 4 == 0 else 0)
    rows = [tuple(line.split('"')[1:4:2]) for line in r.stdout.splitlines()
            if line.startswith("lockshim_calls_total{")]
    assert len(rows) == len(want) and rows == sorted(rows)


def test_a_host_of_more_fields_than_one_reply_holds_is_read_by_pages(redis, tmp_path):
    """A host whose hash has more than 8192 fields (2500 locks, 4 values
    each: 50 locks using every value are 2550) does not fit one HGETALL
    reply (the client takes 16384 elements in an array: the scrape failed,
    status 69); it is read by HSCAN pages, every field once."""
    sep, locks = "\x1f", 2500
    args = []
    for i in range(locks):
        for series, label, value in (("lockshim_calls_total", "", i + 2),
                                     ("lockshim_acquired_total", "fast", i + 1),
                                     ("lockshim_acquired_total", "waited", 1),
                                     ("lockshim_hold_seconds", "0.001", i + 2)):
            args += ["B%d" % i + sep + series + sep + label, str(value)]
    assert redis.cmd("HSET", "lockshim:metrics:{big}", *args) == 4 * locks
    assert redis.cmd("HLEN", "lockshim:metrics:{big}") > 8192  # past one reply
    assert redis.cmd("HSET", "lockshim:metrics:{small}", "B0" + sep + "lockshim_calls_total"
                     + sep, "5") == 1
    c = write_config(tmp_path, redis, "")
    r = subprocess.run([CLI, "metrics", "-c", c], capture_output=True, text=True,
                       timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
    m = parse(r.stdout)
    for i in range(locks):
        lock = "B%d" % i
        assert val(m, "lockshim_calls_total", lock, "big") == i + 2, lock
        assert val(m, "lockshim_acquired_total", lock, "big", how="fast") == i + 1
        assert val(m, "lockshim_acquired_total", lock, "big", how="waited") == 1
        assert val(m, "lockshim_hold_seconds_count", lock, "big") == i + 2
    assert val(m, "lockshim_calls_total", "B0", "small") == 5
    assert r.stdout.count("lockshim_calls_total{") == locks + 1
