"""A tiny broker service that lives outside zbroker, for processes/test_service_plugins.py: found
by its entry point (tiny_service-0.dist-info beside it, on the broker's PYTHONPATH), with a
config section, a metric, status lines and features of its own. It serves nothing: it says
its greeting in its log and its status, and tells peer brokers' echo services that it does."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import GaugeMetricFamily

from zbroker.config import Invalid, boolean, integer, setting
from zbroker.service import PeerBroker, Service, ServiceContext


def greeting(value: Any) -> str:
    if not isinstance(value, str) or not 1 <= len(value) <= 64:
        raise Invalid("a greeting of 1 to 64 characters")
    return value


@dataclass(frozen=True)
class EchoConfig:
    enabled: bool = setting(False, boolean)
    greeting: str = setting("hello", greeting)
    repeat: int = setting(1, integer(minimum=1, maximum=10))


class EchoService(Service):
    name = "echo"
    config_section = EchoConfig
    restart_keys = ("repeat",)

    def __init__(self) -> None:
        self.section = EchoConfig()
        self.reloads = 0
        self.peers: dict[str, str] = {}  # peer broker's name -> what its echo says
        self.log: Any = None

    async def start(self, ctx: ServiceContext, config: Any) -> None:
        self.section, self.log = config.services.echo, ctx.log
        ctx.log.info("echo started", greeting=self.section.greeting, repeat=self.section.repeat)

    async def stop(self) -> None:
        pass

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
                "peers": dict(self.peers)}

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
