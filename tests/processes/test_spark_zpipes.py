"""``format("zpipes")`` with real Spark in local mode against real broker processes: the batch
and streaming sinks deliver every row as a line to library and ``zpipes read`` readers, the batch
source reads a pipe to its end, the streaming source follows a pipe across writers.

The session-wide SparkSession of conftest.py (``local[2]``, UI off, loopback only, workers on
this interpreter) serves these tests; it starts in ~15-20 s. Skipped, with the reason, when pyspark,
pyarrow or Java is missing. Every wait is bounded.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import REPO_ROOT, broker_env, wait_for

import zpipes

pytest.importorskip("pyspark", reason="pyspark is not installed (pip install 'zbroker[spark]')")
pytest.importorskip("pyarrow", reason="pyarrow is not installed (pip install 'zbroker[spark]')")

from zbroker.spark.lines import hold_pipe_open  # noqa: E402

pytestmark = pytest.mark.spark

WAIT = 90.0  # seconds: the longest any one Spark job or query of these tests may take


# --- helpers ---------------------------------------------------------------------------------


class LineCollector:
    """A library reader of a pipe in a thread: collects lines, keeps reading after each
    end-of-stream (a Spark sink attaches one writer per partition), until ``want`` lines have
    come or ``stop()``."""

    def __init__(self, pipe: str, broker: str, want: int | None = None) -> None:
        self.reader = zpipes.open(pipe, "r", broker=broker, timeout=0.2)
        self.want = want
        self.lines: list[bytes] = []
        self.ends = 0  # end-of-stream seen (between writers)
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                if self.want is not None and len(self.lines) >= self.want:
                    return
                try:
                    line = self.reader.readline()
                except zpipes.PipeTimeout:
                    continue
                if line:
                    self.lines.append(line)
                else:
                    self.ends += 1
                    time.sleep(0.02)  # no writer attached now: the next one will come
        except BaseException as exc:  # reported by result()
            self.error = exc

    def result(self, timeout: float = WAIT) -> list[bytes]:
        self._thread.join(timeout)
        self.stop()
        if self.error is not None:
            raise self.error
        return self.lines

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.reader.close()


def feed_pipe(pipe: str, broker: str, pieces: list[bytes], gap: float = 0.0,
              chunk_size: int = zpipes.DEFAULT_CHUNK_SIZE) -> threading.Thread:
    """Write each piece through a writer of its own, in a thread (a write waits for a reader)."""

    def run() -> None:
        for piece in pieces:
            with zpipes.open(pipe, "w", broker=broker, timeout=WAIT,
                             chunk_size=chunk_size) as w:
                w.write(piece)
            time.sleep(gap)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


# --- sinks -----------------------------------------------------------------------------------


def test_batch_sink_every_row_arrives_as_a_line_at_a_library_reader(spark: Any,
                                                                   broker: Any) -> None:
    n, parts = 20_000, 4
    collector = LineCollector("out", broker.name, want=n)
    df = spark.range(n, numPartitions=parts).selectExpr(
        "concat('row ', spark_partition_id(), ' ', id) AS value")
    df.write.format("zpipes").option("pipe", "out").option("broker", broker.name) \
        .option("timeout", "60").mode("append").save()
    lines = collector.result()
    assert len(lines) == n
    assert all(line.endswith(b"\n") and line.count(b"\n") == 1 for line in lines)
    ids_by_partition: dict[int, list[int]] = {}
    for line in lines:
        _, partition, ident = line.split()
        ids_by_partition.setdefault(int(partition), []).append(int(ident))
    assert sorted(i for ids in ids_by_partition.values() for i in ids) == list(range(n))
    for ids in ids_by_partition.values():  # each partition's lines in their order
        assert ids == sorted(ids)


def test_batch_sink_to_zpipes_read_with_the_pipe_held_open(spark: Any, broker: Any,
                                                            tmp_path: Path) -> None:
    """Several partitions, one end-of-stream: ``zpipes read`` ends after the whole job. Binary
    values are written as they are; null values are skipped."""
    n = 3_000
    reader = subprocess.Popen(
        [sys.executable, "-m", "zpipes", "read", "results", "--broker", broker.name,
         "--timeout", str(WAIT)],
        env=broker_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        df = spark.range(n, numPartitions=3).selectExpr(
            "IF(id % 1000 = 999, NULL, CAST(concat('b', id) AS BINARY)) AS value", "id")
        with hold_pipe_open("results", broker=broker.name, timeout=30):
            df.write.format("zpipes").option("pipe", "results") \
                .option("broker", broker.name).mode("append").save()
        out, err = reader.communicate(timeout=WAIT)
    finally:
        if reader.poll() is None:
            reader.kill()
            reader.wait()
    assert reader.returncode == 0, err
    got = out.decode().splitlines()
    assert sorted(got) == sorted(f"b{i}" for i in range(n) if i % 1000 != 999)


def test_sink_needs_a_value_column_and_a_pipe(spark: Any, broker: Any) -> None:
    df = spark.range(3)
    with pytest.raises(Exception, match='column "value"'):
        df.write.format("zpipes").option("pipe", "x").option("broker", broker.name) \
            .mode("append").save()
    with pytest.raises(Exception, match='option "pipe"'):
        df.selectExpr("CAST(id AS STRING) AS value").write.format("zpipes") \
            .option("broker", broker.name).mode("append").save()


def test_streaming_sink_writes_every_row_of_a_rate_stream(spark: Any, broker: Any,
                                                          tmp_path: Path) -> None:
    want = 400
    collector = LineCollector("rates", broker.name)
    stream = (spark.readStream.format("rate").option("rowsPerSecond", 400)
              .option("numPartitions", 2).load()
              .selectExpr("CAST(value AS STRING) AS value"))
    query = (stream.writeStream.format("zpipes").option("pipe", "rates")
             .option("broker", broker.name).option("timeout", "60")
             .option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(processingTime="500 milliseconds").start())
    try:
        def complete() -> bool:
            if query.exception() is not None:
                raise AssertionError(f"query failed: {query.exception()}")
            got = {int(line) for line in collector.lines}
            return all(i in got for i in range(want))

        wait_for(complete, WAIT, f"values 0..{want - 1} from the streaming sink", interval=0.2)
    finally:
        query.stop()
        lines = collector.result(timeout=5)
    values = [int(line) for line in lines]
    assert len(values) == len(set(values)), "a row arrived twice"
    assert set(range(want)) <= set(values)
    assert collector.ends >= 1  # each micro-batch's writers come and go


# --- sources ---------------------------------------------------------------------------------


def test_batch_read_gives_every_line_until_end_of_stream(spark: Any, broker: Any) -> None:
    lines = [f"line {i} \u00e9" for i in range(5_000)] + ["crlf", "last, no newline"]
    body = ("\n".join(lines[:-2]) + "\ncrlf\r\nlast, no newline").encode()
    feed = feed_pipe("in", broker.name, [body], chunk_size=4096)  # lines cut across chunks
    df = (spark.read.format("zpipes").option("pipe", "in").option("broker", broker.name)
          .option("timeout", "60").load())
    assert df.schema.simpleString() == "struct<value:string>"
    rows = [r.value for r in df.collect()]
    feed.join(WAIT)
    assert rows == lines


def test_streaming_source_follows_the_pipe_across_writers(spark: Any, broker: Any,
                                                         tmp_path: Path) -> None:
    n, writers = 3_000, 3
    per = n // writers
    pieces = [b"".join(b"w%d-%d\n" % (w, i) for i in range(per)) for w in range(writers)]
    stream = (spark.readStream.format("zpipes").option("pipe", "feed")
              .option("broker", broker.name).option("max_lines_per_batch", "400").load())
    out = tmp_path / "parquet"
    query = (stream.writeStream.format("parquet").option("path", str(out))
             .option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(processingTime="200 milliseconds").start())
    try:
        feed = feed_pipe("feed", broker.name, pieces, gap=0.3)

        def done() -> bool:
            if query.exception() is not None:
                raise AssertionError(f"query failed: {query.exception()}")
            progress = query.recentProgress
            return sum(p["numInputRows"] for p in progress) >= n

        wait_for(done, WAIT, f"{n} lines through the streaming query", interval=0.2)
        feed.join(WAIT)
        progress = query.recentProgress
    finally:
        query.stop()
    assert max(p["numInputRows"] for p in progress) <= 400
    rows = [r.value for r in spark.read.parquet(str(out)).collect()]
    expected = [f"w{w}-{i}" for w in range(writers) for i in range(per)]
    assert sorted(rows) == sorted(expected)


def test_streaming_source_restarted_from_its_checkpoint_goes_on(spark: Any, broker: Any,
                                                                 tmp_path: Path) -> None:
    """Offsets of a previous run do not confuse a restarted query: it reads what is written
    after the restart, and nothing twice."""
    out, checkpoint = tmp_path / "parquet", tmp_path / "checkpoint"

    def run(tag: str, count: int, total: int) -> None:
        stream = (spark.readStream.format("zpipes").option("pipe", "again")
                  .option("broker", broker.name).load())
        query = (stream.writeStream.format("parquet").option("path", str(out))
                 .option("checkpointLocation", str(checkpoint))
                 .trigger(processingTime="200 milliseconds").start())
        try:
            # The query's reader attaches when it plans its first micro-batch.
            wait_for(lambda: query.recentProgress, WAIT, "the query's first trigger")
            feed = feed_pipe("again", broker.name,
                             [b"".join(b"%s-%d\n" % (tag.encode(), i) for i in range(count))])

            def done() -> bool:
                if query.exception() is not None:
                    raise AssertionError(f"query failed: {query.exception()}")
                return sum(p["numInputRows"] for p in query.recentProgress) >= count

            wait_for(done, WAIT, f"{count} lines in run {tag}", interval=0.2)
            feed.join(WAIT)
        finally:
            query.stop()
        assert spark.read.parquet(str(out)).count() == total

    run("first", 500, 500)
    run("second", 700, 1200)
    rows = sorted(r.value for r in spark.read.parquet(str(out)).collect())
    assert rows == sorted([f"first-{i}" for i in range(500)] + [f"second-{i}" for i in range(700)])


# --- the example pipeline --------------------------------------------------------------------


def test_example_log_pipeline_counts_every_line(spark: Any, broker: Any, tmp_path: Path) -> None:
    sys.path.insert(0, str(REPO_ROOT / "examples"))
    try:
        import make_logs
        import spark_log_pipeline
    finally:
        sys.path.remove(str(REPO_ROOT / "examples"))
    import random

    rng = random.Random(7)
    lines = [make_logs.make_line(rng) for _ in range(4_000)]
    expected: dict[tuple[str, str], int] = {}
    for line in lines:
        _, host, level, _ = line.split(" ", 3)
        expected[(host, level)] = expected.get((host, level), 0) + 1
    counts = LineCollector("log-counts", broker.name)
    query = spark_log_pipeline.start(spark, broker.name, "logs", "log-counts", tmp_path / "out",
                                     tmp_path / "checkpoint", trigger="300 milliseconds")
    try:
        wait_for(lambda: query.recentProgress, WAIT, "the query's first trigger")
        feed = feed_pipe("logs", broker.name, ["".join(f"{x}\n" for x in lines).encode()])

        def done() -> bool:
            if query.exception() is not None:
                raise AssertionError(f"query failed: {query.exception()}")
            return sum(p["numInputRows"] for p in query.recentProgress) >= len(lines)

        wait_for(done, WAIT, "every log line through the pipeline", interval=0.2)
        feed.join(WAIT)
        query.processAllAvailable()
    finally:
        query.stop()
    assert spark_log_pipeline.totals(spark, tmp_path / "out") == expected

    def all_counts_arrived() -> bool:
        latest: dict[tuple[str, str], tuple[int, int]] = {}
        for line in counts.lines:
            fields = dict(field.split("=", 1) for field in line.decode().split())
            key, value = (fields["host"], fields["level"]), (int(fields["batch"]),
                                                             int(fields["count"]))
            latest[key] = max(latest.get(key, value), value)
        return {key: count for key, (_, count) in latest.items()} == expected

    wait_for(all_counts_arrived, 30, "the final counts at the counts pipe's reader")
    counts.stop()


def test_streaming_source_fails_the_query_when_the_broker_stops(spark: Any, broker: Any,
                                                                tmp_path: Path) -> None:
    stream = (spark.readStream.format("zpipes").option("pipe", "gone")
              .option("broker", broker.name).load())
    query = (stream.writeStream.format("memory").queryName("gone")
             .option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(processingTime="200 milliseconds").start())
    try:
        wait_for(lambda: query.recentProgress, WAIT, "the query's first trigger")
        assert broker.stop() == 0
        wait_for(lambda: not query.isActive, WAIT, "the query to fail")
        error = str(query.exception())
    finally:
        query.stop()
    assert "broker stopping" in error or "not running" in error, error


# --- the stream reader's offsets, without Spark ------------------------------------------------


def test_stream_reader_offsets_batches_and_restart(broker: Any, caplog: Any) -> None:
    from zbroker.spark.zpipes_source import PipeOptions, ZpipesStreamReader

    options = PipeOptions.parse({"pipe": "offsets", "broker": broker.name,
                                 "max_lines_per_batch": "3", "poll_seconds": "0.2"})

    def read_some(reader: ZpipesStreamReader, start: dict, want: int) -> tuple[list, dict]:
        rows: list = []
        deadline = time.monotonic() + WAIT
        while len(rows) < want and time.monotonic() < deadline:
            got, end = reader.read(start)
            got = list(got)
            if got:
                assert len(got) <= 3
                assert end == {"run": reader.run, "line": reader.lines}
            else:
                assert end == start
            rows += got
            start = end
        return rows, start

    reader = ZpipesStreamReader(options)
    start = reader.initialOffset()
    assert start == {"run": reader.run, "line": 0}
    try:
        rows, end = reader.read(start)  # attaches; nothing written: no new offset
        assert list(rows) == [] and end == start
        feed_pipe("offsets", broker.name, [b"a\nb\nc\nd\n", b"e"]).join(WAIT)  # two writers
        rows, end = read_some(reader, start, 5)
        assert rows == [("a",), ("b",), ("c",), ("d",), ("e",)]
        assert end == {"run": reader.run, "line": 5}
        reader.commit(end)
    finally:
        reader.stop()
    # A restarted query: a new reader, which gets the old run's offset as its start.
    again = ZpipesStreamReader(options)
    try:
        assert again.run != reader.run
        rows, same = again.read(end)
        assert list(rows) == [] and same == end
        feed_pipe("offsets", broker.name, [b"f\n"]).join(WAIT)
        rows, end2 = read_some(again, end, 1)
        assert rows == [("f",)] and end2 == {"run": again.run, "line": 1}
        # A batch planned before the restart cannot be replayed: a warning, no rows.
        with caplog.at_level("WARNING", logger="zbroker.spark.zpipes"):
            assert list(again.readBetweenOffsets(start, end)) == []
        assert "5 lines are lost" in caplog.text
    finally:
        again.stop()
