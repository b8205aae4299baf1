"""``zbroker top``: a live view of a running broker over its management socket.

Every interval (1 s) it asks the broker for its status, as ``zbroker status`` does, and shows
ZPIPES clients, pipes with their byte rates, pzq queues with their rates and backlog, and
cluster peers with their heartbeat round trips, the busiest first. On a terminal it redraws
in place (rich) until ``q`` (or Ctrl-C); with ``--once``, or when standard output is not a
terminal, it prints plain text: once, or a block per interval.

:func:`compute_view` does the arithmetic (rates from two statuses, sorting) and
:func:`render` the drawing; neither needs a terminal.
"""

from __future__ import annotations

import argparse
import os
import select
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from zbroker.cli.common import (
    command_parser,
    common_options,
    duration,
    error,
    locate,
    plural,
    trouble_lines,
)
from zbroker.config import ConfigError
from zbroker.management import CommandError, NoAccess, NotRunning, request
from zpipes.progress import human_bytes

MAX_ROWS = 50  # rows of each table at most (the busiest)


@dataclass(frozen=True)
class Sample:
    """A status and the monotonic time it was taken."""

    at: float
    status: dict[str, Any]


@dataclass
class View:
    broker: str
    pid: int
    uptime: float
    interval: float | None  # seconds between the two samples (None: only one so far)
    clients: int = 0
    connections: int = 0
    pipes: list[dict[str, Any]] = field(default_factory=list)
    queues: list[dict[str, Any]] = field(default_factory=list)
    peers: list[dict[str, Any]] = field(default_factory=list)
    cluster: bool = False
    troubles: list[str] = field(default_factory=list)  # contacts not answering, peers refused


def _rate(now: float, before: float | None, dt: float | None) -> float | None:
    """Per second; None without a previous sample. A counter that went down (its ends were
    replaced) counts from 0."""
    if dt is None or dt <= 0 or before is None:
        return None
    return (now - before if now >= before else now) / dt


def _sort_key(rate: float | None, name: str) -> tuple[float, str]:
    return (-(rate or 0.0), name)


def compute_view(prev: Sample | None, cur: Sample) -> View:
    """What ``zbroker top`` shows for the status ``cur``, with rates since ``prev`` (the
    previous sample, or None), every table sorted by rate, the busiest first."""
    s = cur.status
    dt = cur.at - prev.at if prev is not None else None
    old = prev.status if prev is not None else {}
    view = View(broker=s.get("name", "?"), pid=s.get("pid", 0), uptime=s.get("uptime", 0.0),
                interval=dt)
    zpipes = s.get("services", {}).get("zpipes") or {}
    old_pipes = (old.get("services", {}).get("zpipes") or {}).get("pipes", {})
    view.clients = zpipes.get("clients", 0)
    view.connections = zpipes.get("connections", 0)
    for name, p in (zpipes.get("pipes") or {}).items():
        before = old_pipes.get(name, {}) if prev is not None else None
        w = _rate(p.get("bytes_written", 0),
                  before.get("bytes_written", 0) if before is not None else None, dt)
        r = _rate(p.get("bytes_read", 0),
                  before.get("bytes_read", 0) if before is not None else None, dt)
        view.pipes.append({"name": name, "readers": p.get("readers", 0),
                           "writers": p.get("writers", 0), "write_rate": w, "read_rate": r,
                           "buffered": p.get("buffered", 0),
                           "rate": None if w is None else w + (r or 0.0)})
    view.pipes.sort(key=lambda p: _sort_key(p["rate"], p["name"]))
    queues = s.get("services", {}).get("pzq") or {}
    old_queues = old.get("services", {}).get("pzq") or {}
    for name, q in queues.items():
        before = old_queues.get(name, {}) if prev is not None else None
        rates = {key: _rate(q.get(key, 0), before.get(key, 0) if before is not None else None,
                            dt)
                 for key in ("produced", "delivered", "consumer_acks")}
        view.queues.append({
            "name": name, "produced_rate": rates["produced"],
            "delivered_rate": rates["delivered"], "acked_rate": rates["consumer_acks"],
            "backlog": q.get("messages", 0), "backlog_bytes": q.get("backlog_bytes", 0),
            "inflight": q.get("messages_inflight", 0), "consumers": q.get("consumers", 0),
            "producers": q.get("producers", 0),
            "rate": None if rates["produced"] is None
            else rates["produced"] + (rates["delivered"] or 0.0)})
    view.queues.sort(key=lambda q: _sort_key(q["rate"], q["name"]))
    cluster = s.get("cluster")
    if cluster:
        view.cluster = True
        view.peers = sorted(({"name": (f"{p.get('name', '?')}@{p['host']}" if p.get("host")
                                       else p.get("name", "?")),
                              "endpoint": p.get("endpoint", ""),
                              "rtt": p.get("rtt_s"), "last_heard": p.get("last_heard_s")}
                             for p in cluster.get("peers") or []),
                            key=lambda p: (-(p["rtt"] or 0.0), p["name"]))
        view.troubles = trouble_lines(cluster)
    return view


