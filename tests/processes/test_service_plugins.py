"""A service is a plug-in: a tiny one that lives here (tests/plugins/echo_service.py, found by
the entry point of tiny_service-0.dist-info beside it) gets its config section, its metric,
its status lines, its reloads, its features, an endpoint on the broker's transport, a
``zbroker`` sub-command and a ``top`` table in a real broker, with nothing of zbroker naming
it; a broker without it refuses its section, and one whose plug-in does not load says
which."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest
import zmq
from helpers import free_port, run_zbroker, wait_for, write_config
from metrics_helpers import scrape, value

PLUGINS = Path(__file__).parents[1] / "plugins"
BROKEN = Path(__file__).parents[1] / "plugins_broken"


@pytest.fixture
def with_plugin(monkeypatch):
    """The plug-in's directory on the PYTHONPATH of the processes the test starts (only)."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        filter(None, [str(PLUGINS), os.environ.get("PYTHONPATH")])))


def echo_config(**echo) -> dict:
    return {"metrics": {"bind": f"127.0.0.1:{free_port()}"},
            "services": {"echo": {"enabled": True, **echo}}}


def zb(b, *args: str) -> tuple[int, str, str]:
    r = run_zbroker([*args, b.name, "--run-dir", str(b.run_dir)], cwd=b.dir)
    return r.returncode, r.stdout, r.stderr


def test_the_plugin_is_not_on_the_test_processs_own_path():
    from zbroker.services import installed

    assert "echo" not in installed() and str(PLUGINS) not in sys.path


def test_a_plugin_gets_its_section_a_metric_and_status_lines(with_plugin, start_broker):
    config = echo_config(greeting="hi there", repeat=3)
    b = start_broker(config=config)
    # (the metrics endpoint is bound once every service has started)
    wait_for(lambda: "broker started" in b.stderr(), 10, "the broker's start")
    assert "greeting='hi there'" in b.stderr() and "repeat=3" in b.stderr()
    _, samples = scrape(int(config["metrics"]["bind"].rpartition(":")[2]))
    assert value(samples, "zbroker_echo_repeat") == 3
    assert value(samples, "zbroker_zpipes_clients_connected") == 0  # ZPIPES's, beside it
    rc, out, err = zb(b, "status")
    assert rc == 0, err
    lines = out.splitlines()
    assert "echo:" in lines, out
    assert lines[lines.index("echo:") + 1] == "  says 'hi there' 3 times"
    rc, out, _ = zb(b, "status", "--json")
    assert json.loads(out)["services"]["echo"] == {"greeting": "hi there", "repeat": 3,
                                                   "peers": {}, "echoed": 0}


def test_a_plugin_gets_an_endpoint_a_sub_command_and_a_top_table(with_plugin, start_broker,
                                                                  ctx):
    """All through the plug-in interface: the endpoint is served by the broker's transport,
    ``zbroker echo`` is the service's command, the ``top`` table its own."""
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    b = start_broker(config=echo_config(greeting="hi", endpoint=endpoint))
    wait_for(lambda: "broker started" in b.stderr(), 10, "the broker's start")
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.RCVTIMEO, 5000)
    sock.connect(endpoint)
    for i in range(3):
        sock.send_multipart([b"frame", b"%d" % i])
        assert sock.recv_multipart() == [b"frame", b"%d" % i]
    rc, out, err = zb(b, "echo", "hello there")
    assert (rc, out, err) == (0, "hello there\n", "")
    rc, out, err = zb(b, "top", "--once", "--interval", "0.1")
    assert rc == 0, err
    assert "echo: says 'hi'" in out, out
    assert re.search(rf"^{re.escape(endpoint)}\s+4\s", out, re.M), out  # three, and the command's
    r = run_zbroker(["--help"], cwd=b.dir)
    assert "zbroker echo TEXT [NAME]" in r.stdout, r.stdout
    r = run_zbroker(["echo", "--help"], cwd=b.dir)
    assert r.returncode == 0 and "Send TEXT to a running broker's echo service" in r.stdout


def test_a_plugins_section_reloads_except_its_restart_keys(with_plugin, start_broker):
    b = start_broker(config=echo_config())
    rc, out, err = zb(b, "set", "services.echo.greeting", "bonjour")
    assert rc == 0, err
    assert "  says 'bonjour' 1 times" in zb(b, "status")[1].splitlines()
    rc, out, err = zb(b, "set", "services.echo.repeat", "2")
    assert (rc, err) == (1, "zbroker: set: services.echo.repeat: these keys only change "
                            "with a restart: services.echo.repeat\n")
    rc, out, err = zb(b, "set", "services.echo.greeting", "x" * 65)
    assert (rc, err) == (1, f"zbroker: set: services.echo.greeting: got {'x' * 65!r}, "
                            "expected a greeting of 1 to 64 characters\n")


