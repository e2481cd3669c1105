# SPDX-License-Identifier: MIT
"""No run-time dependency an image may lack: the shim and the CLI in a bare
Debian 12 root (support/debroot.py: minbase, so libc6 and libgcc-s1 but no
libconfig9, no libhiredis0.14, no libcapstone4, no mbedTLS).

The files NEEDED by both binaries are only the C library's (and libgcc_s
for the shim); inside the root the CLI runs its verbs, a program runs under
the shim with and without a config, and a guarded call takes its lock on a
redis-server of the host (the root shares the network namespace). The
control: a program linked against libconfig.so.9 fails there in the
dynamic linker, as every program did when the shim needed it.
"""
import os
import shutil
import subprocess

import pytest

from support.debroot import chroot, fresh_root
from support.util import ASAN, CLI, SHIM, TSAN

pytestmark = pytest.mark.skipif(ASAN or TSAN, reason="a sanitizer build needs its runtime, "
                                "which the bare root lacks")


def needed(path):
    """The DT_NEEDED entries of an ELF file."""
    out = subprocess.run(["readelf", "-dW", path], capture_output=True, text=True,
                         check=True).stdout
    return sorted(line.split("[")[1].rstrip("]") for line in out.splitlines()
                  if "(NEEDED)" in line)


def test_binaries_need_only_libc():
    libc6 = {"libc.so.6", "ld-linux-x86-64.so.2"}  # both of package libc6
    assert set(needed(SHIM)) <= libc6 | {"libgcc_s.so.1"}  # libgcc-s1, which libc6 needs
    assert set(needed(CLI)) <= libc6
    # the statically linked libconfig left no text relocation behind
    dyn = subprocess.run(["readelf", "-dW", SHIM], capture_output=True, text=True).stdout
    assert "TEXTREL" not in dyn


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    r = fresh_root(tmp_path_factory.mktemp("bare") / "root")
    for lib in ("libconfig.so.9", "libhiredis.so.0.14", "libcapstone.so.4"):
        assert not os.path.exists(os.path.join(r, "usr/lib/x86_64-linux-gnu", lib))
    os.makedirs(os.path.join(r, "usr/local/lib"), exist_ok=True)
    shutil.copy(SHIM, os.path.join(r, "usr/local/lib/liblockshim.so"))
    shutil.copy(CLI, os.path.join(r, "usr/local/bin/lockshim"))
    yield r
    shutil.rmtree(r, ignore_errors=True)


def write(root, name, text):
    with open(os.path.join(root, name.lstrip("/")), "w") as f:
        f.write(text)
    return name


def test_control_a_program_needing_libconfig_fails_there(root, tmp_path):
    prog = os.path.join(root, "usr/local/bin/needs-libconfig")
    src = tmp_path / "p.c"
    src.write_text("#include <libconfig.h>\nint main(void){config_t c; config_init(&c);"
                   " config_destroy(&c); return 0;}\n")
    subprocess.run(["gcc", "-o", prog, str(src), "-lconfig"], check=True)
    p = chroot(root, [ "/usr/local/bin/needs-libconfig"])
    assert p.returncode == 127, p
    assert "libconfig.so.9" in p.stderr


def test_cli_runs(root, redis):
    p = chroot(root, ["lockshim", "version"])
    assert p.returncode == 0, p
    assert "lockshim" in p.stdout
    cfg = write(root, "/guard.cfg", 'redis = { host = "127.0.0.1"; port = %d; };\n'
                'locks = ( { symbols = ( "rename", "renameat", "renameat2" ); '
                'key = "bare:{symbol}"; } );\n' % redis.port)
    p = chroot(root, ["lockshim", "check", "-c", cfg])
    assert p.returncode == 0, p
    p = chroot(root, ["lockshim", "lock", "-c", cfg, "bare-cli", "--", "true"])
    assert p.returncode == 0, p


def test_programs_run_under_the_shim(root, redis):
    pre = {"LD_PRELOAD": "/usr/local/lib/liblockshim.so"}
    # a config without locks: untouched
    none = write(root, "/none.cfg", 'redis = { host = "127.0.0.1"; port = %d; };\n' % redis.port)
    p = chroot(root, "ls / >/dev/null && sh -c 'exit 3'", env=dict(pre, LOCKSHIM_CONFIG=none))
    assert p.returncode == 3 and p.stderr == "", p
    # a config with a lock: the guarded call takes it on the host's server
    cfg = write(root, "/guard.cfg", 'redis = { host = "127.0.0.1"; port = %d; };\n'
                'log_level = "debug";\n'
                'locks = ( { symbols = ( "rename", "renameat", "renameat2" ); '
                'key = "bare:{symbol}"; } );\n' % redis.port)
    p = chroot(root, "touch /tmp/a && mv /tmp/a /tmp/b && test -e /tmp/b",
               env=dict(pre, LOCKSHIM_CONFIG=cfg))
    assert p.returncode == 0, p
    assert "bare:renameat2" in p.stderr or "bare:rename" in p.stderr, p.stderr
