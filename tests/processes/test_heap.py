"""The heap setting of the broker and the standalone pzq: with it, large bodies that come and
go reuse the memory freed before them instead of faulting in fresh pages for each one (glibc
only)."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

WORKLOAD = """
import ctypes, random, resource, sys
from zbroker.runtime import heap
# Huge pages would fault in 2 MiB at a time, and whether the kernel uses them depends on the
# machine's setting and how fragmented its memory is: counted in 4 KiB pages, the measure holds.
ctypes.CDLL(None, use_errno=True).prctl(41, 1, 0, 0, 0)  # PR_SET_THP_DISABLE
if sys.argv[1] == "on":
    assert heap.keep_freed_memory()
rnd = random.Random(1)
held = []  # a window of 64 KiB bodies and small frames, each dropped in its turn
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(40_000):
    held.append(b"x" * 65536)
    held.append(b"y" * rnd.randrange(100, 3000))
    if len(held) > 32:
        del held[rnd.randrange(len(held))]
        del held[0]
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def page_faults(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", WORKLOAD, mode], capture_output=True,
                         text=True, check=True, timeout=60)
    return int(out.stdout.split()[-1])


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="a glibc setting")
def test_freed_memory_is_kept_for_the_next_bodies():
    without, kept = page_faults("off"), page_faults("on")
    assert without > 2_000, without  # the heap's top given back and taken again
    assert kept * 4 < without, (kept, without)


def test_it_does_nothing_where_there_is_no_such_setting(monkeypatch):
    from zbroker.runtime import heap

    class NoLibc:
        def __init__(self, name):
            raise OSError("no C library here")

    monkeypatch.setattr(heap.ctypes, "CDLL", NoLibc)
    assert heap.keep_freed_memory() is False
