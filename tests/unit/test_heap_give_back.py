"""Giving the heap's free pages back (zbroker.runtime.heap): every interval, or less often
when it takes longer than its share of the time (a large heap takes tens of ms to walk)."""

from __future__ import annotations

from zbroker.runtime import heap


class Loop:
    def __init__(self):
        self.delays: list[float] = []
        self.pending = None
        self.cancelled = False

    def call_later(self, delay, callback):
        self.delays.append(delay)
        self.pending = callback
        loop = self

        class Handle:
            def cancel(self):
                loop.cancelled = True
        return Handle()


def test_it_runs_every_interval_and_backs_off_when_it_is_slow(monkeypatch):
    took = [0.0]
    now = [0.0]

    def give_back(pad=heap.TRIM_THRESHOLD):
        now[0] += took[0]
        return True

    monkeypatch.setattr(heap, "give_back", give_back)
    monkeypatch.setattr(heap.time, "perf_counter", lambda: now[0])
    loop = Loop()
    stop = heap.give_back_every(loop, interval=10.0, share=0.001)
    assert loop.delays == [10.0]
    loop.pending()  # quick: every 10 s
    assert loop.delays[-1] == 10.0
    took[0] = 0.03  # 30 ms a walk: at most 0.1 % of the time, so every 30 s
    loop.pending()
    assert abs(loop.delays[-1] - 30.0) < 1e-6
    stop()
    assert loop.cancelled
