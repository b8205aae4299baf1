"""Scraping a broker's metrics endpoint in tests, and a broker config that has everything
metrics can show (ZPIPES, a pzq queue, a one-broker cluster, syslog), all on loopback."""

from __future__ import annotations

import urllib.request
from pathlib import Path
from typing import Any

from helpers import free_port
from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape_text(port: int, timeout: float = 5.0) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout) as r:
        assert r.status == 200
        return r.read().decode()


def parse(text: str) -> tuple[dict[str, str], Samples]:
    """({family name: type}, {(sample name, labels): value})."""
    types: dict[str, str] = {}
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        types[family.name] = family.type
        for s in family.samples:
            samples[(s.name, frozenset(s.labels.items()))] = s.value
    return types, samples


def scrape(port: int) -> tuple[dict[str, str], Samples]:
    return parse(scrape_text(port))


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


def full_config(tmp: Path, metrics_port: int) -> dict[str, Any]:
    """ZPIPES, one pzq queue "jobs", a cluster of one (static peers only, nothing announced),
    syslog over UDP to a loopback port nobody listens on; metrics on ``metrics_port``."""
    return {
        "metrics": {"bind": f"127.0.0.1:{metrics_port}"},
        "log": {"syslog": {"target": f"udp://127.0.0.1:{free_port()}"}},
        "cluster": {"enabled": True, "discovery": False, "insecure": True,
                    "bind": f"tcp://127.0.0.1:{free_port()}"},
        "services": {"zpipes": {"pipe_series": 2}, "pzq": {"enabled": True, "queues": {"jobs": {
            "receive_endpoint": f"tcp://127.0.0.1:{free_port()}",
            "send_endpoint": f"tcp://127.0.0.1:{free_port()}",
            "data_dir": str(tmp / "jobs")}}}},
    }
