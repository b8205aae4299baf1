"""pzq's programs, apart from the service that runs inside a broker (the package above): they
use the service's modules, never the other way round, but for ``QUEUE``, which the service
hands to the broker's CLI (``PzqService.commands``).

    standalone.py  the standalone ``pzq`` command: one queue with the original pzq's command
                   line (``python -m zbroker.services.pzq``)
    queue.py       ``zbroker queue put|get|group ...``: its parser, and which action runs
    put.py         ``zbroker queue put``: messages into a queue
    get.py         ``zbroker queue get``: a push queue's messages ACKed, a stream queue's
                   committed, as they are printed
    groups.py      ``zbroker queue group create|list|delete``: a stream queue's reader groups
    location.py    where a queue is: its mode and endpoints, from the command line, the running
                   broker or its config
    common.py      what the actions share: their error line, standard output gone, a group's
                   name as an argument, how long a stream request waits

``QUEUE`` imports queue.py (with the client, the broker's control socket, ...) only when the
command runs or its parser is asked for: the broker's CLI gets it to list the commands, and to
see whether its first word names one.
"""

from __future__ import annotations

import argparse

from zbroker.command import Command


def _queue_parser() -> argparse.ArgumentParser:
    from .queue import parser

    return parser()


def _queue_run(args: argparse.Namespace) -> int:
    from .queue import run

    return run(args)


QUEUE = Command("queue", _queue_parser, _queue_run, usage=(
    "queue put|get QUEUE   put messages into / get them from a pzq queue",
    "queue group create|list|delete QUEUE [G]   a stream queue's reader groups"))
