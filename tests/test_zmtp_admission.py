"""The door of every ZMTP endpoint, without sockets: one connection budget for the process,
who may connect over ipc, and refusals counted exactly but logged at a bounded rate."""

from __future__ import annotations

from zbroker.local_access import PeerCredentials, Policy
from zbroker.zmtp.admission import (
    BROKEN,
    NO_HANDSHAKE,
    NOT_ALLOWED,
    TOO_MANY,
    Admission,
    ConnectionBudget,
)
from zbroker.zmtp.refusals import Refusals


class Log:
    def __init__(self) -> None:
        self.lines: list[tuple[str, str, dict]] = []

    def warning(self, event: str, **fields) -> None:
        self.lines.append(("warning", event, fields))

    def info(self, event: str, **fields) -> None:
        self.lines.append(("info", event, fields))


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_refusals_are_counted_each_and_logged_once_a_second_with_what_was_held_back():
    log, clock = Log(), Clock()
    refusals = Refusals(log, clock=clock, queue="jobs")
    assert refusals.note(BROKEN, "refused", reason="junk")
    for _ in range(500):
        assert not refusals.note(BROKEN, "refused", reason="junk")
    assert refusals.note(NO_HANDSHAKE, "dropped", level="info")  # another kind: its own line
    clock.now += 0.99
    assert not refusals.note(BROKEN, "refused", reason="junk")
    clock.now += 0.02
    assert refusals.note(BROKEN, "refused", reason="junk")
    assert refusals.count(BROKEN) == 503 and refusals.count(NO_HANDSHAKE) == 1
    assert [(level, event) for level, event, _ in log.lines] == [
        ("warning", "refused"), ("info", "dropped"), ("warning", "refused")]
    assert log.lines[0][2] == {"queue": "jobs", "reason": "junk"}
    assert log.lines[2][2]["suppressed"] == 501


def test_one_budget_is_shared_by_every_endpoint_and_given_back():
    log = Log()
    budget = ConnectionBudget(limit=3)
    zpipes = Admission("zpipes", Refusals(log), budget=budget)
    pzq = Admission("pzq producer", Refusals(log), budget=budget)
    assert zpipes.admit(None, ipc=False) is None
    assert pzq.admit(None, ipc=False) is None
    assert pzq.admit(None, ipc=False) is None
    assert zpipes.admit(None, ipc=False) == TOO_MANY  # the others' connections count too
    assert zpipes.admit(None, ipc=False) == TOO_MANY
    assert budget.open == 3
    assert zpipes.refused()[TOO_MANY] == 2 and pzq.refused()[TOO_MANY] == 0
    pzq.release()
    assert zpipes.admit(None, ipc=False) is None
    assert budget.open == 3
    events = [event for _, event, _ in log.lines]
    assert events == ["zpipes connection refused: too many clients; newer connections are "
                      "hung up until some go", "zpipes takes connections again"]


def test_on_ipc_a_user_not_allowed_is_refused_and_logged_once_and_takes_no_place():
    log = Log()
    budget = ConnectionBudget(limit=10)
    door = Admission("zpipes", Refusals(log), Policy(frozenset({1000}), frozenset()),
                     budget=budget)
    stranger = PeerCredentials(pid=7, uid=2000, gid=2000)
    for _ in range(5):
        assert door.admit(stranger, ipc=True) == NOT_ALLOWED
    assert door.admit(PeerCredentials(pid=8, uid=1000, gid=1000), ipc=True) is None
    assert door.admit(None, ipc=True) == "gone"  # the kernel could not say who: it left
    assert budget.open == 1
    assert door.refused() == {NOT_ALLOWED: 5, TOO_MANY: 0, NO_HANDSHAKE: 0, BROKEN: 0}
    assert [event for _, event, _ in log.lines] == ["zpipes connection refused: user not allowed"]
    door.set_policy(None)  # anyone may connect now
    assert door.admit(stranger, ipc=True) is None


def test_the_budget_never_passes_what_the_open_file_limit_leaves():
    from zbroker.zmtp.admission import fd_budget

    budget = ConnectionBudget()
    budget.set_limit(10 ** 9)
    assert budget.limit == fd_budget()
    budget.set_limit(5)
    assert budget.limit == 5
