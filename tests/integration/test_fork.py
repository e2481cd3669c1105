# SPDX-License-Identifier: MIT
"""fork: a child never renews or releases its parent's locks; its own work."""
import errno

from support.server import lock_keys
from support.util import run, write_config


def test_fork_inside_a_guarded_call(progs, redis, tmp_path):
    cfg = write_config(tmp_path, redis, """log_level = "debug";
locks = ( { symbol = "fork_call"; key = "fk"; lease_ms = 600; },
          { symbol = "other_call"; key = "fk"; wait_ms = 0; },
          { symbol = "hold_call"; key = "child-own"; } );
""")
    r = run([progs["driver"], "fork"], cfg)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    # The child returned through the wrapper without releasing "fk": its probe
    # of the same key is refused (not entered reentrantly, not free).
    assert "child-other rc=-1 errno=%d" % errno.EBUSY in lines
    # A lock the child takes itself works normally.
    assert "child-own rc=42 errno=0" in lines
    assert "parent-fork rc=1 errno=0" in lines
    # Exactly one release of fk (the parent's) and one of child-own.
    assert r.stderr.count("released lockshim:fk") == 1
    assert r.stderr.count("released lockshim:child-own") == 1
    assert "no longer ours" not in r.stderr
    assert lock_keys(redis, "lockshim:*") == []
