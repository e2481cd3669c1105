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
"""
import os
import subprocess
import time

from support.util import MULT, TIMEOUT, cc, shim_env, wait_for


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
