"""The timeouts of clients' requests that wait for their pipes (a READ with nothing to read,
a WRITE its pipe cannot take yet). No I/O.

A heap of (deadline, request serial, routing id); an entry whose request was answered before
its timeout is stale: skipped when it comes due, and dropped when stale ones pile up, so that
the heap stays in proportion to the clients whatever the request rate."""

from __future__ import annotations

import heapq

from .clients import Client

#: stale entries kept at most: this many, and four for each client
SLACK, PER_CLIENT = 1024, 4


class RequestTimers:
    def __init__(self, clients: dict[bytes, Client]) -> None:
        self.clients = clients
        self.entries: list[tuple[float, int, bytes]] = []

    def arm(self, client: Client) -> None:
        """Time the client's request out at its deadline (once; none without one)."""
        if client.deadline is not None and not client.timer_armed:
            client.timer_armed = True
            heapq.heappush(self.entries,
                           (client.deadline, client.request_serial, client.routing_id))
            if len(self.entries) > SLACK + PER_CLIENT * len(self.clients):
                self._compact()

    def pop_due(self, now: float) -> Client | None:
        """The next client whose request is still waiting at its deadline, ``now`` or
        before (its timer disarmed); None when there is none. Asked again after each one
        is handled: handling it may answer the others."""
        entries, clients = self.entries, self.clients
        while entries and entries[0][0] <= now:
            _, serial, routing_id = heapq.heappop(entries)
            client = clients.get(routing_id)
            if client is not None and client.request_serial == serial and client.request:
                client.timer_armed = False
                return client
        return None

    def next_at(self) -> float:
        """When the next entry comes due (inf: none)."""
        return self.entries[0][0] if self.entries else float("inf")

    def _compact(self) -> None:
        live = []
        for entry in self.entries:
            client = self.clients.get(entry[2])
            if client is not None and client.timer_armed and client.request_serial == entry[1]:
                live.append(entry)
        heapq.heapify(live)
        self.entries = live
