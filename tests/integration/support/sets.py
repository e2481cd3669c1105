# SPDX-License-Identifier: MIT
"""The writer-behind-readers scenario of the holder sets (mode = "shared"),
run by test_sets.py (Redis) and test_local.py (lock files) with their own
programs' start and finish: readers keep a key held without a gap, a
writer arriving meanwhile must still get in. The log is progs/sets_*.c's:
"r+"/"w+" when a guarded call starts, "r-"/"w-" when it ends, plus the
marks this scenario writes ("x", "y", "z")."""
import time

from support.util import MULT, wait_for


def _mark(log, mark):
    with open(log, "a") as f:
        f.write(mark + "\n")


def writer_behind_readers(prog, cfg, log, stop, start, finish, bound_ms):
    """Starts readers (4 processes x 2 threads, 100 ms calls, until the file
    stop exists) with start(prog, kind, cfg, log, threads, iters, ms,
    stop), lets them run alone for 1 s between the marks "x" and "y" (the
    control), then one writer (one 50 ms call) that must enter within
    bound_ms x MULT (finish(p) returns (its fields, its stderr)), and waits
    for the readers to go on after it (mark "z"). Asserts that the readers
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
