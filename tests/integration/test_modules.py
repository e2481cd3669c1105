# SPDX-License-Identifier: MIT
"""The tests that are the same for every backend built as a module
(issue 23: postgres, zookeeper, etcd), written once and run for each; a
test's id is its backend (test_verbs_not_built_exit_1[etcd-status]).

BACKENDS is one row per backend: its server (support/postgres.py,
support/zookeeper.py, support/etcd.py: one per backend for this file,
skipped with the backend's own reason where it cannot run), its config
writer, its module file, its client library as /proc/PID/maps names it,
the Debian package of that library, the objects the module brings in, and
what its server shows of locks held, keys made and fences given.

Exclusion of processes x threads and of two keys (one control: the same
workload loses updates without the shim), fences increasing, a
Redis-guarded program mapping neither the client library nor the module,
locks on send/write/poll not looping back through the library, the module
or its library missing (one line, 78), the verbs a backend lacks exiting
1, and `lockshim metrics` of the counts each backend keeps its own way.
What differs in substance stays in test_postgres.py, test_zookeeper.py
and test_etcd.py.
"""
import os
import shutil
import subprocess

import pytest

from support import etcd as etcd_support, postgres as pg_support, zookeeper as zk_support
from support.process import maps
from support.scenarios import METRICS_LOCK, metrics_counts_and_gauges
from support.server import serving
from support.util import CLI, MULT, SHIM, cc, preload_only, run, shim_env, wait_for, \
    write_config
from support.workers import race

BLOCK_LOCK = ('locks = ( { symbol = "block_call"; key = "blk"; wait_ms = %d; '
              'on_timeout = "skip"; } );\n')
RACE = ('locks = ( { symbol = "ledger_update"; key = "ledger:{arg0:str}"; '
        'wait_ms = 30000; } );\n')
TWO_KEYS = ('locks = ( { symbol = "ledger_update"; keys = ( "z", "ledger:{arg0:str}" ); '
            'wait_ms = 30000; } );\n')
RENAME = 'locks = ( { symbol = "rename"; key = "k"; } );\n'


class Backend:
    """One row of BACKENDS. make() is its server (not started);
    config(tmp_path, server, body, root) writes a config of this backend
    plus body (root: a key tree of the test's own, where the backend has
    one); held(server, root) lists the locks held or waited for;
    keys(server, root) the keys made, or None where the server keeps none;
    counter(server) the server's fence counter, or None; fences_seen(server,
    fences) whether the server agrees with the fences the shim logged;
    clear(server) asserts that no lock is left and removes any; lacks the
    verbs of the command not built for it."""

    def __init__(self, name, support, make, lib, lib_file, package, brought, config, held,
                 keys=lambda s, root=None: None, counter=lambda s: None,
                 fences_seen=lambda s, fences: True, clear=lambda s: None,
                 lacks=("status", "unlock", "metrics")):
        self.name, self.support, self.make = name, support, make
        self.lib, self.lib_file, self.package = lib, lib_file, package
        self.brought = (lib, "liblockshim-" + name) + brought
        self.module = "liblockshim-%s.so" % name
        self.config, self.held, self.keys, self.clear = config, held, keys, clear
        self.counter, self.fences_seen = counter, fences_seen
        self.lacks = lacks


# ---- postgres: advisory locks; fences from the sequence lockshim_fence -----------

def pg_config(tmp_path, pg, body, root=None):
    return write_config(tmp_path, None, 'backend = "postgres";\npostgres = { conninfo = "%s"; '
                        '};\n%s' % (pg.conninfo(), body))


def pg_held(pg, root=None):
    return ["advisory"] * int(pg.psql("SELECT count(*) FROM pg_locks WHERE locktype = "
                                      "'advisory'"))


def pg_fence(pg):
    return int(pg.psql("SELECT last_value FROM lockshim_fence"))


# ---- zookeeper: ephemeral sequential znodes under <root>/<key>; fences czxids ------

SESSION_MS = 4000


