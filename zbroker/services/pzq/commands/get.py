"""``zbroker queue get NAME``: a queue's messages on standard output, one per line.

A push queue's message is ACKed only after it is written to standard output; messages pushed
beyond --count are not ACKed: the queue delivers them again when they time out, or at once if no
other consumer is connected (on a credit endpoint, at most --count are held, and those beyond
are given back at once). A stream queue's messages are read from the committed offset (reader
group --group's, or the default group's), and each batch COMMITted once it is written and
flushed to standard output: an interrupted ``get`` may print a batch again next time, it never
loses one (at-least-once). Offsets that the queue's retention limits dropped before the group
committed them are named in one line on standard error.
"""

from __future__ import annotations

import argparse
import sys
import time

import zmq

from pzq import wire
from pzq.client import Consumer, StreamConsumer, StreamError
from zbroker.command import seconds_argument

from .common import error, group_name, output_failed, try_timeout
from .location import QueueInfo, where_options

STREAM_BATCH = 1000  # messages printed, then committed, at a time (what a crash may repeat)
GET_WINDOW = 1024  # messages a get holds at once on a credit endpoint (at most --count)
GET_WINDOW_BYTES = 1 << 20

WHAT = "print messages, one per line, then ACK (push) or COMMIT (stream) them"

EPILOG = """\
push queues (mode: push):
  Each message is ACKed once it is written to standard output. Messages pushed beyond
  --count are not ACKed: the queue delivers them again (at once if no other consumer is
  connected, else after its ack_timeout).

stream queues (mode: stream):
  Messages are read in offset order from the committed offset, printed a batch at a time,
  and the batch is COMMITted once standard output has been flushed: the next get goes on
  after it. A get stopped before the COMMIT (Ctrl-C, a closed pipe, a full disk, a crash)
  prints that batch again next time, it never loses it (at-least-once). --no-commit and
  --from-offset only look (the committed offset stays where it is).

reader groups (stream queues):
  --group G reads from, and commits, group G's own committed offset: every group sees every
  message, and its commits move only its own offset (without --group: the "default" group's,
  shared with every reader that names no group). A new group starts at the oldest message the
  queue holds. If the queue's retention limits (retention_bytes, retention_seconds) dropped
  messages before G committed them, one line on standard error names their offsets (the exit
  status does not change). `zbroker queue group list NAME` shows the groups and their lag.

where the queue is:
  The running broker's status says the queue's mode and endpoints (the broker found as
  `zbroker status` finds it: --config, --broker, --run-dir). If no broker answers, the
  config file says them. --send ENDPOINT (push) or --stream ENDPOINT (stream) skip both.

exit status:
  0 done (with --count 0, also when there was nothing to get); 1 fewer messages than --count
  came within --timeout (what came is printed), or the queue is unknown, unreachable or
  refused a request; 2 usage error; 130 interrupted.

examples:
  zbroker queue get jobs                      one message, waiting up to 10 s for it
  zbroker queue get jobs -n 0 -t 1            messages until none comes for 1 s
  zbroker queue get events -n 0 -t 0          all a stream queue holds now, committed
  zbroker queue get events -n 0 -t 0 --no-commit    the same, only looking
  zbroker queue get events -n 0 -t 0 --group archive   all that group "archive" has not
                                                       committed yet, then committed for it"""


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``get``'s parser, among ``zbroker queue``'s actions (``sub``: their subparsers)."""
    s = sub.add_parser("get", prog="zbroker queue get", help=WHAT, description=WHAT,
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("queue", metavar="NAME", help="the queue's name (services.pzq.queues)")
    where_options(s)
    s.add_argument("--count", "-n", type=_count, default=1, metavar="N",
                   help="messages to get (default 1; 0: until none comes within "
                        "--timeout)")
    s.add_argument("--timeout", "--wait", "-t", type=seconds_argument, default=10.0,
                   metavar="SECONDS",
                   help="seconds to wait for each message (default %(default)s; a "
                        "stream queue's messages already there come at once)")
    where = s.add_mutually_exclusive_group()
    where.add_argument("--send", metavar="ENDPOINT",
                       help="a push queue's consumers' endpoint (no broker or config "
                            "lookup)")
    where.add_argument("--stream", metavar="ENDPOINT",
                       help="a stream queue's stream endpoint (no broker or config "
                            "lookup)")
    s.add_argument("--no-commit", action="store_true",
                   help="stream queues: print without committing (a later get "
                        "prints the same messages)")
    s.add_argument("--from-offset", type=_offset, metavar="OFFSET",
                   help="stream queues: start at this offset instead of the committed "
                        "one; implies --no-commit")
    s.add_argument("--group", "-g", type=group_name, metavar="G",
                   help="stream queues: read and commit as reader group G (its own "
                        "committed offset; made at the oldest message if new)")


def _offset(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = -1
    if not 0 <= n <= wire.MAX_OFFSET:
        raise argparse.ArgumentTypeError(f"expected an offset from 0 to {wire.MAX_OFFSET}, "
                                         f"got {text!r}")
    return n


def _count(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected a number of messages (0 or more), "
                                         f"got {text!r}")
    return n


def get(args: argparse.Namespace, info: QueueInfo) -> int:
    """Get the messages from the queue ``info`` says, as its mode asks; the exit status."""
    if info.mode == "stream":
        assert info.stream is not None
        return _get_stream(args, info)
    if args.no_commit or args.from_offset is not None or args.group is not None:
        return error(f"queue {args.queue!r} is a push queue: --no-commit, --from-offset "
                     "and --group are for stream queues", 2)
    if info.credit:  # batches, never more than --count held: none left waiting on exit
        return _get_batches(args, info.credit, info.note)
    assert info.send is not None
    return _get(args, info.send, info.note)


def _shortfall(args: argparse.Namespace, got: int, note: str = "") -> int:
    """Exit status 1 if fewer than ``--count`` messages came; with ``--count 0`` (all there
    is) none is no error (said on standard error), as ``cat`` of an empty file is none."""
    if args.count == 0 and got == 0:
        print(f"zbroker queue: queue {args.queue!r} had no message to get", file=sys.stderr)
        return 0
    if args.count == 0 or got >= args.count:
        return 0
    if got == 0:
        what = "no message" if args.count == 1 else f"none of the {args.count} messages"
    else:
        what = f"only {got} of the {args.count} messages"
    return error(f"{what} came within {args.timeout:g}s" + (f"; {note}" if note and got == 0
                                                            else ""))


def _get(args: argparse.Namespace, endpoint: str, note: str = "",
         credit: int | None = None) -> int:
    got = 0
    out = sys.stdout.buffer
    with Consumer(endpoint, rcvhwm=1, credit=credit) as c:
        try:
            while args.count <= 0 or got < args.count:
                m = c.recv(args.timeout)
                if m is None:
                    break
                out.write(m.body + b"\n")
                out.flush()
                c.ack(m)
                got += 1
        except OSError as exc:
            return error(output_failed(exc))
        except zmq.ZMQError as exc:
            return error(str(exc))
    return _shortfall(args, got, note)


def _get_batches(args: argparse.Namespace, endpoint: str, note: str = "") -> int:
    """A push queue's credit endpoint, the batch path: at most --count (up to GET_WINDOW)
    messages held at once, each batch printed, then ACKed in one message; what came beyond
    --count is given back at once (NACK), not left to its ACK timeout; the ACKs are durable
    (confirmed) before it exits."""
    got = 0
    out = sys.stdout.buffer
    window = GET_WINDOW if args.count <= 0 else min(args.count, GET_WINDOW)
    with Consumer(endpoint, credit=window, credit_bytes=GET_WINDOW_BYTES) as c:
        try:
            while args.count <= 0 or got < args.count:
                batch = c.recv_many(window, args.timeout)
                if not batch:
                    break
                take = batch if args.count <= 0 else batch[:args.count - got]
                out.write(b"".join(m.body + b"\n" for m in take))
                out.flush()
                c.ack_many(take)
                got += len(take)
                if len(batch) > len(take):
                    break
            # nothing more comes once the queue has this (before the NACKs, on the same
            # connection, so that they are not sent back here); once the ACKs are confirmed,
            # every delivery sent before is here: given back
            c.stop_taking()
            c.confirm(max(args.timeout, 1.0))
            for m in batch[len(take):] if batch else ():
                c.nack(m)
            while (late := c.recv_nowait()) is not None:
                c.nack(late)
        except TimeoutError as exc:
            return error(f"{got} message(s) printed, their ACKs not confirmed: {exc}")
        except OSError as exc:
            return error(output_failed(exc))
        except zmq.ZMQError as exc:
            return error(str(exc))
    return _shortfall(args, got, note)


def _get_stream(args: argparse.Namespace, info: QueueInfo) -> int:
    """Print a stream queue's messages from the committed offset (or --from-offset), and
    COMMIT each batch once it is flushed to standard output."""
    endpoint = info.stream
    assert endpoint is not None
    commit = not args.no_commit and args.from_offset is None
    out = sys.stdout.buffer
    got = 0
    per_try = try_timeout(args.timeout)
    told: list[tuple[int, int] | None] = [None]  # the lost offsets already named
    with StreamConsumer(endpoint, timeout=per_try, retries=2, group=args.group) as s:
        try:
            pos = s.committed() if args.from_offset is None else args.from_offset
            _tell_lost(args, s, told)
            deadline = time.monotonic() + args.timeout
            pause = 0.01
            while args.count <= 0 or got < args.count:
                want = STREAM_BATCH if args.count <= 0 else min(STREAM_BATCH, args.count - got)
                r = s.range(pos, wire.MAX_OFFSET, max_messages=want)
                _tell_lost(args, s, told)
                if not r.messages:
                    if r.next > pos:
                        pos = r.next  # a gap of failed writes: go on at once
                        continue
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    time.sleep(min(pause, left))  # nothing new yet: ask again shortly
                    pause = min(pause * 2, 0.2)
                    continue
                try:
                    for m in r.messages:
                        out.write(m.body + b"\n")
                    out.flush()
                except OSError as exc:
                    # Not committed: the next get prints this batch again.
                    return error(output_failed(exc))
                got += len(r.messages)
                pos = r.next  # [old pos, next): printed, or no message there
                if commit:
                    s.commit(pos)
                    _tell_lost(args, s, told)
                deadline = time.monotonic() + args.timeout
                pause = 0.01
        except TimeoutError:
            what = (f"no answer from the stream endpoint {endpoint} within "
                    f"{per_try * 3:g}s")
            if got:
                what += f" ({got} message(s) printed; the last batch may come again)"
            return error(what + (f"; {info.note}" if info.note else ""))
        except StreamError as exc:
            return error(f"the queue refused a request: {exc}")
    return _shortfall(args, got, info.note)


def _tell_lost(args: argparse.Namespace, s: StreamConsumer,
               told: list[tuple[int, int] | None]) -> None:
    """Name, once, the offsets the queue's last answer says the group lost to retention."""
    lost = s.lost
    if lost is not None and lost != told[0]:
        told[0] = lost
        error(f"group {args.group!r} lost offsets {lost[0]} to {lost[1] - 1} of queue "
              f"{args.queue!r}: the queue's retention limits dropped them before the group "
              "committed them")

