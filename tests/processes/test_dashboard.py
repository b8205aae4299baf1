"""config/zbroker.grafana.json: valid JSON, and every metric it queries is one a real broker
exports (a broker with ZPIPES, pzq, a cluster and syslog, scraped over HTTP)."""

from __future__ import annotations

import json
import re

from helpers import REPO_ROOT, free_port, wait_for
from metrics_helpers import full_config, scrape

DASHBOARD = REPO_ROOT / "config" / "zbroker.grafana.json"
METRIC = re.compile(r"\b((?:zbroker|process)_[a-z0-9_]+)")


def _queries(dashboard: dict) -> list[str]:
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    exprs += [v["definition"] for v in dashboard["templating"]["list"] if "definition" in v]
    return exprs


def test_the_dashboard_is_grafana_json():
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "zbroker" and dashboard["title"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for p in dashboard["panels"]:
        assert p["type"] in ("row", "timeseries", "stat", "table"), p["title"]
        assert set(p["gridPos"]) == {"h", "w", "x", "y"}
        assert p["gridPos"]["x"] + p["gridPos"]["w"] <= 24
        if p["type"] != "row":
            assert p["datasource"]["uid"] == "${datasource}"
            assert p["targets"] and all(t["refId"] for t in p["targets"])
    assert {v["name"] for v in dashboard["templating"]["list"]} == {"datasource", "instance",
                                                                   "queue"}


def test_every_metric_the_dashboard_queries_is_exported(start_broker, tmp_path):
    port = free_port()
    b = start_broker(config=full_config(tmp_path, port))
    wait_for(lambda: "metrics endpoint" in b.stderr(), 10, "the metrics endpoint")
    types, samples = scrape(port)
    exported = {name for name, _ in samples}
    for family, kind in types.items():  # also the series a family has once it has samples
        if kind == "counter":
            exported.add(family + "_total")
        elif kind == "histogram":
            exported |= {family + "_bucket", family + "_sum", family + "_count"}
        else:
            exported.add(family)
    used = {m for expr in _queries(json.loads(DASHBOARD.read_text()))
            for m in METRIC.findall(expr)}
    assert len(used) >= 30
    assert used <= exported, sorted(used - exported)
