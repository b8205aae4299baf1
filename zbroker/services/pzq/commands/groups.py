"""``zbroker queue group create|list|delete NAME [G]``: a stream queue's reader groups, each
with its own committed offset: made before it reads, listed with their lags, forgotten."""

from __future__ import annotations

import argparse
import json
import sys

from pzq.client import StreamConsumer, StreamError
from zbroker.command import seconds_argument

from .common import error, group_name, output_failed, try_timeout
from .location import QueueInfo, where_options

WHAT = "create, list or delete a stream queue's reader groups"

EPILOG = """\
A stream queue's readers are in groups, each with its own committed offset (readers that name
no group are in the "default" group). A group is made by its first reader (`zbroker queue get
NAME --group G`, or a Spark query with the option group), or by `create`, at the oldest message
the queue holds; the queue keeps a message until every group has committed it (or its retention
limits drop it). So a group made after the others committed messages never sees those: make
every group before its messages are read (a new queue has no group, and keeps all it gets until
the first comes).

  create   make group G, reading nothing (nothing happens if it exists)
  list     each group, its committed offset and its lag (the offsets from it to the
           head: lag = head - committed); --json for scripts; makes no group
  delete   forget group G: its committed offset no longer holds messages on the queue (a later
           reader of G makes it again, at the oldest message then)

where the queue is: as for `zbroker queue get` (the running broker's status, else the config;
--stream ENDPOINT names a stream endpoint directly).

exit status:
  0 done; 1 an unknown queue or group, an unreachable queue or a refused request; 2 a usage
  error (a push queue, a bad group name).

examples:
  zbroker queue group create events archive   before the producers start
  zbroker queue group list events             GROUP  COMMITTED  LAG
  zbroker queue group list events --json      {"queue": "events", "head": ..., "groups": {...}}
  zbroker queue group delete events archive"""



def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``group``'s parser, with its own actions, among ``zbroker queue``'s (``sub``: their
    subparsers)."""
    g = sub.add_parser("group", prog="zbroker queue group", help=WHAT, description=WHAT,
                       usage="%(prog)s list NAME [--json] [options]\n"
                             "       %(prog)s create|delete NAME G [options]",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    gsub = g.add_subparsers(dest="group_action", required=True, metavar="create|list|delete",
                            title="actions")
    for name, what in (("create", "make group G at the oldest message, reading nothing"),
                       ("list", "each group, its committed offset and its lag"),
                       ("delete", "delete group G (its committed offset then holds nothing)")):
        s = gsub.add_parser(name, prog=f"zbroker queue group {name}", help=what,
                            description=f"{what}. `zbroker queue group --help` says more.")
        s.add_argument("queue", metavar="NAME", help="the stream queue's name")
        if name != "list":
            s.add_argument("group", metavar="G", type=group_name, help=f"the group to {name}")
        else:
            s.add_argument("--json", action="store_true", help="one JSON object, for scripts")
        where_options(s)
        s.add_argument("--stream", metavar="ENDPOINT",
                       help="the queue's stream endpoint (no broker or config lookup)")
        s.add_argument("--timeout", "-t", type=seconds_argument, default=10.0,
                       metavar="SECONDS",
                       help="seconds to wait for the queue's answer (default %(default)s)")


def groups(args: argparse.Namespace, info: QueueInfo) -> int:
    """``group create``, ``group list`` and ``group delete`` on the queue ``info`` says; the
    exit status."""
    if info.mode != "stream":
        return error(f"queue {args.queue!r} is a push queue: reader groups are for "
                     "stream queues (mode: stream)", 2)
    endpoint = info.stream
    assert endpoint is not None
    per_try = try_timeout(args.timeout)
    try:
        if args.group_action != "list":
            with StreamConsumer(endpoint, timeout=per_try, retries=2, group=args.group) as s:
                if args.group_action == "delete":
                    s.delete_group()
                else:
                    s.head()  # a group's first request makes it (durably, before the answer)
            return 0
        with StreamConsumer(endpoint, timeout=per_try, retries=2) as s:
            head, offsets = s.group_offsets()
    except TimeoutError:
        return error(f"no answer from the stream endpoint {endpoint} within {per_try * 3:g}s"
                     + (f"; {info.note}" if info.note else ""))
    except StreamError as exc:
        if args.group_action != "list":
            return error(f"cannot {args.group_action} group {args.group!r} of queue "
                         f"{args.queue!r}: {exc}")
        return error(f"the queue refused a request: {exc}")
    rows = {name: {"committed": c, "lag": max(0, head - c)}
            for name, c in sorted(offsets.items())}
    if args.json:
        text = json.dumps({"queue": args.queue, "head": head, "groups": rows}) + "\n"
    else:
        width = max([5, *(len(name) for name in rows)])
        text = "".join(f"{name:<{width}}  {committed:>12}  {lag:>12}\n" for name, committed, lag
                       in [("GROUP", "COMMITTED", "LAG"),
                           *((n, r["committed"], r["lag"]) for n, r in rows.items())])
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except OSError as exc:  # a closed pipe, a full disk
        return error(output_failed(exc))
    return 0