def test_check_config_validates_a_plugins_section(with_plugin, tmp_path):
    good = write_config(tmp_path / "good.cfg", echo_config(greeting="hey"))
    r = run_zbroker(["check-config", str(good)], cwd=tmp_path)
    assert (r.returncode, r.stdout) == (0, f"{good}: OK\n"), r.stderr
    bad = write_config(tmp_path / "bad.cfg", echo_config(repeat=11))
    r = run_zbroker(["check-config", str(bad)], cwd=tmp_path)
    assert (r.returncode, r.stderr) == (1, f"zbroker: {bad}: services.echo.repeat: got 11, "
                                           "expected an integer, from 1 to 10\n")


def test_without_the_plugin_its_section_is_refused_clearly(start_broker, tmp_path):
    path = write_config(tmp_path / "echo.cfg", echo_config())
    message = (f"zbroker: {path}: unknown key 'services.echo'; known keys under 'services': "
               "zpipes, pzq; no service plug-in named 'echo' is installed\n")
    r = run_zbroker(["check-config", str(path)], cwd=tmp_path)
    assert (r.returncode, r.stderr) == (1, message)
    b = start_broker(config=echo_config(), wait=False)
    assert b.wait() == 1
    assert b.stderr() == message.replace(str(path), str(b.config_path))


def test_a_plugin_that_does_not_load_is_named(monkeypatch, tmp_path):
    monkeypatch.setenv("PYTHONPATH", str(BROKEN))
    path = write_config(tmp_path / "z.cfg", {})
    r = run_zbroker(["check-config", str(path)], cwd=tmp_path)
    assert r.returncode == 1
    assert r.stderr == ("zbroker: service plug-in 'broken' (no_such_module_here:BrokenService "
                        "of broken-service) cannot be loaded: ModuleNotFoundError: No module "
                        "named 'no_such_module_here'\n")


def test_peer_brokers_carry_a_plugins_features_without_knowing_them(with_plugin,
                                                                     start_broker):
    ports = [free_port(), free_port()]
    brokers = [start_broker(config={
        "cluster": {"enabled": True, "discovery": False, "insecure": True,
                    "peer_timeout": 1.5, "bind": f"tcp://127.0.0.1:{ports[i]}",
                    "peers": [f"tcp://127.0.0.1:{ports[1 - i]}"]},
        "services": {"echo": {"enabled": True, "greeting": f"from {i}"}}}) for i in (0, 1)]

    def told(i: int) -> bool:
        return f"  peer {brokers[1 - i].name} says 'from {1 - i}'" in zb(
            brokers[i], "status")[1].splitlines()

    for i in (0, 1):
        wait_for(lambda i=i: told(i), 15, f"broker {i} to hear its peer's echo")
    # a plug-in that knows only peer_left(peer) is told of a peer lost, as before
    brokers[1].kill()
    wait_for(lambda: not told(0), 15, "broker 0's echo to forget its peer, killed")



@pytest.mark.parametrize("numbered", [True, False])
def test_zpipes_reads_its_own_flags_out_of_a_peers_features(numbered):
    """(and takes CONFIRM only on a link that numbers messages, as before)"""
    from zbroker.service import PeerBroker
    from zbroker.services.zpipes import ZpipesService

    calls = []

    class Core:
        def set_member(self, member):
            pass

        def peer_up(self, peer, now, **flags):
            calls.append((peer, flags))

    class Loop:
        def time(self):
            return 0.0

    service = ZpipesService()
    service.server, service._loop = Core(), Loop()
    service._flush_outside = lambda: None
    flags = service.features()
    service.peer_joined(PeerBroker("b#1", "b", "tcp://b:1", member="b",
                                   features={"zpipes": flags, "pzq": {}}, numbered=numbered,
                                   label="b@hostb (10.0.0.2)"))
    service.peer_joined(PeerBroker("c#1", "c", "tcp://c:1", member="c",
                                   features={"pzq": {}}, numbered=numbered))
    assert calls == [
        ("b#1", {"member": "b", "directory": True, "fanout": True, "write_frames": True,
                 "confirm": numbered, "label": "b@hostb (10.0.0.2)"}),
        ("c#1", {"member": "c", "directory": False, "fanout": False, "write_frames": False,
                 "confirm": False, "label": ""})]
