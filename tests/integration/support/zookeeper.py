# SPDX-License-Identifier: MIT
"""A ZooKeeper server of the test's own: Debian's zookeeper jar (3.8) run
by openjdk's java as a standalone server (ZooKeeperServerMain) with a
generated zoo.cfg: dataDir in a temporary directory, a free 127.0.0.1
clientPort, the admin server off, no four-letter words but `ruok`/`cons`.
Started as a child of the test, stopped by its pid. children() lists the
znodes under a path with the jar's own CLI class (no client library in
Python). JAR is None when the server is not installed (the tests skip,
saying so).

Ensemble: three members (QuorumPeerMain) on 127.0.0.1, each with its own
dataDir and myid, client port, and quorum and election ports (server.N
lines); `srvr` tells each one's mode, so leader() finds the leader and
kill() SIGKILLs one member by its pid.
"""
import os
import shutil
import socket
import subprocess
import tempfile

from resp import free_port
from support.process import ServerProcess
from support.util import wait_for

_JAVA_DIR = "/usr/share/java"
JAR = os.path.join(_JAVA_DIR, "zookeeper.jar") if os.path.exists(
    os.path.join(_JAVA_DIR, "zookeeper.jar")) else None
JAVA = shutil.which("java")
# What the server needs beside its jar (Debian's zkEnv.sh puts all of
# /usr/share/java's on the class path; these are enough).
_DEPS = ("zookeeper-jute.jar", "slf4j-api.jar", "slf4j-simple.jar", "netty-handler.jar",
         "netty-common.jar", "netty-buffer.jar", "netty-transport.jar", "netty-codec.jar",
         "netty-resolver.jar", "netty-transport-native-epoll.jar",
         "netty-transport-native-unix-common.jar", "metrics-core.jar", "commons-io.jar",
         "snappy-java.jar", "commons-cli.jar")


def skip_reason():
    """Why the zookeeper tests cannot run here, or None."""
    if not JAR:
        return "no ZooKeeper server: /usr/share/java/zookeeper.jar is missing " \
               "(apt-get install zookeeper)"
    if not JAVA:
        return "no java to run the ZooKeeper server (apt-get install openjdk-17-jre-headless)"
    return None


def _classpath():
    jars = [JAR] + [os.path.join(_JAVA_DIR, j) for j in _DEPS
                    if os.path.exists(os.path.join(_JAVA_DIR, j))]
    return ":".join(jars)


# every member's settings: a 4 s session is allowed (2 ticks at least)
_CFG = ("tickTime=500\n"
        "minSessionTimeout=1000\n"
        "maxSessionTimeout=60000\n"
        "dataDir=%s\n"
        "clientPort=%d\n"
        "clientPortAddress=127.0.0.1\n"
        "admin.enableServer=false\n"
        "4lw.commands.whitelist=ruok,cons,srvr\n"
        "forceSync=no\n")


