"""The connections libzmq accepts, kept inside their listener's part of the open-file limit.

The broker's control socket and its cluster port are libzmq sockets. libzmq accepts on them
without a cap, so a flood of plain TCP connections to the cluster port (before any key is
checked) used up the process's descriptors, and libzmq aborts the whole process when accepting
on an ipc listener then fails with EMFILE (its ipc listener does not expect that error): the
next ``zbroker status`` killed the broker.

A :class:`LibzmqDoor` watches one such socket through its monitor. Every connection accepted
(``ZMQ_EVENT_ACCEPTED`` carries its descriptor) takes a place in the listener's budget
(:mod:`zbroker.zmtp.admission`; its size is the listener's part of the open-file limit, see
:mod:`zbroker.runtime.limits`) by its source, a host or a uid; one that gets none is shut down
at once with shutdown(2), not closed: the descriptor stays libzmq's, which closes it on the
end of stream. Sources not trusted yet (a host that no admitted peer came from) share a small
pool of their own, so that a flood from strangers leaves the budget to the peers. libzmq's
handshake deadline (``ZMQ_HANDSHAKE_IVL``, set by :meth:`LibzmqDoor.prepare` before the bind)
drops the connections that say nothing.

The monitor's events come in the order libzmq made them (the broker's context has one I/O
thread): the DISCONNECTED of a descriptor comes before the ACCEPTED of the next connection
given its number. When an event is read, its descriptor may be closed already, even reused;
so a descriptor is judged, and shut down, only while it is still a connection to this listener,
and the places held are checked against their descriptors' inodes every few seconds (an
engine ended by its session says no DISCONNECTED).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import socket
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import zmq
from zmq.utils.monitor import parse_monitor_message

from zbroker.runtime.local_access import peer_of
from zbroker.runtime.zmq_reader import SocketReader

from .admission import SOURCE_FULL, TOO_MANY, Admission, Source, describe

#: connections held by sources not trusted yet, in all and each (a peer's broker needs one)
UNTRUSTED_LIMIT = 64
UNTRUSTED_SHARE = 4
SWEEP_EVERY = 2.0  # seconds between checks that the places held are still connections
TRUSTED_REMEMBERED = 1024  # sources trusted, the most recent kept
_WATCHED = zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED


@dataclasses.dataclass
class _Place:
    source: Source
    inode: int
    untrusted: bool


class LibzmqDoor:
    """The door of one libzmq listening socket. ``admission``: its budget and refusals.
    ``untrusted_limit``/``untrusted_share``: the pool of connections from sources not
    :meth:`trust`-ed (None: every source is trusted, as on the control socket, whose
    sources are local users)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, admission: Admission, *,
                 untrusted_limit: int | None = None,
                 untrusted_share: int = UNTRUSTED_SHARE) -> None:
        self.loop = loop
        self.admission = admission
        self.untrusted_limit = untrusted_limit
        self.untrusted_share = untrusted_share
        self._places: dict[int, _Place] = {}
        self._hung_up: set[int] = set()  # shut down, their DISCONNECTED still to come
        self._untrusted: dict[Source, int] = {}
        self._trusted: OrderedDict[Source, None] = OrderedDict()
        self._listener: Any = None  # the listening address, as getsockname() says it
        self._reader: SocketReader | None = None
        self._sock: zmq.Socket[Any] | None = None
        self._on_other: Callable[[dict[str, Any]], None] | None = None
        self._sweep: asyncio.TimerHandle | None = None

    def prepare(self, sock: zmq.Socket[Any]) -> None:
        """Before the bind: the handshake deadline (libzmq copies options at bind time)."""
        sock.setsockopt(zmq.HANDSHAKE_IVL, int(self.admission.handshake_timeout * 1000))

    def watch(self, sock: zmq.Socket[Any], addr: str, also: int = 0,
              on_other: Callable[[dict[str, Any]], None] | None = None) -> None:
        """After the bind: follow ``sock``'s connections (its one monitor, at inproc
        ``addr``). ``also``: more events of the monitor, given to ``on_other``."""
        self._listener = _listening_address(sock)
        self._sock, self._on_other = sock, on_other
        monitor = sock.get_monitor_socket(_WATCHED | also, addr=addr)
        self._reader = SocketReader(self.loop, monitor, self._on_event)
        self._reader.start()
        self._sweep = self.loop.call_later(SWEEP_EVERY, self._check_places)

    def stop(self) -> None:
        """Stop watching (before the socket closes); every place held is given back."""
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        reader, self._reader = self._reader, None
        if reader is not None:
            reader.stop()
            if self._sock is not None:
                try:
                    self._sock.disable_monitor()
                except zmq.ZMQError:
                    pass
            reader.sock.close(linger=0)
        for fd in list(self._places):
            self._give_back(fd)
        self._hung_up.clear()

    def trust(self, source: Source) -> None:
        """Connections of ``source`` leave the strangers' pool (it is a peer's host)."""
        self._trusted[source] = None
        self._trusted.move_to_end(source)
        if len(self._trusted) > TRUSTED_REMEMBERED:
            self._trusted.popitem(last=False)
        if self._untrusted.pop(source, None) is not None:
            for place in self._places.values():
                if place.source == source:
                    place.untrusted = False

    def status(self) -> dict[str, Any]:
        return {"connections": len(self._places),
                "untrusted": sum(self._untrusted.values()),
                "refused": self.admission.refused()}

    # --- the monitor's events ------------------------------------------------------------

    def _on_event(self, frames: list[bytes]) -> None:
        event: dict[str, Any] = dict(parse_monitor_message(frames))
        kind, fd = event["event"], event["value"]
        if kind == zmq.EVENT_ACCEPTED:
            self._accepted(fd)
        elif kind == zmq.EVENT_DISCONNECTED:
            if fd in self._hung_up:
                self._hung_up.discard(fd)
            elif fd in self._places:
                self._give_back(fd)
        elif self._on_other is not None:
            self._on_other(event)

    def _accepted(self, fd: int) -> None:
        if fd in self._places:  # its end went unsaid: the number is another's now
            self._give_back(fd)
        self._hung_up.discard(fd)
        found = self._inspect(fd)
        if found is None:  # closed already (its DISCONNECTED follows), or not ours
            return
        source, inode = found
        untrusted = self.untrusted_limit is not None and source not in self._trusted
        why = self._strangers_full(source) if untrusted else None
        if why is None:
            why = self.admission.admit(None, source)
        if why is not None:
            _shut_down(fd)
            self._hung_up.add(fd)
            return
        self._places[fd] = _Place(source, inode, untrusted)
        if untrusted:
            self._untrusted[source] = self._untrusted.get(source, 0) + 1

    def _strangers_full(self, source: Source) -> str | None:
        """Why the pool of untrusted sources has no place for ``source``, or None."""
        held = self._untrusted.get(source, 0)
        limit = self.untrusted_limit if self.untrusted_limit is not None else 0
        if sum(self._untrusted.values()) >= limit:
            self.admission.refusals.note(
                TOO_MANY, f"{self.admission.what} connection refused: too many connections "
                "from hosts that are not peers", limit=limit,
                source=describe(source))
            return TOO_MANY
        if held >= self.untrusted_share:
            self.admission.refusals.note(
                SOURCE_FULL, f"{self.admission.what} connection refused: too many "
                "connections from one host that is not a peer", source=describe(source),
                max_per_source=self.untrusted_share)
            return SOURCE_FULL
        return None

    def _give_back(self, fd: int) -> None:
        place = self._places.pop(fd)
        self.admission.release(place.source)
        if place.untrusted and place.source in self._untrusted:
            left = self._untrusted[place.source] - 1
            if left:
                self._untrusted[place.source] = left
            else:
                del self._untrusted[place.source]

    def _check_places(self) -> None:
        """Give back the places whose descriptors are no longer their connections."""
        for fd, place in list(self._places.items()):
            try:
                same = os.fstat(fd).st_ino == place.inode
            except OSError:
                same = False
            if not same:
                self._give_back(fd)
        self._sweep = self.loop.call_later(SWEEP_EVERY, self._check_places)

    def _inspect(self, fd: int) -> tuple[Source, int] | None:
        """(source, inode) of descriptor ``fd`` if it is a connection to our listener."""
        try:
            sock = socket.socket(fileno=fd)
        except OSError:
            return None
        try:
            if not _same_listener(sock.getsockname(), self._listener):
                return None
            if sock.family == socket.AF_UNIX:
                peer = peer_of(fd)
                if peer is None:
                    return None
                source: Source = ("uid", peer.uid)
            else:
                source = ("host", sock.getpeername()[0])
            return source, os.fstat(fd).st_ino
        except OSError:
            return None
        finally:
            sock.detach()


def _shut_down(fd: int) -> None:
    """End connection ``fd`` without closing the descriptor (libzmq's to close)."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    finally:
        sock.detach()


def _listening_address(sock: zmq.Socket[Any]) -> str | int:
    """What the connections of ``sock``'s listener have as their own address: the socket's
    path (ipc) or port (tcp: their host is the interface each came in by)."""
    endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
    kind, _, rest = endpoint.partition("://")
    if kind == "ipc":
        return "\0" + rest[1:] if rest.startswith("@") else rest
    return int(rest.rpartition(":")[2])


def _same_listener(address: Any, listener: str | int) -> bool:
    """Whether a connection's own address (getsockname) is one of ``listener``'s."""
    if isinstance(listener, int):
        return isinstance(address, tuple) and address[1] == listener
    if isinstance(address, bytes):
        address = address.decode("utf-8", "surrogateescape")
    return bool(address == listener)
