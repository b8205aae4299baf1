"""What the actions of ``zbroker queue`` share: their error line, standard output gone, a reader
group's name as an argument, how long each try of a request to a stream endpoint waits."""

from __future__ import annotations

import argparse
import os
import sys

from pzq import wire


def error(message: str, status: int = 1) -> int:
    """``zbroker queue: `` and the message on standard error; returns ``status``."""
    print(f"zbroker queue: {message}", file=sys.stderr)
    return status


def output_failed(exc: OSError) -> str:
    """Standard output is gone (a closed pipe, a full disk): say so, and point standard
    output at /dev/null so that the interpreter's last flush does not fail again."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.close(null)
    except (OSError, ValueError):
        pass
    return f"cannot write to standard output: {exc.strerror or exc}"


def group_name(text: str) -> str:
    """An argparse type: a reader group's name, as the queue takes it."""
    if wire.group_name_error(text.encode()) is not None:
        shown = repr(text if len(text) <= 40 else text[:40] + "...")
        raise argparse.ArgumentTypeError(
            f"bad group name {shown} ({len(text.encode())} bytes): a group's name is 1 to "
            f"{wire.MAX_GROUP} characters of a-z A-Z 0-9 . _ -")
    return text


def try_timeout(timeout: float) -> float:
    """A stream request is tried 3 times: an unreachable queue fails within about the timeout
    (at least 3 s)."""
    return min(5.0, max(1.0, timeout / 3))
