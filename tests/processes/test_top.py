"""``zbroker top``: the rates and the order (no terminal), ``--once`` against a real broker,
and the live view in a real terminal: tmux runs it, the test reads the screen and types q."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from helpers import REPO_ROOT, broker_env, run_zbroker, wait_for

import zpipes
from zbroker.cli.top import Sample, compute_view, render_text
from zbroker.services.pzq.top import queue_rows
from zbroker.services.zpipes.top import pipe_rows


def _status(pipes=None, queues=None, peers=None):
    return {"name": "b", "pid": 7, "uptime": 61.0,
            "services": {"zpipes": {"clients": 3, "connections": 3, "pipes": pipes or {}},
                         **({"pzq": queues} if queues is not None else {})},
            "cluster": {"peers": peers} if peers is not None else None}


def _pipe(written, read, readers=1, writers=1):
    return {"readers": readers, "writers": writers, "buffered": 0,
            "bytes_written": written, "bytes_read": read}


def test_rates_come_from_two_samples_and_the_busiest_come_first():
    before = Sample(10.0, _status(
        pipes={"slow": _pipe(0, 0), "fast": _pipe(1000, 1000), "replaced": _pipe(5000, 5000)},
        queues={"jobs": {"produced": 10, "delivered": 5, "consumer_acks": 5, "messages": 5},
                "idle": {"produced": 0}}))
    after = Sample(12.0, _status(
        pipes={"slow": _pipe(100, 50), "fast": _pipe(9000, 5000),
               "replaced": _pipe(400, 0),  # its ends changed: counts from 0
               "new": _pipe(2000, 0)},
        queues={"jobs": {"produced": 30, "delivered": 15, "consumer_acks": 11, "messages": 15,
                         "backlog_bytes": 150},
                "idle": {"produced": 0}},
        peers=[{"name": "far", "endpoint": "tcp://b:1", "rtt_s": 0.004, "last_heard_s": 0.3},
               {"name": "near", "endpoint": "tcp://a:1", "rtt_s": 0.0002}]))
    view = compute_view(before, after)
    assert view.interval == 2.0
    zpipes_now, zpipes_then = (s.status["services"]["zpipes"] for s in (after, before))
    pipes = pipe_rows(zpipes_now, zpipes_then, 2.0)
    assert [p["name"] for p in pipes] == ["fast", "new", "replaced", "slow"]
    fast = pipes[0]
    assert (fast["write_rate"], fast["read_rate"]) == (4000.0, 2000.0)
    assert pipes[1]["write_rate"] == 1000.0  # a new pipe counts from 0
    assert pipes[2]["write_rate"] == 200.0
    jobs, idle = queue_rows(after.status["services"]["pzq"], before.status["services"]["pzq"],
                            2.0)
    assert jobs["name"] == "jobs" and idle["name"] == "idle"
    assert (jobs["produced_rate"], jobs["delivered_rate"], jobs["acked_rate"]) == (10, 5, 3)
    assert jobs["backlog"] == 15 and jobs["backlog_bytes"] == 150
    assert [p["name"] for p in view.peers] == ["far", "near"]  # the slowest round trip first
    # each service's tables, as its plug-in makes them, in the order of the status
    assert [t.title for t in view.tables] == ["ZPIPES: 3 clients, 3 connections, 4 pipes",
                                              "pzq: 2 queues"]
    assert [row[0] for row in view.tables[0].rows] == ["fast", "new", "replaced", "slow"]


def test_the_first_sample_has_no_rates_and_text_says_so():
    view = compute_view(None, Sample(1.0, _status(pipes={"p": _pipe(10, 10)})))
    assert view.interval is None and view.tables[0].rows[0][3] == "-"
    text = render_text(view)
    assert re.search(r"^p\s+1\s+1\s+-\s+-\s+0 B$", text, re.M), text
    assert "rates over" not in text


def test_text_has_no_escape_codes_and_shows_every_section():
    view = compute_view(Sample(0.0, _status(pipes={"logs": _pipe(0, 0)},
                                            queues={"jobs": {"produced": 0}}, peers=[])),
                        Sample(1.0, _status(pipes={"logs": _pipe(3 << 20, 1 << 20)},
                                            queues={"jobs": {"produced": 50}},
                                            peers=[{"name": "b2", "endpoint": "tcp://x:1",
                                                    "rtt_s": 0.00125, "last_heard_s": 0.5}])))
    text = render_text(view)
    assert "\x1b" not in text
    assert "zbroker top: broker b (pid 7), up 1m 1s, rates over 1.0 s" in text
    assert re.search(r"^logs\s+1\s+1\s+3\.0 MiB/s\s+1\.0 MiB/s", text, re.M), text
    assert re.search(r"^jobs\s+50/s", text, re.M), text
    assert re.search(r"^b2\s+tcp://x:1\s+1\.25 ms\s+0\.5 s ago$", text, re.M), text


def test_the_view_fits_80_columns_uncut():
    """At 80 columns every header and figure was cut ("QUE…  PRODU…  DELIVE…")."""
    busy = {"produced": 12_345_678, "delivered": 12_345_000, "consumer_acks": 12_300_000,
            "messages": 1_234_567, "backlog_bytes": 987 << 20, "inflight": 32_000,
            "producers": 12, "consumers": 34}
    view = compute_view(
        Sample(0.0, _status(pipes={"logs-of-webapp-1": _pipe(0, 0)},
                            queues={"orders-eu-west-1": {"produced": 0}},
                            peers=[])),
        Sample(1.0, _status(pipes={"logs-of-webapp-1": _pipe(3 << 30, 3 << 30)},
                            queues={"orders-eu-west-1": busy},
                            peers=[{"name": "broker-b", "endpoint": "tcp://10.0.0.2:5670",
                                    "rtt_s": 0.00125, "last_heard_s": 0.5}])))
    text = render_text(view, width=80)
    assert "…" not in text, text
    assert max(map(len, text.splitlines())) <= 80, text
    for header in ("QUEUE", "PRODUCED", "DELIVERED", "ACKED", "BACKLOG", "BYTES",
                   "IN FLIGHT", "P/C", "PIPE", "READERS", "WRITERS", "BUFFERED", "PEER",
                   "ENDPOINT", "RTT", "LAST HEARD"):
        assert header in text, (header, text)
    assert re.search(r"^orders-eu-west-1\s.*\s12/34$", text, re.M), text


class Trickle:
    """A pipe kept busy: a writer thread writing 32 KiB every 20 ms, a reader thread reading."""

    def __init__(self, broker: str, name: str) -> None:
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._write, args=(broker, name)),
                        threading.Thread(target=self._read, args=(broker, name))]
        for t in self.threads:
            t.start()

    def _write(self, broker: str, name: str) -> None:
        with zpipes.open(name, "w", broker=broker, timeout=10) as w:
            while not self.stop.is_set():
                w.write(b"x" * 32768)
                time.sleep(0.02)

    def _read(self, broker: str, name: str) -> None:
        with zpipes.open(name, "r", broker=broker, timeout=10) as r:
            while r.read(65536):
                pass

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(10)


def test_once_prints_the_busiest_pipe_first(start_broker):
    b = start_broker()
    idle = zpipes.open("idle", "r", broker=b.name, timeout=10)  # a pipe with a reader only
    trickle = Trickle(b.name, "busy")
    try:
        r = run_zbroker(["top", b.name, "--once", "--interval", "0.5",
                         "--run-dir", str(b.run_dir)], cwd=b.dir)
    finally:
        trickle.close()
        idle.close()
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith(f"zbroker top: broker {b.name} ")
    busy = next(i for i, line in enumerate(lines) if line.startswith("busy "))
    assert re.match(r"busy\s+1\s+1\s+[\d.]+ (KiB|MiB)/s\s+[\d.]+ (KiB|MiB)/s", lines[busy])
    assert busy < next(i for i, line in enumerate(lines) if line.startswith("idle "))
    assert "\x1b" not in r.stdout
    gone = run_zbroker(["top", "no-such-broker", "--once", "--run-dir", str(b.dir / "x")],
                       cwd=b.dir)
    assert gone.returncode == 1 and gone.stderr.startswith("zbroker: ")
    assert "Traceback" not in gone.stderr


TMUX = shutil.which("tmux")


@pytest.mark.skipif(TMUX is None, reason="no tmux (scripts/ensure-test-deps installs it)")
def test_live_view_in_a_terminal_refreshes_and_q_quits(start_broker, tmp_path):
    b = start_broker()
    socket = f"zbtop-{uuid.uuid4().hex[:8]}"
    done = tmp_path / "exit-status"
    env = broker_env(b.dir)
    command = " ".join([
        "env", "-u", "COLUMNS", "-u", "LINES",  # the terminal's size, whatever the test had
        *(shlex.quote(f"{k}={env[k]}") for k in ("PYTHONPATH", "XDG_RUNTIME_DIR")),
        shlex.quote(sys.executable), "-m", "zbroker", "top", b.name,
        "--run-dir", shlex.quote(str(b.run_dir)),
        ";", "echo", "$?", ">", shlex.quote(str(done))])

    def tmux(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([TMUX, "-L", socket, *args], capture_output=True, text=True,
                              timeout=10, cwd=REPO_ROOT)

    def screen() -> str:
        return tmux("capture-pane", "-p", "-t", "top").stdout

    trickle = None
    try:
        started = tmux("new-session", "-d", "-s", "top", "-x", "120", "-y", "30", command)
        assert started.returncode == 0, started.stderr
        wait_for(lambda: f"broker {b.name}" in screen(), 15, "the view on the screen")
        assert re.search(r"^ZPIPES: \d+ clients, \d+ connections, 0 pipes", screen(), re.M)

        trickle = Trickle(b.name, "busy")  # shown at the next refreshes, with its rates
        wait_for(lambda: re.search(r"busy\s+1\s+1\s+[\d.]+ (KiB|MiB)/s", screen()), 15,
                 "the busy pipe and its rate")
        assert "q: quit" in screen()
        assert not done.exists()

        tmux("send-keys", "-t", "top", "q")
        wait_for(done.exists, 10, "top to quit on q")
        assert done.read_text().strip() == "0"
    finally:
        if trickle is not None:
            trickle.close()
        tmux("kill-server")


def test_top_is_a_listed_command(tmp_path):
    r = run_zbroker(["--help"], cwd=tmp_path)
    assert "zbroker top [NAME] [--once]" in r.stdout
    assert Path(REPO_ROOT / "zbroker" / "cli" / "top.py").exists()
