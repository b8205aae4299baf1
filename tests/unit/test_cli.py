"""The zbroker command line, in-process (the running broker: test_broker_process.py)."""

from __future__ import annotations

import pytest

from zbroker import cli


def test_help_explains_the_broker(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "ipc://@/zpipes/NAME" in out
    assert "check-config" in out
    assert "SIGTERM" in out and "SIGHUP" in out


@pytest.mark.parametrize("command", ["zbroker", "zpipes", "pzq"])
def test_every_command_says_its_version(capsys, command):
    import zpipes.cli
    from zbroker.services.pzq.commands import standalone

    main = {"zbroker": cli.main, "zpipes": zpipes.cli.main, "pzq": standalone.main}
    with pytest.raises(SystemExit) as info:
        main[command](["--version"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{command} ") and out.split()[1][0].isdigit(), out


def test_bad_log_level_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["x", "--log-level", "loud"])
    assert info.value.code == 2
    assert "invalid choice: 'loud'" in capsys.readouterr().err


def test_overrides_from_the_command_line():
    args = cli.broker_parser().parse_args(["b1", "--log-level", "debug", "--animate"])
    assert cli.overrides_from(args) == {"broker": {"name": "b1"}, "log": {"level": "debug"},
                                        "services": {"zpipes": {"animate": True}}}
    assert cli.overrides_from(cli.broker_parser().parse_args([])) == {}


def test_invalid_name_fails_before_starting(capsys, tmp_path):
    assert cli.main(["no/slashes", "--config", str(tmp_path / "missing.cfg")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("zbroker: cannot read config file")
    (tmp_path / "empty.cfg").write_text("")
    assert cli.main(["no/slashes", "--config", str(tmp_path / "empty.cfg")]) == 1
    assert capsys.readouterr().err.startswith("zbroker: command line: broker.name: got")


def test_check_config_ok_and_error(capsys, tmp_path):
    good = tmp_path / "good.cfg"
    good.write_text("log: {level: debug}\n")
    assert cli.main(["check-config", str(good)]) == 0
    assert capsys.readouterr().out == f"{good}: OK\n"
    bad = tmp_path / "bad.cfg"
    bad.write_text("clients: {max_clients: 0}\n")
    assert cli.main(["check-config", str(bad)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (f"zbroker: {bad}: clients.max_clients: got 0, "
                            "expected an integer >= 1\n")


def test_check_config_without_a_file_checks_what_the_broker_would_read(capsys, tmp_path,
                                                                      monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(cli, "find_config_file", lambda: None)
    assert cli.main(["check-config"]) == 0
    assert "embedded defaults" in capsys.readouterr().out
    (tmp_path / "zbroker.cfg").write_text("log: {level: nope}\n")
    monkeypatch.undo()
    monkeypatch.chdir(tmp_path)
    assert cli.main(["check-config"]) == 1
    assert "log.level: got 'nope'" in capsys.readouterr().err


def test_sub_commands_are_dispatched_by_first_word(monkeypatch):
    seen = []
    monkeypatch.setitem(cli.BUILTIN, "status", lambda argv: seen.append(list(argv)) or 0)
    assert cli.main(["status", "--json"]) == 0
    assert seen == [["--json"]]


@pytest.mark.parametrize(("typo", "meant"), [("stauts", "status"), ("relaod", "reload"),
                                              ("check-confg", "check-config")])
def test_a_typo_of_a_sub_command_is_refused_not_run_as_a_broker(capsys, monkeypatch, typo,
                                                               meant):
    started = []
    monkeypatch.setattr(cli, "run_broker", lambda argv: started.append(argv) or 0)
    assert cli.main([typo]) == 2
    err = capsys.readouterr().err
    assert f"did you mean {meant!r}" in err and f"zbroker -- {typo}" in err
    assert started == []
    assert cli.main(["--", typo]) == 0 and started == [["--", typo]]  # as it says
    assert cli.broker_parser().parse_args(["--", typo]).name == typo
    assert cli.main(["prod"]) == 0 and started[-1] == ["prod"]  # a name like no command


def test_status_and_top_name_each_contact_not_answering_and_each_peer_refused():
    """What keeps a cluster from linking, as ``zbroker status`` and ``zbroker top`` show it:
    one line for each host, since when (local time of day) and for how long, why, and the
    fix. Reported: a peer with another key was three lines (its address refused, its endpoint
    refusing us, and not answering), with "1 times" and "1 peers"."""
    import time

    from zbroker.cli.common import not_answering, trouble_lines
    from zbroker.cli.top import Sample, compute_view, render_text

    since = time.mktime((2026, 11, 28, 12, 3, 4, 0, 0, -1))
    cluster = {
        "endpoint": "tcp://0.0.0.0:5670", "peers": [], "pending_contacts": 2,
        "key_file": "/etc/zbroker/prod.key",
        "not_answering": [
            {"endpoint": "tcp://10.77.0.9:5670", "since": since, "seconds": 40.2, "seed": True},
            {"endpoint": "tcp://10.77.0.2:5670", "since": since, "seconds": 40.2,
             "seed": False}],
        "refusals": [
            {"peer": "tcp://10.77.0.2:5670", "why": "another cluster key",
             "refused_by": "the peer", "since": since, "seconds": 40.2, "times": 160},
            {"peer": "10.77.0.2", "why": "another cluster key", "refused_by": "us",
             "since": since + 1, "seconds": 39.2, "times": 176},
            {"peer": "10.77.0.3", "why": "the peer runs without a key (cluster.insecure)",
             "refused_by": "us", "since": since, "seconds": 3, "times": 1}]}
    fix = ("copy /etc/zbroker/prod.key from a member of the cluster (or ours to the peer), "
           "then run zbroker reload on the broker that got the new key")
    lines = ["  tcp://10.77.0.9:5670 (seed) not answering since 12:03:04 (40s)",
             "  tcp://10.77.0.2:5670 refused both ways: another cluster key, since 12:03:04 "
             f"(40s, 336 times); fix: {fix}",
             "  10.77.0.3 refused: the peer runs without a key (cluster.insecure), since "
             "12:03:04 (3s, 1 time); fix: give the peer the cluster key "
             "(/etc/zbroker/prod.key) (cluster.key_file), or run every broker without one"]
    assert trouble_lines(cluster) == lines
    assert not_answering(cluster) == 1  # (the refused one is said once, with why)
    status = {"name": "b", "pid": 7, "uptime": 61.0, "services": {}, "cluster": cluster}
    text = render_text(compute_view(None, Sample(1.0, status)), width=400)
    assert "cluster: 0 peers\n" + "\n".join(lines) in text, text
    # a broker of before says nothing of them: nothing more is shown
    assert trouble_lines({"peers": [], "pending_contacts": 1}) == []
