"""``zbroker queue put|get NAME``: a broker's pzq queue from the shell.

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
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq

from pzq import wire
from pzq.client import Consumer, Producer, ProducerError, StreamConsumer, StreamError
from zbroker.command import seconds_argument
from zbroker.config import ConfigError
from zbroker.locating import load_for_locating
from zbroker.management import CommandError, NotRunning, request
from zpipes import progress

STREAM_BATCH = 1000  # messages printed, then committed, at a time (what a crash may repeat)
PUT_WINDOW = 1024  # messages unACKed on the batch path
GET_WINDOW = 1024  # messages a get holds at once on a credit endpoint (at most --count)
GET_WINDOW_BYTES = 1 << 20
PUT_BATCH = 256  # messages in one batch
STATUS_TIMEOUT = 5.0  # seconds to wait for the broker's status

GET_EPILOG = """\
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

PUT_EPILOG = """\
Each message is sent with an id and resent until the queue ACKs it; exit status 0 once every
message is ACKed (stored, as the queue's sync mode says), 1 if one is refused or not ACKed
within --timeout. Push and stream queues take messages the same way. Messages go in batches
of up to 256 (one record in the queue's log, all or none); --no-batch sends them one at a
time on the original pzq wire (for the original pzq).

examples:
  printf 'a\\nb\\n' | zbroker queue put jobs      two messages
  zbroker queue put jobs -f a.pdf -f b.pdf       two messages, one per file
  tar c dir | zbroker queue put jobs --whole     one message"""


GROUP_EPILOG = """\
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


def _error(message: str, status: int = 1) -> int:
    print(f"zbroker queue: {message}", file=sys.stderr)
    return status


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


def _group(text: str) -> str:
    if wire.group_name_error(text.encode()) is not None:
        shown = repr(text if len(text) <= 40 else text[:40] + "...")
        raise argparse.ArgumentTypeError(
            f"bad group name {shown} ({len(text.encode())} bytes): a group's name is 1 to "
            f"{wire.MAX_GROUP} characters of a-z A-Z 0-9 . _ -")
    return text


def _where(s: argparse.ArgumentParser) -> None:
    """The options that find the broker, hence the queue."""
    s.add_argument("--config", "-c", metavar="FILE", help="the broker's config file")
    s.add_argument("--broker", "-b", metavar="BROKER",
                   help="the broker's name (default: broker.name of the config)")
    s.add_argument("--run-dir", metavar="DIR", help="the broker's run directory")


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
    for name, what, epilog in (
            ("put", "send messages (one per line of standard input, or per file)", PUT_EPILOG),
            ("get", "print messages, one per line, then ACK (push) or COMMIT (stream) them",
             GET_EPILOG)):
        s = sub.add_parser(name, prog=f"zbroker queue {name}", help=what, description=what,
                           epilog=epilog,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        s.add_argument("queue", metavar="NAME", help="the queue's name (services.pzq.queues)")
        _where(s)
        if name == "put":
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
        else:
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
            s.add_argument("--group", "-g", type=_group, metavar="G",
                           help="stream queues: read and commit as reader group G (its own "
                                "committed offset; made at the oldest message if new)")
    what = "create, list or delete a stream queue's reader groups"
    g = sub.add_parser("group", prog="zbroker queue group", help=what, description=what,
                       usage="%(prog)s list NAME [--json] [options]\n"
                             "       %(prog)s create|delete NAME G [options]",
                       epilog=GROUP_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    gsub = g.add_subparsers(dest="group_action", required=True, metavar="create|list|delete",
                            title="actions")
    for name, what in (("create", "make group G at the oldest message, reading nothing"),
                       ("list", "each group, its committed offset and its lag"),
                       ("delete", "delete group G (its committed offset then holds nothing)")):
        s = gsub.add_parser(name, prog=f"zbroker queue group {name}", help=what,
                            description=f"{what}. `zbroker queue group --help` says more.")
        s.add_argument("queue", metavar="NAME", help="the stream queue's name")
        if name != "list":
            s.add_argument("group", metavar="G", type=_group, help=f"the group to {name}")
        else:
            s.add_argument("--json", action="store_true", help="one JSON object, for scripts")
        _where(s)
        s.add_argument("--stream", metavar="ENDPOINT",
                       help="the queue's stream endpoint (no broker or config lookup)")
        s.add_argument("--timeout", "-t", type=seconds_argument, default=10.0,
                       metavar="SECONDS",
                       help="seconds to wait for the queue's answer (default %(default)s)")
    return p


@dataclass(frozen=True)
class QueueInfo:
    mode: str  # "push" or "stream"
    receive: str | None
    send: str | None
    stream: str | None
    note: str = ""  # why the broker was not asked, for error messages
    credit: str | None = None  # the credit endpoint, if the queue has one


def _lookup(args: argparse.Namespace) -> QueueInfo:
    """The queue's mode and endpoints: given on the command line, else from the running
    broker's status, else from the config. Raises ConfigError (unknown queue, bad config)."""
    if getattr(args, "receive", None):
        return QueueInfo("push", args.receive, None, None)
    if getattr(args, "send", None):
        return QueueInfo("push", None, args.send, None)
    if getattr(args, "stream", None):
        return QueueInfo("stream", None, None, args.stream)
    # the config finds the broker; its errors elsewhere matter only when the broker does not
    # answer and the queue is looked up in the config
    config, problem = load_for_locating(args.config, args.broker)
    broker = config.broker.name
    run_dir = Path(args.run_dir) if args.run_dir else config.broker.run_dir
    assert run_dir is not None
    try:
        status = request(run_dir, broker, {"command": "status"}, timeout=STATUS_TIMEOUT)
    except (NotRunning, CommandError) as exc:
        if problem is not None:
            raise problem from None
        return _from_config(config, args.queue, str(exc))
    queues: dict[str, Any] = (status.get("services") or {}).get("pzq") or {}
    q = queues.get(args.queue)
    if not isinstance(q, dict):
        if not queues:
            raise ConfigError(f"broker {broker!r} has no queue {args.queue!r}: services.pzq "
                              f"is not enabled; {not_enabled(broker)}")
        raise ConfigError(f"broker {broker!r} has no queue {args.queue!r} (queues: "
                          f"{', '.join(queues)})")
    return QueueInfo(str(q.get("mode", "push")), q.get("receive"), q.get("send"),
                     q.get("stream"), credit=q.get("credit"))


