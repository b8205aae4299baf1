"""The ZPIPES service's section of the broker's config: ``services.zpipes``.

Built of zbroker.config's schema pieces (``setting``, ``section``, its parsers); the config
finds it as ``ZpipesService.config_section``. The clients' limits (``clients``), the state
machine's trace (``log.animate``) and the per-pipe metrics (``metrics.pipe_series``) are
shared sections' keys that the service reads too.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from zbroker.config import (
    boolean,
    id_list,
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

    def resolved(self, broker_name: str) -> ZpipesConfig:
        """``{name}`` in the endpoint becomes the broker's name."""
        return dataclasses.replace(self, endpoint=self.endpoint.replace("{name}", broker_name))

