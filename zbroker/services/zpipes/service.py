"""The ZPIPES service: a ZMTP endpoint and a clock around the sans-I/O server core.

All protocol decisions are taken by the server core (``server.py``: ZpipesServer); this module
only moves frames between the client endpoint (``endpoint.py``: a ROUTER on the broker's ZMTP
server) and the core, carries out the actions the core returns, and calls the core's ``tick``
when its next deadline comes.

Each read from a client's connection hands its messages to the core, then the core's replies
are written, one gathered write per connection, without copying the frames: a READ_OK whose
chunk is one WRITE's is that WRITE's frame, turned into READ_OK in place.

Dead clients are noticed by the transport, not by the client timeout: a closed connection
detaches its client at once.

The endpoint guards the door as every ZMTP endpoint of the broker does
(:mod:`zbroker.zmtp.admission`): a connection to an ipc endpoint from a user that
``services.zpipes.allow`` does not admit (by the kernel's SO_PEERCRED on the accepted
socket), or one past ``clients.max_clients`` connections of the whole process, is closed
before a byte of it is read.
"""

from __future__ import annotations

import asyncio
import errno
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from zbroker import zmtp
from zbroker.runtime.limits import clients_problem
from zbroker.runtime.local_access import Policy, default_policy
from zbroker.service import ClusterPort, PeerBroker, Service, ServiceContext, ServiceError
from zbroker.zmtp.addresses import EndpointError
from zbroker.zmtp.admission import Admission
from zbroker.zmtp.refusals import Refusals
from zpipes import hint
from zpipes.protocol import SIGNATURE, MessageId

from .actions import Reply
from .config import MOVED_KEYS, ZpipesConfig
from .endpoint import Endpoint
from .server import SERVICE, ServerConfig, ZpipesServer, peer_terms

FRAME_OVERHEAD = 11  # WRITE header (7) and timeout (4) around a chunk
# A WRITE over max_chunk, up to this many times max_chunk, is refused by the core (WRITE_FAILED
# naming the limit) while its chunk is let go as it arrives; a frame larger than that is no
# ZPIPES client's, and its connection is dropped.
FRAME_LIMIT_FACTOR = 2
_WRITE_HEAD = SIGNATURE + bytes((MessageId.WRITE,))
MAX_FRAMES = 16  # a ZPIPES message is one frame; a few more reach the core, which says INVALID
STOP_LINGER_S = 0.5  # how long the last replies may take to go out at stop


def frame_limit(max_chunk: int) -> int:
    return FRAME_LIMIT_FACTOR * max_chunk + FRAME_OVERHEAD


def access_policy(config: Any) -> Policy:
    allow = config.services.zpipes.allow
    return default_policy(allow.users, allow.groups)


def server_config(config: Any) -> ServerConfig:
    """The core's settings from the broker's config (its own section, and the process's
    connection budget)."""
    z = config.services.zpipes
    return ServerConfig(
        capacity=z.capacity,
        client_timeout=z.client_timeout,
        max_chunk=z.max_chunk,
        max_clients=config.clients.max_clients,
        max_pipelined=z.max_pipelined,
        max_pipelined_bytes=z.max_pipelined_bytes,
        max_buffered=z.max_buffered,
        max_buffered_per_source=z.max_buffered_per_source or z.max_buffered // 2,
        animate=z.animate,
    )


