# SPDX-License-Identifier: MIT
"""The Debian package and make install/uninstall (issue 21 §4).

`make deb` builds build/lockshim_<version>_amd64.deb once for the module:
lintian finds no error in it, it holds exactly the expected files with the
/etc config as its one conffile, and its Depends (dpkg-shlibdeps) names
exactly the packages the README's dependency table names, which are the
packages the binaries' NEEDED entries resolve to through `dpkg -S`. In a
bare Debian 12 root (support/debroot.py) it installs offline, runs a
guarded program, enables the system-wide preload, guards a program through
it, and `apt-get purge` leaves no preload line, no file of the package and
every program working. `make install`/`make uninstall` with DESTDIR keep an
edited /etc config, and uninstall removes only the shim's preload line.
"""
import os
import re
import shutil
import subprocess

import pytest

from support.debroot import chroot, fresh_root
from support.util import ASAN, BUILD, ROOT, TSAN

pytestmark = pytest.mark.skipif(ASAN or TSAN, reason="the package and make install are "
                                "built without sanitizers")

LIBDIR = "/usr/lib/x86_64-linux-gnu/lockshim"
SHIM_LINE = LIBDIR + "/liblockshim.so"
OTHER_LINE = "/usr/lib/x86_64-linux-gnu/libgcc_s.so.1"  # harmless in any program
EXPECTED_FILES = {
    "/etc/lockshim/lockshim.cfg",
    "/usr/bin/lockshim",
    SHIM_LINE,
    SHIM_LINE.replace("liblockshim.so", "liblockshim-postgres.so"),
    SHIM_LINE.replace("liblockshim.so", "liblockshim-zookeeper.so"),
    SHIM_LINE.replace("liblockshim.so", "liblockshim-etcd.so"),
    "/usr/share/doc/lockshim/changelog.gz",
    "/usr/share/doc/lockshim/copyright",
    "/usr/share/doc/lockshim/examples/lockshim.cfg",
    "/usr/share/lintian/overrides/lockshim",
    "/usr/share/man/man1/lockshim.1.gz",
    "/usr/share/man/man5/lockshim.cfg.5.gz",
}


def makefile_version():
    with open(os.path.join(ROOT, "Makefile")) as f:
        return re.search(r"(?m)^VERSION := (\S+)$", f.read()).group(1)


