# SPDX-License-Identifier: MIT
"""Servers of several nodes, started on 127.0.0.1 free ports: Redis
Sentinel (a primary, two replicas, three sentinels), Redis Cluster (its
slot map computed here), and Redlock's independent masters.

Every node is a redis-server whose process is recorded as soon as it
starts, so stop() ends whatever was started (by pid, after a SIGCONT in
case a test froze it); the builders wait for their topology to be ready
by polling the nodes, never by sleeping. A test's fixture wraps them with
conftest.started (start, yield, logs on failure, stop).
"""
import os
import shutil
import signal
import subprocess

from resp import Resp, RespError, free_port
from support.server import RedisServer, namespace_keys
from support.util import TIMEOUT, wait_for

MASTER = "locks"  # the name the sentinels monitor the primary by
FAST = "connect_timeout_ms = 500; command_timeout_ms = 500;"
NSLOTS = 16384  # Redis Cluster's hash slots


# ---- one node ------------------------------------------------------------------

def stop_pid(proc):
    """Stops one process we started, by its pid: SIGCONT first (it may be
    frozen), then SIGTERM, then SIGKILL."""
    if proc is None or proc.poll() is not None:
        return
    try:
        os.kill(proc.pid, signal.SIGCONT)
        proc.terminate()
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    except OSError:
        pass


class Node(RedisServer):
    """A redis-server (data node or sentinel) on 127.0.0.1 with extra arguments."""

    def __init__(self, *extra, name="node", password=None):
        super().__init__(password=password)
        self.extra = list(extra)
        self.name = name

    def args(self):
        return ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                "--save", "", "--appendonly", "no", "--daemonize", "no",
                "--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0",
                "--logfile", self.log, "--dir", self.dir] + self.extra + \
            (["--requirepass", self.password, "--masterauth", self.password]
             if self.password else [])

    def start(self):
        return self.launch(self.args(), "%s on port %d" % (self.name, self.port))

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def client(self, timeout=2):
        return Resp(port=self.port, timeout=timeout, password=self.password)

    def info(self, section="replication"):
        return dict(l.split(":", 1) for l in self.cmd("INFO", section).splitlines()
                    if ":" in l)

    def role(self):
        return self.info()["role"]

    def freeze(self):
        os.kill(self.proc.pid, signal.SIGSTOP)

    def thaw(self):
        if self.alive():
            os.kill(self.proc.pid, signal.SIGCONT)

    def stop(self):
        stop_pid(self.proc)


# ---- Sentinel -------------------------------------------------------------------

class Sentinel(Node):
    """A sentinel; password: its own requirepass (the sentinels share it);
    data_password: the data nodes' (auth-pass)."""

    def __init__(self, primary_port, password=None, data_password=None):
        super().__init__(name="sentinel", password=password)
        self.conf = os.path.join(self.dir, "sentinel.conf")
        with open(self.conf, "w") as f:
            f.write("port %d\nbind 127.0.0.1\ndaemonize no\nlogfile %s\ndir %s\n"
                    "sentinel monitor %s 127.0.0.1 %d 2\n"
                    "sentinel down-after-milliseconds %s 1000\n"
                    "sentinel failover-timeout %s 5000\n"
                    "sentinel parallel-syncs %s 2\n"
                    % (self.port, self.log, self.dir, MASTER, primary_port, MASTER, MASTER,
                       MASTER))
            if password:
                f.write("requirepass %s\n" % password)
            if data_password:
                f.write("sentinel auth-pass %s %s\n" % (MASTER, data_password))

    def args(self):
        return ["redis-server", self.conf, "--sentinel"]

    def addr(self):
        return "127.0.0.1:%d" % self.port

    def master_addr(self):
        a = self.cmd("SENTINEL", "get-master-addr-by-name", MASTER)
        return (a[0], int(a[1])) if a else None


def pairs(flat):
    return dict(zip(flat[::2], flat[1::2]))


