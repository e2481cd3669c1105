# SPDX-License-Identifier: MIT
"""Locks of several keys (`keys`, doc/semantics.md "Several keys").

progs/acct.c moves money between accounts (a file each, a read-modify-write
with a window). Two threads transfer a->b and b->a 1,000 times each under a
lock of keys ( "acct:{arg0:str}", "acct:{arg1:str}" ): no deadlock, the
totals exact, and the first transfers of the two threads never inside at
once. Controls: without the shim the totals are wrong; with two nested
one-key locks taken in call order (the transfer's own account, then the
deposit's) both threads hold their first key at once, by construction (the
first transfer waits for the other inside), and then wait for each other
until wait_ms ends it. A key named twice is taken once (a non-reentrant
lock on a transfer to the same account: control, the nested locks wait for
themselves); a key that cannot be taken releases those taken before it at
once; a `keys` key and another lock's `key` with the same expansion exclude
each other (one server, Cluster); two free keys cost one round trip, and a
call waiting for a key holds none after it; a call of two keys is one call
in the metrics; refused configurations exit 78; on a Cluster whose two keys
live on different nodes and with Redlock masters, the transfers stay exact.
"""
import os
import subprocess

import pytest
from prometheus_client.parser import text_string_to_metric_families

from support.proxy import Proxy
from support.server import lock_keys, started
from support.topology import Cluster, keyslot, lock_key
from support.util import CLI, MULT, TIMEOUT, cc, run, wait_for, write_config

ITER = 1000
DELAY = 0.5  # s: the proxy's reply delay in the round-trip test
START = 100000
KEYS_LOCK = ('locks = ( { symbol = "acct_transfer"; keys = ( "acct:{arg0:str}", '
             '"acct:{arg1:str}" ); lease_ms = 5000; wait_ms = %d; on_timeout = "skip"; '
             'return = -7; %s } );\n')
NESTED_LOCK = ('locks = ( { symbols = ( "acct_transfer", "acct_deposit" ); '
               'key = "acct:{arg0:str}"; method = "entry"; lease_ms = 5000; wait_ms = %d; '
               'on_timeout = "skip"; return = -7; %s } );\n')
HOLD_LOCK = ('  { symbol = "acct_hold"; key = "acct:{arg0:str}"; lease_ms = 30000; },\n')


@pytest.fixture(scope="module")
def acct(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("acct"))
    cc(os.path.join(d, "libacct.so"), ["acct.c"], "-O2", "-shared", "-fPIC")
    return cc(os.path.join(d, "acct_main"), ["acct_main.c"], "-O2", "-L" + d,
              "-Wl,-rpath," + d, "-lacct", "-lpthread")


@pytest.fixture
def cluster(request):
    yield from started(request, Cluster(replicas=0))


def accounts(tmp_path, *names):
    paths = []
    for n in names:
        p = str(tmp_path / n)
        with open(p, "w") as f:
            f.write("%d\n" % START)
        paths.append(p)
    return paths


def balance(path):
    with open(path) as f:
        return int(f.read())


def race(acct, cfg, a, b, iters=ITER, nested=False):
    """Two threads: a->b 1 and b->a 2, iters times each; returns (met,
    failed, stderr) as acct_main says."""
    argv = [acct, "race", a, b, str(iters)] + (["nested"] if nested else [])
    r = run(argv, cfg, preload=cfg is not None, timeout=300 * MULT)
    assert r.returncode == 0, r.stderr[-3000:]
    fields = dict(f.split("=") for f in r.stdout.split()[1:])
    return int(fields["met"]), int(fields["failed"]), r.stderr


def rc_of(line):
    """R of acct_main once's "rc=R us=U"."""
    return int(line.split()[0].split("=")[1])


def us_of(line):
    return int(line.split()[1].split("=")[1])


def exact(a, b, iters=ITER):
    return balance(a) == START + iters and balance(b) == START - iters


