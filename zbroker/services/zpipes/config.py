"""The ZPIPES service's section of the broker's config: ``services.zpipes``.

Built of zbroker.config's schema pieces (``setting``, ``section``, its parsers); the config
finds it as ``ZpipesService.config_section``. What the service allows its clients, the state
machine's trace and the per-pipe metrics are here too; they were keys of the broker's
sections before (``MOVED_KEYS``: the old names still work, and are told the new ones). The
connection budget of the whole process stays the broker's (``clients.max_clients``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from zbroker.config import (
    boolean,
    duration,
    id_list,
    integer,
    optional,
    section,
    served_endpoint,
    setting,
    size,
)

MAX_CHUNK_LIMIT = 2**32 - 1  # a ZPIPES chunk carries a 4-octet length


def user_list(value: Any) -> tuple[int | str, ...]:
    from zbroker.runtime.local_access import user_id

    return id_list("user", user_id, star=True)(value) or ()


def group_list(value: Any) -> tuple[int, ...] | None:
    from zbroker.runtime.local_access import group_id

    return id_list("group", group_id, star=False)(value)


@dataclass(frozen=True)
class ZpipesAllowConfig:
    """Who may connect to an ipc endpoint (tcp endpoints are open to whoever reaches them)."""

    #: besides the broker's own user and root (names or uids); ["*"]: anyone
    users: tuple[int | str, ...] = setting((), user_list)
    #: members of these groups (names or gids); null: the broker's own group
    groups: tuple[int, ...] | None = setting(None, group_list)


@dataclass(frozen=True)
class ZpipesConfig:
    enabled: bool = setting(True, boolean)
    endpoint: str = setting("ipc://@/zpipes/{name}", served_endpoint)
    capacity: int = setting(1 << 20, size(minimum=1))  # bytes buffered per reader
    max_chunk: int = setting(16 << 20, size(minimum=1, maximum=MAX_CHUNK_LIMIT))
    allow: ZpipesAllowConfig = section(ZpipesAllowConfig)
    client_timeout: float = setting(60.0, duration())  # silence before a client is expired
    max_pipelined: int = setting(64, integer(minimum=1))  # queued commands per client
    max_pipelined_bytes: int = setting(8 << 20, size(minimum=1))
    #: data held for all clients together (waiting and queued WRITEs, pipe buffers, answers
    #: not yet taken by their readers)
    max_buffered: int = setting(256 << 20, size(minimum=1))
    #: what one source's clients may hold of it (WRITEs waiting or queued); null: half
    max_buffered_per_source: int | None = setting(None, optional(size(minimum=1)))
    animate: bool = setting(False, boolean)  # trace every state machine transition
    #: per-pipe byte counters for this many pipes, the busiest; 0: none (totals only)
    pipe_series: int = setting(0, integer(minimum=0, maximum=1000))

    def resolved(self, broker_name: str) -> ZpipesConfig:
        """``{name}`` in the endpoint becomes the broker's name."""
        return dataclasses.replace(self, endpoint=self.endpoint.replace("{name}", broker_name))


#: keys of the broker's sections that are this section's now: old name -> key here
MOVED_KEYS = {
    "clients.timeout": "client_timeout",
    "clients.max_pipelined": "max_pipelined",
    "clients.max_pipelined_bytes": "max_pipelined_bytes",
    "clients.max_buffered": "max_buffered",
    "clients.max_buffered_per_source": "max_buffered_per_source",
    "log.animate": "animate",
    "metrics.pipe_series": "pipe_series",
}
