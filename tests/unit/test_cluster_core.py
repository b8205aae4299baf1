"""Pipes across brokers, without sockets: several ZpipesServer cores, each the ZPIPES service of
a broker's cluster core, on the in-memory network (zpipes_cluster.py on cluster_cores.py). The
same scenarios run over real namespaces in test_cluster_netns.py."""

import dataclasses

import pytest
from zpipes_cluster import Cluster

from zbroker.service import PeerBroker
from zbroker.services.zpipes import peering
from zbroker.services.zpipes.server import peer_terms
from zpipes import protocol as p


@pytest.fixture
def c():
    cl = Cluster("ABC")
    cl.join_all()
    return cl


@pytest.mark.parametrize("reader_first", [True, False])
def test_writer_on_a_reader_on_b(c, reader_first):
    opens = [("B", b"r", p.Input(b"x")), ("A", b"w", p.Output(b"x"))]
    for broker, client, msg in opens if reader_first else opens[::-1]:
        c.send(broker, client, msg)
    c.send("A", b"w", p.Write(b"hello ", 0))
    c.send("A", b"w", p.Write(b"world", 0))
    c.send("A", b"w", p.Close())
    c.send("B", b"r", p.Read(100, 0))
    c.send("B", b"r", p.Read(100, 0))
    c.send("B", b"r", p.Read(100, 0))
    assert c.replies("A", b"w") == [p.OutputOk(), p.WriteOk(), p.WriteOk(), p.CloseOk()]
    assert c.replies("B", b"r") == [p.InputOk(), p.ReadOk(b"hello world"), p.ReadEnd(),
                                    p.ReadEnd()]


def test_stream_and_end_across_brokers(c):
    c.send("B", b"r", p.Input(b"x"))
    c.send("A", b"w", p.Output(b"x"))
    c.send("B", b"r", p.Read(100, 0))  # pending before any data
    c.send("A", b"w", p.Write(b"hello", 0))
    c.send("A", b"w", p.Close())
    c.send("B", b"r", p.Read(100, 0))
    assert c.replies("B", b"r") == [p.InputOk(), p.ReadOk(b"hello"), p.ReadEnd()]
    assert c.servers["C"].pipes.pipes[b"x"].readers  # C knows of B's reader
    c.send("B", b"r", p.Close())
    assert all(s.pipes.pipes == {} for s in c.servers.values())  # gone everywhere


def test_write_waits_for_a_remote_reader(c):
    c.send("A", b"w", p.Output(b"x"))
    c.send("A", b"w", p.Write(b"data", 0))
    assert c.replies("A", b"w") == [p.OutputOk()]
    c.send("C", b"r", p.Input(b"x"))
    assert c.replies("A", b"w") == [p.WriteOk()]
    c.send("C", b"r", p.Read(10, 0))
    assert c.replies("C", b"r") == [p.InputOk(), p.ReadOk(b"data")]


def test_fan_out_to_readers_on_two_brokers_and_locally(c):
    for broker in "ABC":
        c.send(broker, b"r", p.Input(b"fan"))
    c.send("A", b"w", p.Output(b"fan"))
    c.send("A", b"w", p.Write(b"one", 0))
    c.send("A", b"w", p.Write(b"two", 0))
    c.send("A", b"w", p.Close())
    for broker in "ABC":
        c.send(broker, b"r", p.Read(100, 0))
        c.send(broker, b"r", p.Read(100, 0))
        assert c.replies(broker, b"r") == [p.InputOk(), p.ReadOk(b"onetwo"), p.ReadEnd()]


def test_late_remote_reader_gets_none_of_a_started_stream(c):
    c.send("B", b"r1", p.Input(b"x"))
    c.send("A", b"w", p.Output(b"x"))
    c.send("A", b"w", p.Write(b"first", 0))
    c.send("C", b"r2", p.Input(b"x"))
    c.send("A", b"w", p.Write(b"second", 0))
    c.send("A", b"w", p.Close())
    c.send("B", b"r1", p.Read(100, 0))
    c.send("C", b"r2", p.Read(100, 0))
    assert c.replies("B", b"r1")[1:] == [p.ReadOk(b"firstsecond")]
    assert c.replies("C", b"r2")[1:] == [p.ReadEnd()]


