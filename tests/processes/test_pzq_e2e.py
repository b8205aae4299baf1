"""pzq end to end: a real ``pzq`` process (and a broker hosting the pzq service), real
sockets on 127.0.0.1, a real disk. One test per defect of the original where it applies."""

from __future__ import annotations

import resource
import signal
import subprocess
import sys
import time

import pytest
import zmq
from helpers import broker_env, endpoint_accepts, wait_for, wait_steady
from pzq_helpers import (
    RawProducer,
    cpu_seconds,
    dealer,
    free_port,
    nothing,
    preset_node,
    recv,
    spawn_pzq,
    wait_counter,
)

from pzq import wire
from pzq.client import Consumer, Producer, monitor
from zbroker.config import default_config
from zbroker.services.pzq.commands.standalone import parser, settings_from_args
from zbroker.services.pzq.service import default_monitor_endpoint

FAST = ("--ack-timeout", "400000", "--reaper-frequency", "50000")


def test_round_trip_with_the_original_frames(start_pzq, ctx):
    q = start_pzq(*FAST)
    prod = dealer(ctx, q.receive)
    cons = dealer(ctx, q.send)  # says nothing first: pzq pushes to it
    prod.send_multipart([b"id-1", b"X-HEADER", b"", b"part1", b"part2"])
    assert recv(prod) == [b"id-1", b"1", b""]
    key, sent, timeout, empty, *body = recv(cons)
    assert empty == b"" and body == [b"part1", b"part2"]
    ts, _, uid = key.decode().partition("|")
    assert abs(int(ts) - time.time() * 1e6) < 60e6 and len(uid) == 36 and uid == uid.lower()
    assert abs(int(sent) - time.time() * 1e6) < 60e6 and timeout == b"400000"
    acked_at = time.time()
    cons.send_multipart([key, b"1"])
    c = wait_counter(q, "messages", lambda n: n == 0)
    assert c["consumer_acks"] == 1 and c["messages_inflight"] == 0
    while not nothing(cons, 0.6):  # ACKed: never sent again (a copy sent before the ACK
        again = recv(cons)  # came, its 0.4 s past on a loaded machine, may be on its way)
        assert again[0] == key and int(again[1]) < acked_at * 1e6, again


def test_a_router_consumer_sees_a_peer_id_and_acks_through_it(start_pzq, ctx):
    q = start_pzq(*FAST)
    prod = dealer(ctx, q.receive)
    cons = dealer(ctx, q.send, zmq.ROUTER)
    prod.send_multipart([b"a", b"", b"hello"])
    peer, key, _, _, empty, body = recv(cons)
    assert empty == b"" and body == b"hello"
    cons.send_multipart([peer, key, b"1"])
    wait_counter(q, "consumer_acks", lambda n: n == 1)
    assert q.counters()["messages"] == 0


def test_malformed_input_gets_a_reason_and_the_queue_goes_on(start_pzq, ctx):
    q = start_pzq(*FAST, "--max-message-size", "1000")
    prod = dealer(ctx, q.receive)
    prod.send_multipart([b"no-delimiter", b"x"])
    assert recv(prod) == [b"no-delimiter", b"0", b"", wire.MALFORMED.encode()]
    prod.send_multipart([b"empty", b""])
    assert recv(prod) == [b"empty", b"0", b"", wire.EMPTY.encode()]
    prod.send_multipart([b"big", b"", b"x" * 2000])
    big = recv(prod)
    assert big[:3] == [b"big", b"0", b""] and b"too large" in big[3]
    prod.send(b"lonely-id")
    assert recv(prod) == [b"lonely-id", b"0", b"", wire.MALFORMED.encode()]
    cons = dealer(ctx, q.send)
    cons.send_multipart([b"no-such-key", b"1"])
    cons.send_multipart([b"bad-status", b"maybe"])
    cons.send(b"lonely")
    prod.send_multipart([b"good", b"", b"ok"])
    assert recv(prod) == [b"good", b"1", b""]
    assert recv(cons)[4] == b"ok"
    c = q.counters()
    assert c["malformed"] >= 5 and c["unknown_acks"] == 1 and q.alive()


