"""The logging pipeline: formats, level filtering, files, re-configuration."""

from __future__ import annotations

import io
import json
import re
from datetime import UTC, datetime, timedelta

import pytest
import structlog

from zbroker import logs
from zbroker.logs.budget import LogBudget, Rate


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


# --- repeated warnings --------------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def repeats():
    """(budget, clock, lines): the log budget on a fake clock, its repeat rule once per 10 s;
    ``lines`` gets what it writes itself (flushed counts) and, through ``log``, what it
    passes."""
    clock = FakeClock()
    lines: list[tuple[str, dict]] = []
    f = LogBudget(max_keys=3, clock=clock, repeat=Rate(1, 10.0, "repeated"),
                  emit=lambda level, event: lines.append((level, event)))

    def log(event, level="warning", **fields):
        try:
            lines.append((level, f(None, level, {"event": event, "level": level, **fields})))
        except structlog.DropEvent:
            pass

    return f, clock, lines, log


def test_a_warning_said_not_to_collapse_passes_every_time(repeats):
    f, clock, lines, log = repeats
    for i in range(5):
        log("pzq replica origin lost", node="n1", messages=i, collapse=False)
        clock.now += 0.1
    assert [e["messages"] for _, e in lines] == [0, 1, 2, 3, 4]
    assert all("collapse" not in e for _, e in lines)
    log("pzq replica origin lost", node="n1", messages=5)  # (the others still collapse)
    log("pzq replica origin lost", node="n1", messages=6)
    assert [e["messages"] for _, e in lines] == [0, 1, 2, 3, 4, 5]


def test_the_first_warning_passes_repeats_are_counted_into_one_line(repeats):
    f, clock, lines, log = repeats
    for i in range(2000):
        log("invalid frame", client=7, error=f"bad {i}")
        clock.now += 0.001
    assert [e["event"] for _, e in lines] == ["invalid frame"]
    assert lines[0][1]["error"] == "bad 0"
    clock.now = 1009.9
    assert f.flush() == 0  # not yet
    clock.now = 1010.0
    assert f.flush() == 1
    level, summary = lines[1]
    assert level == "warning"
    assert summary["event"] == "invalid frame (repeated 1999 times in the last 10 s)"
    assert summary["repeated"] == 1999 and summary["client"] == 7
    assert summary["error"] == "bad 1999"  # the last one's fields
    assert f.flush() == 0 and f.collapsed == 1999


def test_a_flood_that_goes_on_is_one_line_per_interval(repeats):
    f, clock, lines, log = repeats
    for _ in range(60 * 100):  # a minute at 100 per second
        log("invalid frame", client=7)
        clock.now += 0.01
        if round(clock.now * 100) % 100 == 0:
            f.flush()
    assert 6 <= len(lines) <= 7, [e["event"] for _, e in lines]
    assert sum(e.get("repeated", 1) for _, e in lines) + sum(
        w.held for w in f._windows.values()) == 6000


def test_sources_and_kinds_are_counted_apart(repeats):
    f, clock, lines, log = repeats
    f.max_keys = 10
    for _ in range(3):
        log("invalid frame", client=1)
        log("invalid frame", client=2)
        log("write refused", client=1)
        log("peer refused", address="10.0.0.9", claimed_name=f"evil{_}")  # claims vary
    assert [(e["event"], e.get("client", e.get("address"))) for _, e in lines] == [
        ("invalid frame", 1), ("invalid frame", 2), ("write refused", 1),
        ("peer refused", "10.0.0.9")]


def test_info_and_debug_and_events_without_a_source_are_never_collapsed(repeats):
    f, clock, lines, log = repeats
    for _ in range(5):
        log("pipe opened", level="info", client=1)
        log("chunk", level="debug", client=1)
        log("config reload refused", level="error", component="broker", reason=f"bad {_}")
    assert len(lines) == 15


def test_after_a_quiet_interval_the_next_one_is_a_first_again(repeats):
    f, clock, lines, log = repeats
    log("peer left", peer="a#1")
    clock.now += 10
    log("peer left", peer="a#1")
    assert [e["event"] for _, e in lines] == ["peer left", "peer left"]


