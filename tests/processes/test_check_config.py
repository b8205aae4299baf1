"""`zbroker check-config` runs the checks the broker's start runs (zbroker.config_checks):
a config the start refuses is refused by check-config with the same lines, and a config
check-config passes starts. Real broker processes; every config is a file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import broker_env, free_port, run_zbroker, unique_name, write_config

KEY = "zbroker: "


def queue(tmp_path: Path, name: str, **kw: object) -> dict[str, object]:
    """A queue on free loopback ports, its data in the test's folder."""
    return {"receive_endpoint": f"tcp://127.0.0.1:{free_port()}",
            "send_endpoint": f"tcp://127.0.0.1:{free_port()}",
            "data_dir": str(tmp_path / f"data-{name}"), **kw}


def pzq(**queues: dict[str, object]) -> dict[str, object]:
    return {"services": {"pzq": {"enabled": True, "queues": queues}}}


def refused_configs(tmp_path: Path) -> dict[str, tuple[dict[str, object], list[str]]]:
    """name -> (config, pieces of the one line of each problem, in order)."""
    port = free_port()
    run_dir = tmp_path / "run"
    a_file = tmp_path / "a-file"
    a_file.write_text("not a folder\n")
    shared = f"tcp://127.0.0.1:{free_port()}"
    return {
        # the issue's case: two queues on the defaults' endpoints
        "two queues on the default endpoints": (
            {"services": {"pzq": {"enabled": True, "queues": {
                "jobs": {"data_dir": str(tmp_path / "jobs")},
                "events": {"mode": "stream", "data_dir": str(tmp_path / "events")}}}}},
            ["services.pzq.defaults.receive_endpoint (queue 'jobs') and "
             "services.pzq.defaults.receive_endpoint (queue 'events') both use "
             "tcp://127.0.0.1:11131",
             "services.pzq.defaults.send_endpoint (queue 'jobs') and "
             "services.pzq.defaults.send_endpoint (queue 'events') both use "
             "tcp://127.0.0.1:11132"]),
        "a queue's endpoint is another queue's": (
            pzq(a=queue(tmp_path, "a", send_endpoint=shared),
                b=queue(tmp_path, "b", credit_endpoint=shared)),
            ["services.pzq.queues.a.send_endpoint and services.pzq.queues.b.credit_endpoint "
             f"both use {shared}"]),
        "ZPIPES and the cluster on one port": (
            {"services": {"zpipes": {"endpoint": f"tcp://127.0.0.1:{port}"}},
             "cluster": {"enabled": True, "insecure": True, "discovery": False,
                         "bind": f"tcp://*:{port}"}},
            [f"services.zpipes.endpoint (tcp://127.0.0.1:{port}) and cluster.bind "
             f"(tcp://*:{port}) both use port {port}"]),
        "metrics on a queue's port": (
            {**pzq(q=queue(tmp_path, "q", receive_endpoint=f"tcp://127.0.0.1:{port}")),
             "metrics": {"bind": port}},
            [f"services.pzq.queues.q.receive_endpoint and metrics.bind both use "
             f"tcp://127.0.0.1:{port}"]),
        "a monitor on the control socket": (
            {"broker": {"run_dir": str(run_dir)},
             **pzq(q=queue(tmp_path, "q", monitor_endpoint=f"ipc://{run_dir}/ctl"))},
            [f"broker.run_dir (its control socket) and services.pzq.queues.q.monitor_endpoint "
             f"both use ipc://{run_dir}/ctl"]),
        "two queues on one data_dir": (
            pzq(a=queue(tmp_path, "a", data_dir=str(tmp_path / "d")),
                b=queue(tmp_path, "b", data_dir=str(tmp_path / "d"))),
            ["services.pzq.queues.a.data_dir and services.pzq.queues.b.data_dir both use "
             f"{tmp_path / 'd'}"]),
        "a run directory that cannot be made": (
            {"broker": {"run_dir": str(a_file / "run")}},
            [f"broker.run_dir: cannot create '{a_file / 'run'}': '{a_file}' is not a "
             "directory"]),
        "a data_dir that cannot be made": (
            pzq(q=queue(tmp_path, "q", data_dir=str(a_file / "q"))),
            [f"services.pzq.queues.q.data_dir: cannot create '{a_file / 'q'}'"]),
        "replicas without peers": (
            pzq(q=queue(tmp_path, "q", replicas=1)),
            ["services.pzq.queues.q.replicas: 1 needs a cluster (cluster.enabled: true) or "
             "static peers"]),
        "retention on a push queue": (
            pzq(q=queue(tmp_path, "q", retention_bytes="1MiB")),
            ["services.pzq: queue 'q': retention_bytes and retention_seconds are for stream "
             "queues"]),
        "an endpoint with no port": (
            {"services": {"zpipes": {"endpoint": "tcp://127.0.0.1:http"}}},
            ["services.zpipes.endpoint: 'tcp://127.0.0.1:http': 'http' is not a port"]),
        "an ipc socket in no folder": (
            {"services": {"zpipes": {"endpoint": f"ipc://{tmp_path}/nothing/here.sock"}}},
            [f"services.zpipes.endpoint: cannot bind ipc://{tmp_path}/nothing/here.sock: "
             f"there is no folder '{tmp_path}/nothing'"]),
        "a log folder that is not there, and a clash": (
            {"log": {"file": str(tmp_path / "no" / "broker.log")},
             "metrics": {"bind": port},
             **pzq(q=queue(tmp_path, "q", send_endpoint=f"tcp://127.0.0.1:{port}"))},
            [f"log.file: cannot open log file '{tmp_path / 'no' / 'broker.log'}': there is no "
             f"folder '{tmp_path / 'no'}'",
             f"services.pzq.queues.q.send_endpoint and metrics.bind both use "
             f"tcp://127.0.0.1:{port}"]),
        "a cluster key file that is not there": (
            {"cluster": {"enabled": True, "discovery": False, "bind": "tcp://127.0.0.1:*",
                         "key_file": str(tmp_path / "no.key")}},
            [f"cluster.key_file: cannot read cluster key file {tmp_path / 'no.key'}"]),
    }