def test_slow_remote_reader_throttles_the_writer_by_credit():
    c = Cluster("AB", capacity=10)
    c.join_all()
    c.send("B", b"r", p.Input(b"x"))
    c.send("A", b"w", p.Output(b"x"))
    for _ in range(6):
        c.send("A", b"w", p.Write(b"12345", 0))
    assert c.replies("A", b"w") == [p.OutputOk(), p.WriteOk(), p.WriteOk()]
    assert c.servers["B"].pipes.buffered_bytes() == 10  # bounded on the reader's broker too
    c.send("B", b"r", p.Read(5, 0))  # credit flows back: one more chunk may go
    assert c.replies("A", b"w") == [p.WriteOk()]
    c.send("B", b"r", p.Read(100, 0))
    assert c.replies("A", b"w") == [p.WriteOk(), p.WriteOk()]
    assert c.replies("B", b"r")[1:] == [p.ReadOk(b"12345"), p.ReadOk(b"1234512345")]


def test_peer_lost_fails_the_writer_pending_write(c):
    c.send("B", b"r", p.Input(b"x"))
    c.send("A", b"w", p.Output(b"x"))
    c.send("A", b"w", p.Write(b"a", 0))
    c.cut("A", "B")  # B's credits no longer arrive: the writer waits...
    c.servers["A"].pipes.capacity = 1
    c.send("A", b"w", p.Write(b"b", 0))
    c.lose("B")  # ...until B is declared lost
    assert c.replies("A", b"w") == [p.OutputOk(), p.WriteOk(), p.WriteFailed(c.lost("B"))]
    c.send("A", b"w", p.Write(b"c", 0))  # and it stays failed: no WRITE_OK into the void
    assert c.replies("A", b"w") == [p.WriteFailed(c.lost("B"))]


def test_a_writer_whose_reader_was_lost_after_its_write_fails_its_close(c):
    """The seed of a heal that flapped: the WRITE was taken (WRITE_OK) but its DATA never
    reached the reader's broker, which was lost before the writer's CLOSE. Its stream did not
    reach its end: the CLOSE says so (CLOSE_FAILED, the original protocol's), never OK."""
    c.send("B", b"r", p.Input(b"x"))
    c.send("A", b"w", p.Output(b"x"))
    c.cut("A", "B")  # the DATA is lost on the way
    c.send("A", b"w", p.Write(b"works again", 0))
    c.lose("B")
    c.send("A", b"w", p.Close())
    assert c.replies("A", b"w") == [p.OutputOk(), p.WriteOk(), p.CloseFailed(c.lost("B"))]
    c.send("A", b"w", p.Output(b"x"))  # the client may open again: a close all the same
    assert c.replies("A", b"w") == [p.OutputOk()]


def test_a_writer_that_only_lost_a_reader_outside_its_stream_closes_fine(c):
    c.send("B", b"r", p.Input(b"x"))
    c.send("A", b"w", p.Output(b"x"))
    c.lose("B")  # before the stream started: no reader of it was lost
    c.send("C", b"r", p.Input(b"x"))
    c.send("A", b"w", p.Write(b"x", 0))
    c.send("A", b"w", p.Close())
    assert c.replies("A", b"w") == [p.OutputOk(), p.WriteOk(), p.CloseOk()]


def test_peer_lost_fails_the_reader_not_end_of_stream(c):
    c.send("B", b"r", p.Input(b"x"))
    c.send("A", b"w", p.Output(b"x"))
    c.send("A", b"w", p.Write(b"partial", 0))
    c.send("B", b"r", p.Read(100, 0))
    c.send("B", b"r", p.Read(100, 0))  # pending when A dies
    c.lose("A")
    assert c.replies("B", b"r") == [p.InputOk(), p.ReadOk(b"partial"),
                                    p.ReadFailed("writer lost: " + c.lost("A"))]


def test_losing_a_peer_that_had_not_written_is_not_a_failure(c):
    c.send("B", b"r", p.Input(b"x"))
    c.send("A", b"w", p.Output(b"x"))
    c.send("C", b"w", p.Output(b"x"))
    c.lose("A")  # A's writer never wrote: no stream of it is missing
    c.send("C", b"w", p.Write(b"fine", 0))
    c.send("B", b"r", p.Read(100, 0))
    assert c.replies("B", b"r") == [p.InputOk(), p.ReadOk(b"fine")]


