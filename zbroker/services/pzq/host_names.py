"""Which host a replication log line is about: the queue's cores name a peer by its life (a
session id) and a replica origin by its node id (32 hex digits), which say nothing to whoever
reads the log. The service learns each one's broker label (``local@hosta (10.0.0.1)``) as
peers join and say which queues they host, and each such line gets a ``host`` field."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

#: ids remembered (lives and node ids, the most recent): far more than a cluster's
MAX_NAMES = 4096


class HostNames:
    def __init__(self, limit: int = MAX_NAMES) -> None:
        self._labels: OrderedDict[str, str] = OrderedDict()
        self._limit = limit

    def learn(self, ident: str, label: str) -> None:
        """``ident`` (a peer's life or a queue's node id) is on the broker ``label``."""
        if not label:
            return
        labels = self._labels
        labels[ident] = label
        labels.move_to_end(ident)
        while len(labels) > self._limit:
            labels.popitem(last=False)

    def name(self, fields: dict[str, Any]) -> dict[str, Any]:
        """``fields`` of a log line, with ``host`` for the peer or node they name (if known
        and not named already)."""
        if "host" in fields:
            return fields
        for key in ("peer", "node"):
            ident = fields.get(key)
            if isinstance(ident, str) and (label := self._labels.get(ident)):
                return {**fields, "host": label}
        return fields
