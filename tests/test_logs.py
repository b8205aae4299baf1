"""The logging pipeline: formats, level filtering, files, re-configuration."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime, timedelta

import pytest

from zbroker import logs


@pytest.fixture(autouse=True)
def _restore_default_logging():
    yield
    logs.configure()


def lines(buf: io.StringIO) -> list[str]:
    return buf.getvalue().splitlines()


def test_json_lines_parse():
    buf = io.StringIO()
    logs.configure("debug", "json", stream=buf)
    log = logs.get_logger(service="zpipes")
    log.info("pipe opened", pipe="logs", client=7)
    log.debug("chunk", size=4096)
    log.bind(peer="p1").warning("peer silent", seconds=3.5)
    events = [json.loads(line) for line in lines(buf)]
    assert [e["event"] for e in events] == ["pipe opened", "chunk", "peer silent"]
    first = events[0]
    assert list(first)[:3] == ["timestamp", "level", "event"]
    assert first["level"] == "info" and first["service"] == "zpipes"
    assert first["pipe"] == "logs" and first["client"] == 7
    assert events[2]["peer"] == "p1" and events[2]["seconds"] == 3.5
    stamp = datetime.fromisoformat(first["timestamp"].replace("Z", "+00:00"))
    assert stamp.utcoffset() == timedelta(0)
    assert abs((datetime.now(UTC) - stamp).total_seconds()) < 60


def test_json_keeps_an_exception_on_one_line():
    buf = io.StringIO()
    logs.configure("info", "json", stream=buf)
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logs.get_logger().exception("failed")
    [line] = lines(buf)
    event = json.loads(line)
    assert event["level"] == "error"
    assert "RuntimeError: boom" in event["exception"]


def test_json_renders_odd_values_as_text():
    buf = io.StringIO()
    logs.configure("info", "json", stream=buf)
    logs.get_logger().info("x", path=io, data=b"\x00")
    assert json.loads(lines(buf)[0])["path"].startswith("<module 'io'")


@pytest.mark.parametrize("level, shown", [
    ("debug", ["debug", "info", "warning", "error"]),
    ("info", ["info", "warning", "error"]),
    ("warning", ["warning", "error"]),
    ("error", ["error"]),
])
def test_level_filtering(level, shown):
    buf = io.StringIO()
    logs.configure(level, "json", stream=buf)
    log = logs.get_logger()
    for name in ("debug", "info", "warning", "error"):
        getattr(log, name)(name)
    assert [json.loads(line)["level"] for line in lines(buf)] == shown


def test_a_disabled_level_does_no_work():
    logs.configure("warning", "json", stream=io.StringIO())
    log = logs.get_logger()
    assert log.debug("x", value=object()) is None
    assert not log.is_enabled_for(20) and log.is_enabled_for(30)
    assert log.debug.__func__.__name__ == "_nop"  # structlog's bare `return None`


def test_reconfigure_reaches_loggers_bound_before():
    first = io.StringIO()
    logs.configure("warning", "json", stream=first)
    log = logs.get_logger(service="zpipes").bind(client=1)
    log.info("hidden")
    second = io.StringIO()
    logs.configure("debug", "console", stream=second)
    log.debug("shown")
    assert first.getvalue() == ""
    [line] = lines(second)
    assert "shown" in line and "service=zpipes" in line and "client=1" in line
    assert logs.current_level() == "debug"


def test_console_is_one_plain_line_per_event_when_not_a_tty():
    buf = io.StringIO()
    logs.configure("info", "console", stream=buf)
    logs.get_logger(service="zpipes").info("pipe opened", pipe="logs")
    [line] = lines(buf)
    assert "\x1b[" not in line
    assert "[info" in line and "pipe opened" in line and "pipe=logs" in line
    assert line.split()[0].endswith("Z")


def test_file_output_is_line_buffered_and_reopened(tmp_path):
    path = tmp_path / "zbroker.log"
    logs.configure("info", "json", path)
    log = logs.get_logger()
    log.info("one")
    assert json.loads(path.read_text())["event"] == "one"  # there without a close or flush
    path.rename(tmp_path / "zbroker.log.1")  # log rotation, then SIGHUP
    logs.configure("info", "json", path)
    log.info("two")
    assert [json.loads(x)["event"] for x in path.read_text().splitlines()] == ["two"]
    logs.configure("info", "json", path)  # appends, never truncates
    log.info("three")
    assert [json.loads(x)["event"] for x in path.read_text().splitlines()] == ["two", "three"]


def test_a_log_file_that_cannot_be_opened_changes_nothing(tmp_path):
    buf = io.StringIO()
    logs.configure("info", "json", stream=buf)
    with pytest.raises(OSError):
        logs.configure("debug", "json", tmp_path / "missing" / "x.log")
    log = logs.get_logger()
    log.debug("still filtered")
    log.info("still here")
    assert [json.loads(x)["event"] for x in lines(buf)] == ["still here"]


def test_write_errors_never_reach_the_caller():
    buf = io.StringIO()
    logs.configure("info", "json", stream=buf)
    buf.close()
    logs.get_logger().info("into a closed stream")  # must not raise


@pytest.mark.parametrize("kwargs", [{"level": "verbose"}, {"format": "xml"}])
def test_bad_settings_are_refused(kwargs):
    with pytest.raises(ValueError):
        logs.configure(**kwargs)
