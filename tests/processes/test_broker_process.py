"""The broker as a real process: start, stop on signals, refuse to start, reload on SIGHUP."""

from __future__ import annotations

import json
import signal
import stat
from pathlib import Path

import pytest
from helpers import endpoint_accepts, run_zbroker, spawn_broker, wait_for, write_config


def _log_events(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _wait_for_event(path: Path, event: str, after: int = 0, timeout: float = 10.0) -> dict:
    """The first log event named ``event`` after the first ``after`` events of the file."""
    def find() -> dict | None:
        return next((e for e in _log_events(path)[after:] if e["event"] == event), None)

    return wait_for(find, timeout, f"log event {event!r} in {path}")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_the_broker_cleanly(broker, signum):
    assert endpoint_accepts(broker.endpoint)
    assert broker.stop(signum, timeout=5) == 0
    out = broker.stderr()
    assert "broker started" in out and "broker stopped" in out
    assert "Traceback" not in out
    assert not endpoint_accepts(broker.endpoint)


def test_started_line_names_broker_services_and_endpoint(broker):
    broker.stop()
    started = next(line for line in broker.stderr().splitlines() if "broker started" in line)
    assert broker.name in started
    assert "zpipes" in started
    assert broker.endpoint in started
    assert f"pid={broker.pid}" in started


def test_second_broker_with_the_same_name_fails_clearly(broker, tmp_path):
    # its own directory: sharing the first one's stderr file would mix their lines
    second = spawn_broker(tmp_path / "second", name=broker.name)
    assert second.wait() == 1
    err = second.stderr().strip()
    assert err.startswith("zbroker: "), err
    assert len(err.splitlines()) == 1, err
    assert broker.name in err
    assert "Traceback" not in err
    # the first one is unharmed
    assert broker.alive() and endpoint_accepts(broker.endpoint)
    assert broker.run_dir.is_dir()
    assert broker.stop() == 0


def test_run_dir_is_private_and_removed_after_stop(broker):
    run_dir = broker.run_dir
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE((run_dir / "zpipes").stat().st_mode) == 0o700
    assert broker.stop() == 0
    assert not run_dir.exists()


@pytest.mark.parametrize("config, fragments", [
    ({"clients": {"timeout": -1}}, ["clients.timeout", "-1", "seconds > 0"]),
    ({"log": {"levle": "debug"}}, ["log.levle", "did you mean 'level'"]),
    ("log: [unclosed\n", ["not valid YAML", "line 2"]),
])
def test_bad_config_file_fails_naming_the_key(start_broker, config, fragments):
    b = start_broker(config=config, wait=False)
    assert b.wait() == 1
    err = b.stderr().strip()
    assert err.startswith("zbroker: "), err
    assert str(b.config_path) in err
    for fragment in fragments:
        assert fragment in err
    assert "Traceback" not in err


def test_unopenable_log_file_fails(start_broker, tmp_path):
    b = start_broker(config={"log": {"file": str(tmp_path / "no" / "such" / "dir.log")}},
                     wait=False)
    assert b.wait() == 1
    assert b.stderr().startswith("zbroker: log.file: cannot open log file")
    assert "there is no folder" in b.stderr()


def test_help_explains_endpoint_and_stopping(tmp_path):
    result = run_zbroker(["--help"], cwd=tmp_path)
    assert result.returncode == 0
    assert "ipc://@/zpipes/NAME" in result.stdout
    assert "SIGTERM" in result.stdout and "SIGINT" in result.stdout
    assert "SIGHUP" in result.stdout


def test_check_config(tmp_path):
    good = write_config(tmp_path / "good.cfg", {"log": {"level": "debug"}})
    bad = write_config(tmp_path / "bad.cfg", {"services": {"zpipes": {"capacity": "lots"}}})
    ok = run_zbroker(["check-config", str(good)], cwd=tmp_path)
    assert ok.returncode == 0 and "OK" in ok.stdout
    failed = run_zbroker(["check-config", str(bad)], cwd=tmp_path)
    assert failed.returncode == 1
    assert "services.zpipes.capacity" in failed.stderr and "'lots'" in failed.stderr


def test_json_log_file_and_sighup_reload(start_broker, tmp_path):
    log_file = tmp_path / "broker.log"
    config = {"log": {"format": "json", "file": str(log_file)}}
    b = start_broker(config=config)
    started = _wait_for_event(log_file, "broker started")
    assert started["name"] == b.name and started["level"] == "info"
    assert started["timestamp"].endswith("Z")

    # a broken config is refused as a whole; the broker keeps running
    n = len(_log_events(log_file))
    write_config(b.config_path, {**config, "clients": {"timeout": "soon"}})
    b.send_signal(signal.SIGHUP)
    refused = _wait_for_event(log_file, "config reload refused", after=n)
    assert "clients.timeout" in refused["reason"]
    assert b.alive() and endpoint_accepts(b.endpoint)

    # what needs a restart is named and keeps its running value; the rest is applied
    n = len(_log_events(log_file))
    write_config(b.config_path, {**config, "services": {"zpipes": {"enabled": False}},
                                 "clients": {"timeout": 7}})
    b.send_signal(signal.SIGHUP)
    reloaded = _wait_for_event(log_file, "config reloaded", after=n)
    assert reloaded["changed"] == ["services.zpipes.client_timeout"]
    restart = _wait_for_event(log_file, "restart needed for: services.zpipes.enabled", after=n)
    assert restart["keys"] == ["services.zpipes.enabled"] and restart["level"] == "warning"
    assert b.alive() and endpoint_accepts(b.endpoint)

    # a good one is applied: debug lines now appear
    n = len(_log_events(log_file))
    write_config(b.config_path, {"log": {**config["log"], "level": "debug"},
                                 "clients": {"timeout": 5}})
    b.send_signal(signal.SIGHUP)
    reloaded = _wait_for_event(log_file, "config reloaded", after=n)
    assert reloaded["changed"] == ["log.level", "services.zpipes.client_timeout"]
    assert b.stop() == 0
    assert _log_events(log_file)[-1]["event"] == "broker stopped"


def test_sighup_reopens_the_log_file(start_broker, tmp_path):
    log_file = tmp_path / "broker.log"
    b = start_broker(config={"log": {"format": "json", "file": str(log_file)}})
    _wait_for_event(log_file, "broker started")
    log_file.rename(tmp_path / "broker.log.1")  # as logrotate does
    b.send_signal(signal.SIGHUP)
    _wait_for_event(log_file, "config reloaded")
    assert b.stop() == 0


def test_command_line_wins_over_config(start_broker):
    b = start_broker(config={"broker": {"name": "from-file"}, "log": {"level": "warning"}},
                     args=["--log-level", "debug"])
    assert b.name != "from-file" and endpoint_accepts(b.endpoint)
    assert b.stop() == 0
    assert "[debug" in b.stderr()
