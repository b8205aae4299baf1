"""What a broker remembers of its cluster across restarts, as Serf's snapshot does.

A clustered broker with a key keeps, in its state directory
(``$XDG_STATE_HOME/zbroker/<broker>.cluster.json``, else ``~/.local/state/...``; mode 0600),
its cluster's name, its key file, the seeds it was given and the members it knew, each with
when it was last a peer. At start:

- a broker whose config does not turn the cluster on, but that has a snapshot, starts
  clustered again (the join of before holds: ``zbroker NAME`` after ``zbroker NAME
  --join-file F`` is what a service unit runs), unless its config file says
  ``cluster.enabled: false`` (then it says it runs standalone, and why);
- a clustered broker says HELLO to the members it knew as well as to its seeds, so that two
  hosts restarted together find each other without discovery;
- a member not seen for ``FORGET_AFTER`` is dropped from the snapshot (documented in
  docs/operations.md).

This module is the file and the decisions, without the broker; the broker saves the snapshot
when its peers change (at most once a ``SAVE_EVERY``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

#: seconds a member may be away before it is no longer dialled at start (three days: a host
#: down for a long weekend still comes back)
FORGET_AFTER = 3 * 24 * 3600.0
SAVE_EVERY = 5.0  # seconds between two writes of the snapshot at most
MAX_MEMBERS = 256  # members remembered, the most recently seen kept
MAX_SIZE = 1 << 20  # bytes of a snapshot file read at most


@dataclasses.dataclass
class Snapshot:
    cluster: str
    key_file: str | None
    seeds: tuple[str, ...] = ()
    #: endpoint -> when it was last a peer (wall clock, seconds)
    members: dict[str, float] = dataclasses.field(default_factory=dict)

    def saw(self, endpoints: Iterable[str], now: float) -> bool:
        """``endpoints`` are peers now; True if the snapshot changed in what it dials (a
        member new), not only in times."""
        new = False
        for endpoint in endpoints:
            new |= endpoint not in self.members
            self.members[endpoint] = now
        return new

    def forget_old(self, now: float) -> list[str]:
        """Drop the members away longer than FORGET_AFTER (and the oldest past
        MAX_MEMBERS); the endpoints dropped."""
        gone = [e for e, seen in self.members.items() if now - seen > FORGET_AFTER]
        by_age = sorted(self.members, key=self.members.__getitem__, reverse=True)
        gone += [e for e in by_age[MAX_MEMBERS:] if e not in gone]
        for endpoint in gone:
            del self.members[endpoint]
        return gone

    def endpoints(self) -> list[str]:
        """Whom to say HELLO to at start: the seeds, then the members, most recent first."""
        recent = sorted(self.members, key=self.members.__getitem__, reverse=True)
        return list(dict.fromkeys([*self.seeds, *recent]))

    def to_json(self) -> str:
        return json.dumps({"cluster": self.cluster, "key_file": self.key_file,
                           "seeds": list(self.seeds), "members": self.members}, indent=1)

    @classmethod
    def from_json(cls, text: str) -> Snapshot:
        """ValueError if ``text`` is not a snapshot."""
        data = json.loads(text)
        if not isinstance(data, dict) or not isinstance(data.get("cluster"), str):
            raise ValueError("not a cluster snapshot")
        key_file = data.get("key_file")
        seeds = data.get("seeds") or []
        members = data.get("members") or {}
        if (key_file is not None and not isinstance(key_file, str)
                or not isinstance(seeds, list) or not all(isinstance(s, str) for s in seeds)
                or not isinstance(members, dict)
                or not all(isinstance(e, str) and isinstance(t, int | float)
                           for e, t in members.items())):
            raise ValueError("not a cluster snapshot")
        return cls(data["cluster"], key_file, tuple(seeds),
                   {e: float(t) for e, t in members.items()})


def snapshot_path(broker_name: str) -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "zbroker" / f"{broker_name}.cluster.json"


def load(path: Path) -> Snapshot | None:
    """The snapshot at ``path``; None if there is none. ValueError (saying why) if it
    cannot be read or is not one."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read(MAX_SIZE)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        return Snapshot.from_json(text)
    except ValueError as exc:
        raise ValueError(f"{path} is not a cluster snapshot ({exc}): delete it") from None


def save(path: Path, snapshot: Snapshot) -> None:
    """Write ``snapshot`` to ``path`` whole or not at all (aside, then renamed), mode 0600.
    OSError if it cannot."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    aside = path.with_name(path.name + ".new")
    fd = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    with open(fd, "w", encoding="utf-8") as f:
        f.write(snapshot.to_json())
        f.flush()
        os.fsync(f.fileno())
    os.replace(aside, path)


def rejoin_overrides(snapshot: Snapshot) -> dict[str, Any]:
    """The config a broker with ``snapshot`` and no cluster in its config starts with."""
    cluster: dict[str, Any] = {"enabled": True, "name": snapshot.cluster, "insecure": False}
    if snapshot.key_file is not None:
        cluster["key_file"] = snapshot.key_file
    return {"cluster": cluster}


REFRESH_EVERY = 600.0  # seconds between two notes of the peers still there


class Memory:
    """A running broker's snapshot: noted when a peer joins (written at most once a
    SAVE_EVERY), the peers still there noted every REFRESH_EVERY, written at stop.
    ``peers()``: the endpoints of the peers now; ``saved()``: called after each write."""

    def __init__(self, loop: Any, path: Path, snapshot: Snapshot, log: Any,
                 peers: Any, saved: Any = None) -> None:
        self.loop, self.path, self.snapshot, self.log = loop, path, snapshot, log
        self.peers, self.saved = peers, saved
        self._timer: Any = None
        self._refresh: Any = None
        self._failed = False  # a write failed (logged once until one succeeds)
        self._saved_at = float("-inf")  # loop time of the last write

    def start(self) -> None:
        self.snapshot.forget_old(_now())
        self._write()  # (the seeds a join gave; not counted against joins' writes)
        self._refresh = self.loop.call_later(REFRESH_EVERY, self._note_peers)

    def joined(self, endpoint: str) -> None:
        """A peer joined: a member new to the snapshot is written at once (at most once a
        SAVE_EVERY: peers that come and go do not make a write each)."""
        if self.snapshot.saw([endpoint], _now()) and self._timer is None:
            wait = self._saved_at + SAVE_EVERY - self.loop.time()
            self._timer = self.loop.call_later(max(wait, 0.0), self._save)

    def stop(self) -> None:
        for timer in (self._timer, self._refresh):
            if timer is not None:
                timer.cancel()
        self._timer = self._refresh = None
        self.snapshot.saw(self.peers(), _now())
        self._save()

    def _note_peers(self) -> None:
        self.snapshot.saw(self.peers(), _now())
        gone = self.snapshot.forget_old(_now())
        if gone:
            self.log.info("cluster members forgotten: away too long", members=gone,
                          after_s=FORGET_AFTER)
        self._save()
        self._refresh = self.loop.call_later(REFRESH_EVERY, self._note_peers)

    def _save(self) -> None:
        self._timer = None
        self._saved_at = self.loop.time()
        self._write()

    def _write(self) -> None:
        try:
            save(self.path, self.snapshot)
        except OSError as exc:
            if not self._failed:
                self._failed = True
                self.log.warning("cannot write the cluster snapshot: after a restart this "
                                 "broker will not know its cluster's members",
                                 file=str(self.path), reason=exc.strerror or str(exc))
            return
        self._failed = False
        if self.saved is not None:
            self.saved()


def _now() -> float:
    return time.time()
