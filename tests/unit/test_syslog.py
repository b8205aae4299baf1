"""Syslog records (pure formatting), targets, config keys, and the sink against in-process
servers: a record per datagram, octet-counted TCP, drops counted when the server stops
reading, reconnects. (A real rsyslog daemon: test_syslog_rsyslog.py.)"""

from __future__ import annotations

import re
import socket
import threading
import time

import pytest
from helpers import wait_for

from zbroker import logs
from zbroker.config import ConfigError, default_config, parse_config, with_setting
from zbroker.logs import syslog as sl

STAMP = "2026-11-22T02:20:32.123456Z"


@pytest.fixture(autouse=True)
def _restore_default_logging():
    yield
    logs.configure()


def wait_until(predicate, timeout=5.0, what="condition"):
    wait_for(predicate, timeout, what, interval=0.01)


# --- formatting ------------------------------------------------------------------------------


@pytest.mark.parametrize("facility, level, expected", [
    ("kern", "error", 3), ("user", "info", 14), ("daemon", "info", 30),
    ("daemon", "debug", 31), ("daemon", "warning", 28), ("local7", "critical", 186),
    ("local0", "info", 134), ("authpriv", "error", 83),
])
def test_pri_is_facility_times_8_plus_severity(facility, level, expected):
    assert sl.pri(facility, level) == expected


def test_rfc5424_record():
    rec = sl.format_rfc5424("info", {"timestamp": STAMP, "level": "info",
                                     "event": "pipe opened", "pipe": "logs", "client": 7},
                            facility="daemon", hostname="host1", procid=4242)
    assert rec == (b'<30>1 2026-11-22T02:20:32.123456Z host1 zbroker 4242 pipe_opened '
                   b'[zbroker@32473 pipe="logs" client="7"] pipe opened')


def test_rfc5424_escapes_structured_data_and_sanitizes_names():
    rec = sl.format_rfc5424("warning", {"event": "x", "v": 'a"b]c\\d', "bad name=]": "é"},
                            hostname="h", procid=1).decode()
    assert r'v="a\"b\]c\\d"' in rec
    assert 'bad_name__="é"' in rec
    sd = re.search(r"\[zbroker@32473 .*\]", rec)
    assert sd is not None


def test_rfc5424_without_fields_has_nil_structured_data_and_a_long_msgid_is_cut():
    rec = sl.format_rfc5424("error", {"event": "a very long event name that goes on and on"},
                            hostname="h", procid=1).decode()
    head = rec.split(" ")
    assert head[0] == "<27>1" and head[3] == "zbroker" and head[4] == "1"
    assert head[5] == "a_very_long_event_name_that_goes"  # 32 characters
    assert head[6] == "-"
    assert rec.endswith(" a very long event name that goes on and on")


def test_rfc5424_reports_drops_in_its_own_element():
    rec = sl.format_rfc5424("info", {"event": "e", "k": 1}, hostname="h", procid=1, dropped=12)
    assert b'[zbroker@32473 k="1"][dropped@32473 count="12"] e' in rec


def test_rfc5424_timestamp_is_utc_and_made_when_missing():
    rec = sl.format_rfc5424("info", {"event": "e"}, hostname="h", procid=1).decode()
    stamp = rec.split(" ")[1]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", stamp)


def test_rfc3164_record():
    rec = sl.format_rfc3164("warning", {"timestamp": STAMP, "event": "pipe closed",
                                        "pipe": "my logs", "n": 3},
                            facility="local1", hostname="host1", procid=9, dropped=2).decode()
    assert re.fullmatch(r'<140>[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d host1 zbroker\[9\]: '
                        r'pipe closed pipe="my logs" n=3 syslog_dropped=2', rec), rec


def test_rfc3164_without_host_for_a_local_socket_and_on_one_line():
    rec = sl.format_rfc3164("info", {"event": "boom", "exception": "line1\nline2"},
                            procid=9).decode()
    assert re.fullmatch(r"<30>\w{3} [ \d]\d \d\d:\d\d:\d\d zbroker\[9\]: boom "
                        r'exception="line1\\nline2"', rec), rec


def test_snapshot_turns_values_into_text_and_exceptions_into_tracebacks():
    try:
        raise ValueError("bad")
    except ValueError as exc:
        err = exc
    snap = sl.snapshot({"event": "e", "n": 3, "ok": True, "none": None, "l": [1, "a"],
                        "b": b"\xff", "exc_info": err})
    assert snap["n"] == "3" and snap["ok"] == "true" and snap["none"] == "null"
    assert snap["l"] == '[1, "a"]' and snap["b"] == "\\xff"
    assert "ValueError: bad" in snap["exception"] and "exc_info" not in snap


def test_octet_counting():
    assert sl.frame_octet_counted(b"<30>1 - - - - - - hi") == b"20 <30>1 - - - - - - hi"


# --- targets and config ----------------------------------------------------------------------