# --- drawing ---------------------------------------------------------------------------------


def _bytes_rate(rate: float | None) -> str:
    return "-" if rate is None else f"{human_bytes(rate)}/s"


def _count_rate(rate: float | None) -> str:
    return "-" if rate is None else f"{_count(rate)}/s"


def _count(n: float) -> str:
    """A count in at most six characters: 950, 12.5k, 1.23M (the columns fit 80)."""
    if n < 1000:
        return f"{n:.1f}" if n and n < 100 and n != int(n) else f"{n:.0f}"
    for unit in ("k", "M", "G"):
        n /= 1000
        if n < 1000:
            return f"{n:.3g}{unit}"
    return f"{n:.0f}G"


def _uptime(seconds: float) -> str:
    return duration(seconds)


def render(view: View, plain: bool = False) -> Any:
    """The view as a rich renderable: a title line and a table per section. ``plain``: no
    box lines, no colours (text for pipes and files)."""
    from rich import box
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    style = {"box": None if plain else box.SIMPLE_HEAD, "show_edge": False,
             "pad_edge": False, "collapse_padding": True,
             "header_style": None if plain else "bold"}
    every = "" if view.interval is None else f", rates over {view.interval:.1f} s"
    parts: list[Any] = [Text(
        f"zbroker top: broker {view.broker} (pid {view.pid}), up {_uptime(view.uptime)}"
        f"{every}" + ("" if plain else "   q: quit"), style=None if plain else "bold",
        no_wrap=True, overflow="ellipsis")]

    parts.append(Text(f"ZPIPES: {view.clients} clients, {view.connections} connections, "
                      f"{len(view.pipes)} pipes"))
    if view.pipes:
        t = Table(**style)
        for col in ("PIPE", "READERS", "WRITERS", "WRITE", "READ", "BUFFERED"):
            t.add_column(col, justify="left" if col == "PIPE" else "right", no_wrap=True)
        for p in view.pipes[:MAX_ROWS]:
            t.add_row(p["name"], str(p["readers"]), str(p["writers"]),
                      _bytes_rate(p["write_rate"]), _bytes_rate(p["read_rate"]),
                      human_bytes(p["buffered"]))
        parts.append(t)
    if view.queues:
        parts.append(Text(f"pzq: {len(view.queues)} queues"))
        t = Table(**style)
        # (headers that fit 80 columns with a queue name of 16: "BYTES" is the backlog's,
        # "P/C" producers and consumers connected)
        for col in ("QUEUE", "PRODUCED", "DELIVERED", "ACKED", "BACKLOG", "BYTES",
                    "IN FLIGHT", "P/C"):
            t.add_column(col, justify="left" if col == "QUEUE" else "right", no_wrap=True)
        for q in view.queues[:MAX_ROWS]:
            t.add_row(q["name"], _count_rate(q["produced_rate"]),
                      _count_rate(q["delivered_rate"]), _count_rate(q["acked_rate"]),
                      _count(q["backlog"]), human_bytes(q["backlog_bytes"]),
                      _count(q["inflight"]), f"{q['producers']}/{q['consumers']}")
        parts.append(t)
    if view.cluster:
        parts.append(Text(f"cluster: {plural(len(view.peers), 'peer')}"))
        parts += [Text(line) for line in view.troubles[:MAX_ROWS]]
        if view.peers:
            t = Table(**style)
            for col in ("PEER", "ENDPOINT", "RTT", "LAST HEARD"):
                t.add_column(col, justify="right" if col in ("RTT", "LAST HEARD") else "left",
                             no_wrap=True)
            for p in view.peers[:MAX_ROWS]:
                rtt = "-" if p["rtt"] is None else f"{p['rtt'] * 1000:.2f} ms"
                heard = "-" if p["last_heard"] is None else f"{p['last_heard']:.1f} s ago"
                t.add_row(p["name"], p["endpoint"], rtt, heard)
            parts.append(t)
    return Group(*parts)