# ---- the transfer race -------------------------------------------------------------

@pytest.mark.timing
def test_control_without_the_shim_totals_are_wrong(acct, tmp_path):
    a, b = accounts(tmp_path, "x1", "x2")
    met, failed, _ = race(acct, None, a, b)
    assert met == 1 and failed == 0
    assert not exact(a, b)


def test_opposite_transfers_never_deadlock_and_stay_exact(acct, redis, tmp_path):
    a, b = accounts(tmp_path, "x1", "x2")
    cfg = write_config(tmp_path, redis, KEYS_LOCK % (30000, ""))
    met, failed, err = race(acct, cfg, a, b)
    assert (met, failed) == (0, 0), err[-3000:]
    assert exact(a, b), (balance(a), balance(b))
    assert "warn" not in err and "error" not in err, err[-3000:]
    assert lock_keys(redis, "lockshim:acct:*") == []  # every key released


@pytest.mark.timing
def test_control_nested_one_key_locks_deadlock(acct, redis, tmp_path):
    """The same transfers under two nested locks taken in call order: both
    threads hold their own account and wait for the other's until wait_ms
    (300 ms) skips the deposit; money is lost."""
    a, b = accounts(tmp_path, "x1", "x2")
    cfg = write_config(tmp_path, redis, NESTED_LOCK % (300, ""))
    met, failed, err = race(acct, cfg, a, b, iters=20, nested=True)
    assert met == 1 and failed >= 1, err[-3000:]
    assert "still held by another owner after 300 ms" in err
    assert not exact(a, b, 20)


def test_keys_are_taken_in_byte_order(acct, redis, tmp_path):
    """Whatever the arguments' order, the debug lines show the smaller key
    taken first, each once."""
    a, b = accounts(tmp_path, "x1", "x2")
    cfg = write_config(tmp_path, redis, KEYS_LOCK % (30000, "linger_ms = 0;"))
    for src, dst in ((a, b), (b, a)):
        r = run([acct, "once", src, dst, "1"], cfg, LOCKSHIM_LOG_LEVEL="debug")
        assert rc_of(r.stdout) == 1, r.stderr
        got = [l.split("acquired ")[1].split()[0] for l in r.stderr.splitlines()
               if "acquired lockshim:acct:" in l]
        assert got == ["lockshim:acct:" + a, "lockshim:acct:" + b], r.stderr


@pytest.mark.timing
def test_uncontended_two_keys_cost_one_round_trip(acct, redis, tmp_path):
    """Behind a proxy that holds every reply 0.5 s, a call of two free keys
    takes one delay (both acquires in one write, their replies in one read)
    once the server knows the scripts (the first call's EVALSHA gets
    NOSCRIPT and sends them again, together, as EVAL: two).
    Control: fair = true takes each key with the queue script, one round
    trip each, two delays. Every command's deadline is well past the delay
    (command_timeout_ms = 5000): at the default 500 ms, equal to the
    delay, a reply held a few ms longer on a loaded machine timed out, and
    the token of that unanswered command kept the key until its lease
    ended ("may keep a token of this process until it expires"), so the
    measured call waited 2.5 s (1 ASan run in about 60)."""
    proxy = Proxy(redis.port, reply_delay=DELAY).start()
    server = 'redis = { host = "127.0.0.1"; port = %d; command_timeout_ms = 5000; };\n' \
        % proxy.port
    try:
        a, b = accounts(tmp_path, "x1", "x2")
        cfg = write_config(tmp_path, None, server + KEYS_LOCK % (30000, ""))
        # the server learns the scripts (NOSCRIPT: both sent again, together)
        assert rc_of(run([acct, "once", a, b, "1"], cfg).stdout) == 1
        r = run([acct, "once", a, b, "1"], cfg)
        assert rc_of(r.stdout) == 1, r.stderr
        assert DELAY * 1e6 <= us_of(r.stdout) < 1.8 * DELAY * 1e6 * MULT, r.stdout
        fair = write_config(tmp_path, None, server + KEYS_LOCK % (30000, "fair = true;"))
        assert rc_of(run([acct, "once", a, b, "1"], fair).stdout) == 1
        r = run([acct, "once", a, b, "1"], fair)
        assert rc_of(r.stdout) == 1, r.stderr
        assert us_of(r.stdout) >= 2 * DELAY * 1e6, r.stdout
        assert balance(a) == START - 4 and balance(b) == START + 4
    finally:
        proxy.stop()


