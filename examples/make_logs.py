"""Print synthetic log lines to standard output, for the Spark example pipeline:

    python examples/make_logs.py --lines 20000 | zpipes write logs

Each line: ``<ISO time> <host> <LEVEL> <message>``, e.g.
``2026-11-22T10:00:00.123Z web-2 ERROR request failed``.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from datetime import UTC, datetime

HOSTS = [f"web-{i}" for i in range(1, 5)] + ["db-1", "cache-1"]
LEVELS = ["DEBUG"] * 30 + ["INFO"] * 55 + ["WARN"] * 10 + ["ERROR"] * 5
MESSAGES = ["request served", "cache miss", "slow query", "request failed", "retrying",
            "connection reset", "user logged in"]


def make_line(rng: random.Random) -> str:
    now = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return f"{now} {rng.choice(HOSTS)} {rng.choice(LEVELS)} {rng.choice(MESSAGES)}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=10_000, help="how many lines (default 10000)")
    parser.add_argument("--rate", type=float, default=0.0,
                        help="lines per second (default: as fast as possible)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    out = sys.stdout
    for i in range(args.lines):
        out.write(make_line(rng) + "\n")
        if args.rate > 0:
            out.flush()
            time.sleep(1.0 / args.rate)
        elif i % 1000 == 999:
            out.flush()
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
