"""Produce synthetic log lines into a pzq queue, one message per line, for the pzq pipeline:

    pzq --mode stream --database /tmp/pzq-logs &
    python examples/produce_logs_pzq.py --lines 20000

Each message is one line of ``examples/make_logs.py`` (``<ISO time> <host> <LEVEL> <message>``,
without the newline). The script returns once the queue has ACKed every message (stored
durably, as the queue's ``sync`` says), and prints how many it produced.
"""

from __future__ import annotations

import argparse
import random
import sys
import time

from make_logs import make_line

from pzq import Producer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--endpoint", default="tcp://127.0.0.1:11131",
                        help="the queue's receive endpoint (default: tcp://127.0.0.1:11131)")
    parser.add_argument("--lines", type=int, default=10_000, help="how many lines (default 10000)")
    parser.add_argument("--rate", type=float, default=0.0,
                        help="lines per second (default: as fast as possible)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=30.0,
                        help="seconds to wait for the queue's ACKs (default 30)")
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    with Producer(args.endpoint, window=256) as producer:
        for _ in range(args.lines):
            producer.send(make_line(rng).encode(), timeout=args.timeout)
            if args.rate > 0:
                time.sleep(1.0 / args.rate)
        producer.flush(timeout=args.timeout)  # every message ACKed, or an error
    print(f"produced {args.lines} log lines into {args.endpoint}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
