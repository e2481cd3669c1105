# SPDX-License-Identifier: MIT
"""The observed program of the holder sets (test_sets.py on Redis,
test_local.py on lock files): progs/sets_main.c on progs/sets_lib.c,
whose guarded calls append "r+"/"w+" to a log (O_APPEND, one order for
every process and thread) when they start and "r-"/"w-" when they end.

- build(): the program (conftest.py's session fixture sets_prog).
- start()/finish(): one run of it in the background, and its counts;
  run_all(): several at once.
- replay(): who was inside at once, from the log.
- writer_behind_readers(): readers keep a key held without a gap, a
  writer arriving meanwhile must still get in (marks "x", "y", "z").
- readers_overlap_writers_alone(): readers together, writers alone.
- lock_cli() and set_waiter_woken(): holders by `lockshim lock`, and a
  waiter behind them woken by a release (the backends that watch).
"""
import os
import subprocess
import time

from support.process import cpu_ticks
from support.util import CLI, MULT, TIMEOUT, cc, shim_env, wait_for


def build(d):
    """Builds libsets.so and the sets program in d; returns its path."""
    cc(os.path.join(d, "libsets.so"), ["sets_lib.c"], "-O2", "-shared", "-fPIC")
    return cc(os.path.join(d, "sets"), ["sets_main.c"], "-O2", "-L" + d, "-Wl,-rpath," + d,
              "-lsets", "-lpthread")


def replay(log):
    """Replays the log: returns (most readers inside at once, most writers,
    whether a writer was ever inside with anyone else)."""
    inside = {"r": 0, "w": 0}
    most = {"r": 0, "w": 0}
    mixed = False
    with open(log) as f:
        for line in f:
            kind, how = line[0], line[1]
            if kind not in inside:
                continue
            inside[kind] += 1 if how == "+" else -1
            most[kind] = max(most[kind], inside[kind])
            if inside["w"] and (inside["r"] or inside["w"] > 1):
                mixed = True
    return most["r"], most["w"], mixed


def start(prog, kind, cfg, log, threads, iters, ms, stop=None):
    """Starts prog (kind "r" or "w": threads threads of iters calls of ms
    each, until the file stop exists when given) under cfg (None: without
    the shim). Returns the Popen (text pipes)."""
    env = shim_env(cfg, preload=cfg is not None, SETS_LOG=log)
    argv = [prog, kind, str(threads), str(iters), str(ms)] + ([stop] if stop else [])
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def finish(p):
    """Waits for p; asserts it exited 0 with no failed call; returns (its
    fields, its stderr)."""
    out, err = p.communicate(timeout=TIMEOUT)
    assert p.returncode == 0, err[-3000:]
    done = [l for l in out.splitlines() if l.startswith("done")]
    assert done, (out, err[-3000:])
    fields = {k: int(v) for k, v in (f.split("=") for f in done[0].split()[1:])}
    assert fields["failed"] == 0, (done, err[-3000:])
    return fields, err


def run_all(runs):
    """Starts every (prog, kind, cfg, log, threads, iters, ms) of runs at
    once and finishes each; returns the calls made and the stderr of all."""
    ps = [start(*r) for r in runs]
    total, errs = 0, ""
    for p in ps:
        fields, err = finish(p)
        total += fields["ok"]
        errs += err
    return total, errs


def _mark(log, mark):
    with open(log, "a") as f:
        f.write(mark + "\n")


def writer_behind_readers(prog, cfg, log, stop, bound_ms):
    """Starts readers (4 processes x 2 threads, 100 ms calls, until the file
    stop exists), lets them run alone for 1 s between the marks "x" and
    "y" (the control), then one writer (one 50 ms call) that must enter
    within bound_ms x MULT, and waits for the readers to go on after it
    (mark "z"). Asserts that the readers
    alone never left the key free between x and y; returns nothing (the
    caller replays log for who was inside with whom)."""
    readers = [start(prog, "r", cfg, log, 2, 1, 100, stop) for _ in range(4)]
    try:
        for p in readers:
            assert p.stdout.readline().startswith("started")
        _mark(log, "x")
        time.sleep(1.0)  # the stream runs on its own for a while (the control)
        _mark(log, "y")
        w = start(prog, "w", cfg, log, 1, 1, 50)
        fields, err = finish(w)
        assert fields["ok"] == 1 and fields["max_ms"] < bound_ms * MULT, (fields, err)
        _mark(log, "z")
        wait_for(lambda: open(log).read().split("z\n", 1)[1].count("r+") >= 4,
                 what="readers to go on after the writer")
    finally:
        open(stop, "w").close()
    for p in readers:
        finish(p)
    inside, window, gaps = 0, False, 0
    with open(log) as f:
        for line in f:
            if line[0] in "xy":
                window = line[0] == "x"
            elif line[0] == "r":
                inside += 1 if line[1] == "+" else -1
                gaps += window and inside == 0
    assert gaps == 0  # control: the readers alone never left the key free


def readers_overlap_writers_alone(prog, cfg, log):
    """Runs 4 reader processes x 2 threads (40 ms calls) and 2 writers (20
    ms) of cfg, None being the control (unguarded: a writer is then inside
    beside others, asserted). Guarded, asserts readers inside together, a
    writer always alone, every call entered and no error line; returns
    (calls entered, standard error) for the caller's own checks."""
    runs = [(prog, "r", cfg, log, 2, 6, 40)] * 4 + [(prog, "w", cfg, log, 1, 6, 20)] * 2
    total, err = run_all(runs)
    readers, writers, mixed = replay(log)
    if cfg is None:
        assert mixed
        return total, err
    assert total == 4 * 2 * 6 + 2 * 6 and readers > 1, err[-3000:]
    assert writers == 1 and not mixed, err[-3000:]
    assert "error" not in err, err[-3000:]
    return total, err


def lock_cli(bg, cfg, *opts):
    """`lockshim lock` of key k with opts, holding it until sent a line."""
    h = bg([CLI, "lock", "-c", cfg] + list(opts) + ["k", "--", "sh", "-c",
                                                     "echo in; read x"], None)
    h.expect("in")
    return h


def set_waiter_woken(bg, block_prog, cfg, holder_opts, release, entries, cpu_max, bound_s):
    """Holders of key k by `lockshim lock` with holder_opts (two with a
    --limit, else one), then block_prog (a block_call worker of cfg)
    waiting behind them; entries() counts the store's entries of k (the
    holders' and the waiter's). Over 2 s the waiter spends at most cpu_max
    ticks and stays out (the control: the holders are there); once holder
    number release leaves, it enters within bound_s x MULT. Everything is
    released at the end, each holder exiting 0."""
    held = [lock_cli(bg, cfg, *holder_opts) for _ in range(2 if holder_opts else 1)]
    w = bg([block_prog], cfg)
    wait_for(lambda: entries() == len(held) + 1, timeout=30, what="the waiter's entry")
    before = cpu_ticks(w.p.pid)
    time.sleep(2)  # the span measured, not a synchronisation
    assert cpu_ticks(w.p.pid) - before <= cpu_max
    assert entries() == len(held) + 1
    held[release].send()
    t0 = time.monotonic()
    w.expect("enter", timeout=10)
    assert time.monotonic() - t0 < bound_s * MULT
    w.send()
    w.expect("call rc=42")
    for h in held:
        if h is not held[release]:
            h.send()
    for h in held:
        assert h.wait() == 0
