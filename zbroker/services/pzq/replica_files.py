"""The files of replication, for the server: a queue's node id, the logs of the copies it
holds (``<data_dir>/replicas/<node>``) and the keys it took over (``<node>.taken``).

Blocking: called before the queue serves, or in an executor. The decisions are
replication.py's.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from zbroker.services.pzq.core.peering import is_node

from .store import Recovered, Store


def load_node_id(data_dir: Path) -> str:
    """This queue's node id: made once, kept in ``<data_dir>/node-id``."""
    path = data_dir / "node-id"
    try:
        text = path.read_text().strip()
        if is_node(text):
            return text
    except FileNotFoundError:
        pass
    text = uuid.uuid4().hex
    data_dir.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text + "\n")
    tmp.replace(path)
    return text


def open_logs(base: Path, max_origins: int, restore: Callable[[str, Recovered], bool],
              open_store: Callable[[str], Store], log: Any) -> dict[str, Store]:
    """Open the replica logs found in ``base``, at most ``max_origins``, giving each to
    ``restore`` (False: remove that log, it is empty and its node not accepted)."""
    stores: dict[str, Store] = {}
    if not base.is_dir():
        return stores
    removed, skipped = 0, []
    for d in sorted(base.iterdir()):
        if not (d.is_dir() and is_node(d.name)):
            continue
        if len(stores) >= max_origins:
            skipped.append(d.name)
            continue
        store = open_store(d.name)
        if restore(d.name, store.open()):
            stores[d.name] = store
        else:
            store.close()
            shutil.rmtree(d, ignore_errors=True)
            removed += 1
    if removed:
        log.info("pzq empty replica logs of nodes not accepted removed", removed=removed)
    if skipped:
        log.warning("pzq replica logs not opened: more origins than max_replica_origins",
                    limit=max_origins, skipped=len(skipped), first=skipped[0])
    return stores


def load_taken(base: Path) -> dict[str, list[bytes]]:
    """The keys taken over from each origin, one per line in ``<node>.taken``."""
    out: dict[str, list[bytes]] = {}
    if not base.is_dir():
        return out
    for path in base.glob("*.taken"):
        if is_node(path.stem):
            try:
                out[path.stem] = [k for k in path.read_bytes().split(b"\n") if k]
            except OSError:
                pass
    return out


def remember_taken(base: Path, node_id: str, keys: list[bytes], log: Any) -> None:
    """Append keys (they hold no newline) to ``<node>.taken``. If that fails, ``log`` gets
    a warning: it only costs duplicates, if the origin comes back."""
    try:
        base.mkdir(parents=True, exist_ok=True)
        with open(base / f"{node_id}.taken", "ab") as f:
            f.write(b"".join(k + b"\n" for k in keys))
    except OSError as exc:
        log.warning("pzq cannot record taken-over keys", node=node_id, error=str(exc))


def forget_taken(base: Path, node_id: str) -> None:
    (base / f"{node_id}.taken").unlink(missing_ok=True)
