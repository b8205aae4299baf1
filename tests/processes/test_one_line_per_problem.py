"""A broken config is said once, where it matters: the commands that only find the broker
through ``./zbroker.cfg`` (status, get, set, logs, top, stop, queue with a broker that
answers) say nothing of its errors outside the ``broker`` section, ``zbroker reload`` says
the broker's refusal once, ``zbroker check-config`` the error once. Real broker processes."""

from __future__ import annotations

import subprocess
import sys

from helpers import broker_env, endpoint_accepts, free_port, run_zbroker, wait_for

BROKEN = "log:\n  level: loud\n"
REASON = "log.level: got 'loud', expected one of: debug, info, warning, error"


def test_commands_that_only_find_the_broker_do_not_complain_of_the_rest(start_broker):
    b = start_broker(config={"log": {"level": "info"}})
    b.config_path.write_text(f"broker: {{name: {b.name}}}\n" + BROKEN)
    for args in (["status"], ["get", "log.level"], ["set", "log.level", "debug"],
                 ["logs", "-n", "1"], ["top", "--once"]):
        r = run_zbroker(args, cwd=b.dir)  # the broker found by ./zbroker.cfg's broker section
        assert r.returncode == 0, (args, r.stderr)
        assert r.stderr == "", (args, r.stderr)
    r = run_zbroker(["reload"], cwd=b.dir)
    assert r.returncode == 1
    assert r.stderr.splitlines() == [f"zbroker: reload refused: {b.config_path}: {REASON}"]
    r = run_zbroker(["check-config"], cwd=b.dir)  # the running broker's file, by its path
    assert r.returncode == 1
    assert r.stderr.splitlines() == [f"zbroker: {b.config_path.absolute()}: {REASON}"]
    r = run_zbroker(["stop"], cwd=b.dir)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert b.wait() == 0


def test_a_broken_broker_section_is_one_line(tmp_path):
    (tmp_path / "zbroker.cfg").write_text("broker:\n  name: 'no way'\n")
    for args in (["status"], ["reload"], ["check-config"]):
        r = run_zbroker(args, cwd=tmp_path)
        assert r.returncode == 1
        lines = r.stderr.splitlines()
        assert len(lines) == 1 and "broker.name: got 'no way'" in lines[0], (args, lines)


def test_queue_commands_need_the_rest_only_when_the_broker_does_not_answer(start_broker,
                                                                            tmp_path):
    receive = f"tcp://127.0.0.1:{free_port()}"
    config = {"services": {"pzq": {"enabled": True, "queues": {"jobs": {
        "receive_endpoint": receive, "send_endpoint": f"tcp://127.0.0.1:{free_port()}",
        "data_dir": str(tmp_path / "jobs")}}}}}
    b = start_broker(config=config)
    wait_for(lambda: endpoint_accepts(receive), 10, "the queue")
    b.config_path.write_text(f"broker: {{name: {b.name}}}\n" + BROKEN)

    def queue(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "zbroker", "queue", *args],
                              cwd=b.dir, env=broker_env(b.dir), input="one\n",
                              capture_output=True, text=True, timeout=30)

    r = queue("put", "jobs")  # the broker answers: it says where its queue is
    assert r.returncode == 0 and r.stderr == "", r.stderr
    r = queue("get", "jobs", "-t", "5")
    assert (r.returncode, r.stdout, r.stderr) == (0, "one\n", "")
    assert b.stop() == 0
    r = queue("put", "jobs")  # no broker: the config is what says where the queue is
    assert r.returncode == 1
    assert r.stderr.splitlines() == [f"zbroker queue: zbroker.cfg: {REASON}"]
