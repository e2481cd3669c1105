# SPDX-License-Identifier: MIT
"""bench.py - lockshim's benchmark (`make bench`); not a test.

Starts a private redis-server on a free loopback port, builds the benchmark
programs (bench/*.c) and measures, in one run:
  floor        plain hiredis: PING, and SET NX PX + EVALSHA compare-and-delete
  uncontended  a program calling a guarded function N times, minus the same
               program unguarded, per call (default, and linger_ms = 0);
               redis-py Lock acquire+release
  contended    P = 2, 4, 8 processes x K sections of a counter-file
               read-modify-write on one key: the plain C 1 ms poller,
               lockshim (default, linger_ms = 0, fair), redis-py Lock
               (defaults and sleep=0.001); each row the median of R runs
  start-up     a program that calls no guarded function, with and without
               the shim
  imports      Debian's /usr/bin/python3 importing 29 C extension modules
               from lib-dynload (29 dlopens, each followed by the shim's
               scan of the new objects), without the shim and with it
               and 20 locks on symbols python never calls
  entry        the two redirection methods: a guarded uncontended call
               (default, lock kept) of a library function with method
               "reloc" and "entry", and of the executable's own function
               (called directly) with "entry", each minus the same call
               unguarded; and the start-up of a generated executable with
               --symtab-funcs functions in its .symtab, without the shim,
               with it entry-patching 20 of them, and with one lock on a
               symbol no program defines (each case checked once in a
               LOCKSHIM_LOG_LEVEL=debug run: patched, and the lock acquired)
  symbols      start-up of programs with large symbol tables: node (when
               installed; 75,000 dynamic and 110,000 .symtab symbols for
               node 20) and a generated executable with --big-funcs
               exported functions (as many dynamic and .symtab symbols;
               built once and cached in build/bench/), without the shim,
               with two locks on library functions they import (rename,
               unlink) with method "reloc" and with "auto", and with one
               lock on a name no object defines; each the median wall
               and CPU time of --symbols-runs runs, the cases taken in turn
  tls          the uncontended guarded call over TLS (redis.tls, the
               server's TLS port, a CA and certificate made with openssl)
               against plain TCP to the same server, in the same run:
               linger_ms = 0 (a round trip per call) and default settings
  replicas     the uncontended guarded call (linger_ms = 0) without and
               with wait_replicas = 1 against one local replica started
               for it: the time WAIT adds to each acquire
  cluster      P = 1, 2, 4, 8 processes each guarding its own key (keys
               spread over the primaries) against a Redis Cluster of three
               primaries started for it, and against the standalone
               server: sections/s, commands and server read events per
               section (default and linger_ms = 0)
  redlock      the uncontended guarded call with Redlock over three
               masters (redis.masters, started for it) against one
               server (ratio), and P = 8 contended sections/s; skipped
               with a note in the full run when the build has no Redlock
               backend
  sets         the uncontended guarded call (linger_ms = 0: an acquire and
               a release every call, client and server on one CPU) of an
               exclusive lock, limit = 3, mode = "shared" and keys of two,
               measured in turns over --sets-rounds rounds (medians), on
               one CPU, on two, and across a link (a proxy holding each
               reply 0.2 ms); and P = 8 processes x K sections on one key
               with limit = 4
               against the exclusive lock: sections/s and worst wait
  postgres     backend = "postgres" on a private cluster (root and
               PostgreSQL needed, else skipped saying why): the uncontended
               guarded call beside Redis's of linger_ms = 0, and P = 8 x K
               sections on one key (the counter checked)
  zookeeper    backend = "zookeeper" on a private standalone server (the
               zookeeper jar and java needed, else skipped saying why): the
               same two measurements as postgres
  etcd         backend = "etcd" on a private etcd (etcd needed, else skipped
               saying why; its data dir in tmp): the same as postgres
The uncontended, entry, tls, replicas and redlock call rows are measured in
two placements (taskset): client and server on one CPU, and on two CPUs.
Prints a markdown report and writes it to bench/results/. `--only PART`
(uncontended, contended, startup, imports, entry, symbols, tls, replicas,
cluster, redlock, sets, local, postgres, zookeeper, etcd, versus; or several,
comma-separated: `--only local,postgres,zookeeper,etcd` gives the backends
side by side) measures just those parts and prints just their sections and
targets, written only to --out if given.
Usage:
bench.py [--build DIR] [--k K] [--n N] [--reps R] [--startup-runs R]
[--import-runs R] [--symtab-funcs F] [--symbols-runs R] [--big-funcs F]
[--cluster-k K] [--only PART[,PART...]] [--out FILE] [--settings S]
"""
import argparse
import concurrent.futures
import datetime
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
from resp import Resp, free_port  # noqa: E402
from support import postgres as pg_support  # noqa: E402
from support import zookeeper as zk_support  # noqa: E402
from support import etcd as etcd_support  # noqa: E402
from support.proxy import Proxy  # noqa: E402

# The imports row: Debian's interpreter, not the python3 first on PATH (which
# may be a pyenv build), and 29 of its C extension modules that import
# cleanly and silently on a stock Debian 12 python3.11 (no display, terminal,
# network or sound needed; none deprecated; none already loaded at start-up).
SYSTEM_PYTHON = "/usr/bin/python3"
LIB_DYNLOAD = "/usr/lib/python3.11/lib-dynload"
IMPORT_MODULES = (
    "_asyncio", "_bz2", "_codecs_cn", "_codecs_hk", "_codecs_iso2022", "_codecs_jp",
    "_codecs_kr", "_codecs_tw", "_contextvars", "_crypt", "_ctypes", "_dbm", "_decimal",
    "_hashlib", "_json", "_lsprof", "_lzma", "_multibytecodec", "_multiprocessing",
    "_posixshmem", "_queue", "_sqlite3", "_typing", "_uuid", "_zoneinfo", "mmap",
    "resource", "termios", "xxlimited")
IMPORT_LOCKS = 20

# The entry part's start-up rows: locks on ENTRY_LOCKS of the generated
# executable's functions, spread over its source files.
ENTRY_LOCKS = 20
BIG_SOURCES = 8

# The symbols part: the library functions its locks name (both programs
# import them; neither calls them in the timed runs), and the generator's
# version (a cached executable of another version is built again).
SYMBOLS_LOCKS = ("rename", "unlink")
BIG_VERSION = 1

try:
    import redis  # noqa: F401  (Debian python3-redis, for the peer rows)
    HAVE_REDIS_PY = True
except ImportError:
    HAVE_REDIS_PY = False


def cc(out, srcs, *flags):
    subprocess.run(["gcc", "-O2", "-o", out] + [os.path.join(HERE, s) for s in srcs]
                   + list(flags), check=True)
    return out


def make_certs(work):
    """A CA and a server certificate for IP:127.0.0.1 signed by it, made with
    openssl in work; returns (ca, cert, key) paths."""
    def openssl(*args):
        subprocess.run(["openssl"] + list(args), cwd=work, check=True, capture_output=True)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
            "-subj", "/CN=lockshim bench CA")
    openssl("req", *ec, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1")
    with open(os.path.join(work, "server.ext"), "w") as f:
        f.write("subjectAltName = IP:127.0.0.1\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", "server.crt", "-days", "2", "-extfile", "server.ext")
    return [os.path.join(work, f) for f in ("ca.crt", "server.crt", "server.key")]


class Server:
    def __init__(self, work):
        self.port = free_port()
        self.tls_port = free_port()
        self.ca, cert, key = make_certs(work)
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--logfile", os.path.join(work, "redis.log"),
             "--dir", work, "--tls-port", str(self.tls_port), "--tls-cert-file", cert,
             "--tls-key-file", key, "--tls-ca-cert-file", self.ca,
             "--tls-auth-clients", "no"], stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while True:
            try:
                self.client = Resp(port=self.port)
                self.client.cmd("PING")
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.01)

    def pin(self, cpus):
        subprocess.run(["taskset", "-a", "-p", "-c", cpus, str(self.proc.pid)], check=True,
                       capture_output=True)

    def commands(self):
        """Total commands processed since the last CONFIG RESETSTAT."""
        info = self.client.cmd("INFO", "commandstats")
        total = 0
        for line in info.splitlines():
            if line.startswith("cmdstat_") and not line.startswith(("cmdstat_config",
                                                                       "cmdstat_info")):
                total += int(line.split("calls=")[1].split(",")[0])
        return total

    def count_sent(self, run):
        """Runs run() while a MONITOR connection counts the commands clients
        send (lines from scripts, "[0 lua]", are not sent by anyone)."""
        mon = Resp(port=self.port, timeout=600)
        mon.s.sendall(b"*1\r\n$7\r\nMONITOR\r\n")
        mon.f.readline()
        counts = {"sent": 0}
        done = threading.Event()

        def reader():
            while True:
                line = mon.f.readline()
                if not line or b"LOCKSHIM-BENCH-END" in line:
                    break
                if b" lua] " not in line and b'"MONITOR"' not in line:
                    counts["sent"] += 1
            done.set()
        th = threading.Thread(target=reader, daemon=True)
        th.start()
        try:
            run()
        finally:
            self.client.cmd("ECHO", "LOCKSHIM-BENCH-END")
            done.wait(60)
            mon.close()
        return counts["sent"]  # the marker line itself ends the count uncounted

    def stop(self):
        self.client.close()
        self.proc.terminate()
        self.proc.wait()


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
    """Redis Cluster's slot of key (its hash tag when it has one)."""
    k = key.encode()
    s = k.find(b"{")
    if s >= 0:
        e = k.find(b"}", s + 1)
        if e > s + 1:
            k = k[s + 1:e]
    return crc16(k) % 16384


def server_counts(client):
    """(commands, read events) a server processed since its last CONFIG
    RESETSTAT: INFO commandstats calls (but CONFIG and INFO) and INFO
    stats' total_reads_processed, less the two reads of these INFOs."""
    total = 0
    for line in client.cmd("INFO", "commandstats").splitlines():
        if line.startswith("cmdstat_") and not line.startswith(("cmdstat_config",
                                                                   "cmdstat_info")):
            total += int(line.split("calls=")[1].split(",")[0])
    stats = client.cmd("INFO", "stats")
    reads = int(stats.split("total_reads_processed:")[1].split()[0])
    return total, reads - 2


class Plain:
    """A redis-server of a part's own on a free loopback port (a Redlock
    master, a cluster node with extra arguments), stopped by its pid."""

    def __init__(self, work, name, *extra):
        """extra: more arguments; "BUS" among them is replaced by a free port.
        A port taken between free_port() and the bind: started again on
        new ports."""
        self.dir = os.path.join(work, name)
        os.makedirs(self.dir, exist_ok=True)
        self.client = None
        for attempt in range(5):
            self.port = free_port()
            args = [str(free_port()) if a == "BUS" else a for a in extra]
            self.proc = subprocess.Popen(
                ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                 "--appendonly", "no", "--logfile", os.path.join(self.dir, "redis.log"),
                 "--dir", self.dir] + args, stdin=subprocess.DEVNULL)
            deadline = time.monotonic() + 10
            while self.client is None:
                try:
                    c = Resp(port=self.port)
                    c.cmd("PING")
                    self.client = c
                except OSError:
                    if self.proc.poll() is not None or time.monotonic() > deadline:
                        break
                    time.sleep(0.01)
            if self.client:
                return
            self.stop()
            if "Address already in use" not in self.log() or attempt == 4:
                raise RuntimeError("redis-server %s on port %d did not start: %s"
                                   % (name, self.port, self.log()))
            os.unlink(os.path.join(self.dir, "redis.log"))

    def log(self):
        try:
            with open(os.path.join(self.dir, "redis.log")) as f:
                return f.read()[-2000:]
        except OSError:
            return ""

    def pin(self, cpus):
        subprocess.run(["taskset", "-a", "-p", "-c", cpus, str(self.proc.pid)], check=True,
                       capture_output=True)

    def stop(self):
        if self.client:
            self.client.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Cluster:
    """n cluster-enabled Plain nodes (bus ports free ports of their own),
    joined as n primaries without replicas by redis-cli --cluster create."""

    def __init__(self, work, n=3):
        self.nodes = []
        try:
            for i in range(n):
                self.nodes.append(Plain(
                    work, "cluster%d" % i, "--cluster-enabled", "yes", "--cluster-port",
                    "BUS", "--cluster-config-file",
                    os.path.join(work, "cluster%d" % i, "nodes.conf"),
                    "--cluster-node-timeout", "5000"))
            subprocess.run(["redis-cli", "--cluster", "create"] +
                           ["127.0.0.1:%d" % nd.port for nd in self.nodes] +
                           ["--cluster-replicas", "0", "--cluster-yes"],
                           check=True, capture_output=True, timeout=60, stdin=subprocess.DEVNULL)
            deadline = time.monotonic() + 30
            while not all("cluster_state:ok" in nd.client.cmd("CLUSTER", "INFO")
                          for nd in self.nodes):
                if time.monotonic() > deadline:
                    raise RuntimeError("the bench cluster did not reach cluster_state:ok")
                time.sleep(0.05)
        except BaseException:
            self.stop()
            raise
        self.slots = {}
        for start, end, node, *_ in self.nodes[0].client.cmd("CLUSTER", "SLOTS"):
            for s in range(start, end + 1):
                self.slots[s] = int(node[1])

    def seeds(self):
        return ", ".join('"127.0.0.1:%d"' % nd.port for nd in self.nodes)

    def owner(self, key):
        return self.slots[keyslot(key)]

    def stop(self):
        for nd in self.nodes:
            nd.stop()


