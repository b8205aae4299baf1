"""``format("zpipes")``: line-oriented text through a ZPIPES named pipe, for PySpark 4.

Registered by :func:`zbroker.spark.register`. Options (all strings, as Spark passes them):

``pipe``
    the pipe's name (required).
``broker``
    the broker's name (default ``local``); ``endpoint`` overrides its ZeroMQ endpoint.
``timeout``
    seconds (default: wait for ever). Sink: bounds opening the pipe and each write (a write
    waits while no reader is attached, or while the readers are slow). Batch source: bounds
    opening and the wait for each piece of data; a timeout fails the read, it never ends it
    quietly. Stream source: bounds opening the pipe.
``max_lines_per_batch``
    stream source: the most lines in one micro-batch (default 10000).
``poll_seconds``
    stream source: how long planning a micro-batch waits for the first line when none is
    waiting (default 0.1).

Sink (batch ``df.write`` and streaming ``df.writeStream``): the DataFrame needs a ``value``
column of type string or binary. Each partition's task opens its own writer of the pipe (only
when it has a row), writes each non-null value followed by ``\\n``, and closes; the task ends
once the broker has taken every line (``CLOSE_OK``). Lines go in buffers of whole lines of at
most one chunk (1 MiB) each, and ZPIPES never interleaves the chunks of different writers
inside a chunk, so a reader gets every line whole, each partition's lines in their order, and
the partitions' lines interleaved (by buffers) when they write at the same time. A value longer
than a chunk, or one containing ``\\n``, is the exception: the first may be split by another
writer's chunk, the second reads back as several lines.

A pipe is not transactional: ``commit`` has nothing left to do but count, and ``abort`` cannot
take back lines that a task which ran before the failure already delivered (a retried task sends
its lines again). A reader sees end-of-stream whenever no writer at all is attached, which may
happen between two partitions and happens between two micro-batches; keep reading after it
(the client library allows it: after ``b""`` the next read waits for the next writer), or hold
the pipe open for the job's duration with :func:`zbroker.spark.lines.hold_pipe_open`.

Batch source (``spark.read``): one partition; its task opens the pipe for reading and reads until
end-of-stream (all writers closed). Rows: ``value`` (string), one per line, newline removed,
UTF-8 (invalid bytes replaced). If the task is retried, what the first attempt read is gone.

Stream source (``spark.readStream``): one reader of the pipe, opened when the query plans its
first micro-batch and held open for the whole run of the query by the driver-side process that
plans the micro-batches (a writer's stream already under way then, for other readers, is not
seen); each micro-batch takes the lines that have arrived (at most ``max_lines_per_batch``).
It follows the pipe across writers: an end-of-stream only means that no writer is attached now.
Guarantees: within one run of the query, each line read from the pipe is put in exactly one
micro-batch. A pipe is not replayable, so across a restart of the query (or of the driver) it is
**at most once**: the lines of a micro-batch that was planned but not committed when the query
stopped, and those the reader had received but not yet put in a batch, are lost (a warning is
logged). For at-least-once, buffer the data durably before Spark reads it (a pzq queue, or
files).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
    SimpleDataSourceStreamReader,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

import zpipes
from zbroker.spark.columns import value_column
from zbroker.spark.lines import LineSplitter, decode_line, frame_lines

try:  # PySpark 4.1+: a streaming sink can get record batches too
    from pyspark.sql.datasource import DataSourceStreamArrowWriter as _StreamWriterBase

    _STREAM_ARROW = True
except ImportError:  # PySpark 4.0: rows
    _StreamWriterBase = DataSourceStreamWriter  # type: ignore[misc, assignment]
    _STREAM_ARROW = False

log = logging.getLogger("zbroker.spark.zpipes")

FORMAT = "zpipes"
SCHEMA = "value string"
DEFAULT_MAX_LINES_PER_BATCH = 10_000
DEFAULT_POLL_SECONDS = 0.1


# --- options ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class PipeOptions:
    pipe: str
    broker: str = zpipes.DEFAULT_BROKER
    endpoint: str | None = None
    timeout: float | None = None
    max_lines_per_batch: int = DEFAULT_MAX_LINES_PER_BATCH
    poll_seconds: float = DEFAULT_POLL_SECONDS

    @classmethod
    def parse(cls, options: Any) -> PipeOptions:
        """From a data source's (case-insensitive) options; raises ValueError."""

        def get(key: str) -> str | None:
            value = options.get(key)
            return None if value is None or value == "" else str(value)

        pipe = get("pipe")
        if pipe is None:
            raise ValueError('format("zpipes") needs the option "pipe" (the pipe\'s name)')
        zpipes.client.check_pipe_name(pipe)
        timeout = _number(get("timeout"), "timeout", float, allow_none=True)
        max_lines = _number(get("max_lines_per_batch"), "max_lines_per_batch", int,
                            default=DEFAULT_MAX_LINES_PER_BATCH)
        poll = _number(get("poll_seconds"), "poll_seconds", float, default=DEFAULT_POLL_SECONDS)
        if max_lines is None or max_lines < 1:
            raise ValueError(f"max_lines_per_batch must be at least 1, not {max_lines}")
        return cls(pipe=pipe, broker=get("broker") or zpipes.DEFAULT_BROKER,
                   endpoint=get("endpoint"), timeout=timeout, max_lines_per_batch=max_lines,
                   poll_seconds=poll if poll is not None else DEFAULT_POLL_SECONDS)

    def open(self, mode: str, timeout: float | None = None) -> Any:
        extra = {"endpoint": self.endpoint} if self.endpoint else {}
        return zpipes.open(self.pipe, mode, broker=self.broker,
                           timeout=self.timeout if timeout is None else timeout, **extra)


