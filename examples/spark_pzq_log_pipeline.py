"""A streaming pipeline over a pzq queue: log events from a stream queue, counted per level by
Spark, the running counts written to parquet and to a pipe that ``zpipes read`` prints.

    pzq --mode stream --database /tmp/pzq-logs &        # a stream queue (default endpoints)
    zbroker local &                                     # a broker, for the counts pipe
    zpipes read level-counts &                          # prints the counts as they change
    python examples/produce_logs_pzq.py --lines 20000   # log events into the queue
    python examples/spark_pzq_log_pipeline.py --out /tmp/pzq-level-counts --group level-counts

The job reads the queue with ``format("pzq")`` (a message per row, ``body`` a log line), counts
the events per level (a stateful streaming aggregation, checkpointed in ``<out>/checkpoint``),
and for each micro-batch writes the counts that changed to parquet (``<out>/counts/batch=<id>``,
replaced if the batch is replayed) and, with ``format("zpipes")``, as lines
``batch=<id> level=<LEVEL> count=<n>`` to pipe ``level-counts``, which it holds open while it
runs. It stops after ``--idle`` seconds without new events (or, with ``--available-now``, once
it has read what the queue held when it started) and prints the totals.

With ``--group`` the job reads and commits as its own reader group, so other readers of the
queue (another job, ``zbroker queue get --group``) each keep their own offset; without it, it
shares the ``default`` group.

The queue makes it restartable: a micro-batch not yet committed when the job stopped is read
again after a restart from the same ``--out`` (at least once from the queue; the parquet output
holds each batch id once). Needs ``pip install 'zbroker[spark]'`` and Java 17+.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from spark_log_pipeline import local_session


def start(spark: Any, stream_endpoint: str, broker: str, counts_pipe: str,
          out_dir: str | Path, checkpoint_dir: str | Path, trigger: dict[str, Any] | None = None,
          max_messages_per_batch: int = 10_000, group: str | None = None) -> Any:
    """Start the streaming query; returns it. ``zbroker.spark.register(spark)`` must have been
    called. ``group``: the reader group to read and commit as (None: ``default``)."""
    from pyspark.sql import functions as F

    reader = (spark.readStream.format("pzq").option("stream_endpoint", stream_endpoint)
              .option("queue", "logs").option("max_messages_per_batch", max_messages_per_batch))
    if group is not None:
        reader = reader.option("group", group)
    events = reader.load()
    parts = F.split(events.body.cast("string"), " ", 4)
    levels = events.select(parts[2].alias("level")).where(F.col("level").isNotNull())
    counts = levels.groupBy("level").count()
    out = Path(out_dir)

    def each_batch(batch: Any, batch_id: int) -> None:
        if batch.isEmpty():
            return
        batch = batch.cache()
        try:
            batch.write.mode("overwrite").parquet(str(out / "counts" / f"batch={batch_id}"))
            text = batch.select(F.format_string(
                "batch=%d level=%s count=%d", F.lit(batch_id), "level", "count",
            ).alias("value"))
            (text.coalesce(1).write.format("zpipes").option("pipe", counts_pipe)
             .option("broker", broker).mode("append").save())
        finally:
            batch.unpersist()

    return (counts.writeStream.outputMode("update").foreachBatch(each_batch)
            .option("checkpointLocation", str(checkpoint_dir))
            .trigger(**(trigger or {"processingTime": "1 second"})).start())


def totals(spark: Any, out_dir: str | Path) -> dict[str, int]:
    """The latest count of each level in the parquet output."""
    from pyspark.sql import functions as F

    df = spark.read.parquet(str(Path(out_dir) / "counts"))
    latest = df.groupBy("level").agg(F.max_by("count", "batch").alias("count"))
    return {r.level: r["count"] for r in latest.collect()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stream-endpoint", default="tcp://127.0.0.1:11133",
                        help="the queue's stream endpoint (default: tcp://127.0.0.1:11133)")
    parser.add_argument("--broker", default="local")
    parser.add_argument("--counts", default="level-counts",
                        help="the pipe to write the counts to (default: level-counts)")
    parser.add_argument("--out", required=True, help="directory for parquet and checkpoint")
    parser.add_argument("--idle", type=float, default=10.0,
                        help="stop after this many seconds without new events (default 10)")
    parser.add_argument("--group", default=None,
                        help="the reader group to read and commit as (default: the queue's "
                             "default group)")
    parser.add_argument("--available-now", action="store_true",
                        help="read what the queue holds now, then stop")
    args = parser.parse_args(argv)

    from zbroker.spark import register
    from zbroker.spark.lines import hold_pipe_open

    spark = local_session()
    register(spark)
    out = Path(args.out)
    trigger = {"availableNow": True} if args.available_now else None
    with hold_pipe_open(args.counts, broker=args.broker):
        query = start(spark, args.stream_endpoint, args.broker, args.counts, out,
                      out / "checkpoint", trigger, group=args.group)
        print(f"ready: reading queue {args.stream_endpoint}", file=sys.stderr)
        # Idle time counts from the first micro-batch the query completed (the first one
        # takes a while: Spark starts its Python workers).
        last_batch, last_change = None, None
        while query.isActive:
            time.sleep(0.5)
            progress = query.lastProgress
            if progress is None:
                continue
            if last_change is None or (progress["numInputRows"] > 0
                                       and progress["batchId"] != last_batch):
                last_batch, last_change = progress["batchId"], time.monotonic()
            elif time.monotonic() - last_change > args.idle:
                break
        query.stop()
        if query.exception() is not None:
            raise SystemExit(f"the query failed: {query.exception()}")
    if (out / "counts").exists():
        for level, count in sorted(totals(spark, out).items()):
            print(f"{level:6} {count}")
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