# ---- one key twice, a partial failure ----------------------------------------------

def test_a_key_named_twice_is_taken_once(acct, redis, tmp_path):
    """A non-reentrant lock transferring to the same account: one
    acquisition, no wait. Control: the nested locks wait for themselves."""
    (a,) = accounts(tmp_path, "x1")
    cfg = write_config(tmp_path, redis, KEYS_LOCK % (2000, "reentrant = false;"))
    r = run([acct, "once", a, a, "5"], cfg, LOCKSHIM_LOG_LEVEL="debug")
    assert rc_of(r.stdout) == 1, r.stderr
    assert r.stderr.count("acquired lockshim:acct:") == 1, r.stderr
    assert balance(a) == START
    ctl = write_config(tmp_path, redis, NESTED_LOCK % (300, "reentrant = false;"))
    r = run([acct, "once", a, a, "5", "nested"], ctl)
    assert rc_of(r.stdout) == -7, r.stderr
    assert "still held by another owner" in r.stderr


def test_a_key_not_taken_releases_the_ones_taken_before_it(acct, redis, tmp_path, procs):
    """x2 is held by someone else: the call takes x1 (it sorts first), waits
    for x2 until wait_ms, then releases x1 at once (its lease is 5 s)."""
    a, b = accounts(tmp_path, "x1", "x2")
    ka, kb = "lockshim:acct:" + a, "lockshim:acct:" + b
    redis.cmd("SET", kb, "someone-else", "PX", "60000")
    cfg = write_config(tmp_path, redis, KEYS_LOCK % (1500, ""))
    p = procs([acct, "once", b, a, "1"], cfg)
    held = wait_for(lambda: redis.cmd("GET", ka), what="x1 taken while x2 is waited for")
    assert (":%d:" % p.p.pid) in held
    assert rc_of(p.expect("rc=")) == -7
    assert redis.cmd("GET", ka) is None  # released at once, not at its lease
    assert redis.cmd("GET", kb) == "someone-else"
    rc, _, err = p.finish()
    assert rc == 0 and "still held by another owner" in err, err
    assert balance(a) == START and balance(b) == START


def test_waiting_for_a_key_holds_none_after_it(acct, redis, tmp_path, procs):
    """x1 is held by someone else: the first attempt takes x2 with it (one
    write), then gives x2 back before waiting for x1, so a call never waits
    holding a key that sorts after the one it waits for."""
    a, b = accounts(tmp_path, "x1", "x2")
    ka, kb = "lockshim:acct:" + a, "lockshim:acct:" + b
    redis.cmd("SET", ka, "someone-else", "PX", "60000")
    cfg = write_config(tmp_path, redis, KEYS_LOCK % (30000, ""))
    p = procs([acct, "once", b, a, "1"], cfg)
    wait_for(lambda: int(redis.cmd("ZCARD", ka + ":q")) == 1, what="the call queued for x1")
    assert redis.cmd("GET", kb) is None
    assert int(redis.cmd("HGET", kb + ":f", "n") or 0) <= 1  # taken at most by the batch
    redis.cmd("DEL", ka)
    assert rc_of(p.expect("rc=")) == 1
    assert p.finish()[0] == 0
    assert balance(a) == START + 1 and balance(b) == START - 1


# ---- the same lock as another lock's key ---------------------------------------------

