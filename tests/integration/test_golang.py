# SPDX-License-Identifier: MIT
"""Go programs: Go makes its system calls itself, not through libc, so a
lock on a libc function can catch only the calls a Go program makes
through cgo (issue 19: `age` ran unguarded with the reason at `info`).

- The shim recognises a Go executable by its build information (stripped
  too) and says, for each lock on a libc function, at `warn`, that only cgo
  calls reach libc; `strict` refuses the program (exit 78, before main);
  `lockshim check -- PROGRAM` prints the lock `unguarded` with that reason
  (exit 1) unless a cgo call site exists, then the guarded line and the note.
- A cgo call of a guarded function really waits for a lock held elsewhere;
  os.WriteFile in the same program does not.
- Controls: a C program with the same locks gets no Go line; a static
  pure-Go program is still refused by `lockshim run`.

The Go programs are built at test time with Debian's golang-go (skipped,
saying so, where `go` is missing: scripts/install-deps.sh installs it).
"""
import os
import re
import shutil
import subprocess

import pytest

from support.util import CLI, PRELOAD, TIMEOUT, run, shim_env, wait_for, write_config

GO_NOTE = "Go makes system calls directly, not through libc, and only its cgo calls reach libc"

# Only Go's os package (a dynamic executable once the C linker links it).
GO_OS = r"""
package main

import (
	"fmt"
	"os"
)

func main() {
	dir := os.Args[1]
	if err := os.WriteFile(dir+"/a", []byte("go\n"), 0o644); err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	if err := os.Rename(dir+"/a", dir+"/b"); err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	fmt.Println("go done")
}
"""

# The same with the net package: dynamic (the cgo resolver), linked by Go.
GO_NET = GO_OS.replace('"os"\n', '"net"\n\t"os"\n').replace(
    "func main() {\n", "func main() {\n\t_ = net.ParseIP\n")

# cgo calls of rename and write (through libc), and os.WriteFile (not).
GO_CGO = r"""
package main

/*
#include <stdio.h>
#include <string.h>
#include <unistd.h>
static int c_rename(const char *a, const char *b) { return rename(a, b); }
static int c_write(int fd, const char *s) { return (int)write(fd, s, strlen(s)); }
*/
import "C"

import (
	"fmt"
	"os"
)

func main() {
	dir := os.Args[1]
	if err := os.WriteFile(dir+"/a", []byte("go\n"), 0o644); err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	fmt.Println("os done")
	fmt.Println("cgo calling")
	rc := C.c_rename(C.CString(dir+"/a"), C.CString(dir+"/b"))
	fmt.Println("cgo rename rc", rc)
	C.c_write(1, C.CString("cgo wrote\n"))
}
"""

# A C library calling rename, and a Go program calling it through cgo: the
# executable itself imports no rename.
LIB_C = r"""
#include <stdio.h>
int lib_rename(const char *a, const char *b) { return rename(a, b); }
"""

GO_LIB = r"""
package main

/*
#cgo LDFLAGS: -L@DIR@ -Wl,-rpath,@DIR@ -lgorename
int lib_rename(const char *a, const char *b);
*/
import "C"

import (
	"fmt"
	"os"
)

func main() {
	dir := os.Args[1]
	os.WriteFile(dir+"/a", []byte("go\n"), 0o644)
	fmt.Println("lib rename rc", C.lib_rename(C.CString(dir+"/a"), C.CString(dir+"/b")))
}
"""

# Control: a C program calling the same functions through libc.
C_PROG = r"""
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	char a[4096], b[4096];
	FILE *f;

	if (argc != 2)
		return 2;
	snprintf(a, sizeof(a), "%s/a", argv[1]);
	snprintf(b, sizeof(b), "%s/b", argv[1]);
	if (!(f = fopen(a, "w")) || fclose(f) != 0 || rename(a, b) != 0)
		return 1;
	return write(1, "c done\n", 7) == 7 ? 0 : 1;
}
"""

LIBC_LOCKS = 'locks = ( { symbol = "rename"; }, { symbol = "write"; }, { symbol = "openat"; } );\n'


def go_build(d, name, source, *flags, cgo=True):
    """Builds d/name from Go source with Debian's go; returns its path."""
    src = os.path.join(d, name + ".go")
    with open(src, "w") as f:
        f.write(source)
    env = dict(os.environ, GOCACHE=os.path.join(d, "gocache"), GOPATH=os.path.join(d, "gopath"),
               HOME=d, GO111MODULE="off", GOFLAGS="", CGO_ENABLED="1" if cgo else "0")
    env.pop("LD_PRELOAD", None)
    out = os.path.join(d, name)
    subprocess.run(["go", "build", "-o", out] + list(flags) + [src], cwd=d, env=env,
                   check=True, timeout=300)
    return out


