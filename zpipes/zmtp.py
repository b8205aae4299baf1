"""ZMTP, ZeroMQ's wire protocol, as a DEALER on a plain socket: the sync client's connection to
its broker, with no libzmq in between.

A libzmq socket hands every message through an I/O thread of its own: a send wakes that
thread, which writes to the connection; a reply wakes it again, and it wakes the program's
thread in turn. For a small message that comes now and then (a line from ``tail -f``) those
wake-ups, not the bytes, are the cost, on both ends. Here the program's thread writes to the
connection and waits on it itself, so a message costs one wake-up at each end; and importing
the client costs no libzmq.

The wire is ZeroMQ's (ZMTP 3.0/3.1, NULL mechanism, socket type DEALER), so the peer may be
any ROUTER: the broker's own ZMTP server, or a libzmq one (the original broker). Every ZPIPES
message is one frame. A frame of ``DIRECT_MIN`` bytes or more is received into a buffer of its
own, as it arrives, with no further copy.

:class:`DealerLink` does the socket's I/O and never blocks but where it says so; the framing
(:mod:`zpipes.zmtp_framing`, :class:`FrameReader`) does none.
"""

from __future__ import annotations

import select
import socket
from collections import deque
from time import monotonic

from zpipes.zmtp_framing import (
    COMMAND,
    LONG,
    command,
    error_reason,
    frame_head,
    greeting,
    ready_command,
    split_command,
)

TYPE_CHECKING = False  # (typing is not imported at run time: see zpipes/__init__.py)
if TYPE_CHECKING:
    from typing import Any

#: our greeting: ZMTP 3.0, NULL mechanism, not as-server
GREETING = greeting()
DIRECT_MIN = 64 << 10  # a frame this large is received into its own buffer
READ_SIZE = 256 << 10  # bytes asked for by one receive of small frames
#: bytes asked for by the first receive after a large frame: most likely the head of the next
#: large one, whose body then goes straight to its own buffer (not copied out of ours)
HEAD_READ = 8 << 10
MAX_TAKE = 8 << 20  # bytes one call of DealerLink.receive takes at most (others then get a turn)
#: the largest frame taken: a READ_OK answers a READ of at most 2**32 - 1 bytes
MAX_FRAME = (1 << 32) + 16

#: a write to a connection the peer closed fails (EPIPE) instead of raising SIGPIPE, whatever
#: the program did with that signal (as libzmq does)
_NOSIGNAL = getattr(socket, "MSG_NOSIGNAL", 0)


class HandshakeError(Exception):
    """The peer did not speak ZMTP 3 with the NULL mechanism as a ROUTER would."""


class FrameReader:
    """Bytes in, frames out, no I/O: what arrived of the stream after the handshake.

    Frames are ``bytes`` (small ones, copied out of the read buffer) or ``bytearray`` (a frame
    of ``DIRECT_MIN`` bytes or more: its own buffer, filled by the caller through
    :meth:`direct_buffer` and :meth:`direct_filled`). Commands are kept apart (``commands``),
    each as its name and its data. A frame over ``MAX_FRAME`` bytes, or a command over
    ``DIRECT_MIN``, breaks the stream: ``broken`` says why, and nothing more is taken."""

    def __init__(self) -> None:
        self.frames: deque[bytes | bytearray] = deque()
        self.commands: deque[tuple[bytes, bytes]] = deque()
        self._rest = b""  # the start of a small frame (or of a head) that is not all here
        self._direct: bytearray | None = None  # a large frame being filled
        self._direct_flags = 0
        self._direct_got = 0
        self.broken: str | None = None

    def direct_buffer(self) -> memoryview | None:
        """Where the next bytes go when a large frame is being received, else None."""
        if self._direct is None:
            return None
        return memoryview(self._direct)[self._direct_got :]

    def direct_filled(self, nbytes: int) -> None:
        self._direct_got += nbytes
        direct = self._direct
        assert direct is not None
        if self._direct_got == len(direct):
            self._direct = None
            self._deliver(self._direct_flags, direct)

    def feed(self, data: bytes | memoryview) -> None:
        """Take bytes received into a shared buffer (copied out of it as needed)."""
        if self.broken:
            return
        if self._rest:
            data = self._rest + bytes(data)
            self._rest = b""
        view = memoryview(data)
        end = len(view)
        pos = 0
        while pos < end:
            flags = view[pos]
            if flags & LONG:
                if end - pos < 9:
                    break
                size = int.from_bytes(view[pos + 1 : pos + 9], "big")
                start = pos + 9
            else:
                if end - pos < 2:
                    break
                size = view[pos + 1]
                start = pos + 2
            if size > MAX_FRAME or (flags & COMMAND and size >= DIRECT_MIN):
                self.broken = f"a {'command' if flags & COMMAND else 'frame'} of {size} bytes"
                return
            if end - start >= size:
                self._deliver(flags, bytes(view[start : start + size]))
                pos = start + size
                continue
            if size >= DIRECT_MIN and not flags & COMMAND:
                frame = bytearray(size)
                have = end - start
                frame[:have] = view[start:end]
                self._direct, self._direct_flags, self._direct_got = frame, flags, have
                return
            break
        if pos < end:
            self._rest = bytes(view[pos:end])

    def _deliver(self, flags: int, frame: bytes | bytearray) -> None:
        if flags & COMMAND:
            self.commands.append(split_command(bytes(frame)))
        else:
            self.frames.append(frame)


