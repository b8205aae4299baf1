"""Exceptions of the ZPIPES client.

End of stream is never an exception: a read at end of stream returns ``b""``. Everything else
that can go wrong raises one of these, so that end, timeout and failure never look alike:

* :class:`PipeTimeout` (also a builtin :class:`TimeoutError`): the caller's timeout passed.
  Nothing was lost: outstanding requests stay outstanding and a later call picks up from there.
* :class:`PipeFailed`: the broker answered INPUT_FAILED, OUTPUT_FAILED, READ_FAILED,
  WRITE_FAILED or CLOSE_FAILED; ``reason`` is the broker's reason.
* :class:`BrokenPipe` (also a builtin :class:`BrokenPipeError`): a write failed because every
  reader of the stream has gone.
* :class:`BrokerUnavailable`: no broker is running under that name, the connection to it was
  lost (it stopped, died or restarted: a restarted broker has forgotten the pipe end), or it
  stopped answering (hung).
* :class:`ProtocolError`: the broker answered INVALID, or something that is not a valid reply.
"""

from __future__ import annotations

import errno


class ZpipesError(Exception):
    """Base of every ZPIPES client error. ``reason`` is the broker's reason, if it gave one."""

    def __init__(self, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason


class PipeFailed(ZpipesError):
    """The broker refused or failed a request (an ``*_FAILED`` reply)."""


class BrokenPipe(PipeFailed, BrokenPipeError):
    """A write failed because the pipe has no readers any more (like EPIPE)."""

    def __init__(self, message: str, reason: str | None = None) -> None:
        super().__init__(message, reason)
        self.errno = errno.EPIPE


class PipeTimeout(ZpipesError, TimeoutError):
    """The caller's timeout passed before the request could be completed.

    For a write, ``written`` tells how many bytes of the caller's data were handed to the pipe
    before the timeout (they will still be delivered); the rest was not sent.
    """

    def __init__(self, message: str, written: int = 0) -> None:
        super().__init__(message)
        self.errno = errno.ETIMEDOUT
        self.written = written


class BrokerUnavailable(ZpipesError):
    """No broker runs under that name, the connection to it was lost, or it stopped
    answering."""


class ProtocolError(ZpipesError):
    """The broker answered INVALID or sent something that is not a valid reply here."""


__all__ = [
    "BrokenPipe",
    "BrokerUnavailable",
    "PipeFailed",
    "PipeTimeout",
    "ProtocolError",
    "ZpipesError",
]
