# SPDX-License-Identifier: MIT
"""Logging an operator can use (issue 20, section 5).

- every line names the program (the executable's file name) and the pid;
  a line in `log_file` starts with the UTC time, RFC 3339 with
  milliseconds, close to the test's own clock;
- `log_format = "json"`: every line, on stderr and in `log_file`, is one
  JSON object with ts, level, pid, program, msg (and lock, key for the
  events of one lock: acquired, released, timeouts, ...), parsed by
  Python's json module, for a guarded call at `debug` and for a lock-wait
  timeout at the default level; program data with quotes, backslashes,
  control characters and bytes that are not UTF-8 stays one parseable
  line;
- `log_syslog = true`: every line is also one datagram to the syslog
  socket (a test-owned one, LOCKSHIM_TEST_SYSLOG_PATH), facility daemon,
  the level as severity; no listener: lines dropped, program unharmed;
- `warn_wait_ms`: a call that waited longer than it logs one warn line
  when it enters, naming the key, the wait and the holder (a foreign
  value that expires, a live process that hands the lock over); shorter
  waits and `warn_wait_ms = 0` log nothing; a timeout line names the
  holder.
"""
import calendar
import json
import os
import re
import socket
import subprocess
import threading
import time

from support.util import TIMEOUT, Proc, shim_env, write_config

TS = re.compile(r"(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)\.(\d{3})Z")
FOREIGN = "0" * 32 + ":elsewhere:4242:4242:-:0:0:1764000000000:batch"  # a holder on another machine


def locks(*entries):
    return "locks = ( %s );\n" % ", ".join(entries)


def run_driver(progs, cfg, *steps, **env):
    """Runs the driver under the shim with env added; returns (pid,
    returncode, stdout, stderr) as bytes."""
    p = subprocess.Popen([progs["driver"], *steps], env=shim_env(cfg, **env),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         stdin=subprocess.DEVNULL)
    out, err = p.communicate(timeout=TIMEOUT)
    return p.pid, p.returncode, out, err


def run_driver_env(progs, cfg, **env):
    return run_driver(progs, cfg, "call:0", **env)


def epoch(ts):
    """Seconds since the epoch of an RFC 3339 UTC timestamp with milliseconds."""
    m = TS.fullmatch(ts)
    assert m, ts
    y, mo, d, h, mi, s, ms = map(int, m.groups())
    return calendar.timegm((y, mo, d, h, mi, s)) + ms / 1000


def json_lines(data):
    """Parses every line of data (bytes) as one JSON object with ts, level,
    pid, program, msg and, for events of one lock, lock and key; returns
    them."""
    objs = [json.loads(line) for line in data.decode("utf-8").splitlines()]
    for o in objs:
        assert list(o) in (["ts", "level", "pid", "program", "msg"],
                           ["ts", "level", "pid", "program", "lock", "key", "msg"],
                           ["ts", "level", "pid", "program", "lock", "msg"],
                           ["ts", "level", "pid", "program", "key", "msg"]), o
        assert o["level"] in ("error", "warn", "info", "debug"), o
        assert isinstance(o["pid"], int) and isinstance(o["msg"], str), o
    return objs


# ---- text lines ----------------------------------------------------------------

def test_text_lines_name_the_program_and_the_log_file_has_the_time(progs, redis, tmp_path):
    """stderr: "lockshim[pid] driver: debug: ..."; log_file: the same after
    the UTC time, within a minute of this test's clock."""
    body = locks('{ symbol = "hold_call"; }')
    cfg = write_config(tmp_path, redis, 'log_level = "debug";\n' + body)
    pid, rc, out, err = run_driver(progs, cfg, "call:0")
    assert rc == 0 and out.endswith(b"call rc=42 errno=0\n"), err
    lines = err.decode().splitlines()
    assert lines and all(l.startswith("lockshim[%d] driver: " % pid) for l in lines), lines
    assert any(l.startswith("lockshim[%d] driver: debug: acquired lockshim:hold_call" % pid)
               for l in lines), lines

    log = tmp_path / "shim.log"
    cfg = write_config(tmp_path, redis, 'log_level = "debug"; log_file = "%s";\n' % log + body)
    before = time.time()
    pid, rc, out, err = run_driver(progs, cfg, "call:0")
    after = time.time()
    assert rc == 0 and err == b"", err
    lines = log.read_text().splitlines()
    assert lines, lines
    for l in lines:
        ts, rest = l.split(" ", 1)
        assert before - 1 <= epoch(ts) <= after + 1, (l, before, after)
        assert rest.startswith("lockshim[%d] driver: " % pid), l