def test_what_a_peers_hello_says_is_what_its_core_is_told():
    """The service and the harness tell the core the same (server.peer_terms): a feature is
    said with true and nothing else, CONFIRM only on a numbered link."""
    said = {"zpipes": {"directory": True, "fanout": 1, "write_frames": "yes", "confirm": True}}
    life = PeerBroker("b.1#1", "b", "tcp://b:5670", member="b.1", features=said, numbered=True,
                      label="b@h")
    assert peer_terms(life) == {"member": "b.1", "label": "b@h", "directory": True,
                                "fanout": False, "write_frames": False, "confirm": True}
    assert peer_terms(dataclasses.replace(life, numbered=False))["confirm"] is False
    assert not any(peer_terms(PeerBroker("c#1", "c", "tcp://c:1")).values())


def test_broker_joining_late_learns_the_open_pipes():
    """Defect 8 / seed "sometimes reader and writer pipes don't connect"."""
    c = Cluster("AB")
    c.send("A", b"w", p.Output(b"late"))
    c.send("A", b"w", p.Write(b"waiting", 0))
    c.link("A", "B")
    c.send("B", b"r", p.Input(b"late"))
    c.send("B", b"r", p.Read(100, 0))
    assert c.replies("A", b"w") == [p.OutputOk(), p.WriteOk()]
    assert c.replies("B", b"r") == [p.InputOk(), p.ReadOk(b"waiting")]


def test_seed_rapid_writer_opens_do_not_cross_wires(c):
    """Seed "rapid writer opens asserts": writer on A, reader on B, new writer on B; writes."""
    c.send("A", b"w1", p.Output(b"pipe"))
    c.send("B", b"r", p.Input(b"pipe"))
    c.send("B", b"w2", p.Output(b"pipe"))
    c.send("B", b"w2", p.Write(b"from B", 0))
    c.send("A", b"w1", p.Write(b"from A", 0))
    c.send("B", b"r", p.Read(100, 0))
    c.send("B", b"r", p.Read(100, 0))
    assert c.replies("B", b"w2")[-1] == p.WriteOk()
    assert c.replies("A", b"w1")[-1] == p.WriteOk()
    assert c.replies("B", b"r")[1:] == [p.ReadOk(b"from Bfrom A")]


def test_seed_rapid_open_close_reopen_keeps_ids_apart(c):
    """Seed "zpipes_client_new asserts on rapid open" and defect 8: a late message of an old
    attachment cannot act on a new one."""
    c.send("A", b"w", p.Output(b"pipe"))
    c.send("B", b"r", p.Input(b"pipe"))
    c.send("A", b"w", p.Write(b"old", 0))
    c.send("A", b"w", p.Close())
    c.send("B", b"r", p.Close())
    c.send("A", b"w", p.Output(b"pipe"))  # same connections, new attachments
    c.send("B", b"r", p.Input(b"pipe"))
    c.send("A", b"w", p.Write(b"new", 0))
    c.send("B", b"r", p.Read(100, 0))
    assert c.replies("B", b"r")[-1] == p.ReadOk(b"new")


def test_segv_sequence_open_write_then_remote_read(c):
    """Seed "segv on multi-broker": writer on one broker, reader on another."""
    c.send("A", b"w", p.Output(b"pipe"))
    c.send("B", b"r", p.Input(b"pipe"))
    assert c.replies("B", b"r") == [p.InputOk()]
    assert c.replies("A", b"w") == [p.OutputOk()]


def test_writer_close_reaches_reader_after_its_data(c):
    c.send("B", b"r", p.Input(b"x"))
    c.send("A", b"w", p.Output(b"x"))
    for i in range(5):
        c.send("A", b"w", p.Write(b"%d" % i, 0))
    c.send("A", b"w", p.Close())
    c.send("B", b"r", p.Read(100, 0))
    c.send("B", b"r", p.Read(100, 0))
    assert c.replies("B", b"r")[1:] == [p.ReadOk(b"01234"), p.ReadEnd()]


