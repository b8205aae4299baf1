"""``zbroker queue put|get`` as real processes against a real broker hosting pzq queues: a stream
queue read from the shell (ordered, committed after printing, at-least-once) and the errors."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import zmq
from helpers import broker_env, endpoint_accepts, free_port, wait_for, write_config

from pzq.client import StreamConsumer, monitor
from zbroker.services.pzq.service import default_monitor_endpoint


def queue_config(tmp_path: Path) -> dict:
    """A broker config with one stream queue ("events") and one push queue ("jobs")."""
    def endpoints(name: str) -> dict:
        return {"receive_endpoint": f"tcp://127.0.0.1:{free_port()}",
                "send_endpoint": f"tcp://127.0.0.1:{free_port()}",
                "data_dir": str(tmp_path / f"data-{name}")}

    return {"services": {"pzq": {
        "enabled": True,
        "defaults": {"ack_timeout": 0.4, "reaper_frequency": 0.05},
        "queues": {
            "events": {**endpoints("events"), "mode": "stream",
                       "stream_endpoint": f"tcp://127.0.0.1:{free_port()}"},
            "jobs": endpoints("jobs"),
        },
    }}}


class Shell:
    """Runs ``zbroker queue ...`` for one broker (its config, its run directory)."""

    def __init__(self, broker, config: dict):
        self.broker = broker
        self.config = config
        self.env = broker_env(broker.dir)

    def queue(self, name: str) -> dict:
        return self.config["services"]["pzq"]["queues"][name]

    def argv(self, *args: str, broker: bool = True) -> list[str]:
        extra = ["--broker", self.broker.name] if broker else []
        return [sys.executable, "-m", "zbroker", "queue", *args, "--config",
                str(self.broker.config_path), *extra]

    def run(self, *args: str, stdin: bytes = b"", broker: bool = True, stdout=subprocess.PIPE,
            timeout: float = 30) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(self.argv(*args, broker=broker), input=stdin, stdout=stdout,
                              stderr=subprocess.PIPE, env=self.env, timeout=timeout)

    def put(self, queue: str, lines: list[bytes]) -> None:
        r = self.run("put", queue, stdin=b"".join(line + b"\n" for line in lines))
        assert r.returncode == 0, r.stderr

    def offsets(self) -> tuple[int, int]:
        with StreamConsumer(self.queue("events")["stream_endpoint"], timeout=5) as s:
            return s.offsets()


@pytest.fixture
def shell(start_broker, tmp_path) -> Shell:
    cfg = queue_config(tmp_path)
    b = start_broker(config=cfg)
    sh = Shell(b, cfg)
    for q in cfg["services"]["pzq"]["queues"].values():
        for key in ("receive_endpoint", "stream_endpoint"):
            if key in q:
                def up(e=q[key]) -> bool:
                    assert b.alive(), f"the broker died: {b.stderr()[-2000:]}"
                    return endpoint_accepts(e)

                wait_for(up, 30, f"pzq {key}")
    return sh


def lines(n: int, start: int = 0) -> list[bytes]:
    return [b"event %d" % i for i in range(start, start + n)]


def test_stream_get_prints_in_order_then_nothing_once_committed(shell):
    shell.put("events", lines(50))
    r = shell.run("get", "events", "--count", "0", "--timeout", "0")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == lines(50)
    assert shell.offsets() == (50, 50)  # printed means committed
    r = shell.run("get", "events", "--count", "0", "--timeout", "0.2")
    assert (r.returncode, r.stdout) == (0, b""), r  # all there is: nothing, as cat says it
    assert r.stderr == b"zbroker queue: queue 'events' had no message to get\n"
    r = shell.run("get", "events", "--count", "2", "--timeout", "0.2")
    assert (r.returncode, r.stdout) == (1, b""), r
    assert b"none of the 2 messages came within 0.2s" in r.stderr
    shell.put("events", lines(2, start=50))
    r = shell.run("get", "events", "-n", "0", "-t", "0")
    assert r.returncode == 0 and r.stdout.splitlines() == lines(2, start=50), r


def test_stream_get_by_count_goes_on_without_loss_or_duplicates(shell):
    shell.put("events", lines(10))
    got = []
    for _ in range(3):
        r = shell.run("get", "events", "--count", "3", "--timeout", "2")
        assert r.returncode == 0, r.stderr
        assert len(r.stdout.splitlines()) == 3
        got += r.stdout.splitlines()
    assert shell.offsets() == (10, 9)
    r = shell.run("get", "events", "--count", "3", "--timeout", "0.2")  # only one is left
    assert r.returncode == 1 and b"only 1 of the 3 messages came" in r.stderr, r
    got += r.stdout.splitlines()
    assert got == lines(10)
    assert shell.offsets() == (10, 10)


def test_stream_get_waits_for_messages(shell):
    mon = default_monitor_endpoint(shell.broker.run_dir / "pzq", shell.broker.name, "events")
    asked = monitor(mon)["stream_requests"]
    started = time.monotonic()
    get = subprocess.Popen(shell.argv("get", "events", "--count", "2", "--timeout", "10"),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=shell.env)
    try:
        # the get is up and finds nothing: its offset, then a RANGE empty, and it asks again
        wait_for(lambda: monitor(mon)["stream_requests"] >= asked + 3, 10,
                 "the get's requests")
        assert get.poll() is None
        shell.put("events", lines(2))
        out, err = get.communicate(timeout=10)
    finally:
        get.kill()
        get.wait()
    assert get.returncode == 0, err
    assert out.splitlines() == lines(2)
    assert time.monotonic() - started < 8  # not at the end of --timeout


def test_stream_peek_does_not_commit(shell):
    shell.put("events", lines(8))
    r = shell.run("get", "events", "-n", "0", "-t", "0", "--no-commit")
    assert r.returncode == 0 and r.stdout.splitlines() == lines(8), r
    r = shell.run("get", "events", "-n", "2", "--from-offset", "5")
    assert r.returncode == 0 and r.stdout.splitlines() == lines(2, start=5), r
    r = shell.run("get", "events", "-n", "0", "-t", "0", "--from-offset", "100")
    assert r.returncode == 0 and r.stdout == b"", r  # all there is past 100: nothing
    assert shell.offsets() == (8, 0)
    r = shell.run("get", "events", "-n", "0", "-t", "0")
    assert r.returncode == 0 and r.stdout.splitlines() == lines(8), r


def test_stream_get_that_cannot_print_commits_nothing(shell):
    shell.put("events", lines(5))
    with open("/dev/full", "wb") as full:  # every write fails: ENOSPC
        r = shell.run("get", "events", "-n", "0", "-t", "0", stdout=full)
    assert r.returncode == 1 and b"cannot write to standard output" in r.stderr, r
    assert shell.offsets() == (5, 0)
    r = shell.run("get", "events", "-n", "0", "-t", "0")
    assert r.returncode == 0 and r.stdout.splitlines() == lines(5), r


def test_interrupted_stream_get_loses_nothing(shell):
    shell.put("events", lines(5))
    # (a get that does not stop at SIGINT prints where it is, as SIGABRT makes faulthandler do)
    get = subprocess.Popen(shell.argv("get", "events", "--count", "0", "--timeout", "30"),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           env={**shell.env, "PYTHONFAULTHANDLER": "1"})
    try:
        printed = [get.stdout.readline().rstrip(b"\n") for _ in range(5)]
        assert printed == lines(5)
        wait_for(lambda: shell.offsets()[1] == 5, 5, "the printed batch to be committed")
        get.send_signal(signal.SIGINT)  # while it waits for more
        try:
            out, err = get.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            get.send_signal(signal.SIGABRT)
            out, err = get.communicate(timeout=10)
            raise AssertionError(f"no exit within 10 s of SIGINT; where it was: {err!r}") from None
    finally:
        get.kill()
        get.wait()
    assert get.returncode == 130 and b"interrupted" in err, err
    shell.put("events", lines(3, start=5))
    r = shell.run("get", "events", "-n", "0", "-t", "0")
    assert r.returncode == 0 and r.stdout.splitlines() == lines(3, start=5), r


def test_the_running_broker_says_where_the_queue_is(shell):
    """The broker's status wins over a config edited since it started; without an answer
    from the broker the config is used, and its error says the broker is not running."""
    shell.put("events", lines(3))
    edited = queue_config(shell.broker.dir)  # other ports, nothing listens there
    write_config(shell.broker.config_path, edited)
    r = shell.run("get", "events", "-n", "0", "-t", "0")
    assert r.returncode == 0 and r.stdout.splitlines() == lines(3), r
    started = time.monotonic()
    r = shell.run("get", "events", "-n", "0", "-t", "1", broker=False)  # broker "local"
    assert r.returncode == 1, r
    assert b"no answer from the stream endpoint" in r.stderr, r.stderr
    assert b"no broker named 'local' is running" in r.stderr, r.stderr
    assert time.monotonic() - started < 8


def test_push_queue_still_works_through_the_broker(shell):
    shell.put("jobs", [b"first", b"second"])
    r = shell.run("get", "jobs", "--count", "2", "--timeout", "5")
    assert r.returncode == 0 and r.stdout == b"first\nsecond\n", r
    r = shell.run("get", "jobs", "--no-commit")
    assert r.returncode == 2 and b"push queue" in r.stderr, r


def test_errors(shell):
    r = shell.run("get", "nosuch", "-t", "1")
    assert r.returncode == 1 and b"has no queue 'nosuch' (queues: events, jobs)" in r.stderr, r
    r = shell.run("get", "nosuch", "-t", "1", broker=False)  # from the config
    assert r.returncode == 1 and b"no queue 'nosuch' in the config" in r.stderr, r
    r = shell.run("put", "nosuch")
    assert r.returncode == 1 and b"no queue 'nosuch'" in r.stderr, r
    for bad in (["--count", "-1"], ["--timeout", "soon"], ["--from-offset", "-3"]):
        r = shell.run("get", "events", *bad)
        assert r.returncode == 2 and b"expected" in r.stderr, (bad, r)
    started = time.monotonic()
    dead = f"tcp://127.0.0.1:{free_port()}"
    r = shell.run("get", "events", "--stream", dead, "-t", "1")
    assert r.returncode == 1 and f"no answer from the stream endpoint {dead}".encode() \
        in r.stderr, r
    assert time.monotonic() - started < 8


def test_help_explains_stream_queues(shell):
    r = shell.run("get", "--help", broker=False)
    assert r.returncode == 0
    for text in (b"--no-commit", b"--from-offset", b"at-least-once", b"exit status"):
        assert text in r.stdout, text


def test_get_uses_the_credit_endpoint_past_a_stuck_consumer(start_broker, tmp_path):
    cfg = queue_config(tmp_path)
    jobs = cfg["services"]["pzq"]["queues"]["jobs"]
    jobs.update(credit_endpoint=f"tcp://127.0.0.1:{free_port()}", ack_timeout=60)
    sh = Shell(start_broker(config=cfg), cfg)
    wait_for(lambda: endpoint_accepts(jobs["credit_endpoint"]), 10, "the credit endpoint")
    ctx = zmq.Context()
    stuck = ctx.socket(zmq.DEALER)  # an original-style consumer that stops reading
    stuck.connect(jobs["send_endpoint"])
    try:
        sh.put("jobs", [b"job %d" % i for i in range(100)])
        # the stuck one takes the send endpoint's whole share (32); a get through the send
        # endpoint could not have more than the rest of that shared cap
        r = sh.run("get", "jobs", "-n", "60", "-t", "5")
        assert r.returncode == 0, r.stderr
        assert len(r.stdout.splitlines()) == 60 == len(set(r.stdout.splitlines()))
    finally:
        stuck.close(linger=0)
        ctx.term()


# --- reader groups -----------------------------------------------------------------------------


def group_list(shell: Shell, queue: str = "events") -> dict:
    r = shell.run("group", "list", queue, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def committed(shell: Shell, group: str) -> int:
    with StreamConsumer(shell.queue("events")["stream_endpoint"], timeout=5) as s:
        return s.groups()[group]


def test_two_groups_each_read_every_message_and_commit_only_their_own(shell):
    assert group_list(shell) == {"queue": "events", "head": 0, "groups": {}}  # none yet
    for group in ("a", "b"):  # made before the messages come: each will see all of them
        r = shell.run("group", "create", "events", group)
        assert (r.returncode, r.stdout, r.stderr) == (0, b"", b""), r
    shell.put("events", lines(20))
    r = shell.run("get", "events", "-n", "0", "-t", "0", "--group", "a")
    assert r.returncode == 0 and r.stdout.splitlines() == lines(20), r
    assert r.stderr == b""  # nothing lost, nothing to say
    r = shell.run("get", "events", "-n", "5", "-t", "2", "--group", "b")
    assert r.returncode == 0 and r.stdout.splitlines() == lines(5), r
    assert (committed(shell, "a"), committed(shell, "b")) == (20, 5)  # b did not move a

    shell.put("events", lines(3, start=20))
    r = shell.run("get", "events", "-n", "0", "-t", "0", "--group", "a")
    assert r.returncode == 0 and r.stdout.splitlines() == lines(3, start=20), r
    r = shell.run("get", "events", "-n", "0", "-t", "0", "-g", "b", "--no-commit")
    assert r.returncode == 0 and r.stdout.splitlines() == lines(18, start=5), r
    r = shell.run("group", "create", "events", "b")  # there already: nothing changes
    assert r.returncode == 0, r
    assert group_list(shell) == {"queue": "events", "head": 23, "groups": {
        "a": {"committed": 23, "lag": 0}, "b": {"committed": 5, "lag": 18}}}
    r = shell.run("group", "list", "events", "--json", broker=False)  # no broker: the config
    assert r.returncode == 0 and json.loads(r.stdout)["groups"]["b"] == {
        "committed": 5, "lag": 18}, r
    r = shell.run("group", "list", "events")  # for people: a table
    assert r.returncode == 0, r.stderr
    assert [line.split() for line in r.stdout.decode().splitlines()] == [
        ["GROUP", "COMMITTED", "LAG"], ["a", "23", "0"], ["b", "5", "18"]]

    r = shell.run("group", "delete", "events", "b")
    assert (r.returncode, r.stdout, r.stderr) == (0, b"", b""), r
    assert set(group_list(shell)["groups"]) == {"a"}
    r = shell.run("group", "delete", "events", "b")  # gone already
    assert r.returncode == 1, r
    assert r.stderr.decode().splitlines()[0].startswith(
        "zbroker queue: cannot delete group 'b' of queue 'events': no group 'b' on this queue")
    # b held offsets 5..22 for itself: gone with it. A group made now starts at the oldest
    # message the queue holds, past what a committed: it has nothing to read.
    r = shell.run("get", "events", "-n", "0", "-t", "0", "--group", "b")
    assert (r.returncode, r.stdout) == (0, b""), r
    assert b"had no message to get" in r.stderr
    assert (committed(shell, "a"), committed(shell, "b")) == (23, 23)
    shell.put("events", lines(1, start=23))
    for group in ("a", "b"):
        r = shell.run("get", "events", "-n", "0", "-t", "0", "--group", group)
        assert r.returncode == 0 and r.stdout == b"event 23\n", r


def test_group_errors_are_one_line(shell):
    for args in (["get", "events", "--group", ""], ["get", "events", "--group", "a b"],
                 ["get", "events", "--group", "x" * 256],
                 ["group", "delete", "events", "é"], ["group", "create", "events", "a:b"]):
        r = shell.run(*args)
        assert r.returncode == 2, (args, r)
        err = r.stderr.decode()
        assert "Traceback" not in err and "bad group name" in err.splitlines()[-1], (args, err)
    assert group_list(shell)["groups"] == {}  # no group was made
    r = shell.run("get", "jobs", "--group", "a")
    assert r.returncode == 2 and b"push queue" in r.stderr and b"--group" in r.stderr, r
    r = shell.run("group", "list", "jobs")
    assert r.returncode == 2, r
    assert r.stderr.decode().splitlines() == [
        "zbroker queue: queue 'jobs' is a push queue: reader groups are for stream queues "
        "(mode: stream)"]
    r = shell.run("group", "list", "nosuch")
    assert r.returncode == 1 and b"has no queue 'nosuch'" in r.stderr, r
    r = shell.run("group", "delete", "events", "nosuch")
    assert r.returncode == 1 and b"no group 'nosuch'" in r.stderr, r
    dead = f"tcp://127.0.0.1:{free_port()}"
    r = shell.run("group", "list", "events", "--stream", dead, "-t", "1")
    assert r.returncode == 1 and f"no answer from the stream endpoint {dead}".encode() \
        in r.stderr, r
    with open("/dev/full", "wb") as full:  # every write fails: ENOSPC
        r = shell.run("group", "list", "events", stdout=full)
    assert r.returncode == 1, r
    assert r.stderr.decode().splitlines() == [
        "zbroker queue: cannot write to standard output: No space left on device"]
    r = shell.run("group", "--help", broker=False)
    assert r.returncode == 0
    for text in (b"create", b"list", b"delete", b"lag", b"exit status", b"--group"):
        assert text in r.stdout, text
    r = shell.run("get", "--help", broker=False)
    assert b"reader groups" in r.stdout and b"--group" in r.stdout


def test_a_group_behind_retention_is_told_which_offsets_it_lost(start_broker, tmp_path):
    cfg = queue_config(tmp_path)
    events = cfg["services"]["pzq"]["queues"]["events"]
    events["retention_bytes"] = 2000  # about 40 of the messages below
    events["monitor_endpoint"] = f"ipc://{tmp_path}/events.monitor"
    sh = Shell(start_broker(config=cfg), cfg)
    wait_for(lambda: endpoint_accepts(events["stream_endpoint"]), 10, "the stream endpoint")
    r = sh.run("group", "create", "events", "slow")  # made, at 0
    assert r.returncode == 0, r
    sh.put("events", lines(200))
    # every drop done: the backlog is within the limit (so the offsets lost stay put)
    wait_for(lambda: monitor(events["monitor_endpoint"])["backlog_bytes"] <= 2000, 10,
             "retention to drop the oldest")
    r = sh.run("get", "events", "-n", "0", "-t", "0", "--group", "slow")
    assert r.returncode == 0, r
    told = re.fullmatch(r"zbroker queue: group 'slow' lost offsets 0 to (\d+) of queue 'events': "
                        r"the queue's retention limits dropped them before the group committed "
                        r"them\n", r.stderr.decode())
    assert told, r.stderr  # one line, naming the offsets
    lost_to = int(told.group(1)) + 1
    assert 0 < lost_to < 200
    assert r.stdout.splitlines() == lines(200)[lost_to:]  # all the rest, none skipped
    sh.put("events", lines(1, start=200))
    r = sh.run("get", "events", "-n", "0", "-t", "0", "--group", "slow")  # told once: done
    assert (r.returncode, r.stdout, r.stderr) == (0, b"event 200\n", b""), r


def test_a_broker_without_queues_says_how_to_enable_them(start_broker, tmp_path):
    b = start_broker()  # the embedded defaults: ZPIPES only, as the README's broker
    shell = Shell(b, {})
    r = shell.run("put", "jobs", stdin=b"a\n")
    assert r.returncode == 1
    assert r.stderr.decode().splitlines() == [
        f"zbroker queue: broker {b.name!r} has no queue 'jobs': services.pzq is not enabled; "
        "set services.pzq.enabled: true and its queues in the broker's config, or run the "
        "broker with the queues of the examples (jobs, events): "
        f"zbroker {b.name} --config config/queues.cfg (see docs/pzq.md)"]
    assert b.stop() == 0
    r = shell.run("put", "jobs", stdin=b"a\n")  # no broker: its config says the same
    assert r.returncode == 1
    line, = r.stderr.decode().splitlines()
    assert line.startswith(f"zbroker queue: no broker named {b.name!r} is running")
    assert line.endswith("and its config does not enable services.pzq: set "
                         "services.pzq.enabled: true and its queues in the broker's config, "
                         "or run the broker with the queues of the examples (jobs, events): "
                         f"zbroker {b.name} --config config/queues.cfg (see docs/pzq.md)")
