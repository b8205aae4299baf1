"""A real Prometheus server scrapes a real broker every second; what the test did through a pipe
and a queue must come back from Prometheus' HTTP query API.

Prometheus is Debian's package (scripts/ensure-test-deps installs it); without it the test is
skipped, saying why. It listens on a free loopback port and keeps its data in the test's
temporary directory.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from helpers import REPO_ROOT, free_port, through_a_pipe, wait_for
from metrics_helpers import full_config

from pzq.client import Producer

PROMETHEUS = shutil.which("prometheus")

pytestmark = pytest.mark.skipif(
    PROMETHEUS is None,
    reason="no prometheus binary (scripts/ensure-test-deps installs Debian's prometheus)")


class Prometheus:
    def __init__(self, tmp: Path, target_port: int) -> None:
        self.port = free_port()
        config = tmp / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n"
            "  evaluation_interval: 1s\n"
            "scrape_configs:\n  - job_name: zbroker\n    static_configs:\n"
            f"      - targets: ['127.0.0.1:{target_port}']\n")
        self.log_path = tmp / "prometheus.log"
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=1h"],
            stdin=subprocess.DEVNULL, stdout=self._log, stderr=self._log, cwd=tmp)

    def query(self, promql: str) -> list[dict]:
        url = (f"http://127.0.0.1:{self.port}/api/v1/query?"
               + urllib.parse.urlencode({"query": promql}))
        with urllib.request.urlopen(url, timeout=5) as r:
            body = json.load(r)
        assert body["status"] == "success", body
        return body["data"]["result"]

    def scalar(self, promql: str) -> float | None:
        """The value of a query with one series, or None (no series yet, not up)."""
        if self.proc.poll() is not None:
            raise AssertionError(f"prometheus exited:\n{self.log_path.read_text()[-3000:]}")
        try:
            result = self.query(promql)
        except OSError:
            return None  # not listening yet
        return float(result[0]["value"][1]) if len(result) == 1 else None

    def wait_equal(self, promql: str, expected: float, timeout: float = 10.0) -> None:
        last: list[float | None] = [None]

        def check() -> bool:
            last[0] = self.scalar(promql)
            return last[0] == expected

        try:
            wait_for(check, timeout, f"{promql} == {expected}", interval=0.25)
        except AssertionError:
            raise AssertionError(f"{promql}: last {last[0]}, expected {expected}") from None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._log.close()


@pytest.fixture
def prometheus(tmp_path):
    started: list[Prometheus] = []

    def start(target_port: int) -> Prometheus:
        p = Prometheus(tmp_path, target_port)
        started.append(p)
        return p

    yield start
    for p in started:
        p.stop()


def test_prometheus_scrapes_what_a_pipe_and_a_queue_did(start_broker, prometheus, tmp_path):
    metrics_port = free_port()
    config = full_config(tmp_path, metrics_port)
    b = start_broker(config=config)
    prom = prometheus(metrics_port)
    prom.wait_equal('up{job="zbroker"}', 1, timeout=15)
    prom.wait_equal("zbroker_zpipes_written_bytes_total", 0)

    data = b"x" * 123_457
    assert through_a_pipe(b.name, "metered", data) == data

    producer = Producer(config["services"]["pzq"]["queues"]["jobs"]["receive_endpoint"])
    for i in range(42):
        producer.send(b"job %d" % i)
    producer.flush(10)
    producer.close()

    prom.wait_equal("zbroker_zpipes_written_bytes_total", len(data))
    prom.wait_equal("zbroker_zpipes_read_bytes_total", len(data))
    prom.wait_equal('zbroker_pzq_produced_total{queue="jobs"}', 42)
    prom.wait_equal('zbroker_pzq_backlog_messages{queue="jobs"}', 42)
    prom.wait_equal('zbroker_pzq_producer_ack_latency_seconds_count{queue="jobs"}', 42)
    # a histogram Prometheus can take quantiles of
    quantile = prom.scalar('histogram_quantile(0.99, zbroker_pzq_producer_ack_latency_seconds'
                           '_bucket{queue="jobs"})')
    assert quantile is not None and 0 < quantile <= 10
    build = prom.query("zbroker_build_info")
    assert build[0]["metric"]["broker"] == b.name

    # every query of the Grafana dashboard is PromQL that Prometheus takes, and the panels
    # of what the test did have data
    dashboard = json.loads((REPO_ROOT / "config" / "zbroker.grafana.json").read_text())
    answered = {}
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"].replace("$instance", ".*").replace("$queue", ".*")
            answered[expr] = prom.query(expr)  # asserts "success"
    assert any(answered[e] for e in answered if "zbroker_zpipes_written_bytes_total" in e)
    assert any(answered[e] for e in answered if "producer_ack_latency" in e)
