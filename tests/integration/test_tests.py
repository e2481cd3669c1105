# SPDX-License-Identifier: MIT
"""The test suite's own rules (tests/README.md).

- No test module imports another: what several files share lives in
  support/ (plain helpers) or conftest.py (fixtures). A test module
  imported by another has its fixtures and constants pulled into a second
  namespace, and a change to one file's helpers breaks another file's
  tests.
- support/ stays below the tests: its modules import neither a test module
  nor conftest.py, so conftest and the tests import support/, never the
  other way round.
- tests/README.md's tables of where each behaviour is tested have a row
  for every test file (integration/test_*.py, unit/test_*.c), and name no
  file that does not exist.
"""
import ast
import glob
import os
import re

from support.util import ROOT

HERE = os.path.join(ROOT, "tests", "integration")
README = os.path.join(ROOT, "tests", "README.md")


def imports(path):
    """(line, top-level module) for every absolute import statement in path."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module.split(".")[0]


def offenders(paths, forbidden):
    return ["%s:%d imports %s" % (os.path.relpath(p, HERE), line, mod)
            for p in paths for line, mod in imports(p) if forbidden(mod)]


def suite_files():
    """The integration test modules."""
    return sorted(glob.glob(os.path.join(HERE, "test_*.py")))


def test_no_test_module_imports_another():
    files = suite_files()
    assert len(files) > 20, files  # the glob found the suite
    assert offenders(files + [os.path.join(HERE, "conftest.py")],
                     lambda mod: mod.startswith("test_")) == []


def test_support_imports_no_test_module_and_no_conftest():
    files = sorted(glob.glob(os.path.join(HERE, "support", "*.py")))
    assert len(files) > 5, files
    assert offenders(files, lambda mod: mod.startswith("test_") or mod == "conftest") == []


def test_readme_has_a_row_for_every_test_file():
    with open(README) as f:
        text = f.read()
    rows = set(re.findall(r"^\| *`?(test_\w+\.(?:py|c))`? *\|", text, re.M))
    files = {os.path.basename(p) for p in suite_files() +
             glob.glob(os.path.join(ROOT, "tests", "unit", "test_*.c"))}
    assert sorted(files - rows) == [], "test files without a row in tests/README.md"
    assert sorted(rows - files) == [], "rows in tests/README.md naming no test file"
