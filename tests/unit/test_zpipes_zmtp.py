"""The sync client's ZMTP (zpipes/zmtp.py): frames come out whole and in order however the
stream is cut, large ones into buffers of their own; a frame past the limit breaks the stream;
and a DealerLink talks to the broker's own ZMTP codec (the server side) over a socket pair:
handshake, frames larger than the socket buffers both ways, and the end of the connection
after the frames that came before it."""

from __future__ import annotations

import socket
import threading
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from zbroker import zmtp as server_zmtp
from zpipes import zmtp


def framed(frames: list[bytes], ping: bool = False) -> bytes:
    data = b"".join(zmtp.frame_head(len(f)) + f for f in frames)
    return (zmtp.command(b"PING", b"\x00\x0a" + b"ctx") + data) if ping else data


def read_all(data: bytes, cuts: list[int]) -> zmtp.FrameReader:
    """Feed ``data`` to a FrameReader in pieces that end at ``cuts``, as a socket would
    deliver it: into the large frame's own buffer while one is being received."""
    reader = zmtp.FrameReader()
    pos = 0
    for end in [*sorted(set(cuts)), len(data)]:
        while pos < end:
            direct = reader.direct_buffer()
            if direct is None:
                reader.feed(data[pos:end])
                pos = end
            else:
                n = min(len(direct), end - pos)
                direct[:n] = data[pos : pos + n]
                reader.direct_filled(n)
                pos += n
    return reader


sizes = st.one_of(st.integers(0, 300), st.integers(zmtp.DIRECT_MIN - 2, zmtp.DIRECT_MIN + 70_000))


@settings(max_examples=60, deadline=None)
@given(st.lists(sizes, min_size=1, max_size=6), st.lists(st.integers(0, 400_000), max_size=12),
       st.booleans())
def test_frames_come_out_whole_in_order_however_the_stream_is_cut(sizes, cuts, ping):
    frames = [bytes([i % 251]) * n for i, n in enumerate(sizes)]
    data = framed(frames, ping)
    reader = read_all(data, [c % (len(data) + 1) for c in cuts])
    assert [bytes(f) for f in reader.frames] == frames
    assert [name for name, _ in reader.commands] == ([b"PING"] if ping else [])
    assert reader.broken is None


def test_a_large_frame_cut_in_its_middle_is_received_into_a_buffer_of_its_own():
    frame = bytes(range(256)) * 1000
    data = framed([frame, b"after"])
    reader = read_all(data, [100])
    assert [bytes(f) for f in reader.frames] == [frame, b"after"]
    assert type(reader.frames[0]) is bytearray


def test_a_frame_past_the_limit_breaks_the_stream_and_nothing_after_it_comes_out():
    huge = bytes((zmtp.LONG,)) + (zmtp.MAX_FRAME + 1).to_bytes(8, "big")
    reader = zmtp.FrameReader()
    reader.feed(framed([b"before"]) + huge + framed([b"after"]))
    reader.feed(framed([b"later"]))
    assert list(reader.frames) == [b"before"]
    assert reader.broken is not None and str(zmtp.MAX_FRAME + 1) in reader.broken


def serve(sock: socket.socket, pad: bytes) -> None:
    """The broker's side: its ZMTP codec as a ROUTER. Answers each message with itself and
    then ``pad`` (written whole before it reads on), and closes the connection once it has
    answered two."""
    conn = server_zmtp.Connection(4, 1 << 30)
    answered = 0
    sock.sendall(conn.data_to_send())
    while answered < 2:
        data = sock.recv(1 << 20)
        if not data:
            break
        conn.receive_data(data)
        for ev in conn.next_events():
            if type(ev) is server_zmtp.Message:
                sock.sendall(server_zmtp.encode_message(ev.frames))
                sock.sendall(server_zmtp.encode_message([pad]))
                answered += 1
        out = conn.data_to_send()
        if out:
            sock.sendall(out)
    sock.close()


def test_a_dealer_link_talks_to_the_brokers_codec_and_sees_the_end_after_the_data():
    ours, theirs = socket.socketpair()
    big = bytes(range(256)) * (12 << 10)  # 3 MiB: more than the socket buffers hold
    pad = b"p" * (8 << 20)
    server = threading.Thread(target=serve, args=(theirs, pad), daemon=True)
    server.start()
    link = zmtp.DealerLink(ours)
    link.handshake(5)
    assert link.send(b"small", None)
    # The answer to "small" (8 MiB) fills the way back while the large frame goes out: the
    # link must take it as it sends, or neither end could move on.
    assert link.send(big, time.monotonic() + 10)
    got: list[bytes] = []
    while not link.eof:
        assert link.wait(5000), "nothing arrived"
        link.receive()
        got += [bytes(f) for f in link.reader.frames]
        link.reader.frames.clear()
    server.join(5)
    assert got == [b"small", pad, big, pad]
    link.close()
