# SPDX-License-Identifier: MIT
"""The wrapper is invisible: every ABI shape, errno, exceptions and longjmp;
functions the shim itself uses can be guarded, and a program with its own
hiredis works beside the shim's hidden copy."""
import re

import pytest

from support.scenarios import jumped_out_and_released
from support.util import run, write_config

ABI_SYMS = ["many_ints", "many_doubles", "mixed_args", "vmix", "make_big", "take_big",
            "make_pair", "make_dpair", "make_mixed", "ld_mul", "ld_stack", "fsum",
            "set_errno", "deep"]
LOCK = 'log_level = "debug";\nlocks = ( { symbol = "hold_call"; lease_ms = 60000; } );\n'


def locks(syms, extra=""):
    return "locks = (\n" + ",\n".join(
        '  { symbol = "%s"; %s }' % (s, extra) for s in syms) + "\n);\n"


def test_every_shape_is_carried_unchanged(progs, redis, tmp_path):
    plain = run([progs["abi"]])
    assert plain.returncode == 0, plain.stderr
    cfg = write_config(tmp_path, redis, 'log_level = "debug";\n' + locks(ABI_SYMS))
    guarded = run([progs["abi"]], cfg)
    assert guarded.returncode == 0, guarded.stderr
    assert guarded.stdout == plain.stdout
    # The wrapper really ran around each function: one acquire per call.
    for sym in ABI_SYMS:
        assert re.search(r"acquired lockshim:%s for %s " % (sym, sym), guarded.stderr), sym
    assert "set_errno -1 Numerical result out of range" in plain.stdout
    assert "errno kept 0 Interrupted system call" in plain.stdout
    assert "deep 100000" in plain.stdout


def test_a_wide_stack_argument_window_stops_at_the_top_of_the_stack(progs, redis, tmp_path):
    """64 KiB of "stack arguments" above main's frame run past the end of the
    process's stack: the copy is clamped there instead of faulting."""
    cfg = write_config(tmp_path, redis, 'locks = ( { symbol = "hold_call"; '
                                        'stack_args_bytes = 65536; } );\n')
    r = run([progs["driver"], "call:0", "fork"], cfg)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert "call rc=42 errno=0" in lines and "child-own rc=42 errno=0" in lines, r.stdout


def test_skipped_call_returns_configured_values(progs, redis, tmp_path):
    """A skipped call returns `return` in rax and xmm0 and sets errno."""
    redis.cmd("SET", "lockshim:busy", "someone", "PX", "60000")
    cfg = write_config(tmp_path, redis, locks(
        ["set_errno", "many_doubles", "many_ints"],
        'key = "busy"; wait_ms = 0; return = 3; errno = "EAGAIN";'))
    out = run([progs["abi"]], cfg)
    assert out.returncode == 0, out.stderr
    assert "set_errno 3 Resource temporarily unavailable" in out.stdout
    assert "many_doubles 0x1.8p+1" in out.stdout
    assert "many_ints 3\n" in out.stdout


def test_exception_releases_the_lock(progs, redis, tmp_path, procs):
    # linger_ms = 0: the unwinding path itself releases, not the renewal thread.
    cfg = write_config(tmp_path, redis, locks(["may_throw"], 'lease_ms = 60000; linger_ms = 0;'))
    p = procs([progs["throw"]], cfg)
    assert p.expect("caught") == "caught boom"
    assert p.expect("again") == "again 7"
    # Still running: the lock was released during unwinding, not at exit.
    assert redis.cmd("EXISTS", "lockshim:may_throw") == 0
    p.send()
    rc, _, err = p.finish()
    assert rc == 0, err


@pytest.mark.parametrize("prog,kind", [("jump", "longjmp"), ("jump", "siglongjmp"),
                                       ("jump_fortify", "longjmp")])
def test_longjmp_releases_the_lock(progs, redis, tmp_path, procs, prog, kind):
    cfg = write_config(tmp_path, redis, locks(["through"], 'lease_ms = 60000; reentrant = false; '
                                                         'wait_ms = 0; linger_ms = 0;'))
    jumped_out_and_released(procs([progs[prog], kind], cfg), redis)


def test_guarding_functions_the_shim_uses(progs, redis, tmp_path):
    """The shim's own write/connect/malloc never re-enter a wrapper."""
    cfg = write_config(tmp_path, redis, 'log_level = "debug";\n' + locks(
        ["write", "connect", "socket", "poll", "hold_call"], 'key = "own:{symbol}";'))
    out = run([progs["driver"], "call:0", "write", "call:0"], cfg)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("call rc=42 errno=0") == 2
    assert "written\n" in out.stdout
    assert "acquired lockshim:own:hold_call" in out.stderr
    # The program's own write(2) call went through the guarded write.
    assert "acquired lockshim:own:write" in out.stderr


def test_program_with_its_own_hiredis(progs, redis, tmp_path):
    cfg = write_config(tmp_path, redis, LOCK)
    r = run([progs["own_hiredis"], str(redis.port)], cfg)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["enter 0", "call rc=42", "get works"]
    assert "acquired lockshim:hold_call" in r.stderr
    assert redis.cmd("GET", "own-hiredis") == "works"
