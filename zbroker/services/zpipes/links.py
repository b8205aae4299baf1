"""The links to peer brokers: the streams of pipes whose ends are on different brokers. No I/O.

An end on another broker stands in this broker's pipe table as a *remote* end (a proxy, with an
end id of ours), attached when that broker tells of it (ATTACH, or a home's INTRODUCE) and
detached at its DETACH or when its broker is lost. What the pipe table has for remote readers
goes to their brokers as DATA (a chunk once per broker of its readers, or once per reader to a
broker of before), and what local readers took of remote writers' data goes back as CREDIT.
A remote reader's window (bytes in flight to it) is sized to the round trip to its broker.

A writer's CLOSE may wait for CONFIRMED from the brokers of its stream's readers (those that
answer CONFIRM): its end, and all the DATA before it, arrived there. The messages are
peering.py's; they are recorded as actions (actions.py) in the server core's output.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from zpipes import protocol as p

from . import peering
from .actions import SendPeer
from .failures import from_peer, peer_lost
from .pipes import PipeTable, pipe_name_problem, shown

if TYPE_CHECKING:
    from .clients import Client

# Only needs to span the time an introduction takes to arrive (a round trip or so), and is kept
# only while a peer speaks the directory (only those introduce).
MAX_TOMBS = 16384  # remote ends detached, remembered against late introductions of them
#: chunks smaller than this go to peers as they are, not in their WRITE frame: the reader's
#: broker copies a READ_OK that small into ZeroMQ's message anyway
FRAMED_MIN = 1 << 16
#: A remote reader's window (bytes in flight to it) is sized to its link: twice the round trip
#: to its broker at LINK_RATE, at least the capacity and at most MAX_WINDOW, which bounds what
#: a reader that does not read costs its broker. So a stream may reach twice LINK_RATE on links
#: of 2 to 32 ms, and on a LAN (a round trip under 2 ms) the window is the capacity: larger
#: ones were measured to cost the reader's broker CPU there (data going cold between hops)
#: and to gain nothing.
LINK_RATE = 256 << 20  # bytes a second
MAX_WINDOW = 16 << 20
#: the round trip taken is the least of the last few reported: a heartbeat's echo also waits
#: for both brokers' event loops, which a busy host delays by milliseconds (measured here: 0.4
#: to 5 ms over one veth link), while the least is close to the link's own
RTT_SAMPLES = 16


class PeerLinks:
    """The peer brokers of this one and the remote ends that stand for their clients' ends.
    It calls none of the server core's other parts: what it does to ends is in the pipe table
    (the ends it wakes in ``woken``), what it sends in the output, and the CLOSEs whose
    waiting is over in :meth:`take_answered`, for the core to answer."""

    def __init__(self, log: Any, pipes: PipeTable, out: list[Any], woken: deque[int],
                 end_ids: Iterator[int]) -> None:
        # per-pipe lines that peers (brokers of the cluster) cause have a budget a second for
        # each kind (zbroker/logs/budget.py's "peer"), larger than for clients (a peer tells
        # many ends at once when it links)
        self.log = log
        self.pipes = pipes
        self.out = out  # the server core's output (actions.py)
        self._woken = woken  # ends the pipe table says may now be answered
        self._end_ids = end_ids  # (shared with the clients' ends: one table)
        self.peers: set[str] = set()
        self._proxies: dict[tuple[str, int], int] = {}  # (peer, its end) -> our stand-in end
        self._proxy_of: dict[int, tuple[str, int]] = {}
        self._fanout: set[str] = set()  # peers that take a DATA or CREDIT for several readers
        self._write_frames: set[str] = set()  # peers that take a chunk in its WRITE frame
        self._confirming: set[str] = set()  # peers that answer CONFIRM (and number messages)
        self.closing: dict[int, Client] = {}  # writer end closed -> its client, awaiting
        self.windows: dict[str, int] = {}  # peer -> window of its readers, if sized to its link
        self._rtts: dict[str, deque[float]] = {}  # peer -> the round trips last reported
        # remote ends detached: (life, end) -> (was attached here, failure)
        self._tombs: OrderedDict[tuple[str, int], tuple[bool, str | None]] = OrderedDict()
        #: what crossed the links to and from peer brokers (for status and metrics): DATA
        #: messages and the bytes of their chunks, CREDIT messages
        self.data_sent = self.data_bytes_sent = self.credit_sent = 0
        self.data_received = self.data_bytes_received = 0
        self.labels: dict[str, str] = {}  # peer -> how people are told of it
        self._directory: set[str] = set()  # peers that speak the pipe directory
        self._answered: list[Client] = []  # CLOSEs awaiting nothing more (take_answered)

    # --- peers come and go -------------------------------------------------------------------

    def up(self, peer: str, fanout: bool, write_frames: bool, confirm: bool,
           label: str = "") -> None:
        """A peer broker joined (a new life of it), with what its HELLO says it takes, and
        how people are told of it (``label``)."""
        self.peers.add(peer)
        if label:
            self.labels[peer] = label
        if fanout:
            self._fanout.add(peer)
        if write_frames:
            self._write_frames.add(peer)
        if confirm:
            self._confirming.add(peer)

    def speaks_directory(self, peer: str) -> None:
        """``peer`` speaks the pipe directory (directory.py): its ends' DETACHes are
        remembered against late introductions, and its DATA for a writer not introduced yet
        adopts that writer."""
        self._directory.add(peer)

    def rtt(self, peer: str, rtt: float) -> bool:
        """A round trip to ``peer`` (its heartbeat's, measured while the link was idle): the
        windows of its readers are sized to the least of the last RTT_SAMPLES. Whether they
        changed."""
        if peer not in self.peers:
            return False
        rtts = self._rtts.setdefault(peer, deque(maxlen=RTT_SAMPLES))
        rtts.append(rtt)
        window = min(MAX_WINDOW, (int(2 * min(rtts) * LINK_RATE) | 0xFFFF) + 1)  # (by 64 KiB)
        if self.windows.get(peer, 0) == window:
            return False
        self.windows[peer] = window
        for (owner, _), proxy in self._proxies.items():
            if owner == peer:
                self._woken.extend(self.pipes.set_window(proxy, window))
        return True

    def down(self, peer: str) -> None:
        """A peer broker was lost: its ends are detached, and the streams that ran through it
        break ("peer lost")."""
        self.peers.discard(peer)
        label = self.labels.get(peer, "")  # (let go by fail_confirmations, which follows)
        why = peer_lost(label)
        lost = [(key, proxy) for key, proxy in self._proxies.items() if key[0] == peer]
        for key, proxy in lost:
            del self._proxies[key]
            del self._proxy_of[proxy]
            self._woken.extend(self.pipes.detach(proxy, why))
        if lost:
            self.log.warning("peer lost: its pipe ends are detached", peer=peer, ends=len(lost),
                             **({"broker": label} if label else {}))
        self._fanout.discard(peer)
        self._write_frames.discard(peer)
        self._confirming.discard(peer)
        self._directory.discard(peer)
        self.windows.pop(peer, None)
        self._rtts.pop(peer, None)

    def fail_confirmations(self, peer: str) -> None:
        """The CLOSEs awaiting the lost ``peer`` are answered: its stream's end may not have
        arrived there, and their CLOSE says so."""
        why = peer_lost(self.labels.pop(peer, ""))
        for client in [c for c in self.closing.values() if peer in c.awaiting]:
            client.close_failure = client.close_failure or why
            self._answered.append(client)

    def take_answered(self) -> list[Client]:
        """The clients whose CLOSE awaits nothing more (every broker confirmed, or one was
        lost), in order, since the last call: the core answers them."""
        answered, self._answered = self._answered, []
        return answered

    # --- peer messages -----------------------------------------------------------------------

    def on_data(self, peer: str, msg: peering.Data) -> None:
        self.data_received += 1
        self.data_bytes_received += len(msg.chunk)
        key = (peer, msg.writer_end)
        proxy = self._proxies.get(key)
        if proxy is None and peer in self._directory and key not in self._tombs:
            proxy = self._adopt_writer(peer, msg.writer_end, msg.reader_ends)
        if proxy is not None:
            for reader_end in msg.reader_ends:  # (fan-out: one chunk shared by them all)
                self._woken.extend(self.pipes.deliver(proxy, reader_end, msg.first, msg.chunk))

    def on_credit(self, peer: str, msg: peering.Credit) -> None:
        for reader_end, size in msg.credits:
            proxy = self._proxies.get((peer, reader_end))
            if proxy is not None:
                self._woken.extend(self.pipes.credit(proxy, size))

    def on_attach(self, peer: str, msg: peering.Attach) -> None:
        if not pipe_name_problem(msg.pipe):
            self.attach_remote(peer, msg.role, msg.end, msg.pipe, legacy=True)

    def on_detach(self, peer: str, msg: peering.Detach) -> None:
        lost = from_peer(msg.lost)  # (its kind read from the text the peer sends)
        key = (peer, msg.end)
        proxy = self._proxies.pop(key, None)
        if peer in self._directory:
            self._tombs[key] = (proxy is not None, lost)
            self._tombs.move_to_end(key)
            if len(self._tombs) > MAX_TOMBS:
                self._tombs.popitem(last=False)
        if proxy is not None:
            pipe = self.pipes.pipe_of(proxy)
            assert pipe is not None  # a proxy is attached until here
            del self._proxy_of[proxy]
            self._woken.extend(self.pipes.detach(proxy, lost))
            self.log.info("remote end detached", budget="peer", peer=peer,
                          pipe=shown(pipe.name), remote_end=msg.end,
                          **({"lost": lost} if lost else {}))

    def on_confirm(self, peer: str, msg: peering.Confirm) -> None:
        """What came before it is here: say so."""
        self.out.append(SendPeer(peer, peering.encode(peering.Confirmed(msg.end))))

    def on_confirmed(self, peer: str, msg: peering.Confirmed) -> None:
        client = self.closing.get(msg.end)
        if client is not None and peer in client.awaiting:
            client.awaiting.discard(peer)
            if not client.awaiting:
                self._answered.append(client)

    # --- remote ends -------------------------------------------------------------------------

    def attach_remote(self, peer: str, role: str, end: int, pipe: bytes,
                      legacy: bool = False) -> int | None:
        """A proxy for ``peer``'s ``end`` (idempotent); None if it was not made: an end whose
        DETACH came here (before or after its attachment) is not brought back by a late
        introduction."""
        key = (peer, end)
        proxy = self._proxies.get(key)
        if proxy is not None:
            return proxy
        if not legacy and key in self._tombs:
            return None
        proxy = next(self._end_ids)
        self._proxies[key] = proxy
        self._proxy_of[proxy] = key
        attach = self.pipes.attach_reader if role == "reader" else self.pipes.attach_writer
        self._woken.extend(attach(pipe, proxy, remote=True))
        if role == "reader" and peer in self.windows:
            self.pipes.set_window(proxy, self.windows[peer])
        self.log.info("remote end attached", budget="peer", peer=peer, pipe=shown(pipe),
                      role=role, remote_end=end)
        return proxy

    def tomb(self, peer: str, end: int) -> tuple[bool, str | None] | None:
        """What is remembered of ``peer``'s ``end`` detached: (was attached here, failure)."""
        return self._tombs.get((peer, end))

    def broker_of(self, proxy: int) -> str | None:
        """The peer whose end ``proxy`` stands for."""
        owner = self._proxy_of.get(proxy)
        return None if owner is None else owner[0]

    def _adopt_writer(self, peer: str, writer_end: int,
                      reader_ends: Sequence[int]) -> int | None:
        """DATA of a writer we were not introduced to yet (the home's INTRODUCE to us is
        slower than the writer's broker's DATA): the writer is on our readers' pipe."""
        for reader_end in reader_ends:
            pipe = self.pipes.pipe_of(reader_end)
            reader = pipe.readers.get(reader_end) if pipe is not None else None
            if reader is not None and not reader.remote:
                return self.attach_remote(peer, "writer", writer_end, reader.pipe.name)
        return None

    # --- our ends, for peers -----------------------------------------------------------------

    def send_detach(self, peers: Sequence[str], end: int, failure: str | None) -> None:
        """Our ``end`` is closed (``failure``: its stream broke): to the peers told of it."""
        if peers:
            frames = peering.encode(peering.Detach(end, failure))
            for peer in peers:
                self.out.append(SendPeer(peer, frames))

    def confirming_brokers(self, end: int) -> set[str]:
        """The peers with readers of writer ``end``'s stream (its audience; before the
        stream started, every remote reader of its pipe) that answer CONFIRM."""
        pipe = self.pipes.pipe_of(end)
        if pipe is None:
            return set()
        writer = self.pipes.writer(end)
        readers = writer.audience if writer.started else pipe.readers.keys()
        proxy_of = self._proxy_of
        return {proxy_of[r][0] for r in readers if r in proxy_of} & self._confirming

    def await_confirmation(self, client: Client, end: int, peers: set[str]) -> None:
        """The client's CLOSE of writer ``end`` waits until ``peers`` have its end."""
        confirm = peering.encode(peering.Confirm(end))
        for peer in peers:
            self.out.append(SendPeer(peer, confirm))
        client.closing_end, client.awaiting = end, peers
        self.closing[end] = client

    def stop_awaiting(self, end: int) -> None:
        self.closing.pop(end, None)

    def send_outgoing(self) -> None:
        """Turn what the pipe table has for remote ends into peer messages: each chunk goes
        once to each broker of its remote readers (fan-out), or, to a broker of before, once
        per reader there; the credits for one broker go in one CREDIT likewise."""
        out, proxy_of, fanout = self.out, self._proxy_of, self._fanout
        framed = self._write_frames
        for writer_end, first, chunk, proxies in self.pipes.take_outgoing():
            # a chunk that is a whole WRITE frame's goes in that frame, to peers that take it:
            # they can then answer a READ with it as it is (no copy there)
            frame = p.write_frame_of(chunk) if framed and len(chunk) >= FRAMED_MIN else None
            if len(proxies) == 1:  # the common case: one remote reader
                owner = proxy_of.get(proxies[0])
                if owner is None:
                    continue
                out.append(SendPeer(owner[0], peering.encode(peering.Data(
                    writer_end, (owner[1],), first, chunk,
                    frame if owner[0] in framed else None))))
                self.data_sent += 1
                self.data_bytes_sent += len(chunk)
                continue
            by_peer: dict[str, list[int]] = {}
            for proxy in proxies:
                owner = proxy_of.get(proxy)
                if owner is not None:
                    by_peer.setdefault(owner[0], []).append(owner[1])
            for peer, ends in by_peer.items():
                step = peering.MAX_BATCH if peer in fanout else 1
                for i in range(0, len(ends), step):
                    out.append(SendPeer(peer, peering.encode(peering.Data(
                        writer_end, tuple(ends[i:i + step]), first, chunk,
                        frame if peer in framed else None))))
                    self.data_sent += 1
                    self.data_bytes_sent += len(chunk)
        credits: dict[str, list[tuple[int, int]]] = {}
        for (proxy, reader_end), size in self.pipes.take_credits().items():
            owner = proxy_of.get(proxy)
            if owner is not None:
                credits.setdefault(owner[0], []).append((reader_end, size))
        for peer, pairs in credits.items():
            step = peering.MAX_BATCH if peer in fanout else 1
            for i in range(0, len(pairs), step):
                out.append(SendPeer(peer, peering.encode(peering.Credit(
                    tuple(pairs[i:i + step])))))
                self.credit_sent += 1

    # --- questions ---------------------------------------------------------------------------

    def counts(self) -> dict[str, int]:
        """What crossed the links to peer brokers: DATA messages and their chunks' bytes,
        CREDIT messages."""
        return {"data_sent": self.data_sent, "data_bytes_sent": self.data_bytes_sent,
                "credit_sent": self.credit_sent, "data_received": self.data_received,
                "data_bytes_received": self.data_bytes_received}
