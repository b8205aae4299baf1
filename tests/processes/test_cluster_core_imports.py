"""The cluster's core (zbroker/cluster/core/, and the modules of who is a member, gossip, the
numbers of service messages and the troubles it tells of) decides and returns what to do: it
imports without pyzmq, brings in no event loop, socket, thread or logging setup, names no clock
or OS call (the time is passed in), and imports nothing inside a function. The sockets, the
monitors and the clock are the libzmq layer's (zbroker/cluster/node.py)."""

from __future__ import annotations

import ast
import importlib.util
import pkgutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import zbroker.cluster.core

CORES = [*(f"zbroker.cluster.core.{m.name}"
           for m in pkgutil.iter_modules(zbroker.cluster.core.__path__)),
         *(f"zbroker.cluster.{m}" for m in ("membership", "gossip", "numbering", "troubles"))]
#: modules of loops, sockets, threads and logging, and the cluster's own I/O modules
IO_MODULES = ["zmq", "asyncio", "socket", "selectors", "threading", "logging", "structlog",
              "zeroconf", "zbroker.logs", "zbroker.runtime.zmq_reader",
              *(f"zbroker.cluster.{m}" for m in ("node", "handshake", "discovery", "security",
                                                 "tcp_table", "snapshot", "joining")),
              "zbroker.zmtp.libzmq_door"]
#: names a core's source must not use: the clock, the OS, files, randomness of its own kind
IO_NAMES = {"time", "os", "pathlib", "Path", "open", "io", "tempfile", "datetime", "uuid"}


def test_the_cores_are_found():
    assert "zbroker.cluster.core.node" in CORES and len(CORES) >= 9


@pytest.mark.parametrize("core", CORES)
def test_a_core_imports_without_pyzmq_and_brings_in_no_io(core):
    code = f"""
        import sys
        sys.modules['zmq'] = None  # any import of zmq raises ImportError
        before = set(sys.modules)
        import {core}
        print(sorted(m for m in {IO_MODULES!r} if m in set(sys.modules) - before))
    """
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "[]\n", f"{core} brings in {done.stdout.strip()}"


@pytest.mark.parametrize("core", CORES)
def test_a_core_names_no_clock_or_os_call_and_imports_at_the_top_only(core):
    tree = ast.parse(Path(importlib.util.find_spec(core).origin).read_text())
    used = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            used.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            used.add(node.module.split(".")[0])
            used.update(a.name for a in node.names)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            used.add(node.id)
    assert not used & IO_NAMES, f"{core} uses {sorted(used & IO_NAMES)}"
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            hidden = [n for n in ast.walk(node) if isinstance(n, (ast.Import, ast.ImportFrom))]
            assert not hidden, f"{core}: an import inside {node.name}()"
