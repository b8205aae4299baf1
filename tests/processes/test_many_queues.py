"""Thousands of queues on few threads: a broker with 2 000 push queues. Reported: it started in
25 s and idled at 6.2 GB, 2 004 threads and 10 023 descriptors (a writer thread and a 1 MiB
read buffer for each queue's endpoints). Its start time is the bench's
(bench/bench_queue_cost.py); here, what it holds once up, and that its queues work."""

from __future__ import annotations

import json
import os

import pytest
from helpers import logged_broker, rss_bytes, run_zbroker, unique_name, wait_for, write_config

from pzq.client import Consumer, Producer

QUEUES = 2000


@pytest.mark.slow
def test_two_thousand_queues_hold_few_threads_and_little_memory(tmp_path, ctx):
    name = unique_name("many")
    queues = {f"q{i}": {"receive_endpoint": f"ipc://@/{name}/{i}/in",
                        "send_endpoint": f"ipc://@/{name}/{i}/out",
                        "data_dir": str(tmp_path / "data" / f"q{i}")} for i in range(QUEUES)}
    cfg = write_config(tmp_path / "zbroker.cfg", {
        "clients": {"max_clients": 1000},
        "services": {"zpipes": {"enabled": False},
                     "pzq": {"enabled": True, "queues": queues}}})
    broker, log_path = logged_broker(tmp_path, name, cfg)
    try:
        wait_for(lambda: "broker started" in log_path.read_text() or broker.poll() is not None,
                 120, "2 000 queues to start")
        assert broker.poll() is None, log_path.read_text()[-3000:]
        threads = int(next(line.split()[1] for line in
                           open(f"/proc/{broker.pid}/status") if line.startswith("Threads:")))
        assert threads < 32, threads
        assert rss_bytes(broker.pid) < 500 << 20, rss_bytes(broker.pid) >> 20
        fds = len(os.listdir(f"/proc/{broker.pid}/fd"))
        assert fds <= 5 * QUEUES + 200, fds
        r = run_zbroker(["status", name, "--json"], cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        assert len(json.loads(r.stdout)["services"]["pzq"]) == QUEUES
        # the first and the last queue take, store and deliver
        for i in (0, QUEUES - 1):
            with Producer(f"ipc://@/{name}/{i}/in", context=ctx) as p:
                p.send(b"to q%d" % i, msg_id=b"m%d" % i)
                p.flush(30)
            c = Consumer(f"ipc://@/{name}/{i}/out", context=ctx)
            try:
                m = c.recv(10)
                assert m is not None and m.body == b"to q%d" % i
                c.ack(m)
            finally:
                c.close()
    finally:
        broker.kill()
        broker.wait()