def test_malformed_peer_messages_are_dropped(c):
    c.send("B", b"r", p.Input(b"x"))
    c.servers["B"].peer_receive(c.life("B", "A"), [b"DATA", b"short"], c.now)
    c.servers["B"].peer_receive(c.life("B", "A"), [], c.now)
    c.servers["B"].peer_receive("Z", [b"DETACH", b"\0" * 8], c.now)  # not a peer
    c.send("A", b"w", p.Output(b"x"))
    c.send("A", b"w", p.Write(b"ok", 0))
    c.send("B", b"r", p.Read(10, 0))
    assert c.replies("B", b"r")[-1] == p.ReadOk(b"ok")


@pytest.mark.parametrize("how,why", [("disconnected", "disconnected"),
                                     ("expired", "expired")])
def test_a_remote_writer_lost_without_close_fails_the_reader_after_its_data(how, why):
    c = Cluster("AB", client_timeout=1.0)
    c.join_all()
    c.send("B", b"r", p.Input(b"x"))
    c.send("A", b"w", p.Output(b"x"))
    c.send("A", b"w", p.Write(b"partial", 0))
    if how == "disconnected":
        c.servers["A"].disconnected(b"w", c.now)
        c.pump()
    else:
        for _ in range(3):  # the reader talks, the writer is silent with nothing held
            c.advance(0.5)
            c.send("B", b"r", p.Ping())
    c.send("B", b"r", p.Read(100, 0))
    c.send("B", b"r", p.Read(100, 0))
    replies = [r for r in c.replies("B", b"r") if r != p.PingOk()]
    assert replies == [p.InputOk(), p.ReadOk(b"partial"), p.ReadFailed(f"writer lost: {why}")]


def test_a_remote_reader_broken_by_one_writer_holds_back_no_writer_elsewhere(c):
    """A reader whose stream a lost writer broke takes nothing more; what another broker's
    writer sends it meanwhile is credited back, so that writer never waits for that room."""
    c = Cluster("AB", capacity=4)
    c.join_all()
    c.send("B", b"r", p.Input(b"x"))
    c.send("B", b"w1", p.Output(b"x"))
    c.send("A", b"w2", p.Output(b"x"))
    c.send("A", b"r2", p.Input(b"x"))
    c.send("B", b"w1", p.Write(b"1", 0))
    c.send("A", b"w2", p.Write(b"22", 0))  # its audience: r on B and r2 on A
    c.servers["B"].disconnected(b"w1", c.now)
    c.pump()
    for _ in range(5):  # r2 keeps reading; r never reads: w2 must not wait for r's room
        c.send("A", b"w2", p.Write(b"33", 0))
        c.send("A", b"r2", p.Read(100, 0))
    assert c.replies("A", b"w2") == [p.OutputOk()] + [p.WriteOk()] * 6
    c.send("B", b"r", p.Read(100, 0))
    c.send("B", b"r", p.Read(100, 0))
    assert c.replies("B", b"r")[1:] == [p.ReadOk(b"122"), p.ReadFailed("writer lost: disconnected")]


# --- fan-out: one DATA per remote broker per chunk -------------------------------------------


def read_all(c, broker, client, size=1 << 20):
    """Everything the reader gets until it would wait: its data, and how it ended (None: it
    waits for more)."""
    got, last = b"", None
    while True:
        c.send(broker, client, p.Read(size, 0))
        replies = c.replies(broker, client)
        for r in replies:
            if isinstance(r, p.ReadOk):
                got += r.chunk
        last = replies[-1] if replies else None
        if not isinstance(last, p.ReadOk):
            return got, last


def test_one_data_per_remote_broker_per_chunk_whatever_its_readers():
    c = Cluster("ABC", fanout=True)
    c.join_all()
    for client in (b"r1", b"r2", b"r3"):
        c.send("B", client, p.Input(b"fan"))
    c.send("C", b"r", p.Input(b"fan"))
    c.send("A", b"w", p.Output(b"fan"))
    c.sent.clear()
    chunks = [b"%d" % i * 100 for i in range(10)]
    for chunk in chunks:
        c.send("A", b"w", p.Write(chunk, 0))
        for client in (b"r1", b"r2", b"r3"):
            c.send("B", client, p.Read(1 << 20, 0))
        c.send("C", b"r", p.Read(1 << 20, 0))
    c.send("A", b"w", p.Close())
    assert c.sent["A", "B", b"DATA"] == len(chunks)  # not one per reader there
    assert c.sent["A", "C", b"DATA"] == len(chunks)
    assert c.servers["A"].links.data_bytes_sent == 2 * sum(map(len, chunks))
    assert c.servers["B"].links.data_bytes_received == sum(map(len, chunks))
    for broker, client in (("B", b"r1"), ("B", b"r2"), ("B", b"r3"), ("C", b"r")):
        got = b"".join(r.chunk for r in c.replies(broker, client) if isinstance(r, p.ReadOk))
        rest, end = read_all(c, broker, client)
        assert (got + rest, end) == (b"".join(chunks), p.ReadEnd())
    assert c.replies("A", b"w") == [p.OutputOk()] + [p.WriteOk()] * len(chunks) + [p.CloseOk()]


