"""zbroker/heap.py: with it, glibc serves a large body from its heap (no fresh mapping, whose
pages the kernel zeroes first) and keeps what was freed for the next one. Each case runs in a
fresh interpreter: the thresholds are process-wide, and glibc adapts its own to what it saw."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

PROBE = """
import ctypes, sys
from zbroker import heap

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]

mallinfo2 = ctypes.CDLL(None).mallinfo2
mallinfo2.restype = MallInfo2
if sys.argv[1] == "keep":
    assert heap.keep_freed_memory()
before = mallinfo2().hblks
# 24 MiB: over glibc's own threshold (128 KiB at first, raised by each mapped block freed,
# up to 32 MiB), under the one keep_freed_memory sets (32 MiB)
body = bytes(24 << 20)
mapped = mallinfo2().hblks - before
del body
print(mapped, mallinfo2().fordblks)
"""


def probe(mode: str) -> tuple[int, int]:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True,
                         timeout=60, check=True).stdout.split()
    return int(out[0]), int(out[1])


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's heap only")
def test_a_large_body_comes_from_the_heap_and_its_memory_stays_for_the_next():
    mapped, _ = probe("default")
    assert mapped == 1  # glibc's default: a mapping of its own, given back when freed
    mapped, free = probe("keep")
    assert mapped == 0 and free >= 24 << 20  # from the heap, and kept when freed