class ZpipesService(Service):
    name = SERVICE
    start_order = 10
    config_section = ZpipesConfig
    moved_keys = MOVED_KEYS

    @classmethod
    def bound_endpoints(cls, config: Any, run_dir: Path) -> list[tuple[str, str]]:
        return [("services.zpipes.endpoint", config.services.zpipes.endpoint)]

    @classmethod
    def largest_message(cls, section: ZpipesConfig) -> int:
        return section.max_chunk

    @classmethod
    def metric_families(cls, metrics: Mapping[str, Any],
                        broker: Mapping[str, Any]) -> list[Any]:
        from .metrics import families

        return families(metrics, metrics.get("pipe_series", 0))

    @classmethod
    def top_tables(cls, status: Mapping[str, Any], before: Mapping[str, Any] | None,
                   interval: float | None) -> list[Any]:
        from .top import tables

        return tables(status, before, interval)

    def __init__(self) -> None:
        self.server: ZpipesServer | None = None
        self.endpoint = ""
        self._ep: Endpoint | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = float("inf")
        self._log: Any = None
        self._cluster: ClusterPort | None = None
        self._pipe_series = 0  # per-pipe metrics for this many pipes, the busiest
        self._bound: list[str] = []
        self._policy: Policy = default_policy()
        self._admission: Admission | None = None
        self._frame_limit = 0  # the largest frame whose connection is not dropped
        self._serving: asyncio.Task | None = None  # a new endpoint's server, being started
        self._lives: dict[str, str] = {}  # peer broker's member id -> its life (PeerBroker.id)
        self._rtts: dict[str, float] = {}  # member id -> the round trip last told the core

    async def start(self, ctx: ServiceContext, config: Any) -> None:
        section = config.services.zpipes
        self._pipe_series = section.pipe_series
        self.endpoint = section.endpoint  # the config has filled in the broker name
        self._loop, self._log, self._cluster = ctx.loop, ctx.log, ctx.cluster
        problem = clients_problem(config.clients.max_clients)
        if problem:
            raise ServiceError(problem)
        self._policy = access_policy(config)
        self._admission = Admission("zpipes", Refusals(ctx.log), self._policy,
                                    setting="services.zpipes.allow")
        self._frame_limit = frame_limit(section.max_chunk)
        self.server = ZpipesServer(server_config(config), ctx.log)
        server = self.server
        ep = Endpoint(ctx.loop, on_message=self._on_message, on_refused=self._on_refused,
                      on_gone=self._on_gone, after_input=self._after_input,
                      admission=self._admission,
                      max_bytes=section.max_chunk + FRAME_OVERHEAD, max_frames=MAX_FRAMES,
                      log=ctx.log, admit_frame=server.budget_problem)
        self._receive = server.receive
        # what the endpoint holds for readers that do not read and of WRITEs arriving counts
        # in the budget, and each source's writes in its share
        server.outside = ep
        try:
            sock = self._listen(ep, self.endpoint, f"a broker named {ctx.broker_name!r} is "
                                f"already running on this host ({self.endpoint} is in use)")
        except ServiceError:
            self.server = None
            raise
        await ep.serve(sock)
        self._ep = ep
        self._bound = [self.endpoint]
        self._schedule()
        ctx.log.info("zpipes bound", endpoint=self.endpoint,
                     capacity=section.capacity, max_chunk=section.max_chunk,
                     client_timeout=section.client_timeout, allowed=self._policy.describe())

    def _listen(self, ep: Endpoint, endpoint: str, in_use: str = "") -> Any:
        try:
            return ep.listen(endpoint)
        except EndpointError as exc:
            raise ServiceError(f"cannot bind ZPIPES to {endpoint}: {exc} (ZPIPES serves "
                               f"tcp:// and ipc:// endpoints)") from None
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise ServiceError(in_use or f"cannot bind ZPIPES to {endpoint}: it is in "
                                   f"use") from None
            raise ServiceError(f"cannot bind ZPIPES to {endpoint}: {exc.strerror}") from None

    async def stop(self) -> None:
        ep, server, loop = self._ep, self.server, self._loop
        if ep is None or server is None or loop is None:
            return
        if self._timer is not None:
            self._timer.cancel()
        server.shutdown(loop.time())
        self._flush()
        await ep.close_after(STOP_LINGER_S)  # let the last replies go out
        self._ep = None

    def reload(self, new: Any, old: Any) -> None:
        if self.server is None or self._ep is None:
            return
        section, before = new.services.zpipes, old.services.zpipes
        problem = clients_problem(new.clients.max_clients)
        if problem:
            raise ServiceError(problem)
        self._pipe_series = section.pipe_series
        if section.endpoint != before.endpoint and section.endpoint not in self._bound:
            # listen on the new endpoint too; closing the old one would drop its clients
            sock = self._listen(self._ep, section.endpoint)
            self._serving = self._loop.create_task(self._ep.serve(sock))
            self._bound.append(section.endpoint)
            self._log.warning("zpipes bound to a new endpoint; the old one stays bound until "
                              "a restart, so that its clients are not dropped",
                              endpoints=self._bound)
        if section.max_chunk != before.max_chunk:
            self._ep.set_max_bytes(section.max_chunk + FRAME_OVERHEAD)
            self._frame_limit = frame_limit(section.max_chunk)
            self._log.info("zpipes max_chunk changed", max_chunk=section.max_chunk)
        self.server.reconfigure(server_config(new))
        policy = access_policy(new)
        if policy != self._policy:
            self._policy = policy
            self._admission.set_policy(policy)
            self._log.info("zpipes access changed; it applies to connections made from now on",
                           allowed=policy.describe())

    def peer_joined(self, peer: PeerBroker) -> None:
        if self.server is not None:
            member = self._cluster.member_id() if self._cluster is not None else None
            if member is not None:
                self.server.set_member(member)
            self._lives[peer.member] = peer.id
            self.server.peer_up(peer.id, self._loop.time(), **peer_terms(peer))
            self._flush_outside()

    def features(self) -> dict[str, Any]:
        """It speaks the pipe directory (zpipes/directory.py), takes a DATA for several
        readers and one whose chunk is in its WRITE frame, and answers CONFIRM
        (zpipes/peering.py)."""
        return {"directory": True, "fanout": True, "write_frames": True, "confirm": True}

    def peer_left(self, peer: PeerBroker) -> None:
        if self._lives.get(peer.member) == peer.id:
            del self._lives[peer.member]
            self._rtts.pop(peer.member, None)
        if self.server is not None:
            self.server.peer_down(peer.id, self._loop.time())
            self._flush_outside()

    def peer_message(self, peer: PeerBroker, frames: list[Any]) -> None:
        if self.server is not None:
            self.server.peer_receive(peer.id, frames, self._loop.time())
            self._flush_outside()

    def _flush_outside(self) -> None:
        """Send what the core has after an event that did not come from a client."""
        self._flush()
        self._schedule()

    def status(self) -> dict[str, Any]:
        return {"endpoint": self.endpoint, "bound_endpoints": list(self._bound),
                "connections": self._connections(), "refused": self._refused(),
                **(self.server.status() if self.server else {})}

    def metrics(self) -> dict[str, Any]:
        if self.server is None:
            return {}
        pipe_series = self._pipe_series
        return {**self.server.metrics(), "connections": self._connections(),
                "refused": self._refused(), "pipe_series": pipe_series,
                "pipe_bytes": self.server.pipe_bytes() if pipe_series else []}

    def _connections(self) -> int:
        return self._ep.connections if self._ep is not None else 0

    def _refused(self) -> dict[str, int]:
        return self._admission.refused() if self._admission is not None else {}

    # --- I/O: the endpoint calls these -----------------------------------------------------

    def _on_message(self, routing_id: bytes, frames: list[Any]) -> None:
        if len(frames) == 1 and len(frames[0]) == len(hint.QUERY) \
                and bytes(frames[0]) == hint.QUERY:
            self._hint(routing_id)
            return
        self._receive(routing_id, frames, self._loop.time())

    def _hint(self, routing_id: bytes) -> None:
        """A client whose wait timed out asks what may be wrong here (zpipes/hint.py): the
        cluster's links, if this broker is in one."""
        text = self._cluster.hint() if self._cluster is not None else ""
        if self._ep is not None:
            self._ep.send(routing_id, hint.encode_reply(text))  # (written after the read)

    def _on_refused(self, routing_id: bytes, refused: zmtp.Refused) -> None:
        """A message over the endpoint's limit, max_chunk with a WRITE's header and timeout,
        or a WRITE whose chunk does not fit the broker's budget (services.zpipes.max_buffered) as
        its head arrives. A WRITE is refused by the core in its turn (WRITE_FAILED naming the limit
        or the budget), its chunk let go as it arrives, never held; a frame over twice the
        limit, or anything else that large, is no ZPIPES client's: its connection is dropped
        (its client detached)."""
        first, size = refused.first, refused.size
        if (size and size <= self._frame_limit and _WRITE_HEAD.startswith(first[:3])
                and (len(first) < 7
                     or int.from_bytes(first[3:7], "big") == size - FRAME_OVERHEAD)):
            chunk = size - FRAME_OVERHEAD
            over_budget = chunk <= self.server.config.max_chunk  # (not over the limit)
            self.server.receive_withheld_write(routing_id, chunk, self._loop.time(),
                                               refused.reason if over_budget else None)
            return
        client = self.server.clients.get(routing_id)
        self._log.warning("zpipes message refused; its connection is dropped", budget="lines",
                          client=client.id if client is not None else None,
                          reason=refused.reason)
        self._ep.hang_up(routing_id)

    def _on_gone(self, routing_id: bytes) -> None:
        self.server.disconnected(routing_id, self._loop.time())
        self._flush_outside()

    def _size_windows(self) -> None:
        """Tell the core each new round trip to a peer (the cluster's heartbeats measure
        them): the windows of the remote readers are sized to their links."""
        rtts = self._cluster.round_trips() if self._cluster is not None else None
        if rtts:
            for member, life in self._lives.items():
                rtt = rtts.get(member)
                if rtt is not None and rtt != self._rtts.get(member):
                    self._rtts[member] = rtt
                    self.server.peer_rtt(life, rtt)

    def _after_input(self) -> None:
        server = self.server
        self._flush()
        if server.next_deadline() < self._timer_at:
            self._schedule()

    def _flush(self) -> None:
        """Carry out what the core asks, in order: replies to clients (written together at
        the end, one gathered write per connection; first the connections of requests that
        waited, whose clients are idle until their answers come: the READ_OK a WRITE woke
        goes before that WRITE's WRITE_OK) and messages to peer brokers."""
        ep, server = self._ep, self.server
        if server is None:
            return
        out = server.take_output()
        send = ep.send if ep is not None else None
        while out:
            for action in out:
                if type(action) is Reply:
                    if send is not None:  # False: its client has gone, and is detached
                        send(action.routing_id, action.frame, action.wakes)
                else:
                    self._cluster.send(action.peer, action.frames)
            out = server.take_output()  # (what the core did meanwhile: a peer lost on a send)
        if ep is not None:  # (also what was sent beside the core: HINT answers)
            ep.flush()

    def _schedule(self) -> None:
        at = self.server.next_deadline()
        if at < self._timer_at:
            if self._timer is not None:
                self._timer.cancel()
            self._timer_at = at
            self._timer = self._loop.call_at(at, self._on_timer)

    def _on_timer(self) -> None:
        self._timer, self._timer_at = None, float("inf")
        if self.server is None or self._ep is None:
            return
        self.server.tick(self._loop.time())
        self._size_windows()
        self._flush()
        self._schedule()