def test_a_broker_without_fan_out_gets_one_data_per_reader():
    """B takes DATA for several readers, C is a broker of before: it gets the frames it
    knows, one reader each."""
    c = Cluster("ABC", fanout="AB")
    c.join_all()
    for broker in "BC":
        for client in (b"r1", b"r2"):
            c.send(broker, client, p.Input(b"mix"))
    c.send("A", b"w", p.Output(b"mix"))
    c.sent.clear()
    for i in range(4):
        c.send("A", b"w", p.Write(b"chunk %d;" % i, 0))
    c.send("A", b"w", p.Close())
    assert c.sent["A", "B", b"DATA"] == 4
    assert c.sent["A", "C", b"DATA"] == 8
    for broker in "BC":
        for client in (b"r1", b"r2"):
            assert read_all(c, broker, client) == (b"chunk 0;chunk 1;chunk 2;chunk 3;",
                                                   p.ReadEnd())


def test_the_slowest_reader_of_a_remote_broker_bounds_both_brokers():
    c = Cluster("AB", fanout=True, capacity=10)
    c.join_all()
    c.send("B", b"fast", p.Input(b"x"))
    c.send("B", b"slow", p.Input(b"x"))
    c.send("A", b"w", p.Output(b"x"))
    for _ in range(8):
        c.send("A", b"w", p.Write(b"12345", 0))
        c.send("B", b"fast", p.Read(100, 0))
    # the slow reader holds 10 bytes: the writer waits, however fast the other reads
    assert c.replies("A", b"w") == [p.OutputOk(), p.WriteOk(), p.WriteOk()]
    b = c.servers["B"]
    assert b.pipes.buffered_bytes() <= 10
    assert b.links.data_bytes_received == 10
    c.send("B", b"slow", p.Read(100, 0))
    assert c.replies("B", b"slow") == [p.InputOk(), p.ReadOk(b"1234512345")]
    assert c.replies("A", b"w") == [p.WriteOk(), p.WriteOk()]  # room for two more
    assert b.pipes.buffered_bytes() <= 10


@pytest.mark.parametrize("how", ["close", "disconnect"])
def test_a_remote_reader_that_goes_stalls_no_other_reader_of_its_broker(how):
    c = Cluster("AB", fanout=True, capacity=10)
    c.join_all()
    c.send("B", b"stays", p.Input(b"x"))
    c.send("B", b"goes", p.Input(b"x"))
    c.send("A", b"w", p.Output(b"x"))
    c.send("A", b"w", p.Write(b"12345", 0))
    c.send("A", b"w", p.Write(b"67890", 0))
    c.send("A", b"w", p.Write(b"abcde", 0))  # waits: "goes" never reads
    assert c.replies("A", b"w") == [p.OutputOk(), p.WriteOk(), p.WriteOk()]
    if how == "close":
        c.send("B", b"goes", p.Close())
    else:
        c.servers["B"].disconnected(b"goes", c.now)
        c.pump()
    got = b""
    for chunk in (b"fghij", b"klmno", b"pqrst"):
        rest, _ = read_all(c, "B", b"stays")
        got += rest
        c.send("A", b"w", p.Write(chunk, 0))
    c.send("A", b"w", p.Close())
    rest, end = read_all(c, "B", b"stays")
    assert (got + rest, end) == (b"1234567890abcdefghijklmnopqrst", p.ReadEnd())
    assert c.replies("A", b"w") == [p.WriteOk()] * 4 + [p.CloseOk()]


