# SPDX-License-Identifier: MIT
"""backend = "local" (issue 23, first step): kernel file locks under
local.dir, no server, no thread.

Exclusion of processes and threads (controls: the same workload races
without the shim), a SIGKILLed holder freeing the lock at once (control: a
live holder makes the waiter time out), the waiter woken by the release and
not by polling (its threads and context switches stay flat over a 2 s wait;
control: a Redis waiter asks again every retry_max_ms), a fork child not
keeping its parent's lock (control: the kernel keeps an inherited OFD lock
after its parent's death), fences one per grant, keys mapped inside dir,
and every refusal (78, naming the setting). Step 3: max_hold_ms and
on_overrun (log releases the lock at the deadline, kill and abort keep it
until the process dies) and linger_ms (a lock kept between calls, released
linger_ms after the last call), with the renewal thread started only for
them (controls: no thread without them; no max_hold_ms, no linger_ms);
fair: waiters in arrival order (exclusive, permits), a dead one skipped,
readers passing readers but not writers (controls: fair = false lets a
later waiter in first; a live waiter ahead keeps its turn; a reader ahead
does not hold a reader).
"""
import fcntl
import glob
import json
import os
import re
import signal
import struct
import subprocess
import time

import pytest

from support.scenarios import METRICS_LOCK, limit_bounds_the_holders, limit_mismatch_refused, \
    metrics_counts_and_gauges, scrape, val
from support.sets import readers_overlap_writers_alone, replay, writer_behind_readers
from support.util import CLI, MULT, TIMEOUT, cc, run, shim_env, wait_for, write_config
from support.workers import RACE_ITER, RACE_PROCS, killed_holder_frees, race

BLOCK_LOCK = ('locks = ( { symbol = "block_call"; key = "blk"; wait_ms = %d; '
              'on_timeout = "skip"; } );\n')

# A guarded call that forks a child which outlives it (the child waits for
# its stdin to close), then prints "enter child=PID" and waits for a line.
FORK_LIB_C = r"""
#include <stdio.h>
#include <unistd.h>
int fork_call(int x)
{
	char c;
	pid_t pid = fork();

	if (pid == 0) {
		while (read(0, &c, 1) == 1)
			;
		_exit(0);
	}
	printf("enter child=%d\n", (int)pid);
	fflush(stdout);
	while (read(0, &c, 1) == 1 && c != '\n')
		;
	return x;
}
"""
FORK_MAIN_C = r"""
int fork_call(int x);
int main(void) { return fork_call(0); }
"""


def local_config(tmp_path, body, head="", name=None):
    """A config of backend "local" with its dir under tmp_path; returns its
    path (in tmp_path, or in its subdirectory name: several configs)."""
    d = tmp_path / "locks"
    at = tmp_path
    if name:
        at = tmp_path / name
        at.mkdir(exist_ok=True)
    return write_config(at, None, 'backend = "local";\nlocal = { dir = "%s"; };\n%s%s'
                        % (d, head, body))


def lock_files(tmp_path):
    """The lock files of tmp_path's dir (not the hosts' ".counts")."""
    return sorted(f for f in os.listdir(str(tmp_path / "locks")) if f.endswith(".lock"))


def record(path):
    """A lock file's owner record: (fence, lock value)."""
    with open(path) as f:
        fence, value = f.read().split("\n")[:2]
    return int(fence), value


def switches(pid):
    """(threads, voluntary + involuntary context switches of all of them)."""
    total, tasks = 0, glob.glob("/proc/%d/task/*/status" % pid)
    for t in tasks:
        with open(t) as f:
            for line in f:
                if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                    total += int(line.split()[1])
    return len(tasks), total


def waiting(pid):
    """Whether pid has an inotify watch (a local waiter, about to poll)."""
    for fdinfo in glob.glob("/proc/%d/fdinfo/*" % pid):
        try:
            with open(fdinfo) as f:
                if "inotify wd:" in f.read():
                    return True
        except OSError:
            pass
    return False


def program_with_lib(tmp_path_factory, name, lib_c, main_c, *lib_flags):
    """Builds lib<name>.so from lib_c (with lib_flags) and the program name
    from main_c linked to it; returns the program's path."""
    d = str(tmp_path_factory.mktemp(name))
    for src, text in {"lib.c": lib_c, "main.c": main_c}.items():
        with open(os.path.join(d, src), "w") as f:
            f.write(text)
    cc(os.path.join(d, "lib%s.so" % name), [os.path.join(d, "lib.c")], *lib_flags, "-shared",
       "-fPIC")
    return cc(os.path.join(d, name), [os.path.join(d, "main.c")], "-O2", "-L" + d,
              "-Wl,-rpath," + d, "-l" + name)


@pytest.fixture(scope="module")
def forker(tmp_path_factory):
    return program_with_lib(tmp_path_factory, "fork", FORK_LIB_C, FORK_MAIN_C, "-O2")


# ---- exclusion ------------------------------------------------------------------

RACE_LOCAL = ('locks = ( { symbol = "ledger_update"; key = "ledger:{arg0:str}"; '
              'wait_ms = 30000; } );\n')


@pytest.mark.timing
def test_control_processes_and_threads_lose_updates(progs, tmp_path):
    assert race(progs["ledger"], "direct", str(tmp_path / "c"), None, procs=3, iters=10,
                threads=3) < 90


def test_processes_and_threads_exclude_each_other(progs, tmp_path):
    """3 processes x 3 threads: exact; one lock file, its fence one per grant."""
    cfg = local_config(tmp_path, RACE_LOCAL)
    path = str(tmp_path / "c")
    assert race(progs["ledger"], "direct", path, cfg, procs=3, iters=10, threads=3) == 90
    [name] = lock_files(tmp_path)
    assert name == "lockshim%3Aledger%3A" + path.replace("/", "%2F") + ".lock"
    fence, value = record(str(tmp_path / "locks" / name))
    assert fence == 90 and value.endswith(":ledger")


def test_processes_exclude_each_other(progs, tmp_path):
    cfg = local_config(tmp_path, RACE_LOCAL)
    assert race(progs["ledger"], "direct", str(tmp_path / "c"), cfg) == RACE_PROCS * RACE_ITER


def test_several_keys_exclude(progs, tmp_path):
    """A lock of two keys (taken in byte order): exact, both files made."""
    cfg = local_config(tmp_path, 'locks = ( { symbol = "ledger_update"; keys = ( "z", '
                       '"ledger:{arg0:str}" ); wait_ms = 30000; } );\n')
    assert race(progs["ledger"], "direct", str(tmp_path / "c"), cfg, procs=3, iters=10,
                threads=2) == 60
    assert "lockshim%3Az.lock" in lock_files(tmp_path) and len(lock_files(tmp_path)) == 2


def test_fences_increase_by_one_per_grant(progs, tmp_path):
    cfg = local_config(tmp_path, RACE_LOCAL)
    path = str(tmp_path / "c")
    with open(path, "w") as f:
        f.write("0\n")
    for _ in range(2):
        r = run([progs["ledger"], "direct", path, "3"], cfg, LOCKSHIM_LOG_LEVEL="debug")
        assert r.returncode == 0, r.stderr
    fences = [int(l.rsplit("fence ", 1)[1]) for l in r.stderr.splitlines()
              if " acquired " in l]
    assert fences == [4, 5, 6], r.stderr
    assert record(str(tmp_path / "locks" / lock_files(tmp_path)[0]))[0] == 6


# ---- holders that die, waiters that wake ----------------------------------------

def test_killed_holder_frees_the_lock_at_once(bg, worker_progs, tmp_path):
    cfg = local_config(tmp_path, BLOCK_LOCK % 30000)  # wait_ms is 30 s
    killed_holder_frees(bg, worker_progs["block"], cfg, lambda w: waiting(w.p.pid),
                        "the waiter's watch", 5)


def test_control_live_holder_makes_the_waiter_time_out(bg, worker_progs, tmp_path):
    cfg = local_config(tmp_path, BLOCK_LOCK % 1500)
    holder = bg([worker_progs["block"]], cfg)
    holder.expect("enter")
    t0 = time.monotonic()
    r = run([worker_progs["block"]], cfg)
    assert r.stdout.strip() == "call rc=-1 errno=16", (r.stdout, r.stderr)
    assert time.monotonic() - t0 >= 1.4
    assert "still held by another owner after 1500 ms" in r.stderr
    assert "(holder: host %s, pid %d, program block)" % (os.uname().nodename, holder.p.pid) \
        in r.stderr  # from its owner record


