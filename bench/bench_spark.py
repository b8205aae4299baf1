"""Throughput of format("zpipes") with a local Spark (PySpark 4, local[*]) against a broker.

    python bench/bench_spark.py             # 1 M lines
    python bench/bench_spark.py --quick     # 100 k lines, 50 k messages, for a smoke run

Measures, in lines (rows) per second:

* stream source: lines written into a pipe, read by a streaming query that counts them per
  level (a streaming aggregation), from the first line written until the query has them all;
* batch source: ``spark.read.format("zpipes")...count()`` of a pipe fed by one writer, against
  ``spark.read.text(file).count()`` of the same lines in a file;
* batch sink: ``spark.range(n)`` as strings written with ``format("zpipes")`` (2 partitions),
  read by ``zpipes read > /dev/null``;
* messages/s from queue into a Spark aggregation: ``--messages`` (default 200 000) 100-byte
  log messages produced into a stream-mode ``pzq`` (its own process, loopback), then a streaming
  count per level over ``format("pzq")`` with ``trigger(availableNow=True)``, timed from the
  query's start until it has read them all (the produce rate is printed too).

The machine is noisy: compare within one run. Needs ``pip install 'zbroker[spark]'`` and Java.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from bench_pipes import start_broker  # noqa: E402

import zpipes  # noqa: E402

LEVELS = ["DEBUG", "INFO", "WARN", "ERROR"]


def log_lines(n: int) -> bytes:
    return b"".join(b"2026-11-22T10:00:00.000Z web-%d %s request %d\n"
                    % (i % 4, LEVELS[i % 4].encode(), i) for i in range(n))


def feed(pipe: str, broker: str, data: bytes) -> threading.Thread:
    def run() -> None:
        with zpipes.open(pipe, "w", broker=broker) as w:
            w.write(data)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def rate(what: str, n: int, seconds: float) -> None:
    print(f"{what:52} {n:>9} lines {seconds:7.2f} s {n / seconds:>11,.0f} lines/s")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def message_bodies(n: int) -> list[bytes]:
    """``n`` log lines of exactly 100 bytes."""
    return [(b"2026-11-22T10:00:00.000Z web-%d %s request %d " % (i % 4, LEVELS[i % 4].encode(), i))
            .ljust(100, b".") for i in range(n)]


def bench_pzq_source(spark: Any, tmp: Path, n: int) -> None:
    """Produce ``n`` 100-byte messages into a stream queue, then time a streaming count per
    level over format("pzq") with availableNow until all are consumed."""
    from pzq.client import Producer, StreamConsumer

    receive = f"tcp://127.0.0.1:{free_port()}"
    stream_dsn = f"tcp://127.0.0.1:{free_port()}"
    env = dict(os.environ)
    proc = subprocess.Popen(
        [sys.executable, "-m", "zbroker.services.pzq", "--mode", "stream",
         "--database", str(tmp / "pzq"),
         "--receive-dsn", receive, "--send-dsn", f"tcp://127.0.0.1:{free_port()}",
         "--stream-dsn", stream_dsn, "--monitor-dsn", f"ipc://{tmp}/pzq-monitor",
         "--log-level", "warning"], stdin=subprocess.DEVNULL, env=env)
    try:
        with StreamConsumer(stream_dsn, timeout=10) as consumer:
            consumer.offsets()  # waits (with retries) until the queue answers
        bodies = message_bodies(n)
        t = time.perf_counter()
        with Producer(receive, window=1024) as producer:
            for body in bodies:
                producer.send(body, timeout=60)
            producer.flush(timeout=60)
        seconds = time.perf_counter() - t
        print(f"{'pzq: produce 100-byte messages (ACKed)':52} {n:>9} msgs  "
              f"{seconds:7.2f} s {n / seconds:>11,.0f} msg/s")

        events = (spark.readStream.format("pzq").option("stream_endpoint", stream_dsn)
                  .option("max_messages_per_batch", "100000").option("partitions", "2").load())
        level = events.selectExpr("split(cast(body AS string), ' ')[2] AS level")
        t = time.perf_counter()
        query = (level.groupBy("level").count().writeStream.outputMode("complete")
                 .format("memory").queryName("pzq_levels")
                 .option("checkpointLocation", str(tmp / "pzq-ckpt"))
                 .trigger(availableNow=True).start())
        query.awaitTermination(600)
        seconds = time.perf_counter() - t
        if query.exception() is not None:
            raise SystemExit(f"query failed: {query.exception()}")
        total = spark.sql("SELECT sum(count) FROM pzq_levels").first()[0]
        assert total == n, total
        print(f"{'pzq source -> streaming count, availableNow':52} {n:>9} msgs  "
              f"{seconds:7.2f} s {n / seconds:>11,.0f} msg/s")
    finally:
        proc.terminate()
        proc.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--messages", type=int, default=200_000,
                        help="messages for the pzq figure (default 200000)")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    n = 100_000 if args.quick else args.lines
    messages = 50_000 if args.quick else args.messages

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO),
                                                             os.environ.get("PYTHONPATH")]))
    from pyspark.sql import SparkSession

    from zbroker.spark import register
    from zbroker.spark.lines import hold_pipe_open

    broker = f"bench-{uuid.uuid4().hex[:8]}"
    proc = start_broker(broker)
    tmp = Path(tempfile.mkdtemp(prefix="bench-spark-"))
    t = time.perf_counter()
    spark = (SparkSession.builder.master("local[*]").appName("bench-spark")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.driver.host", "127.0.0.1")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    print(f"SparkSession started in {time.perf_counter() - t:.1f} s; {n} lines, "
          f"{os.cpu_count()} cores")
    data = log_lines(n)
    try:
        # Warm up the Python workers and the data source's planning processes.
        feed("warm", broker, log_lines(10))
        spark.read.format("zpipes").option("pipe", "warm").option("broker", broker).load().count()
        reader = subprocess.Popen([sys.executable, "-m", "zpipes", "read", "warm-sink",
                                   "--broker", broker], stdout=subprocess.DEVNULL)
        with hold_pipe_open("warm-sink", broker=broker):
            spark.range(10, numPartitions=2).selectExpr("CAST(id AS STRING) AS value").write \
                .format("zpipes").option("pipe", "warm-sink").option("broker", broker) \
                .mode("append").save()
        reader.wait(60)

        # --- stream source into a streaming aggregation
        stream = (spark.readStream.format("zpipes").option("pipe", "stream")
                  .option("broker", broker).option("max_lines_per_batch", "200000").load())
        level = stream.selectExpr("split(value, ' ')[2] AS level")
        query = (level.groupBy("level").count().writeStream.outputMode("complete")
                 .format("memory").queryName("levels")
                 .option("checkpointLocation", str(tmp / "ckpt")).start())
        while not query.recentProgress:
            time.sleep(0.05)
        t = time.perf_counter()
        writer = feed("stream", broker, data)
        while sum(p["numInputRows"] for p in query.recentProgress) < n:
            if query.exception() is not None:
                raise SystemExit(f"query failed: {query.exception()}")
            time.sleep(0.02)
        seconds = time.perf_counter() - t
        writer.join()
        query.stop()
        total = spark.sql("SELECT sum(count) FROM levels").first()[0]
        assert total == n, total
        rate("stream source -> streaming count per level", n, seconds)

        # --- batch source, against a file
        t = time.perf_counter()
        writer = feed("batch", broker, data)
        count = (spark.read.format("zpipes").option("pipe", "batch").option("broker", broker)
                 .load().count())
        seconds = time.perf_counter() - t
        writer.join()
        assert count == n, count
        rate('batch source: read.format("zpipes").count()', n, seconds)
        path = tmp / "lines.txt"
        path.write_bytes(data)
        t = time.perf_counter()
        count = spark.read.text(str(path)).count()
        rate("baseline: read.text(file).count()", count, time.perf_counter() - t)

        # --- batch sink, read by `zpipes read`
        reader = subprocess.Popen([sys.executable, "-m", "zpipes", "read", "sink",
                                   "--broker", broker], stdout=subprocess.DEVNULL)
        df = spark.range(n, numPartitions=2).selectExpr(
            "concat('2026-11-22T10:00:00.000Z web-1 INFO request ', id) AS value")
        t = time.perf_counter()
        with hold_pipe_open("sink", broker=broker):
            df.write.format("zpipes").option("pipe", "sink").option("broker", broker) \
                .mode("append").save()
        reader.wait(600)
        rate('batch sink: write.format("zpipes") -> zpipes read', n, time.perf_counter() - t)

        # --- messages/s from a pzq stream queue into a streaming aggregation
        bench_pzq_source(spark, tmp, messages)
    finally:
        spark.stop()
        proc.terminate()
        proc.wait(10)


if __name__ == "__main__":
    main()
