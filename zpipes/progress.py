"""A ``pv``-like progress line on standard error, for ``zpipes read|write --progress`` and
``zbroker queue put --progress``.

    if wanted(args.progress):                 # --progress, or ZPIPES_PROGRESS=1
        meter = Progress(total=size)          # total: None if unknown
        meter.add(n)                          # after each piece moved
        meter.finish()                        # the last line

On a terminal the line is redrawn in place (at most a few times a second) and left on screen
at the end; anywhere else (a file, a pipe, a log) only one summary line is written at the end,
so that nothing fills a log with carriage returns. It never writes to standard output.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time

TYPE_CHECKING = False  # (typing is not imported at run time: see zpipes/__init__.py)
if TYPE_CHECKING:
    from typing import TextIO

ENV = "ZPIPES_PROGRESS"  # "1" (or yes, true, on): show progress without --progress
REDRAW_INTERVAL = 0.2  # seconds between redraws on a terminal


def wanted(flag: bool) -> bool:
    """--progress given, or the environment asks for it."""
    return flag or os.environ.get(ENV, "").strip().lower() in ("1", "yes", "true", "on")


def human_bytes(n: float) -> str:
    """1023 B, 1.0 KiB, 12.3 MiB, ..."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def clock(seconds: float) -> str:
    """0:00:07, 1:02:03."""
    seconds = int(max(0.0, seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


class Progress:
    """Bytes (and, with ``unit``, items such as messages) moved, rate, elapsed time, and with
    a known ``total`` (in bytes, or in items when ``unit`` is given) the percentage and the
    time left."""

    def __init__(self, stream: TextIO | None = None, total: int | None = None,
                 label: str = "", unit: str | None = None, live: bool | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.total = total if total is not None and total >= 0 else None
        self.label = label
        self.unit = unit
        if live is None:
            try:
                live = self.stream.isatty()
            except (AttributeError, ValueError, OSError):
                live = False
        self.live = live
        self.bytes = 0
        self.items = 0
        self.started = time.monotonic()
        self._drawn = 0.0
        self._width = 0
        self._finished = False

    def add(self, nbytes: int, items: int = 0) -> None:
        self.bytes += nbytes
        self.items += items
        if self.live:
            now = time.monotonic()
            if now - self._drawn >= REDRAW_INTERVAL:
                self._drawn = now
                self._draw(self.line(now))

    def line(self, now: float | None = None) -> str:
        elapsed = max((now if now is not None else time.monotonic()) - self.started, 1e-9)
        parts = []
        if self.unit:
            parts.append(f"{self.items} {self.unit}")
        parts.append(human_bytes(self.bytes))
        parts.append(f"{human_bytes(self.bytes / elapsed)}/s")
        parts.append(clock(elapsed))
        if self.total is not None:
            done = self.items if self.unit else self.bytes
            fraction = min(done / self.total, 1.0) if self.total else 1.0
            parts.append(f"{fraction * 100:3.0f}%")
            if 0 < fraction < 1:
                parts.append(f"ETA {clock(elapsed * (1 - fraction) / fraction)}")
        return (f"{self.label} " if self.label else "") + "  ".join(parts)

    def finish(self) -> None:
        """Write the last line (once): redrawn in place on a terminal, else a summary."""
        if self._finished:
            return
        self._finished = True
        text = self.line()
        if self.live:
            self._draw(text, end="\n")
        else:
            self._write(text + "\n")

    def _draw(self, text: str, end: str = "") -> None:
        pad = " " * max(0, self._width - len(text))
        self._width = len(text)
        self._write(f"\r{text}{pad}{end}")

    def _write(self, text: str) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.stream.write(text)
            self.stream.flush()
