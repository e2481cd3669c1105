# SPDX-License-Identifier: MIT
"""A program's arguments never reach the shim's own keys.

With key = "kc:{arg0:str}", the lock of the path P is lockshim:kc:P and its
waiters queue in lockshim:kc:P:q, :qx, :due and :w:<token>, and its fencing
counter is lockshim:kc:P:f. A caller whose path is P + ":q" (or ":qx",
":due", ":f") must hold a key of its own, not the queue or counter of P: the holder H1 of P and the holder H2 of P + suffix block inside
their calls (log_call opens a FIFO, which waits for a reader), a waiter W
for P queues, and once the test releases H1 (by opening P's FIFO for
reading) W enters at once; H2 still holds its key with its own value all
along. The control is the same with P + ":r", a suffix the shim does not
use. Bytes of an argument that the key layout uses (% : { } and a reserved
word after a colon) are percent-encoded: the key names are checked. A
template whose own text spells a queue key ("kc:q", "a:w:{arg0}") is a
config error (exit 78) for the shim and for `lockshim check`, and its
control ("kc:qq") loads.
"""
import os
import subprocess
import time

import pytest

from support.server import namespace_keys
from support.util import CLI, MULT, TIMEOUT, run, shim_env, wait_for, write_config

CFG = 'locks = ( { symbol = "log_call"; key = "kc:{arg0:str}"; lease_ms = 20000; ' \
      'wait_ms = 8000; } );\n'


def holders(redis, pid):
    """The lock keys whose value names pid as their holder (a key released
    between KEYS and its read is not one)."""
    out = []
    for k in redis.cmd("KEYS", "lockshim:*"):
        v = redis.cmd("GET", k) if redis.cmd("TYPE", k) == "string" else None
        if v is not None and ":%d:" % pid in v:
            out.append(k)
    return out


def release(fifo):
    """Lets the caller blocked opening fifo for writing go on; returns the
    reading end, to be closed once the caller is done."""
    return os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)


@pytest.mark.parametrize("suffix", [":q", ":qx", ":due", ":f", ":r"])
def test_an_argument_ending_like_a_queue_key_is_a_lock_of_its_own(progs, redis, tmp_path,
                                                                  procs, suffix):
    c = write_config(tmp_path, redis, CFG)
    p = str(tmp_path / "v")
    assert ":" not in p and "%" not in p
    os.mkfifo(p)
    os.mkfifo(p + suffix)
    h1 = procs([progs["driver"], "log:" + p], c)
    wait_for(lambda: holders(redis, h1.p.pid) == ["lockshim:kc:" + p], what="H1 holding")
    h2 = procs([progs["driver"], "log:" + p + suffix], c)
    wait_for(lambda: len(holders(redis, h2.p.pid)) == 1, what="H2 holding")
    k2 = holders(redis, h2.p.pid)[0]
    w = procs([progs["driver"], "log:" + p], c)
    wait_for(lambda: redis.cmd("CLIENT", "LIST").count("cmd=blpop") == 1
             or w.p.poll() is not None, what="W waiting")
    assert holders(redis, h2.p.pid) == [k2]  # nobody wrote over H2's lock
    fd = release(p)
    try:
        assert h1.expect("log") == "log rc=1 errno=0"
        released = time.monotonic()
        assert w.expect("log") == "log rc=1 errno=0"
        assert time.monotonic() - released < 2.0 * MULT
        assert holders(redis, h2.p.pid) == [k2]
    finally:
        os.close(fd)
    fd = release(p + suffix)
    try:
        assert h2.expect("log") == "log rc=1 errno=0"
    finally:
        os.close(fd)
    for x in (h1, h2, w):
        rc, _, err = x.finish()
        assert rc == 0 and "WRONGTYPE" not in err, err
    assert namespace_keys(redis) == []


def test_argument_bytes_of_the_layout_are_percent_encoded(progs, redis, tmp_path, procs):
    """The key of a path with : % { } ~ and a reserved word after a colon."""
    c = write_config(tmp_path, redis, CFG)
    d = str(tmp_path)
    for name, enc in [("a:q", "a%3Aq"), ("b%3A", "b%253A"), ("{c}", "%7Bc%7D"),
                      ("~d", "~d")]:
        os.mkfifo(os.path.join(d, name))
        h = procs([progs["driver"], "log:" + os.path.join(d, name)], c)
        wait_for(lambda: holders(redis, h.p.pid) != [], what="holding " + name)
        assert holders(redis, h.p.pid) == ["lockshim:kc:%s/%s" % (d, enc)]
        fd = release(os.path.join(d, name))
        try:
            assert h.expect("log") == "log rc=1 errno=0"
        finally:
            os.close(fd)
        assert h.finish()[0] == 0


@pytest.mark.parametrize("key,message", [
    ("kc:q", 'ends in ":q", which the shim appends to a lock\'s key for its queue'),
    ("kc:{arg0:str}:due", 'ends in ":due"'),
    ("kc:{arg0:str}:f", 'ends in ":f", which the shim appends to a lock\'s key for its queue '
                        'or fencing counter'),
    ("a:w:{arg0}", 'contains ":w:", which the shim uses for a waiter\'s list'),
    ("kc:qq", None)])
def test_a_template_spelling_a_queue_key_is_refused(progs, redis, tmp_path, key, message):
    c = write_config(tmp_path, redis, 'locks = ( { symbol = "log_call"; key = "%s"; } );\n'
                     % key)
    r = run([progs["driver"], "log:" + str(tmp_path / "f")], c)
    ck = subprocess.run([CLI, "check", "-c", c], env=shim_env(None, preload=False),
                        capture_output=True, text=True, timeout=TIMEOUT,
                        stdin=subprocess.DEVNULL)
    if message is None:
        assert r.returncode == 0 and r.stdout == "log rc=1 errno=0\n", r.stderr
        assert ck.returncode == 0 and "log_call: key lockshim:kc:qq" in ck.stdout, ck
        return
    assert r.returncode == 78 and r.stdout == "", r.stderr
    for err in (r.stderr, ck.stderr):
        assert "locks[0].key: \"%s\": the key's text " % key in err and message in err, err
    assert ck.returncode == 78, ck
