# SPDX-License-Identifier: MIT
"""TLS with the topologies of several servers: `redis.tls` applies to every
connection of a Redis Cluster and of Redlock's masters.

The servers are support/tls.py's TLS-only redis-servers with its PKI (a
certificate for IP:127.0.0.1, which every node announces); a cluster's
nodes also speak TLS on their bus (`tls-cluster yes`), so CLUSTER SLOTS
names their TLS ports, and `redis-cli --tls --cluster create` joins them.

1. Redlock over three TLS masters: processes x threads on one counter,
   exact; every master took TLS connections; `lockshim check` self-tests
   each master; a config without `tls` fails naming every master.
2. A cluster of three TLS primaries: counters whose keys hash to every
   primary, each exact; `lockshim check` names every primary.
"""
import os
import subprocess

import pytest

from resp import free_port
from support.server import connections, start_servers
from support.tls import TlsServer
from support.topology import NSLOTS, keyslot, lock_key
from support.util import CLI, TIMEOUT, run, wait_for
from support.workers import calls, race

LOCK = ('locks = ( { symbol = "ledger_update"; key = "{arg0:str}"; lease_ms = 5000; '
        'wait_ms = 30000; } );\n')


@pytest.fixture
def tls_nodes(request, pki):
    """Starts TLS redis-servers with extra arguments; each is stopped by pid
    when the test ends, its log printed if the test failed."""
    yield from start_servers(request, lambda *extra: TlsServer(pki, extra=extra),
                             lambda s: "redis-server (TLS) %d" % s.port)


def check(cfg):
    """`lockshim check -c cfg`, without the shim."""
    return run([CLI, "check", "-c", cfg])


def write_cfg(tmp_path, topology, tls):
    path = os.path.join(str(tmp_path), "lockshim.cfg")
    with open(path, "w") as f:
        f.write("redis = { %s connect_timeout_ms = 2000; command_timeout_ms = 2000; %s };\n%s"
                % (topology, tls, LOCK))
    return path


# ---- 1. Redlock ----------------------------------------------------------------------


def masters_cfg(tmp_path, servers, tls):
    masters = ", ".join('{ host = "127.0.0.1"; port = %d; }' % s.port for s in servers)
    return write_cfg(tmp_path, "masters = ( %s );" % masters, tls)


def test_redlock_over_tls(progs, tls_nodes, pki, tmp_path):
    servers = [tls_nodes() for _ in range(3)]
    before = [connections(s) for s in servers]
    cfg = masters_cfg(tmp_path, servers, 'tls = { ca_file = "%s"; };' % pki["ca"])
    assert race(progs["ledger"], "direct", str(tmp_path / "c"), cfg, procs=3, iters=10,
                threads=2) == 60
    assert all(connections(s) > b + 3 for s, b in zip(servers, before))
    r = check(cfg)
    assert r.returncode == 0, (r.stdout, r.stderr)
    for s in servers:
        assert "127.0.0.1:%d" % s.port in r.stdout, r.stdout


def test_redlock_without_tls_names_every_master(tls_nodes, tmp_path):
    servers = [tls_nodes() for _ in range(3)]
    r = check(masters_cfg(tmp_path, servers, ""))
    assert r.returncode == 69, (r.stdout, r.stderr)
    for s in servers:
        assert "127.0.0.1:%d" % s.port in r.stdout + r.stderr, (r.stdout, r.stderr)


# ---- 2. Redis Cluster --------------------------------------------------------------------


def tls_cli(pki):
    return ["redis-cli", "--tls", "--cacert", pki["ca"]]


def slots_ok(pki, server):
    r = subprocess.run(tls_cli(pki) + ["-p", str(server.port), "CLUSTER", "INFO"],
                       capture_output=True, text=True, timeout=TIMEOUT,
                       stdin=subprocess.DEVNULL)
    return "cluster_state:ok" in r.stdout and "cluster_slots_ok:%d" % NSLOTS in r.stdout


def test_cluster_over_tls(progs, tls_nodes, pki, tmp_path):
    nodes = []
    for _ in range(3):
        d = free_port()
        nodes.append(tls_nodes("--cluster-enabled", "yes", "--tls-cluster", "yes",
                               "--cluster-port", str(d), "--cluster-node-timeout", "1000",
                               "--cluster-config-file", "nodes-%d.conf" % d))
    r = subprocess.run(tls_cli(pki) + ["--cluster", "create"] +
                       ["127.0.0.1:%d" % n.port for n in nodes] +
                       ["--cluster-replicas", "0", "--cluster-yes"],
                       capture_output=True, text=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, (r.stdout, r.stderr)
    wait_for(lambda: all(slots_ok(pki, n) for n in nodes), timeout=30,
             what="cluster_state:ok on every TLS node")
    cfg = write_cfg(tmp_path, 'cluster = ( "127.0.0.1:%d" );' % nodes[0].port,
                    'tls = { ca_file = "%s"; };' % pki["ca"])
    paths = spread_paths(tmp_path, nodes)
    for p in paths:
        assert race(progs["ledger"], "direct", p, cfg, procs=2, iters=10, threads=2) == 40
    assert all(calls(n, "set") >= 40 for n in nodes), [calls(n, "set") for n in nodes]
    r = check(cfg)
    assert r.returncode == 0, (r.stdout, r.stderr)
    for n in nodes:
        assert "127.0.0.1:%d" % n.port in r.stdout, r.stdout


def spread_paths(tmp_path, nodes):
    """One counter path per node, whose lock key's slot that node serves
    (as its own CLUSTER NODES line says)."""
    owned = []
    for n in nodes:
        mine = next(l for l in n.cmd("CLUSTER", "NODES").splitlines() if "myself" in l)
        slots = set()
        for r in mine.split()[8:]:
            a, _, b = r.partition("-")
            slots.update(range(int(a), int(b or a) + 1))
        owned.append(slots)
    found = [None] * len(nodes)
    for i in range(10000):
        path = str(tmp_path / ("c%d" % i))
        slot = keyslot(lock_key(path))
        k = next(j for j, o in enumerate(owned) if slot in o)
        found[k] = found[k] or path
        if all(found):
            return found
    raise AssertionError("no paths spreading over %d nodes" % len(nodes))
