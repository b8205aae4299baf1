"""The C heap of a process that moves large messages: freed memory is kept for the next ones.

Every large message body is a malloc of its own (a 64 KiB frame is a bytes object of 64 KiB).
glibc gives the top of its heap back to the system as soon as 128 KiB of it is free, so with
messages arriving and being dropped all the time it keeps giving pages back and taking them
again: each new body then faults in fresh pages, which the kernel zeroes first, only for the
body to be written over them. :func:`keep_freed_memory` has glibc keep up to ``trim`` bytes
free at the top of its heap instead, and serve allocations below ``mmap`` bytes from the heap
(the most its own adaptive threshold reaches; setting one threshold turns that adaptation
off, so both are set). Where the C library is not glibc it does nothing.

What that keeps is bounded at the top of the heap only: memory freed below live blocks (a
flood of connections that each held a buffer, then went) stays resident until
:func:`give_back` returns its free pages to the system (glibc's ``malloc_trim``, which also
releases whole free pages inside the heap); the broker calls it every ``GIVE_BACK_INTERVAL``
seconds, keeping ``trim`` bytes at the top for the next messages (:func:`give_back_every`,
also in the standalone ``pzq``).
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable
from typing import Any

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
M_MMAP_THRESHOLD = -3
TRIM_THRESHOLD = 64 << 20
MMAP_THRESHOLD = 32 << 20


GIVE_BACK_INTERVAL = 10.0
#: at most this share of the time goes to giving back: a large heap with many free blocks
#: takes tens of milliseconds to walk (20-35 ms for 540 MB here), and the loop waits meanwhile
GIVE_BACK_SHARE = 0.001


def give_back(pad: int = TRIM_THRESHOLD) -> bool:
    """Return the heap's free pages to the system but ``pad`` bytes at its top; False where
    there is no ``malloc_trim`` (not glibc) or nothing was returned."""
    try:
        malloc_trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError, TypeError):
        return False
    malloc_trim.argtypes = (ctypes.c_size_t,)
    malloc_trim.restype = ctypes.c_int

    return bool(malloc_trim(pad))


def keep_freed_memory(trim: int = TRIM_THRESHOLD, mmap: int = MMAP_THRESHOLD) -> bool:
    """Set glibc's heap thresholds for this process; False where there are none to set."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError, TypeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_TRIM_THRESHOLD, trim)) and bool(mallopt(M_MMAP_THRESHOLD, mmap))


def give_back_every(loop: Any, interval: float = GIVE_BACK_INTERVAL,
                    share: float = GIVE_BACK_SHARE) -> Callable[[], None]:
    """Call :func:`give_back` on ``loop`` every ``interval`` seconds, or less often when it
    takes longer than ``share`` of the time; returns what stops it."""
    handle: list[Any] = [None]

    def run() -> None:
        started = time.perf_counter()
        give_back()
        took = time.perf_counter() - started
        handle[0] = loop.call_later(max(interval, took / share), run)

    handle[0] = loop.call_later(interval, run)
    return lambda: handle[0].cancel()
