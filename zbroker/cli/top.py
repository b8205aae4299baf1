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
from collections.abc import Callable
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
from zbroker.command import Command
from zbroker.config import ConfigError
from zbroker.management import CommandError, NoAccess, NotRunning, request
from zbroker.top_table import TopTable

MAX_ROWS = 50  # rows of the peers' table at most (the slowest)


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
    tables: list[TopTable] = field(default_factory=list)  # the services', in their order
    peers: list[dict[str, Any]] = field(default_factory=list)
    cluster: bool = False
    troubles: list[str] = field(default_factory=list)  # contacts not answering, peers refused


def compute_view(prev: Sample | None, cur: Sample) -> View:
    """What ``zbroker top`` shows for the status ``cur``, with rates since ``prev`` (the
    previous sample, or None): each service's tables as its plug-in makes them
    (``Service.top_tables``: a service without a plug-in here shows none), the peers."""
    s = cur.status
    dt = cur.at - prev.at if prev is not None else None
    old = prev.status.get("services", {}) if prev is not None else {}
    view = View(broker=s.get("name", "?"), pid=s.get("pid", 0), uptime=s.get("uptime", 0.0),
                interval=dt)
    plugins = _plugins()
    for name, status in (s.get("services") or {}).items():
        service = plugins.get(name)
        if service is not None and isinstance(status, dict):
            before = (old.get(name) or {}) if prev is not None else None
            view.tables += service.top_tables(status, before, dt)
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


def _plugins() -> dict[str, Any]:
    from zbroker.services import PluginError, installed

    try:
        return installed()
    except PluginError:
        return {}


# --- drawing ---------------------------------------------------------------------------------


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
        f"zbroker top: broker {view.broker} (pid {view.pid}), up {duration(view.uptime)}"
        f"{every}" + ("" if plain else "   q: quit"), style=None if plain else "bold",
        no_wrap=True, overflow="ellipsis")]

    for table in view.tables:
        parts.append(Text(table.title))
        if table.rows:
            t = Table(**style)
            for i, col in enumerate(table.columns):
                t.add_column(col, justify="right" if i else "left", no_wrap=True)
            for row in table.rows:
                t.add_row(*row)
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


def _top_parser() -> argparse.ArgumentParser:
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
    return parser


def _top(args: argparse.Namespace) -> int:
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


top_command = Command("top", _top_parser, _top)


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
