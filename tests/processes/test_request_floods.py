"""100 ZPIPES connections that send one request type over and over and never read the answers
(HINT, PING, INPUT, OUTPUT, READ, WRITE, CLOSE and a command that does not exist), beside a
``zpipes write | zpipes read`` pair of another client that moves a megabyte.

Reported: 100 unread HINT askers grew the broker by 1.2 GB (each HINT answer waited in its
connection's queue until the core next said something, then went out as a piece of its own),
and beside them a pair got 49 KB of 983 KB through before both ends gave up with "broker not
responding": a new connection's first read took a flood's whole backlog (200 000 requests),
handled before anyone else's turn, and the loop accepts one connection a round."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time

import pytest
from helpers import (
    broker_env,
    logged_broker,
    rss_bytes,
    run_zbroker,
    unique_name,
    wait_for,
    wait_steady,
    write_config,
)
from test_unread_replies import UNREAD

SECONDS = 12
#: each request type's frame, in hex: 12 connections send each
REQUESTS = {
    "HINT": "aaa016",
    "PING": "aaa013",
    "INPUT": "aaa0010178",
    "OUTPUT": "aaa0040179",
    "READ": "aaa0070000000100000001",
    "WRITE": "aaa00c000000017a00000001",
    "CLOSE": "aaa010",
    "unknown": "aaa063",
}
EACH = 12


def zpipes_connections(name: str, cwd) -> int:
    r = run_zbroker(["status", name, "--json"], cwd=cwd)
    return json.loads(r.stdout)["services"]["zpipes"]["connections"] if r.returncode == 0 else 0


@pytest.mark.slow
def test_floods_of_every_request_type_leave_memory_flat_and_a_pair_moves_all(tmp_path):
    name = unique_name("reqs")
    broker, log_path = logged_broker(tmp_path, name, write_config(tmp_path / "zbroker.cfg", {}))
    floods: list[subprocess.Popen] = []
    try:
        wait_for(lambda: "broker started" in log_path.read_text(), 30, "the broker to start")
        before = wait_steady(lambda: rss_bytes(broker.pid), 10, "the broker's memory",
                             tolerance=1 << 20)
        floods = [subprocess.Popen(
            [sys.executable, "-c", UNREAD, str(SECONDS), f"@/zpipes/{name}", frame, str(EACH)],
            stdout=subprocess.PIPE, text=True) for frame in REQUESTS.values()]
        # every flooder connected (the loop takes a connection a round: the pair's clients
        # would otherwise wait behind them all, which the handshake deadline bounds)
        wait_for(lambda: zpipes_connections(name, tmp_path) >= EACH * len(REQUESTS), 30,
                 "the flood's connections")
        data = os.urandom(983_000)
        source = tmp_path / "in"
        source.write_bytes(data)
        zpipes = [sys.executable, "-m", "zpipes", "--broker", name, "--timeout", "5"]
        env = broker_env(tmp_path)
        with open(source, "rb") as stdin:
            writer = subprocess.Popen([*zpipes, "write", "pair"], stdin=stdin, env=env,
                                      stderr=subprocess.PIPE)
        reader = subprocess.run([*zpipes, "read", "pair"], env=env, capture_output=True,
                                timeout=60)
        writer_err = writer.communicate(timeout=60)[1]
        # the pair moved every byte, with no client timeout
        assert (reader.returncode, writer.returncode) == (0, 0), (reader.stderr, writer_err)
        assert hashlib.sha256(reader.stdout).digest() == hashlib.sha256(data).digest()

        peak = before
        while any(f.poll() is None for f in floods):
            peak = max(peak, rss_bytes(broker.pid))
            time.sleep(0.2)
        sent = {kind: int(f.stdout.read()) for kind, f in zip(REQUESTS, floods, strict=True)}
        assert broker.poll() is None, log_path.read_text()[-3000:]
        assert sent["HINT"] > 1 << 20, sent  # the floods got their requests in
        grown = peak - before
        assert grown < 150 << 20, f"the broker grew by {grown >> 20} MiB ({sent})"
    finally:
        for f in floods:
            if f.poll() is None:
                f.kill()
        broker.kill()
        broker.wait()