@pytest.fixture(scope="module")
def goprogs(tmp_path_factory):
    """The Go programs (and the C control), by name."""
    if not shutil.which("go"):
        pytest.skip("no go command: install Debian's golang-go (scripts/install-deps.sh does)")
    d = str(tmp_path_factory.mktemp("go"))
    p = {
        "net": go_build(d, "gonet", GO_NET),
        "os": go_build(d, "goos", GO_OS, "-ldflags=-linkmode=external"),
        "stripped": go_build(d, "gostripped", GO_OS, "-ldflags=-linkmode=external -s -w"),
        "cgo": go_build(d, "gocgo", GO_CGO),
        "static": go_build(d, "gostatic", GO_OS, cgo=False),
    }
    subprocess.run(["strip", p["stripped"]], check=True)
    # no section headers at all (as sstrip leaves it): the blob is found in memory
    p["sectionless"] = os.path.join(d, "gosectionless")
    shutil.copy(p["stripped"], p["sectionless"])
    with open(p["sectionless"], "r+b") as f:
        f.seek(0x28)  # Elf64_Ehdr: e_shoff; e_shnum and e_shstrndx at 0x3c
        f.write(b"\0" * 8)
        f.seek(0x3c)
        f.write(b"\0" * 4)
    assert "There are no sections" in subprocess.run(
        ["readelf", "-S", p["sectionless"]], capture_output=True, text=True).stdout
    with open(os.path.join(d, "gorename.c"), "w") as f:
        f.write(LIB_C)
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", os.path.join(d, "libgorename.so"),
                    os.path.join(d, "gorename.c")], check=True)
    p["lib"] = go_build(d, "golib", GO_LIB.replace("@DIR@", d))
    p["libdir"] = d
    p["c"] = os.path.join(d, "cprog")
    with open(p["c"] + ".c", "w") as f:
        f.write(C_PROG)
    subprocess.run(["gcc", "-O2", "-o", p["c"], p["c"] + ".c"], check=True)
    return p


def check(cfg, *argv):
    return subprocess.run([CLI, "check", "-c", cfg, "--"] + list(argv),
                          env=shim_env(None, preload=False), capture_output=True, text=True,
                          timeout=TIMEOUT, stdin=subprocess.DEVNULL)


def report_lines(stdout):
    """check's lines about the locks (after its summary and the redis line)."""
    lines = stdout.splitlines()
    return lines[[i for i, l in enumerate(lines) if l.startswith("redis: ")][0] + 1:]


def unguarded_why(symbol):
    return "%s is libc's and this is a Go program (go1." % symbol


GO_WITHOUT_CGO = ["net", "os", "stripped", "sectionless"]


# ---- no cgo call site: unguarded, said at warn ------------------------------------

@pytest.mark.parametrize("prog", GO_WITHOUT_CGO)
def test_go_program_says_at_warn_that_its_libc_locks_catch_nothing(goprogs, redis, tmp_path,
                                                                   prog):
    """Each lock on a libc function gets a warn line naming Go and why (old
    shim: nothing at the default level, the reason only at info); the program
    runs and does its work unguarded."""
    r = run([goprogs[prog], str(tmp_path)], write_config(tmp_path, redis, LIBC_LOCKS))
    assert r.returncode == 0, r.stderr
    assert r.stdout == "go done\n"
    assert (tmp_path / "b").read_text() == "go\n"
    warns = [l for l in r.stderr.splitlines() if ": warn: " in l]
    assert len(warns) == 3, r.stderr
    for symbol, line in zip(["rename", "write", "openat"], warns):
        assert unguarded_why(symbol) in line and GO_NOTE in line, line
        assert line.endswith("no cgo call site of %s in the program or the libraries it "
                             "links" % symbol)
    assert "acquired" not in r.stderr


STRICT = [
    ("top level", "strict = true;\n", '{ symbol = "rename"; }'),
    ("per lock", "", '{ symbol = "rename"; strict = true; }'),
]


