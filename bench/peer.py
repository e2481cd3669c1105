# SPDX-License-Identifier: MIT
"""peer.py PORT PATH K SLEEP - the redis-py Lock doing the benchmark's section.

Waits for one byte on stdin, then K times: Lock(name, timeout=10, sleep=SLEEP)
.acquire(), the same read-modify-write of the counter file, release().
Prints "elapsed_ns handoffs" and the waits (ns), like worker.c.
"""
import os
import sys
import time

import redis

port, path, k, sleep = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
r = redis.Redis(host="127.0.0.1", port=port)
r.ping()
pid = os.getpid()
waits, handoffs = [], 0
sys.stdin.buffer.read(1)
start = time.monotonic_ns()
for _ in range(k):
    t0 = time.monotonic_ns()
    lock = r.lock("peer-lock", timeout=10, sleep=sleep)
    lock.acquire()
    waits.append(time.monotonic_ns() - t0)
    with open(path, "r+") as f:
        count, last = (int(x) for x in f.read().split())
        if last != pid:
            handoffs += 1
        f.seek(0)
        f.write("%d %d\n" % (count + 1, pid))
        f.truncate()
    lock.release()
print(time.monotonic_ns() - start, handoffs)
print(" ".join(str(w) for w in waits))
