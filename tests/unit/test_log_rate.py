"""The log budget (zbroker.runtime.log_rate): a kind of line goes out ``burst`` times an
interval; the rest are held back and counted in the next line that goes out."""

from __future__ import annotations

from zbroker.runtime.log_rate import LogRate


class Log:
    def __init__(self):
        self.lines: list[tuple[str, str, dict]] = []

    def __getattr__(self, level):
        return lambda event, **fields: self.lines.append((level, event, fields))


def test_a_kind_goes_out_burst_times_an_interval_and_then_says_what_it_held_back():
    now = [0.0]
    log = Log()
    rate = LogRate(log, burst=3, interval=1.0, clock=lambda: now[0], service="zpipes")
    sent = [rate.line("pipe opened", pipe="a") for _ in range(10)]
    assert sent == [True] * 3 + [False] * 7
    assert rate.suppressed == 7
    now[0] = 1.0
    assert rate.line("pipe opened", pipe="b")
    level, event, fields = log.lines[-1]
    assert (level, event, fields) == ("info", "pipe opened",
                                      {"service": "zpipes", "pipe": "b", "suppressed": 7})
    assert len(log.lines) == 4


def test_kinds_have_budgets_of_their_own_and_levels_are_kept():
    now = [5.0]
    log = Log()
    rate = LogRate(log, burst=1, clock=lambda: now[0])
    assert rate.line("invalid frame", level="warning", client=1)
    assert not rate.line("invalid frame", level="warning", client=2)
    assert rate.line("pipe closed", client=1)
    assert [(lv, ev) for lv, ev, _ in log.lines] == [("warning", "invalid frame"),
                                                       ("info", "pipe closed")]


def test_a_steady_trickle_under_the_burst_is_never_held_back():
    now = [0.0]
    log = Log()
    rate = LogRate(log, burst=5, clock=lambda: now[0])
    for i in range(100):
        now[0] = i * 0.25  # 4 a second
        assert rate.line("client expired")
    assert rate.suppressed == 0


def test_flush_tells_what_a_flood_that_stopped_held_back():
    now = [0.0]
    log = Log()
    rate = LogRate(log, burst=2, clock=lambda: now[0])
    for _ in range(10):
        rate.line("invalid frame", level="warning", client=1)
    rate.flush()  # within the interval: nothing yet
    assert len(log.lines) == 2
    now[0] = 1.5
    rate.flush()
    assert log.lines[-1] == ("warning", "invalid frame (held back)", {"suppressed": 8})
    rate.flush()  # told once
    assert len(log.lines) == 3
