"""Buffers for one gathered write (writev): large ones as they are, runs of small ones joined."""

from __future__ import annotations

from collections.abc import Sequence


def gather(parts: Sequence[bytes], large: int) -> tuple[list[bytes], int]:
    """The buffers to write ``parts`` in order: parts of at least ``large`` bytes as they are
    (no copy), each run of smaller ones joined into one (few iovecs). Returns them and the
    total size."""
    if max(map(len, parts), default=0) < large:  # small parts only: one buffer
        joined = b"".join(parts)
        return ([joined] if parts else []), len(joined)
    out: list[bytes] = []
    run: list[bytes] = []
    size = 0
    for p in parts:
        n = len(p)
        size += n
        if n >= large:
            if run:
                out.append(b"".join(run))
                run = []
            out.append(p)
        else:
            run.append(p)
    if run:
        out.append(b"".join(run))
    return out, size