def test_monitor_counters(start_pzq, ctx):
    q = start_pzq()
    req = dealer(ctx, q.monitor, zmq.REQ)
    req.send(b"MONITOR")
    text = recv(req)[-1].decode()
    for name in ("messages", "messages_inflight", "db_size", "inflight_db_size", "syncs",
                 "expired_messages"):
        assert f"\n{name}: " in "\n" + text


def test_defect1_producer_ack_only_after_fsync(start_pzq):
    """Every ACKed message was fsynced: SIGKILL right after the ACKs loses none."""
    q = start_pzq(*FAST)
    with Producer(q.receive, window=16) as p:
        ids = [p.send(b"m%d" % i) for i in range(200)]
        p.flush(10)
    syncs = q.counters()["syncs"]
    assert 1 <= syncs <= 200
    q.kill()
    q = q.restart()
    with Consumer(q.send) as c:
        got = set()
        while len(got) < 200 and (m := c.recv(5)) is not None:
            got.add(m.body)
            c.ack(m)
    assert got == {b"m%d" % i for i in range(200)} and len(ids) == 200


def test_a_burst_split_by_sync_max_bytes_is_acked_only_once_synced(start_pzq):
    """64 KiB messages with a 128 KiB cap: many small fdatasyncs, every ACKed message on disk
    (SIGKILL right after the ACKs loses none)."""
    q = start_pzq(*FAST, "--sync-max-bytes", "128KiB", "--sync-window", "50000")
    bodies = [bytes([i % 251]) * 65536 for i in range(40)]
    with Producer(q.receive, window=40) as p:
        for body in bodies:
            p.send(body)
        p.flush(10)
    syncs = q.counters()["syncs"]
    assert syncs >= 40 * 65536 // (128 << 10)  # a cap of 128 KiB: at most two per fdatasync
    q.kill()
    q = q.restart()
    with Consumer(q.send) as c:
        got = []
        while len(got) < 40 and (m := c.recv(5)) is not None:
            got.append(m.body)
            c.ack(m)
    assert sorted(got) == sorted(bodies)


def test_a_byte_window_bounds_what_a_producer_has_in_flight(start_pzq):
    q = start_pzq(*FAST)
    seen = []
    with Producer(q.receive, window=64, max_inflight_bytes=100_000) as p:
        for i in range(30):
            p.send(b"%02d" % i + b"x" * 29_998)
            seen.append((len(p.outstanding), p.inflight_bytes))
        p.send(b"big" * 50_000)  # larger than the byte window: it goes alone
        seen.append((len(p.outstanding), p.inflight_bytes))
        p.flush(10)
        assert p.inflight_bytes == 0 and p.acked == 31
    assert all(n <= 3 and b <= 100_000 for n, b in seen[:-1]), seen
    assert seen[-1] == (1, 150_000)
    with pytest.raises(ValueError):
        Producer(q.receive, max_inflight_bytes=0)


def test_defect1_hard_sync_syncs_each_message(start_pzq):
    q = start_pzq(*FAST, "--hard-sync")
    with Producer(q.receive, window=8) as p:
        for i in range(50):
            p.send(b"%d" % i)
        p.flush(10)
    assert q.counters()["syncs"] >= 50


def test_defect2_no_producer_ack_is_dropped_with_many_outstanding(start_pzq, ctx):
    q = start_pzq(*FAST)
    prod = dealer(ctx, q.receive)
    n = 10_000
    for i in range(n):
        prod.send_multipart([b"%d" % i, b"", b"x" * 100])
    acks = set()
    while len(acks) < n:
        frames = recv(prod, 10)
        assert frames[1] == b"1"
        acks.add(frames[0])
    assert acks == {b"%d" % i for i in range(n)}
    assert nothing(prod, 0.2)  # and none twice


