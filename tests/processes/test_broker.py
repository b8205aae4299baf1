"""The Broker in-process, with stand-in services: start/stop order, failures, bounded stop,
all-or-nothing reload. (The real process and its signals: test_broker_process.py.)"""

from __future__ import annotations

import asyncio
import json
import os
import stat
from dataclasses import dataclass
from typing import Any

import pytest
import yaml
import zmq

from zbroker import broker as broker_module
from zbroker import logs
from zbroker.broker import Broker, StartupError, make_private_dir
from zbroker.config import Config, config_diff, load_config, section, services_schema
from zbroker.management import CommandError
from zbroker.service import Service, ServiceContext, ServiceError
from zbroker.services.zpipes.config import ZpipesConfig

# --- a schema with two services, and services that record what happens to them ---------------


class Recorder(Service):
    config_section = ZpipesConfig  # (a section with an `enabled` setting)
    events: list[tuple[str, str]] = []  # (service name, what happened), shared by all
    fail_start: set[str] = set()
    hang_start: set[str] = set()
    hang_stop: set[str] = set()
    refuse_reload: dict[str, Exception] = {}

    def __init__(self) -> None:
        self.ctx: ServiceContext | None = None
        self.reloads: list[tuple[Any, Any]] = []

    async def start(self, ctx: ServiceContext, config: Any) -> None:
        self.ctx = ctx
        if self.name in self.fail_start:
            raise ServiceError(f"{self.name} cannot start")
        if self.name in self.hang_start:
            await asyncio.sleep(3600)
        ctx.log.info("started", level_seen=config.log.level)
        self.events.append((self.name, "start"))

    async def stop(self) -> None:
        self.events.append((self.name, "stop"))
        if self.name in self.hang_stop:
            await asyncio.sleep(3600)

    def reload(self, new: Any, old: Any) -> None:
        self.events.append((self.name, "reload"))
        self.reloads.append((new, old))
        if self.name in self.refuse_reload:
            raise self.refuse_reload[self.name]

    def status(self) -> dict[str, Any]:
        return {"endpoint": f"inproc://{self.name}"}


class Alpha(Recorder):
    name = "alpha"


class Beta(Recorder):
    name = "beta"


class Zpipes(Recorder):  # stands in for the real one: the registry only knows a class
    name = "zpipes"


REGISTRY = {"alpha": Alpha, "beta": Beta, "zpipes": Zpipes}


@dataclass(frozen=True)
class TwoServiceConfig(Config):  # zpipes, and two more services with the same section
    services: Any = section(services_schema(REGISTRY))


@pytest.fixture(autouse=True)
def _reset():
    Recorder.events.clear()
    Recorder.fail_start.clear()
    Recorder.hang_start.clear()
    Recorder.hang_stop.clear()
    Recorder.refuse_reload.clear()
    yield
    logs.configure()


@pytest.fixture
def setup(tmp_path):
    """Write a config (dict) and make a Broker from it, its log a JSON file."""
    path = tmp_path / "zbroker.cfg"
    log_file = tmp_path / "log.json"

    def make(config: dict | None = None) -> Broker:
        write(config)
        cfg = load_config(path, schema=TwoServiceConfig)
        logs.configure(cfg.log.level, cfg.log.format, cfg.log.file)
        return Broker(cfg, config_path=path, registry=REGISTRY)

    def write(config: dict | None = None) -> None:
        config = dict(config or {})
        base = {"broker": {"name": "tb", "run_dir": str(tmp_path / "run")},
                "log": {"format": "json", "file": str(log_file)}}
        for key, value in base.items():
            config[key] = {**value, **config.get(key, {})}
        path.write_text(yaml.safe_dump(config))

    make.write = write  # type: ignore[attr-defined]
    make.events = lambda: [  # type: ignore[attr-defined]
        json.loads(x) for x in log_file.read_text().splitlines()]
    return make


# --- start and stop ------------------------------------------------------------------------


async def test_services_start_in_order_and_stop_in_reverse(setup, tmp_path):
    b = setup()
    await b.start()
    assert Recorder.events == [("alpha", "start"), ("beta", "start"), ("zpipes", "start")]
    ctx = b.services[0].ctx
    assert ctx.broker_name == "tb"
    assert ctx.loop is asyncio.get_running_loop()
    assert isinstance(ctx.zmq_context, zmq.Context) and ctx.zmq_context is b.zmq_context
    assert ctx.run_dir == tmp_path / "run" / "alpha"
    assert stat.S_IMODE(ctx.run_dir.stat().st_mode) == 0o700
    assert b.endpoints() == ["inproc://alpha", "inproc://beta", "inproc://zpipes"]
    context = b.zmq_context
    await b.stop()
    assert Recorder.events[3:] == [("zpipes", "stop"), ("beta", "stop"), ("alpha", "stop")]
    assert context.closed and b.zmq_context is None
    assert not (tmp_path / "run").exists()  # made by the broker, so removed
    started = [e for e in setup.events() if e["event"] == "started"]
    assert [e["service"] for e in started] == ["alpha", "beta", "zpipes"]