def zk_config(tmp_path, zk, body, root=None):
    return write_config(tmp_path, None, 'backend = "zookeeper";\nzookeeper = { hosts = "%s"; '
                        'session_timeout_ms = %d; %s };\n%s'
                        % (zk.hosts(), SESSION_MS, 'root = "/%s";' % root if root else "",
                           body))


def zk_keys(zk, root=None):
    """The key znodes under root (".metrics", the hosts' counts, is none)."""
    return [k for k in zk.children("/" + (root or "lockshim")) if not k.startswith(".")]


def zk_held(zk, root=None):
    top = "/" + (root or "lockshim")
    return [k + "/" + z for k in zk_keys(zk, root) for z in zk.children(top + "/" + k)]


# ---- etcd: a key per acquisition under /lockshim/<key>/; fences create revisions ---

def etcd_config(tmp_path, etcd, body, root=None):
    return write_config(tmp_path, None, 'backend = "etcd";\netcd = { endpoints = ( "%s" ); };\n'
                        '%s' % (etcd.endpoint(), body))


def etcd_held(etcd, root=None):
    return etcd.keys()


def etcd_fences_seen(etcd, fences):
    """Each fence a revision etcd made (its key's creation): below its head."""
    return fences[-1] < int(etcd.call("/v3/kv/range", {"key": "eA=="})["header"]["revision"])


def etcd_clear(etcd):
    """No lock key left (waited for: a release is asynchronous); a failed
    test's keys must not fail the next ones."""
    try:
        wait_for(lambda: etcd.keys() == [], timeout=10 * MULT, what="no key left")
    finally:
        for key in etcd.keys():
            etcd.call("/v3/lease/revoke", {"ID": str(key[3])})


BACKENDS = [
    Backend("postgres", pg_support, pg_support.PostgresServer, "libpq", "libpq.so", "libpq5",
            ("libssl", "libcrypto", "libgssapi", "libldap", "libkrb5", "libk5crypto",
             "libsasl2"),
            pg_config, pg_held, counter=pg_fence,
            fences_seen=lambda pg, fences: fences[-1] == pg_fence(pg), lacks=()),
    Backend("zookeeper", zk_support, zk_support.ZookeeperServer, "libzookeeper",
            "libzookeeper_mt.so", "libzookeeper-mt2", (), zk_config, zk_held, keys=zk_keys,
            lacks=("unlock",)),
    Backend("etcd", etcd_support, etcd_support.EtcdServer, "libcurl", "libcurl.so",
            "libcurl4 libjson-c5", ("libjson-c", "libnghttp2", "libssl", "libcrypto", "libssh2",
                                    "libldap", "libgssapi", "libpsl", "libidn2", "librtmp"),
            etcd_config, etcd_held, fences_seen=etcd_fences_seen, clear=etcd_clear,
            lacks=()),
]


@pytest.fixture(scope="module", params=[
    pytest.param(b, id=b.name, marks=pytest.mark.skipif(b.support.skip_reason() is not None,
                                                        reason=b.support.skip_reason() or ""))
    for b in BACKENDS])
def served(request):
    """(the backend's row, its server): one server per backend."""
    for s in serving(request.param.make()):
        yield request.param, s


@pytest.fixture
def backend(served):
    """served, checked clean before and after the test."""
    b, s = served
    b.clear(s)
    yield b, s
    b.clear(s)


# ---- exclusion ------------------------------------------------------------------

@pytest.mark.timing
def test_control_processes_and_threads_lose_updates(progs, tmp_path):
    """The control of the exclusion tests below: without the shim, the same
    workload loses updates."""
    assert race(progs["ledger"], "direct", str(tmp_path / "c"), None, procs=3, iters=10,
                threads=3) < 90


def test_processes_and_threads_exclude_each_other(progs, backend, tmp_path):
    """3 processes x 3 threads (one connection or session per process):
    exact; nothing held after; the keys made (zookeeper's key znodes) are
    there; postgres's fence sequence moved once per grant at least."""
    b, s = backend
    cfg = b.config(tmp_path, s, RACE)
    assert race(progs["ledger"], "direct", str(tmp_path / "c"), cfg, procs=3, iters=10,
                threads=3) == 90
    assert b.held(s) == []
    assert b.keys(s) != [], "no key znode"
    counter = b.counter(s)
    assert counter is None or counter >= 90


