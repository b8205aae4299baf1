"""A tiny broker service that lives outside zbroker, for processes/test_service_plugins.py: found
by its entry point (tiny_service-0.dist-info beside it, on the broker's PYTHONPATH), with a
config section, a metric, status lines, features, a ``zbroker`` sub-command and a ``top``
table of its own. It says its greeting in its log and its status, tells peer brokers' echo
services that it does, and, given an endpoint, serves it on the broker's ZMTP transport:
each message comes back to its sender (the read and write paths, the door and the budget are
the transport's; this is what the service's part is)."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client.core import GaugeMetricFamily

from zbroker import zmtp
from zbroker.command import Command, command_parser, common_options, error
from zbroker.config import Invalid, boolean, integer, optional_served_endpoint, setting
from zbroker.locating import locate
from zbroker.runtime.local_access import default_policy
from zbroker.service import PeerBroker, Service, ServiceContext
from zbroker.top_table import TopTable, count, count_rate, rate
from zbroker.zmtp.admission import Admission
from zbroker.zmtp.refusals import Refusals
from zbroker.zmtp.server import Link, Server


def greeting(value: Any) -> str:
    if not isinstance(value, str) or not 1 <= len(value) <= 64:
        raise Invalid("a greeting of 1 to 64 characters")
    return value


@dataclass(frozen=True)
class EchoConfig:
    enabled: bool = setting(False, boolean)
    greeting: str = setting("hello", greeting)
    repeat: int = setting(1, integer(minimum=1, maximum=10))
    endpoint: str | None = setting(None, optional_served_endpoint)


class _EchoLink(Link):
    def codec(self, server: Server) -> zmtp.Connection:
        return zmtp.Connection(max_frames=16, max_bytes=1 << 16)


class EchoEndpoint(Server):
    """Each message back to its sender."""

    def __init__(self, ctx: ServiceContext) -> None:
        super().__init__(ctx.loop, Admission("echo", Refusals(ctx.log), default_policy()),
                         ctx.log, _EchoLink)
        self.echoed = 0

    def message(self, link: Link, message: zmtp.Message) -> None:
        self.queue(link, *zmtp.encode_parts(message.frames))
        self.echoed += 1

    def after_read(self, link: Link, events: int) -> None:
        self.flush()


class EchoService(Service):
    name = "echo"
    config_section = EchoConfig
    restart_keys = ("repeat",)

    def __init__(self) -> None:
        self.section = EchoConfig()
        self.reloads = 0
        self.peers: dict[str, str] = {}  # peer broker's name -> what its echo says
        self.log: Any = None
        self.endpoint: EchoEndpoint | None = None

    async def start(self, ctx: ServiceContext, config: Any) -> None:
        self.section, self.log = config.services.echo, ctx.log
        if self.section.endpoint is not None:
            self.endpoint = EchoEndpoint(ctx)
            await self.endpoint.start(self.section.endpoint)
        ctx.log.info("echo started", greeting=self.section.greeting, repeat=self.section.repeat)

    async def stop(self) -> None:
        if self.endpoint is not None:
            await self.endpoint.close_after(1.0)

    @classmethod
    def bound_endpoints(cls, config: Any, run_dir: Path) -> list[tuple[str, str]]:
        endpoint = config.services.echo.endpoint
        return [("services.echo.endpoint", endpoint)] if endpoint else []

    def reload(self, new: Any, old: Any) -> None:
        self.section = new.services.echo
        self.reloads += 1

    def features(self) -> dict[str, Any]:
        return {"says": self.section.greeting}

    def peer_joined(self, peer: PeerBroker) -> None:
        said = peer.features_of(self.name).get("says")
        if said is not None:
            self.peers[peer.name] = said

    def peer_left(self, peer: PeerBroker) -> None:
        self.peers.pop(peer.name, None)

    def status(self) -> dict[str, Any]:
        return {"greeting": self.section.greeting, "repeat": self.section.repeat,
                "peers": dict(self.peers),
                "echoed": self.endpoint.echoed if self.endpoint is not None else 0,
                # (``zbroker status`` puts it beside the service's name)
                **({"endpoint": self.section.endpoint} if self.section.endpoint else {})}

    @classmethod
    def top_tables(cls, status: Mapping[str, Any], before: Mapping[str, Any] | None,
                   interval: float | None) -> list[TopTable]:
        echoed = status.get("echoed", 0)
        per_second = rate(echoed, before.get("echoed", 0) if before is not None else None,
                          interval)
        return [TopTable(f"echo: says {status['greeting']!r}", ("ENDPOINT", "ECHOED", "RATE"),
                         ((status.get("endpoint") or "-", count(echoed),
                           count_rate(per_second)),))]

    @classmethod
    def commands(cls) -> list[Command]:
        return [Command("echo", _echo_parser, _echo, usage=(
            "echo TEXT [NAME]        send TEXT to the echo service and print what comes back",
        ))]

    @classmethod
    def status_lines(cls, status: Mapping[str, Any]) -> list[str]:
        lines = [f"  says {status['greeting']!r} {status['repeat']} times"]
        lines += [f"  peer {name} says {said!r}" for name, said in status["peers"].items()]
        return lines

    def metrics(self) -> dict[str, Any]:
        return {"repeat": self.section.repeat, "reloads": self.reloads}

    @classmethod
    def metric_families(cls, metrics: Mapping[str, Any],
                        broker: Mapping[str, Any]) -> list[Any]:
        return [GaugeMetricFamily("zbroker_echo_repeat", "Times the greeting is said.",
                                  value=metrics["repeat"])]


def _echo_parser() -> argparse.ArgumentParser:
    parser = command_parser("echo", "TEXT [NAME]",
                            "Send TEXT to a running broker's echo service (its endpoint, as "
                            "its status says) and print what comes back.")
    parser.add_argument("text", metavar="TEXT")
    common_options(parser, json_flag=False)
    return parser


def _echo(args: argparse.Namespace) -> int:
    import zmq

    from zbroker.management import request

    name, run_dir = locate(args)
    status = request(run_dir, name, {"command": "status"})
    endpoint = (status.get("services", {}).get("echo") or {}).get("endpoint")
    if not endpoint:
        error(f"broker {name} has no echo endpoint (services.echo.endpoint)")
        return 1
    with zmq.Context() as ctx, ctx.socket(zmq.DEALER) as sock:
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVTIMEO, 5000)
        sock.connect(endpoint.replace("*", "127.0.0.1"))
        sock.send_string(args.text)
        try:
            print(sock.recv_string())
        except zmq.Again:
            error(f"no echo from {endpoint} within 5 s")
            return 1
    return 0
