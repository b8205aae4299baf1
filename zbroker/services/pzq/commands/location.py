"""Where a queue of ``zbroker queue`` is: its mode and endpoints, named on the command line
(--receive, --send, --stream: a standalone pzq), else from the running broker's status (asked
on its control socket, found as ``zbroker status`` finds it: --config, --broker, --run-dir),
else from the broker's config file (the same search as the broker's, or --config)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zbroker.config import ConfigError
from zbroker.locating import load_for_locating
from zbroker.management import CommandError, NotRunning, request

STATUS_TIMEOUT = 5.0  # seconds to wait for the broker's status


@dataclass(frozen=True)
class QueueInfo:
    mode: str  # "push" or "stream"
    receive: str | None
    send: str | None
    stream: str | None
    note: str = ""  # why the broker was not asked, for error messages
    credit: str | None = None  # the credit endpoint, if the queue has one


def where_options(s: argparse.ArgumentParser) -> None:
    """The options that find the broker, hence the queue."""
    s.add_argument("--config", "-c", metavar="FILE", help="the broker's config file")
    s.add_argument("--broker", "-b", metavar="BROKER",
                   help="the broker's name (default: broker.name of the config)")
    s.add_argument("--run-dir", metavar="DIR", help="the broker's run directory")


def lookup(args: argparse.Namespace) -> QueueInfo:
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
