"""``format("pzq")``: pzq persistent queues, for PySpark 4.

Registered by :func:`zbroker.spark.register`. Options (all strings, as Spark passes them):

``stream_endpoint``
    source: the stream endpoint of a stream queue (``mode: stream``; required).
``receive_endpoint``
    sink: the receive endpoint of a queue (push or stream mode; required).
``queue``
    source: the value of the ``queue`` column (default: the stream endpoint).
``group``
    source: the reader group whose committed offset the source reads from and commits (1-255
    characters of a-z A-Z 0-9 . _ -; made by its first request at the oldest message the queue
    holds). Default: none, the queue's ``default`` group (that of readers that name none).
``max_messages_per_batch``
    stream source: the most offsets one micro-batch spans (default 10000). Offsets may have
    gaps, so a micro-batch may hold fewer messages.
``partitions``
    source: how many Spark partitions (tasks) one offset range is split into (default 1).
``timeout``
    seconds (default 10). Source: the wait for each answer of the queue (a request is sent
    three times before it fails). Sink: the wait for the queue's ACKs of a task's messages.
``window``
    sink: how many messages a task may have sent and not yet ACKed (default 1024).
``batch``
    sink: messages sent in one batch (default 256; 0: one at a time, the original pzq wire).

Stream source (``spark.readStream``): rows ``offset`` (long), ``key`` (binary), ``body``
(binary: the message's frames joined), ``sent`` (timestamp: when the queue received it),
``queue`` (string). Offsets are ``{"offset": n}``. The query starts at the queue's committed
offset; each micro-batch spans ``[start, min(head, start + max_messages_per_batch))``; its
tasks read that range on the executors with RANGE requests, which are repeatable; once Spark
has committed the micro-batch to its checkpoint, the source sends ``COMMIT end`` and the queue
drops the messages below ``end``; Spark does that when it plans the next micro-batch (or at the
next start of the query), so the last micro-batch of a run (e.g. ``Trigger.AvailableNow``) stays
on the queue until the query runs again. So delivery is **at least
once**: a micro-batch that was planned but not committed when the query (or the driver, or the
queue) stopped is read again, whole and with the same offsets, after a restart from the
checkpoint. With an idempotent sink (Spark's file sink writes each batch id once) the output is
**exactly once** end to end. ``Trigger.AvailableNow`` reads up to the head seen when the query
starts. Every request of the source (planning in the driver, reading on the executors) names
its ``group``: each query with its own group sees every message and commits only its own
offset; queries (or other readers) that share a group share its committed offset. When the
queue's retention limits dropped messages before the group committed them, the answers say
which offsets, and the source logs a warning naming them (the query goes on after them).

Batch source (``spark.read``): the same rows, for the offsets ``[committed, head)`` of its
group at the time of planning; it commits nothing (a new group is made, though).

Sink (batch ``df.write`` and streaming ``df.writeStream``): the DataFrame needs a ``value``
column of type binary or string (UTF-8). Each partition's task produces its non-null values, one
message each, and succeeds only once the queue has ACKed every one of them (stored durably, as
the queue's ``sync`` says); a refused message or a missing ACK fails the task, and Spark runs it
again. Delivery is **at least once**: a task retried after some of its messages were ACKed, or a
micro-batch run again after a restart, produces those messages again (duplicates).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import zmq
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from pzq import wire
from pzq.client import Producer, StreamConsumer
from zbroker.spark.columns import value_column

try:  # PySpark 4.2+: admission control and Trigger.AvailableNow for Python sources
    from pyspark.sql.streaming.datasource import ReadMaxRows, SupportsTriggerAvailableNow
except ImportError:  # PySpark 4.0/4.1
    ReadMaxRows = None  # type: ignore[assignment, misc]
    SupportsTriggerAvailableNow = object  # type: ignore[assignment, misc]

log = logging.getLogger("zbroker.spark.pzq")

FORMAT = "pzq"
SCHEMA = "offset long, key binary, body binary, sent timestamp, queue string"
DEFAULT_MAX_MESSAGES_PER_BATCH = 10_000
DEFAULT_TIMEOUT = 10.0
DEFAULT_WINDOW = 1024
DEFAULT_BATCH = 256  # messages in one batch (the batch path); 0: the original wire
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


# --- options ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class PzqOptions:
    stream_endpoint: str | None = None
    receive_endpoint: str | None = None
    queue: str | None = None
    group: str | None = None  # None: the queue's default group
    max_messages_per_batch: int = DEFAULT_MAX_MESSAGES_PER_BATCH
    partitions: int = 1
    timeout: float = DEFAULT_TIMEOUT
    window: int = DEFAULT_WINDOW
    batch: int = DEFAULT_BATCH

    @classmethod
    def parse(cls, options: Any) -> PzqOptions:
        """From a data source's (case-insensitive) options; raises ValueError."""

        def get(key: str) -> str | None:
            value = options.get(key)
            return None if value is None or value == "" else str(value)

        return cls(
            stream_endpoint=get("stream_endpoint"),
            receive_endpoint=get("receive_endpoint"),
            queue=get("queue"),
            group=_group(options.get("group")),
            max_messages_per_batch=_number(get("max_messages_per_batch"),
                                           "max_messages_per_batch", int,
                                           DEFAULT_MAX_MESSAGES_PER_BATCH, minimum=1),
            partitions=_number(get("partitions"), "partitions", int, 1, minimum=1),
            timeout=_number(get("timeout"), "timeout", float, DEFAULT_TIMEOUT, minimum=0.001),
            window=_number(get("window"), "window", int, DEFAULT_WINDOW, minimum=1),
            batch=_number(get("batch"), "batch", int, DEFAULT_BATCH, minimum=0),
        )

    def source_endpoint(self) -> str:
        if self.stream_endpoint is None:
            raise ValueError('reading format("pzq") needs the option "stream_endpoint" (the '
                             "stream endpoint of a stream queue)")
        return self.stream_endpoint

    def sink_endpoint(self) -> str:
        if self.receive_endpoint is None:
            raise ValueError('writing format("pzq") needs the option "receive_endpoint" (the '
                             "receive endpoint of a queue)")
        return self.receive_endpoint

    def consumer(self) -> StreamConsumer:
        # A request is idempotent: sent again after ``timeout``, twice, then TimeoutError.
        return StreamConsumer(self.source_endpoint(), timeout=self.timeout, retries=2,
                              group=self.group)

    def group_name(self) -> str:
        """The group, as the logs name it."""
        return repr(self.group or wire.DEFAULT_GROUP)


