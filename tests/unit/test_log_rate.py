"""The log budget's rates (zbroker/logs/budget.py): a kind of line with a ``budget`` goes out
``burst`` times an interval; the rest are held back and counted in the next line that goes
out, or by a flush. (Repeated warnings, the budget's other rule: test_logs.py.)"""

from __future__ import annotations

import io
import json
import uuid

import structlog

from zbroker import logs
from zbroker.logs.budget import LogBudget, Rate


class Budget:
    """A LogBudget on a fake clock; ``lines`` gets what it lets out and what it writes
    itself (flushes), as (level, event dict)."""

    def __init__(self, **rates: Rate) -> None:
        self.now = 0.0
        self.lines: list[tuple[str, dict]] = []
        self.budget = LogBudget(clock=lambda: self.now, rates=rates or {"lines": Rate(5, 1.0)},
                                emit=lambda level, event: self.lines.append((level, event)))

    def log(self, event: str, level: str = "info", **fields) -> bool:
        """Log a line through the processor; True if it went out."""
        try:
            out = self.budget(None, level, {"event": event, "level": level, **fields})
        except structlog.DropEvent:
            return False
        self.lines.append((level, out))
        return True


def test_a_kind_goes_out_burst_times_an_interval_and_then_says_what_it_held_back():
    b = Budget(lines=Rate(3, 1.0))
    sent = [b.log("pipe opened", budget="lines", service="zpipes", pipe="a") for _ in range(10)]
    assert sent == [True] * 3 + [False] * 7
    assert b.budget.held_back == 7
    b.now = 1.0
    assert b.log("pipe opened", budget="lines", service="zpipes", pipe="b")
    assert b.lines[-1] == ("info", {"event": "pipe opened", "level": "info",
                                    "service": "zpipes", "pipe": "b", "suppressed": 7})
    assert len(b.lines) == 4


def test_kinds_have_budgets_of_their_own_and_levels_are_kept():
    b = Budget(lines=Rate(1, 1.0))
    b.now = 5.0
    assert b.log("invalid frame", "warning", budget="lines", client=1)
    assert not b.log("invalid frame", "warning", budget="lines", client=2)
    assert b.log("pipe closed", budget="lines", client=1)
    assert [(lv, e["event"]) for lv, e in b.lines] == [("warning", "invalid frame"),
                                                       ("info", "pipe closed")]
    assert all("budget" not in e for _, e in b.lines)  # (the mark is not written)


def test_a_steady_trickle_under_the_burst_is_never_held_back():
    b = Budget()
    for i in range(100):
        b.now = i * 0.25  # 4 a second
        assert b.log("client expired", budget="lines")
    assert b.budget.held_back == 0


def test_flush_tells_what_a_flood_that_stopped_held_back():
    b = Budget(lines=Rate(2, 1.0))
    for i in range(10):
        b.log("invalid frame", "warning", budget="lines", n=i)  # (no source: no repeats)
    assert b.budget.flush() == 0  # within the interval: nothing yet
    assert len(b.lines) == 2
    b.now = 1.5
    assert b.budget.flush() == 1
    level, event = b.lines[-1]
    assert (level, event["event"], event["suppressed"]) == (
        "warning", "invalid frame (held back)", 8)
    assert event["n"] == 9  # the last one's fields
    assert b.budget.flush() == 0  # told once
    assert len(b.lines) == 3
    assert b.log("invalid frame", "warning", budget="lines")  # (the told line
    assert not b.log("invalid frame", "warning", budget="lines")  # was one of 2)


def test_rates_are_named_and_a_named_kind_is_kept_whatever_its_words():
    b = Budget(lines=Rate(5, 1.0), refused=Rate(1, 1.0), peer=Rate(50, 1.0))
    assert b.log("zpipes connection refused: too many", "warning", budget="refused:full #1")
    assert not b.log("zpipes connection refused: too many hosts", "warning",
                     budget="refused:full #1")  # the same kind in other words
    assert b.log("zpipes connection refused", "warning", budget="refused:broken #1")
    assert b.log("pzq connection refused: too many", "warning", budget="refused:full #2")
    assert sum(b.log("remote end attached", budget="peer") for _ in range(60)) == 50
    assert sum(b.log("pipe opened", budget="unknown") for _ in range(10)) == 5  # (the default)


def test_the_context_keys_tell_apart_the_parts_of_the_broker():
    b = Budget(lines=Rate(1, 1.0))
    assert b.log("started", budget="lines", service="zpipes")
    assert b.log("started", budget="lines", service="pzq")
    assert not b.log("started", budget="lines", service="pzq")


def test_a_line_with_a_budget_that_repeats_a_warning_passes_only_if_both_let_it():
    b = Budget(lines=Rate(5, 1.0))
    out = [b.log("invalid frame", "warning", budget="lines", client=7) for _ in range(3)]
    assert out == [True, False, False]  # the repeat rule: one a 10 s for client 7
    assert b.log("invalid frame", "warning", budget="lines", client=8)  # another source
    assert (b.budget.collapsed, b.budget.held_back) == (2, 0)


def test_the_pipeline_holds_lines_back_and_the_flush_writes_the_count():
    kind = f"line of {uuid.uuid4().hex}"  # (the process's budget: other tests' lines too)
    logs.flush_budget(everything=True)  # (what they held back: told before)
    buf = io.StringIO()
    logs.configure("info", "json", stream=buf)
    try:
        log = logs.get_logger(service="zpipes")
        for i in range(12):
            log.info(kind, budget="lines", pipe=f"p{i}")
        logs.configure("info", "json", stream=buf)  # as each reload does: the budget goes on
        log.info(kind, budget="lines", pipe="p12")
        assert logs.flush_budget(everything=True) == 1
    finally:
        logs.configure()
    events = [e for line in buf.getvalue().splitlines()
              if (e := json.loads(line))["event"].startswith(kind)]
    assert [e["event"] for e in events] == [kind] * 5 + [f"{kind} (held back)"]
    assert events[-1]["suppressed"] == 8 and events[-1]["pipe"] == "p12"
    assert events[-1]["timestamp"].endswith("Z") and events[-1]["level"] == "info"
    assert not any("budget" in e for e in events)


def test_a_new_configuration_tells_the_repeats_held_back_and_starts_them_afresh():
    b = Budget()
    for _ in range(3):
        b.log("invalid frame", "warning", client=7)
        b.log("pipe opened", budget="lines", client=7)
    assert b.budget.forget_repeats() == 1  # told now, to the outputs of before
    assert b.lines[-1][1]["event"] == "invalid frame (repeated 2 times in the last 0 s)"
    assert b.log("invalid frame", "warning", client=7)  # a first again
    assert sum(b.log("pipe opened", budget="lines", client=7) for _ in range(5)) == 2