async def test_disabled_services_are_not_started(setup):
    b = setup({"services": {"beta": {"enabled": False}, "zpipes": {"enabled": False}}})
    await b.start()
    assert [s.name for s in b.services] == ["alpha"]
    await b.stop()


async def test_a_failed_start_stops_what_started_and_releases_everything(setup, tmp_path):
    Recorder.fail_start.add("beta")
    b = setup()
    with pytest.raises(ServiceError, match="beta cannot start"):
        await b.start()
    assert Recorder.events == [("alpha", "start"), ("alpha", "stop")]
    assert b.services == [] and b.zmq_context is None
    assert not (tmp_path / "run").exists()


async def test_start_is_bounded_when_a_service_hangs(setup, monkeypatch):
    monkeypatch.setattr(broker_module, "START_TIMEOUT", 0.2)
    Recorder.hang_start.add("beta")
    b = setup()
    with pytest.raises(ServiceError, match="'beta' did not start within 0.2 seconds"):
        await asyncio.wait_for(b.start(), 5)
    assert Recorder.events == [("alpha", "start"), ("alpha", "stop")]


async def test_stop_is_bounded_when_a_service_hangs(setup, monkeypatch):
    monkeypatch.setattr(broker_module, "STOP_TIMEOUT", 0.2)
    Recorder.hang_stop.add("beta")
    b = setup()
    await b.start()
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await asyncio.wait_for(b.stop(), 5)
    assert loop.time() - t0 < 2
    assert ("alpha", "stop") in Recorder.events  # the others still stopped
    [late] = [e for e in setup.events() if e["event"] == "service did not stop in time"]
    assert late["service"] == "beta" and late["level"] == "error"


async def test_run_until_stop_requested(setup):
    b = setup()
    asyncio.get_running_loop().call_later(0.1, b.request_stop, "test")
    assert await asyncio.wait_for(b.run(), 5) == 0
    events = setup.events()
    started = next(e for e in events if e["event"] == "broker started")
    assert started["name"] == "tb" and started["pid"] == os.getpid()
    assert started["services"] == ["alpha", "beta", "zpipes"]
    assert started["endpoints"] == ["inproc://alpha", "inproc://beta", "inproc://zpipes"]
    assert events[-1]["event"] == "broker stopped"


async def test_run_raises_a_start_failure(setup):
    Recorder.fail_start.add("alpha")
    b = setup()
    with pytest.raises(ServiceError):
        await asyncio.wait_for(b.run(), 5)


def test_a_registry_service_needs_a_config_section(setup):
    b = setup()
    b.registry["gamma"] = Alpha
    with pytest.raises(StartupError, match="services.gamma"):
        asyncio.run(b.start())


# --- reload --------------------------------------------------------------------------------


async def test_reload_applies_a_good_config_everywhere(setup):
    b = setup()
    await b.start()
    old = b.config
    setup.write({"log": {"level": "debug"}, "clients": {"timeout": 5}})
    assert b.reload() is True
    assert b.config.log.level == "debug" and b.config.services.zpipes.client_timeout == 5.0
    for s in b.services:
        assert s.reloads == [(b.config, old)]
    assert logs.current_level() == "debug"
    reloaded = setup.events()[-1]
    assert reloaded["event"] == "config reloaded"
    assert reloaded["changed"] == ["log.level", "services.zpipes.client_timeout"]
    await b.stop()


async def test_reload_refuses_a_broken_file(setup):
    b = setup()
    await b.start()
    old = b.config
    setup.write({"clients": {"timeout": -1}})
    assert b.reload() is False
    assert b.config is old
    assert not any(what == "reload" for _, what in Recorder.events)
    refused = setup.events()[-1]
    assert refused["event"] == "config reload refused" and "clients.timeout" in refused["reason"]
    await b.stop()


@pytest.mark.parametrize("change, key", [
    ({"broker": {"run_dir": "/elsewhere"}}, "broker.run_dir"),
    ({"broker": {"name": "other"}}, "broker.name"),
    ({"services": {"beta": {"enabled": False}}}, "services.beta.enabled"),
])
async def test_reload_keeps_and_names_what_needs_a_restart(setup, change, key):
    """What only changes with a restart keeps its running value and is named; the rest of
    the file is applied."""
    b = setup()
    await b.start()
    old = b.config
    setup.write({**change, "clients": {"timeout": 5}})
    assert b.reload() is True
    assert config_diff(old, b.config) == ["services.zpipes.client_timeout"]
    assert b.last_applied == {"changed": ["services.zpipes.client_timeout"],
                              "restart_needed": [key],
                              "cluster_key_changed": False}
    named = setup.events()[-1]
    assert named["event"] == f"restart needed for: {key}" and named["keys"] == [key]
    assert named["level"] == "warning"
    assert setup.events()[-2]["changed"] == ["services.zpipes.client_timeout"]
    with pytest.raises(CommandError, match=f"these keys only change with a restart: {key}"):
        b.set_setting(key, {"broker.run_dir": "/elsewhere", "broker.name": "other",
                            "services.beta.enabled": False}[key])
    await b.stop()