def symbol_counts(path):
    """(dynamic, .symtab) defined FUNC symbols of the ELF file path (readelf)."""
    out = subprocess.run(["readelf", "-sW", path], check=True, capture_output=True,
                         text=True).stdout
    counts, table = {".dynsym": 0, ".symtab": 0}, None
    for line in out.splitlines():
        if line.startswith("Symbol table"):
            table = line.split("'")[1]
            continue
        f = line.split()
        if table in counts and len(f) >= 8 and f[3] == "FUNC" and f[6] != "UND":
            counts[table] += 1
    return counts[".dynsym"], counts[".symtab"]


def baseline_shim(spec, work):
    """The shim of the baseline: spec is a build directory holding
    liblockshim.so, or a git revision of this repository, built here once
    (git archive, make all) under work."""
    if os.path.isfile(os.path.join(spec, "liblockshim.so")):
        return os.path.join(os.path.abspath(spec), "liblockshim.so")
    src = os.path.join(work, "baseline")
    os.makedirs(src, exist_ok=True)
    tar = subprocess.run(["git", "-C", ROOT, "archive", spec], check=True,
                         capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", src], input=tar, check=True)
    subprocess.run(["make", "-C", src, "-s", "all", "BUILD=build"], check=True,
                   stdout=subprocess.DEVNULL)
    return os.path.join(src, "build", "liblockshim.so")


def pct(values, p):
    v = sorted(values)
    return v[min(len(v) - 1, int(p * len(v)))]


def run_workers(argvs, env=None):
    """Starts every argv, releases them at once, returns (wall_s, outputs)."""
    ps = [subprocess.Popen(a, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, env=env) for a in argvs]
    time.sleep(0.3)  # let every process reach its barrier (interpreter start-up)
    t0 = time.monotonic()
    for p in ps:
        p.stdin.write("g")
        p.stdin.flush()
    outs = []
    for p in ps:
        out, err = p.communicate(timeout=600)
        if p.returncode != 0:
            raise RuntimeError("%s failed (%d): %s" % (p.args, p.returncode, err[-2000:]))
        outs.append(out)
    return time.monotonic() - t0, outs


# The local backend's and flock's P = 8 runs: at least this many sections
# per process (a run of args.k = 200 lasts milliseconds: its ratio to flock
# swings from 0.2 to 1.5 between runs).
LOCAL_P8_K = 5000


def local_k(args):
    """Sections per process of the local part's P = 8 runs."""
    return max(args.k, LOCAL_P8_K)


class Bench:
    def __init__(self, args):
        self.args = args
        self.build = os.path.abspath(args.build)
        self.shim = os.path.join(self.build, "liblockshim.so")
        self.work = tempfile.mkdtemp(prefix="lockshim-bench.")
        w = self.work
        cc(os.path.join(w, "libsection.so"), ["section.c"], "-shared", "-fPIC")
        lib = ["-L" + w, "-Wl,-rpath," + w, "-lsection"]
        self.worker = cc(os.path.join(w, "worker"), ["worker.c"], *lib, "-lhiredis")
        self.floor_bin = cc(os.path.join(w, "floor"), ["floor.c"], "-lhiredis")
        with open(os.path.join(w, "empty.c"), "w") as f:
            f.write("int main(void) { return 0; }\n")
        self.empty = os.path.join(w, "empty")
        subprocess.run(["gcc", "-O2", "-o", self.empty, os.path.join(w, "empty.c")], check=True)
        self.server = Server(w)
        self.counter = os.path.join(w, "counter")

    def config(self, fair=False, symbol="section", extra="", tag=None, tls=False,
               redis_extra="", group=None, key="bench"):
        """A config with one lock on symbol (key template key); extra: more
        settings of that lock; tag names the file where two extras have one
        length; tls: to the server's TLS port (redis.tls, verified by the
        bench CA); redis_extra: more settings of the redis group; group: the
        redis group's settings instead of the bench's server (then tag
        should name the topology); key None: no key (extra names `keys`)."""
        path = os.path.join(self.work, "%s-%s-%s%s.cfg" % (
            symbol, "fair" if fair else "default", tag or len(extra), "-tls" if tls else ""))
        if group is None:
            group = 'host = "127.0.0.1"; ' + (
                'port = %d; tls = { ca_file = "%s"; };' % (self.server.tls_port, self.server.ca)
                if tls else "port = %d;" % self.server.port)
        with open(path, "w") as f:
            f.write('redis = { %s %s };\n'
                    'locks = ( { symbol = "%s"; %slease_ms = 10000; '
                    'wait_ms = 60000; fair = %s; %s %s } );\n'
                    % (group, redis_extra, symbol, 'key = "%s"; ' % key if key else "",
                       "true" if fair else "false", self.args.settings, extra))
        return path

    def config_many(self, symbols, tag="many"):
        """A config with one lock (all defaults) per symbol."""
        path = os.path.join(self.work, "%s-%d.cfg" % (tag, len(symbols)))
        with open(path, "w") as f:
            f.write('redis = { host = "127.0.0.1"; port = %d; };\nlocks = (\n%s\n);\n'
                    % (self.server.port, ",\n".join('  { symbol = "%s"; }' % s
                                                     for s in symbols)))
        return path

    def env(self, cfg, debug=False):
        e = dict(os.environ)
        e.pop("LOCKSHIM_LOG_LEVEL", None)
        if cfg:
            e["LD_PRELOAD"] = self.shim
            e["LOCKSHIM_CONFIG"] = cfg
            if debug:
                e["LOCKSHIM_LOG_LEVEL"] = "debug"
        return e

    def check_log(self, what, argv, cfg, want, unwanted=(), counts=None, stdin=""):
        """Runs argv once under the shim with LOCKSHIM_LOG_LEVEL=debug and fails
        loudly unless it exits 0, its stderr contains every string of want, none
        of unwanted, and each string of counts {s: n} exactly n times."""
        p = subprocess.run(argv, env=self.env(cfg, debug=True), input=stdin,
                           capture_output=True, text=True, timeout=120)
        bad = ["exit %d" % p.returncode] if p.returncode != 0 else []
        bad += ["no %r" % w for w in want if w not in p.stderr]
        bad += ["%r present" % u for u in unwanted if u in p.stderr]
        bad += ["%r %d times (expected %d)" % (c, p.stderr.count(c), n)
                for c, n in (counts or {}).items() if p.stderr.count(c) != n]
        if bad:
            raise RuntimeError("%s: the calls are not guarded as measured (%s) in a debug run "
                               "of %s with %s; stderr:\n%s" % (
                                   what, "; ".join(bad), " ".join(argv), cfg, p.stderr[-4000:]))

    # ---- uncontended -------------------------------------------------------

    def floor(self, cpu):
        out = subprocess.run(["taskset", "-c", cpu, self.floor_bin, str(self.server.port),
                              str(self.args.n)], check=True, capture_output=True, text=True)
        ping, pair = (int(x) / 1000 for x in out.stdout.split())
        return ping, pair

    def noop(self, cpu, cfg, mode="noop", n=None):
        """Per-call time of bench_noop (worker mode noop-wide: bench_noop_wide,
        noop-exe: bench_noop_exe) in microseconds (best of 3 runs of n calls,
        args.n by default). The shim
        is preloaded into the worker only, through env after taskset: taskset
        defines none of the symbols, and a lock with method "entry" stops a
        program where it cannot patch the entry (exit 78)."""
        best = None
        pre = ["env"] + ["%s=%s" % (k, v) for k, v in sorted(self.env(cfg).items())
                         if k in ("LD_PRELOAD", "LOCKSHIM_CONFIG")] if cfg else []
        for _ in range(3):
            _, outs = run_workers([["taskset", "-c", cpu] + pre + [self.worker, mode, "-",
                                                                   str(n or self.args.n)]],
                                  env=self.env(None))
            us = int(outs[0].split()[0]) / 1000 / (n or self.args.n)
            best = us if best is None else min(best, us)
        return best

    def redis_py_pair(self, cpu):
        code = ("import redis,time,sys\nr=redis.Redis(port=%d)\nl=r.lock('py-pair',timeout=10)\n"
                "ts=[]\nfor _ in range(%d):\n t=time.perf_counter_ns();l.acquire();l.release();"
                "ts.append(time.perf_counter_ns()-t)\nts.sort();print(ts[len(ts)//2])\n"
                % (self.server.port, max(1000, self.args.n // 4)))
        out = subprocess.run(["taskset", "-c", cpu, sys.executable, "-c", code], check=True,
                             capture_output=True, text=True)
        return int(out.stdout) / 1000

    def uncontended(self):
        res = {}
        cfg = self.config(symbol="bench_noop")
        cfg0 = self.config(symbol="bench_noop", extra=NO_LINGER)
        for name, server_cpu, client_cpu in [("1 CPU", "0", "0"), ("2 CPUs", "1", "0")]:
            self.server.pin(server_cpu)
            ping, pair = self.floor(client_cpu)
            plain = self.noop(client_cpu, None)
            guarded = self.noop(client_cpu, cfg)
            guarded0 = self.noop(client_cpu, cfg0)
            py = self.redis_py_pair(client_cpu) if HAVE_REDIS_PY else None
            res[name] = dict(ping=ping, pair=pair, guarded=guarded - plain,
                             guarded0=guarded0 - plain, py=py)
        self.server.pin("0,1")
        return res

    def tls(self):
        """Guarded uncontended call minus unguarded (µs per call), to the plain
        port and to the TLS port of the same server, linger_ms = 0 and default
        settings, per placement; the TLS configs are checked once with
        LOCKSHIM_LOG_LEVEL=debug (the lock acquired, no error)."""
        cfgs = {}
        for linger, extra in (("0", NO_LINGER), ("default", "")):
            for tls in (False, True):
                cfgs[(linger, tls)] = cfg = self.config(symbol="bench_noop", extra=extra,
                                                        tls=tls)
                if tls:
                    self.check_log("bench_noop over TLS, linger %s" % linger,
                                   [self.worker, "noop", "-", "3"], cfg, want=["acquired "],
                                   unwanted=[" error: ", " warn: "], stdin="g")
        res = {}
        for place, server_cpu, client_cpu in [("1 CPU", "0", "0"), ("2 CPUs", "1", "0")]:
            self.server.pin(server_cpu)
            plain = self.noop(client_cpu, None)
            res[place] = {k: self.noop(client_cpu, cfg) - plain for k, cfg in cfgs.items()}
        self.server.pin("0,1")
        return res

    def replicas(self):
        """Guarded uncontended call minus unguarded (µs per call), linger_ms = 0,
        without and with wait_replicas = 1 against one local replica of the
        bench's server (started here, stopped by pid), per placement: the
        difference is what WAIT adds to each acquire. The WAIT config is
        checked once with LOCKSHIM_LOG_LEVEL=debug (acquired, no error)."""
        port = free_port()
        replica = subprocess.Popen(
            ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--replicaof", "127.0.0.1", str(self.server.port),
             "--logfile", os.path.join(self.work, "replica.log"), "--dir", self.work],
            stdin=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 20
            while "state=online" not in self.server.client.cmd("INFO", "replication"):
                if time.monotonic() > deadline:
                    raise RuntimeError("the replica did not connect")
                time.sleep(0.05)
            plain_cfg = self.config(symbol="bench_noop", extra=NO_LINGER)
            wait_cfg = self.config(symbol="bench_noop", extra=NO_LINGER, tag="wait",
                                   redis_extra="wait_replicas = 1; wait_replicas_ms = 1000;")
            self.check_log("bench_noop with wait_replicas = 1", [self.worker, "noop", "-", "3"],
                           wait_cfg, want=["acquired "], unwanted=[" error: ", " warn: "],
                           stdin="g")
            res = {}
            for place, server_cpu, client_cpu in [("1 CPU", "0", "0"), ("2 CPUs", "1", "0")]:
                self.server.pin(server_cpu)
                plain = self.noop(client_cpu, None)
                res[place] = (self.noop(client_cpu, plain_cfg) - plain,
                              self.noop(client_cpu, wait_cfg) - plain)
            self.server.pin("0,1")
            return res
        finally:
            replica.terminate()
            replica.wait()

    # ---- contended ---------------------------------------------------------

    def contended(self, impl, p):
        """Runs the workload args.reps times and returns the run with the median
        sections/s; commands sent are counted with MONITOR in one more run."""
        k = self.args.k
        env = self.env(None)
        if impl == "poll":
            argv = [self.worker, "poll", self.counter, str(k), str(self.server.port)]
        elif impl.startswith("lockshim"):
            env = self.env(self.config(fair=impl.endswith("fair"),
                                       extra=NO_LINGER if impl.endswith("-0") else ""))
            argv = [self.worker, "section", self.counter, str(k)]
        else:
            sleep = "0.1" if impl == "redis-py" else "0.001"
            argv = [sys.executable, os.path.join(HERE, "peer.py"), str(self.server.port),
                    self.counter, str(k), sleep]
        runs = sorted((self.contended_once(argv, env, p) for _ in range(self.args.reps)),
                      key=lambda r: r["rate"])
        r = runs[len(runs) // 2]
        r["rates"] = [x["rate"] for x in runs]
        with open(self.counter, "w") as f:
            f.write("0 0\n")
        r["sent"] = self.server.count_sent(lambda: run_workers([argv] * p, env=env)) / r["n"]
        return r

    def contended_once(self, argv, env, p, k=None):
        """One run of p workers argv (k sections each, args.k when None)."""
        with open(self.counter, "w") as f:
            f.write("0 0\n")
        self.server.client.cmd("CONFIG", "RESETSTAT")
        wall, outs = run_workers([argv] * p, env=env)
        cmds = self.server.commands()
        with open(self.counter) as f:
            final = int(f.read().split()[0])
        waits, handoffs, elapsed = [], 0, []
        for out in outs:
            lines = out.splitlines()
            e, h = lines[0].split()
            elapsed.append(int(e) / 1e6)
            handoffs += int(h)
            waits += [int(x) / 1e6 for x in lines[1].split()]
        n = p * (k or self.args.k)
        return dict(rate=n / wall, med=statistics.median(waits), p99=pct(waits, 0.99),
                    max=max(waits), handoffs=handoffs / n, pmin=min(elapsed),
                    pmax=max(elapsed), cmds=cmds / n, exact=final == n, final=final, n=n)

    def startup(self):
        """Start-up (ms) without the shim, with a lock the program does not
        call, and with that lock out of scope (its programs matching none:
        the cost a system-wide preload adds to every other program)."""
        cfg = self.config(symbol="not_called_anywhere")
        out = self.config(symbol="not_called_anywhere", extra='programs = ["no-such-program"];',
                          tag="out-of-scope")
        return (self.startup_ms(self.env(None)), self.startup_ms(self.env(cfg)),
                self.startup_ms(self.env(out)))

    def startup_ms(self, env):
        """Mean wall time (ms) of the fastest 90 % of args.startup_runs runs of
        a program that calls nothing guarded."""
        ts = []
        for _ in range(self.args.startup_runs):
            t0 = time.perf_counter()
            subprocess.run([self.empty], env=env, check=True)
            ts.append(time.perf_counter() - t0)
        return statistics.mean(sorted(ts)[: len(ts) * 9 // 10]) * 1000

    def startup_cost(self, cfg):
        """The shim's start-up cost (ms) with config cfg."""
        return self.startup_ms(self.env(cfg)) - self.startup_ms(self.env(None))

    def versus(self):
        """What a change costs: the uncontended guarded call (default and
        linger_ms = 0, client and server on one CPU), P = 8 contended
        (lockshim default, sections/s) and the start-up cost, each measured
        with the baseline's shim (--baseline) and this build's in turns,
        args.versus_rounds rounds; the medians of the rounds."""
        shims = {"before": baseline_shim(self.args.baseline, self.work), "after": self.shim}
        cfg = self.config(symbol="bench_noop")
        cfg0 = self.config(symbol="bench_noop", extra=NO_LINGER)
        idle = self.config(symbol="not_called_anywhere")
        section = self.config()
        argv = [self.worker, "section", self.counter, str(self.args.k)]
        got = {m: {v: [] for v in shims} for m, _, _ in VERSUS}
        try:
            for _ in range(self.args.versus_rounds):
                for v, shim in shims.items():
                    self.shim = shim
                    self.server.pin("0")
                    plain = self.noop("0", None)
                    got["call"][v].append(self.noop("0", cfg) - plain)
                    got["call0"][v].append(self.noop("0", cfg0) - plain)
                    self.server.pin("0,1")
                    r = self.contended_once(argv, self.env(section), 8)
                    if not r["exact"]:
                        raise RuntimeError("%s: P=8 counter %d, expected %d" % (v, r["final"], r["n"]))
                    got["p8"][v].append(r["rate"])
                    got["startup"][v].append(self.startup_cost(idle))
        finally:
            self.shim = shims["after"]
            self.server.pin("0,1")
        return {m: {v: statistics.median(x) for v, x in d.items()} for m, d in got.items()}

    def imports(self):
        """Mean wall time in ms of SYSTEM_PYTHON importing IMPORT_MODULES, over
        the fastest 90 % of --import-runs runs, without and with the shim
        (IMPORT_LOCKS locks on symbols python never calls). Every run must exit
        0, have loaded each module from LIB_DYNLOAD by that import (not
        before it) and have the shim mapped exactly when it is preloaded."""
        if not os.path.exists(self.shim):
            raise RuntimeError("%s does not exist: build it first" % self.shim)
        cfg = self.config_many(["not_called_%d" % i for i in range(IMPORT_LOCKS)])
        code = ("import sys\n"
                "names = %r\n"
                "before = [n for n in names if n in sys.modules]\n"
                "import %s\n"
                "bad = [n for n in names if n in before or not getattr(sys.modules[n], "
                "'__file__', '').startswith(%r)]\n"
                "if bad:\n"
                "    sys.exit('not loaded from %s by the import: ' + ' '.join(bad))\n"
                "with open('/proc/self/maps') as f:\n"
                "    shim = %r in f.read()\n"
                "print(len(names), 'shim' if shim else 'plain')\n"
                % (list(IMPORT_MODULES), ", ".join(IMPORT_MODULES), LIB_DYNLOAD + "/",
                   LIB_DYNLOAD, os.path.realpath(self.shim)))
        argv = [SYSTEM_PYTHON, "-I", "-c", code]

        def mean_ms(env, expect):
            ts = []
            for _ in range(self.args.import_runs):
                t0 = time.perf_counter()
                p = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL,
                                   capture_output=True, text=True)
                ts.append(time.perf_counter() - t0)
                if p.returncode != 0 or p.stdout.split() != [str(len(IMPORT_MODULES)), expect]:
                    raise RuntimeError("%s importing %d modules (%s) failed: exit %d, stdout "
                                       "%r (expected %r), stderr: %s" % (
                                           SYSTEM_PYTHON, len(IMPORT_MODULES), expect,
                                           p.returncode, p.stdout,
                                           "%d %s" % (len(IMPORT_MODULES), expect),
                                           p.stderr[-2000:]))
            return statistics.mean(sorted(ts)[: len(ts) * 9 // 10]) * 1000
        env = self.env(None)
        env.pop("LD_PRELOAD", None)
        plain = mean_ms(env, "plain")
        shim = mean_ms(self.env(cfg), "shim")
        return plain, shim

    # ---- entry --------------------------------------------------------------

    def entry(self):
        return dict(calls=self.entry_calls(), startup=self.entry_startup())

    def entry_calls(self):
        """Guarded uncontended call (default settings, lock kept) minus the
        same call unguarded, in µs, per placement: libsection's bench_noop_wide
        (called through the PLT) with method "reloc" and "entry", and the
        worker's own bench_noop_exe (a direct call) with "entry"."""
        cases = [("reloc", "bench_noop_wide", "noop-wide", "reloc"),
                 ("entry", "bench_noop_wide", "noop-wide", "entry"),
                 ("exe", "bench_noop_exe", "noop-exe", "entry")]
        cfgs = {}
        for name, sym, mode, method in cases:
            cfgs[name] = cfg = self.config(symbol=sym, extra='method = "%s";' % method,
                                           tag=method)
            patched, slot = "%s: entry patched" % sym, "slot of %s redirected" % sym
            self.check_log("%s with method %s" % (sym, method),
                           [self.worker, mode, "-", "3"], cfg,
                           want=[patched if method == "entry" else "PLT " + slot,
                                 "acquired "],
                           unwanted=[slot if method == "entry" else patched], stdin="g")
        res = {}
        for place, server_cpu, client_cpu in [("1 CPU", "0", "0"), ("2 CPUs", "1", "0")]:
            self.server.pin(server_cpu)
            r = res[place] = dict(plain_lib=self.noop(client_cpu, None, "noop-wide"),
                                  plain_exe=self.noop(client_cpu, None, "noop-exe"))
            for name, _, mode, _ in cases:
                r[name] = self.noop(client_cpu, cfgs[name], mode) - r[
                    "plain_exe" if mode == "noop-exe" else "plain_lib"]
        self.server.pin("0,1")
        return res

    def big_program(self):
        """Generates and builds (once, cached in the temp dir) an executable
        defining args.symtab_funcs functions (-O0, each > 12 bytes of code):
        run without arguments it calls none of them, with one it calls the
        ENTRY_LOCKS returned (spread over the sources) once each. Returns
        (path, locked function names, FUNC symbols in its .symtab, build s)."""
        if getattr(self, "_big", None):
            return self._big
        t0 = time.monotonic()
        n = self.args.symtab_funcs
        d = os.path.join(self.work, "bigsym")
        os.makedirs(d, exist_ok=True)
        srcs = []
        for k in range(BIG_SOURCES):
            srcs.append(os.path.join(d, "f%d.c" % k))
            with open(srcs[-1], "w") as f:
                f.write("".join("__attribute__((noinline, used)) int f%d(int x) "
                                "{ return (x * %d + (x >> 3)) ^ %d; }\n" % (i, i + 1, i)
                                for i in range(k * n // BIG_SOURCES,
                                               (k + 1) * n // BIG_SOURCES)))
        locked = ["f%d" % (i * n // ENTRY_LOCKS + 7) for i in range(ENTRY_LOCKS)]
        srcs.append(os.path.join(d, "main.c"))
        with open(srcs[-1], "w") as f:
            f.write("".join("int %s(int);\n" % s for s in locked)
                    + "int main(int argc, char **argv)\n{\n\t(void)argv;\n"
                    "\tif (argc > 1) {\n"
                    + "".join("\t\t%s(argc);\n" % s for s in locked)
                    + "\t}\n\treturn 0;\n}\n")
        objs = [s[:-2] + ".o" for s in srcs]
        with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 2) as ex:
            list(ex.map(lambda so: subprocess.run(["gcc", "-O0", "-c", "-o", so[1], so[0]],
                                                  check=True), zip(srcs, objs)))
        path = os.path.join(d, "bigsym")
        subprocess.run(["gcc", "-O0", "-o", path] + objs, check=True)
        out = subprocess.run(["readelf", "-sW", path], check=True, capture_output=True,
                             text=True).stdout
        funcs, sizes, table = 0, {}, None
        for line in out.splitlines():
            if line.startswith("Symbol table"):
                table = line.split("'")[1]
                continue
            f = line.split()
            if table == ".symtab" and len(f) >= 8 and f[3] == "FUNC":
                funcs += 1
                sizes[f[7]] = int(f[2], 0)
        small = [s for s in locked if sizes.get(s, 0) < 12]
        if funcs < n or small:
            raise RuntimeError("%s: %d FUNC symbols in .symtab (expected >= %d); locked "
                               "functions shorter than 12 bytes: %s" % (path, funcs, n, small))
        self._big = (path, locked, funcs, time.monotonic() - t0)
        return self._big

    def entry_startup(self):
        """Mean start-up wall time in ms (fastest 90 % of --startup-runs) of
        big_program() calling none of its functions: without the shim, with it
        and ENTRY_LOCKS locks (method auto: entry) on its functions, and with it
        and one lock on a symbol no program defines (whose warn line, like all
        stderr of the timed runs, goes to /dev/null)."""
        path, locked, funcs, build_s = self.big_program()
        cfg = self.config_many(locked, tag="entry")
        cfg0 = self.config(symbol="not_called_anywhere")
        self.check_log("%d locks on %s's functions" % (len(locked), os.path.basename(path)),
                       [path, "call"], cfg, want=[],
                       counts=dict([(": entry patched in", len(locked)),
                                    ("acquired ", len(locked))]
                                   + [("%s: entry patched in" % s, 1) for s in locked]))

        def mean_ms(env):
            ts = []
            for _ in range(self.args.startup_runs):
                t0 = time.perf_counter()
                subprocess.run([path], env=env, check=True, stderr=subprocess.DEVNULL)
                ts.append(time.perf_counter() - t0)
            return statistics.mean(sorted(ts)[: len(ts) * 9 // 10]) * 1000
        plain = mean_ms(self.env(None))
        shim = mean_ms(self.env(cfg))
        shim0 = mean_ms(self.env(cfg0))
        return dict(plain=plain, shim=shim, shim0=shim0, funcs=funcs, locks=len(locked),
                    build_s=build_s, size=os.path.getsize(path))

    # ---- symbols: start-up of programs with large symbol tables ---------------

    def huge_program(self):
        """Generates and builds, once (cached in build/bench/ with a stamp
        naming its size and BIG_VERSION), an executable exporting
        args.big_funcs functions (-rdynamic: each in its dynamic symbols and
        its .symtab) whose main calls SYMBOLS_LOCKS only when given an
        argument. Returns (path, dynamic FUNC symbols, .symtab FUNC symbols,
        build s: 0 when cached)."""
        n = self.args.big_funcs
        d = os.path.join(ROOT, "build", "bench", "symbols-%d" % n)
        path, stamp = os.path.join(d, "huge"), os.path.join(d, "stamp")
        want = "version %d, %d functions, gcc -O0 -rdynamic\n" % (BIG_VERSION, n)
        t0 = time.monotonic()
        try:
            with open(stamp) as f:
                cached = f.read() == want and os.access(path, os.X_OK)
        except OSError:
            cached = False
        if not cached:
            os.makedirs(d, exist_ok=True)
            srcs = []
            for k in range(BIG_SOURCES):
                srcs.append(os.path.join(d, "h%d.c" % k))
                with open(srcs[-1], "w") as f:
                    f.write("".join("int h%d(int x) { return (x * %d + (x >> 3)) ^ %d; }\n"
                                    % (i, i + 1, i) for i in range(k * n // BIG_SOURCES,
                                                                   (k + 1) * n // BIG_SOURCES)))
            srcs.append(os.path.join(d, "main.c"))
            with open(srcs[-1], "w") as f:
                f.write("#include <stdio.h>\n#include <unistd.h>\n"
                        "int main(int argc, char **argv)\n{\n"
                        "\tif (argc > 2)\n\t\treturn rename(argv[1], argv[2]) != 0;\n"
                        "\tif (argc > 1)\n\t\treturn unlink(argv[1]) != 0;\n"
                        "\treturn 0;\n}\n")
            objs = [s[:-2] + ".o" for s in srcs]
            with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 2) as ex:
                list(ex.map(lambda so: subprocess.run(["gcc", "-O0", "-c", "-o", so[1], so[0]],
                                                      check=True), zip(srcs, objs)))
            subprocess.run(["gcc", "-O0", "-rdynamic", "-o", path + ".tmp"] + objs, check=True)
            for o in objs:
                os.unlink(o)
            os.rename(path + ".tmp", path)
            with open(stamp, "w") as f:
                f.write(want)
        dyn, tab = symbol_counts(path)
        if dyn < n or tab < n:
            raise RuntimeError("%s: %d dynamic and %d .symtab FUNC symbols (expected >= %d)"
                               % (path, dyn, tab, n))
        return path, dyn, tab, 0 if cached else time.monotonic() - t0

    def symbols(self):
        """Start-up wall time in ms (median of --symbols-runs runs, the cases
        taken in turn so that a slow spell of the machine hits each alike) of
        node -e 0 (when installed) and of huge_program(): without the shim;
        with two locks on SYMBOLS_LOCKS, method "reloc" and "auto"; with one
        lock on a name no object defines, "reloc" and "auto". Each case is
        checked once in a LOCKSHIM_LOG_LEVEL=debug run: the program's own
        slots of both functions redirected, no entry patched."""
        progs = []
        node = shutil.which("node")
        if node:
            ver = subprocess.run([node, "--version"], capture_output=True, text=True,
                                 timeout=60).stdout.strip()
            dyn, tab = symbol_counts(node)
            progs.append(dict(name="node %s (`node -e 0`)" % ver, argv=[node, "-e", "0"],
                              dyn=dyn, tab=tab, path=node))
        path, dyn, tab, build_s = self.huge_program()
        progs.append(dict(name="generated executable, %d exported functions (`%s`)"
                          % (self.args.big_funcs, os.path.relpath(path, ROOT)),
                          argv=[path], dyn=dyn, tab=tab, path=path, build_s=build_s))
        cfgs = {}
        for method in ("reloc", "auto"):
            cfgs[method] = self.config_symbols(SYMBOLS_LOCKS, method)
            cfgs[method + "-none"] = self.config_symbols(["not_called_anywhere"], method)
        cases = ["none", "reloc", "auto", "reloc-none", "auto-none"]
        res = dict(node=None if node else "no `node` on PATH", progs=progs, cases=cases)
        for prog in progs:
            for method in ("reloc", "auto"):
                self.check_log("%s with method %s" % (prog["name"], method), prog["argv"],
                               cfgs[method], want=["(main): PLT slot of %s redirected" % s
                                                   for s in SYMBOLS_LOCKS]
                               + ["entries: 0 call site(s) redirected"],
                               unwanted=["entry patched"])
            envs = dict(none=self.env(None))
            envs.update((c, self.env(cfgs[c])) for c in cases[1:])
            ts, cpu = dict((c, []) for c in cases), dict((c, []) for c in cases)
            for _ in range(self.args.symbols_runs):
                for c in cases:
                    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
                    t0 = time.perf_counter()
                    subprocess.run(prog["argv"], env=envs[c], check=True,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                    ts[c].append(time.perf_counter() - t0)
                    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
                    cpu[c].append(r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime)
            prog["ms"] = dict((c, statistics.median(ts[c]) * 1000) for c in cases)
            prog["cpu"] = dict((c, statistics.median(cpu[c]) * 1000) for c in cases)
        res["load"] = "%.1f" % os.getloadavg()[0]
        return res

    def config_symbols(self, symbols, method):
        """A config with one lock per symbol, all with method."""
        path = os.path.join(self.work, "symbols-%s-%d.cfg" % (method, len(symbols)))
        with open(path, "w") as f:
            f.write('redis = { host = "127.0.0.1"; port = %d; };\nlocks = (\n%s\n);\n'
                    % (self.server.port, ",\n".join('  { symbol = "%s"; method = "%s"; }'
                                                     % (s, method) for s in symbols)))
        return path

    # ---- cluster and redlock ------------------------------------------------

    def spread_runs(self, cfg, paths, servers):
        """One run of len(paths) processes, each args.cluster_k sections of
        its own counter file guarded by its own key (the path, key
        "{arg0:str}"): (sections/s, commands/section, read events/section,
        {port: commands}); every counter must be exact."""
        k = self.args.cluster_k
        for path in paths:
            with open(path, "w") as f:
                f.write("0 0\n")
        for srv in servers:
            srv.client.cmd("CONFIG", "RESETSTAT")
        wall, _ = run_workers([[self.worker, "section", path, str(k)] for path in paths],
                              env=self.env(cfg))
        per = {srv.port: server_counts(srv.client) for srv in servers}
        for path in paths:
            with open(path) as f:
                got = int(f.read().split()[0])
            if got != k:
                raise RuntimeError("%s: counter %d, expected %d" % (path, got, k))
        n = k * len(paths)
        return dict(rate=n / wall, cmds=sum(c for c, _ in per.values()) / n,
                    reads=sum(r for _, r in per.values()) / n,
                    per={port: c for port, (c, _) in per.items()})

    def cluster(self):
        """P = 1, 2, 4, 8 processes each guarding its own key (keys whose
        slots are on the three primaries in turn), against a cluster of three
        primaries and against the bench's standalone server, default
        settings and linger_ms = 0; each row the run with the median
        sections/s of args.reps."""
        cl = Cluster(self.work)
        try:
            ports = sorted({p for p in cl.slots.values()},
                           key=lambda p: min(s for s, q in cl.slots.items() if q == p))
            paths, i = [], 0
            while len(paths) < max(CLUSTER_PS):
                path = os.path.join(self.work, "spread-%d" % i)
                i += 1
                if cl.owner("lockshim:{%s}" % path) == ports[len(paths) % len(ports)]:
                    paths.append(path)
            cfgs = {}
            for mode, extra in (("default", ""), ("0", NO_LINGER)):
                cfgs[("cluster", mode)] = self.config(
                    extra=extra, tag="cluster-" + mode, key="{arg0:str}",
                    group="cluster = ( %s );" % cl.seeds())
                cfgs[("single", mode)] = self.config(extra=extra, tag="single-" + mode,
                                                     key="{arg0:str}")
            with open(paths[0], "w") as f:
                f.write("0 0\n")
            self.check_log("section in a cluster", [self.worker, "section", paths[0], "3"],
                           cfgs[("cluster", "0")],
                           want=["acquired lockshim:{%s}" % paths[0]],
                           unwanted=[" error: ", " warn: "], stdin="g")
            res = dict(primaries=ports)
            for (topo, mode), cfg in sorted(cfgs.items()):
                servers = cl.nodes if topo == "cluster" else [self.server]
                for p in CLUSTER_PS:
                    runs = sorted((self.spread_runs(cfg, paths[:p], servers)
                                   for _ in range(self.args.reps)), key=lambda r: r["rate"])
                    r = runs[len(runs) // 2]
                    r["rates"] = [x["rate"] for x in runs]
                    res[(topo, mode, p)] = r
            return res
        finally:
            cl.stop()

    def redlock(self):
        """Redlock over three independent masters (redis.masters) against the
        standard backend on one server (the bench's): the uncontended
        guarded call minus unguarded (µs, best of 3 runs), linger_ms = 0
        and default, per placement (all servers on the server CPU); and
        P = 8 processes x args.k contended sections on one key, median of
        args.reps runs."""
        masters = []
        try:
            for i in range(3):
                masters.append(Plain(self.work, "master%d" % i))
            group = "masters = ( %s );" % ", ".join(
                '{ host = "127.0.0.1"; port = %d; }' % m.port for m in masters)
            probe = subprocess.run([os.path.join(self.build, "lockshim"), "check", "-c",
                                    self.config(tag="redlock-probe", group=group)],
                                   env=self.env(None), capture_output=True, text=True,
                                   timeout=60, stdin=subprocess.DEVNULL)
            if "no backend serves" in probe.stderr:
                why = "this build has no Redlock backend (lockshim check: %s)" % (
                    probe.stderr.strip().splitlines()[-1])
                if self.args.only:
                    raise RuntimeError(why)
                return dict(skipped=why)
            cfgs = {}
            for linger, extra in (("0", NO_LINGER), ("default", "")):
                cfgs[(linger, 1)] = self.config(symbol="bench_noop", extra=extra,
                                                tag="one-" + linger)
                cfgs[(linger, 3)] = cfg = self.config(symbol="bench_noop", extra=extra,
                                                      tag="redlock-" + linger, group=group)
                self.check_log("bench_noop with Redlock, linger %s" % linger,
                               [self.worker, "noop", "-", "3"], cfg, want=["acquired "],
                               unwanted=[" error: ", " warn: "], stdin="g")
            res = {}
            for place, server_cpu, client_cpu in [("1 CPU", "0", "0"), ("2 CPUs", "1", "0")]:
                for srv in [self.server] + masters:
                    srv.pin(server_cpu)
                plain = self.noop(client_cpu, None)
                res[place] = {key: self.noop(client_cpu, cfg) - plain
                              for key, cfg in cfgs.items()}
            for srv in [self.server] + masters:
                srv.pin("0,1")
            argv = [self.worker, "section", self.counter, str(self.args.k)]
            for n, grp in ((1, None), (3, group)):
                env = self.env(self.config(tag="contended-%d" % n, group=grp))
                runs = sorted((self.contended_once(argv, env, 8) for _ in range(self.args.reps)),
                              key=lambda r: r["rate"])
                r = runs[len(runs) // 2]
                r["rates"] = [x["rate"] for x in runs]
                res[("contended", n)] = r
            return res
        finally:
            for m in masters:
                m.stop()

    # ---- holder sets and several keys ---------------------------------------

    def sets(self):
        """The uncontended guarded call minus unguarded (µs, linger_ms = 0,
        client and server on one CPU, and on two) of each SETS_CASES lock, the cases
        measured in turns over args.sets_rounds rounds (medians), each
        checked once with LOCKSHIM_LOG_LEVEL=debug (acquired, no warning);
        the same across a link (a proxy holding each reply LINK_DELAY_S: a
        round trip like a LAN's; unpinned, args.n // LINK_CALLS_DIV calls);
        and P = 8 x args.k sections on one key, limit = 4 against exclusive
        (the run with the median sections/s of args.reps; the counter is not
        exact with 4 inside at once, by design)."""
        cfgs = {}
        for name, _, extra, key in SETS_CASES:
            cfgs[name] = cfg = self.config(symbol="bench_noop", extra=NO_LINGER + extra,
                                           tag="sets-" + name, key=key)
            self.check_log("bench_noop, %s" % name, [self.worker, "noop", "-", "3"], cfg,
                           want=["acquired "], unwanted=[" error: ", " warn: "], stdin="g")
        res = {}
        for place, server_cpu in (("1 CPU", "0"), ("2 CPUs", "1")):
            got = {name: [] for name in cfgs}
            self.server.pin(server_cpu)
            try:
                for _ in range(self.args.sets_rounds):
                    plain = self.noop("0", None)
                    for name, cfg in cfgs.items():
                        got[name].append(self.noop("0", cfg) - plain)
            finally:
                self.server.pin("0,1")
            res[place] = {name: statistics.median(v) for name, v in got.items()}
        proxy = Proxy(self.server.port, reply_delay=LINK_DELAY_S).start()
        try:
            group = 'host = "127.0.0.1"; port = %d;' % proxy.port
            linked = {name: self.config(symbol="bench_noop", extra=NO_LINGER + extra,
                                        tag="sets-link-" + name, key=key, group=group)
                      for name, _, extra, key in SETS_CASES}
            n = max(100, self.args.n // LINK_CALLS_DIV)
            got = {name: [] for name in linked}
            for _ in range(self.args.sets_rounds):
                for name, cfg in linked.items():
                    got[name].append(self.noop("0,1", cfg, n=n))
            res["link"] = {name: statistics.median(v) for name, v in got.items()}
        finally:
            proxy.stop()
        argv = [self.worker, "section", self.counter, str(self.args.k)]
        for name, extra in (("p8", ""), ("p8-limit4", "limit = 4;")):
            env = self.env(self.config(extra=extra, tag="sets-" + name))
            runs = sorted((self.contended_once(argv, env, 8) for _ in range(self.args.reps)),
                          key=lambda r: r["rate"])
            res[name] = runs[len(runs) // 2]
        return res

    # ---- the local backend ------------------------------------------------

    def local_config(self, symbol, tag):
        """A config of backend "local" (its dir in the bench's work directory)
        with one lock on symbol, key "bench"."""
        path = os.path.join(self.work, "local-%s.cfg" % tag)
        with open(path, "w") as f:
            f.write('backend = "local";\nlocal = { dir = "%s"; };\n'
                    'locks = ( { symbol = "%s"; key = "bench"; wait_ms = 600000; %s } );\n'
                    % (os.path.join(self.work, "locks"), symbol, self.args.settings))
        return path

    def local(self):
        """backend = "local": the uncontended guarded call minus unguarded (µs,
        one CPU; the best of 3 runs, median of args.sets_rounds rounds, in
        turns with the redis call of linger_ms = 0 for comparison), and P = 8
        x local_k sections on one key against bare flock(2) of one file, and
        x args.k with Redis's linger_ms = 0 lock (the run with the median
        sections/s of args.reps; the counter is checked)."""
        cfg = self.local_config("bench_noop", "noop")
        self.check_log("bench_noop, local", [self.worker, "noop", "-", "3"], cfg,
                       want=["acquired "], unwanted=[" error: ", " warn: "], stdin="g")
        redis0 = self.config(symbol="bench_noop", extra=NO_LINGER)
        got = {"local": [], "redis0": []}
        for _ in range(self.args.sets_rounds):
            plain = self.noop("0", None)
            got["local"].append(self.noop("0", cfg) - plain)
            got["redis0"].append(self.noop("0", redis0) - plain)
        res = {name: statistics.median(v) for name, v in got.items()}
        k = local_k(self.args)
        for name, argv, env, n in (
                ("p8-local", [self.worker, "section", self.counter, str(k)],
                 self.env(self.local_config("section", "section")), k),
                ("p8-flock", [self.worker, "flock", self.counter, str(k),
                              os.path.join(self.work, "flock.lock")], self.env(None), k),
                ("p8-redis", [self.worker, "section", self.counter, str(self.args.k)],
                 self.env(self.config(extra=NO_LINGER, tag="p8-redis0")), self.args.k)):
            runs = sorted((self.contended_once(argv, env, 8, n) for _ in range(self.args.reps)),
                          key=lambda r: r["rate"])
            res[name] = runs[len(runs) // 2]
        return res

    # ---- the backends built as modules ------------------------------------

    def module_config(self, name, server, symbol, tag):
        """A config of backend name (MODULE_BACKENDS) on server with one lock
        on symbol, key "bench"."""
        path = os.path.join(self.work, "%s-%s.cfg" % (name, tag))
        with open(path, "w") as f:
            f.write('backend = "%s";\n%s\n'
                    'locks = ( { symbol = "%s"; key = "bench"; wait_ms = 600000; %s } );\n'
                    % (name, MODULE_BACKENDS[name]["group"](server), symbol,
                       self.args.settings))
        return path

    def module_backend(self, name):
        """backend name (postgres, zookeeper, etcd: MODULE_BACKENDS) on a
        private server started as the tests start it (skipped, saying why,
        where it cannot run): the uncontended guarded call minus unguarded
        (µs, one CPU; the best of 3 runs of args.n / 10 calls, median of
        args.sets_rounds rounds, in turns with the redis call of linger_ms =
        0), and P = 8 x args.k sections on one key (the run with the median
        sections/s of args.reps; the counter is checked). Returns {name: µs,
        "redis0": µs, "p8-" + name: run} or {"skipped": why}."""
        mb = MODULE_BACKENDS[name]
        why = mb["support"].skip_reason()
        if why:
            return {"skipped": why}
        server = mb["server"]().start()
        try:
            cfg = self.module_config(name, server, "bench_noop", "noop")
            self.check_log("bench_noop, " + name, [self.worker, "noop", "-", "3"], cfg,
                           want=["acquired "], unwanted=[" error: "], stdin="g")
            redis0 = self.config(symbol="bench_noop", extra=NO_LINGER)
            n = max(100, self.args.n // 10)
            got = {name: [], "redis0": []}
            for _ in range(self.args.sets_rounds):
                plain = self.noop("0", None, n=n)
                got[name].append(self.noop("0", cfg, n=n) - plain)
                got["redis0"].append(self.noop("0", redis0, n=n) - plain)
            res = {k: statistics.median(v) for k, v in got.items()}
            env = self.env(self.module_config(name, server, "section", "section"))
            runs = sorted((self.contended_once([self.worker, "section", self.counter,
                                                str(self.args.k)], env, 8)
                           for _ in range(self.args.reps)), key=lambda r: r["rate"])
            res["p8-" + name] = runs[len(runs) // 2]
            return res
        finally:
            server.cleanup()

    def close(self):
        self.server.stop()
        shutil.rmtree(self.work, ignore_errors=True)


NO_LINGER = "linger_ms = 0;"
LINK_DELAY_S = 0.0002  # the sets part's link: each reply held 0.2 ms
LINK_CALLS_DIV = 20    # ... and args.n / 20 calls per run there
IMPLS = [("poll", "plain C, SET NX / 1 ms poll / compare-and-delete"),
         ("lockshim", "lockshim, default"),
         ("lockshim-0", "lockshim, linger_ms = 0"),
         ("lockshim-fair", "lockshim, fair = true"),
         ("redis-py", "redis-py Lock, defaults (sleep 0.1)"),
         ("redis-py-0.001", "redis-py Lock, sleep=0.001")]
PARTS = ["uncontended", "contended", "startup", "imports", "entry", "symbols", "tls",
         "replicas", "cluster", "redlock", "sets", "local", "postgres", "zookeeper",
         "etcd", "versus"]
# The backends built as modules (Bench.module_backend), one part each: its
# tests' support module, its server, its config group on that server, and
# its report section's title and set-up sentence.
MODULE_BACKENDS = {
    "postgres": {"support": pg_support, "server": pg_support.PostgresServer,
                 "group": lambda s: 'postgres = { conninfo = "%s"; };' % s.conninfo(),
                 "what": "session advisory locks", "where": "A private cluster on loopback."},
    "zookeeper": {"support": zk_support, "server": zk_support.ZookeeperServer,
                  "group": lambda s: 'zookeeper = { hosts = "%s"; };' % s.hosts(),
                  "what": "ephemeral sequential znodes",
                  "where": "A private standalone server on loopback."},
    "etcd": {"support": etcd_support, "server": etcd_support.EtcdServer,
             "group": lambda s: 'etcd = { endpoints = ( "%s" ); };' % s.endpoint(),
             "what": "a key with a lease",
             "where": "A private etcd on loopback (its data dir in tmp, fsync on)."},
}
# The sets part: name, row, the lock's extra settings, its key (None: `keys`).
SETS_CASES = [("exclusive", "exclusive lock (today's)", "", "bench"),
              ("limit3", "limit = 3", "limit = 3;", "bench"),
              ("shared", 'mode = "shared"', 'mode = "shared";', "bench"),
              ("keys2", "keys of two", 'keys = ( "bench:a", "bench:b" );', None)]
CLUSTER_PS = (1, 2, 4, 8)
# The versus part: key, row name, unit, and whether more is better.
VERSUS = [("call", "uncontended guarded call, default (lock kept between calls), one CPU", "µs"),
          ("call0", "uncontended guarded call, linger_ms = 0, one CPU", "µs"),
          ("p8", "P=8 contended, lockshim default: sections/s", "/s"),
          ("startup", "start-up cost of the shim", "ms")]
ENTRY_CASES = [("reloc", 'library function (bench_noop_wide in libsection.so, through the '
                'PLT), method = "reloc"'),
               ("entry", 'the same library function, method = "entry"'),
               ("exe", 'the executable\'s own function (bench_noop_exe, a direct call), '
                'method = "entry"')]


def report_module(add, args, name, res):
    """Adds the section of backend name (MODULE_BACKENDS) measured as res
    (Bench.module_backend's; nothing when None)."""
    if res and "skipped" in res:
        add("## The %s backend: not measured (%s)" % (name, res["skipped"]))
        add("")
    elif res:
        mb = MODULE_BACKENDS[name]
        add("## The %s backend (%s, backend = \"%s\")" % (name, mb["what"], name))
        add("")
        add("%s Guarded uncontended call minus unguarded, one CPU, median of %d rounds "
            "(each the best of 3 runs of %d calls), in turns with the Redis call of "
            "linger_ms = 0:" % (mb["where"], args.sets_rounds, max(100, args.n // 10)))
        add("")
        add("| lock | guarded call |")
        add("|---|---:|")
        add("| **backend = \"%s\"** | **%.1f µs** |" % (name, res[name]))
        add("| redis, linger_ms = 0 | %.1f µs |" % res["redis0"])
        add("")
        r = res["p8-" + name]
        add("P = 8 processes x %d sections on one key (unpinned; the run with the median "
            "sections/s of %d): %.0f sections/s, wait median %.2f ms, p99 %.2f ms, max "
            "%.2f ms, counter %s." % (args.k, args.reps, r["rate"], r["med"], r["p99"],
                                      r["max"], "exact" if r["exact"] else
                                      "NOT exact (%d of %d)" % (r["final"], r["n"])))
        add("")


def side_by_side(add, args, con, startup, local, modules, versus):
    """Adds one table of every backend measured in this run (when two or
    more were): the uncontended guarded call, P = 8 sections/s and worst
    wait; then the start-up cost of a program guarded with Redis (and,
    with --baseline, before and after)."""
    rows = []
    redis0 = [r["redis0"] for r in [local] + list(modules.values())
              if r and "skipped" not in r]
    p8 = con.get(("lockshim-0", 8)) if con else local and local.get("p8-redis")
    if redis0 or p8:
        rows.append(('redis (linger_ms = 0)', statistics.median(redis0) if redis0 else None,
                     p8))
    if local:
        rows.append(('local', local["local"], local["p8-local"]))
    for name, res in modules.items():
        if res and "skipped" not in res:
            rows.append((name, res[name], res["p8-" + name]))
    if len(rows) < 2:
        return
    add("## Every backend side by side")
    add("")
    add("One run of this bench; the uncontended guarded call minus unguarded on one CPU, "
        "and P = 8 processes x %d sections on one key (unpinned; the median run). Redis's "
        "P = 8 row is the contended part's linger_ms = 0 run, or the local part's." % args.k)
    add("")
    add("| backend | uncontended call | P=8 sections/s | P=8 worst wait |")
    add("|---|---:|---:|---:|")
    for name, call, r in rows:
        add("| %s | %s | %s | %s |" % (
            name, "%.1f µs" % call if call is not None else "–",
            "%.0f" % r["rate"] if r else "–", "%.1f ms" % r["max"] if r else "–"))
    add("")
    if startup:
        add("Start-up cost of a program guarded with Redis (a lock it does not call): "
            "%.2f ms; the modules are not loaded then." % (startup[1] - startup[0]))
    if versus:
        add("Before and after (--baseline %s): %.2f ms, then %.2f ms."
            % (args.baseline, versus["startup"]["before"], versus["startup"]["after"]))
    if startup or versus:
        add("")


def report(b, args, unc=None, con=None, startup=None, imports=None, entry=None, symbols=None,
           tls=None, replicas=None, cluster=None, redlock=None, sets=None, local=None,
           postgres=None, zookeeper=None, etcd=None, versus=None):
    """The markdown report of the parts measured (those not None)."""
    lines = []
    add = lines.append
    add("# lockshim benchmark")
    add("")
    add("%s, %s, %d CPUs, %s, redis-server %s. Command: `%s`." % (
        datetime.datetime.now().strftime("%Y-%m-%d %H:%M"), platform.machine(), os.cpu_count(),
        platform.release(), b.server.client.cmd("INFO", "server").split("redis_version:")[1]
        .split()[0], "make bench" if args.make else " ".join(sys.argv)))
    add("")
    if unc:
        add("## Uncontended (medians; guarded call = guarded minus unguarded, per call)")
        add("")
        add("| measured | client and server on one CPU | on two CPUs |")
        add("|---|---:|---:|")
        u1, u2 = unc["1 CPU"], unc["2 CPUs"]
        add("| PING round trip | %.1f µs | %.1f µs |" % (u1["ping"], u2["ping"]))
        add("| plain hiredis SET NX PX + EVALSHA compare-and-delete | %.1f µs | %.1f µs |"
            % (u1["pair"], u2["pair"]))
        if u1["py"] is not None:
            add("| redis-py Lock acquire+release | %.1f µs | %.1f µs |" % (u1["py"], u2["py"]))
        add("| **lockshim guarded call, default (lock kept between calls)** | **%.1f µs** "
            "| **%.1f µs** |" % (u1["guarded"], u2["guarded"]))
        add("| ratio to the plain pair (target ≤ 0.75) | %.2f | %.2f |"
            % (u1["guarded"] / u1["pair"], u2["guarded"] / u2["pair"]))
        add("| **lockshim guarded call, linger_ms = 0 (acquire and release every call)** "
            "| **%.1f µs** | **%.1f µs** |" % (u1["guarded0"], u2["guarded0"]))
        add("| ratio to the plain pair (target ≤ 0.75) | %.2f | %.2f |"
            % (u1["guarded0"] / u1["pair"], u2["guarded0"] / u2["pair"]))
        if u1["py"] is not None:
            add("| ratio to redis-py, linger_ms = 0 | %.2f | %.2f |"
                % (u1["guarded0"] / u1["py"], u2["guarded0"] / u2["py"]))
        add("")
    if con:
        add("## Contended: P processes x %d sections on one key (both CPUs, unpinned; the run "
            "with the median sections/s of %d)" % (args.k, args.reps))
        add("")
        add("| implementation | P | sections/s (min-max of the runs) | wait median | p99 | max | hand-offs/section "
            "| per-process time min/max | commands sent/section | commandstats/section "
            "| counter exact |")
        add("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
        for impl, label in IMPLS:
            for p in (2, 4, 8):
                r = con.get((impl, p))
                if not r:
                    continue
                add("| %s | %d | %.0f (%.0f-%.0f) | %.2f ms | %.2f ms | %.2f ms | %.2f "
                    "| %.0f / %.0f ms | %.1f | %.1f | %s |"
                    % (label, p, r["rate"], r["rates"][0], r["rates"][-1], r["med"], r["p99"], r["max"], r["handoffs"], r["pmin"],
                       r["pmax"], r["sent"], r["cmds"], "yes" if r["exact"] else "NO (%d of %d)"
                       % (r["final"], r["n"])))
        add("")
    if startup:
        add("## Start-up of a program that calls no guarded function")
        add("")
        add("| | mean wall time per run (fastest 90 %% of %d) |" % args.startup_runs)
        add("|---|---:|")
        add("| without the shim | %.2f ms |" % startup[0])
        add("| with the shim | %.2f ms |" % startup[1])
        add("| cost of the shim (target < 2 ms) | %.2f ms |" % (startup[1] - startup[0]))
        add("| with the shim, the program out of scope | %.2f ms |" % startup[2])
        add("| cost of the shim out of scope (target < 1 ms) | %.2f ms |" % (startup[2] - startup[0]))
        add("")
    if imports:
        add("## python3 importing %d C extension modules (%d locks configured)"
            % (len(IMPORT_MODULES), IMPORT_LOCKS))
        add("")
        add("`%s` importing %s from %s: %d dlopens, each followed by the shim's scan "
            "of the newly loaded objects; the locks guard symbols python never calls."
            % (SYSTEM_PYTHON, ", ".join(IMPORT_MODULES), LIB_DYNLOAD, len(IMPORT_MODULES)))
        add("")
        add("| | mean wall time per run (fastest 90 %% of %d) |" % args.import_runs)
        add("|---|---:|")
        add("| without the shim | %.2f ms |" % imports[0])
        add("| with the shim, %d locks | %.2f ms |" % (IMPORT_LOCKS, imports[1]))
        add("| cost of the shim (target < 5 ms) | %.2f ms |" % (imports[1] - imports[0]))
        add("")
    if entry:
        ec, es = entry["calls"], entry["startup"]
        e1, e2 = ec["1 CPU"], ec["2 CPUs"]
        add("## Entry patching versus relocation patching")
        add("")
        add("Guarded uncontended call, default settings (lock kept between calls): guarded "
            "minus unguarded, per call, best of 3 runs of %d calls. Each lock checked once with "
            "LOCKSHIM_LOG_LEVEL=debug (\"entry patched\" or \"PLT slot of\", and \"acquired\")."
            % args.n)
        add("")
        add("| measured | client and server on one CPU | on two CPUs |")
        add("|---|---:|---:|")
        add("| unguarded call, library function through the PLT | %.4f µs | %.4f µs |"
            % (e1["plain_lib"], e2["plain_lib"]))
        add("| unguarded call, the executable's own function | %.4f µs | %.4f µs |"
            % (e1["plain_exe"], e2["plain_exe"]))
        for key, label in ENTRY_CASES:
            add("| **guarded call, %s** | **%.2f µs** | **%.2f µs** |" % (label, e1[key], e2[key]))
        add("| ratio entry / reloc, library function (same cost: ≤ 1.10) | %.2f | %.2f |"
            % (e1["entry"] / e1["reloc"], e2["entry"] / e2["reloc"]))
        add("| ratio entry (executable's function) / reloc (library function) (same cost: "
            "≤ 1.10) | %.2f | %.2f |" % (e1["exe"] / e1["reloc"], e2["exe"] / e2["reloc"]))
        add("")
        add("Start-up of a generated executable (%d -O0 functions, %d FUNC symbols in its "
            ".symtab, %.1f MB, built in %.0f s) whose main calls none of them; the %d locks "
            "(method auto, i.e. entry) guard %d of its functions (checked once with "
            "LOCKSHIM_LOG_LEVEL=debug and an argument making main call them: %d \"entry "
            "patched\" and %d \"acquired\" lines)."
            % (args.symtab_funcs, es["funcs"], es["size"] / 1e6, es["build_s"], es["locks"],
               es["locks"], es["locks"], es["locks"]))
        add("")
        add("| | mean wall time per run (fastest 90 %% of %d) |" % args.startup_runs)
        add("|---|---:|")
        add("| without the shim | %.2f ms |" % es["plain"])
        add("| with the shim, %d locks entry-patching its functions | %.2f ms |"
            % (es["locks"], es["shim"]))
        add("| with the shim, 1 lock on a function no program defines (reference) | %.2f ms |"
            % es["shim0"])
        add("| **cost of entry-patching %d functions (target < 10 ms)** | **%.2f ms** |"
            % (es["locks"], es["shim"] - es["plain"]))
        add("| cost of the shim with the reference lock | %.2f ms |" % (es["shim0"] - es["plain"]))
        add("")
    if symbols:
        add("## Start-up of programs with large symbol tables")
        add("")
        add("Wall time of one run, the median of %d runs per case, the cases taken in turn. "
            "Locks: two on library functions both programs import and do not call here (%s), "
            "with `method = \"reloc\"` and with `\"auto\"` (the default); and one on a name "
            "no object defines. Each lock case was checked once with LOCKSHIM_LOG_LEVEL=debug: "
            "the program's own PLT slots of both functions redirected, no entry patched. "
            "CPU time: the child's user + system time (all its threads), less disturbed "
            "than wall time when other work shares the machine (load average %s at the "
            "end of this part)."
            % (args.symbols_runs, ", ".join("`%s`" % s for s in SYMBOLS_LOCKS),
               symbols["load"]))
        add("")
        for prog in symbols["progs"]:
            m, u = prog["ms"], prog["cpu"]
            add("%s: %d dynamic and %d `.symtab` function symbols%s." % (
                prog["name"][0].upper() + prog["name"][1:], prog["dyn"], prog["tab"],
                (", built in %.0f s" % prog["build_s"]) if prog.get("build_s") else
                (" (cached build)" if "build_s" in prog else "")))
            add("")
            add("| | median wall time per run | median CPU time (user + system) |")
            add("|---|---:|---:|")
            for c, label in (("none", "without the shim"),
                             ("reloc", "two locks, method \"reloc\""),
                             ("auto", "two locks, method \"auto\"")):
                add("| %s | %.2f ms | %.2f ms |" % (label, m[c], u[c]))
            add("| **auto minus reloc (target ≤ 2 ms)** | **%.2f ms** | **%.2f ms** |"
                % (m["auto"] - m["reloc"], u["auto"] - u["reloc"]))
            add("| cost of the shim, reloc | %.2f ms | %.2f ms |"
                % (m["reloc"] - m["none"], u["reloc"] - u["none"]))
            for c, label in (("reloc-none", "one lock on a name no object defines, \"reloc\""),
                             ("auto-none", "one lock on a name no object defines, \"auto\"")):
                add("| %s | %.2f ms | %.2f ms |" % (label, m[c], u[c]))
            add("| auto minus reloc, the undefined name | %.2f ms | %.2f ms |"
                % (m["auto-none"] - m["reloc-none"], u["auto-none"] - u["reloc-none"]))
            add("")
        if symbols["node"]:
            add("node: not measured (%s)." % symbols["node"])
            add("")
    if tls:
        t1, t2 = tls["1 CPU"], tls["2 CPUs"]
        add("## Uncontended over TLS against plain TCP (guarded call = guarded minus "
            "unguarded, per call)")
        add("")
        add("The same server's plain port and TLS port (redis.tls, the server verified by "
            "CA and IP address), best of 3 runs of %d calls each." % args.n)
        add("")
        add("| measured | client and server on one CPU | on two CPUs |")
        add("|---|---:|---:|")
        for linger, label in (("0", "linger_ms = 0 (acquire and release every call)"),
                              ("default", "default (lock kept between calls)")):
            add("| guarded call, %s, plain TCP | %.2f µs | %.2f µs |"
                % (label, t1[(linger, False)], t2[(linger, False)]))
            add("| **guarded call, %s, TLS** | **%.2f µs** | **%.2f µs** |"
                % (label, t1[(linger, True)], t2[(linger, True)]))
            add("| ratio TLS / plain TCP%s | %.2f | %.2f |"
                % (" (target < 1.3)" if linger == "0" else "",
                   t1[(linger, True)] / t1[(linger, False)],
                   t2[(linger, True)] / t2[(linger, False)]))
        add("")
    if replicas:
        r1, r2 = replicas["1 CPU"], replicas["2 CPUs"]
        add("## Replica acknowledgement (wait_replicas = 1, one local replica)")
        add("")
        add("Guarded uncontended call, linger_ms = 0 (an acquire and a release per call), "
            "guarded minus unguarded, best of 3 runs of %d calls; WAIT is sent in the same "
            "write as the SET." % args.n)
        add("")
        add("| measured | client and server on one CPU | on two CPUs |")
        add("|---|---:|---:|")
        add("| guarded call, wait_replicas = 0 | %.2f µs | %.2f µs |" % (r1[0], r2[0]))
        add("| guarded call, wait_replicas = 1 | %.2f µs | %.2f µs |" % (r1[1], r2[1]))
        add("| **added per acquire** | **%.2f µs** | **%.2f µs** |"
            % (r1[1] - r1[0], r2[1] - r2[0]))
        add("")
    if cluster:
        add("## Redis Cluster: P processes, each guarding its own key")
        add("")
        add("Three primaries, no replicas (cluster nodes started for this part), against the "
            "bench's standalone server, same workload in the same run: P processes x %d "
            "sections of a counter file of their own, each guarded by its own key (key "
            "\"{arg0:str}\", the path; the paths chosen so that the P keys' slots are on the "
            "three primaries in turn, P = 1 uses one). Each row the run with the median "
            "sections/s of %d (min-max in brackets); every counter exact. Commands: INFO "
            "commandstats calls summed over the servers, per section. Read events: the "
            "servers' total_reads_processed (INFO stats) summed, per section: each is one "
            "read of a client's socket by the server, about one per round trip (commands "
            "written together are one read)." % (args.cluster_k, args.reps))
        add("")
        add("| settings | P | standalone sections/s | cluster sections/s | cluster / standalone "
            "| commands/section standalone / cluster | read events/section standalone / "
            "cluster | cluster commands per primary |")
        add("|---|---:|---:|---:|---:|---:|---:|---|")
        for mode, label in (("default", "default (lock kept between calls)"),
                            ("0", "linger_ms = 0")):
            for p in CLUSTER_PS:
                a, c = cluster[("single", mode, p)], cluster[("cluster", mode, p)]
                add("| %s | %d | %.0f (%.0f-%.0f) | %.0f (%.0f-%.0f) | %.2f | %.2f / %.2f "
                    "| %.2f / %.2f | %s |"
                    % (label, p, a["rate"], a["rates"][0], a["rates"][-1], c["rate"],
                       c["rates"][0], c["rates"][-1], c["rate"] / a["rate"], a["cmds"],
                       c["cmds"], a["reads"], c["reads"],
                       " / ".join("%d" % c["per"][port] for port in cluster["primaries"])))
        add("")
    if redlock and "skipped" in redlock:
        add("## Redlock (redis.masters)")
        add("")
        add("Not measured: %s." % redlock["skipped"])
        add("")
    elif redlock:
        r1, r2 = redlock["1 CPU"], redlock["2 CPUs"]
        add("## Redlock: three independent masters against one server")
        add("")
        add("Guarded uncontended call, guarded minus unguarded, best of 3 runs of %d calls; "
            "one server: the standard backend on the bench's server; Redlock: redis.masters, "
            "three plain redis-servers started for this part (all servers on the server CPU: "
            "the three masters' server work adds up there, while their round trips overlap)."
            % args.n)
        add("")
        add("| measured | client and servers on one CPU | on two CPUs |")
        add("|---|---:|---:|")
        for linger, label in (("0", "linger_ms = 0 (acquire and release every call)"),
                              ("default", "default (lock kept between calls)")):
            add("| guarded call, %s, one server | %.2f µs | %.2f µs |"
                % (label, r1[(linger, 1)], r2[(linger, 1)]))
            add("| **guarded call, %s, Redlock (3 masters)** | **%.2f µs** | **%.2f µs** |"
                % (label, r1[(linger, 3)], r2[(linger, 3)]))
            add("| ratio Redlock / one server%s | %.2f | %.2f |"
                % (" (target < 1.5)" if linger == "0" else "",
                   r1[(linger, 3)] / r1[(linger, 1)], r2[(linger, 3)] / r2[(linger, 1)]))
        add("")
        add("P = 8 processes x %d sections on one key (default settings, unpinned; the run "
            "with the median sections/s of %d):" % (args.k, args.reps))
        add("")
        add("| backend | sections/s (min-max) | wait median | p99 | max | hand-offs/section "
            "| counter exact |")
        add("|---|---:|---:|---:|---:|---:|---|")
        for n, label in ((1, "one server"), (3, "Redlock, 3 masters")):
            r = redlock[("contended", n)]
            add("| %s | %.0f (%.0f-%.0f) | %.2f ms | %.2f ms | %.2f ms | %.2f | %s |"
                % (label, r["rate"], r["rates"][0], r["rates"][-1], r["med"], r["p99"],
                   r["max"], r["handoffs"],
                   "yes" if r["exact"] else "NO (%d of %d)" % (r["final"], r["n"])))
        add("")
    if sets:
        add("## Semaphores, shared locks, several keys")
        add("")
        add("Guarded uncontended call minus unguarded, linger_ms = 0 (an acquire and a release "
            "every call: one round trip each, the release not waited for); median of %d rounds, "
            "the cases measured in turns, each the best of 3 runs of %d calls. On one CPU the "
            "server's script time is on the client's core; on two it overlaps the client's."
            % (args.sets_rounds, args.n))
        add("")
        add("Across a link, the whole call (not minus unguarded): the server behind a proxy "
            "that holds each reply %.1f ms, a round trip like a LAN's; unpinned, %d calls a run."
            % (LINK_DELAY_S * 1000, max(100, args.n // LINK_CALLS_DIV)))
        add("")
        add("| lock | one CPU | / exclusive | two CPUs | / exclusive | link | / exclusive |")
        add("|---|---:|---:|---:|---:|---:|---:|")
        s1, s2, sl = sets["1 CPU"], sets["2 CPUs"], sets["link"]
        for name, label, _, _ in SETS_CASES:
            add("| %s | %.2f µs | %.2f | %.2f µs | %.2f | %.1f µs | %.2f |" % (
                label, s1[name], s1[name] / s1["exclusive"], s2[name],
                s2[name] / s2["exclusive"], sl[name], sl[name] / sl["exclusive"]))
        add("")
        add("P = 8 processes x %d sections on one key (default settings, unpinned; the run with "
            "the median sections/s of %d):" % (args.k, args.reps))
        add("")
        add("| lock | sections/s | wait median | p99 | max |")
        add("|---|---:|---:|---:|---:|")
        for name, label in (("p8", "exclusive"), ("p8-limit4", "limit = 4")):
            r = sets[name]
            add("| %s | %.0f | %.2f ms | %.2f ms | %.2f ms |" % (label, r["rate"], r["med"],
                                                                 r["p99"], r["max"]))
        add("")
    if local:
        add("## The local backend (kernel file locks, backend = \"local\")")
        add("")
        add("Guarded uncontended call minus unguarded, one CPU, median of %d rounds (each the "
            "best of 3 runs of %d calls), in turns with the Redis call of linger_ms = 0:"
            % (args.sets_rounds, args.n))
        add("")
        add("| lock | guarded call |")
        add("|---|---:|")
        add("| **backend = \"local\"** | **%.2f µs** |" % local["local"])
        add("| redis, linger_ms = 0 | %.2f µs |" % local["redis0"])
        add("")
        add("P = 8 processes x %d sections on one key (unpinned; the run with the median "
            "sections/s of %d), against bare flock(2) of one file (open, LOCK_EX, section, "
            "LOCK_UN, close), and Redis's lock of linger_ms = 0 (x %d sections):"
            % (local_k(args), args.reps, args.k))
        add("")
        add("| lock | sections/s | wait median | p99 | max | counter exact |")
        add("|---|---:|---:|---:|---:|---|")
        for name, label in (("p8-local", "backend = \"local\""), ("p8-flock", "bare flock(2)"),
                            ("p8-redis", "redis, linger_ms = 0")):
            r = local[name]
            add("| %s | %.0f | %.2f ms | %.2f ms | %.2f ms | %s |" % (
                label, r["rate"], r["med"], r["p99"], r["max"],
                "yes" if r["exact"] else "NO (%d of %d)" % (r["final"], r["n"])))
        add("")
    modules = {"postgres": postgres, "zookeeper": zookeeper, "etcd": etcd}
    for name, res in modules.items():
        report_module(add, args, name, res)
    side_by_side(add, args, con, startup, local, modules, versus)
    if versus:
        add("## Before and after: this build against %s (medians of %d rounds, both builds "
            "measured in turn in each round)" % (args.baseline, args.versus_rounds))
        add("")
        add("| measured | before | after | change |")
        add("|---|---:|---:|---:|")
        for m, name, unit in VERSUS:
            before, after = versus[m]["before"], versus[m]["after"]
            add("| %s | %.2f %s | %.2f %s | %+.1f %% |" % (name, before, unit, after, unit,
                                                         (after / before - 1) * 100))
        add("")
    add("## Targets")
    add("")
    checks = []
    if unc:
        checks += [
            ("uncontended guarded call ≤ 0.75 x plain pair, one CPU",
             u1["guarded"] / u1["pair"], "%.2f", lambda v: v <= 0.75),
            ("uncontended guarded call ≤ 0.75 x plain pair, two CPUs",
             u2["guarded"] / u2["pair"], "%.2f", lambda v: v <= 0.75),
            ("the same with linger_ms = 0, one CPU",
             u1["guarded0"] / u1["pair"], "%.2f", lambda v: v <= 0.75),
            ("the same with linger_ms = 0, two CPUs",
             u2["guarded0"] / u2["pair"], "%.2f", lambda v: v <= 0.75),
        ]
    if con:
        poll8, shim8 = con.get(("poll", 8)), con.get(("lockshim", 8))
        fair8, py8 = con.get(("lockshim-fair", 8)), con.get(("redis-py", 8))
        checks.append(("P=8 default: sections/s ≥ 1.3 x C poll loop",
                       shim8["rate"] / poll8["rate"], "%.2f", lambda v: v >= 1.3))
        if py8:
            checks.append(("P=8 default: sections/s ≥ 8 x redis-py defaults",
                           shim8["rate"] / py8["rate"], "%.1f", lambda v: v >= 8))
        checks += [
            ("P=8 default: worst wait < 10 ms", shim8["max"], "%.2f ms", lambda v: v < 10),
            ("P=8 fair: hand-offs/section ≥ 0.95", fair8["handoffs"], "%.2f",
             lambda v: v >= 0.95),
            ("P=8 fair: worst wait ≤ 3 x P x median section time",
             fair8["max"] / (3 * 8 * (1000.0 / fair8["rate"])), "%.2f of the bound",
             lambda v: v <= 1),
            ("P=8 fair: sections/s ≥ 0.5 x C poll loop", fair8["rate"] / poll8["rate"], "%.2f",
             lambda v: v >= 0.5),
            ("Redis commands sent per contended section ≤ 4 (default, P=8)", shim8["sent"],
             "%.1f", lambda v: v <= 4),
            ("Redis commands sent per contended section ≤ 4 (fair, P=8)", fair8["sent"], "%.1f",
             lambda v: v <= 4),
        ]
    if startup:
        checks.append(("start-up cost < 2 ms", startup[1] - startup[0], "%.2f ms",
                       lambda v: v < 2))
        checks.append(("start-up cost, program out of scope < 1 ms", startup[2] - startup[0],
                       "%.2f ms", lambda v: v < 1))
    if imports:
        checks.append(("python3 imports with %d locks: cost < 5 ms" % IMPORT_LOCKS,
                       imports[1] - imports[0], "%.2f ms", lambda v: v < 5))
    if entry:
        for place, e in (("one CPU", e1), ("two CPUs", e2)):
            checks.append(("guarded call, entry / reloc (library function) ≤ 1.10, %s" % place,
                           e["entry"] / e["reloc"], "%.2f", lambda v: v <= 1.10))
            checks.append(("guarded call, entry (executable's function) / reloc ≤ 1.10, %s"
                           % place, e["exe"] / e["reloc"], "%.2f", lambda v: v <= 1.10))
        checks.append(("start-up, entry-patching %d functions of a %d-symbol executable: "
                       "cost < 10 ms" % (es["locks"], es["funcs"]),
                       es["shim"] - es["plain"], "%.2f ms", lambda v: v < 10))
    if symbols:
        for prog in symbols["progs"]:
            checks.append(("start-up, %s: auto minus reloc ≤ 2 ms" % prog["name"].split(" (")[0],
                           prog["ms"]["auto"] - prog["ms"]["reloc"], "%.2f ms",
                           lambda v: v <= 2))
    if tls:
        for place, t in (("one CPU", t1), ("two CPUs", t2)):
            checks.append(("uncontended guarded call over TLS < 1.3 x plain TCP, linger_ms = 0, "
                           "%s" % place, t[("0", True)] / t[("0", False)], "%.2f",
                           lambda v: v < 1.3))
    if redlock and "skipped" not in redlock:
        for place, r in (("one CPU", redlock["1 CPU"]), ("two CPUs", redlock["2 CPUs"])):
            checks.append(("uncontended guarded call with Redlock (3 masters) < 1.5 x one "
                           "server, linger_ms = 0, %s" % place,
                           r[("0", 3)] / r[("0", 1)], "%.2f", lambda v: v < 1.5))
        checks.append(("Redlock P=8 contended: counter exact",
                       1.0 if redlock[("contended", 3)]["exact"] else 0.0, "%.0f",
                       lambda v: v == 1))
    if sets:
        for place, label_place in (("1 CPU", "one CPU"), ("2 CPUs", "two CPUs"),
                                   ("link", "across a link (0.2 ms replies)")):
            for name, label, _, _ in SETS_CASES[1:]:
                checks.append(("uncontended %s call ≤ 1.10 x exclusive (one round trip), %s"
                               % (label, label_place),
                               sets[place][name] / sets[place]["exclusive"], "%.2f",
                               lambda v: v <= 1.10))
    if local:
        checks.append(("uncontended guarded call with backend = \"local\" ≤ 2 µs, one CPU",
                       local["local"], "%.2f µs", lambda v: v <= 2))
        checks.append(("local P=8 contended ≥ 0.8 x bare flock(2) (sections/s)",
                       local["p8-local"]["rate"] / local["p8-flock"]["rate"], "%.2f",
                       lambda v: v >= 0.8))
        checks.append(("local P=8 contended: counter exact",
                       1.0 if local["p8-local"]["exact"] else 0.0, "%.0f", lambda v: v == 1))
    for name, res in (("postgres", postgres), ("zookeeper", zookeeper), ("etcd", etcd)):
        if res and "skipped" not in res:
            checks.append(("%s P=8 contended: counter exact" % name,
                           1.0 if res["p8-" + name]["exact"] else 0.0, "%.0f",
                           lambda v: v == 1))
    if versus:
        for m, name, unit in VERSUS:
            before, after = versus[m]["before"], versus[m]["after"]
            # sections/s: more is better; the rest: less is better
            change = before / after - 1 if unit == "/s" else (after - before) / max(before, 1e-9)
            checks.append(("%s: after (%.2f %s) vs before %s (%.2f %s) ≤ +5 %%" % (
                name, after, unit, args.baseline, before, unit), change * 100, "%+.1f %%",
                lambda v: v <= 5))
    add("| target | measured | met |")
    add("|---|---:|---|")
    for name, v, fmt, ok in checks:
        add("| %s | %s | %s |" % (name, fmt % v, "yes" if ok(v) else "**no**"))
    if con:
        add("")
        add("Median section time for the fair bound is taken as 1 / (sections/s). Hand-offs per "
            "section: sections whose previous section ran in another process. Per-process time: "
            "how long each process took for its %d sections (a starved process stands out). "
            "Commands sent: counted with MONITOR in a second run of the same workload (lines "
            "from scripts excluded). commandstats: INFO commandstats of the timed run, which also "
            "counts every redis.call inside a script (a plain SET + EVALSHA compare-and-delete "
            "already counts 4)." % args.k)
    if (unc or con) and not HAVE_REDIS_PY:
        add("")
        add("redis-py (Debian python3-redis) is not installed: its rows are missing.")
    return "\n".join(lines) + "\n"


def parts_arg(text):
    """--only's value: a list of PARTS (argparse's type)."""
    parts = [p for p in text.split(",") if p]
    bad = [p for p in parts if p not in PARTS]
    if bad or not parts:
        raise argparse.ArgumentTypeError("not a part: %s (parts: %s)" % (
            ", ".join(bad) or "none", ", ".join(PARTS)))
    return parts


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--k", type=int, default=200, help="sections per process")
    ap.add_argument("--n", type=int, default=20000, help="uncontended calls")
    ap.add_argument("--startup-runs", type=int, default=200)
    ap.add_argument("--import-runs", type=int, default=50,
                    help="runs per python3 imports row")
    ap.add_argument("--symtab-funcs", type=int, default=50000,
                    help="functions of the entry part's generated executable")
    ap.add_argument("--symbols-runs", type=int, default=40,
                    help="runs per case of the symbols part (median)")
    ap.add_argument("--big-funcs", type=int, default=200000,
                    help="exported functions of the symbols part's generated executable")
    ap.add_argument("--only", type=parts_arg, default=None,
                    help="measure and report just these parts (comma-separated)")
    ap.add_argument("--reps", type=int, default=3, help="timed runs per contended row")
    ap.add_argument("--cluster-k", type=int, default=2000,
                    help="sections per process of the cluster part")
    ap.add_argument("--out", default=None, help="markdown file (default bench/results/)")
    ap.add_argument("--settings", default="", help="extra per-lock settings for lockshim, "
                    "e.g. 'handoff_ms = 2;'")
    ap.add_argument("--baseline", default=None, help="versus part: the build directory or git "
                    "revision to compare this build with (e.g. HEAD~3, or origin's main)")
    ap.add_argument("--versus-rounds", type=int, default=5,
                    help="rounds of the versus part (each measures both builds in turn)")
    ap.add_argument("--sets-rounds", type=int, default=5,
                    help="rounds of the sets part's uncontended calls")
    ap.add_argument("--make", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    b = Bench(args)
    wanted = args.only or PARTS
    try:
        res = {}
        if "uncontended" in wanted:
            res["unc"] = b.uncontended()
        if "contended" in wanted:
            con = res["con"] = {}
            for impl, _ in IMPLS:
                if impl.startswith("redis-py") and not HAVE_REDIS_PY:
                    continue
                for p in (2, 4, 8):
                    con[(impl, p)] = b.contended(impl, p)
        if "startup" in wanted:
            res["startup"] = b.startup()
        if "imports" in wanted:
            res["imports"] = b.imports()
        if "entry" in wanted:
            res["entry"] = b.entry()
        if "symbols" in wanted:
            res["symbols"] = b.symbols()
        if "tls" in wanted:
            res["tls"] = b.tls()
        if "replicas" in wanted:
            res["replicas"] = b.replicas()
        if "cluster" in wanted:
            res["cluster"] = b.cluster()
        if "redlock" in wanted:
            res["redlock"] = b.redlock()
        if "sets" in wanted:
            res["sets"] = b.sets()
        if "local" in wanted:
            res["local"] = b.local()
        for name in MODULE_BACKENDS:
            if name in wanted:
                res[name] = b.module_backend(name)
        if "versus" in wanted and args.baseline:
            res["versus"] = b.versus()
        text = report(b, args, **res)
    finally:
        b.close()
    print(text)
    if args.only and not args.out:
        return  # a partial report is kept only where --out says
    out = args.out or os.path.join(HERE, "results", "bench-%s.md" %
                                   datetime.datetime.now().strftime("%Y%m%d-%H%M%S"))
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        f.write(text)
    print("written to %s" % os.path.relpath(out, ROOT))


if __name__ == "__main__":
    main()
