# SPDX-License-Identifier: MIT
"""A redis-server of the test's own, and the bodies of the fixtures that
start servers: each on a free 127.0.0.1 port (and a unix socket), stopped
by its pid when the test ends, its log printed when the test failed.
"""
import os
import shutil
import socket
import subprocess
import tempfile
import weakref

from resp import Resp
from support.process import ServerProcess
from support.util import wait_for


class RedisServer(ServerProcess):
    """A redis-server; until start() its port is held by a bound socket that
    does not listen, so connections to it are refused (a server that is
    down) and no other free_port() (another test process) takes it."""

    STOP_WAIT = 10
    TAIL = 2000

    def __init__(self, password=None):
        self.dir = tempfile.mkdtemp(prefix="lsr")
        # a server a test made and never cleaned up (one that stays down)
        # leaves no directory behind once it is gone
        weakref.finalize(self, shutil.rmtree, self.dir, True)
        self.sock = os.path.join(self.dir, "redis.sock")
        self.log = os.path.join(self.dir, "redis.log")
        self.hold = socket.socket()
        self.hold.bind(("127.0.0.1", 0))
        self.port = self.hold.getsockname()[1]
        self.password = password
        self.proc = None

    def unhold(self):
        """Frees the port for the server about to start."""
        self.hold.close()

    def launch(self, args, what):
        """Frees the port, runs the server (every subclass's start() comes
        here) and waits until it answers; returns self."""
        self.unhold()
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL)
        wait_for(self._ready, what=what)
        return self

    def start(self):
        args = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                "--unixsocket", self.sock, "--unixsocketperm", "700",
                "--save", "", "--appendonly", "no", "--daemonize", "no",
                "--logfile", self.log, "--dir", self.dir]
        if self.password:
            args += ["--requirepass", self.password]
        return self.launch(args, "redis-server on port %d" % self.port)

    def _ready(self):
        if self.proc.poll() is not None:
            raise AssertionError("redis-server exited: %s" % self.tail())
        try:
            c = self.client()
            ok = c.cmd("PING") == "PONG"
            c.close()
            return ok
        except (OSError, ConnectionError):
            return False

    def client(self):
        return Resp(port=self.port, password=self.password)

    def cmd(self, *args):
        c = self.client()
        try:
            return c.cmd(*args)
        finally:
            c.close()

    def cleanup(self):
        self.unhold()
        super().cleanup()


def connections(server):
    """How many connections server (anything with cmd()) has accepted."""
    stats = server.cmd("INFO", "stats")
    return int(stats.split("total_connections_received:")[1].split()[0])


def call_failed(request):
    """Whether the test of a fixture's request failed in its call phase."""
    return bool(getattr(request.node, "rep_call", None) and request.node.rep_call.failed)


def started(request, thing):
    """The body of a fixture around thing (start(), logs(), stop()): yields
    it once started; prints its logs if the test failed; stops it, also
    when start() failed half-way."""
    try:
        thing.start()
        yield thing
        if call_failed(request):
            print(thing.logs())
    finally:
        thing.stop()


def serving(server, request=None, label="server"):
    """The body of a fixture around one server (start(), tail(),
    cleanup()): yields it started; given the fixture's request, prints its
    log's tail, headed label, if the test failed; cleans it up, also when
    start() failed half-way."""
    try:
        yield server.start()
        if request is not None and call_failed(request):
            print("---- %s log ----\n%s" % (label, server.tail()))
    finally:
        server.cleanup()


def start_servers(request, make, label):
    """The body of a fixture starting servers: yields start(*args, **kw),
    which starts make(*args, **kw) and returns it; each one is stopped (by
    pid) when the test ends, with its log, headed label(server), printed
    if the test failed."""
    started = []

    def start(*args, **kw):
        s = make(*args, **kw)
        started.append(s)
        return s.start()
    yield start
    failed = call_failed(request)
    for s in started:
        if failed:
            print("---- %s log ----\n%s" % (label(s), s.tail()))
        s.cleanup()


AUX_SUFFIXES = (":q", ":qx", ":due")
METRICS_PREFIX = "lockshim:metrics:{"  # a host's counts (`lockshim metrics`), kept for good


def namespace_keys(redis, pattern="lockshim:*"):
    """Keys matching pattern but those kept for good: the hosts' count
    hashes, which the shim ships at exit (lockshim metrics), and the
    fencing counters (<key>:f, which never expire)."""
    return [k for k in redis.cmd("KEYS", pattern)
            if not k.startswith(METRICS_PREFIX) and not k.endswith(":f")]


def lock_keys(redis, pattern="lockshim:*"):
    """Lock keys matching pattern, without the short-lived auxiliary keys
    (waiter queues and signal lists) that hang off them, nor the keys kept
    for good (namespace_keys)."""
    return sorted(k for k in namespace_keys(redis, pattern)
                  if not k.endswith(AUX_SUFFIXES) and ":w:" not in k)