def test_waiter_is_woken_by_the_release_not_by_polling(bg, worker_progs, tmp_path):
    """Over a 2 s wait the waiter has one thread and (nearly) no context
    switch; once the holder's call returns it enters at once."""
    cfg = local_config(tmp_path, BLOCK_LOCK % 60000)
    holder = bg([worker_progs["block"], "stay"], cfg)
    holder.expect("enter")
    waiter = bg([worker_progs["block"]], cfg)
    wait_for(lambda: waiting(waiter.p.pid), what="the waiter's watch")
    threads, before = switches(waiter.p.pid)
    time.sleep(2)  # the span measured, not a synchronisation
    threads_after, after = switches(waiter.p.pid)
    assert threads == threads_after == 1 and after - before <= 3, (before, after)
    holder.send()
    holder.expect("call rc=42")
    t0 = time.monotonic()
    waiter.expect("enter", timeout=5)
    assert time.monotonic() - t0 < 1 * MULT


def test_control_redis_waiter_asks_again(bg, worker_progs, redis, tmp_path):
    """The measure above sees a waiter that wakes every retry_max_ms."""
    cfg = write_config(tmp_path, redis, 'locks = ( { symbol = "block_call"; key = "blk"; '
                       'wait_ms = 60000; retry_max_ms = 100; lease_ms = 60000; } );\n')
    holder = bg([worker_progs["block"], "stay"], cfg)
    holder.expect("enter")
    waiter = bg([worker_progs["block"]], cfg)
    wait_for(lambda: switches(waiter.p.pid)[0] == 2, what="the waiter's renewal thread")
    _, before = switches(waiter.p.pid)
    time.sleep(2)
    assert switches(waiter.p.pid)[1] - before >= 10


def test_fork_child_does_not_keep_the_parent_lock(bg, forker, worker_progs, tmp_path):
    """The holder forks a child that outlives it; the holder is SIGKILLed:
    the waiter enters at once, the child still running."""
    cfg = local_config(tmp_path, 'locks = ( { symbol = "fork_call"; key = "blk"; }, '
                       '{ symbol = "block_call"; key = "blk"; wait_ms = 30000; } );\n')
    holder = bg([forker], cfg)
    child = int(holder.expect("enter child=").split("=")[1])
    waiter = bg([worker_progs["block"]], cfg)
    wait_for(lambda: waiting(waiter.p.pid), what="the waiter's watch")
    holder.p.kill()
    waiter.expect("enter", timeout=5)
    assert os.path.exists("/proc/%d" % child)
    holder.p.stdin.close()  # the child's stdin: it exits


def test_control_inherited_ofd_lock_outlives_its_parent(tmp_path):
    """Without the close in the child, a fork child keeps the lock after
    the holder's death: the kernel's rule that the shim must work around."""
    path = str(tmp_path / "f.lock")
    holder = subprocess.Popen(["/usr/bin/python3", "-c", r"""
import fcntl, os, struct, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack("hhqqi4x", fcntl.F_WRLCK, 0, 0, 1, 0))
if os.fork() == 0:
    sys.stdin.read()
    os._exit(0)
print("locked", flush=True)
os._exit(0)
""", path], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline() == "locked\n"
    holder.wait(timeout=TIMEOUT)
    fd = os.open(path, os.O_RDWR)
    try:
        with pytest.raises(OSError):
            fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack("hhqqi4x", fcntl.F_WRLCK, 0, 0, 1, 0))
        holder.stdin.close()  # the child exits
        wait_for(lambda: ofd_free(fd), what="the lock freed with the child")
    finally:
        os.close(fd)


def ofd_free(fd):
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack("hhqqi4x", fcntl.F_WRLCK, 0, 0, 1, 0))
        return True
    except OSError:
        return False


# ---- keys and files -------------------------------------------------------------

def test_keys_map_inside_dir(tmp_path):
    cfg = local_config(tmp_path, "")
    long_key = "k" * 300
    for key in ["a/b", "../../escape", "..", ".hidden", long_key]:
        r = subprocess.run([CLI, "lock", "-c", cfg, key, "--", "true"], capture_output=True,
                           text=True, timeout=TIMEOUT)
        assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(str(tmp_path))) == ["locks", "lockshim.cfg"]
    files = lock_files(tmp_path)
    # the key (as key.c shortens one past 256 bytes) past 200 encoded bytes:
    # its first 150, "~" and the SHA-1 of the whole key
    shortened = [n for n in files if "~" in n]
    assert len(shortened) == 1 and re.fullmatch(r"lockshim%3Ak{139}~[0-9a-f]{40}\.lock",
                                                 shortened[0]), files
    assert sorted(set(files) - set(shortened)) == sorted([
        "lockshim%3Aa%2Fb.lock", "lockshim%3A%2E%2E%2F%2E%2E%2Fescape.lock",
        "lockshim%3A%2E%2E.lock", "lockshim%3A%2Ehidden.lock"])


def test_lock_command_takes_it_with_a_fence(tmp_path):
    cfg = local_config(tmp_path, "")
    for fence in (1, 2):
        r = subprocess.run([CLI, "lock", "-c", cfg, "job", "--", "sh", "-c",
                            'echo "$LOCKSHIM_FENCE"'], capture_output=True, text=True,
                           timeout=TIMEOUT)
        assert (r.returncode, r.stdout) == (0, "%d\n" % fence), r.stderr