def test_defect3_idle_queue_uses_no_cpu(start_pzq):
    q = start_pzq(*FAST)
    with Producer(q.receive) as p, Consumer(q.send) as c:
        p.send(b"warm up")
        p.flush(5)
        c.ack(c.recv(5))
        wait_counter(q, "messages", lambda n: n == 0)
        # the queue has gone quiet (its CPU time holds still), then a window of 2 s
        wait_steady(lambda: round(cpu_seconds(q.pid) * 1000), 10, "the queue's CPU time",
                    tolerance=10)
        before = cpu_seconds(q.pid)
        time.sleep(2.0)
        used = cpu_seconds(q.pid) - before
    assert used < 0.05, f"idle pzq used {used:.3f}s CPU in 2s"


def test_defect4_backlog_drains_without_duplicates(start_pzq):
    # a short ACK timeout: the original's deep buffers pushed latency past it (mass resends)
    q = start_pzq("--ack-timeout", "1000000", "--reaper-frequency", "100000")
    n = 100_000  # the figure
    with Producer(q.receive, window=256) as p:
        for i in range(n):
            p.send(b"%d" % i)
        p.flush(60)
    seen: dict[bytes, int] = {}
    c1, c2 = Consumer(q.send), Consumer(q.send)
    try:
        deadline = time.monotonic() + 90
        while len(seen) < n and time.monotonic() < deadline:
            for c in (c1, c2):
                for _ in range(200):
                    m = c.recv_nowait()
                    if m is None:
                        break
                    seen[m.body] = seen.get(m.body, 0) + 1
                    c.ack(m)
            c1.sock.poll(10)
    finally:
        c1.close()
        c2.close()
    assert len(seen) == n
    assert max(seen.values()) == 1, "duplicates delivered"
    c = q.counters()
    assert c["redelivered"] == 0 and c["expired_messages"] == 0


