"""What the tests of a package of cores check, once (the cluster's, pzq's): a core imports
without pyzmq and brings in none of the modules of I/O it is given, and its source names none
of the names of I/O it is given, nor imports inside a function."""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
import textwrap
from collections.abc import Iterable
from pathlib import Path


def io_brought_in(core: str, io_modules: Iterable[str]) -> list[str]:
    """The modules of ``io_modules`` that importing ``core`` (in a fresh interpreter where
    pyzmq cannot be imported) brings in."""
    code = f"""
        import sys
        sys.modules['zmq'] = None  # any import of zmq raises ImportError
        before = set(sys.modules)
        import {core}
        print(sorted(m for m in {list(io_modules)!r} if m in set(sys.modules) - before))
    """
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    found: list[str] = ast.literal_eval(done.stdout)
    return found


def names_used(core: str) -> set[str]:
    """The names ``core``'s source loads, and the modules and names it imports."""
    tree = ast.parse(Path(importlib.util.find_spec(core).origin).read_text())
    used: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            used.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            used.add(node.module.split(".")[0])
            used.update(a.name for a in node.names)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            used.add(node.id)
    return used


def imports_in_functions(core: str) -> list[str]:
    """The functions of ``core`` that import something inside them."""
    tree = ast.parse(Path(importlib.util.find_spec(core).origin).read_text())
    return [node.name for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and any(isinstance(n, (ast.Import, ast.ImportFrom)) for n in ast.walk(node))]