@pytest.mark.parametrize("how,top,lock", STRICT, ids=[c[0] for c in STRICT])
def test_strict_refuses_a_go_program_before_main(goprogs, redis, tmp_path, how, top, lock):
    """strict: exit 78 before main, one line naming the lock and the Go
    reason (old shim: the program ran unguarded)."""
    cfg = write_config(tmp_path, redis, top + "locks = ( %s );\n" % lock)
    r = run([goprogs["os"], str(tmp_path)], cfg)
    assert r.returncode == 78, r.stdout + r.stderr
    assert r.stdout == "" and not (tmp_path / "a").exists()  # main never ran
    assert len(r.stderr.splitlines()) == 1, r.stderr
    assert "config error: locks[0] (rename) cannot be guarded in this program and is " \
        "strict: " + unguarded_why("rename") in r.stderr
    assert GO_NOTE in r.stderr


def test_lockshim_run_refuses_a_strict_go_program(goprogs, redis, tmp_path):
    """`lockshim run` the same (it loads the shim), and a static pure-Go
    program is refused by run before that, as before."""
    cfg = write_config(tmp_path, redis, "strict = true;\n" + LIBC_LOCKS)
    r = subprocess.run([CLI, "run", "-c", cfg, "--", goprogs["net"], str(tmp_path)],
                       env=shim_env(None, preload=False), capture_output=True, text=True,
                       timeout=TIMEOUT)
    assert r.returncode == 78, r.stdout + r.stderr
    assert r.stdout == "" and unguarded_why("rename") in r.stderr
    r = subprocess.run([CLI, "run", "-c", cfg, "--", goprogs["static"], str(tmp_path)],
                       env=shim_env(None, preload=False), capture_output=True, text=True,
                       timeout=TIMEOUT)
    assert r.returncode != 0 and "statically linked" in r.stderr, r.stderr


@pytest.mark.parametrize("prog", GO_WITHOUT_CGO)
def test_check_says_a_go_programs_libc_locks_are_unguarded(goprogs, redis, tmp_path, prog):
    """check -- PROGRAM: each lock `unguarded` with the Go reason, exit 1."""
    r = check(write_config(tmp_path, redis, LIBC_LOCKS), goprogs[prog], str(tmp_path))
    assert r.returncode == 1, r.stdout + r.stderr
    lines = report_lines(r.stdout)
    assert len(lines) == 3, r.stdout
    for symbol, line in zip(["rename", "write", "openat"], lines):
        assert line.startswith("%s: unguarded: %s" % (symbol, unguarded_why(symbol))), line
        assert GO_NOTE in line


# ---- cgo call sites: guarded for cgo calls only -------------------------------------

