"""``pzq``: one standalone queue, with the original pzq's command line.

Durations are microseconds, as in the original. ``--database`` names a directory for the log.
SIGTERM and SIGINT stop it cleanly (what is queued is written; the last ACKs go out).
Exit status: 0 after a clean stop, 1 if it cannot start, 2 on a bad command line.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

import structlog
import zmq

from zbroker.config import LOG_LEVELS, LogConfig, parse_size
from zbroker.runtime import event_loop, heap
from zbroker.services.pzq.config import PzqQueueConfig, node_id_list
from zbroker.services.pzq.core.group_commit import SYNC_MODES as PZQ_SYNC_MODES
from zbroker.services.pzq.core.queue import MODES as PZQ_MODES
from zbroker.services.pzq.server import QueueServer
from zbroker.services.pzq.settings import QueueError, QueueSettings
from zpipes.version import VersionAction

DESCRIPTION = "Persistent store and forward device for ZeroMQ (a zbroker pzq queue)."


def _positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if n <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {n}")
    return n


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _node_ids(text: str) -> tuple[str, ...]:
    try:
        return node_id_list([n for n in text.split(",") if n.strip()])
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _us(seconds: float) -> int:
    """A duration of the config (seconds) as the original's options give it: microseconds."""
    return round(seconds * 1_000_000)


def parser() -> argparse.ArgumentParser:
    d = PzqQueueConfig  # the defaults of the settings the broker config has too
    p = argparse.ArgumentParser(prog="pzq", description=DESCRIPTION)
    p.add_argument("--version", action=VersionAction)
    a = p.add_argument
    a("--database", default="/tmp/pzq-db", help="directory of the queue's log (%(default)s)")
    a("--ack-timeout", type=_positive_int, default=_us(d.ack_timeout), metavar="US",
      help="how long to wait for a consumer ACK before resending, µs (%(default)s)")
    a("--reaper-frequency", type=_positive_int, default=_us(d.reaper_frequency), metavar="US",
      help="how often to look for timed-out messages, µs (%(default)s)")
    a("--hard-sync", action="store_true",
      help="fdatasync each message alone before its ACK (sync: always)")
    a("--sync", choices=PZQ_SYNC_MODES, default=None,
      help="batch (default: group commit, ACK after fdatasync), always, none (no fdatasync)")
    a("--sync-window", type=int, default=_us(d.sync_window), metavar="US",
      help="how long a batch gathers messages before its fdatasync, µs (%(default)s); up "
           "to five times that while consumers ACK messages not yet written")
    a("--sync-max-bytes", type=_size, default=d.sync_max_bytes, metavar="BYTES",
      help="most bytes one fdatasync covers: a batch closes there and is written at once "
           "(%(default)s)")
    a("--inflight-size", type=_size, default=d.inflight_size, metavar="BYTES",
      help="most bytes in flight to consumers (%(default)s)")
    a("--inflight-window", type=_positive_int, default=d.inflight_window, metavar="N",
      help="most unACKed messages per consumer (%(default)s)")
    a("--max-message-size", type=_size, default=d.max_message_size, metavar="BYTES",
      help="largest message body; a larger message is refused as soon as its frames pass "
           "this (plus 64 KiB for its id and headers) and the rest is not kept (%(default)s)")
    a("--max-frames", type=_positive_int, default=d.max_frames, metavar="N",
      help="most frames in a message (id, headers, delimiter and body); more: refused "
           "(%(default)s)")
    a("--max-backlog", type=_size, default=d.max_backlog, metavar="BYTES",
      help="what unACKed messages may cost together: ids and bodies, 16 bytes a frame, and "
           "the copies held for other nodes; beyond, producers get 'Queue full' (%(default)s)")
    a("--idempotence-bytes", type=_size, default=d.idempotence_bytes, metavar="BYTES",
      help="most bytes of producer ids remembered to answer a retry without storing it "
           "twice; the oldest are forgotten first (%(default)s)")
    a("--segment-size", type=_size, default=d.segment_size, metavar="BYTES",
      help="a new log segment starts past this size (%(default)s)")
    a("--receive-dsn", default=d.receive_endpoint, help="producers' endpoint (%(default)s)")
    a("--send-dsn", default=d.send_endpoint, help="consumers' endpoint (%(default)s)")
    a("--monitor-dsn", default="ipc:///tmp/pzq-monitor", help="MONITOR endpoint (%(default)s)")
    a("--replicas", type=int, default=d.replicas,
      help="copies on other nodes (the first N of --nodes) before the ACK (%(default)s)")
    a("--nodes", default="", metavar="DSN,DSN",
      help="receive endpoints of the other nodes' queues, separated by ','")
    a("--replica-sources", type=_node_ids, default=d.replica_sources, metavar="NODE,NODE",
      help="node ids (<database>/node-id of each) of the queues whose copies this one holds; "
           "REPLICA traffic from any other is refused (default: none, refuse all)")
    a("--max-replica-origins", type=_positive_int, default=d.max_replica_origins, metavar="N",
      help="most nodes whose copies are held at once; copies of more are refused "
           "(%(default)s)")
    a("--timeout-nodes", type=_positive_int, default=_us(d.node_timeout), metavar="US",
      help="silence after which a node's copies are delivered here, µs (%(default)s)")
    a("--mode", choices=PZQ_MODES, default=d.mode,
      help="push: messages go to consumers, ACKed one by one (default); stream: read by "
           "offset and committed on the stream endpoint (HEAD, RANGE, COMMIT)")
    a("--stream-dsn", default=d.stream_endpoint,
      help="stream requests' endpoint, with --mode stream (%(default)s)")
    a("--retention-bytes", type=_size, default=None, metavar="BYTES",
      help="with --mode stream: keep at most this many bytes of messages; past it the "
           "oldest go even if a reader group has not read them (it is told) (no limit)")
    a("--retention-seconds", type=float, default=None, metavar="SECONDS",
      help="with --mode stream: messages older than this go, read or not (no limit)")
    a("--credit-dsn", default=None,
      help="an extra consumers' endpoint (ROUTER) where each consumer says READY with its "
           "window and never holds more unACKed: a slow consumer cannot hoard (off by "
           "default; push queues only)")
    a("--broadcast-dsn", default=None,
      help="accepted for compatibility, not used: nodes talk on their receive endpoints")
    a("--timeout-replication", "--timeout_replication", dest="timeout_replication",
      type=_positive_int, default=_us(d.replication_timeout), metavar="US",
      help="wait this long for the copies, then ACK with REPLICATION_FAILED, µs (%(default)s)")
    a("--log-level", default=LogConfig.level, choices=LOG_LEVELS)
    return p