def test_a_lost_broker_fails_only_the_streams_that_touch_it_with_fan_out():
    c = Cluster("ABC", fanout=True)
    c.join_all()
    for client in (b"r1", b"r2"):
        c.send("B", client, p.Input(b"to-b"))
    c.send("C", b"r", p.Input(b"to-c"))
    c.send("A", b"wb", p.Output(b"to-b"))
    c.send("A", b"wc", p.Output(b"to-c"))
    c.send("A", b"wb", p.Write(b"one", 0))
    c.send("A", b"wc", p.Write(b"one", 0))
    c.lose("C")
    c.send("A", b"wb", p.Write(b"two", 0))
    c.send("A", b"wb", p.Close())
    c.send("A", b"wc", p.Write(b"two", 0))
    assert c.replies("A", b"wb") == [p.OutputOk(), p.WriteOk(), p.WriteOk(), p.CloseOk()]
    assert c.replies("A", b"wc") == [p.OutputOk(), p.WriteOk(), p.WriteFailed(c.lost("C"))]
    for client in (b"r1", b"r2"):
        assert read_all(c, "B", client) == (b"onetwo", p.ReadEnd())


def test_data_and_credit_for_several_readers_round_trip():
    for msg in (peering.Data(7, (1,), True, b"x"), peering.Data(7, (1, 2, 3), False, b"yz"),
                peering.Credit(((1, 10),)), peering.Credit(((1, 10), (2, 20)))):
        decoded = peering.decode(peering.encode(msg))
        assert decoded == msg or (isinstance(decoded, peering.Data)
                                  and bytes(decoded.chunk) == msg.chunk
                                  and decoded.reader_ends == msg.reader_ends)
    named_twice = peering.encode(peering.Data(7, (1, 2, 1), False, b"x"))
    assert peering.decode(named_twice).reader_ends == (1, 2)
    # a single reader is the frame brokers of before know
    assert peering.encode(peering.Data(7, (1,), True, b"x")) == [
        b"DATA", bytes(7) + b"\x07" + bytes(7) + b"\x01", b"\x01", b"x"]
    for frames in ([b"DATA", bytes(8), b"\x00", b"x"], [b"DATA", bytes(20), b"\x00", b"x"],
                   [b"DATA", bytes(8 * 1026), b"\x00", b"x"], [b"CREDIT", bytes(24)],
                   [b"CREDIT", b""], [b"CREDIT", bytes(16 * 1025)]):
        assert isinstance(peering.decode(frames), peering.PeerDecodeError), frames


@pytest.mark.parametrize("write_frames", [True, False])
def test_a_big_chunk_crosses_in_its_write_frame_and_is_read_out_of_it(write_frames):
    """To a broker that takes it, a chunk goes in the WRITE frame it came in, and that broker
    answers its readers' READs with that very buffer (no copy), however many they are."""
    c = Cluster("AB", fanout=True, write_frames=write_frames, writable=True)
    c.join_all()
    for client in (b"r1", b"r2"):
        c.send("B", client, p.Input(b"x"))
    c.send("A", b"w", p.Output(b"x"))
    big = bytes(range(256)) * 1024  # 256 KiB: sent to the clients without a copy
    c.send("A", b"w", p.Write(big, 0))
    c.send("A", b"w", p.Write(b"small", 0))
    c.send("A", b"w", p.Close())
    b = c.servers["B"]
    frames = []
    for client in (b"r1", b"r2"):
        c.send("B", client, p.Read(len(big), 0))
        frames.append(next(f for r, f in b.outbox if r == client and len(f) > len(big)))
        assert read_all(c, "B", client) == (big + b"small", p.ReadEnd())
    assert p.decode(frames[0]) == p.decode(frames[1]) == p.ReadOk(big)
    shared = isinstance(frames[0], memoryview) and frames[0].obj is frames[1].obj
    assert shared is write_frames
    assert c.replies("A", b"w") == [p.OutputOk(), p.WriteOk(), p.WriteOk(), p.CloseOk()]


def test_a_malformed_write_frame_in_a_data_is_dropped():
    ok = p.encode(p.Write(b"abc", 0))
    for frame in (ok[:-1], b"\x00" + ok[1:], ok[:7] + b"abcd" + ok[10:], b"short"):
        msg = peering.decode([b"DATA", bytes(16), bytes((peering.FIRST | peering.FRAMED,)),
                              frame])
        assert isinstance(msg, peering.PeerDecodeError), frame
    msg = peering.decode([b"DATA", bytes(16), bytes((peering.FRAMED,)), ok])
    assert bytes(msg.chunk) == b"abc" and not msg.first
    assert isinstance(peering.decode([b"DATA", bytes(16), b"\x04", b"x"]),
                      peering.PeerDecodeError)