# ---- JSON lines ----------------------------------------------------------------

def test_json_lines_parse_on_stderr_and_in_the_log_file(progs, redis, tmp_path):
    body = locks('{ symbol = "hold_call"; }')
    cfg = write_config(tmp_path, redis, 'log_level = "debug"; log_format = "json";\n' + body)
    before = time.time()
    pid, rc, out, err = run_driver(progs, cfg, "call:0")
    after = time.time()
    assert rc == 0 and out.endswith(b"call rc=42 errno=0\n"), err
    objs = json_lines(err)
    assert objs and all(o["pid"] == pid and o["program"] == "driver" for o in objs), objs
    assert all(before - 1 <= epoch(o["ts"]) <= after + 1 for o in objs), objs
    acq = [o for o in objs if o["msg"].startswith("acquired lockshim:hold_call")]
    assert len(acq) == 1 and acq[0]["level"] == "debug", objs
    assert acq[0]["lock"] == "hold_call" and acq[0]["key"] == "lockshim:hold_call", acq

    log = tmp_path / "shim.log"
    cfg = write_config(tmp_path, redis, 'log_level = "debug"; log_format = "json"; '
                       'log_file = "%s";\n' % log + body)
    pid, rc, out, err = run_driver(progs, cfg, "call:0")
    assert rc == 0 and err == b"", err
    objs = json_lines(log.read_bytes())
    assert objs and all(o["pid"] == pid and o["program"] == "driver" for o in objs), objs


def test_json_lock_timeout_line(progs, redis, tmp_path):
    """A holder on another machine keeps the lock: the wait times out and
    the warn line (default level) is one JSON object; the call is skipped."""
    redis.cmd("SET", "lockshim:hold_call", FOREIGN, "PX", "60000")
    cfg = write_config(tmp_path, redis, 'log_format = "json";\n' +
                       locks('{ symbol = "hold_call"; wait_ms = 300; }'))
    pid, rc, out, err = run_driver(progs, cfg, "call:0")
    assert rc == 0 and out.startswith(b"call rc=-1 "), (out, err)
    objs = json_lines(err)
    assert [o["level"] for o in objs] == ["warn"], objs
    assert objs[0]["msg"] == "hold_call: lock lockshim:hold_call still held by another " \
        "owner after 300 ms (holder: host elsewhere, pid 4242, program batch)", objs
    assert objs[0]["pid"] == pid and objs[0]["program"] == "driver", objs
    assert objs[0]["lock"] == "hold_call" and objs[0]["key"] == "lockshim:hold_call", objs


def test_json_escapes_program_data(progs, redis, tmp_path):
    """A key built from program data holding quotes, a backslash, CR/LF, a
    control byte, UTF-8 and a byte that is not UTF-8: every stderr line is
    one JSON object, and the message carries the characters (the stray
    byte as U+00FF)."""
    cfg = write_config(tmp_path, redis, 'log_level = "debug"; log_format = "json";\n' +
                       locks('{ symbol = "log_call"; key = "{arg0:str}"; }'))
    name = b'q"b\\c\r\nd\x01\xc3\xa9\xff'
    path = os.path.join(os.fsencode(str(tmp_path)), name)
    pid, rc, out, err = run_driver(progs, cfg, b"log:" + path)
    assert rc == 0 and out == b"log rc=1 errno=0\n", err
    assert os.path.exists(path)  # the program saw the raw name
    objs = json_lines(err)
    want = "acquired lockshim:" + path.replace(b":", b"%3A").decode("latin-1") \
        .replace("\xc3\xa9", "\xe9")
    acq = [o for o in objs if o["msg"].startswith(want)]
    assert len(acq) == 1 and acq[0]["key"] == want[len("acquired "):], (want, objs)
    assert acq[0]["lock"] == "log_call", acq


# ---- syslog --------------------------------------------------------------------

