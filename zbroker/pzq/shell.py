"""``zbroker queue put|get NAME``: a broker's pzq queue from the shell.

    printf 'a\\nb\\n' | zbroker queue put jobs          # one message per line
    zbroker queue put jobs --file report.pdf            # one message per file
    zbroker queue get jobs --count 2                    # prints one message per line

The queue's endpoints come from the broker's config file (the same search as the broker's,
or --config), or from --receive / --send. ``get`` ACKs a message only after it is written to
standard output. Messages pushed to it beyond --count are not ACKed: the queue delivers them
again when they time out, or at once if no other consumer is connected.
Exit status: 0 done, 1 failure (unknown queue, refused message, timeout).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import zmq

from zbroker.config import ConfigError, load_config

from .client import Consumer, Producer, ProducerError


def _error(message: str) -> int:
    print(f"zbroker queue: {message}", file=sys.stderr)
    return 1


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="zbroker queue",
                                description="Put messages into, or get them from, a pzq queue.")
    sub = p.add_subparsers(dest="action", required=True)
    for name, what in (("put", "send messages (one per line of standard input, or per file)"),
                       ("get", "receive messages, print them, ACK them")):
        s = sub.add_parser(name, help=what, description=what)
        s.add_argument("queue", metavar="NAME", help="the queue's name in the config")
        s.add_argument("--config", "-c", metavar="FILE", help="the broker's config file")
        s.add_argument("--timeout", type=float, default=10.0,
                       help="seconds to wait for the queue (default %(default)s)")
        if name == "put":
            s.add_argument("--receive", metavar="ENDPOINT", help="the producers' endpoint")
            s.add_argument("--file", "-f", action="append", default=[], metavar="PATH",
                           help="send this file as one message (repeatable)")
            s.add_argument("--whole", action="store_true",
                           help="send all of standard input as one message")
        else:
            s.add_argument("--send", metavar="ENDPOINT", help="the consumers' endpoint")
            s.add_argument("--count", "-n", type=int, default=1,
                           help="messages to get (default 1; 0: until none comes within "
                                "--timeout)")
    return p


def _endpoints(args: argparse.Namespace) -> tuple[str, str]:
    given = getattr(args, "receive", None) or getattr(args, "send", None)
    if given:
        return given, given
    config = load_config(args.config)
    queues = config.services.pzq.queue_configs()
    q = queues.get(args.queue)
    if q is None:
        raise ConfigError(f"no queue {args.queue!r} in the config (queues: "
                          f"{', '.join(queues)})")
    return q.receive_endpoint, q.send_endpoint


def main(argv: Sequence[str]) -> int:
    args = parser().parse_args(argv)
    try:
        receive, send = _endpoints(args)
    except ConfigError as exc:
        return _error(str(exc))
    if args.action == "put":
        return _put(args, receive)
    return _get(args, send)


def _put(args: argparse.Namespace, endpoint: str) -> int:
    if args.file:
        bodies = []
        for path in args.file:
            try:
                with open(path, "rb") as f:
                    bodies.append(f.read())
            except OSError as exc:
                return _error(f"cannot read {path!r}: {exc.strerror or exc}")
    elif args.whole:
        bodies = [sys.stdin.buffer.read()]
    else:
        bodies = [line.rstrip(b"\n") for line in sys.stdin.buffer]
    with Producer(endpoint, window=64, retry_timeout=max(1.0, args.timeout / 3)) as p:
        try:
            for body in bodies:
                p.send(body, timeout=args.timeout)
            p.flush(args.timeout)
        except TimeoutError:
            return _error(f"no ACK from {endpoint} within {args.timeout:g}s "
                          f"({len(p.outstanding)} message(s) unconfirmed)")
        except ProducerError as exc:
            return _error(str(exc))
    return 0


def _get(args: argparse.Namespace, endpoint: str) -> int:
    got = 0
    out = sys.stdout.buffer
    with Consumer(endpoint, rcvhwm=1) as c:
        try:
            while args.count <= 0 or got < args.count:
                m = c.recv(args.timeout)
                if m is None:
                    break
                out.write(m.body + b"\n")
                out.flush()
                c.ack(m)
                got += 1
        except (BrokenPipeError, zmq.ZMQError) as exc:
            return _error(str(exc))
    if got == 0 or (args.count > 0 and got < args.count):
        return _error(f"{got} of {args.count or 'any'} message(s) within {args.timeout:g}s")
    return 0