def render_text(view: View, width: int = 120) -> str:
    """The plain-text form of the view."""
    import io

    from rich.console import Console

    out = io.StringIO()
    Console(file=out, width=width, color_system=None, force_terminal=False,
            highlight=False).print(render(view, plain=True))
    return "\n".join(line.rstrip() for line in out.getvalue().splitlines()) + "\n"


# --- the command -----------------------------------------------------------------------------


def _interval(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0.1 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"expected seconds from 0.1 to 3600, got {text!r}")
    return value


def top_command(argv: Sequence[str]) -> int:
    parser = command_parser("top", "[NAME] [--once] [--interval SECONDS]",
                     "A live view of a running broker: ZPIPES clients and pipes with their "
                     "byte rates, pzq queues with their rates and backlog, cluster peers with "
                     "their round trips; the busiest first, refreshed every second. q quits. "
                     "With --once, or when standard output is not a terminal, plain text.")
    common_options(parser, json_flag=False)
    parser.add_argument("--once", action="store_true",
                        help="print one view as plain text (rates over one interval) and exit")
    parser.add_argument("--interval", "-i", type=_interval, default=1.0, metavar="SECONDS",
                        help="seconds between refreshes (default 1)")
    args = parser.parse_args(argv)
    try:
        name, run_dir = locate(args)
    except ConfigError as exc:
        error(str(exc))
        return 1

    def sample() -> Sample:
        return Sample(time.monotonic(), request(run_dir, name, {"command": "status"}))

    try:
        if args.once or not sys.stdout.isatty():
            return _plain(sample, args.interval, once=args.once)
        return _live(sample, args.interval)
    except (NotRunning, NoAccess, CommandError) as exc:
        error(str(exc))
        return 1
    except KeyboardInterrupt:
        return 0


def _plain(sample: Callable[[], Sample], interval: float, once: bool) -> int:
    prev = sample()
    while True:
        time.sleep(interval)
        cur = sample()
        sys.stdout.write(render_text(compute_view(prev, cur)))
        sys.stdout.flush()
        if once:
            return 0
        sys.stdout.write("\n")
        prev = cur


def _live(sample: Callable[[], Sample], interval: float) -> int:
    from rich.console import Console
    from rich.live import Live

    console = Console()
    keys = _Keys()
    prev, cur = None, sample()
    with keys, Live(render(compute_view(prev, cur)), console=console, screen=True,
                    auto_refresh=False) as live:
        next_at = time.monotonic() + interval
        while True:
            if keys.wait_for_quit(max(0.0, next_at - time.monotonic())):
                return 0
            next_at += interval
            prev, cur = cur, sample()
            live.update(render(compute_view(prev, cur)), refresh=True)


class _Keys:
    """Standard input in cbreak mode (keys arrive one by one, Ctrl-C still interrupts), so
    that ``q`` quits without Enter; nothing to read when standard input is not a terminal."""

    def __init__(self) -> None:
        self.fd = sys.stdin.fileno() if sys.stdin is not None and sys.stdin.isatty() else None
        self._saved: Any = None

    def __enter__(self) -> _Keys:
        if self.fd is not None:
            import termios
            import tty

            self._saved = termios.tcgetattr(self.fd)
            tty.setcbreak(self.fd)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._saved is not None:
            import termios

            termios.tcsetattr(self.fd, termios.TCSADRAIN, self._saved)

    def wait_for_quit(self, timeout: float) -> bool:
        """Wait ``timeout`` seconds; True as soon as q (or Q) is typed."""
        if self.fd is None:
            time.sleep(timeout)
            return False
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            ready, _, _ = select.select([self.fd], [], [], left)
            if ready:
                key = os.read(self.fd, 1)
                if key in (b"q", b"Q") or not key:
                    return True
