"""pzq against a hostile producer and a failing disk: what it refuses, and that a legitimate
producer and consumer next to it lose nothing. Real ``pzq`` processes, real sockets, a real
disk (a small tmpfs mounted by the test for the full-disk case)."""

from __future__ import annotations

import os
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest
import zmq
from helpers import wait_for
from pzq_helpers import RawProducer, dealer, recv, vm_kb, wait_counter

from pzq.client import Consumer, Producer
from zbroker import zmtp

FAST = ("--ack-timeout", "400000", "--reaper-frequency", "50000")


def threads(pid: int) -> int:
    return vm_kb(pid, "Threads")


def open_fds(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/fd").iterdir()))


def legit_round_trip(q, n: int = 20, size: int = 100) -> None:
    """A legitimate producer's messages are all ACKed "1" and all delivered once."""
    with Producer(q.receive, window=16) as p:
        for i in range(n):
            p.send(b"%d:" % i + b"x" * size, msg_id=b"legit-%d-%s" % (i, uuid.uuid4().hex[:8]
                                                                     .encode()))
        p.flush(10)  # raises if any is refused
    got = []
    with Consumer(q.send) as c:
        while len(got) < n:
            m = c.recv(5)
            assert m is not None, f"got {len(got)} of {n}"
            got.append(m.body)
            c.ack(m)
    assert sorted(int(b.split(b":")[0]) for b in got) == list(range(n))


def copy(sock: zmq.Socket, key: bytes, node: str, body: bytes) -> list[bytes]:
    sock.send_multipart([key, b"REPLICA:" + node.encode(), b"", body])
    return recv(sock)


# --- 1. REPLICA traffic --------------------------------------------------------------------


def test_replica_traffic_is_refused_where_replication_is_not_configured(start_pzq, ctx):
    """300 made-up node ids used to open 300 replica stores (a thread and 3 fds each)."""
    q = start_pzq(*FAST)
    before_threads, before_fds = threads(q.pid), open_fds(q.pid)
    s = dealer(ctx, q.receive)
    for i in range(300):
        node = uuid.uuid4().hex
        answer = copy(s, b"k%d" % i, node, b"fake copy")
        assert answer == [b"k%d" % i, b"0", b"",
                          b"replication is not configured on this queue"], answer
        # its DELETE and PING are ignored and create nothing either
        s.send_multipart([b"k%d" % i, b"REPLICA-ACK:" + node.encode(), b"", b"-"])
        s.send_multipart([b"-", b"REPLICA-PING:" + node.encode(), b"", b"-"])
    c = q.counters()
    assert c["replica_origins"] == 0 and c["replicas_held"] == 0, c
    assert c["replicas_refused"] == 900 and c["messages"] == 0, c  # copies, ACKs, PINGs
    assert not (q.database / "replicas").exists() or not any(
        (q.database / "replicas").iterdir())
    assert threads(q.pid) <= before_threads + 2
    assert open_fds(q.pid) <= before_fds + 10
    legit_round_trip(q)


def test_copies_only_from_listed_nodes_and_at_most_max_origins(start_pzq, ctx):
    listed = [uuid.uuid4().hex for _ in range(3)]
    q = start_pzq(*FAST, "--replica-sources", ",".join(listed), "--max-replica-origins", "2")
    s = dealer(ctx, q.receive)
    stranger = uuid.uuid4().hex
    answer = copy(s, b"k0", stranger, b"x")
    assert answer[:2] == [b"k0", b"0"]
    assert answer[3] == f"replica node {stranger} is not accepted by this queue " \
                        f"(replica_sources)".encode()
    assert copy(s, b"k1", listed[0], b"x") == [b"k1", b"1", b""]
    assert copy(s, b"k2", listed[1], b"x") == [b"k2", b"1", b""]
    answer = copy(s, b"k3", listed[2], b"x")
    assert answer[:2] == [b"k3", b"0"] and b"too many replica origins" in answer[3], answer
    assert copy(s, b"k4", listed[0], b"y") == [b"k4", b"1", b""]  # a known origin: fine
    c = q.counters()
    assert c["replica_origins"] == 2 and c["replicas_held"] == 3 and c["replicas_refused"] == 2
    legit_round_trip(q)
    assert "pzq replica traffic refused" in q.log()


def test_copies_count_in_max_backlog_and_a_takeover_stays_under_it(start_pzq, ctx):
    """Copies used to be limited per origin only, and taken over past max_backlog."""
    node = uuid.uuid4().hex
    limit = 1 << 20
    q = start_pzq(*FAST, "--max-backlog", str(limit), "--replica-sources", node,
                  "--timeout-nodes", "1000000")
    with Producer(q.receive, window=4) as p:  # the queue's own messages: 300 KB
        for i in range(3):
            p.send(b"own" * 33_333, msg_id=b"own-%d" % i)
        p.flush(5)
    s = dealer(ctx, q.receive)
    accepted, refused = 0, []
    for i in range(20):  # 2 MB of copies offered
        answer = copy(s, b"%d|copy-%d" % (time.time_ns() // 1000, i), node, b"c" * 100_000)
        if answer[1] == b"1":
            accepted += 1
        else:
            refused.append(answer[3])
    assert 0 < accepted < 10 and refused, (accepted, refused)
    assert refused[0] == b"Queue full: the copies held for peers count in max_backlog"
    c = q.counters()
    assert c["replicas_held"] == accepted
    # the origin falls silent: its copies are taken over, and the queue stays within limit
    wait_counter(q, "replicas_taken_over", lambda n: n == accepted)
    c = wait_counter(q, "replicas_held", lambda n: n == 0)
    assert c["messages"] == 3 + accepted and c["backlog_bytes"] <= limit, c
    s.send_multipart([b"late", b"", b"z" * 100_000])  # full: refused, not stored
    assert recv(s) == [b"late", b"0", b"", b"Queue full"]
    got = 0
    with Consumer(q.send) as cons:
        while (m := cons.recv(2)) is not None:
            got += 1
            cons.ack(m)
    assert got == 3 + accepted
    legit_round_trip(q)


# --- 2. ids and frames count ---------------------------------------------------------------


def test_long_ids_and_many_frames_are_refused_and_count_in_the_backlog(start_pzq, ctx):
    """60 000-byte ids used to be stored (927 MB under 16 MiB), 10 000 empty frames at 0."""
    q = start_pzq(*FAST, "--max-backlog", "1MiB")
    s = dealer(ctx, q.receive)
    s.send_multipart([b"i" * 60_000, b"", b"body"])
    answer = recv(s)
    assert answer == [b"i" * 255, b"0", b"", b"message id longer than 255 bytes"]
    s.send_multipart([b"frames", b"", *[b""] * 1100])
    assert recv(s) == [b"frames", b"0", b"", b"more than 1024 frames in a message"]
    # ids count: 255-byte ids with 1-byte bodies, each 255 + 1 + 2 x 16 bytes
    for i in range(10):
        s.send_multipart([b"%03d" % i + b"i" * 252, b"", b"b"])
        assert recv(s)[1] == b"1"
    assert q.counters()["backlog_bytes"] == 10 * (255 + 1 + 32)
    # empty frames count: 16 bytes each, so 1 000 of them a message fill 1 MiB after ~64
    stored = 0
    for i in range(200):
        s.send_multipart([b"e%d" % i, b"", *[b""] * 1000])
        answer = recv(s)
        if answer[1] == b"0":
            assert answer[3] == b"Queue full", answer
            break
        stored += 1
    assert 50 < stored < 70, stored
    assert q.counters()["backlog_bytes"] <= 1 << 20
    with Consumer(q.send) as c:  # drain, then the legit producer goes on
        while (m := c.recv(1)) is not None:
            c.ack(m)
    legit_round_trip(q)


def test_the_idempotence_window_is_bounded_in_bytes(start_pzq, ctx):
    q = start_pzq(*FAST, "--idempotence-bytes", "64KiB")
    s = dealer(ctx, q.receive)
    ids = [b"%04d" % i + b"i" * 251 for i in range(1000)]  # 255 KB of ids
    for msg_id in ids:
        s.send_multipart([msg_id, b"", b"x"])
    for _ in ids:
        assert recv(s)[1] == b"1"
    with Consumer(q.send) as c:
        for _ in ids:
            c.ack(c.recv(5))
    s.send_multipart([ids[-1], b"", b"x"])  # recent: still known, answered, not stored
    assert recv(s) == [ids[-1], b"1", b""]
    s.send_multipart([ids[0], b"", b"x"])  # the oldest was forgotten: stored again
    assert recv(s) == [ids[0], b"1", b""]
    c = q.counters()
    assert c["duplicates"] == 1 and c["stored"] == 1001, c


# --- 4. oversized messages are let go frame by frame ---------------------------------------


def test_an_oversized_message_is_refused_before_it_has_arrived(start_pzq, ctx):
    """Three 640 MiB messages of 16 MiB frames (libzmq would have held each whole), and one
    of 128 MB in 32 KB frames: each is answered as soon as it passes max_message_size, and
    the rest of it is let go as it arrives, so the queue grows by a few MiB, not by the
    message. A legitimate producer beside loses nothing."""
    q = start_pzq(*FAST, "--max-message-size", "1MiB", "--max-frames", "100000")
    s = dealer(ctx, q.receive)
    s.setsockopt(zmq.SNDHWM, 0)
    legit = dealer(ctx, q.receive)
    legit.send_multipart([b"before", b"", b"ok"])
    assert recv(legit) == [b"before", b"1", b""]
    base = vm_kb(q.pid, "VmHWM")
    big, small = zmq.Frame(b"B" * (16 << 20)), zmq.Frame(b"f" * 32_000)
    messages = [[big] * 40] * 3 + [[small] * 4000]
    for k, body in enumerate(messages):
        s.send_multipart([b"big%d" % k, b"", *body], copy=False)
        answer = recv(s, 60)
        assert answer[:3] == [b"big%d" % k, b"0", b""] and b"too large" in answer[3], answer
        legit.send_multipart([b"after%d" % k, b"", b"ok"])
        assert recv(legit, 60) == [b"after%d" % k, b"1", b""]
    s.send_multipart([b"last", b"", b"ok"])  # answered once all of the above has arrived
    assert recv(s, 60) == [b"last", b"1", b""]
    growth = (vm_kb(q.pid, "VmHWM") - base) << 10
    assert growth < 24 << 20, f"grew {growth >> 20} MiB for messages of 640 MiB"
    assert q.counters()["messages"] == 6
    with Consumer(q.send) as c:
        assert sorted(c.recv(5).body for _ in range(6)) == [b"ok"] * 6


def test_large_frames_in_many_pieces_and_a_huge_length_header(start_pzq):
    """Large frames that come in many small pieces (headers cut too) arrive whole, stored
    and delivered byte for byte; a frame header that
    claims 2^62 bytes gets its "0" at once, with nothing of that size made, and the queue
    goes on."""
    q = start_pzq(*FAST, "--max-message-size", "1MiB")
    base = vm_kb(q.pid, "VmHWM")
    bodies = [os.urandom(300_000), os.urandom(70_000)]
    p = RawProducer(q.receive)
    for k, body in enumerate(bodies):
        data = zmtp.encode_message([b"piece%d" % k, b"", body, b"tail"])
        for pos in range(0, len(data), 4099):
            p.send_raw(data[pos:pos + 4099])
            if pos // 4099 % 8 == 0:
                time.sleep(0.001)  # each a read of its own, sometimes
        assert p.recv() == [b"piece%d" % k, b"1", b""]
    with Consumer(q.send) as c:
        got = []
        for _ in bodies:
            m = c.recv(5)
            got.append(m.frames)
            c.ack(m)
    assert sorted(got) == sorted((b, b"tail") for b in bodies)
    hostile = RawProducer(q.receive)
    hostile.send_raw(bytes([zmtp.MORE, 4]) + b"huge" + bytes([zmtp.MORE, 0])
                     + bytes([zmtp.LONG]) + (1 << 62).to_bytes(8, "big") + b"x" * 1000)
    answer = hostile.recv()
    assert answer[:3] == [b"huge", b"0", b""] and b"too large" in answer[3], answer
    legit_round_trip(q)
    assert (vm_kb(q.pid, "VmHWM") - base) << 10 < 32 << 20


def test_one_host_holds_at_most_half_of_what_is_being_received(start_pzq):
    """What is still arriving counts against its sender's share first: a host whose unfinished
    messages would hold more than half of max_backlog is refused ("Server busy: this host's
    ..."), while another host's message of the same size is taken."""
    q = start_pzq(*FAST, "--max-message-size", "1MiB", "--max-backlog", "4MiB")
    stalled = []
    for k in range(2):  # 2 x 900 KB from one host: under its 2 MiB
        p = RawProducer(q.receive, source="127.0.0.2")
        p.send_raw(zmtp.encode_message([b"slow%d" % k, b"", b"s" * 900_000, b"end"])[:-6])
        stalled.append(p)
    wait_for(lambda: q.counters()["receiving_bytes"] >= 1_800_000, 10,
             "the unfinished messages to be held")
    third = RawProducer(q.receive, source="127.0.0.2")
    third.send_raw(zmtp.encode_message([b"third", b"", b"s" * 900_000, b"end"])[:-6])
    answer = third.recv()
    assert answer[:3] == [b"third", b"0", b""] and b"this host's or user's" in answer[3], answer
    other = RawProducer(q.receive)  # another host (127.0.0.1)
    other.send([b"other", b"", b"s" * 900_000])
    assert other.recv() == [b"other", b"1", b""]
    assert q.counters()["refused_busy"] == 1
    for p in (*stalled, third, other):
        p.close()


def test_unfinished_messages_together_are_bounded(start_pzq):
    """Producers that start big messages and never finish them: together they hold at most
    max_backlog bytes; the message that would pass it is refused ("Server busy"), and the
    queue goes on serving everyone else. Hanging up frees what a producer held. (Each stalled
    producer from a host of its own: one host may hold at most half, see below.)"""
    q = start_pzq(*FAST, "--max-message-size", "1MiB", "--max-backlog", "4MiB")
    base = vm_kb(q.pid, "VmHWM")
    stalled = []
    for k in range(4):  # 4 x 900 KB: under the 4 MiB
        p = RawProducer(q.receive, source=f"127.0.0.{2 + k}")
        p.send_raw(zmtp.encode_message([b"slow%d" % k, b"", b"s" * 900_000, b"end"])[:-6])
        stalled.append(p)
    wait_for(lambda: q.counters()["receiving_bytes"] >= 3_600_000, 10,
             "the unfinished messages to be held")
    last = RawProducer(q.receive)
    last.send_raw(zmtp.encode_message([b"one-too-many", b"", b"s" * 900_000, b"end"])[:-6])
    answer = last.recv()
    assert answer[:3] == [b"one-too-many", b"0", b""] and b"Server busy" in answer[3], answer
    legit_round_trip(q)
    c = q.counters()
    assert c["refused_busy"] == 1 and c["messages"] == 0, c
    for p in stalled:
        p.close()
    wait_for(lambda: q.counters()["receiving_bytes"] == 0, 10, "what they held to be freed")
    again = RawProducer(q.receive)
    again.send([b"later", b"", b"s" * 900_000])
    assert again.recv() == [b"later", b"1", b""]
    assert (vm_kb(q.pid, "VmHWM") - base) << 10 < 32 << 20


# --- 3. a failing disk -----------------------------------------------------------------------


@pytest.fixture
def small_fs(tmp_path):
    """A 3 MiB tmpfs (skipped where mounting is not allowed)."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mnt)],
                       capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {r.stderr.decode(errors='replace').strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def fill_up(q, fs: Path) -> set[bytes]:
    """Many small messages (their ACK records are more than the last page of the log can
    take), then large ones until the disk is full, then the rest of it taken by another
    file. Returns the first 4 bytes of the bodies of the messages ACKed "1"."""
    acked: set[bytes] = set()
    failures: list[str] = []

    def on_ack(msg_id: bytes, ok: bool, text: str) -> None:
        if ok:
            acked.add(b"%04d" % int(msg_id[1:]))
        else:
            failures.append(text)

    with Producer(q.receive, window=64, on_ack=on_ack) as p:
        for i in range(2000):
            p.send(b"%04d" % i + b"s" * 496, msg_id=b"m%d" % i)
        p.flush(30)
        for i in range(2000, 2100):
            p.send(b"%04d" % i + b"d" * 99_996, msg_id=b"m%d" % i)
            wait_for(lambda: p.poll(0.1) >= 0 and not p.outstanding, 10, "the ACK")
            if failures:
                break
    assert failures and "No space left on device" in failures[0], failures
    assert 2000 < len(acked) < 2030
    fd = os.open(fs / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(fd, b"\0" * 4096) > 0:
            pass
    except OSError:
        pass
    finally:
        os.close(fd)
    return acked


def test_a_full_disk_backs_off_and_recovers_losing_nothing_acked(start_pzq, small_fs):
    """It used to try again at once: ~4 400 failed writes a second, a new segment file and
    a warning each."""
    q = start_pzq(*FAST, database=small_fs / "db")
    acked = fill_up(q, small_fs)
    big = {b for b in acked if int(b) >= 2000}
    # the consumer takes them all, ACKs the small ones: their ACK records cannot be written
    got = set()
    with Consumer(q.send) as c:
        while len(got) < len(acked):
            m = c.recv(5)
            assert m is not None, f"got {len(got)} of {len(acked)}"
            got.add(m.body[:4])
            if m.body[:4] not in big:
                c.ack(m)
        c1 = wait_counter(q, "write_failing", lambda n: n == 1)
        time.sleep(3)  # a window of 3 s: how often it tries again (backing off: seldom)
        c2 = q.counters()
    assert got == acked  # every producer-ACKed message
    failed = c2["failed_writes"] - c1["failed_writes"]
    assert c2["write_failing"] == 1 and failed <= 12, (c1, c2)
    segments = list((small_fs / "db").glob("*.seg"))
    assert len(segments) <= 2, len(segments)
    log = q.log()
    # once when the producer's message failed, once for the ACK records (between them, small
    # ACK records fit in the last page of the log: writable again)
    assert log.count("pzq store write failing") <= 2
    assert log.count("pzq store write failing") == log.count("pzq store writable again") + 1
    assert log.count("store failed") <= 2  # no warning per failed write
    # room again: it recovers by itself and writes the ACK records
    subprocess.run(["mount", "-o", "remount,size=64m", str(small_fs)], check=True)
    wait_counter(q, "write_failing", lambda n: n == 0, timeout=10)
    wait_for(lambda: "pzq store writable again" in q.log(), 5, "the recovery log line")
    q = q.restart()  # SIGKILL: what is left is what was not ACKed, all of it
    assert q.counters()["messages"] == len(big)
    with Consumer(q.send) as c:
        again = set()
        while (m := c.recv(1)) is not None:
            again.add(m.body[:4])
            c.ack(m)
    assert again == big
    legit_round_trip(q)


def test_a_full_disk_frees_its_log_once_everything_is_acked(start_pzq, small_fs):
    """Segments used to go only after their ACK records were written: on a full disk,
    never. Now a segment whose messages are all ACKed is deleted while writes fail."""
    q = start_pzq(*FAST, database=small_fs / "db")
    acked = fill_up(q, small_fs)
    with Consumer(q.send) as c:
        for _ in acked:
            c.ack(c.recv(5))
        c = wait_counter(q, "write_failing", lambda n: n == 0)
    assert c["messages"] == 0 and c["failed_writes"] <= 20, c
    assert len(list((small_fs / "db").glob("*.seg"))) <= 2
    q = q.restart()
    assert q.counters()["messages"] == 0
    legit_round_trip(q)


def test_the_python_producer_refuses_an_id_the_queue_would_refuse(ctx):
    """The queue answers a refused long id with the id cut to 255 bytes, which the producer
    could never match to what it sent: the producer refuses such an id itself."""
    from pzq.client import Producer

    producer = Producer("tcp://127.0.0.1:1", context=ctx)
    try:
        with pytest.raises(ValueError, match="message id longer than 255 bytes"):
            producer.send(b"body", msg_id=b"i" * 256)
        assert not producer.outstanding
        producer.send(b"body", msg_id=b"i" * 255)  # at the limit: sent (nobody listens)
    finally:
        producer.close()


def test_a_producer_that_does_not_read_its_acks_holds_back_no_one_else(start_pzq):
    """Its ACKs wait apart from the others' (they were all held behind its full connection,
    and past 100 000 the oldest dropped), its connection is no longer read once they cost
    more than a bound, and when it reads again it gets every ACK, in order."""
    q = start_pzq()
    base = vm_kb(q.pid)
    hog = RawProducer(q.receive, rcvbuf=4096)
    n, tag = 200_000, uuid.uuid4().hex.encode()
    keys = [b"%s-%d-" % (tag, i) + b"k" * 60 for i in range(n)]
    blob = b"".join(zmtp.encode_message([k, b"", b"0123456789"]) for k in keys)
    sender = threading.Thread(target=hog.send_raw, args=(blob,), daemon=True)
    sender.start()
    # its ACKs fill its connection: the rest of its messages are no longer read
    wait_for(lambda: q.counters()["produced"] > 50_000 and _settled(q), 60,
             "the hog's messages to stop coming in")
    held_at = q.counters()["produced"]
    assert held_at < n, "every message was read: its connection was never held"
    with Producer(q.receive, window=16) as p:  # another producer's ACKs come at once
        for i in range(20):
            p.send(b"legit %d" % i, msg_id=b"legit-%d-%s" % (i, tag))
        p.flush(10)  # (raises if any is not ACKed in time)
    assert (vm_kb(q.pid) - base) << 10 < 96 << 20
    hog.sock.settimeout(30)
    for i, key in enumerate(keys):  # it reads: every ACK, in order
        assert hog.recv() == [key, b"1", b""], f"ACK {i}"
    sender.join(30)
    assert q.counters()["produced"] == n + 20
    hog.close()


def _settled(q) -> bool:
    """The queue takes no more of the hog's messages (its count holds for 0.5 s)."""
    before = q.counters()["produced"]
    time.sleep(0.5)
    return q.counters()["produced"] == before
