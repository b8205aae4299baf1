"""A streaming pipeline over ZPIPES: log lines from a pipe, counted by Spark, the running counts
written to parquet and to a pipe that ``zpipes read`` prints.

    zbroker local &                                     # a broker (or scripts/run)
    zpipes read log-counts &                            # prints the counts as they change
    python examples/spark_log_pipeline.py --out /tmp/log-counts &
    # wait for "ready", then:
    python examples/make_logs.py --lines 20000 | zpipes write logs

The job reads pipe ``logs`` with ``format("zpipes")`` (a line per row), counts the lines per
host and level (a stateful streaming aggregation, checkpointed), and for each micro-batch writes
the counts that changed to parquet (``<out>/counts/batch=<id>``, replaced if the batch is
replayed, so the files hold each batch once) and as lines
``batch=<id> host=<host> level=<LEVEL> count=<n>`` to pipe ``log-counts``. It holds
``log-counts`` open while it runs, so that ``zpipes read log-counts`` sees one stream, and
stops after ``--idle`` seconds without new lines (once some came), printing the totals.

Needs ``pip install 'zbroker[spark]'`` and Java 17+.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

# A pipeline that must not lose lines across restarts reads a pzq queue instead of a pipe, with
# format("pzq") (at least once): see examples/spark_pzq_log_pipeline.py.


def start(spark: Any, broker: str, logs_pipe: str, counts_pipe: str, out_dir: str | Path,
          checkpoint_dir: str | Path, trigger: str = "1 second") -> Any:
    """Start the streaming query; returns it. ``zbroker.spark.register(spark)`` must have been
    called."""
    from pyspark.sql import functions as F

    lines = (spark.readStream.format("zpipes").option("pipe", logs_pipe)
             .option("broker", broker).load())
    parts = F.split(lines.value, " ", 4)
    events = lines.select(
        F.to_timestamp(parts[0]).alias("time"),
        parts[1].alias("host"),
        parts[2].alias("level"),
        parts[3].alias("message"),
    ).where(F.col("level").isNotNull())
    counts = events.groupBy("host", "level").count()
    out = Path(out_dir)

    def each_batch(batch: Any, batch_id: int) -> None:
        if batch.isEmpty():
            return
        batch = batch.cache()
        try:
            batch.write.mode("overwrite").parquet(str(out / "counts" / f"batch={batch_id}"))
            text = batch.select(F.format_string(
                "batch=%d host=%s level=%s count=%d", F.lit(batch_id), "host", "level", "count",
            ).alias("value"))
            (text.coalesce(1).write.format("zpipes").option("pipe", counts_pipe)
             .option("broker", broker).mode("append").save())
        finally:
            batch.unpersist()

    return (counts.writeStream.outputMode("update").foreachBatch(each_batch)
            .option("checkpointLocation", str(checkpoint_dir))
            .trigger(processingTime=trigger).start())


def totals(spark: Any, out_dir: str | Path) -> dict[tuple[str, str], int]:
    """The latest count of each (host, level) in the parquet output."""
    from pyspark.sql import functions as F

    df = spark.read.parquet(str(Path(out_dir) / "counts"))
    latest = df.groupBy("host", "level").agg(F.max_by("count", "batch").alias("count"))
    return {(r.host, r.level): r["count"] for r in latest.collect()}


def local_session(master: str = "local[*]") -> Any:
    """A local SparkSession on loopback, its Python workers on this interpreter."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master(master).appName("zbroker-log-pipeline")
             .config("spark.ui.enabled", "false")
             .config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.driver.host", "127.0.0.1")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .getOrCreate())
    spark.sparkContext.setLogLevel("WARN")
    return spark


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--broker", default="local")
    parser.add_argument("--logs", default="logs", help="the pipe to read (default: logs)")
    parser.add_argument("--counts", default="log-counts",
                        help="the pipe to write the counts to (default: log-counts)")
    parser.add_argument("--out", required=True, help="directory for parquet and checkpoint")
    parser.add_argument("--idle", type=float, default=10.0,
                        help="stop after this many seconds without new lines (default 10)")
    args = parser.parse_args(argv)

    from zbroker.spark import register
    from zbroker.spark.lines import hold_pipe_open

    spark = local_session()
    register(spark)
    out = Path(args.out)
    with hold_pipe_open(args.counts, broker=args.broker):
        query = start(spark, args.broker, args.logs, args.counts, out, out / "checkpoint")
        print(f"ready: write log lines to pipe {args.logs!r} on broker {args.broker!r}",
              file=sys.stderr)
        last_batch, last_change = None, None
        while query.isActive:
            time.sleep(0.5)
            progress = query.lastProgress
            if progress and progress["numInputRows"] > 0 and progress["batchId"] != last_batch:
                last_batch, last_change = progress["batchId"], time.monotonic()
            elif last_change is not None and time.monotonic() - last_change > args.idle:
                break
        query.stop()
        if query.exception() is not None:
            raise SystemExit(f"the query failed: {query.exception()}")
    for (host, level), count in sorted(totals(spark, out).items()):
        print(f"{host:8} {level:6} {count}")
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
