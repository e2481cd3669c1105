# SPDX-License-Identifier: MIT
"""Hosts without containers: network namespaces as stand-in hosts.

Redis runs in a namespace of its own behind a bridge (10.231.0.1); each
stand-in host is a namespace joined to that bridge by a veth pair
(10.231.0.2, 10.231.0.3) whose programs run with a host name of their own
(`unshare --uts` inside `ip netns exec`), and both post to one ledger file
(a file system they share, as hosts share NFS). Addresses exist only inside
the namespaces; the test creates and deletes them all, also on failure.

1. the example job (examples/ledger.c, batch.c), 3 copies per host: without
   the shim it loses updates (the control), with the shipped
   examples/ledger.cfg (its key has no {host}) it loses none; the control
   with {host} in the key loses updates under the shim too: each host then
   has a lock of its own;
2. `lockshim status` lists a lock held on each host with that host's name
   and the holder's pid;
3. no key shipped (configs, examples, README, doc/) contains {host}.
"""
import glob
import os
import re
import secrets
import shutil
import subprocess

import pytest

from support.util import ASAN, CLI, MULT, ROOT, TIMEOUT, TSAN, shim_env, wait_for

pytestmark = pytest.mark.skipif(ASAN or TSAN, reason="the plain build is enough here")

REDIS_IP = "10.231.0.1"
HOSTS = {"a": "10.231.0.2", "b": "10.231.0.3"}
PROCS, ENTRIES = 3, 40


def ip(*args, check=True):
    r = subprocess.run(["ip"] + list(args), capture_output=True, text=True, timeout=TIMEOUT)
    assert not check or r.returncode == 0, (args, r.stderr)
    return r


@pytest.fixture
def net(tmp_path):
    """The namespaces ({"redis": name, "a": name, "b": name}) with Redis
    running in the first; all deleted at the end (processes started with
    net["start"] are killed first)."""
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    for tool in ("ip", "unshare", "hostname", "redis-server", "redis-cli"):
        if not shutil.which(tool):
            pytest.skip(tool + " is not installed (scripts/install-deps.sh installs it)")
    probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "true"],
                           capture_output=True, text=True)
    if probe.returncode:
        # a chroot (/ no mount point): ip netns would bind-mount the root's
        # /run/netns in the machine's mount namespace, and the root could
        # not be removed afterwards
        pytest.skip("cannot make a private mount namespace here: " + probe.stderr.strip())
    tag = "lockshim-%d-%s" % (os.getpid(), secrets.token_hex(2))
    ns = {k: "%s-%s" % (tag, k) for k in ("redis", "a", "b")}
    procs = []
    made = []
    try:
        for name in ns.values():
            r = ip("netns", "add", name, check=False)
            if r.returncode:
                pytest.skip("cannot make a network namespace here: " + r.stderr.strip())
            made.append(name)
            ip("-n", name, "link", "set", "lo", "up")
        ip("-n", ns["redis"], "link", "add", "br0", "type", "bridge")
        ip("-n", ns["redis"], "addr", "add", REDIS_IP + "/24", "dev", "br0")
        ip("-n", ns["redis"], "link", "set", "br0", "up")
        for h, addr in HOSTS.items():
            ip("link", "add", "eth0", "netns", ns[h], "type", "veth",
               "peer", "name", "v" + h, "netns", ns["redis"])
            ip("-n", ns["redis"], "link", "set", "v" + h, "master", "br0", "up")
            ip("-n", ns[h], "addr", "add", addr + "/24", "dev", "eth0")
            ip("-n", ns[h], "link", "set", "eth0", "up")
        log = str(tmp_path / "redis.log")
        procs.append(subprocess.Popen(
            ["ip", "netns", "exec", ns["redis"], "redis-server", "--bind", REDIS_IP,
             "--port", "6379", "--protected-mode", "no", "--save", "", "--appendonly", "no",
             "--logfile", log]))

        def ping(where):
            return subprocess.run(["ip", "netns", "exec", where, "redis-cli", "-h", REDIS_IP,
                                   "ping"], capture_output=True, text=True).stdout.strip()
        wait_for(lambda: all(ping(ns[h]) == "PONG" for h in HOSTS), what="Redis from both hosts")

        def start(host, name, argv, cfg=None, **kw):
            """Runs argv in stand-in host `host` named `name` (under the
            shim with cfg); returns the Popen (its pid is argv's)."""
            p = subprocess.Popen(["ip", "netns", "exec", ns[host], "unshare", "--uts", "sh", "-c",
                                  'hostname "$0" && exec "$@"', name] + argv,
                                 env=shim_env(cfg, cfg is not None), **kw)
            procs.append(p)
            return p
        ns["start"] = start
        yield ns
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        for name in made:
            ip("netns", "del", name, check=False)
        if os.path.exists(str(tmp_path / "redis.log")):
            print("---- redis-server log ----\n" + open(str(tmp_path / "redis.log")).read())


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    """examples/ledger.c and batch.c built as make demo builds them."""
    d = str(tmp_path_factory.mktemp("ledger"))
    ex = os.path.join(ROOT, "examples")
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", d + "/libledger.so",
                    ex + "/ledger.c"], check=True)
    subprocess.run(["cc", "-O2", "-o", d + "/batch", ex + "/batch.c", "-L" + d, "-lledger",
                    "-Wl,-rpath," + d], check=True)
    return d + "/batch"


