"""The cluster's core (zbroker/cluster/core/, and the modules of who is a member, gossip, the
numbers of service messages and the troubles it tells of) decides and returns what to do: it
imports without pyzmq, brings in no event loop, socket, thread or logging setup, names no clock
or OS call (the time is passed in), and imports nothing inside a function. The sockets, the
monitors and the clock are the libzmq layer's (zbroker/cluster/node.py)."""

from __future__ import annotations

import pkgutil

import pytest
from core_rules import imports_in_functions, io_brought_in, names_used

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
    assert io_brought_in(core, IO_MODULES) == [], core


@pytest.mark.parametrize("core", CORES)
def test_a_core_names_no_clock_or_os_call_and_imports_at_the_top_only(core):
    used = names_used(core)
    assert not used & IO_NAMES, f"{core} uses {sorted(used & IO_NAMES)}"
    assert imports_in_functions(core) == [], f"{core}: an import inside a function"
