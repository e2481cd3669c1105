# SPDX-License-Identifier: MIT
"""The counter workloads and programs run in the background.

- worker (WORKER_C): THREADS threads calling ledger_update (progs/ledger.c,
  a read-modify-write of a counter file) until told to stop; each prints
  "started" after its first call and "done ok=N failed=N max_ms=N" at the
  end. start_workers/finish_workers run several and check every call;
  counter() reads the file while they write it.
- block (BLOCK_*_C): one guarded block_call that prints "enter" and waits
  for a line on standard input: a holder the test releases when it wants.
- Bg: a program in the background whose stdout is read line by line with
  a deadline (expect) and whose stderr goes to a file.
- race(): N copies of progs/ledger (processes x threads) on one counter;
  returns the final count, exact under the shim, short without it.
- killed_holder_frees(): a block holder killed while another waits; the
  waiter enters at once (a lock freed by its holder's death).
- calls(), lost_lines(), assert_lost_format(): what a server ran and what
  the shim reported about lost leases.

conftest.py builds the programs once per session (fixture worker_progs)
and stops every Bg a test started (fixture bg).
"""
import os
import queue
import re
import subprocess
import threading
import time

from support.topology import stop_pid
from support.util import MULT, TIMEOUT, shim_env, wait_for

LOST = re.compile(r"lockshim\[\d+\] \S+: error: (\S+): lease on (\S+) (.+); applying (\w+)$")

# ---- the programs ----------------------------------------------------------------

WORKER_C = r"""
/* worker PATH THREADS MAXITER STOPFILE: THREADS threads call ledger_update(PATH)
 * until MAXITER calls each (0: no limit) or until STOPFILE exists. Prints
 * "started" after the first call, and at the end "done ok=N failed=N max_ms=N"
 * (calls that returned the new count, calls that did not, longest call). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

int ledger_update(const char *path);
static const char *path, *stop;
static long maxiter, ok, failed;
static double max_ms;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static double now_ms(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static void *work(void *arg)
{
	long my_ok = 0, my_failed = 0;
	double my_max = 0;

	for (long i = 0; maxiter == 0 || i < maxiter; i++) {
		double t0, d;
		int rc;

		if (access(stop, F_OK) == 0)
			break;
		t0 = now_ms();
		rc = ledger_update(path);
		d = now_ms() - t0;
		if (d > my_max)
			my_max = d;
		if (rc > 0)
			my_ok++;
		else
			my_failed++;
		if (i == 0 && arg == NULL) {
			printf("started\n");
			fflush(stdout);
		}
	}
	pthread_mutex_lock(&mu);
	ok += my_ok;
	failed += my_failed;
	if (my_max > max_ms)
		max_ms = my_max;
	pthread_mutex_unlock(&mu);
	return NULL;
}

int main(int argc, char **argv)
{
	pthread_t th[16];
	int n;

	if (argc != 5)
		return 2;
	path = argv[1];
	n = atoi(argv[2]);
	maxiter = atol(argv[3]);
	stop = argv[4];
	if (n < 1 || n > 16)
		return 2;
	for (long i = 0; i < n; i++)
		pthread_create(&th[i], NULL, work, (void *)i);
	for (int i = 0; i < n; i++)
		pthread_join(th[i], NULL);
	printf("done ok=%ld failed=%ld max_ms=%.0f\n", ok, failed, max_ms);
	return 0;
}
"""

BLOCK_LIB_C = r"""
/* A legacy function that works until it is told to stop: prints "enter",
 * then reads one line from standard input. */
#include <errno.h>
#include <stdio.h>
#include <unistd.h>

int block_call(int x)
{
	char c;

	printf("enter %d\n", x);
	fflush(stdout);
	while (read(0, &c, 1) == 1 && c != '\n')
		;
	errno = 0;
	return 42;
}
"""

BLOCK_MAIN_C = r"""
#include <errno.h>
#include <stdio.h>

int block_call(int x);

/* block [stay]: one guarded call; with stay, then waits for a line before
 * exiting. */
int main(int argc, char **argv)
{
	char line[64];
	int rc;

	(void)argv;
	errno = 0;
	rc = block_call(1);
	printf("call rc=%d errno=%d\n", rc, errno);
	fflush(stdout);
	if (argc > 1 && !fgets(line, sizeof(line), stdin))
		return 4;
	return 0;
}
"""


def build_worker(d, ledger_dir):
    """Builds d/worker against ledger_dir's libledger.so; returns its path."""
    with open(os.path.join(d, "worker.c"), "w") as f:
        f.write(WORKER_C)
    subprocess.run(["gcc", "-g", "-O2", "-o", "worker", "worker.c", "-L" + ledger_dir,
                    "-Wl,-rpath," + ledger_dir, "-lledger", "-lpthread"], cwd=d, check=True)
    return os.path.join(d, "worker")


def build_block(d):
    """Builds d/block and its d/libblock.so; returns the program's path."""
    for name, text in {"block_lib.c": BLOCK_LIB_C, "block_main.c": BLOCK_MAIN_C}.items():
        with open(os.path.join(d, name), "w") as f:
            f.write(text)

    def gcc(*args):
        subprocess.run(["gcc", "-g", "-O2"] + list(args), cwd=d, check=True)
    gcc("-shared", "-fPIC", "-o", "libblock.so", "block_lib.c")
    gcc("-o", "block", "block_main.c", "-L" + d, "-Wl,-rpath," + d, "-lblock")
    return os.path.join(d, "block")


# ---- in the background -------------------------------------------------------------

