"""The pzq service's section of the broker's config: ``services.pzq``, its queues and their
defaults.

Built of zbroker.config's schema pieces (``setting``, ``section``, its parsers); the config
finds it as ``PzqService.config_section``. The defaults of a queue's limits and of its store
are the pzq core's own (Limits, Store); the ``pzq`` command and QueueSettings take theirs
from here.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from zbroker.config import (
    Invalid,
    boolean,
    broker_name,
    choice,
    duration,
    endpoint_list,
    integer,
    optional,
    optional_path,
    optional_served_endpoint,
    schema_fields,
    seconds,
    section,
    served_endpoint,
    setting,
    show,
    size,
)
from zbroker.services.pzq.core.group_commit import (
    DEFAULT_MAX_BATCH_BYTES,
    DEFAULT_SYNC,
    DEFAULT_SYNC_WINDOW,
)
from zbroker.services.pzq.core.group_commit import SYNC_MODES as PZQ_SYNC_MODES
from zbroker.services.pzq.core.queue import MODES as PZQ_MODES
from zbroker.services.pzq.core.queue import Limits

from .store import DEFAULT_SEGMENT_SIZE

MAX_MESSAGE_LIMIT = 2**32 - 1  # the bound max_message_size has always had (4 GiB - 1)

_NODE_ID_RE = re.compile(r"[0-9a-f]{32}")


def node_id_list(value: Any) -> tuple[str, ...]:
    """pzq node ids: 32 lower-case hex digits each (a queue's ``<data_dir>/node-id``)."""
    what = "a list of pzq node ids (32 hex digits, from a queue's <data_dir>/node-id)"
    if value is None:
        return ()
    if not isinstance(value, list):
        raise Invalid(what)
    out = []
    for v in value:
        if not isinstance(v, str) or not _NODE_ID_RE.fullmatch(v.strip().lower()):
            raise Invalid(f"{what}; got {show(v)}")
        out.append(v.strip().lower())
    return tuple(out)


@dataclass(frozen=True)
class PzqQueueConfig:
    """The settings of one pzq queue (durations in seconds, sizes in bytes)."""

    mode: str = setting(PZQ_MODES[0], choice(*PZQ_MODES))  # stream: read by offset (docs/pzq.md)
    stream_endpoint: str = setting("tcp://127.0.0.1:11133", served_endpoint)  # stream queues only
    #: stream queues: null, or the bytes of messages kept (past it the oldest go, read or not)
    retention_bytes: int | None = setting(None, optional(size(minimum=1)))
    #: stream queues: null, or the seconds messages are kept (then they go, read or not)
    retention_seconds: float | None = setting(None, optional(duration()))
    receive_endpoint: str = setting("tcp://127.0.0.1:11131", served_endpoint)  # producers
    send_endpoint: str = setting("tcp://127.0.0.1:11132", served_endpoint)  # consumers
    #: null: off. Consumers there say READY with a window and never get more (docs/pzq.md)
    credit_endpoint: str | None = setting(None, optional_served_endpoint)
    #: null: ipc://<run_dir>/pzq/<queue>.monitor
    monitor_endpoint: str | None = setting(None, optional_served_endpoint)
    #: null: $XDG_DATA_HOME/zbroker/<name>/pzq/<queue> (~/.local/share/... without it)
    data_dir: str | None = setting(None, optional_path)
    sync: str = setting(DEFAULT_SYNC, choice(*PZQ_SYNC_MODES))
    sync_window: float = setting(DEFAULT_SYNC_WINDOW, seconds)
    #: most bytes one fdatasync covers
    sync_max_bytes: int = setting(DEFAULT_MAX_BATCH_BYTES, size(minimum=4096))
    segment_size: int = setting(DEFAULT_SEGMENT_SIZE, size(minimum=4096))
    ack_timeout: float = setting(Limits.ack_timeout, duration())
    reaper_frequency: float = setting(2.5, duration())
    inflight_window: int = setting(Limits.inflight_window, integer(minimum=1, maximum=100_000))
    inflight_size: int = setting(Limits.inflight_size, size(minimum=1))
    max_message_size: int = setting(Limits.max_message_size,
                                    size(minimum=1, maximum=MAX_MESSAGE_LIMIT))
    max_backlog: int = setting(Limits.max_backlog, size(minimum=1))
    idempotence_window: int = setting(Limits.idempotence_window, integer(minimum=0))
    #: the idempotence window also keeps at most this many bytes of ids (the oldest go first)
    idempotence_bytes: int = setting(Limits.idempotence_bytes, size(minimum=0))
    max_frames: int = setting(Limits.max_frames, integer(minimum=2, maximum=1 << 20))  # per message
    replicas: int = setting(Limits.replicas, integer(minimum=0))  # copies on peers before the ACK
    replication_timeout: float = setting(Limits.replication_timeout, duration())
    peers: tuple[str, ...] = setting((), endpoint_list)  # peer queues' receive endpoints
    node_timeout: float = setting(10.0, duration())  # a silent peer's copies are taken over
    #: node ids of the queues whose copies this queue holds over static peers (REPLICA:<node>
    #: on its receive endpoint); none: such copies are refused
    replica_sources: tuple[str, ...] = setting((), node_id_list)
    #: origins whose copies this queue holds at once (static peers and the cluster)
    max_replica_origins: int = setting(16, integer(minimum=1, maximum=4096))


def pzq_queues(value: Any) -> tuple[tuple[str, tuple[tuple[str, Any], ...]], ...] | None:
    """null, or a mapping of queue name -> settings of PzqQueueConfig (what differs from
    ``services.pzq.defaults``); kept as (name, ((key, parsed value), ...)) pairs."""
    what = "null, or a mapping of queue names to mappings of queue settings"
    if value is None:
        return None
    if not isinstance(value, Mapping) or not value:
        raise Invalid(what)
    fields = {f.name: f for f in schema_fields(PzqQueueConfig)}
    out = []
    for name, settings in value.items():
        try:
            broker_name(name)
        except Invalid as exc:
            raise Invalid(f"{what}; queue {name!r}: the name must be {exc}") from None
        if settings is None:
            settings = {}
        if not isinstance(settings, Mapping):
            raise Invalid(f"{what}; queue {name!r}: got {show(settings)}")
        items = []
        for key, raw in settings.items():
            if key not in fields:
                raise Invalid(f"{what}; queue {name!r}: unknown key {key!r}, known keys: "
                               + ", ".join(fields))
            try:
                items.append((key, fields[key].metadata["parse"](raw)))
            except Invalid as exc:
                raise Invalid(f"{what}; queue {name!r}: {key}: got {show(raw)}, "
                               f"expected {exc}") from None
        out.append((name, tuple(items)))
    return tuple(out)


@dataclass(frozen=True)
class PzqConfig:
    enabled: bool = setting(False, boolean)
    defaults: PzqQueueConfig = section(PzqQueueConfig)
    #: null: one queue named "default" with the defaults
    queues: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...] | None = setting(None, pzq_queues)

    def queue_configs(self) -> dict[str, PzqQueueConfig]:
        """Each queue's settings: the defaults with what the queue changes."""
        if self.queues is None:
            return {"default": self.defaults}
        return {name: dataclasses.replace(self.defaults, **dict(items))
                for name, items in self.queues}