class ZookeeperServer(ServerProcess):
    """One server: standalone, or member myid of an ensemble (members: the
    server.N lines of all of them)."""

    MAIN = "org.apache.zookeeper.server.ZooKeeperServerMain"

    def __init__(self, parent=None, myid=None, members=""):
        self.dir = tempfile.mkdtemp(prefix="lszk", dir=parent)
        self.port = free_port()
        self.cfg = os.path.join(self.dir, "zoo.cfg")
        self.log = os.path.join(self.dir, "zookeeper.log")
        data = os.path.join(self.dir, "data")
        with open(self.cfg, "w") as f:
            f.write(_CFG % (data, self.port))
            if myid:
                f.write("initLimit=10\nsyncLimit=4\n" + members)
        if myid:
            os.mkdir(data)
            with open(os.path.join(data, "myid"), "w") as f:
                f.write("%d\n" % myid)
            self.MAIN = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
        self.proc = None

    def hosts(self):
        return "127.0.0.1:%d" % self.port

    def start(self, wait=True, heap="256m"):
        """Starts the server (a member: its ensemble's quorum tells when
        it serves, so the caller waits for them all: wait=False)."""
        logf = open(self.log, "a")
        self.proc = subprocess.Popen(
            [JAVA, "-Xmx" + heap, "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
             "-Dzookeeper.admin.enableServer=false", "-cp", _classpath(), self.MAIN, self.cfg],
            stdin=subprocess.DEVNULL, stdout=logf, stderr=logf, cwd=self.dir,
            env=_plain_env())
        logf.close()
        if wait:
            wait_for(self._ready, timeout=60, what="zookeeper on port %d" % self.port)
        return self

    def mode(self):
        """"leader", "follower", "standalone", or "" (not serving, or down)."""
        for line in self.four("srvr").splitlines():
            if line.startswith("Mode: "):
                return line[6:].strip()
        return ""

    def _ready(self):
        if self.proc.poll() is not None:
            raise AssertionError("zookeeper exited: %s" % self.tail())
        # ruok answers before the server serves: cons tells
        return self.four("ruok") == "imok" and "not currently serving" not in self.four("cons")

    def four(self, word):
        """The server's answer to a four-letter word ("" when refused)."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=5) as s:
                s.sendall(word.encode())
                out = b""
                while True:
                    b = s.recv(4096)
                    if not b:
                        break
                    out += b
            return out.decode(errors="replace")
        except OSError:
            return ""

    def cli(self, *cmd):
        """Runs one zkCli command against the server; returns its stdout."""
        r = subprocess.run(
            [JAVA, "-XX:TieredStopAtLevel=1", "-cp", _classpath(),
             "org.apache.zookeeper.ZooKeeperMain", "-server", self.hosts()] + list(cmd),
            capture_output=True, text=True, env=_plain_env(), timeout=60)
        return r.stdout

    def children(self, path):
        """The names of path's children ([] when it has none or is missing)."""
        return self.listing(path) or []

    def listing(self, path):
        """The names of path's children, or None when the server gave no
        listing (path missing, or the server not serving: an election)."""
        for line in self.cli("ls", path).splitlines():
            line = line.strip()
            if line.startswith("[") and line.endswith("]"):
                inner = line[1:-1].strip()
                return [c.strip() for c in inner.split(",")] if inner else []
        return None


def _plain_env():
    env = dict(os.environ)
    for k in ("LD_PRELOAD", "LOCKSHIM_CONFIG"):
        env.pop(k, None)
    return env


class Ensemble:
    """Three members on 127.0.0.1 (each: a client port, a quorum and an
    election port); hosts() is the client's connect string of all three."""

    SIZE = 3

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="lszkens")
        lines = "".join("server.%d=127.0.0.1:%d:%d\n" % (i, free_port(), free_port())
                        for i in range(1, self.SIZE + 1))
        self.members = [ZookeeperServer(self.dir, i, lines) for i in range(1, self.SIZE + 1)]

    def hosts(self):
        return ",".join(m.hosts() for m in self.members)

    def start(self):
        for m in self.members:
            m.start(wait=False, heap="128m")
        wait_for(lambda: self.leader() is not None and
                 sum(1 for m in self.members if m.mode() == "follower") == self.SIZE - 1,
                 timeout=90, what="a 3-member zookeeper ensemble with its leader")
        return self

    def leader(self):
        """The member now leading, or None."""
        for m in self.members:
            if m.proc and m.proc.poll() is not None:
                raise AssertionError("zookeeper member exited: %s" % m.tail())
            if m.proc and m.mode() == "leader":
                return m
        return None

    def kill(self, member):
        """SIGKILLs member (by its pid) and reaps it."""
        member.proc.kill()
        member.proc.wait()
        member.proc = None

    def children(self, path, but=None):
        """listing() asked of a member that is up (other than but): None
        when it did not answer (it may be electing a leader)."""
        return next(m for m in self.members if m.proc and m is not but).listing(path)

    def cleanup(self):
        for m in self.members:
            m.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
