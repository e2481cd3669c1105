# SPDX-License-Identifier: MIT
"""An etcd server of the test's own: one member with a private --data-dir
in a temporary directory, its client and peer URLs on free 127.0.0.1
ports, started as `etcd ...` and stopped by its pid. keys() and lease_ttl()
read it through its JSON gateway (the same API the module speaks), with
urllib and no proxy. ETCD is None when no server is installed (the tests
skip, saying so).

Cluster: three such members forming one cluster (--initial-cluster naming
all three peer URLs), each with its own data dir; leader() asks each
member's /v3/maintenance/status which one leads (its `leader` is its own
`header.member_id`), and a member is killed or stopped by its pid.
"""
import base64
import json
import os
import shutil
import signal
import subprocess
import tempfile
import urllib.request

from resp import free_port
from support.process import ServerProcess
from support.util import wait_for

ETCD = shutil.which("etcd")


def skip_reason():
    """Why the etcd tests cannot run here, or None."""
    if not ETCD:
        return "no etcd server: etcd is missing (apt-get install etcd-server)"
    return None


_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _b64(s):
    return base64.b64encode(s.encode() if isinstance(s, str) else s).decode()


class EtcdServer(ServerProcess):
    def __init__(self, name="t"):
        self.name = name
        self.dir = tempfile.mkdtemp(prefix="lsetcd")
        self.log = os.path.join(self.dir, "etcd.log")
        self.port = free_port()
        self.peer = free_port()
        self.proc = None

    def endpoint(self):
        return "127.0.0.1:%d" % self.port

    def peer_url(self):
        return "http://127.0.0.1:%d" % self.peer

    def start(self, cluster=None, token="lockshim-test"):
        """Starts this member (cluster: the --initial-cluster string; None,
        a cluster of itself) and, alone, waits until it answers."""
        self.launch(cluster or "%s=%s" % (self.name, self.peer_url()), token)
        if cluster is None:
            wait_for(self._ready, what="etcd on port %d" % self.port)
        return self

    def launch(self, cluster, token):
        client = "http://127.0.0.1:%d" % self.port
        logf = open(self.log, "a")
        self.proc = subprocess.Popen(
            [ETCD, "--name", self.name, "--data-dir", os.path.join(self.dir, "data"),
             "--listen-client-urls", client, "--advertise-client-urls", client,
             "--listen-peer-urls", self.peer_url(),
             "--initial-advertise-peer-urls", self.peer_url(),
             "--initial-cluster", cluster, "--initial-cluster-token", token,
             "--log-outputs", "stderr"],
            stdin=subprocess.DEVNULL, stdout=logf, stderr=logf, cwd=self.dir)
        logf.close()

    def status(self):
        """This member's /v3/maintenance/status reply, or None (down)."""
        if self.proc is None or self.proc.poll() is not None:
            return None
        try:
            return self.call("/v3/maintenance/status", {}, timeout=2)
        except OSError:
            return None

    def _ready(self):
        if self.proc.poll() is not None:
            raise AssertionError("etcd exited: %s" % self.tail())
        return self.status() is not None

    def call(self, path, body, timeout=10):
        """POSTs body (JSON) to path; returns the decoded reply."""
        req = urllib.request.Request("http://127.0.0.1:%d%s" % (self.port, path),
                                     data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with _OPENER.open(req, timeout=timeout) as r:
            return json.loads(r.read())

    def keys(self, prefix="/lockshim/", metrics=False):
        """[(key, value, create_revision, lease id)] under prefix, oldest
        first: the lock keys, or (metrics) the hosts' count keys
        <prefix>%metrics/..., which the shims leave (they have no lease)."""
        end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
        r = self.call("/v3/kv/range", {"key": _b64(prefix), "range_end": _b64(end),
                                       "sort_order": "ASCEND", "sort_target": "CREATE"})
        kvs = [(base64.b64decode(kv["key"]).decode(errors="replace"),
                base64.b64decode(kv.get("value", "")).decode(errors="replace"),
                int(kv["create_revision"]), int(kv.get("lease", 0)))
               for kv in r.get("kvs", [])]
        return [kv for kv in kvs if kv[0].startswith(prefix + "%metrics/") == metrics]

    def lease_ttl(self, lease):
        """(granted TTL, remaining TTL) of lease, in seconds (-1: gone)."""
        r = self.call("/v3/lease/timetolive", {"ID": str(lease)})
        return int(r.get("grantedTTL", 0)), int(r.get("TTL", 0))


class Cluster:
    """Three members on free loopback ports, one --initial-cluster."""

    def __init__(self, n=3):
        self.members = [EtcdServer("m%d" % i) for i in range(n)]

    def start(self):
        """Starts every member; returns once one of them leads and all answer."""
        initial = ",".join("%s=%s" % (m.name, m.peer_url()) for m in self.members)
        token = "lockshim-%d" % self.members[0].port
        for m in self.members:
            m.launch(initial, token)
        wait_for(self._formed, timeout=30, what="a 3-member etcd cluster with a leader")
        return self

    def _formed(self):
        for m in self.members:
            if m.proc.poll() is not None:
                raise AssertionError("etcd %s exited: %s" % (m.name, m.tail()))
        return self.leader() is not None and all(m.status() for m in self.members)

    def endpoints(self, first=None):
        """The members' host:port, first (a member) ahead of the others."""
        ms = sorted(self.members, key=lambda m: m is not first)
        return [m.endpoint() for m in ms]

    def leader(self):
        """The member that leads (the one whose status names itself the
        leader), or None while there is none."""
        for m in self.members:
            st = m.status()
            if st and int(st.get("leader", 0)) and \
                    st["leader"] == st.get("header", {}).get("member_id"):
                return m
        return None

    def alive(self):
        """A member still running, to read keys from."""
        return next(m for m in self.members if m.status())

    def kill(self, member, sig=signal.SIGKILL):
        """Sends sig to member's process (by its pid) and reaps it."""
        member.stop(sig)

    def tail(self):
        return "\n".join("---- %s ----\n%s" % (m.name, m.tail()) for m in self.members)

    def cleanup(self):
        for m in self.members:
            m.cleanup()