@pytest.mark.parametrize("error", [ServiceError("beta says no"), RuntimeError("a bug")])
async def test_a_refused_reload_is_rolled_back(setup, error):
    b = setup()
    await b.start()
    old = b.config
    Recorder.refuse_reload["beta"] = error
    setup.write({"log": {"level": "debug"}})
    assert b.reload() is False
    assert b.config is old
    alpha, beta, zpipes = b.services
    new = alpha.reloads[0][0]
    assert alpha.reloads == [(new, old), (old, new)]  # applied, then taken back
    assert beta.reloads == [(new, old)]
    assert zpipes.reloads == []
    assert logs.current_level() == "info"
    refused = [e for e in setup.events() if e["event"].startswith("config reload refused")]
    assert refused and refused[-1]["service"] == "beta"
    await b.stop()


async def test_reload_refuses_a_log_file_it_cannot_open(setup, tmp_path):
    b = setup()
    await b.start()
    old = b.config
    setup.write({"log": {"file": str(tmp_path / "no" / "dir.log")}})
    assert b.try_reload() == (f"log.file: cannot open log file '{tmp_path / 'no' / 'dir.log'}'"
                              f": there is no folder '{tmp_path / 'no'}'")
    assert b.config is old
    assert all(len(s.reloads) == 0 for s in b.services)  # refused before they saw it
    # a file that only opening finds unopenable (a link to a folder that is not there)
    (tmp_path / "link.log").symlink_to(tmp_path / "gone" / "dir.log")
    setup.write({"log": {"file": str(tmp_path / "link.log")}})
    assert b.reload() is False and b.config is old
    assert all(len(s.reloads) == 2 for s in b.services)  # applied, rolled back
    assert "cannot open log file" in setup.events()[-1]["reason"]
    await b.stop()


# --- the run directory ---------------------------------------------------------------------


def test_make_private_dir(tmp_path):
    target = tmp_path / "a" / "b"
    assert make_private_dir(target) == [tmp_path / "a", target]
    assert stat.S_IMODE(target.stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "a").stat().st_mode) == 0o700
    assert make_private_dir(target) == []
    target.chmod(0o755)
    make_private_dir(target)
    assert stat.S_IMODE(target.stat().st_mode) == 0o700


def test_make_private_dir_refuses_a_file(tmp_path):
    (tmp_path / "f").write_text("")
    with pytest.raises(StartupError, match="not a directory"):
        make_private_dir(tmp_path / "f")
    with pytest.raises(StartupError, match="cannot create run directory"):
        make_private_dir(tmp_path / "f" / "sub")


def test_real_registry_has_zpipes():
    from zbroker.services import installed

    assert installed()["zpipes"].name == "zpipes"
    for name in installed():  # every registered service has a config section with `enabled`
        assert isinstance(getattr(Config().services, name).enabled, bool)


async def test_an_exception_nothing_caught_is_in_the_brokers_log_with_its_traceback(setup):
    """A callback of the loop that raises (a connection's handler: the loop then closes that
    connection) was only on standard error; the broker's log says it."""
    b = setup()
    loop = asyncio.get_running_loop()
    previous = loop.get_exception_handler()
    b.loop = loop
    b._log_loop_errors()  # as run() does

    def failing() -> None:
        raise KeyError("a peer gone")

    try:
        loop.call_soon(failing)
        ran = loop.create_future()
        loop.call_soon(ran.set_result, None)  # (callbacks run in order: after failing's)
        await ran
    finally:
        loop.set_exception_handler(previous)
    logs.flush_budget(everything=True)
    events = [e for e in setup.events() if e["event"] == "unexpected error"]
    assert len(events) == 1 and "failing" in events[0]["what"]
    assert "KeyError" in events[0]["exception"] and "a peer gone" in events[0]["exception"]


def test_a_cluster_port_in_use_names_the_setting_and_who_holds_it(start_broker):
    """It said "cannot bind the cluster socket to tcp://*:5670: Address already in use
    (addr='tcp://*:5670')", naming neither cluster.bind nor what holds the port."""
    import os
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        b = start_broker(config={"cluster": {"enabled": True, "insecure": True,
                                             "discovery": False,
                                             "bind": f"tcp://127.0.0.1:{port}"}}, wait=False)
        assert b.wait() == 1
    err = b.stderr()
    assert f"cannot bind the cluster socket (cluster.bind) to tcp://127.0.0.1:{port}: " \
           f"Address already in use; held by pid {os.getpid()}: " in err, err
