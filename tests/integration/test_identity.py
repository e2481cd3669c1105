# SPDX-License-Identifier: MIT
"""The holder identity in lock values (owner.c) is whole: every value any
thread writes is "<token>:<host>:<pid>:<tid>:<boot id>:<pid ns>:<start>:
<since_ms>:<program>" with every field this process's, never empty, never
cut or split (since_ms: when the value was made, wall-clock ms; program: the
executable's file name).

Many threads of several processes make their first value at the same
moment (a barrier), which is when the shim reads the process's identity:
the old lazy read let one thread print it while another was rewriting it
(a value `...:vm:5313:5314:-:0:100695` was seen, that the dead-holder check
cannot judge). Under `make test-tsan` the race itself is a report. The host
name is the one field the process does not control: an empty one or one
with ':' or blanks (set in a UTS namespace the test makes) still gives one
whole field. Every value is read off Redis's MONITOR."""
import os
import re
import socket
import subprocess
import time

import pytest

from resp import Resp
from support.util import PRELOAD, TIMEOUT, cc, shim_env, write_config

PROCS, THREADS = 4, 16
CONFIG = 'locks = ( { symbol = "ledger_update"; key = "burst"; wait_ms = 60000; } );\n'
# An argument as MONITOR prints it, and a lock value among them.
ARG = re.compile(r'"((?:[^"\\]|\\.)*)"')
TOKEN = re.compile(r"[0-9a-f]{32}:")
GRANT = re.compile(r"[0-9a-f]{32}:\d+")


@pytest.fixture(scope="module")
def burst(progs, tmp_path_factory):
    d = str(tmp_path_factory.mktemp("burst"))
    return cc(os.path.join(d, "burst"), ["burst.c"], "-O2", "-L" + progs["dir"],
              "-Wl,-rpath," + progs["dir"], "-lledger", "-lpthread")


class Monitor:
    """Every command Redis runs from now until stop(), as text lines."""

    def __init__(self, port):
        self.port = port
        self.s = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
        self.s.sendall(b"*1\r\n$7\r\nMONITOR\r\n")
        self.buf = b""
        while b"+OK\r\n" not in self.buf:
            self._recv()

    def _recv(self):
        data = self.s.recv(65536)
        if not data:
            raise AssertionError("MONITOR connection closed")
        self.buf += data

    def stop(self):
        """Returns the lines seen up to a marker this sends last."""
        marker = "monitor-end-%d" % os.getpid()
        c = Resp(self.port)
        c.cmd("ECHO", marker)
        c.close()
        while marker.encode() not in self.buf:
            self._recv()
        self.s.close()
        return self.buf.decode(errors="replace").splitlines()


def values(lines):
    """The lock values among the commands' arguments (not the grant record
    "<token>:<ms>" that the scripts write in the fencing counter's g)."""
    return {a for line in lines for a in ARG.findall(line)
            if TOKEN.match(a) and not GRANT.fullmatch(a)}


def field_name(host):
    """The host field owner.c writes for a host name."""
    return "".join("-" if c == ":" or c <= " " or c > "~" else c for c in host) or "unknown"


def start_time(pid):
    with open("/proc/%d/stat" % pid) as f:
        return f.read().rsplit(")", 1)[1].split()[19]  # field 22


def run_burst(redis, burst, procs, argv_prefix=(), **env):
    """Starts PROCS copies of burst (THREADS threads each) at once, waits
    until all are done; returns {pid: start time} and the values seen."""
    mon = Monitor(redis.port)
    ps = [subprocess.Popen(list(argv_prefix) + [burst, str(THREADS), os.devnull], env=env,
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True) for _ in range(procs)]
    starts = {}
    try:
        for p in ps:
            line = p.stdout.readline()
            assert line == "done\n", (line, p.stderr.read() if p.poll() is not None else "")
            starts[p.pid] = start_time(p.pid)
    finally:
        for p in ps:
            _, err = p.communicate("go\n", timeout=TIMEOUT)
            assert p.returncode == 0, err
    return starts, values(mon.stop())


def assert_whole(vals, starts, host):
    """Every value has each field of its own process, and every thread of
    every process wrote one."""
    with open("/proc/sys/kernel/random/boot_id") as f:
        boot = f.read().strip()
    ns = str(os.stat("/proc/self/ns/pid").st_ino)
    threads = set()
    now_ms = time.time() * 1000
    for v in vals:
        head, pid, tid, v_boot, v_ns, start, since, prog = v.rsplit(":", 7)
        assert head[32] == ":" and head[33:] == host, (v, host)
        assert prog == "burst" and since.isdigit(), v
        assert now_ms - 600000 < int(since) <= now_ms + 1000, v
        assert int(pid) in starts and tid.isdigit() and int(tid) > 0, v
        assert (v_boot, v_ns, start) == (boot, ns, starts[int(pid)]), v
        threads.add((pid, tid))
    assert len(threads) == len(starts) * THREADS, sorted(threads)


def test_values_of_threads_starting_at_once_are_whole(redis, burst, tmp_path):
    cfg = write_config(tmp_path, redis, CONFIG)
    starts, vals = run_burst(redis, burst, PROCS, **shim_env(cfg))
    assert_whole(vals, starts, field_name(socket.gethostname()))


def uts_namespace():
    """The unshare(1) prefix that gives a process a host name of its own."""
    for prefix in (["unshare", "--uts"], ["unshare", "--user", "--map-root-user", "--uts"]):
        if subprocess.run(prefix + ["true"], capture_output=True).returncode == 0:
            return prefix
    pytest.skip("no UTS namespace can be made here (unshare --uts)")


# Sets the host name, then executes the program under the shim (unshare
# and this interpreter do not run under it).
SET_HOST = ("import os, socket, sys; socket.sethostname(sys.argv[1]); "
            "os.environ['LD_PRELOAD'] = os.environ.pop('BURST_PRELOAD'); "
            "os.execv(sys.argv[2], sys.argv[2:])")


@pytest.mark.parametrize("host", ["", "a:b c\t"], ids=["empty", "colon-blank"])
def test_host_field_is_one_whole_field(redis, burst, tmp_path, host):
    """An empty host name is written "unknown"; ':' and blanks become '-'
    (before: an empty field, or one field split in three)."""
    cfg = write_config(tmp_path, redis, CONFIG)
    env = shim_env(cfg, preload=False, LOCKSHIM_CONFIG=cfg, BURST_PRELOAD=PRELOAD)
    prefix = uts_namespace() + ["/usr/bin/python3", "-c", SET_HOST, host]
    starts, vals = run_burst(redis, burst, 2, prefix, **env)
    assert_whole(vals, starts, field_name(host))
    assert field_name(host) in ("unknown", "a-b-c-")
