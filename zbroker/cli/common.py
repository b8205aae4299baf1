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

from zbroker.cluster.membership import endpoint_host
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


def plural(n: int, word: str) -> str:
    """``1 peer``, ``2 peers``, ``0 peers``."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _since(entry: dict[str, Any]) -> str:
    """``since 12:03:04 (40s)``: the local time of day, how long ago (and how many times)."""
    since = entry.get("since")
    clock = time.strftime("%H:%M:%S", time.localtime(since)) if since else "?"
    times = entry.get("times")
    return (f"since {clock} ({duration(entry.get('seconds') or 0)}"
            + (f", {plural(times, 'time')})" if times is not None else ")"))


def not_answering(cluster: dict[str, Any]) -> int:
    """Contacts that do not answer, but for those of a host that refuses or is refused (said
    so, with why, and not twice)."""
    refused = {endpoint_host(str(r.get("peer", ""))) for r in cluster.get("refusals") or []}
    listed = cluster.get("not_answering")
    if listed is None:  # a broker of before: only its count
        return int(cluster.get("pending_contacts") or 0)
    return sum(1 for c in listed if endpoint_host(str(c.get("endpoint", ""))) not in refused)


def trouble_lines(cluster: dict[str, Any]) -> list[str]:
    """What keeps brokers from linking, from a cluster's status, one line for each host (for
    ``zbroker status`` and ``zbroker top``): a contact not answering, or a peer refused (by
    us, by it, or both ways), since when, how many times, and what to do about it."""
    from zbroker.cluster.troubles import advice

    by_host: dict[str, list[dict[str, Any]]] = {}
    for r in cluster.get("refusals") or []:
        by_host.setdefault(endpoint_host(str(r.get("peer", ""))), []).append(r)
    lines = []
    for contact in cluster.get("not_answering") or []:
        if endpoint_host(str(contact.get("endpoint", ""))) in by_host:
            continue  # said below, with why
        seed = " (seed)" if contact.get("seed") else ""
        lines.append(f"  {contact.get('endpoint')}{seed} not answering {_since(contact)}")
    for host, refusals in by_host.items():
        sides = {r.get("refused_by") for r in refusals}
        what = ("refused both ways" if len(sides) > 1 else
                "refuses us" if sides == {"the peer"} else "refused")
        whys = list(dict.fromkeys(str(r.get("why")) for r in refusals))
        name = next((r["peer"] for r in refusals if "://" in str(r.get("peer"))), host)
        first = min(refusals, key=lambda r: r.get("since") or 0)
        seen = {"since": first.get("since"),
                "seconds": max(r.get("seconds") or 0 for r in refusals),
                "times": (sum(r.get("times") or 0 for r in refusals)
                          if any("times" in r for r in refusals) else None)}
        lines.append(f"  {name} {what}: {'; '.join(whys)}, {_since(seen)}; fix: "
                     f"{advice(whys[0], cluster.get('key_file'))}")
    return lines
