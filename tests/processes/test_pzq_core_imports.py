"""The pzq cores (wire, records, dispatcher, queue, stream, replication, ...) and the ZMTP codec
decide and return what to do; they do no I/O. Each imports without pyzmq, brings in no threads,
event loop, sockets or file locks, and names no file or OS call: the I/O is the server's and the
store's. Like the cluster's cores, they import nothing inside a function (an
import hidden there would escape these checks)."""

from __future__ import annotations

import pkgutil

import pytest
from core_rules import imports_in_functions, io_brought_in, names_used

import zbroker.services.pzq.core

#: every module of the package zbroker.services.pzq.core (what is a core is said by where it
#: lives), and the ZMTP codec
CORES = [*(f"zbroker.services.pzq.core.{m.name}"
           for m in pkgutil.iter_modules(zbroker.services.pzq.core.__path__)),
         "zbroker.zmtp.codec"]
#: modules of threads, loops, sockets, files, and pzq's own I/O modules
IO_MODULES = ["zmq", "threading", "asyncio", "socket", "selectors", "fcntl", "shutil",
              "zbroker.runtime.zmq_reader", *(f"zbroker.services.pzq.{m}" for m in (
                  "store", "receiver", "endpoints", "sockets", "server", "consumers",
                  "queue_logs", "offsets_file", "replica_files", "stream_endpoint", "monitor",
                  "commands")),
              "zbroker.zmtp.server"]
#: names a core's source must not use: the OS and the file system
IO_NAMES = {"os", "pathlib", "Path", "open", "io", "tempfile", "time"}


def test_the_cores_are_found():
    assert len(CORES) >= 13 and "zbroker.services.pzq.core.queue" in CORES


@pytest.mark.parametrize("core", CORES)
def test_a_core_imports_without_pyzmq_and_brings_in_no_io(core):
    assert io_brought_in(core, IO_MODULES) == [], core


@pytest.mark.parametrize("core", CORES)
def test_a_core_names_no_file_or_os_call_and_imports_at_the_top_only(core):
    used = names_used(core)
    assert not used & IO_NAMES, f"{core} uses {sorted(used & IO_NAMES)}"
    assert imports_in_functions(core) == [], f"{core}: an import inside a function"