def test_a_remote_readers_window_is_sized_to_its_link_and_bounded():
    """On a link with a long round trip, more than the capacity may be in flight to a remote
    reader (the bandwidth-delay product), up to a bound: what a reader that does not read
    costs its broker."""
    from zbroker.services.zpipes.links import LINK_RATE, MAX_WINDOW, RTT_SAMPLES

    c = Cluster("AB", fanout=True)
    c.join_all()
    a, b = c.servers["A"], c.servers["B"]
    c.send("B", b"r", p.Input(b"x"))
    c.send("A", b"w", p.Output(b"x"))
    assert c.replies("A", b"w") == [p.OutputOk()]
    chunk = bytes(64 << 10)

    waiting = 0

    def fill():
        """Write until a WRITE waits; the bytes in flight to the reader then."""
        nonlocal waiting
        while True:
            c.send("A", b"w", p.Write(chunk, 0))
            waiting += 1 - c.replies("A", b"w").count(p.WriteOk())
            if waiting:
                return b.pipes.buffered_bytes()

    assert fill() == 1 << 20  # a LAN: the capacity (1 MiB) in flight, no more
    life = c.life("A", "B")
    a.peer_rtt(life, 0.016)  # 16 ms: twice the round trip at LINK_RATE
    window = 2 * 0.016 * LINK_RATE
    assert window <= fill() < window + (128 << 10)
    for _ in range(RTT_SAMPLES):  # however long the round trip, the window is bounded
        a.peer_rtt(life, 0.5)
    assert fill() == MAX_WINDOW  # all the reader's broker holds for it
    c.send("B", b"r", p.Read(1 << 20, 0))  # credit for 1 MiB lets as much more in
    assert fill() == MAX_WINDOW
    a.peer_rtt(life, 0.000_2)  # a short round trip: the window is the capacity again, and
    for _ in range(15):  # what is in flight drains to it before anything more goes
        c.send("B", b"r", p.Read(1 << 20, 0))
    assert c.replies("A", b"w") == []
    c.send("B", b"r", p.Read(1 << 20, 0))
    assert c.replies("A", b"w") == [p.WriteOk()]
    waiting = 0
    a.peer_rtt(life, 0.020)  # one slow echo (a busy host) is not a longer link: the least
    assert fill() == 1 << 20  # of the last few round trips counts


# --- a writer's CLOSE waits for its readers' brokers to confirm its end (CONFIRM) -------------


def confirming():
    """Three brokers that answer CONFIRM (test_directory_core runs these with its own)."""
    cl = Cluster("ABC", confirm=True, client_timeout=1.0)
    cl.join_all()
    return cl


def test_a_writers_close_is_answered_once_its_readers_broker_has_the_end():
    cc = confirming()
    cc.send("B", b"r", p.Input(b"x"))
    cc.send("A", b"w", p.Output(b"x"))
    cc.send("A", b"w", p.Write(b"all of it", 0))
    cc.send("B", b"r", p.Read(100, 0))
    cc.send("B", b"r", p.Read(100, 0))  # pending: its client is not silent either
    cc.pause("B", "A")  # B's answer is on its way
    cc.send("A", b"w", p.Close())
    cc.send("A", b"w", p.Ping())  # answered at once
    cc.send("A", b"w", p.Output(b"y"))  # queued behind the CLOSE: answered after it
    assert cc.replies("A", b"w") == [p.OutputOk(), p.WriteOk(), p.PingOk()]
    cc.advance(2.0)  # waiting for its answer, the client is not silent: never expired
    # (2 s: over the client timeout, under the peers' (3 s): B's heartbeats wait too)
    assert cc.replies("A", b"w") == []
    cc.resume("B", "A")
    assert cc.replies("A", b"w") == [p.CloseOk(), p.OutputOk()]
    assert cc.sent["A", "B", b"CONFIRM"] == 1 and cc.sent["A", "C", b"CONFIRM"] == 0
    assert cc.replies("B", b"r") == [p.InputOk(), p.ReadOk(b"all of it"), p.ReadEnd()]


