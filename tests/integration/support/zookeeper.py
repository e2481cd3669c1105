# SPDX-License-Identifier: MIT
"""A ZooKeeper server of the test's own: Debian's zookeeper jar (3.8) run
by openjdk's java as a standalone server (ZooKeeperServerMain) with a
generated zoo.cfg: dataDir in a temporary directory, a free 127.0.0.1
clientPort, the admin server off, no four-letter words but `ruok`/`cons`.
Started as a child of the test, stopped by its pid. children() lists the
znodes under a path with the jar's own CLI class (no client library in
Python). JAR is None when the server is not installed (the tests skip,
saying so). A 3-member ensemble is for a later step.
"""
import glob
import os
import shutil
import socket
import subprocess
import tempfile

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


class ZookeeperServer(ServerProcess):
    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="lszk")
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        self.port = s.getsockname()[1]
        s.close()
        self.cfg = os.path.join(self.dir, "zoo.cfg")
        self.log = os.path.join(self.dir, "zookeeper.log")
        with open(self.cfg, "w") as f:
            f.write("tickTime=500\n"
                    "minSessionTimeout=1000\n"
                    "maxSessionTimeout=60000\n"
                    "dataDir=%s\n"
                    "clientPort=%d\n"
                    "clientPortAddress=127.0.0.1\n"
                    "admin.enableServer=false\n"
                    "4lw.commands.whitelist=ruok,cons\n"
                    "forceSync=no\n" % (os.path.join(self.dir, "data"), self.port))
        self.proc = None

    def hosts(self):
        return "127.0.0.1:%d" % self.port

    def start(self):
        logf = open(self.log, "a")
        self.proc = subprocess.Popen(
            [JAVA, "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
             "-Dzookeeper.admin.enableServer=false", "-cp", _classpath(),
             "org.apache.zookeeper.server.ZooKeeperServerMain", self.cfg],
            stdin=subprocess.DEVNULL, stdout=logf, stderr=logf, cwd=self.dir,
            env=_plain_env())
        logf.close()
        wait_for(self._ready, timeout=60, what="zookeeper on port %d" % self.port)
        return self

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
        for line in self.cli("ls", path).splitlines():
            line = line.strip()
            if line.startswith("[") and line.endswith("]"):
                inner = line[1:-1].strip()
                return [c.strip() for c in inner.split(",")] if inner else []
        return []


def _plain_env():
    env = dict(os.environ)
    for k in ("LD_PRELOAD", "LOCKSHIM_CONFIG"):
        env.pop(k, None)
    return env
