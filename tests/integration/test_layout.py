"""The source layout's promises (doc/design.md): the folders are levels
that use only the levels below them (cli -> shim -> backend -> common ->
arch; the CLI reaches shim/ only for the lock layers that `lockshim lock`
links), the include graph has no cycle, the
lock layers depend one way (dispatch -> lock -> renew -> backend), and only
arch/<name>/ names an architecture (a new one is a new folder)."""
import glob
import os
import re

from support.util import ROOT

FOLDERS = ["cli", "shim", "backend", "common", "arch"]
LAYERS = ["dispatch", "lock", "renew", "backend"]
# Which folders each folder may include from (besides its own).
MAY_USE = {
    "cli": {"backend", "common", "arch"},
    "shim": {"backend", "common", "arch"},
    "backend": {"common", "arch"},
    "common": {"arch"},
    "arch": {"shim"},  # the trampoline reads the guard (guard.h)
}
# `lockshim lock` takes its lock with the shim's own lock layers, linked
# into the command (the Makefile's CLI_SHARED), and nothing else of shim/.
CLI_FROM_SHIM = {"lock.h", "renew.h", "guard.h", "count.h"}


def sources():
    """Every source file, as its path relative to the root."""
    out = []
    for folder in FOLDERS:
        for path in glob.glob(os.path.join(ROOT, folder, "**", "*.[chS]"),
                              recursive=True):
            out.append(os.path.relpath(path, ROOT))
    return out


def headers():
    """Header name -> its folder's top (cli, shim, backend, common, arch)."""
    return {os.path.basename(p): p.split(os.sep)[0]
            for p in sources() if p.endswith(".h")}


def includes():
    graph = {}
    for path in sources():
        mod = os.path.splitext(os.path.basename(path))[0]
        with open(os.path.join(ROOT, path)) as f:
            names = re.findall(r'^#include "([^"]+)\.h"', f.read(), re.M)
        graph.setdefault(mod, set()).update(n for n in names if n != mod)
    return graph


def reachable(graph, start):
    seen, todo = set(), [start]
    while todo:
        for n in graph.get(todo.pop(), ()):
            if n not in seen:
                seen.add(n)
                todo.append(n)
    return seen


def test_every_source_is_in_a_folder():
    assert sources()
    top = glob.glob(os.path.join(ROOT, "*.[chS]"))
    assert top == []


def test_header_names_are_unique():
    """-iquote finds a header by its name alone."""
    names = [os.path.basename(p) for p in sources() if p.endswith(".h")]
    assert sorted(names) == sorted(set(names))


def test_folders_use_only_the_levels_below():
    where = headers()
    offenders = []
    for path in sources():
        folder = path.split(os.sep)[0]
        with open(os.path.join(ROOT, path)) as f:
            names = re.findall(r'^#include "([^"]+)"', f.read(), re.M)
        for n in names:
            other = where.get(n)
            assert other, (path, n)
            if other != folder and other not in MAY_USE[folder] and \
                    not (folder == "cli" and other == "shim" and n in CLI_FROM_SHIM):
                offenders.append((path, n))
    assert offenders == []


def test_include_graph_has_no_cycle():
    graph = includes()
    cycles = [m for m in graph if m in reachable(graph, m)]
    assert cycles == []


def test_lock_layers_depend_one_way():
    """Each layer reaches only the layers below it, never one above."""
    graph = includes()
    for i, layer in enumerate(LAYERS):
        above = set(LAYERS[:i])
        assert not reachable(graph, layer) & above, layer


def test_generic_code_names_no_architecture():
    """Only an architecture's own folder (arch/<name>/) mentions it; the
    rest reach it through arch/arch.h (the interface, whose comments name
    examples), which includes the folder's machine.h."""
    arch = [os.path.basename(p) for p in glob.glob(os.path.join(ROOT, "arch", "*"))
            if os.path.isdir(p)]
    assert arch
    offenders = []
    for path in sources():
        if path.startswith("arch" + os.sep):
            continue
        with open(os.path.join(ROOT, path)) as f:
            text = f.read()
        if any(re.search(r"\b%s\b" % a, text) for a in arch) or "__x86_64__" in text:
            offenders.append(path)
    assert offenders == []