class Topology:
    """A primary, two replicas and three sentinels; processes are recorded as
    soon as they start, so teardown stops whatever was started."""

    def __init__(self, password=None, sentinel_password=None):
        self.nodes = []
        self.sentinels = []
        self.out = set()   # sentinels killed or frozen by the test: not asked
        self.password = password
        self.sentinel_password = sentinel_password

    def start(self):
        primary = Node(name="primary", password=self.password)
        self.nodes.append(primary)
        primary.start()
        for i in range(2):
            r = Node("--replicaof", "127.0.0.1", str(primary.port), name="replica%d" % i,
                     password=self.password)
            self.nodes.append(r)
            r.start()
        wait_for(lambda: all(r.info().get("master_link_status") == "up" for r in self.nodes[1:]),
                 timeout=30, what="both replicas linked to the primary")
        for _ in range(3):
            s = Sentinel(primary.port, self.sentinel_password, self.password)
            self.sentinels.append(s)
            s.start()
        wait_for(self.healthy, timeout=60, what="every sentinel to see 2 replicas and 2 sentinels")
        return self

    def healthy(self):
        for s in self.sentinels:
            replicas = [pairs(r) for r in s.cmd("SENTINEL", "REPLICAS", MASTER)]
            if len(replicas) != 2 or any(r["flags"] != "slave" for r in replicas):
                return False
            if len(s.cmd("SENTINEL", "SENTINELS", MASTER)) != 2:
                return False
        return all(r.info().get("master_link_status") == "up" for r in self.replicas())

    def asked(self):
        return [s for s in self.sentinels if s not in self.out and s.alive()]

    def by_port(self, port):
        return next(n for n in self.nodes if n.port == port)

    def primary(self):
        """The node the (first answering) sentinel names as the primary."""
        for s in self.asked():
            try:
                addr = s.master_addr()
            except (OSError, ConnectionError, RespError):
                continue
            if addr:
                return self.by_port(addr[1])
        raise AssertionError("no sentinel names a primary")

    def replicas(self):
        p = self.primary()
        return [n for n in self.nodes if n is not p and n.alive()]

    def failover_done(self, old):
        """The new primary once every asked sentinel names the same node
        other than old, it says role:master and old, if alive, is a replica."""
        try:
            addrs = {s.master_addr() for s in self.asked()}
            if len(addrs) != 1:
                return None
            port = addrs.pop()[1]
            if port == old.port:
                return None
            new = self.by_port(port)
            if new.role() != "master":
                return None
            if old.alive() and old.role() != "slave":
                return None
            return new
        except (OSError, ConnectionError, RespError):
            return None

    def wait_failover(self, old, timeout=60):
        return wait_for(lambda: self.failover_done(old), timeout=timeout,
                        what="the failover away from port %d to finish" % old.port)

    def sentinel_list(self, first=None):
        order = ([first] if first else []) + [s for s in self.sentinels if s is not first]
        return ", ".join('"%s"' % s.addr() for s in order)

    def config(self, tmp_path, body, extra="", first=None, name="lockshim.cfg"):
        path = os.path.join(str(tmp_path), name)
        with open(path, "w") as f:
            f.write('redis = { sentinels = ( %s ); master_name = "%s"; %s %s };\n%s'
                    % (self.sentinel_list(first), MASTER, FAST, extra, body))
        return path

    def logs(self):
        return "\n".join("---- %s %d ----\n%s" % (n.name, n.port, n.tail())
                         for n in self.nodes + self.sentinels)

    def stop(self):
        for n in self.sentinels + self.nodes:
            n.stop()
        for n in self.sentinels + self.nodes:
            shutil.rmtree(n.dir, ignore_errors=True)


# ---- Redis Cluster: slots ----------------------------------------------------------

def crc16(data):
    """CRC16-CCITT (XMODEM), Redis Cluster's key hash."""
    crc = 0
    for b in data:
        crc ^= b << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc


