"""The ZPIPES server core and its pipe table against a model of what a pipe must deliver, under
any sequence of opens of a few pipe names, writes of random chunks, reads of random sizes,
closes and disconnects: each reader gets, in order, exactly the chunks accepted for it (a
writer's stream goes to the readers attached when it started, each of its chunks to each of
them) with nothing lost or duplicated; a READ takes what is there up to its size; a reader is
told end-of-pipe only once what it was sent is read, no writer is attached and one closed while
it was; it fails only once it has read what a writer lost after starting sent it. No request
waits that could be answered. No sockets, no clock (no request has a timeout)."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from zpipes_core import Core

from zbroker.services.zpipes.server import ServerConfig
from zpipes import protocol as p

CAPACITY = 16  # bytes a reader holds before its writers wait (a chunk may go past it)
PIPES = (b"p0", b"p1")
MAX_READERS, MAX_WRITERS = 3, 2  # open at a time: few enough that their pipes see traffic
NOW = 1.0


@dataclass(eq=False)
class Reader:
    pipe: bytes
    expected: bytearray = field(default_factory=bytearray)  # accepted for it, not read yet
    saw_close: bool = False  # a writer closed while it was attached
    failed: bool = False  # a writer of its stream was lost: it fails once it read the rest
    pending: int | None = None  # the size of its READ not answered yet
    closing: bool = False


@dataclass(eq=False)
class Writer:
    pipe: bytes
    started: bool = False
    audience: set[bytes] = field(default_factory=set)  # the readers its chunks go to
    pending: bytes | None = None  # the chunk of its WRITE not answered yet
    closing: bool = False


class PipesModel(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.core = Core(ServerConfig(capacity=CAPACITY))
        self.readers: dict[bytes, Reader] = {}
        self.writers: dict[bytes, Writer] = {}
        self.opening: dict[bytes, type] = {}  # clients whose INPUT_OK / OUTPUT_OK is due
        self.closing: dict[bytes, Reader | Writer] = {}  # ends whose CLOSE is being answered
        self.serial = 0

    # --- the model's view of a pipe ----------------------------------------------------------

    def readers_of(self, pipe: bytes) -> dict[bytes, Reader]:
        return {c: r for c, r in self.readers.items() if r.pipe == pipe}

    def writers_of(self, pipe: bytes) -> dict[bytes, Writer]:
        return {c: w for c, w in self.writers.items() if w.pipe == pipe}

    def reader_gone(self, client: bytes) -> None:
        self.readers.pop(client)
        for writer in self.writers.values():
            writer.audience.discard(client)

    def writer_gone(self, client: bytes, lost: bool) -> None:
        """Its end is detached: closed (``lost`` False), or lost, which breaks its stream."""
        writer = self.writers.pop(client)
        if not lost:
            for reader in self.readers_of(writer.pipe).values():
                reader.saw_close = True
            return
        for end in writer.audience:  # (a writer that had not started breaks nothing)
            reader = self.readers[end]
            if not reader.failed:
                reader.failed = True
                for other in self.writers.values():  # it takes nothing more from anyone
                    other.audience.discard(end)

    # --- what clients do ---------------------------------------------------------------------

    def send(self, client: bytes, msg) -> None:
        self.core.receive(client, [p.encode(msg)], NOW)
        self.check_replies()

    def new_client(self, kind: bytes) -> bytes:
        self.serial += 1
        return kind + str(self.serial).encode()

    @precondition(lambda self: len(self.readers) < MAX_READERS)
    @rule(pipe=st.sampled_from(PIPES))
    def open_reader(self, pipe):
        client = self.new_client(b"r")
        self.readers[client] = Reader(pipe)
        self.opening[client] = p.InputOk
        self.send(client, p.Input(pipe))

    @precondition(lambda self: len(self.writers) < MAX_WRITERS)
    @rule(pipe=st.sampled_from(PIPES))
    def open_writer(self, pipe):
        client = self.new_client(b"w")
        self.writers[client] = Writer(pipe)
        self.opening[client] = p.OutputOk
        self.send(client, p.Output(pipe))

    @precondition(lambda self: any(w.pending is None for w in self.writers.values()))
    @rule(data=st.data(), chunk=st.binary(max_size=24))
    def write(self, data, chunk):
        client = data.draw(st.sampled_from(sorted(c for c, w in self.writers.items()
                                                  if w.pending is None)))
        self.writers[client].pending = chunk
        self.send(client, p.Write(chunk, 0))

    @precondition(lambda self: any(r.pending is None for r in self.readers.values()))
    @rule(data=st.data(), size=st.integers(0, 40))
    def read(self, data, size):
        client = data.draw(st.sampled_from(sorted(c for c, r in self.readers.items()
                                                  if r.pending is None)))
        self.readers[client].pending = size
        self.send(client, p.Read(size, 0))

    @precondition(lambda self: self.readers or self.writers)
    @rule(data=st.data(), disconnect=st.booleans())
    def leave(self, data, disconnect):
        client = data.draw(st.sampled_from(sorted([*self.readers, *self.writers])))
        if disconnect:
            self.disconnect(client)
        else:
            self.close(client)

    def close(self, client: bytes) -> None:
        """CLOSE: a reader's pending READ fails; a writer's pending WRITE fails and cuts its
        stream (its readers fail after what they were sent)."""
        if client in self.readers:
            end = self.closing[client] = self.readers[client]
            self.reader_gone(client)
        else:
            end = self.closing[client] = self.writers[client]
            self.writer_gone(client, lost=end.pending is not None)
        end.closing = True
        self.send(client, p.Close())

    def disconnect(self, client: bytes) -> None:
        """Its connection is gone: a writer's stream, if it started, breaks."""
        if client in self.readers:
            self.reader_gone(client)
        else:
            self.writer_gone(client, lost=True)
        self.core.disconnected(client, NOW)
        self.check_replies()

    # --- what the core answers ---------------------------------------------------------------

    def check_replies(self) -> None:
        """Every reply of the step, in the order the core gave them."""
        for client, frame in self.core.outbox:
            self.check_reply(client, p.decode(frame))
        self.core.outbox.clear()
        assert not self.opening, self.opening  # every open answered
        assert not self.closing, self.closing  # every CLOSE answered (CLOSE_OK its last reply)

    def check_reply(self, client: bytes, reply) -> None:
        if client in self.opening:
            assert reply == self.opening.pop(client)(), (client, reply)
            return
        end = self.readers.get(client) or self.writers.get(client) or self.closing.get(client)
        assert end is not None, (client, reply)
        if type(end) is Reader:
            self.check_reader_reply(client, end, reply)
            return
        writer = end
        if type(reply) is p.WriteOk:
            self.accepted(client, writer)
        elif type(reply) is p.WriteFailed:
            # its audience has gone ("no readers"), or its CLOSE cut the WRITE
            assert writer.pending is not None, reply
            assert writer.closing or (writer.started and not writer.audience), reply
            writer.pending = None
        else:
            assert type(reply) is p.CloseOk and writer.closing, reply
            assert writer.pending is None
            del self.closing[client]

    def accepted(self, client: bytes, writer: Writer) -> None:
        """WRITE_OK: its chunk goes to each reader of its stream, the first one fixing who
        they are: the readers of the pipe then, but those whose stream broke."""
        assert writer.pending is not None and not writer.closing
        if not writer.started:
            writer.started = True
            writer.audience = {c for c, r in self.readers_of(writer.pipe).items()
                               if not r.failed}
        assert writer.audience, "a chunk accepted for no reader"
        for end in writer.audience:
            self.readers[end].expected += writer.pending
        writer.pending = None

    def check_reader_reply(self, client: bytes, reader: Reader, reply) -> None:
        if type(reply) is p.CloseOk:
            assert reader.closing and reader.pending is None
            del self.closing[client]
            return
        size = reader.pending
        assert size is not None, (client, reply)
        reader.pending = None
        if type(reply) is p.ReadOk:
            got = bytes(reply.chunk)
            assert len(got) == min(size, len(reader.expected)), (size, got, reader.expected)
            assert got == reader.expected[:len(got)], (got, reader.expected)
            del reader.expected[:len(got)]
        elif type(reply) is p.ReadEnd:
            assert size and not reader.expected and not reader.failed
            assert reader.saw_close and not self.writers_of(reader.pipe)
        else:
            assert type(reply) is p.ReadFailed, reply
            assert reader.closing or (reader.failed and not reader.expected), reply

    # --- what must hold after every step ----------------------------------------------------

    @invariant()
    def nothing_waits_that_could_be_answered(self):
        for client, reader in self.readers.items():
            if reader.pending:
                assert not reader.expected, (client, "a READ waits with data there")
                assert not reader.failed, (client, "a READ waits on a broken stream")
                assert not (reader.saw_close and not self.writers_of(reader.pipe)), \
                    (client, "a READ waits at the end of the pipe")
        for client, writer in self.writers.items():
            if writer.pending is None:
                continue
            if writer.started:
                audience = [self.readers[end] for end in writer.audience]
                assert audience, (client, "a WRITE waits with no reader left")
            else:
                audience = [r for r in self.readers_of(writer.pipe).values() if not r.failed]
            assert not audience or any(len(r.expected) >= CAPACITY for r in audience), \
                (client, "a WRITE waits with room for it")

    @invariant()
    def the_table_holds_what_the_readers_were_sent(self):
        held = sum(len(r.expected) for r in self.readers.values())
        assert self.core.pipes.buffered == held == self.core.pipes.buffered_bytes()


PipesModel.TestCase.settings = settings(max_examples=300, stateful_step_count=80,
                                        deadline=None)
test_pipes_deliver_what_their_model_delivers = PipesModel.TestCase
