"""The pipe ends of this broker's clients: opened in the pipe table and announced to the
pipe directory; closed, with what the other brokers are told (a DETACH with the failure of
a writer's stream, a CLOSE that waits until the brokers of its readers have its end). No I/O.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from .clients import Client
from .machine import Event
from .pipes import PipeTable, pipe_name_problem, shown

if TYPE_CHECKING:
    from .directory import DirectoryMember
    from .links import PeerLinks


class ClientEnds:
    def __init__(self, log: Any, pipes: PipeTable, woken: deque[int], end_ids: Iterator[int],
                 links: PeerLinks, directory: DirectoryMember) -> None:
        self.log = log  # (per-pipe lines: budget "lines", zbroker/logs/budget.py)
        self.pipes = pipes
        self._woken = woken  # ends the pipe table says may now be answered
        self._end_ids = end_ids  # (shared with the peer links' remote ends: one table)
        self.links, self.directory = links, directory
        self._by_end: dict[int, Client] = {}
        self.closed_bytes_written = 0  # bytes written by local writers whose end is gone
        self.closed_bytes_read = 0  # bytes read by local readers whose end is gone

    def client_of(self, end: int) -> Client | None:
        return self._by_end.get(end)

    def open(self, client: Client, role: str, name: bytes) -> str | None:
        """Open ``client``'s end of pipe ``name`` as ``role``; why it cannot, or None."""
        problem = pipe_name_problem(name)
        if problem:
            self.log.info("pipe open refused", budget="lines", client=client.id,
                          pipe=shown(name), role=role, reason=problem)
            return problem
        end = next(self._end_ids)
        attach = self.pipes.attach_reader if role == "reader" else self.pipes.attach_writer
        self._woken.extend(attach(name, end))
        client.end, client.pipe = end, name
        self._by_end[end] = client
        self.directory.announce(role, end, name)
        pipe = self.pipes.pipes[name]
        self.log.info("pipe opened", budget="lines", client=client.id, pipe=shown(name),
                      role=role, readers=len(pipe.readers), writers=len(pipe.writers))
        return None

    def close(self, client: Client, event: Event, lost: str | None, cut: bool) -> None:
        """Close ``client``'s end, for ``event`` (its CLOSE, or what ended it): ``lost``
        says why it went without a CLOSE (its readers' streams break with it), ``cut``: it
        was closed with a WRITE pending."""
        end = client.end
        assert end is not None
        pipe = self.pipes.pipe_of(end)
        if pipe is not None and end in pipe.readers:
            r = pipe.readers[end]
            role, sizes = "reader", {"bytes_read": r.bytes_out, "bytes_discarded": r.queued}
            self.closed_bytes_read += r.bytes_out
        else:
            role, sizes = "writer", {"bytes_written": self.pipes.writer(end).bytes_in}
            self.closed_bytes_written += sizes["bytes_written"]
        # the other brokers' readers of a writer's stream learn that it broke; a reader's loss
        # only shrinks its writers' audience, wherever they are
        failure = (lost or self.pipes.writer(end).failure) if role == "writer" else None
        if failure is not None and event is Event.CLOSE and not cut \
                and client.failed_end != end:  # (a WRITE_FAILED told it already)
            client.close_failure = failure  # its stream never reached its end: say so
        told = self.directory.told_of(end)
        confirming = (self.links.confirming_brokers(end)
                      if role == "writer" and failure is None else None)
        self._woken.extend(self.pipes.detach(end, lost))
        del self._by_end[end]
        self.links.send_detach(told, end, failure)
        if confirming:  # its CLOSE waits until the brokers of its readers have its end
            self.links.await_confirmation(client, end, confirming)
        self.directory.unregister(end, failure)
        fields: dict[str, Any] = {**sizes, **({"lost": lost} if lost else {})}
        self.log.info("pipe closed", budget="lines", client=client.id, pipe=shown(client.pipe),
                      role=role, why=str(event),
                      pipe_gone=client.pipe not in self.pipes.pipes, **fields)
        client.end = client.pipe = None
