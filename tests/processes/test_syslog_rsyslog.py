"""A broker process logging to a real rsyslog daemon (started by the test, on loopback ports
of its own): records arrive with the right PRI, app name, procid and structured data, over UDP,
TCP and a local socket; a daemon that stops reading (SIGSTOP) does not slow a pipe streaming
meanwhile, and the records it missed are counted and reported.

rsyslog comes from the Debian package of that name: scripts/ensure-test-deps installs it, and
the fixture runs that script when the daemon is missing; the tests are skipped, with the
reason, only when it cannot be installed."""

from __future__ import annotations

import json
import re
import statistics

import pytest
from helpers import run_zbroker, wait_for
from pipe_stream import lockstep
from rsyslog import RsyslogServer, ensure_rsyslogd

LOCAL4 = 20


@pytest.fixture(scope="session")
def rsyslogd_binary() -> str:
    found = ensure_rsyslogd()
    if found is None:
        pytest.skip("rsyslogd is not installed and scripts/ensure-test-deps could not install "
                    "it (needs apt-get as root or password-less sudo)")
    return found


@pytest.fixture
def rsyslog(rsyslogd_binary, tmp_path_factory):
    server = RsyslogServer(tmp_path_factory.mktemp("rsyslog"), rsyslogd_binary).start()
    yield server
    server.stop()


def status(b) -> dict:
    r = run_zbroker(["status", b.name, "--json"], cwd=b.dir)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.mark.parametrize("transport", ["udp", "tcp", "unix-rfc5424"])
def test_records_arrive_with_pri_app_procid_and_structured_data(rsyslog, start_broker, ctx,
                                                                 transport):
    target = getattr(rsyslog, transport.split("-")[0])
    b = start_broker(config={"log": {"syslog": {"target": target, "facility": "local4",
                                                "format": "rfc5424"}}})
    lockstep(ctx, b.endpoint, b"sys-log", 2)
    recs = rsyslog.wait_for_records(
        lambda rs: any(r.msgid == "pipe_closed" for r in rs) and len(rs) >= 4)
    started = next(r for r in recs if r.msgid == "broker_started")
    assert started.pri == LOCAL4 * 8 + 6  # local4.info
    assert started.app == "zbroker" and started.procid == str(b.pid)
    assert started.msg == "broker started"
    assert started.sd.startswith("[zbroker@32473 ") and f'name="{b.name}"' in started.sd
    opened = [r for r in recs if r.msgid == "pipe_opened"]
    assert len(opened) == 2
    assert all('pipe="sys-log"' in r.sd and 'service="zpipes"' in r.sd for r in opened)
    assert {re.search(r'role="(\w+)"', r.sd).group(1) for r in opened} == {"reader", "writer"}
    syslog = status(b)["logs"]["syslog"]
    assert syslog["target"] == target and syslog["dropped"] == 0 and syslog["sent"] >= 4


def test_local_socket_defaults_to_rfc3164(rsyslog, start_broker):
    b = start_broker(config={"log": {"level": "warning",
                                     "syslog": {"target": rsyslog.unix}}})
    assert status(b)["logs"]["syslog"]["format"] == "rfc3164"
    r = run_zbroker(["set", "log.level", "info", b.name], cwd=b.dir)
    assert r.returncode == 0, r.stderr
    recs = rsyslog.wait_for_records(lambda rs: any("set log.level applied" in r.msg for r in rs))
    rec = next(r for r in recs if "set log.level applied" in r.msg)
    assert rec.pri == 3 * 8 + 6 and rec.app == "zbroker" and rec.procid == str(b.pid)
    assert "changed=" in rec.msg


def test_syslog_target_is_applied_on_reload(rsyslog, start_broker):
    b = start_broker(config={})
    assert status(b)["logs"]["syslog"] is None
    b.config_path.write_text(f"log:\n  syslog:\n    target: \"{rsyslog.tcp}\"\n")
    r = run_zbroker(["reload", b.name], cwd=b.dir)
    assert r.returncode == 0, r.stderr
    assert status(b)["logs"]["syslog"]["target"] == rsyslog.tcp
    recs = rsyslog.wait_for_records(lambda rs: any(r.msgid == "config_reloaded" for r in rs))
    assert next(r for r in recs if r.msgid == "config_reloaded").procid == str(b.pid)