@pytest.mark.parametrize("text, expected", [
    ("udp://127.0.0.1:5514", "udp://127.0.0.1:5514"),
    ("udp://loghost", "udp://loghost:514"),
    ("tcp://[::1]:601", "tcp://[::1]:601"),
    ("unix:///dev/log", "unix:///dev/log"),
])
def test_parse_target(text, expected):
    assert str(sl.parse_target(text)) == expected


@pytest.mark.parametrize("text", ["udp:/x", "http://h:1", "udp://h:0", "udp://h:70000",
                                  "unix://dev/log", "tcp://", "udp://a b", 514])
def test_parse_target_rejects(text):
    with pytest.raises(ValueError, match="syslog target"):
        sl.parse_target(text)


def test_syslog_config_defaults_and_validation():
    c = default_config()
    assert c.log.syslog.target is None and c.log.syslog.facility == "daemon"
    assert c.log.syslog.format == "auto" and c.log.syslog.queue == 10_000
    c = parse_config({"log": {"syslog": {"target": "udp://127.0.0.1", "facility": "local3",
                                         "format": "rfc3164", "queue": 5}}})
    assert c.log.syslog.target == "udp://127.0.0.1:514"
    with pytest.raises(ConfigError, match=r"log\.syslog\.target: got 'syslog://x', expected "
                                          r"a syslog target"):
        parse_config({"log": {"syslog": {"target": "syslog://x"}}})
    with pytest.raises(ConfigError, match=r"log\.syslog\.facility: got 'daemons', expected "
                                          r"one of: kern, .*local7"):
        parse_config({"log": {"syslog": {"facility": "daemons"}}})
    with pytest.raises(ConfigError, match=r"unknown key 'log\.syslog\.port'"):
        parse_config({"log": {"syslog": {"port": 514}}})
    with pytest.raises(ConfigError, match=r"log\.syslog\.queue: got 0, expected an integer"):
        parse_config({"log": {"syslog": {"queue": 0}}})


def test_with_setting_validates_like_a_file():
    c = default_config("n")
    assert with_setting(c, "clients.max_clients", 5).clients.max_clients == 5
    assert with_setting(c, "log.file", "/tmp/{name}.log").log.file.name == "n.log"
    assert with_setting(c, "log.syslog.target", "udp://h").log.syslog.target == "udp://h:514"
    for key, value, message in [
        ("log.level", "loud", "set: log.level: got 'loud', expected one of: debug, info, "
                              "warning, error"),
        ("services.zpipes.client_timeout", -1,
         "set: services.zpipes.client_timeout: got -1, expected a number of seconds > 0"),
        ("log.levle", "x", "set: unknown key 'log.levle' (did you mean 'level'?); known keys "
                           "under 'log': level, format, file, syslog"),
        ("log", "x", "set: 'log' is a section, not a setting; its keys: level, format, file, "
                     "syslog"),
        ("log.level.x", "x", "set: 'log.level' is a setting, not a section"),
    ]:
        with pytest.raises(ConfigError) as err:
            with_setting(c, key, value)
        assert str(err.value) == message


# --- the sink against in-process servers --------------------------------------------------


def test_udp_sink_sends_one_record_per_datagram():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as server:
        server.bind(("127.0.0.1", 0))
        server.settimeout(5)
        port = server.getsockname()[1]
        sink = sl.SyslogSink(f"udp://127.0.0.1:{port}", facility="local0", hostname="h")
        try:
            sink.emit("info", {"event": "one", "timestamp": STAMP})
            sink.emit("error", {"event": "two", "timestamp": STAMP, "k": "v"})
            first, second = server.recv(9000), server.recv(9000)
        finally:
            sink.close(2)
    assert first.startswith(b"<134>1 " + STAMP.encode() + b" h zbroker ")
    assert second.endswith(b' two [zbroker@32473 k="v"] two')
    assert sink.stats()["sent"] == 2 and sink.stats()["dropped"] == 0


def _read_octet_counted(conn: socket.socket, count: int, timeout: float = 5.0) -> list[bytes]:
    conn.settimeout(timeout)
    buf, records = b"", []
    while len(records) < count:
        chunk = conn.recv(65536)
        if not chunk:
            break
        buf += chunk
        while b" " in buf:
            length, _, rest = buf.partition(b" ")
            if len(rest) < int(length):
                break
            records.append(rest[: int(length)])
            buf = rest[int(length):]
    return records


def test_tcp_sink_frames_with_octet_counting():
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        sink = sl.SyslogSink(f"tcp://127.0.0.1:{port}", hostname="h")
        try:
            for i in range(50):
                sink.emit("info", {"event": f"record {i}", "text": "x\ny" * i})
            server.settimeout(5)
            conn, _ = server.accept()
            with conn:
                records = _read_octet_counted(conn, 50)
        finally:
            sink.close(2)
    assert len(records) == 50
    assert all(r.startswith(b"<30>1 ") for r in records)
    assert records[7].endswith(b"record 7")


