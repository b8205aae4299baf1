"""Finding peers with zeroconf (mDNS/DNS-SD), on the broker's own event loop.

Each broker announces ``_zbroker._tcp.local.`` with TXT records id, name, cluster, proto and
browses for the others; an announcement of the same cluster becomes a contact of the node,
which then says HELLO. Discovery only finds: it never decides that a peer has gone (mDNS keeps
a killed broker for many minutes); heartbeats do that.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from typing import Any

import ifaddr
from zeroconf import ServiceStateChange
from zeroconf.asyncio import AsyncServiceBrowser, AsyncServiceInfo, AsyncZeroconf

from .membership import PROTOCOL_VERSION

SERVICE_TYPE = "_zbroker._tcp.local."
RESOLVE_TIMEOUT_MS = 3000


def local_ipv4_addresses() -> list[str]:
    """This host's IPv4 addresses, loopback left out."""
    found = []
    for adapter in ifaddr.get_adapters():
        for ip in adapter.ips:
            if isinstance(ip.ip, str) and not ipaddress.ip_address(ip.ip).is_loopback:
                found.append(ip.ip)
    return found


class Discovery:
    def __init__(self, node: Any, log: Any) -> None:
        self.node = node
        self.log = log
        self._zc: AsyncZeroconf | None = None
        self._browser: AsyncServiceBrowser | None = None
        self._info: AsyncServiceInfo | None = None
        self._tasks: set[asyncio.Task] = set()

    async def start(self) -> None:
        node = self.node
        host, _, port = node.endpoint.rpartition("://")[2].rpartition(":")
        addresses = local_ipv4_addresses() if host in ("0.0.0.0", "*") else [host]
        self._zc = AsyncZeroconf()
        name = f"{node.broker_name}-{node.id[:12]}"
        self._info = AsyncServiceInfo(
            SERVICE_TYPE,
            f"{name}.{SERVICE_TYPE}",
            port=int(port),
            addresses=[socket.inet_aton(a) for a in addresses],
            server=f"{name}.local.",
            properties={"id": node.id, "name": node.broker_name, "cluster": node.config.name,
                        "proto": str(PROTOCOL_VERSION), "endpoint": node.advertised},
        )
        await self._zc.async_register_service(self._info)
        self._browser = AsyncServiceBrowser(self._zc.zeroconf, [SERVICE_TYPE],
                                            handlers=[self._on_change])
        self.log.info("discovery started", service=SERVICE_TYPE, instance=name,
                      addresses=addresses, port=int(port))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        if self._browser is not None:
            await self._browser.async_cancel()
        if self._zc is not None:
            if self._info is not None:
                try:
                    await asyncio.wait_for(
                        await self._zc.async_unregister_service(self._info), 2)
                except (TimeoutError, Exception) as exc:  # stopping: never hang on it
                    self.log.info("discovery unregister incomplete", error=str(exc))
            await self._zc.async_close()

    def _on_change(self, zeroconf: Any, service_type: str, name: str,
                   state_change: ServiceStateChange) -> None:
        if state_change in (ServiceStateChange.Added, ServiceStateChange.Updated):
            task = asyncio.ensure_future(self._resolve(service_type, name))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _resolve(self, service_type: str, name: str) -> None:
        info = AsyncServiceInfo(service_type, name)
        if not await info.async_request(self._zc.zeroconf, RESOLVE_TIMEOUT_MS):
            return
        props = {k.decode(): (v or b"").decode() for k, v in info.properties.items()}
        if props.get("id") == self.node.id or props.get("cluster") != self.node.config.name:
            return
        addresses = info.parsed_addresses()
        ipv4 = [a for a in addresses if ":" not in a]
        if not ipv4 or not info.port:
            return
        endpoint = f"tcp://{ipv4[0]}:{info.port}"
        self.log.info("peer discovered", peer=props.get("name"), id=props.get("id"),
                      endpoint=endpoint)
        self.node.add_contact(endpoint)