def excludes(acct, procs, cfg, tmp_path, queued):
    """A holder of x2 by acct_hold's one-key lock makes a keys transfer
    x1->x2 wait (queued(path of x2) says it is in x2's queue) until it
    returns; a transfer x1->x3 goes through meanwhile (control)."""
    a, b, c = accounts(tmp_path, "x1", "x2", "x3")
    holder = procs([acct, "hold", b], cfg)
    assert holder.expect("holding") == "holding " + b
    assert rc_of(run([acct, "once", a, c, "1"], cfg).stdout) == 1
    t = procs([acct, "once", a, b, "1"], cfg)
    wait_for(lambda: queued(b), what="the transfer queued for x2")
    assert t.p.poll() is None
    holder.send()
    assert rc_of(t.expect("rc=")) == 1
    assert holder.finish()[0] == 0
    assert balance(a) == START - 2 and balance(b) == START + 1 and balance(c) == START + 1


def with_hold_lock(body):
    return body.replace("locks = ( ", "locks = (\n" + HOLD_LOCK)


def test_a_key_held_as_a_semaphore_is_a_mismatch_at_once(acct, redis, tmp_path, procs):
    """x2 held as a permit of limit = 3 (acct_hold's lock): a transfer
    x1->x2 (limit 1) gets the mismatch error naming both numbers and
    on_error (skip: -7) at once, never enters; x1 is released. The batched
    first attempt used to read the script's -3 (the holders' limit, minus)
    as a fencing token and ran the transfer beside the permit holder (rc=1).
    Control: x1->x3 goes through."""
    a, b, c = accounts(tmp_path, "x1", "x2", "x3")
    cfg = write_config(tmp_path, redis, with_hold_lock(KEYS_LOCK % (20000, "on_error = \"skip\";"))
                       .replace("lease_ms = 30000; }", "lease_ms = 30000; limit = 3; }"))
    holder = procs([acct, "hold", b], cfg)
    assert holder.expect("holding") == "holding " + b
    assert rc_of(run([acct, "once", a, c, "1"], cfg).stdout) == 1
    r = run([acct, "once", a, b, "1"], cfg)
    assert rc_of(r.stdout) == -7, r.stdout + r.stderr
    assert "limit 1 here, 3 for the key's holders" in r.stderr, r.stderr
    assert us_of(r.stdout) < 5e6 * MULT, r.stdout
    assert redis.cmd("EXISTS", "lockshim:acct:" + a) == 0
    holder.send()
    assert holder.finish()[0] == 0
    assert balance(a) == START - 1 and balance(b) == START and balance(c) == START + 1


def test_a_keys_key_excludes_a_key_lock_with_the_same_expansion(acct, redis, tmp_path, procs):
    cfg = write_config(tmp_path, redis, with_hold_lock(KEYS_LOCK % (30000, "")))
    excludes(acct, procs, cfg, tmp_path,
             lambda b: int(redis.cmd("ZCARD", "lockshim:acct:%s:q" % b)) == 1)


def test_cluster_keys_key_excludes_a_key_lock(acct, cluster, tmp_path, procs):
    """The same on a Cluster: both locks' keys get the hash tag alike."""
    cfg = cluster.config(tmp_path, with_hold_lock(KEYS_LOCK % (30000, "")))

    def queued(b):
        k = lock_key("acct:" + b)
        return int(cluster.owner(keyslot(k)).cmd("ZCARD", k + ":q")) == 1
    excludes(acct, procs, cfg, tmp_path, queued)


# ---- metrics -----------------------------------------------------------------------

def scrape(config):
    """`lockshim metrics`: {(name, labels as a sorted tuple): value}."""
    r = subprocess.run([CLI, "metrics", "-c", config], capture_output=True, text=True,
                       timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(r.stdout) for s in fam.samples}