def settings_from_args(args: argparse.Namespace) -> QueueSettings:
    sync = args.sync or ("always" if args.hard_sync else PzqQueueConfig.sync)
    return QueueSettings(
        name="pzq", receive_endpoint=args.receive_dsn, send_endpoint=args.send_dsn,
        monitor_endpoint=args.monitor_dsn or None,
        data_dir=Path(args.database).expanduser().absolute(), sync=sync,
        sync_window=max(0, args.sync_window) / 1e6, sync_max_bytes=args.sync_max_bytes,
        ack_timeout=args.ack_timeout / 1e6,
        reaper_frequency=args.reaper_frequency / 1e6, inflight_window=args.inflight_window,
        inflight_size=args.inflight_size, max_message_size=args.max_message_size,
        max_backlog=args.max_backlog, max_frames=args.max_frames,
        idempotence_bytes=args.idempotence_bytes, segment_size=args.segment_size,
        replica_sources=args.replica_sources, max_replica_origins=args.max_replica_origins,
        replicas=args.replicas,
        replication_timeout=args.timeout_replication / 1e6,
        peers=tuple(n.strip() for n in args.nodes.split(",") if n.strip()),
        node_timeout=args.timeout_nodes / 1e6, mode=args.mode,
        stream_endpoint=args.stream_dsn, credit_endpoint=args.credit_dsn or None,
        retention_bytes=args.retention_bytes, retention_seconds=args.retention_seconds)


async def serve(settings: QueueSettings, log: structlog.typing.FilteringBoundLogger) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    ctx = zmq.Context()
    try:
        server = QueueServer(settings, ctx, loop, log)
        await server.start()
    except QueueError as exc:
        print(f"pzq: {exc}", file=sys.stderr)
        ctx.term()
        return 1
    stop_giving_back = heap.give_back_every(loop)  # what floods of producers leave, returned
    try:
        await stop.wait()
    finally:
        stop_giving_back()
        await server.stop()
        ctx.term()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    settings = settings_from_args(args)
    if settings.replicas < 0 or settings.replicas > len(settings.peers):
        print(f"pzq: --replicas {settings.replicas} needs at least as many --nodes "
              f"(given {len(settings.peers)})", file=sys.stderr)
        return 2
    # the standard levels' numbers (what zbroker.logs uses too); not zbroker.logs itself, which
    # configures structlog for the broker when imported
    level = logging.getLevelNamesMapping()[args.log_level.upper()]
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(level),
                        logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    log = structlog.get_logger(service="pzq")
    heap.keep_freed_memory()  # large bodies come and go: no page faults for each new one
    try:
        return event_loop.run(serve(settings, log))
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