def ledger_cfg(tmp_path, key=None):
    """examples/ledger.cfg with Redis at REDIS_IP (and key, if given)."""
    with open(os.path.join(ROOT, "examples", "ledger.cfg")) as f:
        text = f.read()
    text = re.sub(r"(?m)^redis = .*$", 'redis = { host = "%s"; port = 6379; };' % REDIS_IP, text)
    if key:
        text, n = re.subn(r'key = "[^"]*"', 'key = "%s"' % key, text)
        assert n == 1
    path = tmp_path / ("ledger-%s.cfg" % ("shipped" if key is None else "control"))
    path.write_text(text)
    return str(path)


def post(net, batch, tmp_path, name, cfg):
    """Both hosts run PROCS copies of batch at once (after a go file);
    returns the ledger's balance."""
    ledger, go = tmp_path / ("ledger-" + name), tmp_path / (name + ".go")
    ledger.write_text("0\n")
    script = ('until [ -e "$1" ]; do sleep 0.01; done; pids=; for i in $(seq %d); do '
              '"$2" "$3" %d & pids="$pids $!"; done; rc=0; for p in $pids; do wait $p || rc=1; '
              'done; exit $rc' % (PROCS, ENTRIES))
    hosts = [net["start"](h, "standin-" + h, ["sh", "-c", script, "sh", str(go), batch,
                                              str(ledger)], cfg, stderr=subprocess.PIPE,
                          text=True) for h in HOSTS]
    go.write_text("")
    for p in hosts:
        _, err = p.communicate(timeout=120 * MULT)
        assert p.returncode == 0, err
    return int(ledger.read_text())


@pytest.mark.timing
def test_standin_hosts_exclude_each_other_with_a_shared_key(net, batch, tmp_path):
    expected = len(HOSTS) * PROCS * ENTRIES
    plain = post(net, batch, tmp_path, "plain", None)
    assert plain < expected, plain  # the control: the race loses updates
    shipped = ledger_cfg(tmp_path)
    [key] = re.findall(r'key = "([^"]*)"', open(shipped).read())
    assert "{host}" not in key, key
    assert post(net, batch, tmp_path, "guarded", shipped) == expected
    # The control for the key: with {host} in it each host takes its own
    # lock, and the two hosts overwrite each other's updates.
    per_host = ledger_cfg(tmp_path, "ledger:{host}:{arg0:str}")
    assert post(net, batch, tmp_path, "per-host", per_host) < expected


def test_status_shows_both_host_names(net, progs, tmp_path):
    cfg = tmp_path / "hold.cfg"
    cfg.write_text('redis = { host = "%s"; port = 6379; };\n'
                   'locks = ( { symbol = "hold_call"; key = "hold:{arg0}"; } );\n' % REDIS_IP)
    holders = {h: net["start"](h, "standin-" + h, [progs["driver"], "call:%d" % (600000 + i)],
                               str(cfg), stdout=subprocess.PIPE, text=True)
               for i, h in enumerate(HOSTS)}
    for p in holders.values():
        assert p.stdout.readline().startswith("enter "), "a holder did not enter"

    def listed():
        r = subprocess.run(["ip", "netns", "exec", net["a"], CLI, "status", "-c", str(cfg)],
                           capture_output=True, text=True, timeout=TIMEOUT)
        assert r.returncode == 0, r.stderr
        return r.stdout
    out = listed()
    for i, h in enumerate(HOSTS):
        [line] = [l for l in out.splitlines() if "hold:%d" % (600000 + i) in l]
        assert re.search(r"  held by standin-%s pid %d " % (h, holders[h].pid), line), out
    assert os.uname().nodename not in out


def test_no_shipped_key_has_host():
    """Shipped keys are meant to be shared by hosts and containers, where
    {host} would give each its own lock (the control above)."""
    files = [p for pattern in ("config/**/*.cfg", "examples/**/*", "README.md", "doc/*.md",
                               "doc/*.scd") for p in glob.glob(os.path.join(ROOT, pattern),
                                                                 recursive=True)
             if os.path.isfile(p)]
    keys = []
    for p in files:
        with open(p, errors="replace") as f:
            keys += [(os.path.relpath(p, ROOT), k) for k in re.findall(r'key\s*=\s*"([^"]*)"',
                                                                       f.read())]
    assert len(keys) >= 5 and ("examples/ledger.cfg", "ledger:{arg0:str}") in keys, keys
    assert [k for k in keys if "{host}" in k[1]] == []
