# SPDX-License-Identifier: MIT
"""Calls that reach a guarded function by the dynamic linker's side doors:

- RTLD_NEXT from a library: libwrap.so wraps libbiz.so's biz_price and
  libc's umask and calls the next definition through dlsym(RTLD_NEXT);
  each call of the program takes the lock once and gets the wrapper's
  result;
- dlvsym: libc's read at version GLIBC_2.2.5, looked up in RTLD_DEFAULT, a
  handle or RTLD_NEXT and called through the pointer, runs under its lock;
  readv, looked up and called the same way but not configured, takes none;
- dlmopen: a library loaded into a new link-map namespace (what the shim
  does there today is written down in that test);
- pthread_cancel: a thread cancelled while blocked inside a guarded call
  releases its lock at once, and the process goes on using it.

Guarded calls are seen in Redis (the key held by the process during the
call) and counted by the shim's debug lines ("acquired <key> for"), with
linger_ms = 0 so that every call takes the lock from Redis. The programs
are progs/rtld_next_main.c (with wrap.c and biz.c), dlvsym_main.c,
dlmopen_main.c (with dlmopen_lib.c) and cancel_main.c (with cancel_lib.c).
"""
import os

import pytest

from support.server import lock_keys
from support.util import cc, run, wait_for, write_config


@pytest.fixture(scope="module")
def interp(tmp_path_factory):
    """Builds this file's programs and libraries; returns their paths."""
    d = str(tmp_path_factory.mktemp("interp"))
    lib = ["-L" + d, "-Wl,-rpath," + d]
    p = {"dir": d}
    cc(os.path.join(d, "libbiz.so"), ["biz.c"], "-O2", "-shared", "-fPIC")
    cc(os.path.join(d, "libwrap.so"), ["wrap.c"], "-O2", "-shared", "-fPIC", "-ldl")
    # libwrap.so comes first in the search order: its definitions win.
    p["rtld_next"] = cc(os.path.join(d, "rtld_next_main"), ["rtld_next_main.c"], "-O2",
                        *lib, "-lwrap", "-lbiz")
    p["dlvsym"] = cc(os.path.join(d, "dlvsym_main"), ["dlvsym_main.c"], "-O2", "-ldl")
    p["libnsuser"] = cc(os.path.join(d, "libnsuser.so"), ["dlmopen_lib.c"], "-O2", "-shared",
                        "-fPIC", *lib, "-lbiz")
    p["dlmopen"] = cc(os.path.join(d, "dlmopen_main"), ["dlmopen_main.c"], "-O2", *lib,
                      "-lbiz", "-ldl")
    cc(os.path.join(d, "libcancel.so"), ["cancel_lib.c"], "-O2", "-shared", "-fPIC")
    p["cancel"] = cc(os.path.join(d, "cancel_main"), ["cancel_main.c"], "-O2", *lib,
                     "-lcancel", "-lpthread")
    return p


def acquires(stderr, key):
    """How many times the shim took `key` from Redis (debug lines)."""
    return stderr.count("acquired lockshim:%s for" % key)


def sets_sent(redis):
    """SET commands Redis ran since the last CONFIG RESETSTAT: one per acquire."""
    for line in redis.cmd("INFO", "commandstats").splitlines():
        if line.startswith("cmdstat_set:"):
            return int(line.split("calls=")[1].split(",")[0])
    return 0


def config(tmp_path, redis, locks):
    return write_config(tmp_path, redis, 'log_level = "debug";\nlocks = ( %s );\n' % locks)


# ---- RTLD_NEXT from a library ------------------------------------------------

RTLD_NEXT_OUT = ["biz_price 41", "umask 22", "calls wrap=3 biz=1"]
# How often the program itself calls each symbol (each call reaches libwrap).
PROGRAM_CALLS = {"biz_price": 1, "umask": 2}


def test_rtld_next_wrapper_without_the_shim(interp):
    """Control: libwrap's wrappers run and reach the next definitions."""
    r = run([interp["rtld_next"]])
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == RTLD_NEXT_OUT


