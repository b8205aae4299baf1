"""What the ``zbroker`` commands share besides what every command, a service's too, has
(zbroker/command.py): durations as people read them, and what keeps a broker's cluster from
linking."""

from __future__ import annotations

import time
from typing import Any

from zbroker.cluster.membership import endpoint_host

# (where services' commands find them too)
from zbroker.command import command_parser, common_options, error, seconds_argument
from zbroker.locating import load_for_locating, locate

__all__ = ["command_parser", "common_options", "duration", "error", "load_for_locating",
           "locate", "not_answering", "plural", "seconds_argument", "trouble_lines"]


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
