"""The fault plan of the pzq fault-injection runs (pzq_faults.plan): drawn from the seed
alone, so that a run is replayed by its seed, and within its own rules (the gaps between
faults, at most two hosts in a fault at once, a host left alone while it recovers)."""

from __future__ import annotations

from itertools import pairwise

import pytest
from pzq_faults import (
    GAP,
    HOLDS,
    KILL,
    MAX_FAULTED,
    TAKEOVER_KILL,
    WEIGHTS,
    plan,
)


def test_the_same_seed_gives_the_same_plan_and_another_seed_another():
    assert plan(7, 120) == plan(7, 120)
    assert plan(7, 120) != plan(8, 120)
    # a longer run starts with the same faults
    assert plan(7, 60) == [f for f in plan(7, 120) if f.at < 60]


@pytest.mark.parametrize("seed", range(40))
def test_a_plan_keeps_its_rules(seed):
    faults = plan(seed, 120)
    assert faults and all(0 < f.at < 120 for f in faults)
    times = sorted({f.at for f in faults})
    assert all(GAP[0] - 0.1 <= b - a for a, b in pairwise(times))
    for f in faults:
        low, high = HOLDS[f.kind]
        assert low - 0.05 <= f.hold <= high + 0.05, f
        assert (f.then > 0) == (f.kind == TAKEOVER_KILL), f
        active = {g.host for g in faults if g.at <= f.at < g.until()}
        every = any(g.kind == TAKEOVER_KILL and g.at <= f.at < g.until() for g in faults)
        assert len(active) <= MAX_FAULTED or every, (seed, f)
        others = [g for g in faults if g is not f and g.at <= f.at < g.until()]
        assert all(g.host != f.host and g.kind != TAKEOVER_KILL for g in others), (seed, f)


def test_every_kind_comes_up_over_a_few_long_runs():
    kinds = {f.kind for seed in range(10) for f in plan(seed, 120)}
    assert kinds == set(WEIGHTS)
    assert sum(f.kind == KILL for f in plan(1, 600)) > 5
    # sometimes two at once
    assert any(a.at == b.at for seed in range(10) for a, b in pairwise(plan(seed, 120)))