def _group(value: Any) -> str | None:
    if value is None:
        return None
    text = str(value)
    why = wire.group_name_error(text.encode())
    if why is not None:
        shown = repr(text if len(text) <= 40 else text[:40] + "...")
        raise ValueError(f"option 'group' must be 1 to {wire.MAX_GROUP} characters of "
                         f"a-z A-Z 0-9 . _ -, not {shown}")
    return text


def _number(text: str | None, key: str, kind: type, default: Any, minimum: Any) -> Any:
    if text is None:
        return default
    try:
        value = kind(text)
    except ValueError:
        raise ValueError(f"option {key!r} must be a number, not {text!r}") from None
    if value < minimum:
        raise ValueError(f"option {key!r} must be at least {minimum}, not {text!r}")
    return value


# --- the data source -------------------------------------------------------------------------


class PzqDataSource(DataSource):
    """pzq queues: see the module's documentation."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return PzqBatchReader(PzqOptions.parse(self.options))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return PzqStreamReader(PzqOptions.parse(self.options))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return PzqBatchWriter(PzqOptions.parse(self.options), value_column(schema, FORMAT))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return PzqStreamWriter(PzqOptions.parse(self.options), value_column(schema, FORMAT))


# --- sources ---------------------------------------------------------------------------------


@dataclass
class PzqRange(InputPartition):
    """The offsets [start, end) of a queue, read by one task."""

    start: int
    end: int


def split_range(start: int, end: int, parts: int) -> list[PzqRange]:
    """[start, end) in at most ``parts`` contiguous, non-empty pieces (none if empty)."""
    if end <= start:
        return []
    parts = min(parts, end - start)
    step, extra = divmod(end - start, parts)
    pieces, at = [], start
    for i in range(parts):
        size = step + (1 if i < extra else 0)
        pieces.append(PzqRange(at, at + size))
        at += size
    return pieces


def _sent(sent_us: int) -> datetime:
    return _EPOCH + timedelta(microseconds=sent_us)


def read_range(options: PzqOptions, partition: PzqRange
               ) -> Iterator[tuple[int, bytes, bytes, datetime, str]]:
    """The rows of the messages with offsets in the partition's range (runs on an executor;
    repeatable until the range is committed)."""
    queue = options.queue or options.source_endpoint()
    with options.consumer() as consumer:
        start = partition.start
        checked = False
        while start < partition.end:
            r = consumer.range(start, partition.end)
            if not checked:  # is the start of the range still there (not committed, not lost)?
                checked = True
                _check_not_committed(options, partition, r.committed, r.lost)
            for m in r.messages:
                yield (m.offset, m.key, m.body, _sent(m.sent_us), queue)
            if r.next <= start:
                return  # at the head
            start = r.next


def _check_not_committed(options: PzqOptions, partition: PzqRange, committed: int,
                         lost: tuple[int, int] | None) -> None:
    """Warn when the group's committed offset is past the start of a range Spark reads: those
    messages are gone. Retention took them (the queue says which: ``lost``), or the group
    committed them (a checkpoint older than the group's commit, or a second query sharing
    the group)."""
    if committed <= partition.start:
        return
    if lost is not None and lost[0] < partition.end and lost[1] > partition.start:
        log.warning("pzq source: group %s lost offsets %d..%d (of the range %d..%d read now): "
                    "the queue's retention limits dropped them before the group committed "
                    "them", options.group_name(), max(lost[0], partition.start),
                    min(lost[1], partition.end) - 1, partition.start, partition.end - 1)
        return
    log.warning("pzq source: offsets %d..%d were already committed by group %s on the queue "
                "(its committed offset is %d); they are not read again", partition.start,
                min(committed, partition.end) - 1, options.group_name(), committed)


def _log_lost(options: PzqOptions, lost: tuple[int, int] | None) -> None:
    if lost is not None:
        log.warning("pzq source: group %s lost offsets %d..%d: the queue's retention limits "
                    "dropped them before the group committed them; the query goes on after "
                    "them", options.group_name(), lost[0], lost[1] - 1)


class PzqBatchReader(DataSourceReader):
    def __init__(self, options: PzqOptions) -> None:
        self.options = options

    def partitions(self) -> list[InputPartition]:
        with self.options.consumer() as consumer:
            head, committed = consumer.offsets()
            _log_lost(self.options, consumer.lost)
        return list(split_range(committed, head, self.options.partitions))

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, PzqRange)
        return read_range(self.options, partition)


class PzqStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):  # type: ignore[misc]
    """Offsets ``{"offset": n}``. Planning (``initialOffset``, ``latestOffset``, ``commit``)
    runs in the driver-side process; ``read`` on the executors."""

    def __init__(self, options: PzqOptions) -> None:
        self.options = options
        self._consumer: StreamConsumer | None = None
        self._target: int | None = None  # Trigger.AvailableNow: the head when it started
        self._last: int | None = None  # the last end planned (PySpark 4.0/4.1 signature)
        self._told: tuple[int, int] | None = None  # the lost offsets already logged

    def _queue(self) -> StreamConsumer:
        if self._consumer is None:
            self._consumer = self.options.consumer()
        return self._consumer

    def _tell_lost(self) -> None:
        """Log, once, the offsets the queue's last answer says the group lost to retention."""
        lost = self._queue().lost
        if lost is not None and lost != self._told:
            self._told = lost
            _log_lost(self.options, lost)

    def initialOffset(self) -> dict[str, int]:
        committed = self._queue().committed()
        self._tell_lost()
        return {"offset": committed}

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._queue().head()
        self._tell_lost()

    def latestOffset(self, start: dict[str, int] | None = None,
                     limit: Any = None) -> dict[str, int]:
        if start is None:
            at = self._last if self._last is not None else self._queue().committed()
        else:
            at = int(start["offset"])
        head = self._target if self._target is not None else self._queue().head()
        self._tell_lost()
        most = self.options.max_messages_per_batch
        if ReadMaxRows is not None and isinstance(limit, ReadMaxRows):
            most = min(most, limit.max_rows)
        end = max(at, min(head, at + most))
        self._last = end
        return {"offset": end}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
        return list(split_range(int(start["offset"]), int(end["offset"]),
                                self.options.partitions))

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, PzqRange)
        return read_range(self.options, partition)

    def commit(self, end: dict[str, int]) -> None:
        committed = self._queue().commit(int(end["offset"]))
        self._tell_lost()
        log.debug("pzq source: group %s committed up to %d (queue at %d)",
                  self.options.group_name(), end["offset"], committed)

    def stop(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            consumer.close()


# --- sinks -----------------------------------------------------------------------------------


@dataclass
class PzqCommitMessage(WriterCommitMessage):
    """What one task produced: messages ACKed, null values skipped."""

    messages: int = 0
    nulls: int = 0


def write_partition(options: PzqOptions, rows: Iterator[Any], column: int) -> PzqCommitMessage:
    """Produce one partition's values, one message each; return once the queue has ACKed all
    of them. A refused message or a missing ACK raises (and fails the task)."""
    sent = nulls = 0
    producer: Producer | None = None
    try:
        for row in rows:
            value = row[column]
            if value is None:
                nulls += 1
                continue
            body = value.encode("utf-8") if isinstance(value, str) else bytes(value)
            if producer is None:
                producer = Producer(options.sink_endpoint(), window=options.window,
                                    retry_timeout=options.timeout / 2,
                                    batch=min(options.batch, options.window))
            producer.send(body, timeout=options.timeout)
            sent += 1
        if producer is not None:
            producer.flush(timeout=options.timeout)  # TimeoutError or ProducerError
    finally:
        if producer is not None:
            producer.sock.setsockopt(zmq.LINGER, 0)  # nothing unACKed is worth keeping
            producer.close()
    return PzqCommitMessage(sent, nulls)


def _totals(messages: list[Any]) -> tuple[int, int]:
    done = [m for m in messages if isinstance(m, PzqCommitMessage)]
    return sum(m.messages for m in done), len(messages) - len(done)


class PzqBatchWriter(DataSourceWriter):
    def __init__(self, options: PzqOptions, column: int) -> None:
        self.options = options
        self.column = column

    def write(self, iterator: Iterator[Any]) -> PzqCommitMessage:
        return write_partition(self.options, iterator, self.column)

    def commit(self, messages: list[Any]) -> None:
        sent, _ = _totals(messages)
        log.info("pzq sink: %d messages ACKed by %s", sent, self.options.receive_endpoint)

    def abort(self, messages: list[Any]) -> None:
        sent, failed = _totals(messages)
        log.warning("pzq sink: job failed (%d task(s) failed); %d messages of the tasks that "
                    "succeeded are in queue %s and cannot be taken back", failed, sent,
                    self.options.receive_endpoint)


class PzqStreamWriter(DataSourceStreamWriter):
    def __init__(self, options: PzqOptions, column: int) -> None:
        self.options = options
        self.column = column

    def write(self, iterator: Iterator[Any]) -> PzqCommitMessage:
        return write_partition(self.options, iterator, self.column)

    def commit(self, messages: list[Any], batchId: int) -> None:  # noqa: N803 - Spark's name
        sent, _ = _totals(messages)
        log.debug("pzq sink: batch %d: %d messages ACKed by %s", batchId, sent,
                  self.options.receive_endpoint)

    def abort(self, messages: list[Any], batchId: int) -> None:  # noqa: N803
        sent, failed = _totals(messages)
        log.warning("pzq sink: batch %d failed (%d task(s) failed); %d messages already in "
                    "queue %s cannot be taken back", batchId, failed, sent,
                    self.options.receive_endpoint)