def test_a_server_that_stops_reading_costs_drops_not_time():
    """The server accepts and never reads: the sender's buffers fill, the queue fills, then
    every record is dropped and counted; emit stays fast throughout."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        sink = sl.SyslogSink(f"tcp://127.0.0.1:{port}", hostname="h", queue=100)
        try:
            server.settimeout(5)
            conn, _ = server.accept()
            payload = "x" * 1000
            worst = 0.0
            t0 = time.perf_counter()
            for i in range(20_000):
                t = time.perf_counter()
                sink.emit("info", {"event": "flood", "i": i, "payload": payload})
                worst = max(worst, time.perf_counter() - t)
            elapsed = time.perf_counter() - t0
            stats = sink.stats()
            assert stats["dropped"] > 0, stats
            assert stats["queued"] <= 100
            assert worst < 0.5, f"one emit took {worst:.3f}s"
            assert elapsed < 10, f"20000 emits took {elapsed:.1f}s"
            # the server reads again: the next record delivered carries the count of drops
            conn.settimeout(5)
            deadline = time.monotonic() + 10
            buf = b""
            while time.monotonic() < deadline and sink.stats()["queued"]:
                buf += conn.recv(1 << 20)
            sink.emit("info", {"event": "after"})
            while time.monotonic() < deadline and not buf.endswith(b"after"):
                buf += conn.recv(1 << 20)
            assert buf.endswith(b"after")
            counts = re.findall(rb'\[dropped@32473 count="(\d+)"\]', buf)
            assert counts and sum(map(int, counts)) == sink.stats()["dropped"]
            conn.close()
        finally:
            sink.close(2)


def test_reconnects_with_backoff_when_the_server_comes_back():
    with socket.socket() as probe:  # a port with nothing on it
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    sink = sl.SyslogSink(f"tcp://127.0.0.1:{port}", hostname="h")
    try:
        sink.emit("info", {"event": "early"})
        wait_until(lambda: sink.stats()["last_error"] is not None, what="a failed connect")
        assert not sink.stats()["connected"]
        with socket.create_server(("127.0.0.1", port)) as server:
            server.settimeout(15)
            conn, _ = server.accept()
            with conn:
                records = _read_octet_counted(conn, 1)
        assert records and records[0].endswith(b"early")  # it waited in the queue
    finally:
        sink.close(2)


def test_closed_sink_ends_its_thread():
    sink = sl.SyslogSink("udp://127.0.0.1:9")
    sink.close(2)
    assert not sink._thread.is_alive()
    sink.emit("info", {"event": "ignored"})
    assert sink.stats()["queued"] == 0


# --- the sink in the logging pipeline --------------------------------------------------------


def test_configure_keeps_an_unchanged_syslog_sink_and_replaces_a_changed_one():
    cfg = parse_config({"log": {"syslog": {"target": "udp://127.0.0.1:9"}}}).log.syslog
    logs.configure("info", "json", syslog=cfg)
    first = logs._OUTPUT.syslog
    assert first is not None and logs.status()["syslog"]["target"] == "udp://127.0.0.1:9"
    logs.configure("debug", "console", syslog=cfg)
    assert logs._OUTPUT.syslog is first
    other = parse_config({"log": {"syslog": {"target": "udp://127.0.0.1:9",
                                             "facility": "local2"}}}).log.syslog
    logs.configure("debug", "console", syslog=other)
    assert logs._OUTPUT.syslog is not first and logs._OUTPUT.syslog.facility == "local2"
    wait_until(lambda: not first._thread.is_alive(), what="the old sender to end")
    logs.configure()
    assert logs._OUTPUT.syslog is None and logs.status()["syslog"] is None


def test_log_calls_reach_syslog_with_their_bound_context():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as server:
        server.bind(("127.0.0.1", 0))
        server.settimeout(5)
        port = server.getsockname()[1]
        cfg = parse_config({"log": {"syslog": {"target": f"udp://127.0.0.1:{port}"}}})
        logs.configure("info", "json", stream=open("/dev/null", "w"), syslog=cfg.log.syslog)
        logs.get_logger(service="zpipes").bind(pipe="p").warning("pipe slow", waited=1.5)
        data = server.recv(9000).decode()
    assert data.startswith("<28>1 ")
    assert ' pipe_slow [zbroker@32473 service="zpipes" pipe="p" waited="1.5"] pipe slow' in data


def test_emit_from_many_threads_is_counted_exactly(tmp_path):
    sink = sl.SyslogSink(f"unix://{tmp_path}/nothing-here", queue=10)
    try:
        def flood():
            for _ in range(1000):
                sink.emit("info", {"event": "e"})
        threads = [threading.Thread(target=flood) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        stats = sink.stats()
        assert stats["queued"] == 10 and stats["dropped"] == 3990 and stats["sent"] == 0
        # the sender's first connection attempt may come after the flood (a loaded machine)
        wait_until(lambda: sink.stats()["last_error"] is not None,
                   what="the sender to try the socket")
        assert "No such file" in sink.stats()["last_error"]
    finally:
        sink.close(2)
