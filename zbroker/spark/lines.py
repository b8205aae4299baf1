"""Line framing for the Spark data sources over ZPIPES, with no dependency on Spark.

* :func:`frame_lines` packs values into buffers of whole lines, each at most one chunk long, so
  that every buffer goes to the broker as one chunk: chunks of different writers are never
  interleaved inside a chunk, so lines of several writers of one pipe never mix.
* :class:`LineSplitter` turns a byte stream back into lines.
* :func:`hold_pipe_open` keeps one idle writer attached to a pipe while a Spark job writes to
  it, so that its readers see one end-of-stream after the whole job instead of one whenever no
  partition's writer happens to be attached.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import zpipes

NEWLINE = b"\n"


def encode_value(value: str | bytes | bytearray | memoryview) -> bytes:
    """A row's value as bytes: strings as UTF-8, binary values as they are."""
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    raise TypeError(f"a zpipes sink writes str or bytes values, not {type(value).__name__}")


def frame_lines(values: Iterable[Any], chunk_size: int = zpipes.DEFAULT_CHUNK_SIZE,
                counts: dict[str, int] | None = None) -> Iterator[bytes]:
    """Buffers of whole lines (each value followed by a newline), each at most ``chunk_size``
    bytes unless a single line is longer. ``None`` values are skipped. ``counts`` (if given)
    gets ``lines``, ``bytes`` and ``nulls`` added up."""
    parts: list[bytes] = []
    size = 0
    lines = nbytes = nulls = 0
    for value in values:
        if value is None:
            nulls += 1
            continue
        line = encode_value(value) + NEWLINE
        if parts and size + len(line) > chunk_size:
            yield b"".join(parts)
            parts, size = [], 0
        parts.append(line)
        size += len(line)
        lines += 1
        nbytes += len(line)
    if parts:
        yield b"".join(parts)
    if counts is not None:
        counts["lines"] = counts.get("lines", 0) + lines
        counts["bytes"] = counts.get("bytes", 0) + nbytes
        counts["nulls"] = counts.get("nulls", 0) + nulls


def decode_line(line: bytes) -> str:
    """A line as text: its newline (``\\n`` or ``\\r\\n``) removed, UTF-8 decoded with invalid
    bytes replaced by U+FFFD."""
    if line.endswith(b"\n"):
        line = line[:-2] if line.endswith(b"\r\n") else line[:-1]
    return line.decode("utf-8", errors="replace")


class LineSplitter:
    """Splits a byte stream into lines; the newline stays on each line."""

    def __init__(self) -> None:
        self._partial = b""

    @property
    def partial(self) -> bytes:
        """Bytes of a line whose newline has not arrived yet."""
        return self._partial

    def feed(self, data: bytes) -> list[bytes]:
        """The lines that ``data`` completes."""
        if not data:
            return []
        pieces = data.split(NEWLINE)
        if len(pieces) == 1:
            self._partial += data
            return []
        pieces[0] = self._partial + pieces[0]
        self._partial = pieces.pop()
        return [piece + NEWLINE for piece in pieces]

    def finish(self) -> bytes | None:
        """At end of stream: the last line if it had no newline, else None."""
        tail, self._partial = self._partial, b""
        return tail or None


@contextmanager
def hold_pipe_open(pipe: str, broker: str = zpipes.DEFAULT_BROKER,
                   timeout: float | None = None, **opts: Any) -> Iterator[zpipes.PipeWriter]:
    """Keep an idle writer attached to ``pipe`` for the duration of the ``with`` block.

    A ZPIPES reader sees end-of-stream whenever no writer at all is attached. A Spark job
    writing with ``format("zpipes")`` attaches one writer per partition (per micro-batch for a
    streaming query), so a reader may see an end-of-stream between two partitions. While this
    writer is attached, it sees one end-of-stream only, after the block::

        with hold_pipe_open("results", broker="local"):
            df.write.format("zpipes").option("pipe", "results").mode("append").save()

    The held writer never writes, so it never waits for a reader; it is closed (and the readers
    get their end-of-stream) when the block ends, also on an exception.
    """
    writer = zpipes.open(pipe, "w", broker=broker, timeout=timeout, **opts)
    assert isinstance(writer, zpipes.PipeWriter)
    try:
        yield writer
    finally:
        writer.close()
