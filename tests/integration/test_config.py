# SPDX-License-Identifier: MIT
"""Unusable configs stop the program before main; connection settings."""
import errno
import os
import re

import pytest

from resp import Resp
from support.server import RedisServer
from support.util import run, wait_for, write_config

BAD = [
    ('locks = ( { symbol = "hold_call"; on_timeout = "maybe"; } );',
     ':1: locks[0].on_timeout: unknown value "maybe"'),
    ('locks = ( { symbol = "hold_call";\n  colour = 1; } );', ":2: locks[0].colour: unknown setting"),
    ('locks = ( { key = "k"; } );', 'missing required setting "symbol"'),
    ('locks = ( { symbol = "hold_call"; key = "{arg7}"; } );', "locks[0].key"),
    ('locks = ( { symbol = "hold_call"; lease_ms = -5; } );', "lease_ms: value -5 out of range"),
    ('locks = ( { symbol = "hold_call" ', "syntax error"),
    ('locks = ( { symbol = "longjmp"; } );', "cannot be guarded"),
    ('redis = { port = "6379"; };', "redis.port: expected an integer"),
    ('log_level = "chatty";', 'log_level: unknown value "chatty"'),
]


@pytest.mark.parametrize("text,message", BAD)
def test_bad_config_stops_before_main(progs, tmp_path, text, message):
    cfg = write_config(tmp_path, None, text)
    r = run([progs["driver"], "call:0"], cfg)
    assert r.returncode == 78
    assert r.stdout == ""  # main never ran
    assert cfg in r.stderr and message in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_missing_config_file(progs, tmp_path):
    r = run([progs["driver"], "call:0"], str(tmp_path / "nope.cfg"))
    assert r.returncode == 78 and r.stdout == ""
    assert "nope.cfg" in r.stderr and "No such file" in r.stderr


def test_default_path_missing_is_silent(progs, tmp_path):
    """Without LOCKSHIM_CONFIG the shim reads /etc/lockshim/lockshim.cfg
    (implicit); missing, it does nothing and says nothing (the exit-78 and
    broken cases: test_systemwide.py, in a root of its own)."""
    if os.path.exists("/etc/lockshim/lockshim.cfg"):
        pytest.skip("a system config exists")
    r = run([progs["driver"], "call:0"], "", LOCKSHIM_CONFIG="", LOCKSHIM_LOG_LEVEL="debug")
    assert r.returncode == 0 and "call rc=42" in r.stdout
    assert r.stderr == ""


def test_bad_log_level_env(progs, redis, tmp_path):
    # checked where the shim acts: a lock applies to the program
    cfg = write_config(tmp_path, redis, 'locks = ( { symbol = "hold_call"; } );\n')
    r = run([progs["driver"], "call:0"], cfg, LOCKSHIM_LOG_LEVEL="loud")
    assert r.returncode == 78 and "LOCKSHIM_LOG_LEVEL" in r.stderr


def test_no_locks_means_no_thread_and_no_connection(progs, tmp_path):
    down = RedisServer()
    cfg = write_config(tmp_path, None, 'redis = { port = %d; };\nlog_level = "debug";\n' % down.port)
    r = run([progs["driver"], "call:0"], cfg)
    assert r.returncode == 0 and "call rc=42" in r.stdout
    # no lock applies: not a line, even at debug (test_scope.py)
    assert r.stderr == ""


def test_log_file(progs, redis, tmp_path):
    log = tmp_path / "shim.log"
    cfg = write_config(tmp_path, redis, 'log_file = "%s"; log_level = "debug";\n'
                       'locks = ( { symbol = "hold_call"; } );\n' % log)
    r = run([progs["driver"], "call:0"], cfg)
    assert r.returncode == 0 and "lockshim" not in r.stderr
    text = log.read_text()
    assert "debug: acquired lockshim:hold_call" in text
    # every line: the UTC time (RFC 3339, milliseconds), the pid, the program
    assert all(re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z lockshim\[\d+\] driver: "
                        r"(error|warn|info|debug): ", l) for l in text.splitlines()), text


@pytest.fixture
def secured():
    r = RedisServer(password="s3cret").start()
    r.cmd("ACL", "SETUSER", "alice", "on", ">alicepw", "~*", "+@all")
    yield r
    r.cleanup()


def test_unix_socket_with_password_and_db(progs, secured, tmp_path, procs):
    cfg = write_config(tmp_path, None, """
redis = { socket = "%s"; password = "s3cret"; db = 2; };
namespace = "ns1";
locks = ( { symbol = "hold_call"; key = "u:{arg0}"; lease_ms = 60000; } );
""" % secured.sock)
    p = procs([progs["driver"], "call:3000"], cfg)
    p.expect("enter")
    c = Resp(path=secured.sock, password="s3cret")
    c.cmd("SELECT", 2)
    assert ":%d:" % p.p.pid in c.cmd("GET", "ns1:u:3000")
    assert p.expect("call") == "call rc=42 errno=0"
    assert c.cmd("EXISTS", "ns1:u:3000") == 0
    c.close()
    rc, _, err = p.finish()
    assert rc == 0 and "error" not in err, err


def test_acl_user(progs, secured, tmp_path, procs):
    cfg = write_config(tmp_path, None, """
redis = { port = %d; username = "alice"; password = "alicepw"; db = 1; };
locks = ( { symbol = "hold_call"; lease_ms = 60000; } );
""" % secured.port)
    p = procs([progs["driver"], "call:0", "stdin"], cfg)
    assert p.expect("call") == "call rc=42 errno=0"
    c = secured.client()
    c.cmd("SELECT", 1)
    # Released after the call (by the renewal thread, on its own connection,
    # once linger_ms has passed).
    wait_for(lambda: c.cmd("EXISTS", "lockshim:hold_call") == 0, what="release")
    c.close()
    p.send()
    assert p.finish()[0] == 0


def test_wrong_password_is_a_redis_error(progs, secured, tmp_path):
    cfg = write_config(tmp_path, None, """
redis = { port = %d; password = "wrong"; };
locks = ( { symbol = "hold_call"; wait_ms = 100; } );
""" % secured.port)
    r = run([progs["driver"], "call:0"], cfg)
    assert r.stdout.strip() == "call rc=-1 errno=%d" % errno.EBUSY
    assert "AUTH" in r.stderr and "Redis unavailable" in r.stderr
