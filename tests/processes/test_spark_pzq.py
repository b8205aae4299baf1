"""``format("pzq")`` with real Spark in local mode against real ``pzq`` processes: a streaming
query reads a stream queue into parquet, is stopped mid-way and restarted from its checkpoint
(with a SIGKILL restart of the queue in between) and ends with every message exactly once and
the queue committed; a SIGKILL restart of the queue while a query runs loses nothing; two
queries in two reader groups each get every message once and commit only their own offset; a
range a group lost to retention is named in a warning; the batch source reads [committed, head);
the batch and streaming sinks deliver every row to a queue once.

Uses the session-wide SparkSession of conftest.py; skipped, with the reason, when pyspark,
pyarrow or Java is missing. Every wait is bounded.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import zmq
from helpers import wait_for

from pzq.client import Producer, StreamConsumer, monitor

pytest.importorskip("pyspark", reason="pyspark is not installed (pip install 'zbroker[spark]')")
pytest.importorskip("pyarrow", reason="pyarrow is not installed (pip install 'zbroker[spark]')")

pytestmark = pytest.mark.spark

STREAM = ("--mode", "stream")
WAIT = 90.0  # seconds: the longest any one Spark job or query of these tests may take


def produce(endpoint: str, bodies: list[bytes]) -> None:
    with Producer(endpoint, window=256) as p:
        p.sock.setsockopt(zmq.LINGER, 0)
        for body in bodies:
            p.send(body)
        p.flush(timeout=30)


def queue_bodies(stream_endpoint: str) -> list[bytes]:
    """Every uncommitted message of a stream queue, in offset order."""
    with StreamConsumer(stream_endpoint) as c:
        head, committed = c.offsets()
        return [m.body for m in c.read(committed, head)]


def offsets(stream_endpoint: str) -> tuple[int, int]:
    with StreamConsumer(stream_endpoint) as c:
        return c.offsets()


def source(spark: Any, q: Any, per_batch: int = 1000, **options: Any) -> Any:
    reader = (spark.readStream.format("pzq").option("stream_endpoint", q.stream)
              .option("queue", "events").option("max_messages_per_batch", per_batch)
              .option("partitions", 2))
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def group_committed(stream_endpoint: str, group: str) -> int:
    with StreamConsumer(stream_endpoint) as c:
        return c.groups()[group]


def batches_with_rows(query: Any) -> list[dict[str, Any]]:
    return [p for p in query.recentProgress if p["numInputRows"] > 0]


# --- the source ------------------------------------------------------------------------------


def test_stream_stopped_mid_way_and_restarted_gives_every_message_once(
        spark: Any, start_pzq: Any, tmp_path: Path) -> None:
    n = 10_000
    q = start_pzq(*STREAM)
    produce(q.receive, [b"event %05d" % i for i in range(n)])
    assert offsets(q.stream) == (n, 0)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    def start(trigger: dict[str, Any]) -> Any:
        return (source(spark, q).writeStream.format("parquet")
                .option("path", str(out)).option("checkpointLocation", str(checkpoint))
                .trigger(**trigger).start())

    # First run: stopped after at least one micro-batch and before the last.
    query = start({"processingTime": "0.2 seconds"})
    try:
        wait_for(lambda: len(batches_with_rows(query)) >= 2 or query.exception(), WAIT,
                 "two micro-batches")
        assert query.exception() is None, query.exception()
    finally:
        query.stop()
    first = spark.read.parquet(str(out)).count()
    assert 0 < first < n, f"the first run was meant to stop mid-way (it wrote {first} rows)"
    head, committed = offsets(q.stream)
    assert head == n and committed <= first  # only what Spark had committed is committed

    # The queue is killed (SIGKILL) and started again on its data between the two runs.
    q = q.restart()
    assert offsets(q.stream) == (n, committed)

    # Second run from the checkpoint, to the end of what is there now.
    query = start({"availableNow": True})
    assert query.awaitTermination(WAIT), "the restarted query did not finish"
    assert query.exception() is None, query.exception()

    rows = spark.read.parquet(str(out))
    assert rows.count() == n
    assert rows.select("offset").distinct().count() == n
    got = sorted(r.body for r in rows.select("body").collect())
    assert got == [b"event %05d" % i for i in range(n)]
    sample = rows.where("offset = 0").collect()[0]
    assert sample.queue == "events" and sample.key and sample.sent is not None
    # Spark commits a micro-batch's end to the source only when it plans the next batch (or at
    # the next start of the query); an availableNow run ends after its last batch without
    # planning another, so the queue is committed to the end of the last-but-one batch.
    ends = [int(p["sources"][0]["endOffset"].split(":")[1].strip(" }"))
            for p in batches_with_rows(query)]
    assert ends[-1] == n
    head, committed = offsets(q.stream)
    assert head == n and committed >= ends[-2]
    assert len(queue_bodies(q.stream)) == n - committed

    # The next run of the query commits it as it plans its first batch: the queue is empty.
    produce(q.receive, [b"one more"])
    query = start({"availableNow": True})
    assert query.awaitTermination(WAIT), "the third run did not finish"
    assert query.exception() is None, query.exception()
    assert queue_bodies(q.stream) == [b"one more"]  # all of the first n are committed
    assert offsets(q.stream) == (n + 1, n)
    assert spark.read.parquet(str(out)).count() == n + 1


def test_batch_read_gives_the_uncommitted_messages(spark: Any, start_pzq: Any) -> None:
    q = start_pzq(*STREAM)
    produce(q.receive, [b"m%d" % i for i in range(500)])
    with StreamConsumer(q.stream) as c:
        c.commit(100)
    df = (spark.read.format("pzq").option("stream_endpoint", q.stream)
          .option("partitions", 3).load())
    rows = df.collect()
    assert sorted(r.offset for r in rows) == list(range(100, 500))
    assert sorted(r.body for r in rows) == sorted(b"m%d" % i for i in range(100, 500))
    assert offsets(q.stream) == (500, 100)  # a batch read commits nothing


def test_source_needs_a_stream_endpoint(spark: Any) -> None:
    with pytest.raises(Exception, match="stream_endpoint"):
        spark.read.format("pzq").load().collect()


# --- the sinks -------------------------------------------------------------------------------


def test_batch_sink_every_row_is_acked_into_the_queue_once(spark: Any, start_pzq: Any) -> None:
    n = 3000
    q = start_pzq(*STREAM)
    df = spark.range(n, numPartitions=3).selectExpr(
        "CASE WHEN id % 2 = 0 THEN concat('row ', id) END AS text",
        "cast(concat('row ', id) AS binary) AS value")
    df.write.format("pzq").option("receive_endpoint", q.receive).mode("append").save()
    # The write returned: every message is ACKed, so durable and in the head already.
    assert offsets(q.stream)[0] == n
    assert sorted(queue_bodies(q.stream)) == sorted(b"row %d" % i for i in range(n))

    # A string column, with nulls (skipped).
    q2 = start_pzq(*STREAM)
    df.selectExpr("text AS value").write.format("pzq").option(
        "receive_endpoint", q2.receive).mode("append").save()
    assert sorted(queue_bodies(q2.stream)) == sorted(b"row %d" % i for i in range(0, n, 2))


def test_sink_needs_a_value_column(spark: Any, start_pzq: Any) -> None:
    q = start_pzq(*STREAM)
    with pytest.raises(Exception, match="value"):
        spark.range(3).write.format("pzq").option("receive_endpoint", q.receive).mode(
            "append").save()


def test_streaming_queue_to_queue(spark: Any, start_pzq: Any, tmp_path: Path) -> None:
    n = 2000
    a, b = start_pzq(*STREAM), start_pzq(*STREAM)
    produce(a.receive, [b"e%d" % i for i in range(n)])
    query = (source(spark, a, per_batch=700).selectExpr("upper(cast(body AS string)) AS value")
             .writeStream.format("pzq").option("receive_endpoint", b.receive)
             .option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(availableNow=True).start())
    assert query.awaitTermination(WAIT), "the query did not finish"
    assert query.exception() is None, query.exception()
    assert sorted(queue_bodies(b.stream)) == sorted(b"E%d" % i for i in range(n))
    ends = [int(p["sources"][0]["endOffset"].split(":")[1].strip(" }"))
            for p in batches_with_rows(query)]
    assert ends == [700, 1400, 2000]
    # The last batch's end is committed when a later run plans its next batch (see above).
    assert offsets(a.stream) == (n, 1400)


def test_queue_killed_and_restarted_during_the_query_loses_nothing(
        spark: Any, start_pzq: Any, tmp_path: Path) -> None:
    n = 4000
    q = start_pzq(*STREAM)
    produce(q.receive, [b"x%d" % i for i in range(n)])
    out = tmp_path / "out"
    query = (source(spark, q, per_batch=500).writeStream.format("parquet")
             .option("path", str(out)).option("checkpointLocation", str(tmp_path / "cp"))
             .trigger(processingTime="0.2 seconds").start())
    try:
        wait_for(lambda: batches_with_rows(query) or query.exception(), WAIT, "a micro-batch")
        q = q.restart()  # SIGKILL and start again on the same data and endpoints
        read_before = sum(p["numInputRows"] for p in batches_with_rows(query))
        wait_for(lambda: sum(p["numInputRows"] for p in batches_with_rows(query)) >= n
                 or query.exception(), WAIT, "every message")
        assert query.exception() is None, query.exception()
    finally:
        query.stop()
    assert read_before < n, "the queue was meant to restart while the query was reading"
    rows = spark.read.parquet(str(out))
    assert rows.count() == n and rows.select("offset").distinct().count() == n
    assert sorted(r.body for r in rows.select("body").collect()) == sorted(
        b"x%d" % i for i in range(n))


# --- reader groups -----------------------------------------------------------------------------


def test_two_queries_in_two_groups_each_get_every_message_once(
        spark: Any, start_pzq: Any, tmp_path: Path) -> None:
    """Groups a and b read one queue (in 2 and 3 partitions per micro-batch); the queue is
    SIGKILLed and restarted under both; b is stopped mid-way, a goes on to the end without
    moving b's offset, then b restarts from its checkpoint: each parquet output holds every
    message exactly once. The default group (readers that name none) is half way from the
    start: a reader that did not name its group (driver or executor) would miss messages."""
    n = 6000
    q = start_pzq(*STREAM)
    produce(q.receive, [b"event %05d" % i for i in range(n)])
    for group in ("a", "b"):
        with StreamConsumer(q.stream, group=group) as c:
            assert c.committed() == 0  # made, at the oldest message
    with StreamConsumer(q.stream) as c:
        assert c.commit(n // 2) == n // 2  # groups a and b keep them all

    def start(group: str, trigger: dict[str, Any]) -> Any:
        return (source(spark, q, per_batch=500 if group == "a" else 700, group=group,
                       partitions=2 if group == "a" else 3)
                .writeStream.format("parquet").option("path", str(tmp_path / f"out-{group}"))
                .option("checkpointLocation", str(tmp_path / f"checkpoint-{group}"))
                .trigger(**trigger).start())

    def rows_read(query: Any) -> int:
        return sum(p["numInputRows"] for p in batches_with_rows(query))

    a = start("a", {"processingTime": "0.2 seconds"})
    b = start("b", {"processingTime": "0.2 seconds"})
    try:
        wait_for(lambda: (batches_with_rows(a) and len(batches_with_rows(b)) >= 2)
                 or a.exception() or b.exception(), WAIT, "micro-batches of both queries")
        q = q.restart()  # SIGKILL and start again, under both queries
        wait_for(lambda: rows_read(b) > 2100 or b.exception(), WAIT, "b to read on")
        assert b.exception() is None, b.exception()
        b.stop()
        b_read = rows_read(b)
        assert b_read < n, "query b was meant to stop mid-way"
        b_at = group_committed(q.stream, "b")
        assert b_at <= b_read  # only what b's checkpoint holds is committed
        # a reads to the end and commits (each commit as it plans its next micro-batch)
        wait_for(lambda: rows_read(a) >= n or a.exception(), WAIT, "query a to read all")
        wait_for(lambda: group_committed(q.stream, "a") > b_read or a.exception(), WAIT,
                 "query a to commit past what b read")
        assert a.exception() is None, a.exception()
    finally:
        a.stop()
        b.stop()
    assert group_committed(q.stream, "b") == b_at  # a's commits did not move b
    assert offsets(q.stream) == (n, n // 2)  # nor the default group

    b = start("b", {"availableNow": True})  # from its checkpoint, to the end
    assert b.awaitTermination(WAIT), "the restarted query b did not finish"
    assert b.exception() is None, b.exception()
    assert group_committed(q.stream, "b") >= b_at

    want = [b"event %05d" % i for i in range(n)]
    for group in ("a", "b"):
        rows = spark.read.parquet(str(tmp_path / f"out-{group}"))
        assert rows.count() == n, group
        assert rows.select("offset").distinct().count() == n, group
        assert sorted(r.body for r in rows.select("body").collect()) == want, group


def test_offsets_a_group_lost_to_retention_are_named_in_warnings(
        start_pzq: Any, caplog: pytest.LogCaptureFixture) -> None:
    """Without Spark: the source's planning and its reading of a range (what runs in the driver
    and on an executor) against a real queue whose retention dropped what group a had not
    committed."""
    from zbroker.spark.pzq_source import (
        PzqBatchReader,
        PzqOptions,
        PzqRange,
        PzqStreamReader,
        read_range,
    )

    q = start_pzq(*STREAM, "--retention-bytes", "2000")
    options = PzqOptions.parse({"stream_endpoint": q.stream, "group": "a", "timeout": "5"})
    reader = PzqStreamReader(options)
    try:
        assert reader.initialOffset() == {"offset": 0}  # group a is made, at 0
        produce(q.receive, [b"m%03d" % i for i in range(200)])
        # every drop done: the backlog is within the limit (so the offsets lost stay put)
        wait_for(lambda: monitor(q.monitor)["backlog_bytes"] <= 2000, 10, "retention")
        with caplog.at_level(logging.WARNING, logger="zbroker.spark.pzq"):
            rows = list(read_range(options, PzqRange(0, 200)))  # the range a checkpoint asks
            end = reader.latestOffset({"offset": 0})
            batch = PzqBatchReader(options).partitions()  # spark.read, as group a
    finally:
        reader.stop()
    assert end == {"offset": 200}
    lost_to = 200 - len(rows)
    assert 0 < lost_to < 200
    assert [r[2] for r in rows] == [b"m%03d" % i for i in range(lost_to, 200)]
    assert batch == [PzqRange(lost_to, 200)]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    told = (f"pzq source: group 'a' lost offsets 0..{lost_to - 1}: the queue's retention limits "
            "dropped them before the group committed them; the query goes on after them")
    assert warnings == [
        f"pzq source: group 'a' lost offsets 0..{lost_to - 1} (of the range 0..199 read now): "
        "the queue's retention limits dropped them before the group committed them",
        told, told]  # the executor's range, the driver's planning, the batch read's


def test_the_group_option_is_checked() -> None:
    from zbroker.spark.pzq_source import PzqOptions

    assert PzqOptions.parse({"stream_endpoint": "tcp://127.0.0.1:1"}).group is None
    assert PzqOptions.parse({"group": "hourly.job-1"}).group == "hourly.job-1"
    for bad in ("a b", "x" * 256, "é"):
        with pytest.raises(ValueError, match="option 'group' must be 1 to 255 characters"):
            PzqOptions.parse({"group": bad})


# --- the example pipeline --------------------------------------------------------------------


def test_example_pzq_pipeline_in_its_own_group_counts_every_event(
        spark: Any, start_pzq: Any, broker: Any, tmp_path: Path) -> None:
    import sys
    import threading

    import zpipes
    from zbroker.spark.lines import hold_pipe_open

    examples = str(Path(__file__).resolve().parents[2] / "examples")
    sys.path.insert(0, examples)
    try:
        import produce_logs_pzq
        import spark_pzq_log_pipeline
    finally:
        sys.path.remove(examples)
    q = start_pzq(*STREAM)
    assert produce_logs_pzq.main(["--endpoint", q.receive, "--lines", "3000", "--seed", "5"]) == 0
    with StreamConsumer(q.stream, group="check") as c:  # the levels as the queue holds them
        levels: dict[str, int] = {}
        for m in c.read(0, c.offsets()[0]):
            level = m.body.split(b" ", 3)[2].decode()
            levels[level] = levels.get(level, 0) + 1
    assert sum(levels.values()) == 3000
    lines: list[bytes] = []
    reader = zpipes.open("level-counts", "r", broker=broker.name, timeout=WAIT)
    collect = threading.Thread(target=lambda: lines.extend(reader), daemon=True)
    collect.start()
    out = tmp_path / "out"
    with hold_pipe_open("level-counts", broker=broker.name):
        query = spark_pzq_log_pipeline.start(
            spark, q.stream, broker.name, "level-counts", out, out / "checkpoint",
            {"availableNow": True}, group="level-counts")
        try:
            assert query.awaitTermination(WAIT), "the availableNow query did not end"
            assert query.exception() is None
        finally:
            query.stop()
    collect.join(WAIT)
    reader.close()
    assert spark_pzq_log_pipeline.totals(spark, out) == levels
    final = {}
    for line in lines:
        fields = dict(field.split("=", 1) for field in line.decode().split())
        final[fields["level"]] = max(final.get(fields["level"], 0), int(fields["count"]))
    assert final == levels
    with StreamConsumer(q.stream, group="check") as c:  # it read as its own group only
        groups = c.groups()
    assert sorted(groups) == ["check", "level-counts"] and groups["check"] == 0
