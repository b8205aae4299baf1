"""The door of every ZMTP endpoint, without sockets: one connection budget for the process,
who may connect over ipc, and refusals counted exactly but logged at a bounded rate."""

from __future__ import annotations

import structlog

from zbroker.logs.budget import LogBudget
from zbroker.runtime.local_access import PeerCredentials, Policy
from zbroker.zmtp.admission import (
    BROKEN,
    NO_HANDSHAKE,
    NOT_ALLOWED,
    SOURCE_FULL,
    TOO_MANY,
    Admission,
    ConnectionBudget,
)
from zbroker.zmtp.refusals import Refusals


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Log:
    """A logger whose lines go through the log budget's processor (on ``clock``), as the
    broker's do, without its repeat rule (no source keys)."""

    def __init__(self, clock: Clock | None = None) -> None:
        self.lines: list[tuple[str, str, dict]] = []
        self.budget = LogBudget(clock=clock or Clock(), source_keys=())

    def _line(self, level: str, event: str, fields: dict) -> None:
        try:
            out = self.budget(None, level, {"event": event, "level": level, **fields})
        except structlog.DropEvent:
            return
        out.pop("event"), out.pop("level")
        self.lines.append((level, event, out))

    def warning(self, event: str, **fields) -> None:
        self._line("warning", event, fields)

    def info(self, event: str, **fields) -> None:
        self._line("info", event, fields)


def test_refusals_are_counted_each_and_logged_once_a_second_with_what_was_held_back():
    clock = Clock()
    log = Log(clock)
    refusals = Refusals(log, queue="jobs")
    other = Refusals(log, queue="orders")  # another endpoint: a budget of its own
    refusals.note(BROKEN, "refused", reason="junk")
    for _ in range(500):
        refusals.note(BROKEN, "refused", reason="junk")
    other.note(BROKEN, "refused", reason="junk")
    refusals.note(NO_HANDSHAKE, "dropped", level="info")  # another kind: its own line
    clock.now += 0.99
    refusals.note(BROKEN, "refused", reason="junk")
    clock.now += 0.02
    refusals.note(BROKEN, "refused", reason="junk")
    assert refusals.count(BROKEN) == 503 and refusals.count(NO_HANDSHAKE) == 1
    assert [(level, event, fields["queue"]) for level, event, fields in log.lines] == [
        ("warning", "refused", "jobs"), ("warning", "refused", "orders"),
        ("info", "dropped", "jobs"), ("warning", "refused", "jobs")]
    assert log.lines[0][2] == {"queue": "jobs", "reason": "junk"}
    assert log.lines[3][2]["suppressed"] == 501


HOST = ("host", "127.0.0.1")


def test_one_budget_is_shared_by_every_endpoint_and_given_back():
    log = Log()
    budget = ConnectionBudget(limit=3, per_source=3)
    zpipes = Admission("zpipes", Refusals(log), budget=budget)
    pzq = Admission("pzq producer", Refusals(log), budget=budget)
    assert zpipes.admit(None, HOST) is None
    assert pzq.admit(None, HOST) is None
    assert pzq.admit(None, HOST) is None
    assert zpipes.admit(None, HOST) == TOO_MANY  # the others' connections count too
    assert zpipes.admit(None, HOST) == TOO_MANY
    assert budget.open == 3
    assert zpipes.refused()[TOO_MANY] == 2 and pzq.refused()[TOO_MANY] == 0
    pzq.release(HOST)
    assert zpipes.admit(None, HOST) is None
    assert budget.open == 3
    events = [event for _, event, _ in log.lines]
    assert events == ["zpipes connection refused: too many clients; newer connections are "
                      "hung up until some go", "zpipes takes connections again"]


def test_churn_at_the_budgets_edge_is_not_a_flood_of_lines_that_it_takes_again():
    clock = Clock()
    log = Log(clock)
    door = Admission("zpipes", Refusals(log), budget=ConnectionBudget(limit=1, per_source=1))
    assert door.admit(None, HOST) is None
    for _ in range(100):  # one goes, the next is taken, the one after it refused
        door.release(HOST)
        assert door.admit(None, HOST) is None
        assert door.admit(None, HOST) == TOO_MANY
    assert door.refused()[TOO_MANY] == 100
    events = [event for _, event, _ in log.lines]
    assert events == ["zpipes connection refused: too many clients; newer connections are "
                      "hung up until some go", "zpipes takes connections again"]  # a second
    clock.now += 1.0
    door.release(HOST)
    assert door.admit(None, HOST) is None
    level, event, fields = log.lines[-1]
    assert (level, event) == ("info", "zpipes takes connections again")
    assert fields["refused"] == 100 and fields["suppressed"] == 98


def test_on_ipc_a_user_not_allowed_is_refused_and_logged_once_and_takes_no_place():
    log = Log()
    budget = ConnectionBudget(limit=10)
    door = Admission("zpipes", Refusals(log), Policy(frozenset({1000}), frozenset()),
                     budget=budget)
    stranger = PeerCredentials(pid=7, uid=2000, gid=2000)
    for _ in range(5):
        assert door.admit(stranger, ("uid", 2000)) == NOT_ALLOWED
    assert door.admit(PeerCredentials(pid=8, uid=1000, gid=1000), ("uid", 1000)) is None
    assert budget.open == 1
    assert door.refused() == {NOT_ALLOWED: 5, TOO_MANY: 0, SOURCE_FULL: 0, NO_HANDSHAKE: 0,
                              BROKEN: 0}
    assert [event for _, event, _ in log.lines] == ["zpipes connection refused: user not allowed"]
    door.set_policy(None)  # anyone may connect now
    assert door.admit(stranger, ("uid", 2000)) is None


def test_the_budget_never_passes_what_the_open_file_limit_leaves():
    from zbroker.zmtp.admission import fd_budget

    budget = ConnectionBudget()
    budget.set_limit(10 ** 9)
    assert budget.limit == fd_budget()
    budget.set_limit(5)
    assert budget.limit == 5


def test_one_source_holds_at_most_its_share_and_the_others_still_get_in():
    log = Log()
    budget = ConnectionBudget(limit=10)  # a share of half by default
    door = Admission("pzq producer", Refusals(log), budget=budget)
    attacker, user = ("host", "10.0.0.66"), ("uid", 1000)
    taken = [door.admit(None, attacker) for _ in range(8)]
    assert taken == [None] * 5 + [SOURCE_FULL] * 3
    for _ in range(5):
        assert door.admit(None, user) is None  # the rest of the budget is theirs
    assert door.admit(None, ("host", "10.0.0.7")) == TOO_MANY
    door.release(attacker)
    assert door.admit(None, attacker) is None and budget.by_source[attacker] == 5
    for _ in range(5):
        door.release(user)
    assert user not in budget.by_source and budget.open == 5
    assert log.lines[0][1] == "pzq producer connection refused: too many connections from one " \
        "source"
    assert log.lines[0][2]["source"] == "host 10.0.0.66"
    budget.set_limit(10, per_source=2)
    assert budget.per_source == 2