class Syslog:
    """A test-owned AF_UNIX datagram socket standing in for /dev/log (the
    shim reads LOCKSHIM_TEST_SYSLOG_PATH, outside secure-execution mode),
    read by a thread as a daemon would (the kernel queues only a few
    datagrams: max_dgram_qlen)."""

    def __init__(self, tmp_path):
        self.path = str(tmp_path / "log.sock")
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.s.bind(self.path)
        self.s.settimeout(0.05)
        self.got, self.stop = [], False
        self.lock = threading.Lock()
        self.t = threading.Thread(target=self.read)
        self.t.start()

    def read(self):
        while not self.stop:
            with self.lock:  # a datagram is in got or in the queue, never in between
                try:
                    self.got.append(self.s.recv(65536).decode())
                except socket.timeout:
                    pass

    def take(self):
        """Returns the datagrams received since the last take, in order (the
        program has exited: all it sent is in got or still queued)."""
        with self.lock:
            while True:
                try:
                    self.got.append(self.s.recv(65536).decode())
                except socket.timeout:  # empty for one timeout: nothing more
                    break
            got, self.got = self.got, []
        return got

    def close(self):
        self.stop = True
        self.t.join()
        self.s.close()


def test_syslog_gets_every_line_as_one_datagram(progs, redis, tmp_path):
    """log_syslog = true: each stderr line is also one datagram
    "<PRI>lockshim[pid]: driver: level: msg", facility daemon (3) and the
    level as severity (debug 7, warning 4); the control without
    log_syslog sends nothing."""
    sl = Syslog(tmp_path)
    path = sl.path
    try:
        cfg = write_config(tmp_path, redis, 'log_level = "debug";\n' +
                           locks('{ symbol = "hold_call"; }'))
        p = subprocess.run([progs["driver"], "call:0"], capture_output=True, timeout=TIMEOUT,
                           env=shim_env(cfg, LOCKSHIM_TEST_SYSLOG_PATH=path))
        assert p.returncode == 0 and p.stderr, p.stderr
        assert sl.take() == []  # the control: log_syslog is off

        cfg = write_config(tmp_path, redis, 'log_level = "debug"; log_syslog = true;\n' +
                           locks('{ symbol = "hold_call"; }'))
        pid, rc, out, err = run_driver_env(progs, cfg, LOCKSHIM_TEST_SYSLOG_PATH=path)
        assert rc == 0, err
        lines = err.decode().splitlines()
        got = sl.take()
        want = []
        for l in lines:
            level, msg = re.fullmatch(r"lockshim\[\d+\] driver: (\w+): (.*)", l).groups()
            sev = {"error": 3, "warn": 4, "info": 6, "debug": 7}[level]
            want.append("<%d>lockshim[%d]: driver: %s: %s" % (3 * 8 + sev, pid, level, msg))
        assert got == want and len(got) >= 3, (got, want)

        redis.cmd("SET", "lockshim:hold_call", FOREIGN, "PX", "60000")
        cfg = write_config(tmp_path, redis, 'log_syslog = true;\n' +
                           locks('{ symbol = "hold_call"; wait_ms = 300; }'))
        pid, rc, out, err = run_driver_env(progs, cfg, LOCKSHIM_TEST_SYSLOG_PATH=path)
        assert rc == 0 and out.startswith(b"call rc=-1 "), (out, err)
        assert sl.take() == [
            "<28>lockshim[%d]: driver: warn: hold_call: lock lockshim:hold_call still held "
            "by another owner after 300 ms (holder: host elsewhere, pid 4242, program batch)" % pid], err
    finally:
        sl.close()


def test_syslog_without_a_listener_drops_lines(progs, redis, tmp_path):
    """No syslog daemon at the path: the program runs as before, the lines
    still reach stderr."""
    cfg = write_config(tmp_path, redis, 'log_level = "debug"; log_syslog = true;\n' +
                       locks('{ symbol = "hold_call"; }'))
    pid, rc, out, err = run_driver_env(progs, cfg,
                                       LOCKSHIM_TEST_SYSLOG_PATH=str(tmp_path / "none.sock"))
    assert rc == 0 and out.endswith(b"call rc=42 errno=0\n"), err
    assert b"debug: acquired lockshim:hold_call" in err


# ---- slow waits ----------------------------------------------------------------

SLOW = re.compile(r"lockshim\[(\d+)\] driver: warn: hold_call: lock lockshim:hold_call taken "
                  r"after waiting (\d+) ms \(holder: host (\S+), pid (\d+), program (\S+)\)")


def warn_lines(err):
    return [l for l in err.decode().splitlines() if ": warn: " in l]


