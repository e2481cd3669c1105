# SPDX-License-Identifier: MIT
"""Fresh Debian 12 roots for the tests that touch /etc or need a bare image.

base_root() makes a minimal Debian 12 root (debootstrap --variant=minbase:
libc6, libgcc-s1, dash, coreutils, apt and dpkg; no libconfig9, no
libhiredis) once and caches it under ROOTS (one debootstrap at a time, by a
lock file). fresh_root() copies it for one test, which may then write its
/etc freely; chroot() runs a command inside a copy, in a private mount
namespace with /proc, /dev and /tmp of its own, so nothing is mounted on
the machine. A machine that cannot make or enter a root skips, saying why.
"""
import fcntl
import glob
import os
import shutil
import subprocess

import pytest

ROOTS = os.environ.get("LOCKSHIM_TEST_ROOTS", "/var/tmp/lockshim-roots")
SUITE = "bookworm"


def _mirror():
    for f in glob.glob("/etc/apt/sources.list.d/*.sources"):
        for line in open(f):
            if line.startswith("URIs:"):
                return line.split()[1]
    if os.path.exists("/etc/apt/sources.list"):
        for line in open("/etc/apt/sources.list"):
            if line.startswith("deb "):
                return line.split()[1]
    return None


def _remove(base):
    """Removes an unfinished root: first what is mounted in it (a debootstrap
    killed mid-run leaves its proc mounted, which rmtree cannot remove, and
    every later debootstrap into it then fails)."""
    with open("/proc/mounts") as f:
        points = [line.split()[1] for line in f]
    for point in sorted((p for p in points if p == base or p.startswith(base + "/")),
                        reverse=True):
        subprocess.call(["umount", "-l", point])
    shutil.rmtree(base, ignore_errors=True)


def base_root():
    """Returns the cached minimal root's path, making it first if needed
    (about a minute, 200 MB); skips the test when it cannot be made."""
    if os.geteuid() != 0:
        pytest.skip("a Debian root needs root")
    base = os.path.join(ROOTS, SUITE + "-minbase")
    if os.path.exists(os.path.join(base, ".complete")):
        return base
    if not shutil.which("debootstrap"):
        pytest.skip("debootstrap is not installed (scripts/install-deps.sh installs it)")
    mirror = _mirror()
    if not mirror:
        pytest.skip("no Debian mirror in this machine's apt sources")
    os.makedirs(ROOTS, exist_ok=True)
    with open(os.path.join(ROOTS, ".lock"), "w") as lk:
        fcntl.flock(lk, fcntl.LOCK_EX)
        if not os.path.exists(os.path.join(base, ".complete")):
            _remove(base)
            log = os.path.join(ROOTS, "debootstrap.log")
            with open(log, "w") as out:
                rc = subprocess.call(["debootstrap", "--variant=minbase", SUITE, base, mirror],
                                     stdout=out, stderr=subprocess.STDOUT)
            if rc != 0:
                _remove(base)
                pytest.skip(f"debootstrap failed (exit {rc}); see {log}")
            subprocess.run(["chroot", base, "apt-get", "clean"], check=False)
            open(os.path.join(base, ".complete"), "w").close()
    return base


def fresh_root(dest):
    """Copies the base root to dest (which must not exist); returns dest."""
    subprocess.run(["cp", "-a", base_root(), str(dest)], check=True)
    os.unlink(os.path.join(str(dest), ".complete"))
    return str(dest)


def chroot(root, cmd, **kw):
    """Runs cmd (a list, or a string for sh -c) as root inside root, in a
    private mount namespace with its own /proc, /dev and /tmp; returns the
    CompletedProcess (text mode; output captured unless kw says otherwise).
    Skips when the namespace cannot be made (inside a chroot, / is no mount
    point and cannot be made private)."""
    if isinstance(cmd, str):
        cmd = ["/bin/sh", "-c", cmd]
    root = str(root)
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
           "LANG": "C.UTF-8", "HOME": "/root", "DEBIAN_FRONTEND": "noninteractive"}
    env.update(kw.pop("env", {}))
    # the command's environment is set inside the root, so that a variable
    # such as LD_PRELOAD never reaches the machine's own unshare and mount
    setup = ("mount -t proc proc \"$R/proc\" && mount --rbind /dev \"$R/dev\" && "
             "mount -t tmpfs tmpfs \"$R/tmp\" && exec chroot \"$R\" /usr/bin/env -i \"$@\"")
    full = ["unshare", "--mount", "--propagation", "private", "sh", "-c", setup, "sh"] + \
        ["%s=%s" % kv for kv in env.items()] + cmd
    host = {"R": root, "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    kw.setdefault("capture_output", True)
    kw.setdefault("text", True)
    kw.setdefault("timeout", 600)
    p = subprocess.run(full, env=host, **kw)
    if p.returncode != 0 and "unshare:" in (p.stderr or "") and "propagation" in (p.stderr or ""):
        pytest.skip("cannot make a private mount namespace here: " + p.stderr.strip())
    return p
