"""``zbroker queue put NAME``: messages into a queue, one per line of standard input, one per
file (--file), or all of standard input as one (--whole); each resent until the queue ACKs it."""

from __future__ import annotations

import argparse
import sys

from pzq.client import Producer, ProducerError
from zbroker.command import seconds_argument
from zpipes import progress

from .common import error
from .location import where_options

PUT_WINDOW = 1024  # messages unACKed on the batch path
PUT_BATCH = 256  # messages in one batch

WHAT = "send messages (one per line of standard input, or per file)"

EPILOG = """\
Each message is sent with an id and resent until the queue ACKs it; exit status 0 once every
message is ACKed (stored, as the queue's sync mode says), 1 if one is refused or not ACKed
within --timeout. Push and stream queues take messages the same way. Messages go in batches
of up to 256 (one record in the queue's log, all or none); --no-batch sends them one at a
time on the original pzq wire (for the original pzq).

examples:
  printf 'a\\nb\\n' | zbroker queue put jobs      two messages
  zbroker queue put jobs -f a.pdf -f b.pdf       two messages, one per file
  tar c dir | zbroker queue put jobs --whole     one message"""


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``put``'s parser, among ``zbroker queue``'s actions (``sub``: their subparsers)."""
    s = sub.add_parser("put", prog="zbroker queue put", help=WHAT, description=WHAT,
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("queue", metavar="NAME", help="the queue's name (services.pzq.queues)")
    where_options(s)
    s.add_argument("--timeout", type=seconds_argument, default=10.0, metavar="SECONDS",
                   help="seconds to wait for the queue's ACKs (default %(default)s)")
    s.add_argument("--receive", metavar="ENDPOINT",
                   help="the producers' endpoint (no broker or config lookup)")
    s.add_argument("--file", "-f", action="append", default=[], metavar="PATH",
                   help="send this file as one message (repeatable)")
    s.add_argument("--whole", action="store_true",
                   help="send all of standard input as one message")
    s.add_argument("--no-batch", action="store_true",
                   help="one message per ZeroMQ message (the original wire, for "
                        "the original pzq); default: batches of up to 256")
    s.add_argument("--progress", action="store_true",
                   help="show messages and bytes sent, rate, elapsed time, percent "
                        "and time left on standard error, like pv (also "
                        f"{progress.ENV}=1)")


def put(args: argparse.Namespace, endpoint: str) -> int:
    """Send the messages to the producers' ``endpoint``; the exit status."""
    if args.file:
        bodies = []
        for path in args.file:
            try:
                with open(path, "rb") as f:
                    bodies.append(f.read())
            except OSError as exc:
                return error(f"cannot read {path!r}: {exc.strerror or exc}")
    elif args.whole:
        bodies = [sys.stdin.buffer.read()]
    else:
        bodies = [line.rstrip(b"\n") for line in sys.stdin.buffer]
    meter = progress.Progress(label="zbroker queue put:", total=len(bodies),
                              unit="messages") if progress.wanted(args.progress) else None
    with Producer(endpoint, window=64 if args.no_batch else PUT_WINDOW,
                  batch=0 if args.no_batch else PUT_BATCH,
                  retry_timeout=max(1.0, args.timeout / 3)) as p:
        try:
            for body in bodies:
                p.send(body, timeout=args.timeout)
                if meter is not None:
                    meter.add(len(body), 1)
            p.flush(args.timeout)
        except TimeoutError:
            _finish(meter)
            return error(f"no ACK from {endpoint} within {args.timeout:g}s "
                         f"({p.inflight} message(s) unconfirmed)")
        except ProducerError as exc:
            _finish(meter)
            return error(str(exc))
    _finish(meter)
    return 0


def _finish(meter: progress.Progress | None) -> None:
    if meter is not None:
        meter.finish()