def test_check_probes_the_directory(tmp_path):
    cfg = local_config(tmp_path, "")
    r = subprocess.run([CLI, "check", "-c", cfg], capture_output=True, text=True,
                       timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
    assert "local: ok (acquire, renew, queue, wait, release and leave" in r.stdout


@pytest.mark.parametrize("verb,says", [
    (["unlock", "job"], "a kernel lock cannot be taken from another process"),
])
def test_verbs_not_built_yet_say_so(tmp_path, verb, says):
    cfg = local_config(tmp_path, "")
    r = subprocess.run([CLI, verb[0], "-c", cfg] + verb[1:], capture_output=True, text=True,
                       timeout=TIMEOUT)
    assert r.returncode == 1 and says in r.stderr, r.stderr


# ---- refusals -------------------------------------------------------------------

REFUSED = [("lease_ms = 5000", "lease_ms"), ("on_lost = \"log\"", "on_lost"),
           ("retry_max_ms = 50", "retry_max_ms"), ("break_dead_holders = true",
                                                    "break_dead_holders"),
           ("handoff_ms = 1", "handoff_ms")]


@pytest.mark.parametrize("setting,name", REFUSED)
@pytest.mark.parametrize("where", ["lock", "defaults"])
def test_refused_settings_exit_78_naming_them(tmp_path, setting, name, where):
    lock = 'locks = ( { symbol = "f"; %s } );\n' % (setting + ";" if where == "lock" else "")
    head = "defaults = { %s; };\n" % setting if where == "defaults" else ""
    r = run(["true"], local_config(tmp_path, lock, head))
    what = "locks[0].%s" % name if where == "lock" else "defaults.%s" % name
    assert r.returncode == 78 and what in r.stderr and "\"local\"" in r.stderr, r.stderr
    # control: the redis backend takes the same file (no server needed to start)
    assert run(["true"], write_config(tmp_path, None, head + lock)).returncode == 0


@pytest.mark.parametrize("body,says", [
    ('zookeeper = { hosts = "h:1"; };', 'zookeeper: is the group of backend "zookeeper", '
     'but backend is "redis"'),
    ('etcd = { prefix = "/x/"; };', 'etcd: is the group of backend "etcd", but backend '
     'is "redis"'),
    ('local = { dir = "/tmp"; };', 'local: is the group of backend "local", but backend '
     'is "redis"'),
    ('backend = "local"; redis = { port = 7000; };', 'redis: is the group of backend '
     '"redis", but backend is "local"'),
    ('backend = "local"; local = { dir = "relative"; };', "local.dir"),
    ('backend = "local"; local = { dir = "/nonexistent-lockshim/x"; };',
     'nor does its parent "/nonexistent-lockshim"'),
    ('backend = "local"; local = { dir = "{tmp}/lockshim.cfg"; };', "is not a directory"),
])
def test_refused_configs_exit_78(tmp_path, body, says):
    body = body.replace("{tmp}", str(tmp_path))
    r = run(["true"], write_config(tmp_path, None, body + "\nlocks = ( { symbol = \"f\"; } );"))
    assert r.returncode == 78 and says in r.stderr, r.stderr


def test_missing_dir_is_made_at_start(progs, tmp_path):
    cfg = local_config(tmp_path, RACE_LOCAL)
    assert not os.path.exists(str(tmp_path / "locks"))
    path = str(tmp_path / "c")
    assert race(progs["ledger"], "direct", path, cfg, procs=1, iters=2) == 2
    assert os.stat(str(tmp_path / "locks")).st_mode & 0o777 == 0o755 & ~current_umask()


def current_umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_lock_options_refused(tmp_path):
    """-l is refused; --limit and --shared take their lock (the control)."""
    cfg = local_config(tmp_path, "")
    r = subprocess.run([CLI, "lock", "-c", cfg, "-l", "500", "job", "--", "true"],
                       capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 78 and "-l: not available with backend \"local\"" in r.stderr, \
        r.stderr
    for opts in (["--limit", "2"], ["--shared"]):
        r = subprocess.run([CLI, "lock", "-c", cfg] + opts + ["job", "--", "sh", "-c",
                           'echo "$LOCKSHIM_FENCE"'], capture_output=True, text=True,
                           timeout=TIMEOUT)
        assert r.returncode == 0 and int(r.stdout) > 0, (opts, r.stderr)


def test_unusable_lock_file_applies_on_error(worker_progs, tmp_path):
    """A symbolic link where the lock file goes is never followed: the call
    gets on_error (here: skip, errno 5) after wait_ms, the link's target is
    untouched. Control: without the link the same call runs."""
    cfg = local_config(tmp_path, 'locks = ( { symbol = "block_call"; key = "blk"; '
                       'wait_ms = 300; on_error = "skip"; errno = 5; } );\n')
    target = tmp_path / "target"
    target.write_text("keep\n")
    os.mkdir(str(tmp_path / "locks"))
    os.symlink(str(target), str(tmp_path / "locks" / "lockshim%3Ablk.lock"))
    r = run([worker_progs["block"]], cfg)
    assert r.stdout.strip() == "call rc=-1 errno=5", (r.stdout, r.stderr)
    assert "open of the lock file" in r.stderr and target.read_text() == "keep\n"
    assert "lock file unavailable for 300 ms" in r.stderr and "Redis" not in r.stderr
    os.unlink(str(tmp_path / "locks" / "lockshim%3Ablk.lock"))
    p = subprocess.run([worker_progs["block"]], env=shim_env(cfg), input="\n",
                       capture_output=True, text=True, timeout=TIMEOUT)
    assert p.stdout.splitlines()[-1] == "call rc=42 errno=0", (p.stdout, p.stderr)


def test_status_lists_the_held_files(bg, worker_progs, tmp_path):
    """A live holder is listed (text and JSON, limit 1, exclusive, its fence,
    no lease); the control: a file whose holder released it (its record
    still there) is not; the pattern filters."""
    cfg = local_config(tmp_path, 'locks = ( { symbol = "block_call"; key = "blk/{arg0}"; } );\n')
    for _ in range(2):
        r = subprocess.run([CLI, "lock", "-c", cfg, "done", "--", "true"],
                           capture_output=True, text=True, timeout=TIMEOUT)
        assert r.returncode == 0, r.stderr
    holder = bg([worker_progs["block"]], cfg)
    holder.expect("enter")

    def status(*args):
        r = subprocess.run([CLI, "status", "-c", cfg] + list(args), capture_output=True,
                           text=True, timeout=TIMEOUT)
        assert r.returncode == 0, r.stderr
        return r.stdout.splitlines()
    [line] = status()
    assert line.startswith("blk/1  held by %s pid %d " % (os.uname().nodename, holder.p.pid))
    assert "(block)" in line and "no lease, fence 1" in line
    [obj] = [json.loads(l) for l in status("--json")]
    assert (obj["key"], obj["pid"], obj["fence"], obj["limit"], obj["mode"],
            obj["lease_left_ms"]) == ("blk/1", holder.p.pid, 1, 1, "exclusive", None)
    assert status("blk/*") == [line] and status("done*") == []
    assert record(str(tmp_path / "locks" / "lockshim%3Adone.lock"))[0] == 2  # released
    holder.send()
    holder.expect("call rc=42")
    wait_for(lambda: status() == [], what="the released lock gone from status")


# outer() calls inner(): both guarded with the same key.
NEST_LIB_C = r"""
int inner(int x) { return x + 1; }
int outer(int x) { return inner(x) * 2; }
"""
NEST_MAIN_C = r"""
#include <errno.h>
#include <stdio.h>
int outer(int x);
int main(void)
{
	int rc;

	errno = 0;
	rc = outer(1);
	printf("rc=%d errno=%d\n", rc, errno);
	return 0;
}
"""


@pytest.fixture(scope="module")
def nester(tmp_path_factory):
    return program_with_lib(tmp_path_factory, "nest", NEST_LIB_C, NEST_MAIN_C, "-O0",
                            "-fno-semantic-interposition")


@pytest.mark.parametrize("reentrant,out", [("true", "rc=4 errno=0"),
                                           ("false", "rc=-2 errno=16")])
def test_reentrant_call_enters_its_own_lock(nester, tmp_path, reentrant, out):
    """reentrant = true: the nested call of the same key enters at once;
    the control, reentrant = false, waits for its own lock until wait_ms
    (inner skipped: -1, so outer returns -2)."""
    cfg = local_config(tmp_path, 'locks = ( { symbols = ( "outer", "inner" ); key = "nest"; '
                       'wait_ms = 300; reentrant = %s; method = "entry"; } );\n' % reentrant)
    r = run([nester], cfg)
    assert r.returncode == 0 and r.stdout.strip() == out, (r.stdout, r.stderr)


def user_ns_sets_inotify_limit():
    """Returns "" when a user namespace of our own may be made here and its
    max_inotify_instances set, else why not (a container may forbid
    either: then the test cannot make its condition, and is skipped)."""
    r = subprocess.run(["unshare", "-Ur", "sh", "-c",
                        "echo 128 > /proc/sys/user/max_inotify_instances"],
                       capture_output=True, text=True, timeout=TIMEOUT)
    return "" if r.returncode == 0 else (r.stderr.strip() or "exit %d" % r.returncode)


@pytest.mark.parametrize("instances,polls", [("0", True), ("128", False)])
def test_waiter_without_inotify_polls(bg, worker_progs, tmp_path, instances, polls):
    """A waiter refused an inotify instance (a user namespace of its own
    whose max_inotify_instances is 0) still enters after the release,
    trying every 20 ms, and says so once; the control (128) watches."""
    why = user_ns_sets_inotify_limit()
    if why:
        pytest.skip("no user namespace with its own inotify limit here: " + why)
    cfg = local_config(tmp_path, BLOCK_LOCK % 30000)
    holder = bg([worker_progs["block"], "stay"], cfg)
    holder.expect("enter")
    waiter = bg(["unshare", "-Ur", "sh", "-c", "echo %s > /proc/sys/user/max_inotify_instances"
                 " && exec %s" % (instances, worker_progs["block"])], cfg)
    # unshare and sh exec: the waiter keeps the pid
    wait_for(lambda: "cannot watch" in waiter.stderr() or waiting(waiter.p.pid),
             what="the waiter waiting")
    holder.send()
    holder.expect("call rc=42")
    waiter.expect("enter", timeout=5)
    said = waiter.stderr().count("waiters without a watch try every 20 ms")
    assert said == (1 if polls else 0), waiter.stderr()



# ---- shared holders and semaphores (issue 23, step 2) ---------------------------
#
# The observed program of test_sets.py (support/sets.py): each guarded call
# appends "r+"/"w+" to a log when it starts and "r-"/"w-" when it ends;
# replaying the log counts who was inside at once.

def set_lock(symbol, settings):
    return '{ symbol = "%s"; key = "k"; wait_ms = 30000; %s }' % (symbol, settings)


RW_LOCAL = "locks = ( %s, %s );\n" % (set_lock("set_read", 'mode = "shared";'),
                                      set_lock("set_write", ""))


@pytest.mark.timing
@pytest.mark.parametrize("guarded", [True, False], ids=["shared", "control-unguarded"])
def test_shared_readers_overlap_writers_alone(sets_prog, tmp_path, guarded):
    """Shared readers are inside together (more than one at once), a writer
    is always alone, every call entered, and each grant has its own fence.
    Control: unguarded, a writer is inside beside others."""
    log = str(tmp_path / "log")
    cfg = local_config(tmp_path, RW_LOCAL) if guarded else None
    total, err = readers_overlap_writers_alone(sets_prog, cfg, log)
    if not guarded:
        return
    assert "warn" not in err.replace("taken after waiting", ""), err[-3000:]
    [name] = lock_files(tmp_path)
    assert record(str(tmp_path / "locks" / name))[0] == total  # one fence per grant


@pytest.mark.timing
@pytest.mark.parametrize("limit,most", [(3, 3), (None, 1), ("control", None)],
                         ids=["limit3", "default", "control-unguarded"])
def test_limit_bounds_the_holders(sets_prog, tmp_path, limit, most):
    """8 processes x 2 threads: limit 3 lets never more than 3 in, and 3
    are reached; no limit, one at a time. Control: unguarded, more than 3."""
    extra = "limit = %d;" % limit if limit != "control" and limit else ""
    cfg = None if limit == "control" else local_config(
        tmp_path, "locks = ( %s );\n" % set_lock("set_read", extra))
    limit_bounds_the_holders(sets_prog, cfg, str(tmp_path / "log"), most)


def test_limit_mismatch_is_an_error_at_once(progs, procs, tmp_path):
    """A holder took the key with limit = 3; callers with limit 2, with no
    limit (1) and shared (1) get one error line naming both numbers and
    on_error at once (skip), well before wait_ms. Control: limit 3 enters
    beside the holder."""
    lock = 'locks = ( { symbol = "hold_call"; key = "k"; wait_ms = 20000; %s } );\n'
    limit_mismatch_refused(progs, procs,
                           lambda setting, name: local_config(tmp_path, lock % setting,
                                                              name=name))


def test_exclusive_holder_mismatches_a_semaphore_and_waits_shared(progs, procs, tmp_path):
    """A plain lock (limit 1) held: a limit = 3 caller gets the mismatch at
    once; a shared caller waits instead, and enters once the holder is
    gone."""
    lock = 'locks = ( { symbol = "hold_call"; key = "k"; wait_ms = 20000; %s } );\n'
    holder = procs([progs["driver"], "call:3000"], local_config(tmp_path, lock % "", name="x"))
    holder.expect("enter")
    r = run([progs["driver"], "call:0"], local_config(tmp_path, lock % "limit = 3;", name="p"))
    assert r.stdout.strip().splitlines()[-1] == "call rc=-1 errno=16", r.stderr
    assert "limit 3 here, 1 for the key's holders" in r.stderr, r.stderr
    t0 = time.monotonic()
    r = run([progs["driver"], "call:0"], local_config(tmp_path, lock % 'mode = "shared";',
                                                      name="s"))
    assert r.stdout.strip().splitlines()[-1] == "call rc=42 errno=0", r.stderr
    assert time.monotonic() - t0 > 0.3  # waited for the exclusive holder (3 s from its start)
    assert holder.finish()[0] == 0


@pytest.mark.timing
def test_writer_not_starved_by_readers(sets_prog, tmp_path):
    """Readers (4 processes x 2 threads, 100 ms calls) keep the key held
    without a gap between the marks x and y (the control: a writer waiting
    for a free key would wait for the whole stream); a writer arriving
    meanwhile enters within a few calls' time (it takes the intent byte:
    new readers queue behind it), alone, and the readers go on after."""
    log = str(tmp_path / "log")
    cfg = local_config(tmp_path, RW_LOCAL)
    writer_behind_readers(sets_prog, cfg, log, str(tmp_path / "stop"), 1000)
    assert replay(log)[1:] == (1, False)


def test_control_kernel_grants_readers_beside_a_waiting_writer(tmp_path):
    """Why the intent byte: with bare OFD locks, a read lock is granted
    while a writer waits, so overlapping readers keep a writer out for as
    long as they overlap (here 1 s: the writer never gets byte 0)."""
    path = str(tmp_path / "f.lock")
    open(path, "w").close()
    rd = struct.pack("hhqqi4x", fcntl.F_RDLCK, 0, 0, 1, 0)
    fds = [os.open(path, os.O_RDWR) for _ in range(2)]
    writer = os.open(path, os.O_RDWR)
    try:
        fcntl.fcntl(fds[0], fcntl.F_OFD_SETLK, rd)
        end, turns, entered = time.monotonic() + 1.0, 0, False
        while time.monotonic() < end:
            a, b = fds[turns % 2], fds[(turns + 1) % 2]
            fcntl.fcntl(b, fcntl.F_OFD_SETLK, rd)  # a new reader joins...
            fcntl.fcntl(a, fcntl.F_OFD_SETLK, struct.pack("hhqqi4x", fcntl.F_UNLCK, 0, 0,
                                                            1, 0))  # ...then one leaves
            entered |= ofd_free(writer)
            turns += 1
        assert not entered and turns > 10
    finally:
        for fd in fds + [writer]:
            os.close(fd)


def test_status_shows_shared_and_permit_holders(bg, tmp_path):
    """Two shared holders: two lines, mode shared, each its own fence; a
    permit holder of limit 3: limit 3, exclusive. Control: once they
    return, nothing is listed."""
    cfg = local_config(tmp_path, "")

    def status():
        r = subprocess.run([CLI, "status", "-c", cfg, "--json"], capture_output=True,
                           text=True, timeout=TIMEOUT)
        assert r.returncode == 0, r.stderr
        return [json.loads(l) for l in r.stdout.splitlines()]
    held = [bg([CLI, "lock", "-c", cfg, "--shared", "r", "--", "sh", "-c",
                "echo in; read x"], None) for _ in range(2)]
    held.append(bg([CLI, "lock", "-c", cfg, "--limit", "3", "p", "--", "sh", "-c",
                    "echo in; read x"], None))
    for h in held:
        h.expect("in")
    objs = status()
    assert sorted((o["key"], o["mode"], o["limit"]) for o in objs) == [
        ("p", "exclusive", 3), ("r", "shared", 1), ("r", "shared", 1)], objs
    assert sorted(o["fence"] for o in objs if o["key"] == "r") == [1, 2]
    for h in held:
        h.send()
    wait_for(lambda: status() == [], what="the holders gone from status")


# ---- file modes, unsafe files, remote filesystems -------------------------------

@pytest.mark.parametrize("mode,nobody_ok", [("0666", True), (None, False)],
                         ids=["0666", "control-default-0644"])
def test_file_mode_lets_another_user_lock(tmp_path, mode, nobody_ok):
    """file_mode = "0666" (whatever the umask): a lock file made by root can
    be locked by user nobody. Control: the default 0644 refuses nobody
    (on_error)."""
    import tempfile
    top = tempfile.mkdtemp(prefix="lockshim-mode-")
    try:
        os.chmod(top, 0o755)
        cfg = os.path.join(top, "lockshim.cfg")
        with open(cfg, "w") as f:
            f.write('backend = "local";\nlocal = { dir = "%s/locks"; %s };\n' % (
                top, 'file_mode = "%s";' % mode if mode else ""))
        os.chmod(cfg, 0o644)
        os.mkdir(os.path.join(top, "locks"))
        os.chmod(os.path.join(top, "locks"), 0o1777)  # a shared dir: everyone makes files
        old = os.umask(0o022)
        try:
            r = subprocess.run([CLI, "lock", "-c", cfg, "shared-job", "--", "true"],
                               capture_output=True, text=True, timeout=TIMEOUT)
        finally:
            os.umask(old)
        assert r.returncode == 0, r.stderr
        [name] = [f for f in os.listdir(os.path.join(top, "locks")) if f.endswith(".lock")]
        st = os.stat(os.path.join(top, "locks", name))
        assert st.st_mode & 0o777 == (0o666 if mode else 0o644)
        r = subprocess.run(["runuser", "-u", "nobody", "--", CLI, "lock", "-c", cfg, "-w",
                            "1", "shared-job", "--", "true"], capture_output=True,
                           text=True, timeout=TIMEOUT)
        if nobody_ok:
            assert r.returncode == 0, r.stderr
        else:
            assert r.returncode != 0 and "Permission denied" in r.stderr, r.stderr
    finally:
        subprocess.run(["rm", "-rf", top])


@pytest.mark.parametrize("planted", ["hardlink", "fifo", "control-none"])
def test_planted_lock_file_is_refused(worker_progs, tmp_path, planted):
    """A FIFO at the lock file's name, or a lock file with a second name (a
    hard link planted by someone who wants the lock's writes to land in
    their file) is refused: on_error after wait_ms, one error line naming
    the file and why; the other name's content is untouched. Control: a
    plain file is used."""
    cfg = local_config(tmp_path, 'locks = ( { symbol = "block_call"; key = "blk"; '
                       'wait_ms = 300; on_error = "skip"; errno = 5; } );\n')
    os.mkdir(str(tmp_path / "locks"))
    path = str(tmp_path / "locks" / "lockshim%3Ablk.lock")
    target = tmp_path / "target"
    if planted == "fifo":
        os.mkfifo(path)
    elif planted == "hardlink":
        target.write_text("keep\n")
        os.link(str(target), path)
    p = subprocess.run([worker_progs["block"]], env=shim_env(cfg), input="\n",
                       capture_output=True, text=True, timeout=TIMEOUT)
    if planted == "control-none":
        assert p.stdout.splitlines()[-1] == "call rc=42 errno=0", (p.stdout, p.stderr)
        return
    assert p.stdout.strip() == "call rc=-1 errno=5", (p.stdout, p.stderr)
    why = "not a regular file" if planted == "fifo" else "it has 2 hard links"
    assert ('lock file "%s" refused: %s' % (path, why)) in p.stderr, p.stderr
    if planted == "hardlink":
        assert target.read_text() == "keep\n"


@pytest.mark.parametrize("body,says", [
    ('local = { dir = "{tmp}"; file_mode = "0755"; };', "local.file_mode"),
    ('local = { dir = "{tmp}"; file_mode = "0400"; };', "local.file_mode"),
    ('local = { dir = "{tmp}"; file_mode = "0668"; };', "local.file_mode"),
    ('local = { dir = "{tmp}"; file_mode = "666"; };', "local.file_mode"),
])
def test_bad_file_mode_exits_78(tmp_path, body, says):
    body = 'backend = "local";\n' + body.replace("{tmp}", str(tmp_path))
    r = run(["true"], write_config(tmp_path, None, body + "\nlocks = ( { symbol = \"f\"; } );"))
    assert r.returncode == 78 and says in r.stderr, r.stderr
    r = run(["true"], write_config(tmp_path, None, 'backend = "local";\nlocal = { dir = "%s"; '
                                   'file_mode = "0660"; };\nlocks = ( { symbol = "f"; } );'
                                   % tmp_path))
    assert r.returncode == 0, r.stderr  # the control


def test_remote_dir_is_refused_where_a_mount_can_be_made(tmp_path):
    """A dir on a FUSE filesystem: exit 78 naming local.dir and FUSE. The
    decision itself (statfs's f_type) is unit-tested (tests/unit/
    test_config.c: local_fs_remote); a FUSE mount needs a FUSE program
    and /dev/fuse, which this machine may not have: then skipped."""
    import shutil
    tool = shutil.which("squashfuse") or shutil.which("sshfs") or shutil.which("bindfs")
    if not tool or not os.path.exists("/dev/fuse"):
        pytest.skip("no FUSE program or /dev/fuse here: the unit test covers the decision")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    src = tmp_path / "src"
    src.mkdir()
    if not tool.endswith("bindfs"):
        pytest.skip("no bindfs here: the unit test covers the decision")
    subprocess.run([tool, str(src), str(mnt)], check=True, timeout=TIMEOUT)
    try:
        r = run(["true"], write_config(tmp_path, None, 'backend = "local";\nlocal = { dir = '
                                       '"%s"; };\nlocks = ( { symbol = "f"; } );' % mnt))
        assert r.returncode == 78 and "local.dir" in r.stderr and "FUSE" in r.stderr, r.stderr
    finally:
        subprocess.run(["fusermount", "-u", str(mnt)], timeout=TIMEOUT)


NESTED_LOCAL = "locks = ( %s );\n" % ", ".join(
    '{ symbol = "%s"; key = "k"; wait_ms = 1500; %s %%s }' % (sym, mode)
    for sym, mode in [("set_read_then", 'mode = "shared";'), ("set_read", 'mode = "shared";'),
                      ("set_write_then", ""), ("set_write", "")])


@pytest.mark.parametrize("order,reentrant,out,upgrade", [
    ("wr", "", "nested rc=1 errno=0", False),
    ("wr", "reentrant = false;", "nested rc=-1 errno=16", False),
    ("rw", "", "nested rc=-1 errno=16", True),
    ("rw", "reentrant = false;", "nested rc=-1 errno=16", False),
], ids=["excl-enters-shared", "control-excl-not-reentrant", "upgrade-refused",
        "control-upgrade-waits"])
def test_nested_shared_and_exclusive(sets_prog, tmp_path, order, reentrant, out, upgrade):
    """Holding the key exclusively, a thread enters a shared call at once
    (control: not reentrant, it waits for itself until wait_ms); holding it
    shared, its exclusive call is refused at once with one error line (an
    upgrade; control: not reentrant, it waits for its own entry)."""
    cfg = local_config(tmp_path, NESTED_LOCAL.replace("%s", reentrant))
    t0 = time.monotonic()
    r = subprocess.run([sets_prog, order, "10"], env=shim_env(cfg, SETS_LOG=str(tmp_path / "l")),
                       capture_output=True, text=True, timeout=TIMEOUT)
    took = time.monotonic() - t0
    assert r.stdout.strip() == out, r.stderr
    assert ("upgrade" in r.stderr) == upgrade, r.stderr
    assert (took >= 1.4) == (out.endswith("16") and not upgrade), took


def test_held_fence_byte_is_bounded_by_wait_ms(progs, tmp_path):
    """A process that stopped while it held a set's fence byte (10002: here
    a test's own OFD lock on it) delays shared callers by at most their
    wait_ms: on_error then, saying why (the byte is never waited for in
    the kernel). Control: with the byte free the caller enters at once."""
    cfg = local_config(tmp_path, 'locks = ( { symbol = "hold_call"; key = "k"; wait_ms = 600; '
                       'mode = "shared"; on_error = "skip"; errno = 5; } );\n')
    os.mkdir(str(tmp_path / "locks"))
    fd = os.open(str(tmp_path / "locks" / "lockshim%3Ak.lock"), os.O_RDWR | os.O_CREAT, 0o644)
    fence = struct.pack("hhqqi4x", fcntl.F_WRLCK, 0, 10002, 1, 0)
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, fence)
        t0 = time.monotonic()
        r = run([progs["driver"], "call:0"], cfg)
        took = time.monotonic() - t0
        assert r.stdout.strip().splitlines()[-1] == "call rc=-1 errno=5", r.stderr
        assert "lock of the set's fence byte" in r.stderr and took < 5 * MULT, (took, r.stderr)
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack("hhqqi4x", fcntl.F_UNLCK, 0, 10002, 1, 0))
        r = run([progs["driver"], "call:0"], cfg)
        assert r.stdout.strip().splitlines()[-1] == "call rc=42 errno=0", r.stderr
    finally:
        os.close(fd)