def not_enabled(broker: str) -> str:
    """What to do when a broker hosts no queue."""
    return ("set services.pzq.enabled: true and its queues in the broker's config, or run "
            "the broker with the queues of the examples (jobs, events): "
            f"zbroker {broker} --config config/queues.cfg (see docs/pzq.md)")


def _from_config(config: Any, queue: str, note: str) -> QueueInfo:
    if not config.services.pzq.enabled:
        raise ConfigError(f"{note}, and its config does not enable services.pzq: "
                          f"{not_enabled(config.broker.name)}")
    queues = config.services.pzq.queue_configs()
    q = queues.get(queue)
    if q is None:
        raise ConfigError(f"no queue {queue!r} in the config (queues: {', '.join(queues)})")
    broker = config.broker.name
    return QueueInfo(q.mode, q.receive_endpoint.replace("{name}", broker),
                     q.send_endpoint.replace("{name}", broker),
                     q.stream_endpoint.replace("{name}", broker), note,
                     q.credit_endpoint.replace("{name}", broker) if q.credit_endpoint else None)


def main(argv: Sequence[str]) -> int:
    return run(parser().parse_args(argv))


def run(args: argparse.Namespace) -> int:
    """``zbroker queue ...`` with its arguments parsed (its exit status)."""
    try:
        info = _lookup(args)
    except ConfigError as exc:
        return _error(str(exc))
    try:
        return _run(args, info)
    except zmq.ZMQError as exc:  # an endpoint ZeroMQ refuses (bogus, unknown transport)
        endpoint = (getattr(args, "receive", None) or getattr(args, "send", None)
                    or getattr(args, "stream", None))
        where = f"endpoint {endpoint!r}" if endpoint else f"queue {args.queue!r}"
        return _error(f"cannot connect to {where}: {zmq.strerror(exc.errno)} (an endpoint "
                      "is e.g. tcp://host:port or ipc:///path)")


