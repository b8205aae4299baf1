"""The ZPIPES server core: the broker's side of the pipes, with no I/O.

The caller (the broker's ZPIPES service) feeds it what arrives and what time it is::

    server.receive(routing_id, frames, now)   # a message from a client
    server.tick(now)                          # at server.next_deadline(): timeouts, expiry
    server.disconnected(routing_id, now)      # the client's connection is gone
    server.unreachable(routing_id, now)       # a reply could not be delivered
    server.shutdown(now)                      # the broker is stopping
    server.peer_up/peer_rtt/peer_down/peer_receive(peer, ...)   # the cluster's peer brokers

and carries out, in order, what ``server.take_output()`` returns: actions.py's ``Reply`` (a
frame to a client) and ``SendPeer`` (a message to a peer broker).

The core is three parts around one pipe table (pipes.py), each with its own state:

    engine.py     the clients: their state machines (machine.py), requests and replies
    links.py      the peer brokers: remote ends, DATA, CREDIT, windows, confirmations
    directory.py  the pipe directory: the homes of our ends, and the ends we hold as a home

This facade wires them together, dispatches peer messages (peering.py) to the part that
handles each, and answers for status and metrics.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from . import peering
from .buffers import Outside
from .clients import Client
from .directory import DirectoryMember
from .engine import ClientEngine, ServerConfig
from .failures import FAILURE_KINDS
from .links import PeerLinks
from .pipes import PipeTable, shown

if TYPE_CHECKING:
    from zbroker.service import PeerBroker

__all__ = ["FAILURE_KINDS", "SERVICE", "ServerConfig", "ZpipesServer", "peer_terms"]

SERVICE = "zpipes"  # the service's name: its messages' on the cluster, its features' key


def peer_terms(peer: PeerBroker) -> dict[str, Any]:
    """What ``ZpipesServer.peer_up`` is told of a peer's life as the cluster gives it (its
    member id, its label) and of what its HELLO said ZPIPES does there (the ``features`` of
    SERVICE): the directory, a DATA for several readers, a chunk in its WRITE frame, and
    CONFIRM, taken only on a numbered link (a CONFIRMED proves what came before it only if
    the link's order and losses are known). A feature is said with ``true``; anything else,
    or nothing (a broker of before), is not."""
    said = peer.features_of(SERVICE)
    return {"member": peer.member, "label": peer.label,
            "directory": said.get("directory") is True,
            "fanout": said.get("fanout") is True,
            "write_frames": said.get("write_frames") is True,
            "confirm": said.get("confirm") is True and peer.numbered}


class ZpipesServer:
    """The broker's ZPIPES core: a client engine, peer links and a directory member sharing
    one pipe table and one output."""

    def __init__(self, config: ServerConfig | None = None, log: Any = None) -> None:
        config = config or ServerConfig()
        self.log = log if log is not None else _NullLog()
        self.pipes = PipeTable(config.capacity)
        self._out: list[Any] = []  # the actions of all three parts, in order
        woken: deque[int] = deque()  # ends the pipe table says may now be answered
        end_ids = itertools.count(1)  # our ends' ids and our proxies' (one table)
        # one way: the engine tells the links and the directory of its ends, the directory
        # attaches through the links, and neither calls back: what they do to ends is in
        # the pipe table and ``woken``, the CLOSEs they let go are answered here
        self.links = PeerLinks(self.log, self.pipes, self._out, woken, end_ids)
        self.directory = DirectoryMember(self.log, self.pipes, self._out, woken, self.links)
        self.engine = ClientEngine(config, self.log, self.pipes, self._out, woken, end_ids,
                                   self.links, self.directory)
        links, directory = self.links, self.directory
        self._handlers: dict[type, Callable[[str, Any], None]] = {
            peering.Data: links.on_data,
            peering.Credit: links.on_credit,
            peering.Attach: links.on_attach,
            peering.Detach: links.on_detach,
            peering.Confirm: links.on_confirm,
            peering.Confirmed: links.on_confirmed,
            peering.Register: directory.on_register,
            peering.Registered: directory.on_registered,
            peering.Unregister: directory.on_unregister,
            peering.Introduce: directory.on_introduce,
            peering.PeerDecodeError: self._invalid,
        }
        # the clients' events go straight to the engine (no call in between, per message)
        engine = self.engine
        self.receive = engine.receive
        self.receive_withheld_write = engine.receive_withheld_write
        self.tick = engine.tick
        self.next_deadline = engine.next_deadline
        self.disconnected = engine.disconnected
        self.unreachable = engine.unreachable
        self.shutdown = engine.shutdown
        self.reconfigure = engine.reconfigure
        self.budget_problem = engine.buffers.problem

    def take_output(self) -> list[Any]:
        """The actions recorded since the last call, in order (actions.py)."""
        out = self._out
        if not out:
            return []
        taken = out[:]
        out.clear()  # (the parts hold this list: it stays)
        return taken

    # --- the parts' state, as the service and the tests ask for it ----------------------------

    @property
    def config(self) -> ServerConfig:
        return self.engine.config

    @property
    def clients(self) -> dict[bytes, Client]:
        return self.engine.clients

    @property
    def held(self) -> int:
        return self.engine.held

    @property
    def peers(self) -> set[str]:
        return self.links.peers

    @property
    def outside(self) -> Outside:
        return self.engine.buffers.outside

    @outside.setter
    def outside(self, outside: Outside) -> None:
        """What the I/O layer holds of the clients' bytes (it counts in the budget), and who
        each client is (buffers.py): the client endpoint."""
        self.engine.buffers.outside = outside

    # --- peer brokers ------------------------------------------------------------------------

    def set_member(self, member_id: str) -> None:
        """This broker's id among the members (its cluster start id): the hash that picks
        pipes' homes takes it. Set before the first peer comes."""
        self.directory.set_member(member_id)

    def peer_up(self, peer: str, now: float, member: str = "",
                directory: bool = False, fanout: bool = False,
                write_frames: bool = False, confirm: bool = False, label: str = "") -> None:
        """A peer broker joined (a new life of it: ``peer`` names one session). ``member``:
        its id among the members (the same for all of them); ``directory``: it speaks the
        pipe directory; ``fanout``: it takes a DATA (and a CREDIT) for several readers;
        ``write_frames``: a DATA whose chunk is in its WRITE frame; ``confirm``: it answers
        CONFIRM, and its link numbers messages (what came before a CONFIRMED did arrive);
        ``label``: how people are told of it (in the reasons of the ends it breaks).
        Then our ends whose home it now is register with it; otherwise it is told of every end
        we have, so pipes opened before it came find their other ends."""
        self.engine.now = self.directory.now = now
        self.links.up(peer, fanout, write_frames, confirm, label)
        if self.directory.peer_up(peer, member, directory, now):
            self.links.speaks_directory(peer)
        self._answer_awaited()
        self.engine.wake()

    def peer_rtt(self, peer: str, rtt: float) -> None:
        """A round trip to ``peer`` (its heartbeat's, measured while the link was idle): the
        windows of its readers are sized to it (links.py)."""
        if self.links.rtt(peer, rtt):
            self.engine.wake()

    def peer_down(self, peer: str, now: float) -> None:
        """A peer broker was lost: the streams that ran through it break (*_FAILED "peer
        lost"), never end quietly. What it had registered with us is forgotten, and our ends
        whose home it was register with their new home: no pipe of other brokers fails."""
        self.engine.now = now
        self.links.down(peer)
        self.directory.peer_down(peer)
        # (last: a CLOSE answered takes the client's queued commands, which must find the
        # peer gone everywhere)
        self.links.fail_confirmations(peer)
        self._answer_awaited()
        self.engine.wake()

    def peer_receive(self, peer: str, frames: Sequence[bytes | memoryview], now: float) -> None:
        """A ZPIPES peer message from ``peer``: to the part that handles its kind."""
        self.engine.now = self.directory.now = now
        if peer not in self.links.peers:
            return  # late traffic of a peer already declared lost
        msg = peering.decode(frames)
        self._handlers[type(msg)](peer, msg)
        self._answer_awaited()
        self.engine.wake()

    def _answer_awaited(self) -> None:
        """The CLOSEs the links let go (every broker confirmed, or one was lost)."""
        for client in self.links.take_answered():
            self.engine.answer_awaited(client)

    def _invalid(self, peer: str, msg: peering.PeerDecodeError) -> None:
        self.log.warning("invalid peer message", peer=peer, error=msg.reason)

    # --- questions ---------------------------------------------------------------------------

    def link_counts(self) -> dict[str, int]:
        """What crossed the links to peer brokers: DATA messages and their chunks' bytes,
        CREDIT messages."""
        return self.links.counts()

    def status(self) -> dict[str, Any]:
        return {
            "clients": len(self.engine.clients),
            # the windows of the readers of each peer whose round trip is known (bytes in
            # flight to one reader: at least the capacity)
            "link": {**self.link_counts(),
                     "windows": {peer: max(window, self.config.capacity)
                                 for peer, window in self.links.windows.items()}},
            "pipes": {
                shown(name): {
                    "readers": len(pipe.readers), "writers": len(pipe.writers),
                    "remote_ends": (sum(1 for r in pipe.readers.values() if r.remote)
                                    + sum(1 for w in pipe.writers.values() if w.remote)),
                    "buffered": sum(r.queued for r in pipe.readers.values() if not r.remote),
                    "bytes_written": sum(w.bytes_in for w in pipe.writers.values()),
                    "bytes_read": sum(r.bytes_out for r in pipe.readers.values()),
                }
                for name, pipe in self.pipes.pipes.items()
            },
        }

    def pipe_bytes(self) -> list[tuple[str, int, int]]:
        """(pipe name, bytes written, bytes read) of each open pipe, by this broker's clients."""
        out = []
        for name, pipe in self.pipes.pipes.items():
            written = sum(w.bytes_in for w in pipe.writers.values() if not w.remote)
            read = sum(r.bytes_out for r in pipe.readers.values() if not r.remote)
            out.append((name.decode("utf-8", errors="backslashreplace"), written, read))
        return out

    def metrics(self) -> dict[str, Any]:
        """Totals for metrics, as plain data: counts of this broker's own clients' ends
        (remote ends stand in for other brokers' clients, which those count)."""
        engine = self.engine
        readers = writers = 0
        written, read = engine.ends.closed_bytes_written, engine.ends.closed_bytes_read
        buffered = 0
        for pipe in self.pipes.pipes.values():
            for r in pipe.readers.values():
                if not r.remote:
                    readers += 1
                    read += r.bytes_out
                    buffered += r.queued
            for w in pipe.writers.values():
                if not w.remote:
                    writers += 1
                    written += w.bytes_in
        return {"clients": len(engine.clients), "pipes": len(self.pipes.pipes),
                "readers": readers, "writers": writers, "buffered_bytes": buffered,
                "held_bytes": engine.held, "bytes_written": written, "bytes_read": read,
                "clients_expired": engine.clients_expired,
                "clients_disconnected": engine.clients_disconnected,
                "link": self.link_counts(),
                "ends_failed": [(role, kind, n) for (role, kind), n in
                                engine.ends_failed.items()]}


class _NullLog:
    def _drop(self, *args: Any, **kwargs: Any) -> None:
        pass

    def is_enabled_for(self, level: int) -> bool:
        return False

    debug = info = warning = error = _drop