def test_without_a_flush_the_next_event_tells_the_count(repeats):
    f, clock, lines, log = repeats
    log("invalid frame", client=7)
    log("invalid frame", client=7)
    log("invalid frame", client=7)
    clock.now += 12
    log("invalid frame", client=7)
    assert [e["event"] for _, e in lines] == [
        "invalid frame", "invalid frame (repeated 3 times in the last 12 s)"]
    assert f.flush(everything=True) == 0


def test_memory_is_bounded_and_a_forgotten_key_tells_its_count_first(repeats):
    f, clock, lines, log = repeats
    log("invalid frame", client=1)
    log("invalid frame", client=1)  # owed
    for c in range(2, 6):
        log("invalid frame", client=c)
    assert len(f._windows) == 3
    events = [(e["event"], e["client"]) for _, e in lines]
    assert ("invalid frame (repeated 1 times in the last 0 s)", 1) in events
    assert f.flush(everything=True) == 0


def test_the_pipeline_collapses_repeats_and_flush_writes_the_count():
    logs.flush_budget(everything=True)  # (what other tests' lines held back: told before)
    buf = io.StringIO()
    logs.configure("info", "json", stream=buf)
    log = logs.get_logger(service="zpipes")
    for i in range(500):
        log.warning("invalid frame", client=3, error=f"bad {i}")
    log.info("pipe opened", client=3)
    assert logs.flush_budget(everything=True) == 1
    events = [json.loads(line) for line in lines(buf)]
    assert [e["event"] for e in events] == [
        "invalid frame", "pipe opened", "invalid frame (repeated 499 times in the last 0 s)"]
    assert events[2]["repeated"] == 499 and events[2]["level"] == "warning"
    assert events[2]["service"] == "zpipes" and events[2]["timestamp"].endswith("Z")
    assert logs.status()["repeats_collapsed"] >= 499


def test_a_broker_flooded_with_malformed_frames_logs_a_few_lines_and_works(start_broker, ctx):
    """2 000 malformed ZPIPES frames from one client: the first is logged, then counts, not
    2 000 lines (the log budget lets 5 lines of a kind a second through, saying how many it
    held back; the repeat filter collapses those of one client); a pipe next to it works all
    along."""
    from helpers import wait_for
    from wire import INPUT_OK, INVALID, OUTPUT_OK, READ_OK, WRITE_OK, RawClient, input_, output
    from wire import read as read_frame
    from wire import write as write_frame

    b = start_broker()
    bad, reader, writer = (RawClient(ctx, b.endpoint) for _ in range(3))
    try:
        assert reader.call(input_(b"beside")) == (INPUT_OK, None)
        assert writer.call(output(b"beside")) == (OUTPUT_OK, None)
        for i in range(2000):
            assert bad.call(b"junk %d" % i if i % 2 else b"\xaa\xa0\xff")[0] == INVALID
            if i % 500 == 0:
                assert writer.call(write_frame(b"line %d\n" % i, 0)) == (WRITE_OK, None)
                assert reader.call(read_frame(100, 1000)) == (READ_OK, b"line %d\n" % i)
        text = wait_for(lambda: re.search(r"\(repeated|suppressed=", b.stderr())
                        and b.stderr(), 20, "the count of the repeated warnings")
    finally:
        for c in (bad, reader, writer):
            c.close()
    lines = text.splitlines()
    invalid = [line for line in lines if "invalid frame" in line]
    print(f"{len(lines)} lines on standard error, {len(invalid)} of them 'invalid frame'")
    assert len(lines) < 50, lines[:60]
    assert "invalid frame" in invalid[0] and "repeated" not in invalid[0]  # the first as is
    told = sum(int(n) for n in re.findall(r"(?:repeated|suppressed)=(\d+)", "\n".join(invalid)))
    assert told > 1000, invalid  # the lines held back are counted in the lines that went
    assert b.stop() == 0