class Bg:
    """A program in the background: stdout read line by line by a thread
    (so expect() has a deadline), stderr into a file (so a chatty shim can
    never block on a full pipe)."""

    def __init__(self, argv, cfg, errfile, **env):
        self.errfile = errfile
        self.err = open(errfile, "w")
        self.p = subprocess.Popen(argv, env=shim_env(cfg, cfg is not None, **env),
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=self.err, text=True, errors="backslashreplace")
        self.lines = queue.Queue()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.p.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def expect(self, prefix, timeout=TIMEOUT):
        deadline = time.monotonic() + timeout * MULT
        seen = []
        while True:
            try:
                line = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError("no %r within %s s; saw %r; stderr: %s"
                                     % (prefix, timeout, seen, self.stderr()[-3000:]))
            if line is None:
                raise AssertionError("EOF before %r; saw %r; stderr: %s"
                                     % (prefix, seen, self.stderr()[-3000:]))
            if line.startswith(prefix):
                return line
            seen.append(line)

    def send(self, line="go"):
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()

    def stderr(self):
        with open(self.errfile) as f:
            return f.read()

    def wait(self, timeout=TIMEOUT):
        return self.p.wait(timeout=timeout)

    def stop(self):
        stop_pid(self.p)
        self.err.close()


# ---- reading the results -------------------------------------------------------------

def last(stdout):
    """The last line a program printed ("" for none)."""
    lines = stdout.strip().splitlines()
    return lines[-1] if lines else ""


def counter(path):
    """The counter's value. A worker rewrites the file (truncate, then
    write) outside any lock the reader holds, so an empty read means "being
    written": read again."""
    for _ in range(1000):
        with open(path) as f:
            text = f.read()
        if text:
            return int(text)
        time.sleep(0.001)
    return 0


def calls(node, command):
    m = re.search(r"^cmdstat_%s:calls=(\d+)," % command, node.cmd("INFO", "commandstats"), re.M)
    return int(m.group(1)) if m else 0


def lost_lines(stderr):
    return [l for l in stderr.splitlines() if ": lease on " in l]


def assert_lost_format(stderr, symbol, key, policy="log"):
    """Every lost-lease line is on_lost's: error level, symbol, key, policy."""
    for line in lost_lines(stderr):
        m = LOST.match(line)
        assert m, line
        assert m.group(1) == symbol and m.group(2) == key and m.group(4) == policy, line


# ---- the counter workload ----------------------------------------------------------

# the counter workload's lock; %d: wait_ms
WORK = ('locks = ( { symbol = "ledger_update"; key = "ledger"; lease_ms = 5000; '
        'wait_ms = %d; on_timeout = "skip"; return = -7; } );\n')
PROCS, THREADS = 3, 2  # start_workers' default


def start_workers(bg, worker_progs, cfg, path, stop, procs=PROCS, threads=THREADS, maxiter=0):
    with open(path, "w") as f:
        f.write("0\n")
    ws = [bg([worker_progs["worker"], path, str(threads), str(maxiter), stop], cfg)
          for _ in range(procs)]
    for w in ws:
        w.expect("started")
    return ws


def finish_workers(ws, wait_ms):
    """Every worker exits 0 with no failed call and no call longer than
    wait_ms plus a wide margin; returns (calls made, joined stderr)."""
    total, errs = 0, []
    for w in ws:
        assert w.wait() == 0, w.stderr()[-3000:]
        done = w.expect("done")
        fields = dict(f.split("=") for f in done.split()[1:])
        err = w.stderr()
        errs.append(err)
        assert int(fields["failed"]) == 0, (done, err[-3000:])
        assert int(fields["max_ms"]) < wait_ms + 5000 * MULT, (done, err[-3000:])
        total += int(fields["ok"])
    return total, "".join(errs)


# ---- progs/ledger racing on one counter ----------------------------------------------

# per-path keys: race() on two counters takes two locks
RACE_LOCK = ('locks = ( { symbol = "ledger_update"; key = "ledger:{arg0:str}"; lease_ms = 5000; '
             'wait_ms = 30000; } );\n')
RACE_PROCS, RACE_ITER = 4, 25


def race(prog, mode, path, cfg, procs=RACE_PROCS, iters=RACE_ITER, threads=1):
    """Runs procs copies of prog at once; returns the final counter."""
    with open(path, "w") as f:
        f.write("0\n")
    env = shim_env(cfg, preload=cfg is not None)
    ps = [subprocess.Popen([prog, mode, path, str(iters), str(threads)], env=env,
                           stderr=subprocess.PIPE, text=True, errors="backslashreplace")
          for _ in range(procs)]
    for p in ps:
        _, err = p.communicate(timeout=TIMEOUT)
        assert p.returncode == 0, err
        assert "error" not in err and "warn" not in err, err
    return counter(path)


def killed_holder_frees(bg, block, cfg, waiting, what, bound_s):
    """A block holder of cfg's lock is killed while a second one waits
    (waiting(the waiter's Bg) is true once its wait is seen, what says
    which): the waiter enters within bound_s x MULT (the caller's wait_ms
    is far longer) and its call returns 42."""
    holder = bg([block], cfg)
    holder.expect("enter")
    waiter = bg([block], cfg)
    wait_for(lambda: waiting(waiter), what=what)
    t0 = time.monotonic()
    holder.p.kill()
    waiter.expect("enter", timeout=5)
    assert time.monotonic() - t0 < bound_s * MULT
    waiter.send()
    assert waiter.expect("call").startswith("call rc=42")
