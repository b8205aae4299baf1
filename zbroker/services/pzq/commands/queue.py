"""``zbroker queue put|get|group ...``: a broker's pzq queue from the shell; the command's
parser, and which action runs (put.py, get.py, groups.py; location.py finds the queue).

    printf 'a\\nb\\n' | zbroker queue put jobs          # one message per line
    zbroker queue put jobs --file report.pdf            # one message per file
    zbroker queue get jobs --count 2                    # prints one message per line
    zbroker queue get events --count 0 --timeout 0      # a stream queue: all there is now
    zbroker queue get events -n 0 -t 0 --group archive  # the same, as reader group "archive"
    zbroker queue group create events archive           # a reader group, before it reads
    zbroker queue group list events                     # its groups, committed offsets, lags
    zbroker queue group delete events archive           # a group no longer holds messages

The queue's mode and endpoints come from the running broker (its status, asked on its control
socket, found as ``zbroker status`` finds it: --config, --broker, --run-dir); when no broker
answers there, from its config file (the same search as the broker's, or --config). --receive,
--send or --stream name an endpoint directly (a standalone pzq) and skip both.

``get`` on a push queue ACKs a message only after it is written to standard output. Messages
pushed to it beyond --count are not ACKed: the queue delivers them again when they time out,
or at once if no other consumer is connected. ``get`` on a stream queue reads from the
committed offset and COMMITs each batch once it is written and flushed to standard output:
an interrupted ``get`` may print a batch again next time, it never loses one (at-least-once).
``--group G`` reads from, and commits, reader group G's own committed offset (the default
group's without it); offsets that the queue's retention limits dropped before G committed them
are named in one line on standard error.
Exit status: 0 done, 1 failure (unknown queue, refused message, timeout, unreachable queue),
2 usage error, 130 interrupted.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import zmq

from zbroker.config import ConfigError

from . import get, groups, put
from .common import error
from .location import QueueInfo, lookup


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="zbroker queue",
                                usage="%(prog)s put|get NAME [options]\n"
                                      "       %(prog)s group create|list|delete NAME [G] "
                                      "[options]",
                                description="Put messages into, or get them from, a pzq queue; "
                                            "create, list or delete a stream queue's reader "
                                            "groups. `zbroker queue put --help`, `zbroker queue "
                                            "get --help` and `zbroker queue group --help` say "
                                            "more.")
    sub = p.add_subparsers(dest="action", required=True, metavar="put|get|group",
                           title="actions")
    put.add_parser(sub)
    get.add_parser(sub)
    groups.add_parser(sub)
    return p


def main(argv: Sequence[str]) -> int:
    return run(parser().parse_args(argv))


def run(args: argparse.Namespace) -> int:
    """``zbroker queue ...`` with its arguments parsed (its exit status)."""
    try:
        info = lookup(args)
    except ConfigError as exc:
        return error(str(exc))
    try:
        return _run(args, info)
    except zmq.ZMQError as exc:  # an endpoint ZeroMQ refuses (bogus, unknown transport)
        endpoint = (getattr(args, "receive", None) or getattr(args, "send", None)
                    or getattr(args, "stream", None))
        where = f"endpoint {endpoint!r}" if endpoint else f"queue {args.queue!r}"
        why = zmq.strerror(exc.errno) if exc.errno is not None else str(exc)
        return error(f"cannot connect to {where}: {why} (an endpoint "
                     "is e.g. tcp://host:port or ipc:///path)")


def _run(args: argparse.Namespace, info: QueueInfo) -> int:
    try:
        if args.action == "put":
            assert info.receive is not None
            return put.put(args, info.receive)
        if args.action == "group":
            return groups.groups(args, info)
        return get.get(args, info)
    except KeyboardInterrupt:
        return error("interrupted", 130)
