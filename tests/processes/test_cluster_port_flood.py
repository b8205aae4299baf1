"""The cluster port inside the process's budget (zbroker/zmtp/libzmq_door.py).

Reported: the cluster socket accepted plain TCP connections without a cap, before any key
check; a flood of them used up the broker's descriptors and the next ``zbroker status`` made
libzmq abort the process (``Too many open files (src/ipc_listener.cpp:297)``). Here two keyed
brokers on loopback carry a pipe from one to the other while hosts that are not peers (other
loopback addresses) open more connections to the first one's cluster port than its
open-file limit allows."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from helpers import (
    FLOOD,
    free_port,
    logged_broker,
    run_zbroker,
    unique_name,
    wait_for,
    write_config,
)
from pipe_stream import (
    INPUT_OK,
    OUTPUT_OK,
    RawClient,
    input_,
    output,
)
from test_zmtp_flood import pipe_round
from test_zpipes_guard import limit_files

from zbroker.cluster.security import generate_key_file
from zbroker.zmtp.admission import HANDSHAKE_TIMEOUT_S
from zbroker.zmtp.libzmq_door import UNTRUSTED_LIMIT

FILES = 1200  # the flooded broker's open-file limit
SOURCES = 20  # hosts that are not peers: 127.0.0.10 ...
EACH = 150  # connections from each: 3 000 in all, past the limit


def status(name: str, cwd) -> dict:
    r = run_zbroker(["status", name, "--json"], cwd=cwd)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def peer_names(name: str, cwd) -> set[str]:
    """The names of the peers of broker ``name`` (none while it is starting)."""
    r = run_zbroker(["status", name, "--json"], cwd=cwd)
    if r.returncode != 0:
        return set()
    return {p["name"] for p in json.loads(r.stdout)["cluster"]["peers"]}


@pytest.mark.slow
def test_a_flood_of_the_cluster_port_leaves_the_broker_its_peer_and_its_pipe(tmp_path, ctx):
    key = tmp_path / "cluster.key"
    generate_key_file(key)
    names = [unique_name("fa"), unique_name("fb")]
    ports = [free_port(), free_port()]
    procs, logs = [], []
    for i, name in enumerate(names):
        home = tmp_path / name
        home.mkdir()
        cfg = write_config(home / "zbroker.cfg", {
            "clients": {"max_clients": 100, "timeout": 600},
            "cluster": {"enabled": True, "discovery": False, "key_file": str(key),
                        "peer_timeout": 3.0, "bind": f"tcp://127.0.0.1:{ports[i]}",
                        "peers": [f"tcp://127.0.0.1:{ports[1 - i]}"]}})
        proc, log = logged_broker(home, name, cfg,
                                  preexec_fn=limit_files(FILES) if i == 0 else None)
        procs.append(proc)
        logs.append(log)
    a, b = procs
    w = RawClient(ctx, f"ipc://@/zpipes/{names[0]}")
    r = RawClient(ctx, f"ipc://@/zpipes/{names[1]}")
    floods: list[subprocess.Popen] = []
    try:
        wait_for(lambda: names[1] in peer_names(names[0], tmp_path / names[0])
                 and names[0] in peer_names(names[1], tmp_path / names[1]), 30,
                 "the two brokers to link")
        # a pipe from one host to the other, through the cluster link
        assert r.call(input_(b"live")) == (INPUT_OK, None)
        assert w.call(output(b"live")) == (OUTPUT_OK, None)
        pipe_round(w, r, 0)

        flood_start = time.monotonic()
        floods = [subprocess.Popen(
            [sys.executable, "-c", FLOOD, str(EACH), "-", f"127.0.0.{10 + i}",
             f"127.0.0.1:{ports[0]}"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            for i in range(SOURCES)]
        # (libzmq accepts at once: every connection is made, then the excess is shut down)
        assert sum(int(f.stdout.readline()) for f in floods) > FILES

        # the broker stays alive, well below its limit, its control socket answers (it
        # aborted on the first status once the descriptors were gone), and it says what it
        # refused
        for _ in range(6):
            time.sleep(1)
            assert a.poll() is None, logs[0].read_text()[-3000:]
            fds = len(os.listdir(f"/proc/{a.pid}/fd"))
            assert fds < FILES - 200, fds
            port = status(names[0], tmp_path / names[0])["cluster"]["port"]
        assert port["untrusted"] <= UNTRUSTED_LIMIT, port
        assert port["refused"]["too many from one source"] > 0, port
        assert port["refused"]["too many clients"] > 0, port  # the strangers' pool is full

        # the pipe goes on, and the peers stay linked through the flood
        for i in range(1, 20):
            pipe_round(w, r, i)
        assert names[1] in peer_names(names[0], tmp_path / names[0])
        assert names[0] in peer_names(names[1], tmp_path / names[1])

        # the strangers' connections that hold end at the handshake deadline
        wait_for(lambda: status(names[0], tmp_path / names[0])["cluster"]["port"]["untrusted"]
                 == 0, HANDSHAKE_TIMEOUT_S + 20, "the flood's connections to be dropped")
        pipe_round(w, r, 99)
        elapsed = time.monotonic() - flood_start
        log = logs[0].read_text()
        assert "Too many open files" not in log
        assert "peer lost" not in log and "peer lost" not in logs[1].read_text()
        refusals = [line for line in log.splitlines() if "cluster connection refused" in line]
        assert 0 < len(refusals) <= 2 * (elapsed + 2), refusals[:10]
        assert a.poll() is None and b.poll() is None
    finally:
        for flood in floods:
            flood.kill()
            flood.wait(30)
        w.close()
        r.close()
        for p in procs:
            p.kill()
            p.wait(30)