def _run(args: argparse.Namespace, info: QueueInfo) -> int:
    try:
        if args.action == "put":
            assert info.receive is not None
            return _put(args, info.receive)
        if args.action == "group":
            if info.mode != "stream":
                return _error(f"queue {args.queue!r} is a push queue: reader groups are for "
                              "stream queues (mode: stream)", 2)
            assert info.stream is not None
            return _groups(args, info)
        if info.mode == "stream":
            assert info.stream is not None
            return _get_stream(args, info)
        if args.no_commit or args.from_offset is not None or args.group is not None:
            return _error(f"queue {args.queue!r} is a push queue: --no-commit, --from-offset "
                          "and --group are for stream queues", 2)
        if info.credit:  # batches, never more than --count held: none left waiting on exit
            return _get_batches(args, info.credit, info.note)
        assert info.send is not None
        return _get(args, info.send, info.note)
    except KeyboardInterrupt:
        return _error("interrupted", 130)


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
            return _error(f"no ACK from {endpoint} within {args.timeout:g}s "
                          f"({p.inflight} message(s) unconfirmed)")
        except ProducerError as exc:
            _finish(meter)
            return _error(str(exc))
    _finish(meter)
    return 0


def _finish(meter: progress.Progress | None) -> None:
    if meter is not None:
        meter.finish()


def _output_failed(exc: OSError) -> str:
    """Standard output is gone (a closed pipe, a full disk): say so, and point standard
    output at /dev/null so that the interpreter's last flush does not fail again."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.close(null)
    except (OSError, ValueError):
        pass
    return f"cannot write to standard output: {exc.strerror or exc}"


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
    return _error(f"{what} came within {args.timeout:g}s" + (f"; {note}" if note and got == 0
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
            return _error(_output_failed(exc))
        except zmq.ZMQError as exc:
            return _error(str(exc))
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
            while (m := c.recv_nowait()) is not None:
                c.nack(m)
        except TimeoutError as exc:
            return _error(f"{got} message(s) printed, their ACKs not confirmed: {exc}")
        except OSError as exc:
            return _error(_output_failed(exc))
        except zmq.ZMQError as exc:
            return _error(str(exc))
    return _shortfall(args, got, note)


def _get_stream(args: argparse.Namespace, info: QueueInfo) -> int:
    """Print a stream queue's messages from the committed offset (or --from-offset), and
    COMMIT each batch once it is flushed to standard output."""
    endpoint = info.stream
    assert endpoint is not None
    commit = not args.no_commit and args.from_offset is None
    out = sys.stdout.buffer
    got = 0
    per_try = _per_try(args.timeout)
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
                    return _error(_output_failed(exc))
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
            return _error(what + (f"; {info.note}" if info.note else ""))
        except StreamError as exc:
            return _error(f"the queue refused a request: {exc}")
    return _shortfall(args, got, info.note)


def _per_try(timeout: float) -> float:
    """A stream request is tried 3 times: an unreachable queue fails within about the timeout
    (at least 3 s)."""
    return min(5.0, max(1.0, timeout / 3))


def _tell_lost(args: argparse.Namespace, s: StreamConsumer,
               told: list[tuple[int, int] | None]) -> None:
    """Name, once, the offsets the queue's last answer says the group lost to retention."""
    lost = s.lost
    if lost is not None and lost != told[0]:
        told[0] = lost
        _error(f"group {args.group!r} lost offsets {lost[0]} to {lost[1] - 1} of queue "
               f"{args.queue!r}: the queue's retention limits dropped them before the group "
               "committed them")


def _groups(args: argparse.Namespace, info: QueueInfo) -> int:
    """``group create``, ``group list`` and ``group delete``."""
    endpoint = info.stream
    assert endpoint is not None
    per_try = _per_try(args.timeout)
    try:
        if args.group_action != "list":
            with StreamConsumer(endpoint, timeout=per_try, retries=2, group=args.group) as s:
                if args.group_action == "delete":
                    s.delete_group()
                else:
                    s.head()  # a group's first request makes it (durably, before the answer)
            return 0
        with StreamConsumer(endpoint, timeout=per_try, retries=2) as s:
            head, groups = s.group_offsets()
    except TimeoutError:
        return _error(f"no answer from the stream endpoint {endpoint} within {per_try * 3:g}s"
                      + (f"; {info.note}" if info.note else ""))
    except StreamError as exc:
        if args.group_action != "list":
            return _error(f"cannot {args.group_action} group {args.group!r} of queue "
                          f"{args.queue!r}: {exc}")
        return _error(f"the queue refused a request: {exc}")
    rows = {name: {"committed": c, "lag": max(0, head - c)} for name, c in sorted(groups.items())}
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
        return _error(_output_failed(exc))
    return 0
