"""The ``zpipes`` command: copy standard input into a named pipe, or a named pipe to standard
output.

    producer | zpipes write NAME        # closes the pipe at end of input
    zpipes read NAME | consumer         # ends at end of stream

Exit status: 0 success, 1 pipe or broker failure (one line on standard error), 2 usage,
130 interrupted (Ctrl-C). ``zpipes read`` ends quietly, with status 0, when its standard output
is closed.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import os
import select
import signal
import stat
import sys
from collections.abc import Sequence

from zpipes import client
from zpipes.errors import ZpipesError

STDIN, STDOUT = 0, 1
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
PIPE_SIZE = 1 << 20  # ask the kernel for OS pipes this big on our side (best effort)


def _timeout(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError("must be more than 0 seconds")
    return value


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--broker",
        metavar="NAME",
        default=argparse.SUPPRESS,
        help=f"the broker to use (default: {client.DEFAULT_BROKER!r}; it listens on "
        f"{client.endpoint('NAME')})",
    )
    common.add_argument(
        "--timeout",
        metavar="SECONDS",
        type=_timeout,
        default=argparse.SUPPRESS,
        help="give up (exit status 1) when opening the pipe or a single read or write on it "
        "takes longer than this (default: wait for ever)",
    )
    common.add_argument(
        "--endpoint",
        metavar="URL",
        default=argparse.SUPPRESS,
        help="the broker's ZPIPES endpoint, if it is not the default for its name (e.g. "
        "tcp://host:5670)",
    )
    parser = argparse.ArgumentParser(
        prog="zpipes",
        parents=[common],
        description="Reliable named pipes served by a zbroker. Data is copied byte for byte "
        "(binary-safe); a writer blocks while no reader is attached or the reader is slow.",
        epilog="Exit status: 0 success, 1 pipe or broker failure, 2 usage error, "
        "130 interrupted. Example: 'tar c dir | zpipes write backup' in one shell and "
        "'zpipes read backup | tar x' in another.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    write = commands.add_parser(
        "write",
        parents=[common],
        help="copy standard input into a pipe",
        description="Copy standard input into pipe NAME; at end of input, wait until the "
        "broker has taken all of it, then close the pipe so that the reader sees the end of "
        "the stream. Input is passed on as soon as it arrives (fit for interactive use).",
    )
    write.add_argument("name", metavar="NAME", help="the pipe's name (1 to 255 bytes of UTF-8)")
    read = commands.add_parser(
        "read",
        parents=[common],
        help="copy a pipe to standard output",
        description="Copy pipe NAME to standard output until the end of the stream (all "
        "writers closed). Data is written out as soon as it arrives. Ends quietly when "
        "standard output is closed.",
    )
    read.add_argument("name", metavar="NAME", help="the pipe's name (1 to 255 bytes of UTF-8)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    broker = getattr(args, "broker", client.DEFAULT_BROKER)
    timeout = getattr(args, "timeout", None)
    address = getattr(args, "endpoint", None)
    try:
        name = client.check_pipe_name(os.fsencode(args.name))
        client.check_broker_name(broker)
    except (ValueError, TypeError) as exc:
        parser.error(str(exc))
    try:
        if args.command == "write":
            return _write(name, broker, timeout, address)
        return _read(name, broker, timeout, address)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except ZpipesError as exc:
        _complain(str(exc))
        return EXIT_FAILED


def _write(name: bytes, broker: str, timeout: float | None, address: str | None) -> int:
    _grow_os_pipe(STDIN)
    pipe = client.PipeWriter(name, broker, timeout, endpoint=address)
    try:
        try:
            while pipe.write_from(STDIN):
                pass
        except OSError as exc:
            if isinstance(exc, ZpipesError):
                raise
            pipe.abort()
            _complain(f"cannot read standard input: {exc.strerror or exc}")
            return EXIT_FAILED
        pipe.close()  # waits for the last WRITE_OK and CLOSE_OK
        return EXIT_OK
    except BaseException:
        _quiet_abort(pipe)
        raise


def _read(name: bytes, broker: str, timeout: float | None, address: str | None) -> int:
    _grow_os_pipe(STDOUT)
    pipe = client.PipeReader(name, broker, timeout, endpoint=address)
    try:
        while True:
            view = pipe.readview()
            if not view:
                break
            try:
                _write_all(STDOUT, view)
            except OSError as exc:
                pipe.close()
                if exc.errno == errno.EPIPE:
                    _silence_stdout()
                    return EXIT_OK
                _complain(f"cannot write standard output: {exc.strerror or exc}")
                return EXIT_FAILED
        pipe.close()
        return EXIT_OK
    except BaseException:
        _quiet_abort(pipe)
        raise


def _quiet_abort(pipe: client.PipeReader | client.PipeWriter) -> None:
    """Close the pipe end at once, with Ctrl-C held off so that it is closed properly."""
    if pipe.closed:
        return
    try:
        old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:  # not the main thread
        old = None
    try:
        pipe.abort()
    except Exception:  # the error that brought us here is the one to report
        pass
    finally:
        if old is not None:
            signal.signal(signal.SIGINT, old)


def _write_all(fd: int, data: memoryview) -> None:
    while data:
        try:
            written = os.write(fd, data)
        except BlockingIOError:  # someone made our output non-blocking
            select.select([], [fd], [])
            continue
        except InterruptedError:
            continue
        data = data[written:]


def _grow_os_pipe(fd: int) -> None:
    """If ``fd`` is an OS pipe, make it bigger: fewer, larger reads and writes."""
    try:
        if stat.S_ISFIFO(os.fstat(fd).st_mode):
            fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
    except (OSError, AttributeError):
        pass


def _silence_stdout() -> None:
    """Standard output is gone: point it at /dev/null so that nothing at exit complains."""
    with contextlib.suppress(OSError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, STDOUT)
        os.close(devnull)


def _complain(message: str) -> None:
    with contextlib.suppress(OSError):
        sys.stderr.write(f"zpipes: {message}\n")
        sys.stderr.flush()


if __name__ == "__main__":
    sys.exit(main())
