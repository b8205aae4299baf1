"""Where one message's time goes in a pzq queue: a windowed producer and a consumer of the
original wire against a real ``pzq`` process, each message timed at four points.

    send            the producer sends it (its wall clock)
    arrive          the queue takes it (the arrival time in µs that starts its key)
    consumer        the consumer has it
    producer ACK    the producer has its "1"

and the percentiles of each leg printed, with the rate. One clock for the three processes
(the same machine). Use it to see whether the producer's window is spent on the way in, on
the way to a consumer, or waiting for the answer (the consumer's ACK or the fdatasync)::

    python bench/pzq_latency.py --size 65536 --window 16 --messages 6000
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import shutil
import sys
import tempfile
import time
from pathlib import Path

import zmq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_pzq import monitor, start_pzq  # noqa: E402
from pzq_load import ack_arrived, produce_windowed  # noqa: E402


def produce(endpoint: str, n: int, size: int, window: int, out) -> None:
    """Wall-clock stamps, to compare with the queue's and the consumer's."""
    produced = produce_windowed(endpoint, n, size, window, start=time.time() + 0.5,
                                clock=time.time)  # (the consumer connects meanwhile)
    out.send(produced.stamps)


def consume(endpoint: str, n: int, out) -> None:
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.connect(endpoint)
    got = []
    while len(got) < n:
        if not s.poll(20_000):
            raise SystemExit(f"consumer: nothing for 20 s after {len(got)} messages")
        now = time.time()
        got.extend((int(key[:key.index(b"|")]) * 1e-6, now) for key in ack_arrived(s))
    s.close(linger=200)
    ctx.term()
    out.send(got)


def percentiles(values: list[float]) -> str:
    v = sorted(values)
    return "  ".join(f"p{p} {v[min(len(v) - 1, len(v) * p // 100)] * 1e3:6.2f}"
                     for p in (10, 50, 90, 99)) + " ms"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, default=65536, help="bytes a message (default 64 KiB)")
    ap.add_argument("--window", type=int, default=16, help="messages the producer keeps "
                    "unACKed (default 16: 1 MiB of 64 KiB messages)")
    ap.add_argument("--messages", type=int, default=6000)
    ap.add_argument("--sync-window", type=int, default=2000, metavar="US")
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="pzq-latency-"))
    proc, receive, send, _, mon = start_pzq(base / "q", "batch", args.sync_window, None)
    try:
        ctx = mp.get_context("fork")
        (p_in, p_out), (c_in, c_out) = ctx.Pipe(False), ctx.Pipe(False)
        consumer = ctx.Process(target=consume, args=(send, args.messages, c_out))
        producer = ctx.Process(target=produce, args=(receive, args.messages, args.size,
                                                     args.window, p_out))
        consumer.start()
        producer.start()
        if not p_in.poll(300) or not c_in.poll(60):
            raise SystemExit("timed out")
        sends, deliveries = p_in.recv(), c_in.recv()
        producer.join(10)
        consumer.join(10)
        counters = monitor(mon)
    finally:
        proc.terminate()
        proc.wait(20)
        shutil.rmtree(base, ignore_errors=True)
    # one producer connection: the queue takes its messages in the order they were sent
    sends.sort()
    deliveries.sort()
    legs = [(arrive - t0, got - arrive, acked - got, acked - t0)
            for (t0, acked), (arrive, got) in zip(sends, deliveries, strict=True)]
    legs = legs[len(legs) // 10:]  # past the start
    rate = len(sends) / (max(a for _, a in sends) - min(t for t, _ in sends))
    print(f"{args.size} B, window {args.window}: {rate:,.0f} msg/s, "
          f"{counters.get('avoided_messages', 0)} of {args.messages} never written")
    for i, leg in enumerate(("send -> queue takes it", "-> consumer has it",
                             "-> producer has its ACK", "send -> producer ACK")):
        print(f"  {leg:24} {percentiles([x[i] for x in legs])}")


if __name__ == "__main__":
    main()