def _number(text: str | None, key: str, kind: type, default: Any = None,
            allow_none: bool = False) -> Any:
    if text is None or (allow_none and text.lower() in ("none", "inf", "forever")):
        return default
    try:
        value = kind(text)
    except ValueError:
        raise ValueError(f"option {key!r} must be a number, not {text!r}") from None
    if value < 0:
        raise ValueError(f"option {key!r} must not be negative, not {text!r}")
    return value


# --- the data source -------------------------------------------------------------------------


class ZpipesDataSource(DataSource):
    """Line-oriented text through a ZPIPES named pipe: see the module's documentation."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return ZpipesBatchReader(PipeOptions.parse(self.options))

    def simpleStreamReader(self, schema: StructType) -> SimpleDataSourceStreamReader:
        return ZpipesStreamReader(PipeOptions.parse(self.options))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return ZpipesBatchWriter(PipeOptions.parse(self.options), value_column(schema, FORMAT))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return ZpipesStreamWriter(PipeOptions.parse(self.options), value_column(schema, FORMAT))


# --- sinks -----------------------------------------------------------------------------------


@dataclass
class ZpipesCommitMessage(WriterCommitMessage):
    """What one task wrote: lines (each value + newline), bytes, null values skipped."""

    lines: int = 0
    bytes: int = 0
    nulls: int = 0


def row_values(rows: Iterator[Any], column: int) -> Iterator[Any]:
    """The values of one column of Spark rows."""
    for row in rows:
        yield row[column]


def arrow_values(batches: Iterator[Any], column: int) -> Iterator[Any]:
    """The values of one column of pyarrow record batches (much cheaper than rows)."""
    for batch in batches:
        yield from batch.column(column).to_pylist()


def write_partition(options: PipeOptions, values: Iterator[Any]) -> ZpipesCommitMessage:
    """Write one partition's values to the pipe as lines, through a writer of its own that is
    opened with the first value (an empty partition opens nothing) and closed once the broker
    has taken every line. On an error the writer is aborted and the error raised."""
    counts: dict[str, int] = {}
    writer = None
    try:
        for buffer in frame_lines(values, zpipes.DEFAULT_CHUNK_SIZE, counts):
            if writer is None:
                writer = options.open("wb")
            writer.write(buffer)
        if writer is not None:
            writer.close()
    except BaseException:
        if writer is not None:
            writer.abort()
        raise
    return ZpipesCommitMessage(counts.get("lines", 0), counts.get("bytes", 0),
                               counts.get("nulls", 0))


def _totals(messages: list[Any]) -> tuple[int, int, int]:
    done = [m for m in messages if isinstance(m, ZpipesCommitMessage)]
    return sum(m.lines for m in done), sum(m.bytes for m in done), len(messages) - len(done)


class ZpipesBatchWriter(DataSourceArrowWriter):
    """Gets each partition as pyarrow record batches."""

    def __init__(self, options: PipeOptions, column: int) -> None:
        self.options = options
        self.column = column

    def write(self, iterator: Iterator[Any]) -> ZpipesCommitMessage:
        return write_partition(self.options, arrow_values(iterator, self.column))

    def commit(self, messages: list[Any]) -> None:
        lines, nbytes, _ = _totals(messages)
        log.info("zpipes sink: %d lines (%d bytes) written to pipe %r", lines, nbytes,
                 self.options.pipe)

    def abort(self, messages: list[Any]) -> None:
        lines, _, failed = _totals(messages)
        log.warning("zpipes sink: job failed (%d task(s) failed); %d lines of the tasks that "
                    "succeeded were delivered to pipe %r and cannot be taken back",
                    failed, lines, self.options.pipe)


class ZpipesStreamWriter(_StreamWriterBase):  # type: ignore[misc, valid-type]
    """Gets each partition of a micro-batch as pyarrow record batches where Spark can (4.1+),
    else as rows."""

    def __init__(self, options: PipeOptions, column: int) -> None:
        self.options = options
        self.column = column

    def write(self, iterator: Iterator[Any]) -> ZpipesCommitMessage:
        if _STREAM_ARROW:
            return write_partition(self.options, arrow_values(iterator, self.column))
        return write_partition(self.options, row_values(iterator, self.column))

    def commit(self, messages: list[Any], batchId: int) -> None:  # noqa: N803 - Spark's name
        lines, nbytes, _ = _totals(messages)
        log.debug("zpipes sink: batch %d: %d lines (%d bytes) to pipe %r", batchId, lines,
                  nbytes, self.options.pipe)

    def abort(self, messages: list[Any], batchId: int) -> None:  # noqa: N803
        lines, _, failed = _totals(messages)
        log.warning("zpipes sink: batch %d failed (%d task(s) failed); %d lines already "
                    "delivered to pipe %r cannot be taken back", batchId, failed, lines,
                    self.options.pipe)


# --- batch source ----------------------------------------------------------------------------


class ZpipesBatchReader(DataSourceReader):
    def __init__(self, options: PipeOptions) -> None:
        self.options = options

    def partitions(self) -> list[InputPartition]:
        return [InputPartition(0)]  # one pipe, one stream: one reader

    def read(self, partition: InputPartition) -> Iterator[tuple[str]]:
        splitter = LineSplitter()
        with self.options.open("rb") as pipe:
            while True:
                data = pipe.read1()
                if not data:
                    break
                for line in splitter.feed(data):
                    yield (decode_line(line),)
        tail = splitter.finish()
        if tail is not None:
            yield (decode_line(tail),)


# --- stream source ---------------------------------------------------------------------------


class ZpipesStreamReader(SimpleDataSourceStreamReader):
    """Runs in the long-lived driver-side process that plans the query's micro-batches; the
    pipe is opened there on the first ``read``. Offsets: ``{"run": id, "line": n}``, the lines
    this run of the query has put in micro-batches (``run`` is new at every start)."""

    def __init__(self, options: PipeOptions) -> None:
        self.options = options
        self.run = uuid.uuid4().hex[:16]
        self.lines = 0  # lines of this run put in micro-batches
        self._pipe: Any = None
        self._splitter = LineSplitter()
        self._pending: deque[bytes] = deque()  # complete lines read and not yet in a batch

    def _offset(self) -> dict[str, Any]:
        return {"run": self.run, "line": self.lines}

    def initialOffset(self) -> dict[str, Any]:
        return {"run": self.run, "line": 0}

    def read(self, start: dict[str, Any]) -> tuple[Iterator[tuple[str]], dict[str, Any]]:
        if start.get("run") == self.run and start.get("line") != self.lines:
            raise RuntimeError(f"zpipes source: asked for lines from {start}, at {self.lines}")
        self._fill()
        count = min(len(self._pending), self.options.max_lines_per_batch)
        if count == 0:
            return iter(()), start
        rows = [(decode_line(self._pending.popleft()),) for _ in range(count)]
        self.lines += count
        return iter(rows), self._offset()

    def _fill(self) -> None:
        """Take what has arrived; wait up to ``poll_seconds`` for something if nothing has."""
        if self._pipe is None:
            self._pipe = self.options.open("rb")
        pipe, pending, splitter = self._pipe, self._pending, self._splitter
        deadline = time.monotonic() + self.options.poll_seconds
        while len(pending) < self.options.max_lines_per_batch:
            pipe.timeout = 0 if pending else max(0.0, deadline - time.monotonic())
            try:
                data = pipe.read1()
            except zpipes.PipeTimeout:
                return
            if data:
                pending.extend(splitter.feed(data))
                continue
            # End-of-stream: no writer is attached now. The last line may lack its newline;
            # the next writer starts a new stream, which the same reader receives.
            tail = splitter.finish()
            if tail is not None:
                pending.append(tail)
            if not pending:
                time.sleep(max(0.0, deadline - time.monotonic()))  # no busy polling
            return

    def readBetweenOffsets(self, start: dict[str, Any],
                           end: dict[str, Any]) -> Iterator[tuple[str]]:
        # Called (on an executor) only when a micro-batch is replayed without the lines the
        # planning process prefetched: after a restart of the query. The pipe cannot replay.
        if start != end:
            lost = _lines_between(start, end)
            log.warning("zpipes source: micro-batch %s..%s of pipe %r cannot be replayed "
                        "after a restart; %s lines are lost (a pipe is at-most-once across "
                        "restarts)", start, end, self.options.pipe,
                        lost if lost is not None else "its")
        return iter(())

    def commit(self, end: dict[str, Any]) -> None:
        pass  # the lines were taken from the pipe when read: nothing is held for them

    def stop(self) -> None:
        pipe, self._pipe = self._pipe, None
        if pipe is not None:
            pipe.close()


def _lines_between(start: dict[str, Any], end: dict[str, Any]) -> int | None:
    if start.get("run") == end.get("run"):
        return int(end.get("line", 0)) - int(start.get("line", 0))
    if end.get("run") is not None:
        return int(end.get("line", 0))  # a batch that starts a run starts at its line 0
    return None