def keyslot(key):
    """The slot of key: the hash of its hash tag (the bytes between the first
    "{" and the first "}" after it, when not empty), else of the whole key."""
    k = key.encode() if isinstance(key, str) else key
    s = k.find(b"{")
    if s >= 0:
        e = k.find(b"}", s + 1)
        if e > s + 1:
            k = k[s + 1:e]
    return crc16(k) % NSLOTS


def lock_key(expanded, ns="lockshim"):
    """The cluster layout of a lock key."""
    return "%s:{%s}" % (ns, expanded)


# ---- Redis Cluster: nodes ----------------------------------------------------------

class ClusterNode(Node):
    """A cluster-enabled redis-server; its bus port is a free port of its own
    (the default, port + 10000, may be taken or above 65535)."""

    def __init__(self, name):
        super().__init__(name=name)
        self.id = None
        self.ports()

    def ports(self, new=False):
        if new:
            self.port = free_port()
        self.bus = free_port()
        self.extra = ["--cluster-enabled", "yes", "--cluster-port", str(self.bus),
                      "--cluster-config-file", os.path.join(self.dir, "nodes-%d.conf" % self.port),
                      "--cluster-node-timeout", "1000"]

    def start(self):
        """Starts the node; when a port it was given was taken meanwhile
        (by another program between free_port() and the bind), again on
        new ports."""
        for attempt in range(5):
            try:
                return super().start()
            except AssertionError:
                if self.alive() or "Address already in use" not in self.tail() or attempt == 4:
                    raise
            os.unlink(self.log)
            self.ports(new=True)

    def addr(self):
        return "127.0.0.1:%d" % self.port

    def cluster_info(self):
        return dict(l.split(":", 1) for l in self.cmd("CLUSTER", "INFO").splitlines()
                    if ":" in l)

    def kill(self):
        """SIGKILL, as a crash."""
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


