"""Shared fixtures. Broker processes: see helpers.py.

    def test_x(broker):                     # a running broker with the default config
        broker.name, broker.endpoint, broker.proc, broker.stop()

    def test_y(start_broker):               # a factory
        b = start_broker(config={"log": {"level": "debug"}}, args=["--animate"])
        c = start_broker(name=b.name, wait=False)   # not waiting: it is expected to fail
        assert c.wait() == 1
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from helpers import BrokerProcess, spawn_broker  # noqa: E402

StartBroker = Callable[..., BrokerProcess]


@pytest.fixture
def start_broker(tmp_path: Path) -> Iterator[StartBroker]:
    """``start_broker(name=None, config=None, args=(), wait=True) -> BrokerProcess``.

    Starts a broker process (a unique name unless given; ``config`` a dict written as YAML)
    and, with ``wait``, waits until its endpoint accepts connections. Every broker still
    running at teardown is killed (SIGKILL).
    """
    started: list[BrokerProcess] = []

    def start(name: str | None = None, config: dict[str, Any] | str | None = None,
              args: Sequence[str] = (), wait: bool = True) -> BrokerProcess:
        b = spawn_broker(tmp_path, name=name, config=config, args=args)
        started.append(b)
        if wait:
            b.wait_until_up()
        return b

    yield start
    for b in started:
        b.kill()


@pytest.fixture
def broker(start_broker: StartBroker) -> BrokerProcess:
    """A running broker with a unique name and the default config."""
    return start_broker()


@pytest.fixture
def start_pzq(tmp_path: Path) -> Iterator[Callable[..., Any]]:
    """``start_pzq(*args, database=None) -> PzqProcess``: a standalone pzq process on free
    loopback ports, data in the test's temporary directory; killed at teardown."""
    from pzq_helpers import spawn_pzq

    started: list[Any] = []

    def start(*args: str, database: Path | None = None, **kw: Any) -> Any:
        db = database or tmp_path / f"pzq{len(started)}"
        q = spawn_pzq(db, *args, registry=started, **kw)
        q.wait_up()
        return q

    yield start
    for q in started:
        q.kill()
