"""Streaming bytes through a broker's pipe with two raw wire clients, for tests that need
traffic while something else happens (SIGHUPs, a stopped syslog server)."""

from __future__ import annotations

import hashlib
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import zmq
from wire import (
    CLOSE_OK,
    INPUT_OK,
    OUTPUT_OK,
    READ_END,
    READ_OK,
    WRITE_OK,
    RawClient,
    close,
    input_,
    output,
    read,
    write,
)


def lockstep(ctx: zmq.Context, endpoint: str, pipe: bytes, chunks: int,
             size: int = 4096) -> list[float]:
    """Write ``chunks`` chunks and read each back before the next; returns each round's
    seconds (write until WRITE_OK, read until READ_OK)."""
    w, r = RawClient(ctx, endpoint), RawClient(ctx, endpoint)
    try:
        assert w.call(output(pipe)) == (OUTPUT_OK, None)
        assert r.call(input_(pipe)) == (INPUT_OK, None)
        rounds = []
        for i in range(chunks):
            data = bytes([i % 251]) * size
            t = time.perf_counter()
            assert w.call(write(data, 5000)) == (WRITE_OK, None)
            assert r.call(read(size, 5000)) == (READ_OK, data)
            rounds.append(time.perf_counter() - t)
        assert w.call(close()) == (CLOSE_OK, None)
        assert r.call(read(1, 5000)) == (READ_END, None)
        assert r.call(close()) == (CLOSE_OK, None)
        return rounds
    finally:
        w.close()
        r.close()


@dataclass
class Stream:
    """A writer thread and a reader thread moving bytes through ``pipe`` until ``finish()``.
    Any protocol error ends the stream and is kept in ``errors``."""

    ctx: zmq.Context
    endpoint: str
    pipe: bytes
    chunk: int = 16384
    written: Any = field(default_factory=hashlib.sha256)
    read_: Any = field(default_factory=hashlib.sha256)
    bytes_written: int = 0
    bytes_read: int = 0
    errors: list[str] = field(default_factory=list)

    def start(self) -> Stream:
        self._stop = threading.Event()
        self._opened = threading.Barrier(2, timeout=10)
        self._threads = [threading.Thread(target=self._write, daemon=True),
                         threading.Thread(target=self._read, daemon=True)]
        for t in self._threads:
            t.start()
        return self

    def finish(self, timeout: float = 20.0) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout)
        assert not any(t.is_alive() for t in self._threads), "stream threads still running"

    def _write(self) -> None:
        c = RawClient(self.ctx, self.endpoint, timeout_ms=10_000)
        try:
            self._expect(c.call(output(self.pipe)), OUTPUT_OK, "OUTPUT")
            self._opened.wait()
            i = 0
            while not self._stop.is_set() and not self.errors:
                data = (i.to_bytes(8, "big") * (self.chunk // 8))[: self.chunk]
                self._expect(c.call(write(data, 10_000)), WRITE_OK, f"WRITE {i}")
                self.written.update(data)
                self.bytes_written += len(data)
                i += 1
            self._expect(c.call(close()), CLOSE_OK, "writer CLOSE")
        except Exception as exc:
            self.errors.append(f"writer: {exc!r}")
        finally:
            c.close()

    def _read(self) -> None:
        c = RawClient(self.ctx, self.endpoint, timeout_ms=10_000)
        try:
            self._expect(c.call(input_(self.pipe)), INPUT_OK, "INPUT")
            self._opened.wait()
            while not self.errors:
                mid, data = c.call(read(self.chunk, 10_000))
                if mid == READ_END:
                    break
                self._expect((mid, None), READ_OK, "READ")
                assert isinstance(data, bytes)
                self.read_.update(data)
                self.bytes_read += len(data)
            self._expect(c.call(close()), CLOSE_OK, "reader CLOSE")
        except Exception as exc:
            self.errors.append(f"reader: {exc!r}")
        finally:
            c.close()

    def _expect(self, got: tuple, mid: int, what: str) -> None:
        if got[0] != mid:
            raise AssertionError(f"{what}: got {got!r}, expected message id {mid}")