def test_a_readers_broker_lost_before_it_confirmed_fails_the_close():
    cc = confirming()
    """The DATA and the DETACH went, but nothing says they arrived before the link (a reset
    one, that lost them) ended: the writer is told, never OK."""
    cc.send("B", b"r", p.Input(b"x"))
    cc.send("A", b"w", p.Output(b"x"))
    cc.send("A", b"w", p.Write(b"gone", 0))
    cc.cut("A", "B")
    cc.send("A", b"w", p.Close())
    assert cc.replies("A", b"w") == [p.OutputOk(), p.WriteOk()]
    cc.lose("B")
    assert cc.replies("A", b"w") == [p.CloseFailed(cc.lost("B"))]
    assert not cc.servers["A"].links.closing


def test_the_close_waits_for_every_readers_broker_and_only_for_them():
    cc = confirming()
    cc.send("B", b"r", p.Input(b"x"))
    cc.send("C", b"r", p.Input(b"x"))
    cc.send("A", b"r", p.Input(b"x"))  # a local reader needs no confirmation
    cc.send("A", b"w", p.Output(b"x"))
    cc.send("A", b"w", p.Write(b"both", 0))
    cc.pause("B", "A")
    cc.pause("C", "A")
    cc.send("A", b"w", p.Close())
    cc.resume("B", "A")
    assert cc.replies("A", b"w") == [p.OutputOk(), p.WriteOk()]
    cc.resume("C", "A")
    assert cc.replies("A", b"w") == [p.CloseOk()]


def test_a_close_before_the_stream_started_waits_for_the_remote_readers_too():
    cc = confirming()
    """An empty stream ends for its readers too: its end must get there."""
    cc.send("B", b"r", p.Input(b"x"))
    cc.send("A", b"w", p.Output(b"x"))
    cc.pause("B", "A")
    cc.send("A", b"w", p.Close())
    assert cc.replies("A", b"w") == [p.OutputOk()]
    cc.resume("B", "A")
    assert cc.replies("A", b"w") == [p.CloseOk()]
    cc.send("B", b"r", p.Read(10, 0))
    assert cc.replies("B", b"r") == [p.InputOk(), p.ReadEnd()]


def test_a_broker_that_does_not_confirm_is_not_waited_for():
    cl = Cluster("AB", confirm="A")  # B is a broker of before
    cl.join_all()
    cl.send("B", b"r", p.Input(b"x"))
    cl.send("A", b"w", p.Output(b"x"))
    cl.send("A", b"w", p.Write(b"x", 0))
    cl.pause("B", "A")
    cl.send("A", b"w", p.Close())
    assert cl.replies("A", b"w") == [p.OutputOk(), p.WriteOk(), p.CloseOk()]
    assert cl.sent["A", "B", b"CONFIRM"] == 0


def test_a_client_gone_or_a_broker_stopping_while_its_close_waits():
    cc = confirming()
    for client in (b"w1", b"w2"):
        cc.send("B", b"r" + client, p.Input(b"x" + client))
        cc.send("A", client, p.Output(b"x" + client))
        cc.send("A", client, p.Write(b"x", 0))
    cc.pause("B", "A")
    cc.send("A", b"w1", p.Close())
    cc.send("A", b"w2", p.Close())
    cc.servers["A"].disconnected(b"w1", cc.now)  # gone: nothing to answer
    cc.resume("B", "A")  # its late confirmation finds nobody
    assert cc.replies("A", b"w1") == [p.OutputOk(), p.WriteOk()]
    assert cc.replies("A", b"w2") == [p.OutputOk(), p.WriteOk(), p.CloseOk()]
    cc.send("A", b"w2", p.Output(b"xw2"))
    cc.send("A", b"w2", p.Write(b"y", 0))
    cc.pause("B", "A")
    cc.send("A", b"w2", p.Close())
    cc.send("A", b"w2", p.Read(1, 0))  # queued behind it
    cc.servers["A"].shutdown(cc.now)
    assert cc.replies("A", b"w2") == [p.OutputOk(), p.WriteOk(),
                                      p.CloseFailed("broker stopping"),
                                      p.ReadFailed("broker stopping")]
    assert not cc.servers["A"].links.closing