def test_slow_wait_logs_one_warn_line_with_the_holder(progs, redis, tmp_path):
    """A foreign holder whose lease runs 1.5 s: the call enters after it
    expires and logs one warn line at the default level (warn_wait_ms
    1000 by default) with the wait and the holder; the same wait with
    warn_wait_ms = 0, and a 0.3 s wait, log nothing."""
    body = locks('{ symbol = "hold_call"; }')
    cfg = write_config(tmp_path, redis, body)
    redis.cmd("SET", "lockshim:hold_call", FOREIGN, "PX", "1500")
    pid, rc, out, err = run_driver(progs, cfg, "call:0")
    assert rc == 0 and out.endswith(b"call rc=42 errno=0\n"), err
    warns = warn_lines(err)
    assert len(warns) == 1, err
    m = SLOW.fullmatch(warns[0])
    assert m and int(m.group(1)) == pid and m.group(3) == "elsewhere" and m.group(4) == "4242", \
        warns
    assert 1000 < int(m.group(2)) < 1500 + 5000, warns

    cfg = write_config(tmp_path, redis, locks('{ symbol = "hold_call"; warn_wait_ms = 0; }'))
    redis.cmd("SET", "lockshim:hold_call", FOREIGN, "PX", "1500")
    start = time.monotonic()
    pid, rc, out, err = run_driver(progs, cfg, "call:0")
    assert rc == 0 and out.endswith(b"call rc=42 errno=0\n") and err == b"", err
    assert time.monotonic() - start > 1.0  # it did wait the lease out

    cfg = write_config(tmp_path, redis, body)
    redis.cmd("SET", "lockshim:hold_call", FOREIGN, "PX", "300")
    pid, rc, out, err = run_driver(progs, cfg, "call:0")
    assert rc == 0 and out.endswith(b"call rc=42 errno=0\n") and err == b"", err


def test_slow_wait_names_a_live_holder_that_hands_over(progs, redis, tmp_path):
    """A holder process of this machine keeps the lock 1.5 s; the waiter
    gets it from its release and names it: this host, the holder's pid."""
    cfg = write_config(tmp_path, redis, locks('{ symbol = "hold_call"; warn_wait_ms = 500; }'))
    holder = Proc([progs["driver"], "call:1500"], cfg)
    try:
        holder.expect("enter 1500")
        pid, rc, out, err = run_driver(progs, cfg, "call:0")
        hrc, hout, herr = holder.finish()
    finally:
        holder.kill()
    assert hrc == 0 and herr == "", herr
    assert rc == 0 and out.endswith(b"call rc=42 errno=0\n"), err
    warns = warn_lines(err)
    assert len(warns) == 1, err
    m = SLOW.fullmatch(warns[0])
    assert m and int(m.group(1)) == pid and int(m.group(4)) == holder.p.pid, warns
    assert 500 < int(m.group(2)) < 1500 + 5000, warns


def test_syslog_that_does_not_read_costs_the_program_nothing_but_lines(progs, redis, tmp_path):
    """A daemon that reads nothing: the queue takes its first lines
    (max_dgram_qlen) and the rest are dropped, only the first of them after
    waiting (100 ms); the program ends normally, every line on stderr."""
    path = str(tmp_path / "deaf.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(path)
    try:
        with open("/proc/sys/net/unix/max_dgram_qlen") as f:
            qlen = int(f.read())
        cfg = write_config(tmp_path, redis, 'log_level = "debug"; log_syslog = true;\n' +
                           locks('{ symbol = "hold_call"; }'))
        calls = ["call:0"] * (qlen + 40)
        start = time.monotonic()
        run_driver(progs, cfg, *calls)  # the control: no syslog socket to send to
        plain = time.monotonic() - start
        start = time.monotonic()
        pid, rc, out, err = run_driver(progs, cfg, *calls, LOCKSHIM_TEST_SYSLOG_PATH=path)
        deaf = time.monotonic() - start
        assert rc == 0 and out.count(b"call rc=42 errno=0\n") == len(calls), err
        lines = err.decode().splitlines()
        # one line waits 100 ms for the queue; the others do not wait at all
        # (waiting each would cost (dropped lines) x 100 ms, over 3 s here)
        assert len(lines) - qlen > 30 and deaf - plain < 2.0, (deaf, plain, len(lines))
        assert len(lines) > qlen + 1, lines
        s.settimeout(0.05)
        got = []
        while True:
            try:
                got.append(s.recv(65536).decode())
            except socket.timeout:
                break
        # the first lines, as many as the queue took (Linux takes qlen + 1)
        assert qlen <= len(got) < len(lines), (got, lines)
        assert [g.split(": ", 1)[1] for g in got] == \
            [l.split("] ", 1)[1] for l in lines[:len(got)]], (got, lines)
    finally:
        s.close()