def test_a_stopped_syslog_server_does_not_slow_a_pipe(rsyslog, start_broker, ctx):
    """Every chunk makes the broker log about four events (debug level, animate). With rsyslog
    stopped, the TCP link fills, the sink's queue fills, and the records are dropped and
    counted: the pipe's round trips stay about as fast as with rsyslog reading.

    rsyslog's receive buffer has grown while it read (Linux autotuning), so the test streams
    until the broker drops records, then measures the rounds while it is dropping."""
    b = start_broker(config={"log": {"level": "debug", "animate": True,
                                     "syslog": {"target": rsyslog.tcp, "queue": 200}}})
    lockstep(ctx, b.endpoint, b"warm-up", 200, size=1024)
    base = lockstep(ctx, b.endpoint, b"measured", 1000, size=1024)
    # (rsyslog reading keeps up on a quiet machine; with every core busy it may fall behind
    # and records be dropped already: what follows counts from here)
    dropped_reading = status(b)["logs"]["syslog"]["dropped"]
    rsyslog.pause()
    try:
        for _ in range(20):  # until dropping (about 2 MB of records here)
            lockstep(ctx, b.endpoint, b"filling", 500, size=1024)
            if status(b)["logs"]["syslog"]["dropped"] > dropped_reading:
                break
        dropped_before = status(b)["logs"]["syslog"]["dropped"]
        assert dropped_before > dropped_reading, "the syslog link never filled"
        stopped = lockstep(ctx, b.endpoint, b"measured", 1000, size=1024)
        syslog = status(b)["logs"]["syslog"]
    finally:
        rsyslog.resume()
    assert syslog["dropped"] > dropped_before + 2000, syslog  # dropping all along
    assert syslog["queued"] <= 200
    base_median, stopped_median = statistics.median(base), statistics.median(stopped)
    # loose bounds (the machine may be busy with other work): a broker that waited for its
    # syslog server would take seconds per round, or hang
    assert stopped_median < 4 * base_median + 0.003, (base_median, stopped_median)
    assert sum(stopped) < 4 * sum(base) + 3.0, (sum(base), sum(stopped))
    # rsyslog reads again: the next record delivered reports what was dropped
    recs = rsyslog.wait_for_records(lambda rs: any("dropped@32473" in r.sd for r in rs),
                                    timeout=15)
    counts = [int(m) for r in recs for m in re.findall(r'dropped@32473 count="(\d+)"', r.sd)]
    assert counts and counts[0] > 0
    wait_for(lambda: status(b)["logs"]["syslog"]["queued"] == 0, 15, "the queue to drain")
    final = status(b)["logs"]["syslog"]
    assert final["connected"] and final["dropped"] >= syslog["dropped"]
    recs = rsyslog.wait_for_records(lambda rs: sum(
        int(m) for r in rs for m in re.findall(r'dropped@32473 count="(\d+)"', r.sd))
        == final["dropped"], timeout=15)  # every drop reported, once


def test_broker_survives_the_syslog_server_going_away_and_reconnects(rsyslog, start_broker,
                                                                    ctx, tmp_path_factory):
    b = start_broker(config={"log": {"syslog": {"target": rsyslog.tcp}}})
    rsyslog.wait_for_records(lambda rs: any(r.msgid == "broker_started" for r in rs))
    port = rsyslog.tcp_port
    rsyslog.stop()
    lockstep(ctx, b.endpoint, b"meanwhile", 20)  # the broker serves on
    wait_for(lambda: not status(b)["logs"]["syslog"]["connected"], 10, "the link to drop")
    # a new daemon on the same port: the sink reconnects (backoff at most 10 s)
    again = RsyslogServer(tmp_path_factory.mktemp("rsyslog2"), rsyslog.binary)
    again.start(tcp_port=port)
    try:
        lockstep(ctx, b.endpoint, b"after", 1)
        recs = again.wait_for_records(
            lambda rs: any('pipe="after"' in r.sd for r in rs), timeout=20)
        assert all(r.procid == str(b.pid) for r in recs)
        s = status(b)["logs"]["syslog"]
        assert s["connected"]
    finally:
        again.stop()
