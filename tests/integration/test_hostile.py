# SPDX-License-Identifier: MIT
"""The shim inside programs that are hostile to it without knowing: it must
never kill, crash or corrupt them.

- SIGPIPE: Redis drops the shim's connection (CLIENT KILL, idle timeout)
  while a guarded call runs; the next writes meet a reset connection. The
  program must live on, its next call guarded, its SIGPIPE disposition and
  signal mask untouched.
- Crossed streams: a daemon closes every descriptor (loop, close_range, raw
  system calls) or puts its data file on the shim's socket numbers (dup2,
  raw dup2) between two guarded calls. The shim must never write Redis
  commands into the program's file nor close the program's descriptors, and
  must reconnect.
- Coroutine and signal stacks: a guarded call with stack-passed arguments
  made next to the top of a makecontext() stack or a sigaltstack, with an
  unreadable page above the top, must not fault while the shim copies the
  stack-argument window.

The programs are progs/hostile.c and its library progs/hostile_lib.c.
"""
import os

import pytest

from support.scenarios import (DROPPED_LOCK, acquisitions, assert_held_by, dropped_during_a_call,
                               expect)
from support.server import lock_keys
from support.util import run, write_config


def config(tmp_path, redis, locks):
    return write_config(tmp_path, redis, 'log_level = "debug";\nlocks = ( %s );\n' % locks)


# ---- SIGPIPE -----------------------------------------------------------------

# subprocess starts programs with SIGPIPE at SIG_DFL and an empty signal mask
@pytest.mark.parametrize("how", ["client-kill", "idle-timeout"])
def test_connection_closed_by_redis_during_a_call_is_no_sigpipe(hostile, redis, tmp_path,
                                                                 procs, how):
    """Redis closes the shim's connection while a guarded call holds the
    lock (linger_ms = 0: the release is written at the call's end, its reply
    read before the next command). The release's write draws a reset and
    the next write would raise SIGPIPE: the old shim's program died of it.
    The program must finish both calls, the second one guarded (its key
    seen in Redis, held by this pid, within seconds: the first key was not
    stranded for its lease), and see SIGPIPE still at SIG_DFL and unblocked."""
    cfg = config(tmp_path, redis, DROPPED_LOCK)
    dropped_during_a_call(hostile, redis, cfg, procs, how)


# ---- crossed streams -----------------------------------------------------------

CLOSERS = {"closeall": "closeall", "close_range": "closerange", "closeall-raw": "closeall-raw"}
REPLACERS = {"dup2": "replace", "dup2-raw": "replace-raw"}


def record_of(proc):
    return "record %d\n" % proc.p.pid


def guarded_second_call(p, redis):
    """The program's second guarded call (block_call) holds its lock in
    Redis while it runs; lets it return."""
    expect(p, "inside")
    assert_held_by(redis, "lockshim:block_call", p)
    p.send()
    assert expect(p, "block") == "block rc=7"


def finish_with_record(p, data, redis):
    """The program exits 0; its data file holds exactly its own record; each
    guarded call took its lock once; no key is left."""
    rc, _, err = p.finish()
    assert rc == 0, err
    with open(data, "rb") as f:
        assert f.read().decode(errors="replace") == record_of(p), err
    assert acquisitions(err, "lockshim:quick_call") == 1, err
    assert acquisitions(err, "lockshim:block_call") == 1, err
    assert lock_keys(redis) == []


def crossed_cfg(tmp_path, redis):
    # wait_ms bounds how long a shim that lost its connection may keep a
    # call waiting: the new shim reconnects at once.
    return config(tmp_path, redis,
                  '{ symbol = "quick_call"; linger_ms = 0; wait_ms = 5000; },'
                  '{ symbol = "block_call"; linger_ms = 0; wait_ms = 5000; }')


@pytest.mark.parametrize("closer", sorted(CLOSERS))
def test_daemon_closing_every_descriptor_gets_no_redis_commands_in_its_file(
        hostile, redis, tmp_path, procs, closer):
    """A guarded call opens the shim's socket; the program then closes every
    descriptor from 3 up (close loop, close_range, or raw close system calls
    no libc wrapper sees), opens its data file (which gets the lowest free
    number) and makes another guarded call. The old shim wrote that call's
    commands into the data file. The new one must reconnect, guard the call,
    and leave the file holding exactly the program's record."""
    data = os.path.join(str(tmp_path), "data")
    p = procs([hostile, "quick:1", CLOSERS[closer], "open:" + data, "block", "record"],
              crossed_cfg(tmp_path, redis))
    assert expect(p, "quick") == "quick rc=3"
    assert expect(p, "data") == "data fd=3"
    guarded_second_call(p, redis)
    assert expect(p, "record") == "record written"
    finish_with_record(p, data, redis)


@pytest.mark.parametrize("replacer", sorted(REPLACERS))
def test_data_file_put_on_the_shims_socket_numbers_is_never_written_nor_closed(
        hostile, redis, tmp_path, procs, replacer):
    """After a guarded call, the program dup2()s its data file onto every
    socket descriptor it did not create (the shim's), through libc or with a
    raw system call, then makes a guarded call and writes its record through
    its own descriptor. The shim must not write into the file (a send to a
    file fails, and the descriptor is then re-checked), must not close the
    replaced numbers, and must reconnect to guard the call."""
    data = os.path.join(str(tmp_path), "data")
    p = procs([hostile, "quick:1", "open:" + data, REPLACERS[replacer], "block", "record",
               "still-open"], crossed_cfg(tmp_path, redis))
    assert expect(p, "quick") == "quick rc=3"
    replaced = int(expect(p, "replaced").split()[1])
    assert replaced >= 1, "the shim's connection is a socket of the program"
    guarded_second_call(p, redis)
    assert expect(p, "record") == "record written"
    assert expect(p, "still-open") == "still-open %d of %d" % (replaced, replaced)
    finish_with_record(p, data, redis)


# ---- coroutine and signal stacks ---------------------------------------------

@pytest.mark.parametrize("step,settings", [
    ("coro", ""),                                  # PROT_NONE page above the top
    ("coro-hole", ""),                             # unmapped pages above the top
    # The kernel's signal frame sits at the altstack's top, a few KiB above
    # the handler's frame: a 64 KiB window reaches past the top.
    ("altstack", "stack_args_bytes = 65536;"),
])
def test_call_next_to_the_top_of_a_foreign_stack(hostile, redis, tmp_path, step, settings):
    """A guarded function with ten integer arguments (four on the stack) is
    called within a few dozen bytes of the top of a coroutine stack (or of a
    sigaltstack, from a signal handler), and the page above the top cannot
    be read. The old shim copied its stack-argument window past the top and
    died of SIGSEGV. The new one must return the same value as the
    unguarded run, and the call must have been guarded."""
    plain = run([hostile, step])
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.startswith("many=28231640996005")
    assert "hole=mapped" not in plain.stdout  # and equal output: not in the guarded run either
    cfg = config(tmp_path, redis, '{ symbol = "many_args"; %s }' % settings)
    r = run([hostile, step], cfg)
    assert r.returncode == 0, r.stderr
    assert r.stdout == plain.stdout, r.stderr
    assert acquisitions(r.stderr, "lockshim:many_args") == 1, r.stderr
    assert lock_keys(redis) == []