@pytest.mark.parametrize("reentrant", ["true", "false"])
@pytest.mark.parametrize("symbol", ["biz_price", "umask"])
def test_rtld_next_from_a_library_is_guarded_once(interp, redis, tmp_path, symbol, reentrant):
    """The program calls biz_price (libbiz's, wrapped by libwrap) or umask
    (libc's, wrapped by libwrap); the wrapper calls the next definition
    through dlsym(RTLD_NEXT). Each call of the program takes the lock from
    Redis exactly once (one debug line, one SET; not zero, not two), and
    the wrapper's result is right: the next definition ran, not skipped.
    With reentrant = false a second wrapping of the same call (the pointer
    from RTLD_NEXT wrapped too) would wait for the lock its own thread holds
    and skip the next definition (biz_price 0, umask -1)."""
    cfg = config(tmp_path, redis, '{ symbol = "%s"; linger_ms = 0; wait_ms = 300; '
                                  'reentrant = %s; }' % (symbol, reentrant))
    redis.cmd("CONFIG", "RESETSTAT")
    r = run([interp["rtld_next"]], cfg)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == RTLD_NEXT_OUT, r.stderr
    assert acquires(r.stderr, symbol) == PROGRAM_CALLS[symbol], r.stderr
    assert sets_sent(redis) == PROGRAM_CALLS[symbol]
    assert r.stderr.count("released lockshim:%s" % symbol) == PROGRAM_CALLS[symbol]
    assert "skipped" not in r.stderr
    assert lock_keys(redis) == []


# ---- dlvsym ------------------------------------------------------------------

@pytest.mark.parametrize("how", ["default", "handle", "next"])
def test_dlvsym_pointer_is_guarded(interp, redis, tmp_path, procs, how):
    """read@GLIBC_2.2.5 from dlvsym, called through the pointer, holds its
    lock while it blocks (the key is in Redis with this process's value) and
    releases it when it returns. Control: readv, found and called the same
    way but not configured, takes no lock: one acquire and one SET in all."""
    cfg = config(tmp_path, redis, '{ symbol = "read"; lease_ms = 30000; linger_ms = 0; }')
    redis.cmd("CONFIG", "RESETSTAT")
    p = procs([interp["dlvsym"], how], cfg)
    assert p.expect("ready") == "ready read"
    value = wait_for(lambda: redis.cmd("GET", "lockshim:read"), what="read's lock taken")
    assert ":%d:" % p.p.pid in value
    p.send("abc")
    assert p.expect("read") == "read 4"
    assert p.expect("ready") == "ready readv"
    wait_for(lambda: lock_keys(redis) == [], what="read's lock released")
    p.send("defgh")
    assert p.expect("readv") == "readv 6"
    rc, _, err = p.finish()
    assert rc == 0, err
    assert acquires(err, "read") == 1
    assert "readv" not in err
    assert sets_sent(redis) == 1
    assert lock_keys(redis) == []


def test_dlvsym_program_without_the_shim(interp, procs):
    """Control: the same lookups and reads, unguarded, give the same results."""
    p = procs([interp["dlvsym"], "handle"])
    assert p.expect("ready") == "ready read"
    p.send("abc")
    assert p.expect("read") == "read 4"
    p.send("defgh")
    assert p.expect("readv") == "readv 6"
    assert p.finish()[0] == 0


# ---- dlmopen -----------------------------------------------------------------

DLMOPEN_OUT = ["lmid 1", "ns_price 45", "dlsym 50", "main 60", "calls ns=2 main=1"]


def test_dlmopen_namespace(interp, redis, tmp_path):
    """What the shim does with a library loaded by dlmopen(LM_ID_NEWLM), as
    of today (observed, not a design promise):

    - The program works as without the shim: same output, exit 0, and each
      namespace's copy of libbiz.so counts its own calls.
    - Calls made inside the new namespace are NOT guarded: ns_price(4)
      calls that namespace's biz_price(4) through libnsuser.so's PLT, and
      no lock biz:4 is taken. The shim is loaded only in the base namespace
      (LD_PRELOAD does not reach a new one), and its rescan after dlmopen
      walks dl_iterate_phdr, which glibc limits to the caller's namespace:
      no slot of the new namespace is redirected. The shim says so at warn.
    - A pointer the executable gets from dlsym(handle, "biz_price") on the
      dlmopen handle IS guarded (lock biz:5): the executable's dlsym is the
      shim's wrapper, which returns the hook's stub around the new
      namespace's biz_price. The executable's own call (biz:6) is guarded
      as usual.
    """
    plain = run([interp["dlmopen"], interp["libnsuser"]])
    assert plain.returncode == 0, plain.stdout + plain.stderr
    assert plain.stdout.splitlines() == DLMOPEN_OUT
    cfg = config(tmp_path, redis, '{ symbol = "biz_price"; key = "biz:{arg0}"; '
                                  'linger_ms = 0; wait_ms = 2000; reentrant = false; }')
    redis.cmd("CONFIG", "RESETSTAT")
    r = run([interp["dlmopen"], interp["libnsuser"]], cfg)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout == plain.stdout
    assert acquires(r.stderr, "biz:4") == 0  # inside the new namespace: not guarded
    assert r.stderr.count("outside the base namespace: calls between the objects "
                          "loaded there are not guarded") == 1, r.stderr
    assert acquires(r.stderr, "biz:5") == 1  # through the dlsym'd pointer: guarded
    assert acquires(r.stderr, "biz:6") == 1  # the executable's own call: guarded
    assert sets_sent(redis) == 2
    assert "skipped" not in r.stderr
    assert lock_keys(redis) == []