def test_metrics_count_a_call_once_and_name_every_key(acct, redis, tmp_path, procs):
    """A call holding two keys is one call, one fast acquisition, one hold;
    both its keys count as held by its lock (each template's glob names it)."""
    (a,) = accounts(tmp_path, "x1")
    cfg = write_config(tmp_path, redis, 'locks = ( { symbol = "acct_hold"; keys = ( '
                       '"acct:{arg0:str}", "audit:{arg0:str}" ); } );\n')
    p = procs([acct, "hold", a], cfg, LOCKSHIM_TEST_HOST="h1")
    assert p.expect("holding") == "holding " + a
    m = scrape(cfg)
    assert m.get(("lockshim_held", (("lock", "acct_hold"),))) == 2, m
    p.send()
    assert p.finish()[0] == 0
    m = scrape(cfg)
    lab = (("host", "h1"), ("lock", "acct_hold"))
    assert m.get(("lockshim_calls_total", lab)) == 1, m
    assert m.get(("lockshim_acquired_total", tuple(sorted(lab + (("how", "fast"),))))) == 1
    assert m.get(("lockshim_wait_seconds_count", lab)) == 1
    assert m.get(("lockshim_hold_seconds_count", lab)) == 1


# ---- refusals -----------------------------------------------------------------------

@pytest.mark.parametrize("lock,why", [
    ('keys = ( "k:{arg0}" ); key = "k";', "key and keys together"),
    ('keys = ();', "is empty"),
    ('keys = ( %s );' % ", ".join('"k%d"' % i for i in range(17)), "at most 16"),
    ('keys = ( "k", "k:{arg7}" );', "out of range"),
])
def test_refused_keys_exit_78(acct, redis, tmp_path, lock, why):
    cfg = write_config(tmp_path, redis, 'locks = ( { symbol = "acct_transfer"; %s } );\n'
                       % lock)
    r = run([acct, "once", "p", "q", "1"], cfg)
    assert r.returncode == 78 and r.stdout == "", r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "locks[0].keys" in lines[0] and why in lines[0], r.stderr


def test_check_names_every_key(tmp_path):
    cfg = write_config(tmp_path, None, KEYS_LOCK % (30000, ""))
    r = subprocess.run([CLI, "check", "-c", cfg], capture_output=True, text=True,
                       timeout=TIMEOUT)
    assert "  acct_transfer: keys lockshim:acct:{arg0:str} lockshim:acct:{arg1:str}, " \
        "lease_ms 5000, wait_ms 30000, return -7\n" in r.stdout, r.stdout


# ---- topologies ------------------------------------------------------------------------

def test_cluster_keys_on_two_nodes(acct, cluster, tmp_path):
    """The two accounts' keys hash to slots of different primaries: taken one
    node after the other, the transfers stay exact and deadlock-free."""
    names = ["n%d" % i for i in range(200)]
    owner = {n: cluster.owner(keyslot(lock_key("acct:" + str(tmp_path / n)))).port
             for n in names}
    first = names[0]
    second = next(n for n in names if owner[n] != owner[first])
    a, b = accounts(tmp_path, first, second)
    cfg = cluster.config(tmp_path, KEYS_LOCK % (60000, ""))
    met, failed, err = race(acct, cfg, a, b, iters=200)
    assert (met, failed) == (0, 0), err[-3000:]
    assert exact(a, b, 200)
    for path in (a, b):
        k = lock_key("acct:" + path)
        node = cluster.owner(keyslot(k))
        assert int(node.cmd("HGET", k + ":f", "n")) >= 1  # its fence, on its own node


def test_redlock_opposite_transfers(acct, masters, tmp_path):
    a, b = accounts(tmp_path, "x1", "x2")
    cfg = masters.config(tmp_path, KEYS_LOCK % (60000, ""))
    met, failed, err = race(acct, cfg, a, b, iters=200)
    assert (met, failed) == (0, 0), err[-3000:]
    assert exact(a, b, 200)