def test_several_keys_exclude(progs, backend, tmp_path):
    """A lock of two keys (taken in byte order, released together): exact;
    nothing held after, and where keys are made both are there."""
    b, s = backend
    cfg = b.config(tmp_path, s, TWO_KEYS, root="two")
    assert race(progs["ledger"], "direct", str(tmp_path / "c"), cfg, procs=3, iters=10,
                threads=2) == 60
    assert b.held(s, "two") == []
    keys = b.keys(s, "two")
    assert keys is None or len(keys) == 2, keys


def test_fences_increase(progs, backend, tmp_path):
    """Three grants: three fences, each above the last (postgres: from its
    sequence, the last its last_value; zookeeper: czxids; etcd: the keys'
    create revisions, test_fences_are_create_revisions_and_increase)."""
    b, s = backend
    cfg = b.config(tmp_path, s, RACE)
    path = str(tmp_path / "c")
    with open(path, "w") as f:
        f.write("0\n")
    r = run([progs["ledger"], "direct", path, "3"], cfg, LOCKSHIM_LOG_LEVEL="debug")
    assert r.returncode == 0, r.stderr
    fences = [int(l.rsplit("fence ", 1)[1]) for l in r.stderr.splitlines() if " acquired " in l]
    assert len(fences) == 3 and fences == sorted(set(fences)) and fences[0] > 0, r.stderr
    assert b.fences_seen(s, fences), fences


# ---- what the module brings in ----------------------------------------------------

def test_redis_guarded_program_maps_no_client_library(bg, worker_progs, redis, backend,
                                                       tmp_path):
    """test_redis_guarded_program_maps_no_libpq, _no_libzookeeper,
    _no_libcurl: a Redis-guarded program maps neither the client library
    nor the module. Control: the same program guarded with the backend
    maps both."""
    b, s = backend
    rcfg = write_config(tmp_path, redis, BLOCK_LOCK % 1000)
    p = bg([worker_progs["block"]], rcfg)
    p.expect("enter")
    m = maps(p.p.pid)
    assert b.lib not in m and "liblockshim-" + b.name not in m
    p.send()
    p.expect("call rc=42")
    (tmp_path / "m").mkdir()
    q = bg([worker_progs["block"]], b.config(tmp_path / "m", s, BLOCK_LOCK % 1000))
    q.expect("enter")
    m = maps(q.p.pid)
    assert b.lib_file in m and b.module in m
    q.send()
    q.expect("call rc=42")


IO_C = r"""
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
int main(void)
{
	int sv[2];
	char buf[8];
	socketpair(AF_UNIX, SOCK_STREAM, 0, sv);
	for (int i = 0; i < 20; i++) {
		struct pollfd p = { .fd = sv[1], .events = POLLIN };
		if (send(sv[0], "x", 1, 0) != 1 || poll(&p, 1, 1000) != 1 ||
		    read(sv[1], buf, 1) != 1 || write(1, "ok\n", 3) != 3)
			return 1;
	}
	return 0;
}
"""


def test_locks_on_send_write_poll_do_not_loop_through_the_library(backend, tmp_path):
    """test_locks_on_send_write_poll_do_not_loop_through_libpq,
    _libzookeeper, _libcurl: the module and what it brought in (the client
    library and its own libraries) are never redirected, so the library's
    send/poll/write/read (zookeeper: its own threads') reach libc: every
    guarded call of the program is taken once, in the server."""
    b, s = backend
    src = tmp_path / "io.c"
    src.write_text(IO_C)
    prog = cc(str(tmp_path / "io"), [str(src)], "-O2")
    cfg = b.config(tmp_path, s, 'locks = ( { symbol = "send"; key = "s"; }, '
                   '{ symbol = "poll"; key = "p"; }, { symbol = "write"; key = "w"; }, '
                   '{ symbol = "recv"; key = "r"; }, { symbol = "read"; key = "rd"; } );\n')
    r = run([prog], cfg, LOCKSHIM_LOG_LEVEL="debug", timeout=60)
    assert r.returncode == 0 and r.stdout == "ok\n" * 20, (r.stdout, r.stderr[-2000:])
    acquired = [l for l in r.stderr.splitlines() if " acquired " in l]
    assert len(acquired) >= 80, r.stderr[-2000:]  # send, poll, read, write: 20 each
    redirected = [l for l in r.stderr.splitlines() if " redirected" in l and
                  any(o in l for o in b.brought)]
    assert redirected == [], redirected