def test_defect5_consumer_acks_survive_a_crash(start_pzq):
    q = start_pzq(*FAST)
    n = 2000
    with Producer(q.receive, window=64) as p:
        for i in range(n):
            p.send(b"%d" % i)
        p.flush(20)
    acked = set()
    with Consumer(q.send) as c:
        while len(acked) < n // 2:
            m = c.recv(5)
            assert m is not None
            c.ack(m)
            acked.add(m.body)
        wait_counter(q, "consumer_acks", lambda k: k >= n // 2)
        # the ACK records are written: the store's writer goes quiet (within a sync window)
        wait_steady(lambda: q.counters()["records_written"], 10, "the records written",
                    interval=0.1)
    q.kill()
    q = q.restart()
    assert q.counters()["messages"] == n - n // 2
    got = set()
    with Consumer(q.send) as c:
        while (m := c.recv(1.5)) is not None:
            got.add(m.body)
            c.ack(m)
    assert not (got & acked), f"{len(got & acked)} ACKed messages came back"
    assert len(got) == n - n // 2


def test_defect6_a_late_ack_is_honoured(start_pzq):
    q = start_pzq("--ack-timeout", "300000", "--reaper-frequency", "20000")
    with Producer(q.receive) as p, Consumer(q.send) as c:
        p.send(b"late")
        p.flush(5)
        first = c.recv(5)
        again = c.recv(3)  # not ACKed in time: delivered again, same key
        assert again is not None and again.key == first.key and again.sent_us > first.sent_us
        c.ack(first)  # the late ACK of the first delivery
        wait_counter(q, "messages", lambda n: n == 0)
        assert c.recv(0.8) is None  # not sent a third time
        assert q.counters()["expired_messages"] == 1


def test_nack_redelivers_at_once(start_pzq):
    q = start_pzq("--ack-timeout", "30000000")
    with Producer(q.receive) as p, Consumer(q.send) as c:
        p.send(b"retry me")
        p.flush(5)
        m = c.recv(5)
        t0 = time.monotonic()
        c.nack(m)
        m2 = c.recv(5)
        assert m2.key == m.key and time.monotonic() - t0 < 1.0
        c.ack(m2)


def test_defect7_replication_acks_the_producer(start_pzq, ctx, tmp_path):
    """Copies confirmed: "1"; the holder keeps them until the consumer ACK at the origin."""
    node_a = preset_node(tmp_path / "a")
    b = start_pzq(*FAST, "--replica-sources", node_a)
    a = start_pzq(*FAST, "--replicas", "1", "--nodes", b.receive,
                  "--timeout-replication", "2000000", database=tmp_path / "a")
    prod = dealer(ctx, a.receive)
    prod.send_multipart([b"r1", b"", b"copied"])
    assert recv(prod) == [b"r1", b"1", b""]
    assert b.counters()["replicas_held"] == 1 and b.counters()["messages"] == 0
    assert a.counters()["replicated"] == 1
    with Consumer(a.send) as c:
        c.ack(c.recv(5))
    wait_counter(b, "replicas_held", lambda n: n == 0)


def test_replica_frames_without_a_delimiter_are_refused_not_fatal(start_pzq, ctx):
    node = b"a" * 32
    q = start_pzq(*FAST, "--replica-sources", node.decode())
    s = dealer(ctx, q.receive)
    s.send_multipart([b"k1", b"REPLICA:" + node, b"x", b"y"])  # no "" before the body
    assert recv(s)[:2] == [b"k1", b"0"]
    s.send_multipart([b"k2", b"REPLICA:" + node, b"h2", b"", b"body"])  # extra header: fine
    assert recv(s)[:2] == [b"k2", b"1"]
    assert q.counters()["replicas_held"] == 1
    s.send_multipart([b"m", b"", b"still serving"])
    assert recv(s) == [b"m", b"1", b""]


def test_defect7_replication_failed_when_the_peer_is_down(start_pzq, ctx):
    b = start_pzq(*FAST)
    a = start_pzq(*FAST, "--replicas", "1", "--nodes", b.receive,
                  "--timeout-replication", "200000")
    b.kill()
    prod = dealer(ctx, a.receive)
    t0 = time.monotonic()
    prod.send_multipart([b"r2", b"", b"lonely"])
    assert recv(prod) == [b"r2", b"1", b"", wire.REPLICATION_FAILED.encode()]
    assert 0.15 < time.monotonic() - t0 < 3
    assert a.counters()["replication_failed"] == 1


def test_replica_holder_takes_over_when_the_origin_is_lost(start_pzq, tmp_path):
    b = start_pzq(*FAST, "--timeout-nodes", "1000000",
                  "--replica-sources", preset_node(tmp_path / "a"))
    a = start_pzq(*FAST, "--replicas", "1", "--nodes", b.receive, "--timeout-nodes", "1000000",
                  database=tmp_path / "a")
    with Producer(a.receive, window=16) as p:
        for i in range(50):
            p.send(b"%d" % i)
        p.flush(10)
        assert p.replication_failed == 0
    assert b.counters()["replicas_held"] == 50
    a.kill()  # the owner is lost: after node_timeout its copies are delivered by b
    got = set()
    with Consumer(b.send) as c:
        deadline = time.monotonic() + 10
        while len(got) < 50 and time.monotonic() < deadline:
            m = c.recv(0.5)
            if m is not None:
                got.add(m.body)
                c.ack(m)
    assert got == {b"%d" % i for i in range(50)}
    wait_counter(b, "replicas_held", lambda n: n == 0)
    assert b.counters()["replicas_taken_over"] == 50


def test_replicas_need_nodes(tmp_path):
    q = spawn_pzq(tmp_path / "db", "--replicas", "1")
    assert q.proc.wait(10) == 2
    assert "needs at least as many --nodes" in q.log()


def test_defect8_a_retried_id_is_delivered_once(start_pzq, ctx):
    q = start_pzq(*FAST)
    prod = dealer(ctx, q.receive)
    prod.send_multipart([b"same", b"", b"one"])
    prod.send_multipart([b"same", b"", b"one"])
    assert recv(prod) == recv(prod) == [b"same", b"1", b""]
    prod2 = dealer(ctx, q.receive)  # a reconnected producer retries too
    prod2.send_multipart([b"same", b"", b"one"])
    assert recv(prod2) == [b"same", b"1", b""]
    cons = dealer(ctx, q.send)
    delivered = recv(cons)
    assert delivered[4] == b"one"
    cons.send_multipart([delivered[0], b"1"])
    assert nothing(cons, 0.8)  # stored and delivered once
    c = q.counters()
    assert c["duplicates"] == 2 and c["stored"] == 1 and c["delivered"] == 1


def test_defect9_loopback_by_default():
    args = parser().parse_args([])
    s = settings_from_args(args)
    assert s.receive_endpoint.startswith("tcp://127.0.0.1:")
    assert s.send_endpoint.startswith("tcp://127.0.0.1:")
    d = default_config().services.pzq.defaults
    assert d.receive_endpoint == "tcp://127.0.0.1:11131"
    assert d.send_endpoint == "tcp://127.0.0.1:11132"


def test_write_avoidance_a_fast_consumer_cuts_disk_writes(start_pzq):
    """With a long sync window, messages ACKed by a waiting consumer are never written."""
    q = start_pzq(*FAST, "--sync-window", "200000")
    with Producer(q.receive, window=64) as p, Consumer(q.send) as c:
        for _ in range(64):
            p.send(b"x" * 1000)
        for _ in range(64):
            c.ack(c.recv(5))
        p.flush(5)
    cnt = q.counters()
    assert cnt["avoided_messages"] > 32, cnt
    assert cnt["bytes_written"] < 32 * 1000 < cnt["avoided_bytes"]


def test_disk_full_gives_0_and_the_queue_goes_on(tmp_path):
    limit = 300_000

    def small_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    q = spawn_pzq(tmp_path / "db", *FAST, preexec=small_files).wait_up()
    try:
        results: dict[bytes, tuple[bool, str]] = {}
        with Producer(q.receive, window=1,
                      on_ack=lambda i, ok, text: results.__setitem__(i, (ok, text))) as p:
            for i in range(8):
                p.send(bytes([65 + i]) * 100_000, msg_id=b"%d" % i)
                p.poll(5)
        failed = [t for ok, t in results.values() if not ok]
        assert failed and "store failed" in failed[0], results
        assert q.alive()
        good = {i for i, (ok, _) in results.items() if ok}
        with Consumer(q.send) as c:
            got = set()
            while (m := c.recv(1.0)) is not None:
                got.add(b"%d" % (m.body[0] - 65))
                c.ack(m)
        assert got == good
    finally:
        q.kill()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_cleanly_and_keeps_the_messages(start_pzq, sig):
    q = start_pzq(*FAST)
    with Producer(q.receive) as p:
        for i in range(10):
            p.send(b"%d" % i)
        p.flush(5)
    assert q.stop(sig) == 0
    assert "pzq queue stopped" in q.log()
    q = q.restart()
    assert q.counters()["messages"] == 10


# --- the broker hosting pzq queues ------------------------------------------------------------


def pzq_config(tmp_path, **queues):
    return {"services": {"pzq": {
        "enabled": True,
        "defaults": {"ack_timeout": 0.4, "reaper_frequency": 0.05},
        "queues": {name: {"receive_endpoint": f"tcp://127.0.0.1:{free_port()}",
                          "send_endpoint": f"tcp://127.0.0.1:{free_port()}",
                          "data_dir": str(tmp_path / f"data-{name}"), **kw}
                   for name, kw in queues.items()},
    }}}


def test_broker_hosts_two_queues(start_broker, tmp_path):
    cfg = pzq_config(tmp_path, orders={}, audit={"sync": "none"})
    b = start_broker(config=cfg)
    qs = cfg["services"]["pzq"]["queues"]
    for q in qs.values():
        wait_for(lambda q=q: endpoint_accepts(q["receive_endpoint"]), 10, "pzq queue")
    for name, q in qs.items():
        with Producer(q["receive_endpoint"]) as p, Consumer(q["send_endpoint"]) as c:
            p.send(name.encode())
            p.flush(5)
            m = c.recv(5)
            assert m.body == name.encode()
            c.ack(m)
        mon = default_monitor_endpoint(b.run_dir / "pzq", b.name, name)
        assert wait_for(lambda mon=mon: monitor(mon)["consumer_acks"] == 1, 5, "ack")
    # idle broker with two queues: ~0 % CPU (over a window of 2 s)
    before = cpu_seconds(b.pid)
    time.sleep(2.0)
    assert cpu_seconds(b.pid) - before < 0.06
    assert b.stop() == 0


def test_broker_queue_survives_a_restart(start_broker, tmp_path):
    cfg = pzq_config(tmp_path, jobs={})
    q = cfg["services"]["pzq"]["queues"]["jobs"]
    b = start_broker(config=cfg)
    wait_for(lambda: endpoint_accepts(q["receive_endpoint"]), 10, "pzq queue")
    with Producer(q["receive_endpoint"]) as p:
        for i in range(100):
            p.send(b"%d" % i)
        p.flush(5)
    b.kill()  # SIGKILL: nothing is flushed on the way out
    b2 = start_broker(name=b.name, config=cfg)
    wait_for(lambda: endpoint_accepts(q["receive_endpoint"]), 10, "pzq queue")
    got = set()
    with Consumer(q["send_endpoint"]) as c:
        while len(got) < 100 and (m := c.recv(5)) is not None:
            got.add(m.body)
            c.ack(m)
    assert got == {b"%d" % i for i in range(100)}
    assert b2.stop() == 0


def test_broker_refuses_replicas_without_peers_and_clashing_queues(start_broker, tmp_path):
    cfg = pzq_config(tmp_path, a={"replicas": 1})
    b = start_broker(config=cfg, wait=False)
    assert b.wait() != 0 and "needs a cluster (cluster.enabled: true) or static peers" \
        in b.stderr()
    cfg = pzq_config(tmp_path, a={"replicas": 2, "peers": ["tcp://127.0.0.1:1"]})
    cfg["cluster"] = {"enabled": True, "discovery": False, "bind": "tcp://127.0.0.1:*",
                      "insecure": True}
    b = start_broker(config=cfg, wait=False)
    assert b.wait() != 0 and "needs at least as many peers (has 1)" in b.stderr()
    cfg = pzq_config(tmp_path, a={}, b={})
    cfg["services"]["pzq"]["queues"]["b"]["send_endpoint"] = \
        cfg["services"]["pzq"]["queues"]["a"]["send_endpoint"]
    b = start_broker(config=cfg, wait=False)
    assert b.wait() != 0 and "both use" in b.stderr()


def test_shell_put_and_get(start_broker, tmp_path):
    cfg = pzq_config(tmp_path, jobs={})
    q = cfg["services"]["pzq"]["queues"]["jobs"]
    b = start_broker(config=cfg)
    wait_for(lambda: endpoint_accepts(q["receive_endpoint"]), 10, "pzq queue")
    env = broker_env(b.dir)

    def zbroker(*args, stdin=b""):
        return subprocess.run([sys.executable, "-m", "zbroker", "queue", *args, "--config",
                               str(b.config_path)], input=stdin, capture_output=True,
                              env=env, timeout=30)

    r = zbroker("put", "jobs", stdin=b"first\nsecond\nthird\n")
    assert r.returncode == 0, r.stderr
    r = zbroker("get", "jobs", "--count", "2", "--timeout", "5")
    assert r.returncode == 0 and r.stdout == b"first\nsecond\n", r
    r = zbroker("get", "jobs", "--count", "0", "--timeout", "1")
    assert r.returncode == 0 and r.stdout == b"third\n", r
    r = zbroker("get", "jobs", "--timeout", "0.3")
    assert r.returncode == 1 and b"no message came within" in r.stderr
    r = zbroker("put", "nosuch")
    assert r.returncode == 1 and b"no queue 'nosuch'" in r.stderr


def test_broker_queue_replicates_to_a_peer_broker(start_broker, tmp_path):
    node_a = preset_node(tmp_path / "a" / "data-q")  # a's queue, listed by its peer
    peer_cfg = pzq_config(tmp_path / "b", q={"replica_sources": [node_a]})
    peer_q = peer_cfg["services"]["pzq"]["queues"]["q"]
    cfg = pzq_config(tmp_path / "a", q={"replicas": 1, "peers": [peer_q["receive_endpoint"]]})
    q = cfg["services"]["pzq"]["queues"]["q"]
    b = start_broker(config=peer_cfg)
    a = start_broker(config=cfg)
    for endpoint in (q["receive_endpoint"], peer_q["receive_endpoint"]):
        wait_for(lambda e=endpoint: endpoint_accepts(e), 10, "pzq queue")
    with Producer(q["receive_endpoint"]) as p:
        p.send(b"twice")
        p.flush(5)
        assert p.replication_failed == 0
    mon = default_monitor_endpoint(b.run_dir / "pzq", b.name, "q")
    assert monitor(mon)["replicas_held"] == 1
    assert a.stop() == 0 and b.stop() == 0


def test_a_second_queue_on_the_same_data_is_refused(start_pzq):
    q = start_pzq()
    second = spawn_pzq(q.database)  # other ports, same data directory
    assert second.proc.wait(10) == 1
    assert "in use by another process" in second.log()
    assert q.alive()


def test_broker_hosts_a_stream_queue_read_by_offset(start_broker, tmp_path):
    from pzq.client import StreamConsumer

    stream_endpoint = f"tcp://127.0.0.1:{free_port()}"
    cfg = pzq_config(tmp_path, events={"mode": "stream", "stream_endpoint": stream_endpoint})
    q = cfg["services"]["pzq"]["queues"]["events"]
    b = start_broker(config=cfg)
    wait_for(lambda: endpoint_accepts(stream_endpoint), 10, "stream endpoint")
    with Producer(q["receive_endpoint"]) as p:
        for i in range(10):
            p.send(b"event %d" % i)
        p.flush(5)
    with StreamConsumer(stream_endpoint) as s:
        assert s.head() == 10 and s.committed() == 0
        first = [m.body for m in s.read(0, 10)]
        assert first == [b"event %d" % i for i in range(10)]
        assert [m.body for m in s.read(0, 10)] == first  # replayable
        assert s.commit(4) == 4
    assert b.stop() == 0


def test_broker_queue_with_a_credit_endpoint(start_broker, tmp_path):
    credit = f"tcp://127.0.0.1:{free_port()}"
    cfg = pzq_config(tmp_path, jobs={"credit_endpoint": credit}, other={"credit_endpoint": credit})
    b = start_broker(config=cfg, wait=False)
    assert b.wait() != 0 and "both use" in b.stderr()  # two queues cannot share it
    cfg = pzq_config(tmp_path, jobs={"credit_endpoint": credit, "ack_timeout": 30})
    b = start_broker(config=cfg)
    q = cfg["services"]["pzq"]["queues"]["jobs"]
    wait_for(lambda: endpoint_accepts(credit), 10, "the credit endpoint")
    with Producer(q["receive_endpoint"]) as p, Consumer(credit, credit=1) as c:
        p.send(b"one")
        p.send(b"two")
        p.flush(5)
        m = c.recv(5)
        assert m is not None and c.recv(0.5) is None  # credit 1: the second waits
        c.ack(m)
        assert c.recv(5) is not None


def test_a_producer_of_libzmq_3_2_speaking_zmtp2_is_answered(start_pzq):
    """The original pzq needs libzmq 3.2 or newer: its producers may speak ZMTP 2.0."""
    q = start_pzq(*FAST)
    p = RawProducer(q.receive, version=2, identity=b"old-producer")
    p.send([b"m1", b"", b"from", b"2013"])
    assert p.recv() == [b"m1", b"1", b""]
    p.send([b"m2", b"x"])
    assert p.recv() == [b"m2", b"0", b"", wire.MALFORMED.encode()]
    with Consumer(q.send) as c:
        m = c.recv(5)
        assert list(m.frames) == [b"from", b"2013"]
        c.ack(m)


def test_two_producers_asking_for_one_identity_each_get_their_own_answers(start_pzq, ctx):
    """As a libzmq ROUTER does: the second connection with a taken identity gets another."""
    q = start_pzq(*FAST)
    a = RawProducer(q.receive, identity=b"same")
    b = ctx.socket(zmq.DEALER)
    b.setsockopt(zmq.LINGER, 0)
    b.setsockopt(zmq.ROUTING_ID, b"same")
    b.connect(q.receive)
    a.send([b"from-a", b"", b"x"])
    b.send_multipart([b"from-b", b"", b"y"])
    assert a.recv() == [b"from-a", b"1", b""]
    assert recv(b) == [b"from-b", b"1", b""]
