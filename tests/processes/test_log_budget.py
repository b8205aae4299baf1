"""A log budget: however fast clients make events, the broker's log grows by a bounded number
of lines a second. For 10 s, at once: new connections that each send one bad ZPIPES frame and
go, new connections that each send a bad greeting to a queue's receive endpoint and go, and a
client that opens and closes a pipe as fast as it can (before: about 53 000, 91 000 and
97 000 lines for each 10 s). Together they add fewer than 500 lines, the lines that went say
how many of their kind were held back, and a live pipe goes on beside them."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from helpers import (
    broker_env,
    dealer_hello,
    free_port,
    logged_broker,
    unique_name,
    wait_for,
    write_config,
)
from pipe_stream import (
    INPUT_OK,
    OUTPUT_OK,
    READ_OK,
    WRITE_OK,
    RawClient,
    input_,
    output,
    read,
    write,
)

SECONDS = 10

#: ``python -c CHURN SECONDS TARGET HEX``: for SECONDS, connect to TARGET (``@NAME``: an
#: abstract ipc socket, else ``HOST:PORT``), send HEX's bytes, and close; prints how many times
CHURN = textwrap.dedent("""
    import socket, sys, time
    seconds, target, data = float(sys.argv[1]), sys.argv[2], bytes.fromhex(sys.argv[3])
    n, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        if target.startswith("@"):
            s = socket.socket(socket.AF_UNIX)
            address = "\\0" + target[1:]
        else:
            host, port = target.rsplit(":", 1)
            s, address = socket.socket(), (host, int(port))
        try:
            s.connect(address)
            s.sendall(data)
            time.sleep(0.001)  # the broker reads it before the close
            n += 1
        except OSError:
            time.sleep(0.01)
        finally:
            s.close()
    print(n, flush=True)
""")

#: ``python -c OPEN_CLOSE SECONDS ENDPOINT``: open a pipe as its writer and close it, again and
#: again, on one connection; prints how many times
OPEN_CLOSE = textwrap.dedent("""
    import sys, time, zmq
    seconds, endpoint = float(sys.argv[1]), sys.argv[2]
    sock = zmq.Context().socket(zmq.DEALER)
    sock.connect(endpoint)
    n, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        sock.send(b"\\xaa\\xa0\\x04\\x05churn")  # OUTPUT "churn"
        assert sock.recv()[2] == 5  # OUTPUT_OK
        sock.send(b"\\xaa\\xa0\\x10")  # CLOSE
        assert sock.recv()[2] == 17  # CLOSE_OK
        n += 1
    print(n, flush=True)
""")


@pytest.mark.slow
def test_floods_of_any_kind_add_a_bounded_number_of_log_lines(tmp_path, ctx):
    name = unique_name("logs")
    receive = free_port()
    cfg = write_config(tmp_path / "zbroker.cfg", {
        "services": {"pzq": {"enabled": True, "queues": {"jobs": {
            "receive_endpoint": f"tcp://127.0.0.1:{receive}",
            "send_endpoint": f"tcp://127.0.0.1:{free_port()}",
            "data_dir": str(tmp_path / "jobs")}}}}})
    broker, log_path = logged_broker(tmp_path, name, cfg)
    endpoint = f"ipc://@/zpipes/{name}"
    floods: list[subprocess.Popen] = []
    try:
        wait_for(lambda: "pzq queue started" in log_path.read_text(), 30, "the broker to start")
        w, r = RawClient(ctx, endpoint, 15_000), RawClient(ctx, endpoint, 15_000)
        assert w.call(output(b"live")) == (OUTPUT_OK, None)
        assert r.call(input_(b"live")) == (INPUT_OK, None)
        before = len(log_path.read_text().splitlines())

        bad_frame = dealer_hello() + b"\x00\x03\x00\x01\x02"  # not a ZPIPES signature
        floods.append(subprocess.Popen(
            [sys.executable, "-c", CHURN, str(SECONDS), f"@/zpipes/{name}", bad_frame.hex()],
            stdout=subprocess.PIPE, text=True))
        floods.append(subprocess.Popen(
            [sys.executable, "-c", CHURN, str(SECONDS), f"127.0.0.1:{receive}",
             (b"GET / HTTP/1.0\r\n\r\n" * 4).hex()], stdout=subprocess.PIPE, text=True))
        floods.append(subprocess.Popen(
            [sys.executable, "-c", OPEN_CLOSE, str(SECONDS), endpoint],
            stdout=subprocess.PIPE, text=True))
        rounds = 0
        deadline = time.monotonic() + SECONDS
        while time.monotonic() < deadline:
            data = b"%06d" % rounds * 10
            assert w.call(write(data, 15_000)) == (WRITE_OK, None)
            assert r.call(read(len(data), 15_000)) == (READ_OK, data)
            rounds += 1
            time.sleep(0.05)
        made = [int(f.communicate(timeout=30)[0]) for f in floods]
        time.sleep(1.5)  # past the budget's interval (1 s): what it held back is said
        assert broker.poll() is None, log_path.read_text()[-3000:]
        lines = log_path.read_text().splitlines()[before:]
        assert min(made) > 200, f"the floods did not get going: {made}"
        assert rounds > 0
        assert len(lines) < 500, (
            f"{len(lines)} log lines for {made} bad frames, bad greetings and open/close "
            "rounds:\n" + "\n".join(lines[:40]))
        held = sum(int(n) for n in re.findall(r"suppressed=(\d+)", "\n".join(lines)))
        assert held > 0, "no line says how many were held back"
        for kind in ("invalid frame", "pipe opened", "pipe closed"):
            assert any(kind in line for line in lines), f"no {kind!r} line at all"
        w.close()
        r.close()
    finally:
        for f in floods:
            if f.poll() is None:
                f.kill()
        broker.kill()
        broker.wait()


def test_a_flood_of_sighups_adds_a_bounded_number_of_log_lines(tmp_path):
    """Every reload logs what it did; 4 000 SIGHUPs in 20 s wrote 7 936 lines. The lines of
    reloads have a budget of their own now; the reloads themselves all happen (status)."""
    name = unique_name("hups")
    cfg = write_config(tmp_path / "zbroker.cfg", {"log": {"level": "info"}})
    broker, log_path = logged_broker(tmp_path, name, cfg)
    try:
        wait_for(lambda: "broker started" in log_path.read_text(), 30, "the broker to start")
        before = len(log_path.read_text().splitlines())
        sent, start = 0, time.monotonic()
        while time.monotonic() - start < 2.0 and sent < 2000:
            broker.send_signal(signal.SIGHUP)
            sent += 1
            time.sleep(0.002)
        time.sleep(1.5)  # past the budget's interval (1 s): what it held back is said
        assert broker.poll() is None, log_path.read_text()[-3000:]
        lines = log_path.read_text().splitlines()[before:]
        r = subprocess.run([sys.executable, "-m", "zbroker", "status", name, "--json"],
                           capture_output=True, text=True, cwd=tmp_path,
                           env=broker_env(tmp_path), timeout=30)
        reloads = json.loads(r.stdout)["reloads"]
        assert reloads["ok"] > 50, reloads  # (signals coalesce: fewer than sent)
        assert len(lines) < 60, f"{len(lines)} lines for {reloads['ok']} reloads:\n" + \
            "\n".join(lines[:20])
        assert any("suppressed" in line for line in lines), "\n".join(lines[:20])
    finally:
        broker.terminate()
        broker.wait(10)