@pytest.fixture(scope="module")
def deb():
    """Builds the package with `make deb`; returns its path."""
    for tool in ("dpkg-deb", "dpkg-shlibdeps"):
        if not shutil.which(tool):
            pytest.skip(tool + " is missing (scripts/install-deps.sh installs dpkg-dev)")
    path = os.path.join(ROOT, "build", "lockshim_%s_amd64.deb" % makefile_version())
    if os.path.exists(path):
        os.unlink(path)
    r = subprocess.run(["make", "-s", "-C", ROOT, "deb"], capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    assert os.path.exists(path)
    return path


def field(deb_path, name):
    return subprocess.run(["dpkg-deb", "-f", deb_path, name], capture_output=True, text=True,
                          check=True).stdout.strip()


def package_names(depends):
    """The package names of a Depends value, without versions."""
    return {re.match(r"\s*([a-z0-9][a-z0-9+.-]*)", d).group(1) for d in depends.split(",")}


def readme_dependencies():
    """{installed file name: set of packages} from the README's dependency table."""
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    sect = text.split("\n## Dependencies\n", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in sect.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`"):
            rows[cells[0].strip("`")] = set(re.findall(r"`([a-z0-9][a-z0-9+.-]*)`", cells[1]))
    return rows


def dpkg_owner(path):
    """The package owning a library path on this machine (trying the path,
    its real path and the other side of the /usr merge)."""
    tries = [path, os.path.realpath(path)]
    tries += [p[4:] if p.startswith("/usr/") else "/usr" + p for p in list(tries)]
    for p in tries:
        r = subprocess.run(["dpkg", "-S", p], capture_output=True, text=True)
        if r.returncode == 0:
            return r.stdout.split(":")[0].strip()
    raise AssertionError("no package owns " + path)


def needed_packages(binary):
    """The packages the NEEDED entries of binary (objdump -p) resolve to."""
    dyn = subprocess.run(["objdump", "-p", binary], capture_output=True, text=True,
                         check=True).stdout
    needed = re.findall(r"^\s+NEEDED\s+(\S+)$", dyn, re.M)
    assert needed, dyn
    ldd = subprocess.run(["ldd", binary], capture_output=True, text=True, check=True).stdout
    found = {}
    for line in ldd.splitlines():
        m = re.match(r"\s*(\S+) => (/\S+)", line) or re.match(r"\s*((/\S+))", line)
        if m:
            found[os.path.basename(m.group(1))] = m.group(2)
    return {dpkg_owner(found[n]) for n in needed}


def test_lintian_finds_no_error(deb, tmp_path):
    if not shutil.which("lintian"):
        pytest.skip("lintian is not installed (scripts/install-deps.sh installs it)")
    # lintian leaves its mldbm-elf-* files in TMPDIR: the test's own
    r = subprocess.run(["lintian", "--no-cfg", deb], capture_output=True, text=True,
                       timeout=600, env=dict(os.environ, TMPDIR=str(tmp_path)))
    errors = [l for l in r.stdout.splitlines() if l.startswith("E:")]
    assert errors == [] and r.returncode == 0, r.stdout + r.stderr


def test_package_files_and_metadata(deb, tmp_path):
    listing = subprocess.run(["dpkg-deb", "-c", deb], capture_output=True, text=True,
                             check=True).stdout
    files = {l.split()[-1][1:] for l in listing.splitlines() if not l.startswith("d")}
    assert files == EXPECTED_FILES
    assert all(" root/root " in l for l in listing.splitlines())
    ctrl = str(tmp_path / "ctrl")
    subprocess.run(["dpkg-deb", "-e", deb, ctrl], check=True)
    with open(os.path.join(ctrl, "conffiles")) as f:
        assert f.read().split() == ["/etc/lockshim/lockshim.cfg"]
    for script in ("prerm", "postrm"):
        path = os.path.join(ctrl, script)
        assert os.access(path, os.X_OK)
        with open(path) as f:
            text = f.read()
        assert "\nlockshim_unpreload() {\n" in text and "\n#UNPRELOAD#\n" not in text
        assert "lockshim_unpreload /etc/ld.so.preload %s\n" % SHIM_LINE in text
        assert ">> /etc/ld.so.preload" not in text  # never adds a line
    assert not os.path.exists(os.path.join(ctrl, "postinst"))
    assert os.path.basename(deb) == "lockshim_%s_amd64.deb" % field(deb, "Version")
    assert field(deb, "Version") == makefile_version()
    assert field(deb, "Section") == "admin" and field(deb, "Priority") == "optional"
    assert re.fullmatch(r".+ <[^ ]+@[^ ]+>", field(deb, "Maintainer"))
    assert "Redis" in field(deb, "Description")


def test_depends_are_the_documented_packages_and_the_needed_ones(deb, tmp_path):
    depends = package_names(field(deb, "Depends"))
    documented = readme_dependencies()
    modules = ("liblockshim-postgres.so", "liblockshim-zookeeper.so", "liblockshim-etcd.so")
    assert set(documented) == {"liblockshim.so", "lockshim"} | set(modules), documented
    assert depends == documented["liblockshim.so"] | documented["lockshim"]
    # the modules' libraries are suggested: needed only when that backend is selected
    assert package_names(field(deb, "Suggests")) == \
        set().union(*(documented[m] for m in modules)) - depends
    tree = str(tmp_path / "tree")
    subprocess.run(["dpkg-deb", "-x", deb, tree], check=True)
    assert needed_packages(tree + SHIM_LINE) == documented["liblockshim.so"]
    assert needed_packages(tree + "/usr/bin/lockshim") == documented["lockshim"]
    for module in modules:
        assert needed_packages(tree + SHIM_LINE.replace("liblockshim.so", module)) == \
            documented[module]
    assert "libc6" in depends


def in_root(root, cmd, **kw):
    """Runs cmd in root; returns the CompletedProcess, asserting exit 0."""
    r = chroot(root, cmd, **kw)
    assert r.returncode == 0, (cmd, r.stdout, r.stderr)
    return r


@pytest.fixture
def root(tmp_path):
    """A fresh bare Debian 12 root, removed after the test (200 MB)."""
    r = fresh_root(tmp_path / "root")
    yield r
    shutil.rmtree(r, ignore_errors=True)


def test_install_run_enable_purge_in_a_bare_root(deb, redis, root):
    shutil.copy(deb, root)
    r = in_root(root, "cd / && apt-get install -y ./" + os.path.basename(deb))
    assert "Setting up lockshim" in r.stdout
    assert in_root(root, "lockshim version").stdout.strip().endswith(makefile_version())
    listed = in_root(root, "dpkg -L lockshim").stdout.split()
    assert EXPECTED_FILES <= set(listed)

    # lockshim run: the CLI finds the package's shim (its compiled-in LIBDIR).
    # The guarded program: Debian's mv, its rename under the lock.
    mv = "touch /root/a && mv /root/a /root/b && rm /root/b"
    cfg = ('redis = { host = "127.0.0.1"; port = %d; };\nlog_level = "debug";\n'
           'locks = ( { symbols = ( "rename", "renameat", "renameat2" ); key = "pkgtest"; } );\n'
           % redis.port)
    with open(os.path.join(root, "root/run.cfg"), "w") as f:
        f.write(cfg)
    r = in_root(root, "lockshim run -c /root/run.cfg -- sh -c '%s'" % mv)
    assert "acquired lockshim:pkgtest" in r.stderr, r.stderr
    r = in_root(root, mv)  # control: not guarded without the shim
    assert "acquired" not in r.stderr

    if in_root(root, "command -v man || true").stdout.strip():
        assert in_root(root, "man -w lockshim").stdout.strip() == \
            "/usr/share/man/man1/lockshim.1.gz"
    elif shutil.which("man"):  # man-db is not in the bare root: the host's reads its pages
        for page, path in (("lockshim", "man1/lockshim.1.gz"),
                           ("lockshim.cfg", "man5/lockshim.cfg.5.gz")):
            r = subprocess.run(["man", "-M", os.path.join(root, "usr/share/man"), "-w", page],
                               capture_output=True, text=True)
            assert r.stdout.strip() == os.path.join(root, "usr/share/man", path), r.stderr
    for page in ("man1/lockshim.1.gz", "man5/lockshim.cfg.5.gz"):
        assert os.path.getsize(os.path.join(root, "usr/share/man", page)) > 1000

    # System-wide: the guarded config as /etc/lockshim/lockshim.cfg, then the
    # preload line. Control first: the config alone guards nothing.
    with open(os.path.join(root, "etc/lockshim/lockshim.cfg"), "w") as f:
        f.write(cfg)
    assert "acquired" not in in_root(root, mv).stderr
    preload = os.path.join(root, "etc/ld.so.preload")
    with open(preload, "w") as f:
        f.write(OTHER_LINE + "\n")
    if re.search(r"(?m)^\s*enable\b", in_root(root, "lockshim help").stdout):
        in_root(root, "lockshim enable")
    else:
        # SWITCH to `lockshim enable` (engineer A) once the verb is merged:
        # until then the test writes the line the verb adds.
        with open(preload, "a") as f:
            f.write(SHIM_LINE + "\n")
    with open(preload) as f:
        assert f.read().split("\n") == [OTHER_LINE, SHIM_LINE, ""]
    r = in_root(root, mv)
    assert "acquired lockshim:pkgtest" in r.stderr, r.stderr

    # An upgrade (here a reinstall) keeps the line and the edited conffile.
    in_root(root, "cd / && dpkg -i ./" + os.path.basename(deb))
    with open(preload) as f:
        assert f.read().split("\n") == [OTHER_LINE, SHIM_LINE, ""]
    with open(os.path.join(root, "etc/lockshim/lockshim.cfg")) as f:
        assert f.read() == cfg

    r = in_root(root, "apt-get purge -y lockshim")
    assert "removed %s from /etc/ld.so.preload" % SHIM_LINE in r.stdout
    with open(preload) as f:
        assert f.read() == OTHER_LINE + "\n"
    left = [p for p in listed if p in EXPECTED_FILES and os.path.lexists(root + p)]
    assert left == []
    for d in ("/etc/lockshim", LIBDIR, "/usr/share/doc/lockshim"):
        assert not os.path.exists(root + d), d
    assert chroot(root, "dpkg -s lockshim").returncode != 0  # purged: unknown to dpkg
    for cmd in ("sh -c true", "ls /", mv):
        r = in_root(root, cmd)
        assert r.stderr == "", (cmd, r.stderr)
    # Control: the line left behind, every program prints an ld.so error.
    with open(preload, "a") as f:
        f.write(SHIM_LINE + "\n")
    assert "cannot be preloaded" in in_root(root, "sh -c true").stderr

    # apt-get remove (the prerm) also takes the line out, and keeps the
    # conffile until purge.
    with open(preload, "w") as f:
        f.write(OTHER_LINE + "\n")
    in_root(root, "cd / && apt-get install -y ./" + os.path.basename(deb))
    with open(preload, "a") as f:
        f.write(SHIM_LINE + "\n")  # as enable would, with the shipped config
    assert in_root(root, "sh -c true").stderr == ""
    r = in_root(root, "apt-get remove -y lockshim")
    assert "removed %s from /etc/ld.so.preload" % SHIM_LINE in r.stdout
    with open(preload) as f:
        assert f.read() == OTHER_LINE + "\n"
    assert os.path.exists(os.path.join(root, "etc/lockshim/lockshim.cfg"))
    assert not os.path.lexists(root + SHIM_LINE)
    in_root(root, "apt-get purge -y lockshim")
    assert not os.path.exists(os.path.join(root, "etc/lockshim"))


def make(*args):
    build = os.path.relpath(BUILD, ROOT)
    return subprocess.run(["make", "-s", "-C", ROOT, "BUILD=" + build] + list(args),
                          capture_output=True, text=True, timeout=600)


def test_make_uninstall_removes_only_the_preload_line_and_keeps_the_config(tmp_path):
    dest = str(tmp_path / "dest")
    r = make("install", "DESTDIR=" + dest)
    assert r.returncode == 0, r.stderr
    etc_cfg = os.path.join(dest, "etc/lockshim/lockshim.cfg")
    with open(etc_cfg) as f, open(os.path.join(ROOT, "config/lockshim.etc.cfg")) as g:
        assert f.read() == g.read()
    with open(etc_cfg, "a") as f:
        f.write("# edited by the operator\n")
    preload = os.path.join(dest, "etc/ld.so.preload")
    with open(preload, "w") as f:
        f.write("/opt/other/libother.so\n/usr/local/lib/liblockshim.so\n")
    os.chmod(preload, 0o600)

    r = make("uninstall", "DESTDIR=" + dest)
    assert r.returncode == 0, r.stderr
    assert "removed /usr/local/lib/liblockshim.so from %s" % preload in r.stdout
    assert "left %s" % etc_cfg in r.stdout
    with open(preload) as f:
        assert f.read() == "/opt/other/libother.so\n"
    assert os.stat(preload).st_mode & 0o777 == 0o600
    left = sorted(os.path.relpath(os.path.join(d, f), dest)
                  for d, _, fs in os.walk(dest) for f in fs)
    assert left == ["etc/ld.so.preload", "etc/lockshim/lockshim.cfg"]

    # Again: nothing to remove is not reported; a second install keeps the
    # edited config.
    r = make("uninstall", "DESTDIR=" + dest)
    assert r.returncode == 0 and "removed" not in r.stdout
    r = make("install", "DESTDIR=" + dest)
    assert r.returncode == 0 and "kept %s" % etc_cfg in r.stdout
    with open(etc_cfg) as f:
        assert f.read().endswith("# edited by the operator\n")


def unpreload(path, line):
    """Runs packaging/unpreload.sh's function on path; returns the CompletedProcess."""
    return subprocess.run(["sh", "-c", '. "$0" && lockshim_unpreload "$1" "$2"',
                           os.path.join(ROOT, "packaging", "unpreload.sh"), path, line],
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("before,after", [
    ("a.so\n%s\nb.so\n", "a.so\nb.so\n"),
    ("%s\na.so\n%s\n", "a.so\n"),          # every copy of the line
    ("a.so\n%s", "a.so\n"),                 # no newline after the last line
    ("%s\n", ""),                           # the file stays, empty
    ("a.so %s\n%s.bak\n %s\n", "a.so %s\n%s.bak\n %s\n"),  # not exactly the line: kept
    ("a.so\n", "a.so\n"),                   # nothing to remove: the file untouched
])
def test_unpreload_removes_exactly_the_line(tmp_path, before, after):
    line = "/usr/lib/x86_64-linux-gnu/lockshim/liblockshim.so"
    target = tmp_path / "real.preload"
    target.write_text(before.replace("%s", line))
    os.chmod(target, 0o640)
    link = tmp_path / "ld.so.preload"
    os.symlink("real.preload", link)
    ino = os.stat(target).st_ino
    r = unpreload(str(link), line)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert target.read_text() == after.replace("%s", line)
    assert os.path.islink(link)  # the link is followed, not replaced
    assert os.stat(target).st_mode & 0o777 == 0o640
    assert ("removed " + line in r.stdout) == (before != after)
    assert (os.stat(target).st_ino == ino) == (before == after)  # renamed over, or untouched
    assert sorted(os.listdir(tmp_path)) == ["ld.so.preload", "real.preload"]  # no temp file


def test_unpreload_failure_stops_the_caller(tmp_path):
    """A file it cannot rewrite (here: its directory is not writable) makes
    it fail, so that prerm under set -e stops the removal instead of
    leaving a preload line naming a deleted shim."""
    line = "/usr/local/lib/liblockshim.so"
    d = tmp_path / "ro"
    d.mkdir()
    (d / "ld.so.preload").write_text(line + "\n")
    r = subprocess.run(["unshare", "--mount", "sh", "-c",
                        'mount --bind -o ro "$1" "$1" && mount -o remount,bind,ro "$1" && '
                        'set -e && . "$0" && lockshim_unpreload "$1/ld.so.preload" "$2"; echo after',
                        os.path.join(ROOT, "packaging", "unpreload.sh"), str(d), line],
                       capture_output=True, text=True, timeout=60)
    if "unshare:" in r.stderr or "mount:" in r.stderr:
        pytest.skip("cannot make a read-only mount here: " + r.stderr.strip())
    assert r.returncode != 0 and "after" not in r.stdout, r
    assert (d / "ld.so.preload").read_text() == line + "\n"
