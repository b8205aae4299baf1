"""The loop a broker runs on: uvloop (a dependency) unless ZBROKER_EVENT_LOOP=asyncio; a
real broker on each loop moves a pipe's bytes and says in its log which loop it runs."""

from __future__ import annotations

import os

import pytest
from helpers import through_a_pipe, wait_for

from zbroker.runtime import event_loop


def test_the_loop_is_uvloop_unless_asyncio_is_asked_for(monkeypatch):
    monkeypatch.delenv(event_loop.ENV, raising=False)
    assert event_loop.chosen() == "uvloop"
    for value in ("asyncio", "ASYNCIO", " asyncio "):
        monkeypatch.setenv(event_loop.ENV, value)
        assert event_loop.chosen() == "asyncio"
    monkeypatch.setenv(event_loop.ENV, "uvloop")
    assert event_loop.chosen() == "uvloop"


def test_run_returns_what_the_coroutine_returns(monkeypatch):
    async def answer() -> int:
        return 42

    for loop in ("asyncio", "uvloop"):
        monkeypatch.setenv(event_loop.ENV, loop)
        assert event_loop.run(answer()) == 42


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_broker_on_each_loop_moves_a_pipe(start_broker, monkeypatch, loop):
    monkeypatch.setenv(event_loop.ENV, loop)
    b = start_broker()
    wait_for(lambda: f"event_loop={loop}" in b.stderr(), 10, "the broker's start line")
    data = os.urandom(3 << 20)
    assert through_a_pipe(b.name, "p", data) == data
