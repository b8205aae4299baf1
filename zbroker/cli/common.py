"""What the ``zbroker`` commands share: error lines, parsers with the options that find a
broker (NAME, --config, --run-dir, --json), finding its run directory, durations as people
read them, and what keeps a broker's cluster from linking."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from zbroker.config import Config, ConfigError, find_config_file, load_config, parse_config


def error(message: str) -> None:
    """``zbroker: `` and the message on standard error; each line of it so (one a problem)."""
    for line in message.splitlines() or [""]:
        print(f"zbroker: {line}", file=sys.stderr)


def command_parser(command: str, usage_args: str, description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"zbroker {command}", description=description)
    parser.usage = f"%(prog)s {usage_args}"
    return parser


def common_options(parser: argparse.ArgumentParser, json_flag: bool = True) -> None:
    parser.add_argument("name", metavar="NAME", nargs="?",
                        help="the broker's name (default: broker.name of the config, 'local')")
    parser.add_argument("--config", "-c", metavar="FILE",
                        help="the broker's config file, to find its run directory")
    parser.add_argument("--run-dir", metavar="DIR", help="the broker's run directory")
    if json_flag:
        parser.add_argument("--json", action="store_true", help="output JSON, for scripts")


def locate(args: argparse.Namespace) -> tuple[str, Path]:
    """(broker name, run directory). Raises ConfigError when the config does not say them.

    A config file with errors elsewhere than in its ``broker`` section still locates the
    broker, and says nothing of them: a command that only finds the broker does not use
    the rest (``zbroker reload`` gets the errors from the broker, which reads the file)."""
    config, _ = load_for_locating(args.config, args.name)
    run_dir = Path(args.run_dir) if args.run_dir else config.broker.run_dir
    assert run_dir is not None
    return config.broker.name, run_dir


def load_for_locating(path: str | None, name: str | None) -> tuple[Config, ConfigError | None]:
    """The config of ``path`` (None: the broker's search) with broker ``name`` (if given), and
    None; or, when it has errors outside its ``broker`` section, a config of that section
    alone and the error, for a command that needs more of the config to report. Raises
    ConfigError when even the broker section cannot be read."""
    overrides = {"broker": {"name": name}} if name else None
    try:
        return load_config(path, overrides), None
    except ConfigError as exc:
        config = _broker_section_only(path, overrides)
        if config is None:
            raise
        return config, exc


def _broker_section_only(path: str | None, overrides: dict | None) -> Config | None:
    file = Path(path) if path else find_config_file()
    try:
        data = yaml.safe_load(file.read_text(encoding="utf-8")) if file else None
        broker = data.get("broker") if isinstance(data, dict) else None
        return parse_config({"broker": broker} if broker is not None else None, overrides)
    except (OSError, UnicodeDecodeError, yaml.YAMLError, ConfigError):
        return None


def duration(seconds: float) -> str:
    seconds = int(seconds)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{days}d"] if days else []
    if days or hours:
        parts.append(f"{hours}h")
    if days or hours or minutes:
        parts.append(f"{minutes}m")
    parts.append(f"{secs}s")
    return " ".join(parts)


def seconds_argument(text: str) -> float:
    """An argparse type: seconds, 0 or more."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < 1e9:
        raise argparse.ArgumentTypeError(f"expected seconds (0 or more), got {text!r}")
    return value


def _since(entry: dict[str, Any]) -> str:
    """``since 12:03:04 (40s)``: the local time of day, how long ago (and how many times)."""
    since = entry.get("since")
    clock = time.strftime("%H:%M:%S", time.localtime(since)) if since else "?"
    times = entry.get("times")
    return (f"since {clock} ({duration(entry.get('seconds') or 0)}"
            + (f", {times} times)" if times is not None else ")"))


def trouble_lines(cluster: dict[str, Any]) -> list[str]:
    """What keeps brokers from linking, from a cluster's status: each contact not answering,
    each peer refused (for ``zbroker status`` and ``zbroker top``)."""
    lines = []
    refused = {r.get("peer") for r in cluster.get("refusals") or []}
    for contact in cluster.get("not_answering") or []:
        if contact.get("endpoint") in refused:
            continue  # said below, with why
        seed = " (seed)" if contact.get("seed") else ""
        lines.append(f"  {contact.get('endpoint')}{seed} not answering {_since(contact)}")
    for r in cluster.get("refusals") or []:
        what = "refuses us" if r.get("refused_by") == "the peer" else "refused"
        lines.append(f"  {r.get('peer')} {what}: {r.get('why')}, {_since(r)}")
    return lines
