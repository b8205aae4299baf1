"""What members tell each other about whom they know, as on the wire (MEMBERS). No I/O.

A MEMBERS message lists the members its sender has as peers right now: ``{"members": [{"id",
"name", "endpoint"}, ...]}``, each endpoint the one the sender links to (where that member
answered its HELLO). It only ever says "this one is alive, try it": it never says that a member
is gone (only a member's own BYE and our own heartbeats do, membership.py), and what it names is
only a *contact* until that member answers our HELLO at that endpoint, as any stranger must.

Everything about it is bounded: the frame (``MAX_FRAME`` bytes, refused before it is parsed),
the members it may name (``MAX_MEMBERS``, the rest ignored), each field's length. A malformed
entry is skipped and counted, a malformed message is refused with the reason: never an
exception.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .membership import MAX_ENDPOINT, Named

MAX_MEMBERS = 512  # members a MEMBERS message may name (and contacts learned from them)
MAX_ID = 64  # characters of a broker id (ours are 32 hex digits)
MAX_NAME = 256  # characters of a broker name
MAX_FRAME = 64 + MAX_MEMBERS * (MAX_ID + MAX_NAME + MAX_ENDPOINT + 64)


@dataclass(frozen=True)
class Member:
    """A member as a MEMBERS message names it."""

    id: str  # its start id: a new one at every start of the broker
    name: str
    endpoint: str  # where the sender links to it


def encode(members: Iterable[Named]) -> bytes:
    """The MEMBERS frame naming ``members`` (the first ``MAX_MEMBERS`` of them)."""
    listed: list[dict[str, str]] = []
    for member in members:
        if len(listed) == MAX_MEMBERS:
            break
        listed.append({"id": member.id, "name": member.name, "endpoint": member.endpoint})
    return json.dumps({"members": listed}, separators=(",", ":")).encode()


def decode(data: bytes | memoryview) -> tuple[list[Member], str | None]:
    """The members a MEMBERS frame names, and what was wrong with it (None: nothing). Entries
    that are not a member are skipped, and so is everything past ``MAX_MEMBERS``."""
    if len(data) > MAX_FRAME:
        return [], f"{len(data)} bytes, more than {MAX_FRAME}"
    try:
        message = json.loads(bytes(data))
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return [], "not JSON"
    entries = message.get("members") if isinstance(message, dict) else None
    if not isinstance(entries, list):
        return [], "no list of members"
    members: list[Member] = []
    bad = 0
    for entry in entries[:MAX_MEMBERS]:
        member = _member(entry)
        if member is None:
            bad += 1
        else:
            members.append(member)
    problems = []
    if bad:
        problems.append(f"{bad} malformed entries skipped")
    if len(entries) > MAX_MEMBERS:
        problems.append(f"{len(entries)} members, only the first {MAX_MEMBERS} taken")
    return members, "; ".join(problems) or None


def _member(entry: Any) -> Member | None:
    if not isinstance(entry, dict):
        return None
    member_id, name, endpoint = entry.get("id"), entry.get("name"), entry.get("endpoint")
    if not (isinstance(member_id, str) and isinstance(name, str) and isinstance(endpoint, str)):
        return None
    if not member_id or len(member_id) > MAX_ID or len(name) > MAX_NAME \
            or not endpoint or len(endpoint) > MAX_ENDPOINT:
        return None
    return Member(member_id, name, endpoint)