CASES = ["two queues on the default endpoints", "a queue's endpoint is another queue's",
         "ZPIPES and the cluster on one port", "metrics on a queue's port",
         "a monitor on the control socket", "two queues on one data_dir",
         "a run directory that cannot be made", "a data_dir that cannot be made",
         "replicas without peers", "retention on a push queue", "an endpoint with no port",
         "an ipc socket in no folder", "a log folder that is not there, and a clash",
         "a cluster key file that is not there"]


def problem_lines(stderr: str, prefix: str) -> list[str]:
    lines = stderr.splitlines()
    assert all(line.startswith(prefix) for line in lines), stderr
    return [line[len(prefix):] for line in lines]


@pytest.mark.parametrize("case", CASES)
def test_a_config_start_refuses_check_config_refuses_with_the_same_lines(start_broker,
                                                                          tmp_path, case):
    config, pieces = refused_configs(tmp_path)[case]
    b = start_broker(config=config, wait=False)
    assert b.wait() == 1
    started = problem_lines(b.stderr(), KEY)
    checked = run_zbroker(["check-config", str(b.config_path)], cwd=tmp_path)
    assert checked.returncode == 1 and checked.stdout == ""
    assert problem_lines(checked.stderr, f"{KEY}{b.config_path}: ") == started
    assert len(started) == len(pieces), started  # one line a problem
    for line, piece in zip(started, pieces, strict=True):
        assert piece in line, (piece, started)
    assert "Traceback" not in b.stderr()
    assert not (b.dir / "zbroker" / b.name).exists()  # refused before anything was made


def test_a_config_check_config_passes_starts(start_broker, tmp_path):
    port = free_port()
    config = {**pzq(jobs=queue(tmp_path, "jobs"),
                    events=queue(tmp_path, "events", mode="stream",
                                 stream_endpoint=f"tcp://127.0.0.1:{free_port()}")),
              "metrics": {"bind": f"127.0.0.1:{port}"},
              "cluster": {"enabled": True, "insecure": True, "discovery": False,
                          "bind": f"tcp://127.0.0.1:{free_port()}"},
              "log": {"file": str(tmp_path / "broker.log")}}
    path = tmp_path / "good.cfg"
    path.write_text(yaml.safe_dump(config))
    checked = run_zbroker(["check-config", str(path)], cwd=tmp_path)
    assert checked.returncode == 0 and checked.stdout == f"{path}: OK\n", checked
    b = start_broker(name=unique_name(), config=config)
    assert b.stop() == 0


def test_a_key_that_moved_passes_and_is_told_its_new_name(start_broker, tmp_path):
    """check-config and the broker's start both say the new name of a moved key, and the
    broker runs with its value there."""
    config = {"clients": {"timeout": 7, "max_clients": 500}}
    path = write_config(tmp_path / "old.cfg", config)
    checked = run_zbroker(["check-config", str(path)], cwd=tmp_path)
    assert checked.returncode == 0 and checked.stdout == f"{path}: OK\n", checked
    assert checked.stderr == (f"zbroker: {path}: note: clients.timeout is now "
                              "services.zpipes.client_timeout (the old name works for now)\n")
    b = start_broker(name=unique_name(), config=config)
    assert "config key moved" in b.stderr() and "services.zpipes.client_timeout" in b.stderr()
    got = run_zbroker(["get", "services.zpipes.client_timeout", b.name], cwd=b.dir)
    assert got.stdout == "7.0\n", got


