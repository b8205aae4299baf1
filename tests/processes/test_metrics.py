"""The metrics endpoint: what a snapshot becomes (no I/O), and real brokers scraped over HTTP
with urllib, the text parsed by prometheus_client's parser."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import urllib.error
import urllib.request

import pytest
from helpers import assert_writer_lost, free_port, run_zbroker, wait_for, write_config
from metrics_helpers import full_config, parse, scrape, scrape_text, value
from prometheus_client import CollectorRegistry, generate_latest

import zpipes
from pzq.client import Consumer, Producer
from zbroker.config import ConfigError, parse_bind, parse_config
from zbroker.metrics import beyond_loopback, families
from zbroker.runtime.stats import Buckets, cumulative
from zbroker.services.zpipes.failures import (
    FAILURE_KINDS,
    Failure,
    from_peer,
    kind_of,
    peer_lost,
    writer_lost,
)
from zbroker.services.zpipes.metrics import busiest

# --- no I/O ----------------------------------------------------------------------------------


def test_buckets_count_by_upper_bound_and_cumulate():
    b = Buckets((0.1, 1.0))
    for v in (0.05, 0.1, 0.5, 7.0):
        b.observe(v)
    b.observe(0.2, n=3)
    snap = b.snapshot()
    assert snap["counts"] == [2, 4] and snap["count"] == 7
    assert snap["sum"] == pytest.approx(0.05 + 0.1 + 0.5 + 7.0 + 0.6)
    assert cumulative(snap) == [("0.1", 2), ("1.0", 6), ("+Inf", 7)]
    b.observe(0.01)
    assert snap["counts"] == [2, 4]  # a snapshot is a copy
    with pytest.raises(ValueError):
        Buckets((1.0, 0.5))


def test_failure_kinds_are_data_carried_with_the_text():
    """The kind is given where a failure is made and carried to the readers it breaks; it
    is read out of text only for what a peer broker says (its DETACH is text)."""
    lost = peer_lost("local@hosta (10.0.0.1)")
    assert (lost, kind_of(lost)) == ("peer lost: broker local@hosta (10.0.0.1)", "peer_lost")
    assert kind_of(writer_lost(lost)) == "peer_lost"  # a reader of a writer lost that way
    assert kind_of(writer_lost(Failure("expired", "other"))) == "writer_lost"
    assert writer_lost("expired") == "writer lost: expired"
    assert kind_of("a text without a kind") == "other"
    assert kind_of(Failure("x", "not a kind")) == "other"  # the label set stays bounded
    for text, kind in (("writer lost: expired", "writer_lost"), ("peer lost", "peer_lost"),
                       ("writer lost: peer lost: broker b", "peer_lost"),
                       ("broker stopping", "broker_stopping"), ("something new", "other")):
        assert kind_of(from_peer(text)) == kind, text
    assert from_peer(None) is None


def _snapshot(pipe_series: int = 0) -> dict:
    latency = Buckets()
    latency.observe(0.002, 5)
    return {
        "name": "b1", "host": "hosta", "version": "9.9", "python": "3.11.0", "started": 1000.0,
        "uptime": 12.5,
        "reloads": {"ok": 2, "refused": 1},
        "log_write_errors": 0,
        "services": {
            "zpipes": {"clients": 3, "pipes": 2, "readers": 1, "writers": 2,
                       "pipe_series": pipe_series,
                       "buffered_bytes": 10, "held_bytes": 0, "bytes_written": 700,
                       "bytes_read": 600, "clients_expired": 1, "clients_disconnected": 4,
                       "ends_failed": [("reader", "writer_lost", 2)], "connections": 3,
                       "refused": {"not allowed": 1, "too many clients": 0},
                       "pipe_bytes": [("quiet", 1, 0), ("busy", 500, 400), ("mid", 50, 0)]},
            "pzq": {"queues": {"jobs": {"produced": 7, "consumer_acks": 3, "messages": 4,
                                        "backlog_bytes": 40, "syncs": 2,
                                        "refusals": {"full": 1, "busy": 0},
                                        "ack_latency": latency.snapshot(),
                                        "sync_batches": Buckets((1, 8)).snapshot(),
                                        "batches": 2, "group.spark.lag": 12,
                                        "group.spark.committed": 3}}},
        },
        "cluster": {"peers": 1, "peer_losses": 0, "bytes_sent": 5, "bytes_received": 6,
                    "peer_list": [{"label": "b2@hostb (10.0.0.2)",
                                   "endpoint": "tcp://10.0.0.2:5670", "last_heard_s": 0.4}],
                    "rtt": Buckets().snapshot()},
        "syslog": {"sent": 9, "dropped": 1, "reconnects": 0, "queued": 0, "connected": True},
    }


def _exposition(snap: dict) -> str:
    class Static:
        def collect(self):
            return iter(families(snap))

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Static())
    return generate_latest(registry).decode()


def test_what_crossed_the_links_becomes_counters_by_direction():
    snap = _snapshot()
    snap["services"]["zpipes"]["link"] = {"data_sent": 3, "data_bytes_sent": 300,
                                          "credit_sent": 2, "data_received": 1,
                                          "data_bytes_received": 100}
    _, samples = parse(_exposition(snap))
    assert value(samples, "zbroker_zpipes_link_data_messages_total", direction="sent") == 3
    assert value(samples, "zbroker_zpipes_link_data_bytes_total", direction="received") == 100
    assert value(samples, "zbroker_zpipes_link_credit_messages_total") == 2
    _, samples = parse(_exposition(_snapshot()))  # a broker that does not count: none
    assert not any(name.startswith("zbroker_zpipes_link_") for name, _ in samples)


def test_a_snapshot_becomes_conventional_metrics():
    types, samples = parse(_exposition(_snapshot()))
    for name, kind in types.items():
        assert name.startswith("zbroker_"), name
        if kind == "counter":  # the parser names the family without _total
            assert any(s[0] == name + "_total" for s in samples), name
    assert value(samples, "zbroker_zpipes_written_bytes_total") == 700
    assert value(samples, "zbroker_config_reloads_total", result="refused") == 1
    assert value(samples, "zbroker_build_info", broker="b1", host="hosta", version="9.9",
                 python="3.11.0") == 1
    assert value(samples, "zbroker_cluster_peer_last_heard_seconds",
                 peer="b2@hostb (10.0.0.2)", endpoint="tcp://10.0.0.2:5670") == 0.4
    assert value(samples, "zbroker_zpipes_ends_failed_total", role="reader",
                 reason="writer_lost") == 2
    # every reason of each role is there from the start, and nothing else
    reasons = {dict(labels)["reason"] for name, labels in samples
               if name == "zbroker_zpipes_ends_failed_total"}
    assert reasons == set(FAILURE_KINDS)
    assert value(samples, "zbroker_zpipes_connections_refused_total", reason="not_allowed") == 1
    assert value(samples, "zbroker_pzq_produced_total", queue="jobs") == 7
    assert value(samples, "zbroker_pzq_refused_total", queue="jobs", reason="full") == 1
    assert value(samples, "zbroker_pzq_producer_ack_latency_seconds_bucket", queue="jobs",
                 le="0.0025") == 5
    assert value(samples, "zbroker_pzq_producer_ack_latency_seconds_count", queue="jobs") == 5
    assert value(samples, "zbroker_pzq_batches_total", queue="jobs") == 2
    assert value(samples, "zbroker_pzq_stream_group_lag_messages", queue="jobs",
                 group="spark") == 12
    assert value(samples, "zbroker_cluster_peers") == 1
    assert value(samples, "zbroker_syslog_records_sent_total") == 9
    assert not any(name.startswith("zbroker_zpipes_pipe_") for name, _ in samples)  # off


def test_per_pipe_series_only_for_the_busiest_pipes():
    _, samples = parse(_exposition(_snapshot(pipe_series=2)))
    pipes = {dict(labels)["pipe"] for name, labels in samples
             if name == "zbroker_zpipes_pipe_written_bytes_total"}
    assert pipes == {"busy", "mid"}
    assert value(samples, "zbroker_zpipes_pipe_read_bytes_total", pipe="busy") == 400
    assert busiest([("a", 1, 1), ("b", 1, 1), ("c", 0, 5)], 2) == [("c", 0, 5), ("a", 1, 1)]


def test_metrics_bind_is_an_address_on_loopback_by_default():
    assert parse_config(None).metrics.bind is None  # off
    assert parse_config({"metrics": {"bind": 9670}}).metrics.bind == "127.0.0.1:9670"
    assert parse_config({"metrics": {"bind": "0.0.0.0:9670"}}).metrics.bind == "0.0.0.0:9670"
    assert parse_config({"metrics": {"bind": "[::1]:9"}}).metrics.bind == "[::1]:9"
    assert parse_bind("[::1]:9") == ("::1", 9)
    assert parse_bind("0") == ("127.0.0.1", 0)  # any free port
    for bad in ("x", "host:", ":80", "1.2.3.4:99999", "a b:1", "::1:9", "-1", True):
        with pytest.raises(ConfigError, match="metrics.bind: got .* expected null"):
            parse_config({"metrics": {"bind": bad}})
    with pytest.raises(ConfigError, match="metrics.pipe_series"):
        parse_config({"metrics": {"pipe_series": -1}})


# --- real brokers ----------------------------------------------------------------------------


def test_a_broker_exports_what_traffic_did(start_broker, tmp_path):
    port = free_port()
    config = full_config(tmp_path, port)
    b = start_broker(config=config)
    wait_for(lambda: "metrics endpoint" in b.stderr(), 10, "the metrics endpoint")
    queue = config["services"]["pzq"]["queues"]["jobs"]

    data = os.urandom(300_000)
    got: list[bytes] = []

    def read() -> None:
        with zpipes.open("logs", "r", broker=b.name, timeout=10) as r:
            got.append(r.read())

    reader = threading.Thread(target=read)
    reader.start()
    with zpipes.open("logs", "w", broker=b.name, timeout=10) as w:
        w.write(data)
        # while the pipe is open, it is one of the busiest (pipe_series: 2)
        wait_for(lambda: value(scrape(port)[1], "zbroker_zpipes_pipe_written_bytes_total",
                               pipe="logs") == len(data), 10, "the pipe's own series")
        assert value(scrape(port)[1], "zbroker_zpipes_writers") == 1
    reader.join(10)
    assert got == [data]

    producer = Producer(queue["receive_endpoint"])
    for i in range(25):
        producer.send(b"job %d" % i)
    producer.flush(10)
    producer.close()
    consumer = Consumer(queue["send_endpoint"])
    for _ in range(10):
        consumer.ack(consumer.recv(10))
    consumer.close()

    def settled():
        _, s = scrape(port)
        return s if value(s, "zbroker_pzq_acked_total", queue="jobs") == 10 else None

    samples = wait_for(settled, 10, "the ACKs counted")
    assert value(samples, "zbroker_zpipes_written_bytes_total") == len(data)  # the pipe is gone
    assert value(samples, "zbroker_zpipes_read_bytes_total") == len(data)
    assert value(samples, "zbroker_zpipes_pipes") == 0
    assert value(samples, "zbroker_pzq_produced_total", queue="jobs") == 25
    assert value(samples, "zbroker_pzq_stored_total", queue="jobs") == 25
    assert value(samples, "zbroker_pzq_backlog_messages", queue="jobs") == 15
    assert value(samples, "zbroker_pzq_producer_ack_latency_seconds_count", queue="jobs") == 25
    assert value(samples, "zbroker_pzq_messages_per_fsync_sum", queue="jobs") == 25
    assert value(samples, "zbroker_pzq_fsyncs_total", queue="jobs") >= 1
    assert value(samples, "zbroker_cluster_peers") == 0
    assert value(samples, "zbroker_syslog_records_sent_total") > 0
    assert value(samples, "zbroker_uptime_seconds") > 0
    assert value(samples, "process_resident_memory_bytes") > 0


def test_failed_ends_and_lost_clients_are_counted(start_broker, tmp_path):
    port = free_port()
    b = start_broker(args=["--metrics", str(port)])  # a bare port: 127.0.0.1
    wait_for(lambda: "metrics endpoint" in b.stderr(), 10, "the metrics endpoint")
    writer = zpipes.open("cut", "w", broker=b.name, timeout=10)
    with zpipes.open("cut", "r", broker=b.name, timeout=10) as r:
        writer.write(b"some data\n")
        writer.flush()
        assert r.read(10) == b"some data\n"
        writer.abort()  # the stream is cut: the reader fails, it does not see an end
        with pytest.raises(zpipes.PipeFailed) as failed:
            r.read(10)
    assert_writer_lost(failed.value)
    wait_for(lambda: value(scrape(port)[1], "zbroker_zpipes_clients_disconnected_total") >= 1, 10,
             "the writer's connection counted as gone")
    _, samples = scrape(port)
    assert value(samples, "zbroker_zpipes_ends_failed_total", role="reader",
                 reason="writer_lost") == 1
    assert value(samples, "zbroker_zpipes_clients_disconnected_total") >= 1


def test_reload_moves_the_endpoint_or_is_refused(start_broker, tmp_path):
    first, second = free_port(), free_port()
    b = start_broker(config={"metrics": {"bind": f"127.0.0.1:{first}"}})
    wait_for(lambda: "metrics endpoint" in b.stderr(), 10, "the metrics endpoint")
    assert value(scrape(first)[1], "zbroker_config_reloads_total", result="ok") == 0

    write_config(b.config_path, {"metrics": {"bind": f"127.0.0.1:{second}"}})
    b.send_signal(signal.SIGHUP)
    wait_for(lambda: "metrics endpoint moved" in b.stderr(), 10, "the move")
    assert value(scrape(second)[1], "zbroker_config_reloads_total", result="ok") == 1

    def first_closed() -> bool:
        try:
            scrape_text(first, timeout=1)
        except (urllib.error.URLError, ConnectionError):
            return True
        return False

    wait_for(first_closed, 5, "the old address to be let go")

    # an address in use: the reload is refused whole, the endpoint stays where it is
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        write_config(b.config_path, {"metrics": {"bind": f"127.0.0.1:{busy}"},
                                     "log": {"level": "debug"}})
        r = run_zbroker(["reload", b.name, "--run-dir", str(b.run_dir)], cwd=b.dir)
        assert r.returncode == 1
        assert f"cannot serve metrics (metrics.bind) on 127.0.0.1:{busy}" in r.stderr
        assert "Traceback" not in r.stderr
    _, samples = scrape(second)
    assert value(samples, "zbroker_config_reloads_total", result="refused") == 1
    r = run_zbroker(["get", "log.level", b.name, "--run-dir", str(b.run_dir)], cwd=b.dir)
    assert r.stdout.strip() == "info"  # nothing of the refused config applied


def test_a_broker_that_cannot_bind_its_metrics_does_not_start(start_broker, tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        b = start_broker(args=["--metrics", f"127.0.0.1:{port}"], wait=False)
        assert b.wait() == 1
    err = b.stderr()
    # the setting, and who holds the port (this test's process)
    assert f"zbroker: cannot serve metrics (metrics.bind) on 127.0.0.1:{port}: Address " \
           f"already in use; held by pid {os.getpid()}: " in err, err
    assert "Traceback" not in err
    r = run_zbroker(["--metrics", "nowhere:x"], cwd=tmp_path)
    assert r.returncode == 1
    assert r.stderr.startswith("zbroker: command line: metrics.bind: got 'nowhere:x'")


def test_a_scrape_does_not_hold_the_event_loop(start_broker, tmp_path):
    """Scrapes run on their own thread; pipes keep working while many come in."""
    port = free_port()
    b = start_broker(args=["--metrics", str(port)])
    wait_for(lambda: "metrics endpoint" in b.stderr(), 10, "the metrics endpoint")
    stop = threading.Event()
    scrapes = []

    def scraper() -> None:
        while not stop.is_set():
            scrapes.append(scrape_text(port))

    t = threading.Thread(target=scraper)
    t.start()
    try:
        for i in range(3):
            got: list[bytes] = []

            def read(name: str, into: list[bytes]) -> None:
                with zpipes.open(name, "r", broker=b.name, timeout=10) as r:
                    into.append(r.read())

            reader = threading.Thread(target=read, args=(f"p{i}", got))
            reader.start()
            with zpipes.open(f"p{i}", "w", broker=b.name, timeout=10) as w:
                w.write(b"x" * 100_000)
            reader.join(10)
            assert got == [b"x" * 100_000]
    finally:
        stop.set()
        t.join(10)
    assert len(scrapes) >= 1
    _, samples = parse(scrapes[-1])
    assert ("zbroker_zpipes_written_bytes_total", frozenset()) in samples


def test_metrics_are_off_by_default(broker):
    wait_for(lambda: "broker started" in broker.stderr(), 10, "the start")
    assert "metrics endpoint" not in broker.stderr()
    r = run_zbroker(["status", broker.name, "--run-dir", str(broker.run_dir)], cwd=broker.dir)
    assert "  metrics: off (metrics.bind)" in r.stdout.splitlines()


def test_two_clustered_brokers_export_peers_round_trips_and_traffic(start_broker, tmp_path):
    ports = [free_port(), free_port()]
    metrics = [free_port(), free_port()]
    brokers = [start_broker(config={
        "metrics": {"bind": f"127.0.0.1:{metrics[i]}"},
        "cluster": {"enabled": True, "discovery": False, "insecure": True,
                    "peer_timeout": 1.5, "bind": f"tcp://127.0.0.1:{ports[i]}",
                    "peers": [f"tcp://127.0.0.1:{ports[1 - i]}"]}}) for i in (0, 1)]

    def joined_with_round_trips():
        _, s = scrape(metrics[0])
        return s if value(s, "zbroker_cluster_peers") == 1 and value(
            s, "zbroker_cluster_heartbeat_rtt_seconds_count") > 0 else None

    samples = wait_for(joined_with_round_trips, 15, "a peer and a heartbeat round trip")
    assert value(samples, "zbroker_cluster_sent_bytes_total") > 0
    assert value(samples, "zbroker_cluster_received_bytes_total") > 0
    assert value(samples, "zbroker_cluster_peer_losses_total") == 0
    # the peer as people name it: its broker, its host, its address
    heard = [dict(labels) for name, labels in samples
             if name == "zbroker_cluster_peer_last_heard_seconds"]
    assert heard == [{"peer": f"{brokers[1].name}@{socket.gethostname()} (127.0.0.1)",
                      "endpoint": f"tcp://127.0.0.1:{ports[1]}"}], heard
    # the status shows each peer's last round trip (zbroker top shows it)
    r = run_zbroker(["status", brokers[0].name, "--json", "--run-dir", str(brokers[0].run_dir)],
                    cwd=brokers[0].dir)
    peers = json.loads(r.stdout)["cluster"]["peers"]
    assert len(peers) == 1 and 0 < peers[0]["rtt_s"] < 1.5

    brokers[1].kill()
    wait_for(lambda: value(scrape(metrics[0])[1], "zbroker_cluster_peer_losses_total") == 1,
             10, "the loss counted")
    assert value(scrape(metrics[0])[1], "zbroker_cluster_peers") == 0


def test_beyond_loopback_is_told_apart():
    assert not beyond_loopback("127.0.0.1:9670") and not beyond_loopback("[::1]:1")
    assert not beyond_loopback("localhost:9670") and not beyond_loopback("127.5.0.1:2")
    assert beyond_loopback("0.0.0.0:9670") and beyond_loopback("[::]:1")
    assert beyond_loopback("10.1.2.3:9670") and beyond_loopback("metrics.example:80")


def test_port_0_takes_a_free_port_that_status_shows(start_broker):
    b = start_broker(args=["--metrics", "127.0.0.1:0"])
    wait_for(lambda: "metrics endpoint" in b.stderr(), 10, "the metrics endpoint")
    assert "beyond loopback" not in b.stderr()
    r = run_zbroker(["status", b.name, "--run-dir", str(b.run_dir)], cwd=b.dir)
    url = next(line.split(": ", 1)[1] for line in r.stdout.splitlines()
               if line.startswith("  metrics: "))
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    assert url == f"http://127.0.0.1:{port}/metrics" and port > 0
    assert value(scrape(port)[1], "zbroker_zpipes_pipes") == 0
