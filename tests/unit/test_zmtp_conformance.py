"""The broker's ZMTP server (zbroker/zmtp/server.py) against real peers: libzmq's DEALER, REQ
and ROUTER sockets (through pyzmq) over tcp and ipc, a ZMTP 2.0 peer (libzmq 3.2's greeting)
and the READY with no properties that libzmtp, the original C clients' library, sends. The
server here is a third endpoint made of the transport alone: it echoes each message back."""

from __future__ import annotations

import asyncio
import os
import socket
import struct
import threading
from collections.abc import Iterator

import pytest
import zmq
from helpers import free_port

from zbroker import zmtp
from zbroker.zmtp.admission import Admission, ConnectionBudget
from zbroker.zmtp.refusals import Refusals
from zbroker.zmtp.server import Link, Server


class _Log:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def warning(self, event: str, **fields) -> None:
        self.lines.append(f"{event} {fields}")

    info = warning


class Echo(Link):
    def codec(self, server: Server) -> zmtp.Connection:
        return zmtp.Connection(max_frames=16, max_bytes=1 << 20)


class EchoServer(Server):
    """A service of the transport in a few lines: each message back to its sender (the
    read path, its turns and the write path are the transport's)."""

    def message(self, link: Link, message: zmtp.Message) -> None:
        self.queue(link, *zmtp.encode_parts(message.frames))

    def after_read(self, link: Link, events: int) -> None:
        self.flush()


@pytest.fixture
def echo() -> Iterator[tuple[str, str, Server]]:
    """An echo server on a tcp and an ipc endpoint, on a loop in a thread of its own."""
    loop = asyncio.new_event_loop()
    log = _Log()
    server = EchoServer(loop, Admission("echo", Refusals(log), budget=ConnectionBudget(100)), log,
                    Echo)
    tcp = f"tcp://127.0.0.1:{free_port()}"
    ipc = f"ipc://@/zmtp-echo-{os.getpid()}-{id(server)}"
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    for endpoint in (tcp, ipc):
        asyncio.run_coroutine_threadsafe(server.start(endpoint), loop).result(10)
    yield tcp, ipc, server
    asyncio.run_coroutine_threadsafe(server.close_after(1.0), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.close()


@pytest.mark.parametrize("transport", ["tcp", "ipc"])
@pytest.mark.parametrize("kind", ["DEALER", "REQ"])
def test_libzmq_dealer_and_req_talk_to_it(echo, ctx, transport, kind):
    tcp, ipc, server = echo
    s = ctx.socket(getattr(zmq, kind))
    s.linger = 0
    s.rcvtimeo = s.sndtimeo = 5000
    s.connect(tcp if transport == "tcp" else ipc)
    try:
        for i in range(20):
            s.send_multipart([b"hello", b"%d" % i])
            assert s.recv_multipart() == [b"hello", b"%d" % i]
    finally:
        s.close()


def test_a_libzmq_router_names_the_server_and_talks_to_it(echo, ctx):
    tcp, _, server = echo
    s = ctx.socket(zmq.ROUTER)
    s.linger = 0
    s.rcvtimeo = 5000
    s.setsockopt(zmq.ROUTER_MANDATORY, 1)
    s.setsockopt(zmq.CONNECT_ROUTING_ID, b"server")
    s.setsockopt(zmq.ROUTING_ID, b"me")
    s.connect(tcp)
    try:
        for _ in range(500):  # until the connection is up: unroutable until then
            try:
                s.send_multipart([b"server", b"ping"])
                break
            except zmq.ZMQError as exc:
                assert exc.errno == zmq.EHOSTUNREACH
                threading.Event().wait(0.01)
        assert s.recv_multipart() == [b"server", b"ping"]
        assert b"me" in server.links  # the routing id the peer asked for
    finally:
        s.close()


def _raw(endpoint: str) -> socket.socket:
    host, port = endpoint[len("tcp://"):].rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=5)


def _recv_exactly(s: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = s.recv(n - len(data))
        assert chunk, f"closed after {data!r}"
        data += chunk
    return data


def test_a_zmtp2_peer_of_libzmq_3_2(echo):
    tcp, _, _ = echo
    s = _raw(tcp)
    try:
        # signature, revision 1, DEALER (5), then an empty identity
        s.sendall(zmtp.SIGNATURE + b"\x01\x05" + b"\x00\x00")
        assert _recv_exactly(s, 10) == zmtp.SIGNATURE
        assert _recv_exactly(s, 4) == b"\x03\x06\x00\x00"  # ROUTER, and our empty identity
        s.sendall(b"\x01\x03abc\x00\x02de")  # [abc][de]
        assert _recv_exactly(s, 9) == b"\x01\x03abc\x00\x02de"
    finally:
        s.close()


def test_libzmtp_s_ready_with_no_properties_is_taken(echo):
    """The bytes of libzmtp 5cf4350's handshake: a ZMTP 3.0 greeting, then READY with no
    metadata at all (no Socket-Type). libzmq takes it; an ERROR here broke the original
    client."""
    tcp, _, server = echo
    s = _raw(tcp)
    try:
        s.sendall(zmtp.SIGNATURE + b"\x03\x00" + b"NULL".ljust(20, b"\0") + b"\0" * 32)
        s.sendall(b"\x04\x06\x05READY")
        greeting = _recv_exactly(s, 64)
        assert greeting[:10] == zmtp.SIGNATURE and greeting[12:16] == b"NULL"
        ready = zmtp.ready_command()
        assert _recv_exactly(s, len(ready)) == ready
        s.sendall(b"\x00\x05hello")
        assert _recv_exactly(s, 7) == b"\x00\x05hello"
        assert len(server.links) == 1
    finally:
        s.close()


def test_a_pub_socket_is_told_error_and_hung_up(echo):
    tcp, _, server = echo
    s = _raw(tcp)
    try:
        name, value = b"Socket-Type", b"PUB"
        s.sendall(zmtp.SIGNATURE + b"\x03\x01" + b"NULL".ljust(20, b"\0") + b"\0" * 32
                  + zmtp.command(b"READY", bytes([len(name)]) + name
                                 + struct.pack(">I", len(value)) + value))
        data = b""
        while chunk := s.recv(4096):
            data += chunk
        assert b"\x05ERROR" in data and b"Invalid socket type" in data
        assert server.hung_up == 1
    finally:
        s.close()