def test_a_duplicated_queue_name_is_one_line_naming_it(tmp_path):
    path = tmp_path / "twice.cfg"
    path.write_text("services:\n  pzq:\n    enabled: true\n    queues:\n"
                    "      jobs: {}\n      jobs: {mode: stream}\n")
    r = run_zbroker(["check-config", str(path)], cwd=tmp_path)
    assert r.returncode == 1
    assert r.stderr.splitlines() == [f"zbroker: {path}: line 6, column 7: not valid YAML: "
                                     "duplicate key 'jobs'"]


def test_reload_refuses_a_config_that_would_not_start(start_broker, tmp_path):
    jobs = queue(tmp_path, "jobs")
    b = start_broker(config=pzq(jobs=jobs))
    clashing = pzq(jobs=jobs, events=queue(tmp_path, "events",
                                           receive_endpoint=jobs["receive_endpoint"]))
    b.config_path.write_text(yaml.safe_dump(clashing, sort_keys=False))
    r = run_zbroker(["reload", b.name], cwd=b.dir)
    assert r.returncode == 1
    assert r.stderr.splitlines() == [
        "zbroker: reload refused: services.pzq.queues.jobs.receive_endpoint and "
        "services.pzq.queues.events.receive_endpoint both use "
        f"{jobs['receive_endpoint']}: give each its own"]
    assert b.alive()
    assert b.stop() == 0


def test_without_a_file_the_running_brokers_config_is_checked(start_broker, tmp_path):
    """With no FILE, check-config checked the file a broker started here would read (or
    said "no config file found") beside a running broker started with --config: it checks
    the file the running broker that the management commands find uses."""
    b = start_broker(config={"log": {"level": "info"}})
    status = json.loads(run_zbroker(["status", b.name, "--json"], cwd=b.dir).stdout)
    here = tmp_path / "here"  # its zbroker.cfg only names the broker, as an operator's would
    here.mkdir()
    (here / "zbroker.cfg").write_text(yaml.safe_dump(
        {"broker": {"name": b.name, "run_dir": status["run_dir"]}, "log": {"levle": 1}}))
    r = run_zbroker(["check-config"], cwd=here)
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"{status['config']}: OK (the config of the running broker " \
                       f"{b.name!r})\n", r.stdout
    assert Path(status["config"]).is_absolute()
    b.stop()
    r = run_zbroker(["check-config"], cwd=here)  # none runs: the file here, and its error
    assert r.returncode == 1 and "log.levle" in r.stderr, r


def test_every_problem_of_a_file_is_reported_at_once(tmp_path):
    path = write_config(tmp_path / "bad.cfg", {
        "log": {"levle": "debug"}, "clients": {"timeout": "soon"},
        "cluster": {"peer_timeout": -1}})
    r = run_zbroker(["check-config", str(path)], cwd=tmp_path)
    assert r.returncode == 1
    lines = r.stderr.splitlines()
    assert len(lines) == 3, r.stderr
    assert any("log.levle" in line for line in lines)
    assert any("clients.timeout" in line for line in lines)
    assert any("cluster.peer_timeout" in line for line in lines)


def test_the_open_file_check_counts_what_the_queues_hold_beside_the_clients(tmp_path):
    """2 000 queues took 10 023 descriptors, yet the default max_clients (10 000) passed the
    check at a limit of 20 000: the check counted the clients and a reserve only."""
    import resource

    queues = {f"q{i}": {"receive_endpoint": f"tcp://127.0.0.1:{20_000 + 2 * i}",
                        "send_endpoint": f"tcp://127.0.0.1:{20_001 + 2 * i}",
                        "data_dir": str(tmp_path / f"q{i}")} for i in range(400)}
    cfg = write_config(tmp_path / "zbroker.cfg", {
        "clients": {"max_clients": 1000},
        "services": {"pzq": {"enabled": True, "queues": queues}}})

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (4096, 4096))

    r = subprocess.run([sys.executable, "-m", "zbroker", "check-config", str(cfg)],
                       cwd=tmp_path, env=broker_env(tmp_path), capture_output=True, text=True,
                       timeout=60, preexec_fn=limit)
    # 1 000 clients + 400 queues x 5 + the control socket's 129 + the reserve 256 = 3 385
    assert r.returncode == 0, r.stderr
    cfg = write_config(tmp_path / "zbroker.cfg", {
        "clients": {"max_clients": 2000},
        "services": {"pzq": {"enabled": True, "queues": queues}}})
    r = subprocess.run([sys.executable, "-m", "zbroker", "check-config", str(cfg)],
                       cwd=tmp_path, env=broker_env(tmp_path), capture_output=True, text=True,
                       timeout=60, preexec_fn=limit)
    assert r.returncode == 1
    assert ("clients.max_clients (2000) does not fit in the open-file limit (4096) beside the "
            "2385 descriptors the rest of the config holds (the control socket's connections "
            "129; 400 queues' sockets and files 2000; a reserve for the broker's own files "
            "256): set clients.max_clients to at most 1711") in r.stderr, r.stderr
