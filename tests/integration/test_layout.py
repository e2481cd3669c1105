"""The source layout's promises: shim/'s include graph has no cycle, the
lock layers depend one way (dispatch -> lock -> renew -> backend), and the
generic code names no architecture (a new one is its three files)."""
import glob
import os
import re

from conftest import ROOT

SHIM = os.path.join(ROOT, "shim")
LAYERS = ["dispatch", "lock", "renew", "backend"]


def includes():
    graph = {}
    for path in glob.glob(os.path.join(SHIM, "*.[chS]")):
        mod = os.path.splitext(os.path.basename(path))[0]
        with open(path) as f:
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
    """Only an architecture's own files (arch_, tramp_) mention it; the
    rest reach it through tramp.h (the interface, whose comments name
    examples) and LOCKSHIM_ARCH_H."""
    arch = [os.path.basename(p)[len("arch_"):-2]
            for p in glob.glob(os.path.join(SHIM, "arch_*.c"))]
    assert arch
    offenders = []
    for path in glob.glob(os.path.join(SHIM, "*.[ch]")):
        name = os.path.basename(path)
        if name.startswith(("arch_", "tramp_")) or name == "tramp.h":
            continue
        with open(path) as f:
            text = f.read()
        if any(re.search(r"\b%s\b" % a, text) for a in arch) or "__x86_64__" in text:
            offenders.append(name)
    assert offenders == []
