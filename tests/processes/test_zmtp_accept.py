"""How the ZMTP server every endpoint runs on accepts (zbroker/zmtp/server.py): every waiting
connection in a round of the loop (uvloop's own server took one a round), and, when the
process has no descriptor left, a pause rather than a spin or a stop."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time

import pytest
from helpers import broker_env, wait_for
from test_metrics_slow_clients import cpu_seconds
from test_zpipes_guard import limit_files

#: a ZMTP endpoint alone in a process (``python -c SERVE``): prints its port, then, at each
#: line on its standard input: takes every descriptor left; gives them back; ends
SERVE = textwrap.dedent("""
    import asyncio, os, time
    import structlog
    from zbroker import logs
    from zbroker.runtime import event_loop
    from zbroker.services.zpipes.endpoint import Endpoint
    from zbroker.zmtp.admission import Admission, ConnectionBudget
    from zbroker.zmtp.refusals import Refusals

    logs.configure()  # to standard error

    async def line(loop):
        got = loop.create_future()
        loop.add_reader(0, lambda: got.done() or got.set_result(os.read(0, 100)))
        await got
        loop.remove_reader(0)

    def busy(loop):  # a loop that has other work: each round takes 10 ms
        time.sleep(0.01)
        loop.call_soon(busy, loop)

    async def main():
        loop = asyncio.get_running_loop()
        log = structlog.get_logger()
        admission = Admission("test", Refusals(log), budget=ConnectionBudget(limit=1000))
        ep = Endpoint(loop, on_message=lambda rid, frames: None,
                      on_refused=lambda rid, refused: None, on_gone=lambda rid: None,
                      after_input=lambda: None, admission=admission, max_bytes=1 << 20,
                      max_frames=4, log=log)
        sock = ep.listen("tcp://127.0.0.1:0")
        await ep.serve(sock)
        loop.call_soon(busy, loop)
        print(sock.getsockname()[1], flush=True)
        await line(loop)
        hog = []
        while True:  # every descriptor left
            try:
                hog.append(os.open("/dev/null", os.O_RDONLY))
            except OSError:
                break
        print("full", flush=True)
        await line(loop)
        for fd in hog:
            os.close(fd)
        await line(loop)

    event_loop.run(main())
""")


def greeted(s: socket.socket, timeout: float) -> bool:
    """Whether the server's ZMTP greeting (its first byte, 0xFF) came within ``timeout``."""
    s.settimeout(timeout)
    try:
        return s.recv(1) == b"\xff"
    except TimeoutError:
        return False


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_every_waiting_connection_is_taken_and_out_of_descriptors_it_waits(tmp_path, loop):
    env = {**broker_env(tmp_path), "ZBROKER_EVENT_LOOP": loop}
    server = subprocess.Popen([sys.executable, "-c", SERVE], env=env, cwd=tmp_path,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, preexec_fn=limit_files(512))
    conns: list[socket.socket] = []
    try:
        port = int(server.stdout.readline())
        fds = len(os.listdir(f"/proc/{server.pid}/fd"))
        # 100 connections at once to a loop whose rounds take 10 ms: all greeted within a
        # few rounds (one a round: a second)
        conns = [socket.create_connection(("127.0.0.1", port)) for _ in range(100)]
        started = time.monotonic()
        assert all(greeted(c, 5) for c in conns)
        assert time.monotonic() - started < 0.5
        for c in conns:
            c.close()
        conns = []
        # (their ends closed on the server's side too, before it takes every descriptor left:
        # one freed after would let the next connection in)
        seen = []

        def settled() -> bool:
            seen.append(len(os.listdir(f"/proc/{server.pid}/fd")))
            time.sleep(0.2)
            return len(seen) > 5 and len(set(seen[-5:])) == 1 and seen[-1] < fds + 50

        wait_for(settled, 15, "the server to close the connections")

        server.stdin.write(b"hog\n")
        server.stdin.flush()
        assert server.stdout.readline() == b"full\n"
        late = socket.create_connection(("127.0.0.1", port))  # waits in the backlog
        conns.append(late)
        cpu = cpu_seconds(server.pid)
        time.sleep(3)
        assert server.poll() is None
        # resting between tries (a spin on accept would take the whole 3 s of a core;
        # the loop.s own rounds sleep)
        assert cpu_seconds(server.pid) - cpu < 1.0
        assert not greeted(late, 0.1)
        server.stdin.write(b"free\n")
        server.stdin.flush()
        assert greeted(late, 5)  # accepted at the next try, and greeted
        server.stdin.write(b"end\n")
        server.stdin.flush()
        assert server.wait(10) == 0
        err = server.stderr.read().decode()
        assert "Traceback" not in err, err
        assert 1 <= err.count("test cannot accept connections: Too many open files") <= 5, err
    finally:
        for c in conns:
            c.close()
        if server.poll() is None:
            server.kill()
            server.wait(10)
