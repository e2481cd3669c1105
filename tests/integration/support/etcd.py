# SPDX-License-Identifier: MIT
"""An etcd server of the test's own: one member with a private --data-dir
in a temporary directory, its client and peer URLs on free 127.0.0.1
ports, started as `etcd ...` and stopped by its pid. keys() and lease_ttl()
read it through its JSON gateway (the same API the module speaks), with
urllib and no proxy. ETCD is None when no server is installed (the tests
skip, saying so).
"""
import base64
import json
import os
import shutil
import socket
import subprocess
import tempfile
import urllib.request

from support.process import ServerProcess
from support.util import wait_for

ETCD = shutil.which("etcd")


def skip_reason():
    """Why the etcd tests cannot run here, or None."""
    if not ETCD:
        return "no etcd server: etcd is missing (apt-get install etcd-server)"
    return None


def _free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _b64(s):
    return base64.b64encode(s.encode() if isinstance(s, str) else s).decode()


class EtcdServer(ServerProcess):
    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="lsetcd")
        self.log = os.path.join(self.dir, "etcd.log")
        self.port = _free_port()
        self.peer = _free_port()
        self.proc = None

    def endpoint(self):
        return "127.0.0.1:%d" % self.port

    def start(self):
        client = "http://127.0.0.1:%d" % self.port
        peer = "http://127.0.0.1:%d" % self.peer
        logf = open(self.log, "a")
        self.proc = subprocess.Popen(
            [ETCD, "--name", "t", "--data-dir", os.path.join(self.dir, "data"),
             "--listen-client-urls", client, "--advertise-client-urls", client,
             "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
             "--initial-cluster", "t=" + peer, "--log-outputs", "stderr"],
            stdin=subprocess.DEVNULL, stdout=logf, stderr=logf, cwd=self.dir)
        logf.close()
        wait_for(self._ready, what="etcd on port %d" % self.port)
        return self

    def _ready(self):
        if self.proc.poll() is not None:
            raise AssertionError("etcd exited: %s" % self.tail())
        try:
            self.call("/v3/maintenance/status", {})
            return True
        except OSError:
            return False

    def call(self, path, body):
        """POSTs body (JSON) to path; returns the decoded reply."""
        req = urllib.request.Request("http://127.0.0.1:%d%s" % (self.port, path),
                                     data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with _OPENER.open(req, timeout=10) as r:
            return json.loads(r.read())

    def keys(self, prefix="/lockshim/"):
        """[(key, value, create_revision, lease id)] under prefix, oldest first."""
        end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
        r = self.call("/v3/kv/range", {"key": _b64(prefix), "range_end": _b64(end),
                                       "sort_order": "ASCEND", "sort_target": "CREATE"})
        return [(base64.b64decode(kv["key"]).decode(errors="replace"),
                 base64.b64decode(kv.get("value", "")).decode(errors="replace"),
                 int(kv["create_revision"]), int(kv.get("lease", 0)))
                for kv in r.get("kvs", [])]

    def lease_ttl(self, lease):
        """(granted TTL, remaining TTL) of lease, in seconds (-1: gone)."""
        r = self.call("/v3/lease/timetolive", {"ID": str(lease)})
        return int(r.get("grantedTTL", 0)), int(r.get("TTL", 0))

    def cleanup(self):
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
