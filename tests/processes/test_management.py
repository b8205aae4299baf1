"""Management commands against real broker processes: status, get, set, reload, stop, logs;
and a pipe streaming through 20 SIGHUPs with alternating configs."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml
import zmq
from helpers import broker_env, run_zbroker, wait_for
from pipe_stream import Stream, lockstep
from wire import INPUT_OK, OUTPUT_OK, WRITE_OK, RawClient, input_, output, write

from zbroker.management import SocketPath


def zb(b, *args, timeout=30.0):
    """Run a management command for broker ``b`` (found by its name, as an operator would:
    same config file, same runtime directory)."""
    return run_zbroker([*args], cwd=b.dir, timeout=timeout)


def status(b) -> dict:
    r = zb(b, "status", b.name, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


# --- status ----------------------------------------------------------------------------------


def test_status_shows_clients_pipes_and_ends(broker, ctx):
    w, r = RawClient(ctx, broker.endpoint), RawClient(ctx, broker.endpoint)
    try:
        assert w.call(output(b"jobs")) == (OUTPUT_OK, None)
        assert r.call(input_(b"jobs")) == (INPUT_OK, None)
        assert w.call(write(b"x" * 1000, 1000)) == (WRITE_OK, None)
        s = status(broker)
        assert s["name"] == broker.name and s["pid"] == broker.pid
        assert 0 < s["uptime"] < 60 and s["config"].endswith("zbroker.cfg")
        zp = s["services"]["zpipes"]
        assert zp["endpoint"] == broker.endpoint and zp["clients"] == 2
        assert zp["pipes"] == {"jobs": {"readers": 1, "writers": 1, "remote_ends": 0,
                                        "buffered": 1000, "bytes_written": 1000,
                                        "bytes_read": 0}}
        assert s["logs"]["syslog"] is None and s["management"]["followers"] == 0
        human = zb(broker, "status", broker.name)
        assert human.returncode == 0, human.stderr
        out = human.stdout
        assert f"broker {broker.name} (pid {broker.pid}), up " in out
        assert f"zpipes: {broker.endpoint}" in out and "clients: 2" in out
        assert "jobs: readers 1, writers 1, remote_ends 0, buffered 1000" in out
        assert "syslog: off" in out
    finally:
        w.close()
        r.close()


def test_run_dir_is_private_and_holds_the_control_socket(broker):
    status(broker)
    assert stat.S_IMODE(broker.run_dir.stat().st_mode) == 0o700
    assert stat.S_ISSOCK((broker.run_dir / "ctl").stat().st_mode)


def test_no_broker_of_that_name(tmp_path):
    r = run_zbroker(["status", "nobody-here"], cwd=tmp_path)
    assert r.returncode == 1
    assert r.stderr.startswith("zbroker: no broker named 'nobody-here' is running")
    assert r.stdout == ""


def test_a_killed_broker_is_reported_and_its_name_can_be_reused(start_broker):
    b = start_broker()
    status(b)
    b.kill()
    r = zb(b, "status", b.name)
    assert r.returncode == 1 and "nothing answers" in r.stderr, r.stderr
    again = start_broker(name=b.name)  # same directory: the stale socket is replaced
    assert status(again)["pid"] == again.pid


# --- get and set -----------------------------------------------------------------------------


def test_get_set_and_reload_back_to_the_file(start_broker):
    b = start_broker(config={"services": {"zpipes": {"client_timeout": 30}}})
    assert zb(b, "get", "log.level", b.name).stdout == "info\n"
    r = zb(b, "get", "services.zpipes", b.name)
    assert "services.zpipes.client_timeout: 30.0\n" in r.stdout
    assert "clients.max_clients: 10000" in zb(b, "get", "clients", b.name).stdout
    # a key that moved, asked by its old name, is answered
    assert zb(b, "get", "clients.timeout", b.name).stdout == "30.0\n"
    r = zb(b, "set", "log.level", "debug", b.name)
    assert r.returncode == 0, r.stderr
    # it says that a reload undoes it
    assert r.stdout == ("log.level: info -> debug (until the next reload, which reverts it to "
                        "the config file: put it in the file to keep it)\n")
    r = zb(b, "set", "clients.timeout", "2.5", b.name, "--json")  # (set by its new name)
    assert json.loads(r.stdout) == {"key": "services.zpipes.client_timeout", "old": 30.0,
                                    "new": 2.5}
    got = json.loads(zb(b, "get", "log", b.name, "--json").stdout)
    assert got["log.level"] == "debug" and got["log.syslog.target"] is None
    # a reload re-reads the file: what was set is gone
    r = zb(b, "reload", b.name)
    assert r.returncode == 0 and r.stdout.startswith("reloaded "), r.stderr
    assert zb(b, "get", "log.level", b.name).stdout == "info\n"
    assert zb(b, "get", "services.zpipes.client_timeout", b.name).stdout == "30.0\n"


@pytest.mark.parametrize("key, value, message", [
    ("log.level", "loud",
     "zbroker: set: log.level: got 'loud', expected one of: debug, info, warning, error\n"),
    ("services.zpipes.client_timeout", "-1",
     "zbroker: set: services.zpipes.client_timeout: got -1, expected a number of seconds > 0\n"),
    ("services.zpipes.capacity", "lots", "zbroker: set: services.zpipes.capacity: got 'lots', "
     'expected a size in bytes, as an integer or a string like "512KiB" or "16 MiB" >= 1\n'),
    ("clients.max_client", "5", "zbroker: set: unknown key 'clients.max_client' (did you mean "
     "'max_clients'?); known keys under 'clients': max_clients, max_per_source\n"),
    ("broker.name", "other",
     "zbroker: set: broker.name: these keys only change with a restart: broker.name\n"),
    ("log.syslog.target", "syslog://x", "zbroker: set: log.syslog.target: got 'syslog://x', "
     'expected a syslog target "udp://HOST[:PORT]", "tcp://HOST[:PORT]" or "unix:///PATH" '
     '(e.g. "udp://127.0.0.1:514", "unix:///dev/log")\n'),
])
def test_set_refuses_invalid_values_precisely(broker, key, value, message):
    r = zb(broker, "set", key, value, broker.name)
    assert (r.returncode, r.stderr, r.stdout) == (1, message, "")
    assert broker.alive()


def test_set_applies_live_to_the_service(start_broker, ctx):
    b = start_broker()
    assert zb(b, "set", "services.zpipes.capacity", "64KiB", b.name).returncode == 0
    w = RawClient(ctx, b.endpoint)
    r = RawClient(ctx, b.endpoint)
    try:
        assert w.call(output(b"cap")) == (OUTPUT_OK, None)
        assert r.call(input_(b"cap")) == (INPUT_OK, None)
        assert w.call(write(b"x" * 65536, 1000)) == (WRITE_OK, None)
        w.send(write(b"y" * 10, 0))  # beyond the new capacity: waits for the reader
        assert w.nothing_within(300)
    finally:
        w.close()
        r.close()


def test_reload_command_refuses_a_broken_file(start_broker):
    b = start_broker(config={"log": {"level": "info"}})
    b.config_path.write_text("log:\n  level: loud\n")
    # the command still finds the broker through the broken file's broker section; the
    # reason is said once, by the broker that refuses it
    r = zb(b, "reload", b.name)
    assert r.returncode == 1
    assert r.stderr.splitlines() == [
        f"zbroker: reload refused: {b.config_path}: log.level: got 'loud', expected one of: "
        "debug, info, warning, error"]
    assert b.alive()
    b.config_path.write_text("log:\n  level: warning\n")
    r = zb(b, "reload", b.name, "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["config"].endswith("zbroker.cfg")
    assert zb(b, "get", "log.level", b.name).stdout == "warning\n"


def test_reload_says_what_it_changed_and_names_what_needs_a_restart(start_broker):
    b = start_broker(config={"services": {"zpipes": {"client_timeout": 30}}})
    r = zb(b, "reload", b.name)
    assert (r.returncode, r.stdout) == (0, f"reloaded {b.config_path}: nothing changed\n")
    config = yaml.safe_load(b.config_path.read_text())
    config["services"]["zpipes"].update(client_timeout=20, enabled=False)
    config.setdefault("cluster", {})["enabled"] = True
    b.config_path.write_text(yaml.safe_dump(config))
    r = zb(b, "reload", b.name)
    assert r.returncode == 0, r.stderr
    assert r.stdout == (f"reloaded {b.config_path}: changed services.zpipes.client_timeout\n"
                        "restart needed for: cluster.enabled, services.zpipes.enabled (the "
                        "broker runs on their values of before until it restarts)\n")
    # the running values stay (and the next reload names them again)
    assert zb(b, "get", "cluster.enabled", b.name).stdout == "false\n"
    assert zb(b, "get", "services.zpipes.client_timeout", b.name).stdout == "20.0\n"
    assert status(b)["cluster"] is None and "zpipes" in status(b)["services"]
    r = zb(b, "reload", b.name, "--json")
    assert json.loads(r.stdout) == {"config": str(b.config_path), "changed": [],
                                    "restart_needed": ["cluster.enabled",
                                                       "services.zpipes.enabled"],
                                    "cluster_key_changed": False}
    assert b.stderr().count("restart needed for: cluster.enabled, services.zpipes.enabled") \
        == 2
    assert b.alive()


def test_join_token_without_a_keyed_cluster_says_so(broker):
    r = zb(broker, "join-token", broker.name)
    assert (r.returncode, r.stdout) == (1, "")
    assert r.stderr == ("zbroker: this broker has no cluster with a key to join: start it "
                        "with --cluster (and without cluster.insecure)\n")


def test_sighup_with_a_broken_config_still_reopens_the_log_file(start_broker, tmp_path):
    log_file = tmp_path / "broker.log"
    b = start_broker(config={"log": {"file": str(log_file)}})
    wait_for(lambda: log_file.exists() and "broker started" in log_file.read_text(), 10,
             "the log file")
    log_file.rename(tmp_path / "broker.log.1")  # what logrotate does, then SIGHUP
    b.config_path.write_text("log: {file: " + str(log_file) + ", level: loud}\n")
    b.send_signal(signal.SIGHUP)
    wait_for(lambda: log_file.exists(), 10, "the log file to be reopened")
    assert b.alive()
    r = zb(b, "status", b.name)
    assert r.returncode == 0
    wait_for(lambda: "config reload refused" in (tmp_path / "broker.log.1").read_text()
             + log_file.read_text(), 10, "the refusal to be logged")


def test_stop_command(broker):
    r = zb(broker, "stop", broker.name)
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"broker {broker.name} (pid {broker.pid}) stopped\n"
    # "stopped" means the process has exited (it waits only for its parent to collect it)
    assert broker.proc.poll() is not None
    assert broker.wait() == 0
    assert not (broker.run_dir / "ctl").exists()
    assert "stopping" in broker.stderr() and "zbroker stop" in broker.stderr()


def test_stop_says_so_when_the_process_does_not_exit(tmp_path, ctx):
    """A control socket that answers "stop" for a process that goes on running (a sleep):
    stop waits --wait seconds, then says so on one line and exits 1."""
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    sleeper = subprocess.Popen(["sleep", "60"])
    rep = ctx.socket(zmq.REP)
    rep.bind(f"ipc://{run_dir}/ctl")
    try:
        cmd = subprocess.Popen([sys.executable, "-m", "zbroker", "stop", "stuck", "--run-dir",
                                str(run_dir), "--wait", "0.5"], cwd=tmp_path,
                               env=broker_env(tmp_path), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
        assert rep.poll(30_000), "no stop request came"
        assert json.loads(rep.recv()) == {"command": "stop"}
        rep.send(json.dumps({"ok": True, "result": {"pid": sleeper.pid}}).encode())
        out, err = cmd.communicate(timeout=30)
        assert cmd.returncode == 1 and out == "", err
        assert err.startswith(f"zbroker: broker stuck (pid {sleeper.pid}) was asked to stop "
                              "but is still running after 0.5 s") and err.count("\n") == 1
        assert sleeper.poll() is None
    finally:
        rep.close(linger=0)
        sleeper.kill()
        sleeper.wait()


# --- logs --------------------------------------------------------------------------------------


def test_logs_follow_filters_on_the_broker_side(start_broker, ctx):
    b = start_broker(config={"log": {"level": "debug"}})
    outputs, procs = {}, {}
    for label, args in (("a", ["--pipe", "a"]), ("warn", ["--level", "warning"]),
                        ("all", [])):
        path = b.dir / f"follow-{label}.txt"
        outputs[label] = path
        procs[label] = subprocess.Popen(
            [sys.executable, "-m", "zbroker", "logs", "-f", "--json", "-n", "0", *args, b.name],
            cwd=b.dir, env=broker_env(b.dir), stdout=open(path, "w"),
            stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    try:
        wait_for(lambda: status(b)["management"]["followers"] == 3, 15, "three followers")
        lockstep(ctx, b.endpoint, b"a", 3)
        lockstep(ctx, b.endpoint, b"b", 3)

        def events(label):
            return [json.loads(line) for line in outputs[label].read_text().splitlines()]

        wait_for(lambda: any(e.get("pipe") == "b" and e["event"] == "pipe closed"
                             for e in events("all")), 10, "pipe b's events")
        wait_for(lambda: any(e["event"] == "pipe closed" for e in events("a")), 10,
                 "pipe a's events")
        assert {e.get("pipe") for e in events("a")} == {"a"}
        assert {"a", "b"} <= {e.get("pipe") for e in events("all")}
        assert events("warn") == []  # nothing of warning level or above happened
        assert zb(b, "stop", b.name).returncode == 0
        for label, p in procs.items():
            assert p.wait(10) == 0, label
            assert "broker stopping" in p.stderr.read()
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait(5)


def test_logs_shows_recent_events(broker, ctx):
    lockstep(ctx, broker.endpoint, b"recent", 1)
    r = zb(broker, "logs", "-n", "3", "--pipe", "recent", "--json", broker.name)
    assert r.returncode == 0, r.stderr
    events = [json.loads(line) for line in r.stdout.splitlines()]
    assert [e["event"] for e in events][-1] == "pipe closed"
    assert len(events) == 3 and all(e["pipe"] == "recent" for e in events)
    human = zb(broker, "logs", "-n", "1", broker.name).stdout
    assert "pipe closed" in human and "pipe=recent" in human


def test_a_follower_that_never_reads_does_not_slow_the_broker(start_broker, ctx):
    b = start_broker(config={"log": {"level": "debug", "animate": True}})
    ctl = ctx.socket(zmq.DEALER)  # a follower that asks and then never reads
    ctl.setsockopt(zmq.RCVHWM, 1)
    ctl.setsockopt(zmq.RCVBUF, 4096)
    where = SocketPath(b.run_dir, "ctl")
    ctl.connect(where.endpoint)
    ctl.send_multipart([b"", json.dumps({"command": "logs", "follow": True}).encode()])
    try:
        wait_for(lambda: status(b)["management"]["followers"] == 1, 10, "the follower")
        t = time.monotonic()
        for _ in range(10):  # thousands of events; between them the follower pings, as
            # followers do (it never reads): on a loaded machine the whole run can take
            # longer than the silence after which a follower is forgotten
            lockstep(ctx, b.endpoint, b"busy", 200, size=1024)
            ctl.send_multipart([b"", json.dumps({"command": "ping"}).encode()])
        elapsed = time.monotonic() - t
        assert elapsed < 30
        s = status(b)
        assert s["management"]["followers"] == 1  # still followed
        assert s["management"]["followers_dropped"] > 0  # but it lost events
    finally:
        ctl.close(linger=0)
        where.close()


# --- SIGHUP while streaming ----------------------------------------------------------------------


def test_twenty_sighups_with_alternating_configs_lose_no_byte_and_no_client(start_broker, ctx):
    configs = [
        {"log": {"level": "info", "format": "console"}, "clients": {"timeout": 30}},
        {"log": {"level": "debug", "format": "json", "animate": True},
         "clients": {"timeout": 45, "max_pipelined": 32},
         "services": {"zpipes": {"capacity": "256KiB"}}},
    ]
    b = start_broker(config=configs[0])
    stream = Stream(ctx, b.endpoint, b"through-sighup").start()
    reloads = 0
    try:
        wait_for(lambda: stream.bytes_read > 1 << 20 or stream.errors, 15, "streaming to start")
        for i in range(20):
            b.config_path.write_text(yaml.safe_dump(configs[(i + 1) % 2]))
            b.send_signal(signal.SIGHUP)
            reloads += 1
            wait_for(lambda n=reloads: status(b)["reloads"]["ok"] >= n, 10,
                     f"reload {reloads}")
            moved = stream.bytes_read
            wait_for(lambda m=moved: stream.bytes_read > m + (256 << 10) or stream.errors, 10,
                     "bytes to move after the reload")
            assert not stream.errors, stream.errors
        s = status(b)
        assert s["services"]["zpipes"]["clients"] == 2
        assert s["services"]["zpipes"]["pipes"]["through-sighup"]["readers"] == 1
    finally:
        stream.finish()
    assert not stream.errors, stream.errors
    assert stream.bytes_written == stream.bytes_read > 2 << 20
    assert stream.written.hexdigest() == stream.read_.hexdigest()
    log = b.stderr()
    assert status(b)["reloads"] == {"ok": 20, "refused": 0}
    assert log.count("config reloaded") >= 5  # (a budget of 5 a second: see test_log_budget)
    assert "refused" not in log and "client expired" not in log
    assert b.alive() and b.stop() == 0


# --- output formatting (no broker) -----------------------------------------------------------


def test_status_text_renders_any_service_and_the_cluster():
    from zbroker.cli.commands import format_status

    text = format_status({
        "name": "b1", "pid": 7, "uptime": 3725.5, "config": None, "run_dir": "/run/zbroker/b1",
        "services": {
            "zpipes": {"endpoint": "ipc://@/zpipes/b1", "clients": 1,
                       "pipes": {"p": {"readers": 1, "writers": 0, "buffered": 5}}},
            "pzq": {"queues": {"orders": {"depth": 3, "in_flight": 1}}, "paused": False},
        },
        "logs": {"level": "info", "format": "json", "file": None,
                 "write_errors": 0, "repeats_collapsed": 1999,
                 "syslog": {"target": "udp://127.0.0.1:514", "format": "rfc5424",
                            "facility": "daemon", "connected": False,
                            "last_error": "connection refused", "sent": 1, "dropped": 2,
                            "queued": 3, "queue": 10}},
        "management": {"followers": 0, "followers_dropped": 0},
        "cluster": {"endpoint": "tcp://10.0.0.1:5670",
                    "peers": [{"id": "AB", "name": "b2", "endpoint": "tcp://10.0.0.2:5670",
                               "last_heard_s": 0.4}], "pending_contacts": 3},
    })
    assert text.splitlines()[:3] == ["broker b1 (pid 7), up 1h 2m 5s",
                                     "  config: embedded defaults",
                                     "  run dir: /run/zbroker/b1"]
    assert "    p: readers 1, writers 0, buffered 5" in text
    assert "pzq:\n  queues: 1\n    orders: depth 3, in_flight 1\n  paused: false" in text
    assert "cluster: tcp://10.0.0.1:5670, 1 peer, 3 contacts not answering\n" \
           "  b2 (AB) tcp://10.0.0.2:5670, last heard 0.4s ago" in text
    assert "logs: level info, json to standard error, 1999 repeated warnings counted, " \
           "not written" in text
    assert ("  syslog: udp://127.0.0.1:514 (rfc5424, daemon, not connected: connection "
            "refused): 1 sent, 2 dropped, 3/10 queued") in text


@pytest.mark.parametrize("text, value", [
    ("debug", "debug"), ("30", 30), ("2.5", 2.5), ("true", True), ("null", None),
    ("1MiB", "1MiB"), ("udp://127.0.0.1:514", "udp://127.0.0.1:514"), ("[1, 2]", "[1, 2]"),
    ("{a: 1}", "{a: 1}"), ("a: b: c", "a: b: c"),
])
def test_set_values_are_read_as_yaml_scalars(text, value):
    from zbroker.cli.commands import parse_value

    assert parse_value(text) == value


def test_socket_path_too_long_for_a_unix_socket_goes_through_the_directory(tmp_path):
    short = SocketPath(tmp_path, "ctl")
    assert short.address == str(tmp_path / "ctl") or len(str(tmp_path / "ctl")) > 107
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    where = SocketPath(deep, "ctl")
    try:
        assert where.address.startswith("/proc/self/fd/") and where.address.endswith("/ctl")
        ctx = zmq.Context()
        server, client = ctx.socket(zmq.REP), ctx.socket(zmq.REQ)
        server.bind(where.endpoint)
        assert (deep / "ctl").exists() and where.answers()
        client.connect(where.endpoint)
        client.send(b"ping")
        assert server.poll(5000) and server.recv() == b"ping"
        server.close(linger=0)
        client.close(linger=0)
        ctx.term()
    finally:
        where.close()
        short.close()


# --- who may use the control socket ----------------------------------------------------------

OTHER_UID = 65534  # nobody
# run as root, the interpreter drops to OTHER_UID once the command's modules are imported (for
# an interpreter that another user may not run); the command then runs as that user
DROP_PRIVILEGES = f"""
import os, sys
from zbroker.cli import main
os.setgroups([])
os.setgid({OTHER_UID})
os.setuid({OTHER_UID})
sys.exit(main(sys.argv[1:]))
"""


def as_other_user(args: list[str]) -> subprocess.CompletedProcess[str]:
    """Run ``zbroker ARGS`` as another user: with setpriv or runuser when that user may run
    this interpreter and import zbroker with it, else by dropping privileges in the process
    itself (which has imported it already)."""
    env = broker_env(Path("/"))
    env.pop("XDG_RUNTIME_DIR")
    tool = None
    if shutil.which("setpriv"):
        tool = ["setpriv", f"--reuid={OTHER_UID}", f"--regid={OTHER_UID}", "--clear-groups"]
    elif shutil.which("runuser"):
        tool = ["runuser", "-u", pwd.getpwuid(OTHER_UID).pw_name, "--"]
    if tool:
        # (the other user may run the interpreter and still not reach our package, or the
        # interpreter's own library: a clone in a home of mode 0700 gave "No module named
        # zbroker"; dropping privileges in the process fails there too, at its next import)
        probe = subprocess.run([*tool, sys.executable, "-c", "import zbroker.cli, argparse"],
                               cwd="/", capture_output=True, text=True, env=env)
        if probe.returncode:
            why = (probe.stderr.strip().splitlines() or ["?"])[-1]
            pytest.skip(f"uid {OTHER_UID} cannot run {sys.executable} with zbroker (a clone "
                        f"or an interpreter in a private home?): {why}")
        command = [*tool, sys.executable, "-m", "zbroker", *args]
    else:
        command = [sys.executable, "-c", DROP_PRIVILEGES, *args]
    return subprocess.run(command, cwd="/", env=env, capture_output=True, text=True, timeout=30,
                          stdin=subprocess.DEVNULL)


@pytest.fixture
def open_dir():
    """A directory any user can reach (a test's own temporary directory is private)."""
    d = Path(tempfile.mkdtemp(prefix="zbroker-test-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def one_line(r: subprocess.CompletedProcess[str]) -> str:
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    assert r.stdout == "" and r.stderr.count("\n") == 1, r.stderr
    assert "Traceback" not in r.stderr
    return r.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="running a command as another user needs root")
def test_a_user_without_access_to_the_control_socket_is_told_so(start_broker, open_dir):
    run_dir = open_dir / "run"
    b = start_broker(config={"broker": {"run_dir": str(run_dir)}})
    ctl = run_dir / "ctl"
    wait_for(ctl.exists, 10, "the control socket")
    assert status(b)["pid"] == b.pid  # its own user may
    where = ["--run-dir", str(run_dir), "-c", os.devnull]
    denied = f"zbroker: permission denied on {ctl}"
    for command in (["status"], ["get", "log.level"], ["set", "log.level", "debug"], ["reload"],
                    ["stop"], ["logs"], ["logs", "-f"]):
        assert one_line(as_other_user([*command, b.name, *where])).startswith(denied), command
    # a run directory it may enter, a socket it may not write to: still denied, not "stale"
    run_dir.chmod(0o755)
    if not ctl.stat().st_mode & stat.S_IWOTH:
        assert one_line(as_other_user(["status", b.name, *where])).startswith(denied)
    run_dir.chmod(0o700)
    assert b.alive() and status(b)["pid"] == b.pid
    # a socket left by a killed broker, and no broker at all: each said in one line
    b.kill()
    run_dir.chmod(0o755)
    ctl.chmod(0o777)
    stale = one_line(as_other_user(["status", b.name, *where]))
    assert stale.startswith(f"zbroker: no broker named {b.name!r} is running (nothing answers")
    ctl.unlink()
    gone = one_line(as_other_user(["status", b.name, *where]))
    assert gone.startswith(f"zbroker: no broker named {b.name!r} is running (no control socket")


def test_a_run_directory_that_does_not_exist_is_one_line_however_long_its_path(tmp_path):
    for run_dir in (tmp_path / "missing", tmp_path / ("d" * 60) / ("e" * 60) / "missing"):
        r = run_zbroker(["status", "absent", "--run-dir", str(run_dir), "-c", os.devnull],
                        cwd=tmp_path)
        assert one_line(r).startswith("zbroker: no broker named 'absent' is running"), r.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="running a command as another user needs root")
def test_a_user_looking_in_its_own_run_directory_is_told_who_runs_the_broker(start_broker):
    """As nobody, `zbroker status` said "no broker named 'local' is running", which was
    false: the broker runs as root, with its control socket in root's run directory."""
    b = start_broker()
    r = as_other_user(["status", b.name])
    assert r.returncode == 1, r
    assert r.stderr.startswith(f"zbroker: a broker named {b.name!r} runs as root (pid "
                               f"{b.pid}), not as nobody: ") and "--run-dir" in r.stderr, r