# ---- pthread_cancel ----------------------------------------------------------

CANCEL_LOCKS = """
  { symbol = "block_read"; key = "k"; lease_ms = 30000; },
  { symbol = "quick_call"; key = "k"; lease_ms = 30000; wait_ms = 0; },
  { symbol = "hold_call"; key = "k"; lease_ms = 30000; wait_ms = 0; }"""


def test_cancelled_thread_releases_its_lock(interp, progs, redis, tmp_path, procs):
    """A worker blocked in read(2) inside guarded block_read (30 s lease) is
    cancelled (deferred) and joined: the join yields PTHREAD_CANCELED, the
    key is gone within seconds (the release runs while the cancellation
    unwinds through the call, not when the lease expires), another process
    takes the lock at its first try (wait_ms = 0), and the same process's
    next guarded call, from its main thread, takes it at the first try too."""
    cfg = config(tmp_path, redis, CANCEL_LOCKS)
    p = procs([interp["cancel"]], cfg)
    assert p.expect("inside") == "inside"
    value = wait_for(lambda: redis.cmd("GET", "lockshim:k"), what="block_read's lock taken")
    assert ":%d:" % p.p.pid in value
    assert redis.cmd("PTTL", "lockshim:k") > 20000
    p.send()
    assert p.expect("joined") == "joined canceled"
    wait_for(lambda: redis.cmd("EXISTS", "lockshim:k") == 0, timeout=5,
             what="the cancelled call's lock released")
    other = run([progs["driver"], "call:0"], cfg)
    assert other.stdout.splitlines()[-1] == "call rc=42 errno=0", other.stderr
    p.send()
    assert p.expect("quick") == "quick 41"  # -1 would be a skip: lock not free
    p.send()
    rc, out, err = p.finish()
    assert rc == 0, err
    assert "returned" not in out
    assert acquires(err, "k") == 2  # block_read, then quick_call
    assert "skipped" not in err and "lost" not in err and "error" not in err
    assert lock_keys(redis) == []


def test_cancel_program_without_the_shim(interp, procs):
    """Control: the same program, unguarded, is cancelled and goes on."""
    p = procs([interp["cancel"]])
    assert p.expect("inside") == "inside"
    p.send()
    assert p.expect("joined") == "joined canceled"
    p.send()
    assert p.expect("quick") == "quick 41"
    p.send()
    rc, out, _ = p.finish()
    assert rc == 0 and "returned" not in out


WAITER_LOCKS = """
  { symbol = "block_read"; key = "k"; lease_ms = 30000; wait_ms = 60000; },
  { symbol = "quick_call"; key = "k"; lease_ms = 30000; wait_ms = 0; linger_ms = 0; }"""


def test_thread_cancelled_while_waiting_leaves_the_queue(interp, redis, tmp_path, procs):
    """A worker cancelled while it waits for a lock another process holds
    (blocked in the shim's BLPOP, a cancellation point) leaves the queue at
    once, so the holder's release frees the lock instead of handing it to a
    thread that no longer exists; both processes then take it at the first
    try (wait_ms = 0)."""
    cfg = config(tmp_path, redis, WAITER_LOCKS)
    holder = procs([interp["cancel"]], cfg)
    assert holder.expect("inside") == "inside"
    wait_for(lambda: redis.cmd("EXISTS", "lockshim:k") == 1, what="the holder's lock")
    waiter = procs([interp["cancel"]], cfg)
    wait_for(lambda: redis.cmd("ZCARD", "lockshim:k:q") == 1, what="the waiter queued")
    waiter.send()
    assert waiter.expect("joined") == "joined canceled"
    wait_for(lambda: redis.cmd("ZCARD", "lockshim:k:q") == 0, timeout=5,
             what="the cancelled waiter gone from the queue")
    holder.send()
    assert holder.expect("joined") == "joined canceled"
    wait_for(lambda: redis.cmd("EXISTS", "lockshim:k") == 0, timeout=5,
             what="the holder's lock released, not handed over")
    waiter.send()
    assert waiter.expect("quick") == "quick 41"
    holder.send()
    assert holder.expect("quick") == "quick 41"
    for p in (waiter, holder):
        p.send()
        rc, out, err = p.finish()
        assert rc == 0, err
        assert "returned" not in out
    assert lock_keys(redis) == []
