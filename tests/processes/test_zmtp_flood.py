"""Every ZMTP endpoint of a broker is guarded alike (zbroker/zmtp/): a flood of connections that
each send one byte and hold, on the ZPIPES endpoint and on a pzq queue's receive and send
endpoints at once, beside a live pipe and a live producer and consumer. The broker stays up,
its management socket answers, the legitimate traffic goes on, its descriptors stay within the
connection budget, the excess is refused and counted, and its log says so at most once a second
per endpoint and kind of refusal; once the flood's connections have been dropped (no handshake
in time), new clients are served again."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest
from helpers import (
    AS_NOBODY,
    FLOOD,
    free_port,
    logged_broker,
    needs_nobody,
    run_zbroker,
    unique_name,
    wait_for,
    write_config,
)
from pipe_stream import (
    CLOSE_OK,
    INPUT_OK,
    OUTPUT_OK,
    READ_OK,
    WRITE_OK,
    RawClient,
    close,
    input_,
    lockstep,
    output,
    read,
    write,
)
from test_zpipes_guard import limit_files

from pzq.client import Consumer, Producer
from zbroker.runtime.limits import CONTROL_CONNECTIONS, FD_RESERVE
from zbroker.zmtp.admission import HANDSHAKE_TIMEOUT_S

MAX_CLIENTS = 1500
FLOOD_EACH = 6700  # connections on each of the three endpoints: 20 100 in all

def status(name: str, cwd) -> dict:
    r = run_zbroker(["status", name, "--json"], cwd=cwd)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def pipe_round(w: RawClient, r: RawClient, i: int) -> None:
    data = b"%06d" % i * 100
    assert w.call(write(data, 5000)) == (WRITE_OK, None)
    assert r.call(read(len(data), 5000)) == (READ_OK, data)


@pytest.mark.slow
def test_a_flood_on_every_zmtp_endpoint_leaves_the_broker_and_its_clients_going(tmp_path, ctx):
    name = unique_name("flood")
    receive, send = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    cfg = write_config(tmp_path / "zbroker.cfg", {
        # (timeout: the live clients below do not ping, and 20 000 connections take a while
        # to make on a busy machine)
        "clients": {"max_clients": MAX_CLIENTS, "timeout": 600},
        "services": {"pzq": {"enabled": True, "queues": {"jobs": {
            "receive_endpoint": f"tcp://{receive}", "send_endpoint": f"tcp://{send}",
            "data_dir": str(tmp_path / "jobs")}}}}})
    broker, log_path = logged_broker(
        tmp_path, name, cfg,
        preexec_fn=limit_files(MAX_CLIENTS + FD_RESERVE + CONTROL_CONNECTIONS + 100))
    endpoint = f"ipc://@/zpipes/{name}"
    floods: list[subprocess.Popen] = []
    w, r = RawClient(ctx, endpoint), RawClient(ctx, endpoint)
    producer = consumer = None
    try:
        wait_for(lambda: "zpipes bound" in log_path.read_text()
                 and "pzq queue started" in log_path.read_text(), 30, "the broker to start")
        # the legitimate clients, connected before the flood
        assert w.call(output(b"live")) == (OUTPUT_OK, None)
        assert r.call(input_(b"live")) == (INPUT_OK, None)
        producer = Producer(f"tcp://{receive}", context=ctx)
        consumer = Consumer(f"tcp://{send}", context=ctx)
        pipe_round(w, r, 0)

        flood_start = time.monotonic()
        # two processes, each holding half (a process may hold 20 000 descriptors here)
        floods = [subprocess.Popen(
            [sys.executable, "-c", FLOOD, str(FLOOD_EACH // 2), "ff", "-",
             f"@/zpipes/{name}", receive, send],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            preexec_fn=limit_files(3 * FLOOD_EACH // 2 + 256)) for _ in range(2)]
        assert sum(int(f.stdout.readline()) for f in floods) > 0

        # the broker is up, its management socket answers, and it counts the refusals
        assert broker.poll() is None, log_path.read_text()[-3000:]
        fds = len(os.listdir(f"/proc/{broker.pid}/fd"))
        assert fds <= MAX_CLIENTS + FD_RESERVE, fds
        zpipes = status(name, tmp_path)["services"]["zpipes"]
        # one source (this test's uid, this host) holds at most half of the budget
        assert zpipes["refused"]["too many from one source"] > 0, zpipes
        # the pipe and the queue go on
        for i in range(1, 20):
            pipe_round(w, r, i)
        for i in range(50):
            producer.send(b"job %d" % i, msg_id=b"id-%d" % i)
        producer.flush(30)
        got = []
        deadline = time.monotonic() + 30
        while len(got) < 50 and time.monotonic() < deadline:
            m = consumer.recv(0.5)
            if m is not None:
                got.append(m.body)
                consumer.ack(m)
        assert sorted(got) == sorted(b"job %d" % i for i in range(50))

        # the flood's connections are dropped once their handshake is late; new clients
        # are served again
        wait_for(lambda: status(name, tmp_path)["services"]["zpipes"]["connections"] <= 2,
                 HANDSHAKE_TIMEOUT_S + 30, "the flood's connections to be dropped")
        fresh_w, fresh_r = RawClient(ctx, endpoint), RawClient(ctx, endpoint)
        try:
            assert fresh_w.call(output(b"after")) == (OUTPUT_OK, None)
            assert fresh_r.call(input_(b"after")) == (INPUT_OK, None)
            pipe_round(fresh_w, fresh_r, 99)
        finally:
            fresh_w.close()
            fresh_r.close()
        elapsed = time.monotonic() - flood_start
        assert broker.poll() is None
        zpipes = status(name, tmp_path)["services"]["zpipes"]
        assert zpipes["refused"]["no handshake"] > 0, zpipes

        log = log_path.read_text()
        assert "Too many open files" not in log
        lines = [line for line in log.splitlines()
                 if re.search(r"connection (refused|dropped)", line)]
        assert lines, log[-3000:]
        by_kind: dict[tuple[str, str], int] = {}
        for line in lines:
            who = re.search(r"(zpipes|pzq \w+) connection", line).group(1)
            kind = "dropped" if "dropped" in line else (
                "too many" if "too many" in line else "other")
            by_kind[who, kind] = by_kind.get((who, kind), 0) + 1
        # at most one line a second for each endpoint and kind, however many connections
        for key, n in by_kind.items():
            assert n <= elapsed + 2, (key, n, elapsed, lines[:20])
        assert len(lines) < 100
        assert w.call(close()) == (CLOSE_OK, None)
    finally:
        for flood in floods:
            flood.kill()
            flood.wait(30)
        for c in (producer, consumer):
            if c is not None:
                c.close()
        w.close()
        r.close()
        broker.kill()
        broker.wait(30)


@needs_nobody
def test_one_source_cannot_take_every_place_another_user_and_host_still_connect(tmp_path,
                                                                                 ctx):
    """Another local user floods the ZPIPES endpoint, another host a queue's receive
    endpoint: each holds at most its share (clients.max_per_source) of the budget, and new
    connections of this user and this host are still taken while the floods hold theirs."""
    name = unique_name("share")
    receive = f"127.0.0.1:{free_port()}"
    cfg = write_config(tmp_path / "zbroker.cfg", {
        "clients": {"max_clients": 1000, "max_per_source": 300},
        "services": {"zpipes": {"allow": {"users": ["*"]}},
                     "pzq": {"enabled": True, "queues": {"jobs": {
                         "receive_endpoint": f"tcp://{receive}",
                         "send_endpoint": f"tcp://127.0.0.1:{free_port()}",
                         "data_dir": str(tmp_path / "jobs")}}}}})
    broker, log_path = logged_broker(tmp_path, name, cfg)
    floods = []
    try:
        wait_for(lambda: "pzq queue started" in log_path.read_text(), 30, "the broker")
        nobody = AS_NOBODY
        # (the first byte of a greeting; from another address, as another host)
        for argv in ([*nobody, "-c", FLOOD, "600", "ff", "-", f"@/zpipes/{name}"],
                     [sys.executable, "-c", FLOOD, "600", "ff", "127.0.0.2", receive]):
            flood = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     preexec_fn=limit_files(4096), cwd=tmp_path)
            floods.append(flood)
            assert int(flood.stdout.readline()) > 0
        zpipes = status(name, tmp_path)["services"]["zpipes"]
        assert zpipes["refused"]["too many from one source"] >= 300, zpipes
        assert zpipes["connections"] <= 300
        # this user's new pipe and this host's new producer are served while the floods hold
        lockstep(ctx, f"ipc://@/zpipes/{name}", b"mine", 8)
        with Producer(f"tcp://{receive}", context=ctx) as producer:
            producer.send(b"job", msg_id=b"job-1")
            producer.flush(10)
        log = log_path.read_text()
        assert "uid 65534 (nobody)" in log and "host 127.0.0.2" in log, log[-3000:]
        assert broker.poll() is None
    finally:
        for flood in floods:
            flood.kill()
            flood.wait(30)
        broker.kill()
        broker.wait(30)