class Cluster:
    """primaries primaries with replicas replicas each; nodes are recorded as
    soon as they start, so teardown stops whatever was started."""

    def __init__(self, primaries=3, replicas=1):
        self.nprimaries = primaries
        self.nreplicas = replicas
        self.nodes = []

    def start(self):
        for i in range(self.nprimaries * (1 + self.nreplicas)):
            n = ClusterNode("node%d" % i)
            self.nodes.append(n)
            n.start()
        r = subprocess.run(["redis-cli", "--cluster", "create"] +
                           [n.addr() for n in self.nodes] +
                           ["--cluster-replicas", str(self.nreplicas), "--cluster-yes"],
                           capture_output=True, text=True, timeout=TIMEOUT,
                           stdin=subprocess.DEVNULL)
        assert r.returncode == 0, (r.stdout, r.stderr)
        wait_for(self.healthy, timeout=30, what="cluster_state:ok on every node")
        for n in self.nodes:
            n.id = n.cmd("CLUSTER", "MYID")
        return self

    def alive(self):
        return [n for n in self.nodes if n.alive()]

    def healthy(self):
        """Every live node says the cluster is ok with every slot served and
        knows every live node, and sees as many live primaries as there are
        (gossip tells a node late that a new replica is not a primary any
        more); every live replica's link is up."""
        try:
            for n in self.alive():
                info = n.cluster_info()
                if (info.get("cluster_state") != "ok" or
                        info.get("cluster_slots_ok") != str(NSLOTS) or
                        int(info.get("cluster_known_nodes", 0)) < len(self.nodes)):
                    return False
                if sum("master" in v["flags"] and "fail" not in v["flags"]
                       for v in self.view(n)) != self.nprimaries:
                    return False
                rep = n.info()
                if rep["role"] == "slave" and rep.get("master_link_status") != "up":
                    return False
            return len(self.primaries()) == self.nprimaries
        except (OSError, ConnectionError, RespError):
            return False

    def view(self, asker=None):
        """CLUSTER NODES as seen by asker (default: the first live node): a
        list of dicts id, port, flags, master (id or "-"), slots (ints)."""
        asker = asker or self.alive()[0]
        out = []
        for line in asker.cmd("CLUSTER", "NODES").splitlines():
            f = line.split()
            slots = set()
            for r in f[8:]:
                if r.startswith("["):
                    continue  # a slot being imported or migrated
                a, _, b = r.partition("-")
                slots.update(range(int(a), int(b or a) + 1))
            out.append(dict(id=f[0], port=int(f[1].split("@")[0].rsplit(":", 1)[1]),
                            flags=f[2].split(","), master=f[3], slots=slots))
        return out

    def by_id(self, node_id):
        return next(n for n in self.nodes if n.id == node_id)

    def by_port(self, port):
        return next(n for n in self.nodes if n.port == port)

    def primaries(self, asker=None):
        """The live primaries serving slots, in slot order."""
        ps = [v for v in self.view(asker) if "master" in v["flags"] and "fail" not in v["flags"]
              and v["slots"]]
        return [self.by_port(v["port"]) for v in sorted(ps, key=lambda v: min(v["slots"]))]

    def owner(self, slot, asker=None):
        for v in self.view(asker):
            if slot in v["slots"] and "master" in v["flags"] and "fail" not in v["flags"]:
                return self.by_port(v["port"])
        raise AssertionError("no primary serves slot %d" % slot)

    def replica_of(self, primary):
        """The replica of primary, as the replica itself says (the
        primary's own view of its replicas can lag behind the gossip)."""
        def find():
            for n in self.alive():
                me = next(v for v in self.view(n) if "myself" in v["flags"])
                if me["master"] == primary.id:
                    return n
            return None
        wait_for(lambda: find() is not None, what="a replica of %d" % primary.port)
        return find()

    def config(self, tmp_path, body, extra="", name="lockshim.cfg", seeds=None):
        path = os.path.join(str(tmp_path), name)
        seeds = seeds or self.nodes
        with open(path, "w") as f:
            f.write('redis = { cluster = ( %s ); %s %s };\n%s'
                    % (", ".join('"%s"' % n.addr() for n in seeds), FAST, extra, body))
        return path

    def keys(self, pattern="lockshim:*"):
        """{port: sorted keys matching pattern} for every live primary, but
        those kept for good (namespace_keys: count hashes, fencing counters)."""
        return {p.port: sorted(namespace_keys(p, pattern)) for p in self.primaries()}

    def logs(self):
        return "\n".join("---- %s %d ----\n%s" % (n.name, n.port, n.tail()) for n in self.nodes)

    def stop(self):
        for n in self.nodes:
            n.stop()
        for n in self.nodes:
            shutil.rmtree(n.dir, ignore_errors=True)


# ---- Redlock's masters ----------------------------------------------------------

class Masters:
    """n masters (3 unless start() is told); each is a Node recorded as it
    starts."""

    def __init__(self, n=3):
        self.n = n
        self.nodes = []

    def start(self, n=None):
        for i in range(self.n if n is None else n):
            m = Node(name="master%d" % i)
            self.nodes.append(m)
            m.start()
        return self

    def addr(self, i):
        return "127.0.0.1:%d" % self.nodes[i].port

    def config(self, tmp_path, body, ports=None, extra=FAST, name="lockshim.cfg"):
        """Writes a config naming every master (ports: their ports, in order,
        for a proxy in front of one); returns its path."""
        ports = ports or [m.port for m in self.nodes]
        masters = ", ".join('{ host = "127.0.0.1"; port = %d; }' % p for p in ports)
        path = os.path.join(str(tmp_path), name)
        with open(path, "w") as f:
            f.write("redis = { masters = ( %s ); %s };\n%s" % (masters, extra, body))
        return path

    def restart(self, i):
        """SIGKILLs master i and starts it again, empty, on the same port."""
        m = self.nodes[i]
        m.proc.kill()
        m.proc.wait()
        m.start()

    def logs(self):
        return "\n".join("---- %s %d ----\n%s" % (m.name, m.port, m.tail())
                         for m in self.nodes)

    def stop(self):
        for m in self.nodes:
            m.cleanup()
