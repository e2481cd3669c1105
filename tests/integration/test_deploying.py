# SPDX-License-Identifier: MIT
"""doc/deploying.md's examples work as shown.

1. The systemd examples (examples/systemd/) pass `systemd-analyze verify`
   without a word: the unit running a legacy program under `lockshim run`,
   and the drop-in adding LD_PRELOAD and LOCKSHIM_CONFIG to an existing
   unit. Both are checked in a root the test makes (--root: the host's unit
   files, the CLI and the shim where the Debian package puts them), so the
   commands they name exist there and nothing is installed on this machine.
   The controls: the unit's command missing, and a drop-in with a misspelt
   setting, are reported. Skipped where systemd-analyze is missing.
2. The configs the document shows parse (`lockshim check`; 69: their Redis
   is not here)."""
import os
import re
import shutil
import subprocess

import pytest

from support.util import CLI, ROOT, SHIM, TIMEOUT

EXAMPLES = os.path.join(ROOT, "examples", "systemd")
PKG_CLI = "usr/bin/lockshim"
PKG_SHIM = "usr/lib/x86_64-linux-gnu/lockshim/liblockshim.so"


@pytest.fixture
def root(tmp_path):
    """A root with the host's systemd units, the CLI and the shim at the
    package's paths, and a stand-in legacy-app.service (sleep); returns a function
    verifying a unit in it: (exit status, standard error)."""
    if not shutil.which("systemd-analyze"):
        pytest.skip("systemd-analyze is missing (package systemd)")
    units = "/usr/lib/systemd/system"
    if not os.path.isdir(units):
        pytest.skip("no systemd unit files in " + units)
    r = str(tmp_path / "root")
    shutil.copytree(units, r + units, symlinks=True)
    for src, dest in [(CLI, PKG_CLI), (SHIM, PKG_SHIM), ("/usr/bin/sleep", "usr/bin/sleep")]:
        os.makedirs(os.path.dirname(os.path.join(r, dest)), exist_ok=True)
        shutil.copy(src, os.path.join(r, dest))
    etc = os.path.join(r, "etc", "systemd", "system")
    os.makedirs(etc)
    with open(os.path.join(etc, "legacy-app.service"), "w") as f:
        f.write("[Unit]\nDescription=a legacy service\n\n"
                "[Service]\nExecStart=/usr/bin/sleep infinity\n")

    def verify(unit):
        p = subprocess.run(["systemd-analyze", "verify", "--man=no", "--root=" + r, unit],
                           capture_output=True, text=True, timeout=TIMEOUT)
        return p.returncode, p.stderr
    verify.etc, verify.root = etc, r
    return verify


def test_unit_running_lockshim_run_verifies(root):
    shutil.copy(os.path.join(EXAMPLES, "ledger-batch.service"), root.etc)
    assert root("ledger-batch.service") == (0, "")
    os.unlink(os.path.join(root.root, PKG_CLI))
    rc, err = root("ledger-batch.service")  # the control: its command is checked
    assert rc != 0 and "/usr/bin/lockshim" in err, err


def test_dropin_adding_the_preload_verifies(root):
    d = os.path.join(root.etc, "legacy-app.service.d")
    os.makedirs(d)
    with open(os.path.join(EXAMPLES, "legacy-app.service.d", "lockshim.conf")) as f:
        text = f.read()
    assert "Environment=LD_PRELOAD=/" + PKG_SHIM + " LOCKSHIM_CONFIG=/" in text
    with open(os.path.join(d, "lockshim.conf"), "w") as f:
        f.write(text)
    assert root("legacy-app.service") == (0, "")
    with open(os.path.join(d, "lockshim.conf"), "a") as f:
        f.write("Enviroment=LOCKSHIM_LOG_LEVEL=debug\n")
    rc, err = root("legacy-app.service")  # the control: the drop-in is read
    assert "lockshim.conf" in err and "Enviroment" in err, err


def test_configs_shown_parse(tmp_path):
    with open(os.path.join(ROOT, "doc", "deploying.md")) as f:
        blocks = [b for b in re.findall(r"(?ms)^```\n(.*?)^```$", f.read()) if "locks = (" in b]
    assert blocks
    known = subprocess.run([CLI, "settings"], capture_output=True, text=True,
                           timeout=TIMEOUT).stdout.splitlines()
    if not any(l.startswith("top programs ") for l in known):
        pytest.skip("this build has no `programs` setting yet")
    for i, text in enumerate(blocks):
        path = str(tmp_path / ("shown-%d.cfg" % i))
        with open(path, "w") as f:
            f.write(text)
        r = subprocess.run([CLI, "check", "-c", path], capture_output=True, text=True,
                           timeout=TIMEOUT)
        assert r.returncode in (0, 69) and "ok, " in r.stdout, (text, r.stdout, r.stderr)