def connect(family: int, address: Any, timeout: float) -> socket.socket:
    """A stream socket connected to ``address`` (blocking connect, at most ``timeout`` s)."""
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect(address)
        if family != socket.AF_UNIX:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except BaseException:
        sock.close()
        raise
    return sock


def _send_or_closed(sock: socket.socket, data: bytes) -> None:
    """Send ``data``, unless the peer closed already: a peer that refuses us sends its
    greeting and ERROR (why) and closes; what it sent is read next."""
    try:
        sock.sendall(data, _NOSIGNAL)
    except (BrokenPipeError, ConnectionResetError):
        pass


class DealerLink:
    """One ZMTP connection, as a DEALER, on a connected stream socket (see :func:`connect`).

    :meth:`handshake` first (blocking, bounded); then the socket is non-blocking: :meth:`send`
    writes a frame whole (waiting for room at most until a deadline), :meth:`receive` takes what
    has arrived into ``reader.frames``. ``eof``: the peer closed the connection (what it sent
    before is in ``reader.frames``)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.reader = FrameReader()
        self.eof = False
        self._scratch = bytearray(READ_SIZE)
        self._large = False  # the last frame was received into its own buffer
        self._poll = select.poll()
        self._poll.register(self.fd, select.POLLIN)

    # --- the handshake ---------------------------------------------------------------------

    def handshake(self, timeout: float) -> None:
        """Greetings and READY, both ways, within ``timeout`` seconds. Raises HandshakeError,
        or OSError (a timeout included) from the socket."""
        sock = self.sock
        sock.settimeout(timeout)
        _send_or_closed(sock, GREETING)
        greeting = self._recv_exactly(11)  # (what a ZMTP 2 peer sends before it waits)
        if greeting[0] != 0xFF or not greeting[9] & 1:
            raise HandshakeError("the peer does not speak ZMTP")
        if greeting[10] < 3:
            raise HandshakeError(f"the peer speaks ZMTP {greeting[10] + 1} (libzmq 3), not 3")
        greeting += self._recv_exactly(53)
        if greeting[12:32].rstrip(b"\x00") != b"NULL":
            raise HandshakeError("the peer asks for a security mechanism other than NULL")
        _send_or_closed(sock, ready_command(b"DEALER", identity=b""))
        reader = self.reader
        while not reader.commands:
            try:
                data = sock.recv(READ_SIZE)
            except ConnectionResetError:
                data = b""
            if not data:
                raise HandshakeError("the peer closed the connection during the handshake")
            reader.feed(data)
            if reader.broken:
                raise HandshakeError(f"the peer sent {reader.broken}")
            if reader.frames:
                raise HandshakeError("the peer sent a message before its READY")
        name, data = reader.commands.popleft()
        if name == b"ERROR":
            raise HandshakeError(f"the peer refused us: {error_reason(data)}")
        if name != b"READY":
            raise HandshakeError(f"the peer sent {name!r} instead of READY")
        sock.setblocking(False)

    def _recv_exactly(self, size: int) -> bytes:
        data = b""
        while len(data) < size:
            more = self.sock.recv(size - len(data))
            if not more:
                raise HandshakeError("the peer closed the connection during the handshake")
            data += more
        return data

    # --- sending ---------------------------------------------------------------------------

    def send(self, frame: Any, give_up: float | None = None) -> bool:
        """Write one frame whole. While the socket has no room, take what arrives (so that
        neither end waits for the other) and wait at most until ``give_up`` (monotonic; None:
        do not wait at all). True once it is written; False if it could not be, or only in
        part (then the connection is of no further use: close it). Raises OSError when the
        connection is gone."""
        size = len(frame)
        head = frame_head(size)
        if size < 4096:
            return self.send_framed(head + bytes(frame), give_up)
        sock = self.sock
        try:
            sent = sock.sendmsg([head, frame], (), _NOSIGNAL)
        except BlockingIOError:
            sent = 0
        if sent == len(head) + size:
            return True
        rest = [memoryview(head)[sent:], memoryview(frame).cast("B")] if sent < len(head) \
            else [memoryview(frame).cast("B")[sent - len(head) :]]
        return self._send_rest(rest, give_up, partial=sent > 0)

    def send_framed(self, data: bytes, give_up: float | None = None) -> bool:
        """Like :meth:`send`, for ``data`` that holds whole frames, heads included."""
        try:
            sent = self.sock.send(data, _NOSIGNAL)
        except BlockingIOError:
            sent = 0
        if sent == len(data):
            return True
        return self._send_rest([memoryview(data)[sent:]], give_up, partial=sent > 0)

    def _send_rest(self, rest: list[memoryview], give_up: float | None, partial: bool) -> bool:
        if give_up is None:
            if not partial:
                return False
            give_up = monotonic() + 1.0  # a frame begun is finished, or the stream is broken
        poll = select.poll()
        poll.register(self.fd, select.POLLOUT | select.POLLIN)
        while rest:
            left = give_up - monotonic()
            if left <= 0:
                return False
            for _fd, events in poll.poll(max(1, int(left * 1000))):
                if events & select.POLLIN and not self.eof:
                    self.receive()
                    if self.eof:
                        poll.modify(self.fd, select.POLLOUT)
                if events & (select.POLLOUT | select.POLLERR | select.POLLHUP):
                    try:
                        sent = self.sock.sendmsg(rest, (), _NOSIGNAL)
                    except BlockingIOError:
                        continue
                    while sent and rest:
                        if sent >= len(rest[0]):
                            sent -= len(rest.pop(0))
                        else:
                            rest[0] = rest[0][sent:]
                            sent = 0
        return True

    # --- receiving -------------------------------------------------------------------------

    def wait(self, timeout_ms: int) -> bool:
        """Wait at most ``timeout_ms`` for something to receive (or the end); True if so."""
        return bool(self._poll.poll(timeout_ms))

    def receive(self) -> int:
        """Take what has arrived, without waiting: frames into ``reader.frames``, and ``eof``
        once the peer closed. Answers the peer's ZMTP PINGs. Returns the bytes taken."""
        reader, sock = self.reader, self.sock
        scratch = memoryview(self._scratch)
        taken = 0
        while taken < MAX_TAKE and not self.eof:
            direct = reader.direct_buffer()
            if direct is None:
                into = scratch[:HEAD_READ] if self._large else scratch
            else:
                into = direct
            try:
                n = sock.recv_into(into)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:  # reset, timed out (keepalive): the connection is gone
                n = 0
            if n == 0:
                self.eof = True
                break
            taken += n
            if direct is None:
                reader.feed(scratch[:n])
                self._large = reader.direct_buffer() is not None
            else:
                reader.direct_filled(n)
                self._large = True
            if reader.commands:
                self._commands()
            if reader.broken:
                self.eof = True  # (the stream cannot be read on: as good as closed)
                break
            if direct is None and n < len(into) and reader.direct_buffer() is None:
                break  # (all there was, most likely: no second call to find nothing)
        return taken

    def _commands(self) -> None:
        commands = self.reader.commands
        while commands:
            name, data = commands.popleft()
            if name == b"PING":  # ZMTP 3.1 heartbeat: [TTL, 2 bytes][context]
                try:
                    self.sock.send(command(b"PONG", data[2:18]), _NOSIGNAL)
                except OSError:
                    pass
            elif name == b"ERROR":
                self.eof = True

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass
