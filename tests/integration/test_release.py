# SPDX-License-Identifier: MIT
"""Asynchronous release: a release is sent without waiting for its reply;
the reply is still read (and a failure logged) when the process exits and
before it execs another image."""
from support.util import run, wait_for, write_config

KEY = "lockshim:f"


def cfg(tmp_path, redis, settings, log=""):
    return write_config(tmp_path, redis, log + """locks = (
  { symbol = "hold_call"; key = "f"; %s },
  { symbol = "log_call"; key = "f"; %s } );
""" % (settings, settings))


def test_async_release_is_flushed_when_the_process_exits(progs, redis, tmp_path):
    c = cfg(tmp_path, redis, "lease_ms = 60000;", log='log_level = "debug";\n')
    r = run([progs["driver"], "call:0"], c)
    assert r.returncode == 0
    assert "released lockshim:f" in r.stderr
    assert redis.cmd("EXISTS", KEY) == 0  # released at once, not after 60 s
    assert "unconfirmed" not in r.stderr and "failed" not in r.stderr


def test_async_release_failure_is_still_logged_at_exit(progs, redis, tmp_path, procs):
    c = cfg(tmp_path, redis, "lease_ms = 60000;")
    p = procs([progs["driver"], "call:500"], c)
    p.expect("enter")
    redis.cmd("SET", KEY, "thief", "PX", "60000")
    rc, _, err = p.finish()
    assert rc == 0
    assert "%s was no longer ours at release" % KEY in err
    assert redis.cmd("GET", KEY) == "thief"


def test_async_release_failure_is_logged_before_exec(progs, redis, tmp_path, procs):
    """The exec'd image never reads the old connection: the reply is read first."""
    c = cfg(tmp_path, redis, "lease_ms = 60000;")
    p = procs([progs["driver"], "call:500", "exec:stdin"], c)
    p.expect("enter")
    redis.cmd("SET", KEY, "thief", "PX", "60000")
    p.expect("call")
    wait_for(lambda: open("/proc/%d/cmdline" % p.p.pid).read().split("\0")[1:2] == ["stdin"],
             what="exec")
    p.send()
    rc, _, err = p.finish()
    assert rc == 0
    assert "%s was no longer ours at release" % KEY in err