# A writer thread calls set_write while another thread, told by a line on
# stdin, forks a child that lives on (it waits for stdin to close).
FORK_WRITER_C = r"""
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>
int set_write(int ms);
static void *writer(void *arg)
{
	(void)arg;
	printf("writer rc=%d\n", set_write(10));
	fflush(stdout);
	return NULL;
}
int main(void)
{
	pthread_t t;
	char c;

	pthread_create(&t, NULL, writer, NULL);
	if (read(0, &c, 1) != 1)
		return 1;
	if (fork() == 0) {
		while (read(0, &c, 1) == 1)
			;
		_exit(0);
	}
	printf("forked\n");
	fflush(stdout);
	pthread_join(t, NULL);
	return 0;
}
"""


def test_fork_child_does_not_keep_a_writer_intent(bg, sets_prog, tmp_path):
    """An exclusive waiter behind a shared holder takes the intent byte; a
    thread of its process forks a child that lives on; the waiter times out.
    A new shared caller then enters at once: the child closed its copy of
    the waiter's descriptor (checked by removing that close: the shared
    caller then waits until its wait_ms, refused by the child's intent)."""
    src = tmp_path / "fw.c"
    src.write_text(FORK_WRITER_C)
    d = os.path.dirname(sets_prog)
    prog = cc(str(tmp_path / "fw"), [str(src)], "-O2", "-L" + d, "-Wl,-rpath," + d, "-lsets",
              "-lpthread")
    cfg = local_config(tmp_path, 'locks = ( { symbol = "set_write"; key = "k"; wait_ms = 1000; '
                       'on_timeout = "skip"; } );\n')
    reader = bg([CLI, "lock", "-c", cfg, "--shared", "k", "--", "sh", "-c", "echo in; read x"],
                None)
    reader.expect("in")
    fw = bg([prog], cfg)
    wait_for(lambda: waiting(fw.p.pid), what="the writer's watch")
    fw.send()
    fw.expect("forked")
    assert fw.expect("writer rc=") == "writer rc=-1"  # timed out; the child lives on
    t0 = time.monotonic()
    r = subprocess.run([CLI, "lock", "-c", cfg, "--shared", "-w", "3", "k", "--", "true"],
                       capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 0 and time.monotonic() - t0 < 1.5 * MULT, r.stderr
    reader.send()
    fw.p.stdin.close()  # the child's stdin: it exits (it outlived the test before)


# ---- max_hold_ms, on_overrun and linger_ms: the renewal thread's jobs -----------

HOLD_LOCAL = 'locks = ( { symbol = "hold_call"; key = "h"; wait_ms = 30000; %s } );\n'
OVERRUN_SAID = "hold_call: lease on lockshim:h exceeded max_hold_ms; renewal stopped; applying "


def tasks(pid):
    return len(os.listdir("/proc/%d/task" % pid))


@pytest.mark.parametrize("settings,threads", [
    ("", 1), ("linger_ms = 0; max_hold_ms = 0;", 1),
    ("max_hold_ms = 60000;", 2), ("linger_ms = 100;", 2)],
    ids=["default", "zeros", "control-max_hold", "control-linger"])
def test_no_thread_without_max_hold_or_linger(bg, progs, tmp_path, settings, threads):
    """A local-guarded program has no thread of the shim's, during its call
    and after it, unless its lock asks for max_hold_ms or linger_ms (the
    controls: either starts the renewal thread)."""
    cfg = local_config(tmp_path, HOLD_LOCAL % settings)
    p = bg([progs["driver"], "call:300", "stdin"], cfg)
    p.expect("enter")
    inside = tasks(p.p.pid)
    p.expect("call rc=42")
    assert (inside, tasks(p.p.pid)) == (threads, threads)
    p.send()
    assert p.wait() == 0


def waiter_enters(bg, progs, cfg, holder, after):
    """Starts a second driver of cfg's lock once holder printed `after`;
    returns the waiter and the seconds from then until it entered."""
    holder.expect(after)
    t0 = time.monotonic()
    waiter = bg([progs["driver"], "call:0"], cfg)
    waiter.expect("enter", timeout=20)
    return waiter, time.monotonic() - t0


@pytest.mark.timing
@pytest.mark.parametrize("max_hold", [300, None], ids=["max_hold", "control-none"])
def test_overrun_log_releases_the_lock_at_the_deadline(bg, progs, tmp_path, max_hold):
    """on_overrun "log" (what a Redis lock does when its renewal stops and
    it expires): at max_hold_ms the holder's renewal thread releases the
    kernel lock, so a waiter enters while the 3 s call runs on. Control
    without max_hold_ms: the waiter enters when the call returns."""
    cfg = local_config(tmp_path, HOLD_LOCAL % ("max_hold_ms = %d;" % max_hold
                                               if max_hold else ""))
    holder = bg([progs["driver"], "call:3000"], cfg)
    waiter, entered = waiter_enters(bg, progs, cfg, holder, "enter")
    if max_hold:
        assert entered < 2.0 and holder.p.poll() is None, entered  # the call runs on
    else:
        assert entered >= 2.5, entered
    holder.expect("call rc=42")
    assert holder.wait() == 0 and waiter.wait() == 0
    assert (OVERRUN_SAID + "log" in holder.stderr()) == bool(max_hold), holder.stderr()


@pytest.mark.timing
@pytest.mark.parametrize("policy,settings,steps,status", [
    ("kill", "kill_grace_ms = 1500;", ["ignore-term"], -signal.SIGKILL),
    ("kill", "", [], -signal.SIGTERM),
    ("abort", "", [], -signal.SIGABRT)])
def test_overrun_kill_and_abort_keep_the_lock_until_death(bg, progs, tmp_path, policy, settings,
                                                         steps, status):
    """on_overrun "kill" and "abort" at max_hold_ms (300): the process dies,
    and the kernel frees its lock then, not before: a holder that ignores
    SIGTERM keeps it through kill_grace_ms (1.5 s) until the SIGKILL (the
    control is the "log" test above: there the waiter enters at 0.3 s)."""
    cfg = local_config(tmp_path, HOLD_LOCAL % ('max_hold_ms = 300; on_overrun = "%s"; %s'
                                               % (policy, settings)))
    holder = bg([progs["driver"]] + steps + ["call:20000"], cfg)
    waiter, entered = waiter_enters(bg, progs, cfg, holder, "enter")
    assert holder.wait() == status
    assert OVERRUN_SAID + policy in holder.stderr(), holder.stderr()
    assert entered < 10, entered
    if steps:
        assert entered >= 1.5, entered
    assert waiter.wait() == 0


LINGER_CALLS = 200


@pytest.mark.parametrize("linger,grants", [(60000, 1), (0, LINGER_CALLS)],
                         ids=["linger", "control-no-linger"])
def test_linger_keeps_the_lock_between_calls(progs, tmp_path, linger, grants):
    """200 calls in a row with linger_ms: the lock is taken from the kernel
    once (the file's fence counts grants), the kept calls take it back
    without asking the kernel; control linger_ms = 0: a grant per call."""
    cfg = local_config(tmp_path, HOLD_LOCAL % ("linger_ms = %d;" % linger))
    r = run([progs["driver"]] + ["call:0"] * LINGER_CALLS, cfg)
    assert r.returncode == 0 and r.stdout.count("call rc=42") == LINGER_CALLS, r.stderr
    assert record(str(tmp_path / "locks" / lock_files(tmp_path)[0]))[0] == grants


@pytest.mark.timing
@pytest.mark.parametrize("linger,low,high", [(100, 8, 60), (60000, 1, 1)],
                         ids=["linger-100", "control-60000"])
def test_kept_lock_goes_back_to_the_kernel_every_linger_ms(progs, tmp_path, linger, low, high):
    """A thread that calls without pause (200 calls of 6 ms, 1.2 s or more)
    keeps its lock at most linger_ms (100) from its grant: it takes it from
    the kernel again about every 100 ms (between the calls others may take
    it). Control linger_ms = 60000: one grant."""
    cfg = local_config(tmp_path, HOLD_LOCAL % ("linger_ms = %d;" % linger))
    r = run([progs["driver"]] + ["call:6"] * 200, cfg)
    assert r.returncode == 0, r.stderr
    fence = record(str(tmp_path / "locks" / lock_files(tmp_path)[0]))[0]
    assert low <= fence <= high, fence


@pytest.mark.timing
@pytest.mark.parametrize("linger", [3000, 0], ids=["linger", "control-no-linger"])
def test_kept_lock_is_released_linger_ms_after_the_last_call(bg, progs, tmp_path, linger):
    """The holder's only call returns and its program lives on: a waiter in
    another process enters linger_ms (3 s) later, when the holder's renewal
    thread releases the kept lock (nothing else would before the holder
    exits). Control linger_ms = 0: at once, the lock was not kept."""
    cfg = local_config(tmp_path, HOLD_LOCAL % ("linger_ms = %d;" % linger))
    holder = bg([progs["driver"], "call:0", "stdin"], cfg)
    waiter, entered = waiter_enters(bg, progs, cfg, holder, "call rc=42")
    if linger:
        assert 2.0 <= entered < 3.0 + 2.0 * MULT, entered
    else:
        assert entered < 1.5, entered
    assert holder.p.poll() is None and waiter.wait() == 0
    holder.send()
    assert holder.wait() == 0


# ---- fair = true: tickets ------------------------------------------------------

FAIR_LOCAL = ('locks = ( { symbol = "block_call"; key = "q"; wait_ms = 30000; }, '
              '{ symbol = "log_call"; key = "q"; wait_ms = 30000; fair = %s; } );\n')


def tickets(tmp_path):
    """How many fair waiters' tickets (locks at byte 2^32 and past) are held
    on key q's lock file (/proc/locks)."""
    ino = os.stat(str(tmp_path / "locks" / "lockshim%3Aq.lock")).st_ino
    n = 0
    with open("/proc/locks") as f:
        for line in f:
            fields = line.split()
            for i, x in enumerate(fields[:-1]):
                m = re.fullmatch(r"[0-9a-f]+:[0-9a-f]+:(\d+)", x)
                if m and int(m.group(1)) == ino and int(fields[i + 1]) >= 1 << 32:
                    n += 1
    return n


def logged(path):
    try:
        with open(path) as f:
            return [int(x) for x in f.read().split()]
    except FileNotFoundError:
        return []


def queue_waiters(bg, progs, cfg, tmp_path, log, n, fair):
    """Starts n log_call waiters (logging at debug) one after another, each
    once the one before waits (fair: holds its ticket); returns them."""
    ws = []
    for i in range(n):
        w = bg([progs["driver"], "log:" + log], cfg, LOCKSHIM_LOG_LEVEL="debug")
        if fair:
            wait_for(lambda: tickets(tmp_path) == i + 1, what="ticket %d" % (i + 1))
        else:
            wait_for(lambda: waiting(w.p.pid), what="waiter %d's watch" % (i + 1))
        ws.append(w)
    return ws


FAIR_PERMITS = ('locks = ( { symbol = "block_call"; key = "q"; wait_ms = 30000; limit = 2; }, '
                '{ symbol = "log_call"; key = "q"; wait_ms = 30000; limit = 2; fair = %s; } );\n')


def fence_of(w):
    """The fence of the grant a debug-logging waiter got."""
    m = re.search(r"acquired lockshim:q for log_call .*, fence (\d+)", w.stderr())
    assert m, w.stderr()
    return int(m.group(1))


@pytest.mark.parametrize("fair", [True, False], ids=["fair", "control-unfair"])
@pytest.mark.parametrize("kind", ["exclusive", "permits"])
def test_fair_waiters_enter_in_arrival_order(bg, progs, worker_progs, tmp_path, fair, kind):
    """Three waiters queue behind the holders (one exclusive, or two permits
    of limit 2) and are stopped (SIGSTOP); the holders leave; the third and
    the second are continued first: with fair neither passes the first's
    ticket (1 s), and once the first runs they are granted in arrival order
    (their fences). Control fair = false: the first continued takes the
    free lock."""
    cfg = local_config(tmp_path, (FAIR_LOCAL if kind == "exclusive" else FAIR_PERMITS)
                       % ("true" if fair else "false"))
    log = str(tmp_path / "order")
    holders = [bg([worker_progs["block"]], cfg) for _ in range(1 if kind == "exclusive" else 2)]
    for h in holders:
        h.expect("enter")
    ws = queue_waiters(bg, progs, cfg, tmp_path, log, 3, fair)
    for w in ws:
        os.kill(w.p.pid, signal.SIGSTOP)
    for w in ws:  # the stops take effect before the release
        wait_for(lambda: stopped(w.p.pid), what="waiter %d stopped" % w.p.pid)
    for h in holders:
        h.send()
        h.expect("call rc=42")
    os.kill(ws[2].p.pid, signal.SIGCONT)
    os.kill(ws[1].p.pid, signal.SIGCONT)
    if fair:
        time.sleep(1)  # the span in which nobody may pass the first waiter
        assert logged(log) == []
    else:
        wait_for(lambda: logged(log), what="a later waiter entering")
        assert logged(log)[0] in (ws[1].p.pid, ws[2].p.pid)
    os.kill(ws[0].p.pid, signal.SIGCONT)
    for w in ws:
        assert w.wait() == 0
    if fair:
        fences = [fence_of(w) for w in ws]
        assert fences == sorted(fences), fences


def test_fair_dead_waiter_leaves_the_queue(bg, progs, worker_progs, tmp_path):
    """Two waiters queue behind a holder, the first is stopped and the holder
    leaves: the second stays behind the live first's ticket (1 s: the
    control), and so does a caller arriving now (no barging). The first is
    SIGKILLed: its ticket goes with it, and the second then the newcomer
    enter at once."""
    cfg = local_config(tmp_path, FAIR_LOCAL % "true")
    log = str(tmp_path / "order")
    holder = bg([worker_progs["block"]], cfg)
    holder.expect("enter")
    w1, w2 = queue_waiters(bg, progs, cfg, tmp_path, log, 2, True)
    os.kill(w1.p.pid, signal.SIGSTOP)
    holder.send()
    holder.expect("call rc=42")
    late = bg([progs["driver"], "log:" + log], cfg)
    wait_for(lambda: tickets(tmp_path) == 3, what="the newcomer's ticket")
    time.sleep(1)  # the span in which nobody may pass the stopped waiter
    assert logged(log) == []
    t0 = time.monotonic()
    w1.p.kill()
    assert w2.wait() == 0 and late.wait() == 0
    assert time.monotonic() - t0 < 2 * MULT
    assert logged(log) == [w2.p.pid, late.p.pid]
    assert tickets(tmp_path) == 0


def test_fair_readers_pass_readers_not_writers(bg, progs, worker_progs, tmp_path):
    """fair readers (mode "shared") behind an exclusive holder: a reader
    that queued second enters past a stopped first reader when the holder
    leaves (read tickets do not hold readers: the control), but a reader
    behind a stopped fair writer waits for it (1 s), and enters after it."""
    cfg = local_config(tmp_path, 'locks = ( { symbol = "block_call"; key = "q"; }, '
                       '{ symbol = "log_call"; key = "q"; wait_ms = 30000; mode = "shared"; '
                       'fair = true; }, { symbol = "hold_call"; key = "q"; wait_ms = 30000; '
                       'fair = true; } );\n')
    log = str(tmp_path / "order")
    holder = bg([worker_progs["block"]], cfg)
    holder.expect("enter")
    r1, r2 = queue_waiters(bg, progs, cfg, tmp_path, log, 2, True)
    os.kill(r1.p.pid, signal.SIGSTOP)
    holder.send()
    assert r2.wait() == 0 and logged(log) == [r2.p.pid]
    os.kill(r1.p.pid, signal.SIGCONT)
    assert r1.wait() == 0
    holder = bg([worker_progs["block"]], cfg)
    holder.expect("enter")
    writer = bg([progs["driver"], "call:0"], cfg)
    wait_for(lambda: tickets(tmp_path) == 1, what="the writer's ticket")
    os.kill(writer.p.pid, signal.SIGSTOP)
    r3 = bg([progs["driver"], "log:" + log], cfg)
    wait_for(lambda: tickets(tmp_path) == 2, what="the reader's ticket")
    holder.send()
    holder.expect("call rc=42")
    time.sleep(1)  # the span in which the reader may not pass the writer
    assert len(logged(log)) == 2
    os.kill(writer.p.pid, signal.SIGCONT)
    writer.expect("enter")
    assert r3.wait() == 0 and logged(log)[-1] == r3.p.pid


def test_fork_child_does_not_keep_a_fair_ticket(bg, sets_prog, progs, worker_progs, tmp_path):
    """A fair waiter (a thread, behind a holder) holds its ticket; another
    thread forks a child that lives on; the waiter times out and the holder
    leaves. A new fair caller then enters at once, no ticket left: the
    child closed its copy of the waiter's descriptor (checked by not
    registering the ticket: the caller then waits behind the child's copy
    until its wait_ms)."""
    src = tmp_path / "fw.c"
    src.write_text(FORK_WRITER_C)
    d = os.path.dirname(sets_prog)
    prog = cc(str(tmp_path / "fw"), [str(src)], "-O2", "-L" + d, "-Wl,-rpath," + d, "-lsets",
              "-lpthread")
    cfg = local_config(tmp_path, 'locks = ( { symbol = "block_call"; key = "q"; }, '
                       '{ symbol = "set_write"; key = "q"; wait_ms = 1000; on_timeout = "skip"; '
                       'fair = true; }, { symbol = "log_call"; key = "q"; wait_ms = 3000; '
                       'on_timeout = "skip"; fair = true; } );\n')
    holder = bg([worker_progs["block"]], cfg)
    holder.expect("enter")
    fw = bg([prog], cfg)
    wait_for(lambda: tickets(tmp_path) == 1, what="the waiter's ticket")
    fw.send()
    fw.expect("forked")
    assert fw.expect("writer rc=") == "writer rc=-1"  # timed out; the child lives on
    holder.send()
    holder.expect("call rc=42")
    assert tickets(tmp_path) == 0
    log = str(tmp_path / "log")
    t0 = time.monotonic()
    r = run([progs["driver"], "log:" + log], cfg)
    assert r.returncode == 0 and logged(log) and time.monotonic() - t0 < 1.5 * MULT, r.stderr
    fw.p.stdin.close()  # the child's stdin: it exits


def stopped(pid):
    """Whether pid is stopped (a SIGSTOP has taken effect: /proc state T)."""
    with open("/proc/%d/stat" % pid) as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"


# ---- metrics ----------------------------------------------------------------------

@pytest.mark.timing
def test_metrics_counts_per_host_and_the_gauges(progs, procs, tmp_path):
    """`lockshim metrics` of local (support/scenarios.py), the counts kept in
    "<key>.counts" files of the dir, which status does not list; a waiter
    is not listed (it waits on inotify), so only held is checked."""
    cfg = local_config(tmp_path, METRICS_LOCK)
    metrics_counts_and_gauges(progs, procs, cfg, waiters=False)
    assert sorted(os.listdir(str(tmp_path / "locks"))) == [
        "lockshim%3Af.lock"] + ["lockshim%%3Ametrics%%3A%%7B%s%%7D.%d.counts" % (h, os.geteuid())
                                for h in ("h1", "h2", "live", "waiter")]  # not the killed holder
    r = run([CLI, "status", "-c", cfg])
    assert r.returncode == 0 and "metrics" not in r.stdout, (r.stdout, r.stderr)


@pytest.mark.timing
def test_metrics_shipped_by_a_release_add_up(progs, procs, tmp_path):
    """No renewal thread (no linger_ms or max_hold_ms): a running process's
    counts are shipped by a release a second after its first, on its own
    thread; concurrent shipments of 4 processes of one host add up exactly."""
    cfg = local_config(tmp_path, METRICS_LOCK)
    p = procs([progs["driver"], "call:0", "call:1100", "stdin"], cfg, LOCKSHIM_TEST_HOST="live")
    assert p.expect("call") == p.expect("call") == "call rc=42 errno=0"
    wait_for(lambda: val(scrape(cfg), "lockshim_calls_total", "hold_call", "live") == 2,
             what="the shipment of a release")
    assert len(os.listdir("/proc/%d/task" % p.p.pid)) == 1
    steps = ["call:0"] * 300
    ps = [procs([progs["driver"]] + steps, cfg, LOCKSHIM_TEST_HOST="many") for _ in range(4)]
    for q in ps:
        assert q.finish()[0] == 0
    m = scrape(cfg)
    assert val(m, "lockshim_calls_total", "hold_call", "many") == 1200
    assert val(m, "lockshim_hold_seconds_count", "hold_call", "many") == 1200


# ---- step 5: a release wakes the waiters only when one watches ------------------

IN_MODIFY, IN_ATTRIB = 0x2, 0x4
LOCAL_WATCH = (1 << 32) - 1  # backend_local.c: a watching waiter's read-locked byte


def attrib_events(path, fn):
    """Runs fn() while an inotify watch is on path; returns how many
    IN_ATTRIB events (a release's futimens) it made. IN_MODIFY (the record's
    write) is watched too, so that successive IN_ATTRIBs are not merged."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    ino = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
    assert ino >= 0, ctypes.get_errno()
    try:
        assert libc.inotify_add_watch(ino, path.encode(), IN_MODIFY | IN_ATTRIB) >= 0
        fn()
        n = 0
        while True:
            try:
                buf = os.read(ino, 65536)
            except BlockingIOError:
                return n
            off = 0
            while off < len(buf):
                _, mask, _, namelen = struct.unpack_from("iIII", buf, off)
                n += bool(mask & IN_ATTRIB)
                off += 16 + namelen
    finally:
        os.close(ino)


@pytest.mark.parametrize("watcher,wakes", [(False, 0), (True, LINGER_CALLS)],
                         ids=["unwatched", "control-watched"])
def test_release_wakes_only_when_a_waiter_watches(progs, tmp_path, watcher, wakes):
    """200 uncontended calls make no wake-up (IN_ATTRIB): no waiter holds
    the watch byte, so no release calls futimens. Control: a read lock on
    that byte (taken here as a waiter takes it before its first try) makes
    each of the 200 releases wake."""
    cfg = local_config(tmp_path, HOLD_LOCAL % "linger_ms = 0;")
    r = run([progs["driver"], "call:0"], cfg)  # makes the lock file
    assert r.returncode == 0, r.stderr
    path = str(tmp_path / "locks" / lock_files(tmp_path)[0])

    def calls():
        r = run([progs["driver"]] + ["call:0"] * LINGER_CALLS, cfg)
        assert r.returncode == 0 and r.stdout.count("call rc=42") == LINGER_CALLS, r.stderr

    fd = os.open(path, os.O_RDWR)
    try:
        if watcher:
            fcntl.fcntl(fd, fcntl.F_OFD_SETLK,
                        struct.pack("hhqqi4x", fcntl.F_RDLCK, 0, LOCAL_WATCH, 1, 0))
        assert attrib_events(path, calls) == wakes
    finally:
        os.close(fd)


LONG_HOST = "h" * 100 + "." + "x" * 150  # 251 bytes: LOCKSHIM_TEST_HOST takes 255


@pytest.mark.parametrize("ns,host", [("lockshim", LONG_HOST), ("n" * 128, "a.b.c." * 10 + "dd")],
                         ids=["long-host", "long-namespace"])
def test_metrics_of_a_long_host_name_are_read_back(progs, tmp_path, ns, host):
    """A key "<ns>:metrics:{<host>}" of over 200 encoded bytes (a long host
    name, or a 62-byte one with dots under a 128-byte namespace) gets a
    shortened file name (keyname.h: "~" and a SHA-1): the file's key line
    tells the key, and the counts are read back. Control: the same file
    without its key line (as an older shipper wrote it) loses them (the
    name alone cannot tell the host), while a short name's file without it
    is still read."""
    cfg = local_config(tmp_path, 'namespace = "%s";\n%s' % (ns, METRICS_LOCK))
    for h in (host, "short"):
        r = run([progs["driver"], "call:0", "call:0"], cfg, LOCKSHIM_TEST_HOST=h)
        assert r.returncode == 0, r.stderr
    m = scrape(cfg)
    assert val(m, "lockshim_calls_total", "hold_call", host) == 2
    assert val(m, "lockshim_hold_seconds_count", "hold_call", host) == 2
    assert val(m, "lockshim_calls_total", "hold_call", "short") == 2
    counts = sorted(glob.glob(str(tmp_path / "locks" / "*.counts")))
    assert len(counts) == 2 and "~" in os.path.basename(counts[0]), counts
    assert "~" not in os.path.basename(counts[1])
    for path in counts:  # the control: no key line
        with open(path) as f:
            lines = f.readlines()
        assert lines[0].startswith("key "), lines[0]
        with open(path, "w") as f:
            f.writelines(lines[1:])
    m = scrape(cfg)
    assert val(m, "lockshim_calls_total", "hold_call", host) == 0
    assert val(m, "lockshim_calls_total", "hold_call", "short") == 2