# ---- the module missing ----------------------------------------------------------

def run_with_shim_copy(worker_progs, cfg, libdir):
    """The block program with the shim copied into libdir preloaded."""
    return subprocess.run([worker_progs["block"]], env=shim_env(cfg, LD_PRELOAD=preload_only(
        str(libdir / "liblockshim.so"))), capture_output=True, text=True,
        stdin=subprocess.DEVNULL)


def test_missing_module_is_one_line_and_78(worker_progs, backend, tmp_path):
    b, s = backend
    d = tmp_path / "lib"
    d.mkdir()
    shutil.copy(SHIM, str(d / "liblockshim.so"))
    r = run_with_shim_copy(worker_progs, b.config(tmp_path, s, BLOCK_LOCK % 1000), d)
    assert r.returncode == 78, (r.stdout, r.stderr)
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and "%s is not installed beside liblockshim.so (%s)" \
        % (b.module, d) in lines[0], r.stderr


def test_module_whose_library_is_missing_names_the_package(worker_progs, backend, tmp_path):
    """A module that cannot be loaded (here: its client library is gone):
    one line naming the library's package, 78; the command's own module
    (the build's) is there, so its check passes."""
    b, s = backend
    d = tmp_path / "lib"
    d.mkdir()
    shutil.copy(SHIM, str(d / "liblockshim.so"))
    src = tmp_path / "gone.c"
    src.write_text("int gone(void) { return 1; }\n")
    cc(str(tmp_path / "libgone.so"), [str(src)], "-shared", "-fPIC")
    mod = tmp_path / "mod.c"
    mod.write_text("int gone(void); int lockshim_backend_%s(void) { return gone(); }\n" % b.name)
    cc(str(d / b.module), [str(mod)], "-shared", "-fPIC", "-L" + str(tmp_path), "-lgone")
    os.unlink(str(tmp_path / "libgone.so"))
    cfg = b.config(tmp_path, s, BLOCK_LOCK % 1000)
    r = run_with_shim_copy(worker_progs, cfg, d)
    assert r.returncode == 78, (r.stdout, r.stderr)
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and "%s cannot be loaded (" % b.module in lines[0] \
        and "libgone.so" in lines[0] and lines[0].endswith("install " + b.package), r.stderr
    r = run([CLI, "check", "-c", cfg], LD_PRELOAD="")
    assert r.returncode == 0, (r.stdout, r.stderr)


# ---- the command ----------------------------------------------------------------

@pytest.mark.parametrize("verb", [["status"], ["unlock", "k"], ["metrics"]],
                         ids=["status", "unlock", "metrics"])
def test_verbs_not_built_exit_1(backend, tmp_path, verb):
    b, s = backend
    if verb[0] not in b.lacks:
        pytest.skip("%s is built for %s (its own test file tests it)" % (verb[0], b.name))
    r = run([CLI] + verb[:1] + ["-c", b.config(tmp_path, s, RENAME)] + verb[1:])
    assert r.returncode == 1 and b.name in r.stderr, (r.stdout, r.stderr)


@pytest.mark.timing
def test_metrics_counts_per_host_and_the_gauges(progs, procs, backend, tmp_path):
    """`lockshim metrics` through the backend's .count_read and .holders
    (support/scenarios.py): counts of exited processes per host, held and
    waiting, a waiter let in by a killed holder counted as waited."""
    b, s = backend
    if "metrics" in b.lacks:
        pytest.skip("metrics is not built for %s" % b.name)
    metrics_counts_and_gauges(progs, procs, b.config(tmp_path, s, METRICS_LOCK, root="m"),
                              waiters="status" not in b.lacks)