def test_check_says_cgo_calls_only(goprogs, redis, tmp_path):
    """A lock whose function the program calls through cgo: the guarded line,
    then the note that only cgo calls are guarded (old check: the reloc line
    alone, as if every call were); exit 0, every lock has call sites."""
    cfg = write_config(tmp_path, redis, 'locks = ( { symbol = "rename"; }, '
                                        '{ symbol = "write"; } );\n')
    r = check(cfg, goprogs["cgo"], str(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    lines = report_lines(r.stdout)
    assert len(lines) == 4, r.stdout
    for symbol, (guarded, note) in zip(["rename", "write"], [lines[0:2], lines[2:4]]):
        # (a sanitizer runtime's libraries add call sites of their own)
        assert re.match(r"%s: reloc \(\d+ call sites?\) in \S+/libc\.so\.6$" % symbol,
                        guarded), guarded
        assert note.startswith("%s: cgo calls only: this is a Go program (go1." % symbol), note
        assert GO_NOTE in note and note.endswith("1 call site outside libc is guarded")
    # openat has no cgo call site there: unguarded, exit 1
    cfg = write_config(tmp_path, redis, LIBC_LOCKS)
    r = check(cfg, goprogs["cgo"], str(tmp_path))
    assert r.returncode == 1, r.stdout + r.stderr
    assert report_lines(r.stdout)[-1].startswith("openat: unguarded: " + unguarded_why("openat"))


def test_cgo_call_waits_for_the_lock_and_os_call_does_not(goprogs, worker_progs, redis,
                                                           tmp_path, bg):
    """While another process holds the key: os.WriteFile (a direct system
    call) runs at once, the cgo rename waits (blocked on the key) and runs
    once the holder leaves; at start-up the note is at warn, not refused
    (strict is set)."""
    holder_cfg = write_config(tmp_path, redis, 'locks = ( { symbol = "block_call"; '
                                               'key = "golock"; } );\n')
    holder = bg([worker_progs["block"]], holder_cfg)
    holder.expect("enter")
    go_dir = tmp_path / "go"
    go_dir.mkdir()
    go_cfg = str(go_dir / "go.cfg")
    shutil.copy(write_config(tmp_path, redis, 'strict = true;\nlocks = ( { symbol = "rename"; '
                                              'key = "golock"; wait_ms = 60000; } );\n'),
                go_cfg)
    prog = bg([goprogs["cgo"], str(go_dir)], go_cfg, LOCKSHIM_LOG_LEVEL="debug")
    prog.expect("os done")  # written while the key is held
    assert (go_dir / "a").read_text() == "go\n"
    prog.expect("cgo calling")
    wait_for(lambda: redis.cmd("CLIENT", "LIST").count("cmd=blpop") == 1,
             what="the cgo rename blocked on the key")
    assert (go_dir / "a").exists() and not (go_dir / "b").exists()
    holder.send()
    assert prog.expect("cgo rename rc") == "cgo rename rc 0"
    prog.expect("cgo wrote")
    assert prog.wait() == 0 and holder.wait() == 0
    assert (go_dir / "b").read_text() == "go\n"
    err = prog.stderr()
    assert "acquired lockshim:golock for rename" in err
    warns = [l for l in err.splitlines() if ": warn: " in l]
    assert len(warns) == 1 and "rename: cgo calls only: this is a Go program" in warns[0], err


def test_cgo_call_site_in_a_c_library_the_program_links(goprogs, redis, tmp_path):
    """A C library the Go program links (DT_NEEDED) calls rename: that is its
    cgo call site (the executable imports none); the call is guarded."""
    exe_imports = subprocess.run(["readelf", "--dyn-syms", "-W", goprogs["lib"]],
                                 capture_output=True, text=True, check=True).stdout
    assert " rename" not in exe_imports and " lib_rename" in exe_imports
    cfg = write_config(tmp_path, redis, 'locks = ( { symbol = "rename"; } );\n')
    r = check(cfg, goprogs["lib"], str(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    lines = report_lines(r.stdout)
    assert len(lines) == 2 and lines[0].startswith("rename: reloc ("), r.stdout
    assert lines[1].startswith("rename: cgo calls only: ") and \
        lines[1].endswith("1 call site outside libc is guarded"), lines[1]
    r = run([goprogs["lib"], str(tmp_path)], cfg, LOCKSHIM_LOG_LEVEL="debug")
    assert r.returncode == 0 and r.stdout == "lib rename rc 0\n", r.stderr
    assert "acquired lockshim:rename for rename" in r.stderr
    assert (tmp_path / "b").read_text() == "go\n"


def test_a_preloaded_library_is_no_cgo_call_site(goprogs, redis, tmp_path):
    """A library preloaded beside the shim (as a sanitizer runtime is) calls
    rename: its calls are caught, but it is not the Go program's, whose
    lock on rename stays unguarded (the Go reason at warn; strict refuses)."""
    cfg = write_config(tmp_path, redis, 'locks = ( { symbol = "rename"; } );\n')
    preload = os.path.join(goprogs["libdir"], "libgorename.so") + ":" + PRELOAD
    r = run([goprogs["os"], str(tmp_path)], cfg, LD_PRELOAD=preload)
    assert r.returncode == 0 and r.stdout == "go done\n", r.stderr
    assert unguarded_why("rename") in r.stderr
    cfg = write_config(tmp_path, redis, 'strict = true;\nlocks = ( { symbol = "rename"; } );\n')
    r = run([goprogs["os"], str(tmp_path)], cfg, LD_PRELOAD=preload)
    assert r.returncode == 78 and unguarded_why("rename") in r.stderr, r.stderr


# ---- controls ------------------------------------------------------------------------

def test_c_program_gets_no_go_line(goprogs, redis, tmp_path):
    """The same locks on a C program: no Go line at start-up or in check;
    strict accepts its guarded rename."""
    cfg = write_config(tmp_path, redis, 'strict = true;\nlocks = ( { symbol = "rename"; } );\n')
    r = run([goprogs["c"], str(tmp_path)], cfg, LOCKSHIM_LOG_LEVEL="debug")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "c done\n" and "acquired lockshim:rename for rename" in r.stderr
    assert "Go" not in r.stderr
    cfg = write_config(tmp_path, redis, 'locks = ( { symbol = "rename"; }, '
                                        '{ symbol = "write"; } );\n')
    r = check(cfg, goprogs["c"], str(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    lines = report_lines(r.stdout)
    assert len(lines) == 2, r.stdout
    assert lines[0].startswith("rename: reloc (") and lines[1].startswith("write: reloc (")
    assert "Go" not in r.stdout
