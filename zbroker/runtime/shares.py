"""Bytes counted by who holds them (a source: a uid on ipc, a host on tcp), for the shares
of a budget that no one source may pass."""

from __future__ import annotations

from collections.abc import Hashable


def count(held: dict[Hashable, int], source: Hashable, change: int) -> None:
    """Add ``change`` to ``source``'s bytes in ``held``; a source that holds none is not
    kept (the table stays as small as the sources that hold something)."""
    left = held.get(source, 0) + change
    if left:
        held[source] = left
    else:
        held.pop(source, None)
