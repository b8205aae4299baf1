"""The ``zpipes`` command: copy standard input into a named pipe, or a named pipe to standard
output.

    producer | zpipes write NAME        # closes the pipe at end of input
    zpipes read NAME | consumer         # ends at end of stream

``zpipes write`` closes the pipe only at the end of its input: then its readers see the end of
the stream. Stopped any other way (Ctrl-C, SIGTERM, an error reading its input, a pipe or
broker failure) it aborts instead, and its readers fail with "writer lost" after the data the
broker took. ``zpipes read`` exits 0 only at the end of a whole stream (every writer closed);
a cut stream makes it exit 1 with the broker's reason.

Exit status: 0 success, 1 pipe or broker failure (one line on standard error), 2 usage,
130 interrupted (SIGINT, Ctrl-C), 143 terminated (SIGTERM). ``zpipes read`` ends quietly, with
status 0, when its standard output is closed.
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

from zpipes import client, progress
from zpipes.errors import ZpipesError
from zpipes.version import VersionAction

TYPE_CHECKING = False  # (typing is not imported at run time: see zpipes/__init__.py)
if TYPE_CHECKING:
    from typing import Any

STDIN, STDOUT = 0, 1
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED, EXIT_TERMINATED = 0, 1, 2, 130, 143
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
        help=f"the broker to use (default: ${client.BROKER_ENV}, else 'local'; now "
        f"{client.DEFAULT_BROKER!r}; it listens on {client.endpoint('NAME')})",
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
        help="the broker's ZPIPES endpoint, if it is not the default for its name (its "
        "services.zpipes.endpoint, e.g. tcp://host:PORT; not the cluster's port)",
    )
    common.add_argument(
        "--progress",
        action="store_true",
        default=argparse.SUPPRESS,
        help="show bytes moved, rate and elapsed time on standard error (with a regular "
        f"file as input: percent and time left), like pv; also {progress.ENV}=1. Redrawn "
        "in place on a terminal, else one summary line at the end",
    )
    parser = argparse.ArgumentParser(
        prog="zpipes",
        parents=[common],
        description="Reliable named pipes served by a zbroker. Data is copied byte for byte "
        "(binary-safe); a writer blocks while no reader is attached or the reader is slow.",
        epilog="Exit status: 0 success (for read: the whole stream, every writer closed), "
        "1 pipe or broker failure (for read also: a writer was lost, the stream is cut), "
        "2 usage error, 130 interrupted (SIGINT), 143 terminated (SIGTERM). Example: "
        "'tar c dir | zpipes write backup' in one shell and 'zpipes read backup | tar x' in "
        "another.",
    )
    parser.add_argument("--version", action=VersionAction)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    write = commands.add_parser(
        "write",
        parents=[common],
        help="copy standard input into a pipe",
        description="Copy standard input into pipe NAME; at end of input, wait until the "
        "broker has taken all of it, then close the pipe so that the reader sees the end of "
        "the stream. Input is passed on as soon as it arrives (fit for interactive use). "
        "Stopped before the end of its input (SIGINT: exit status 130, SIGTERM: 143, an error "
        "reading standard input or a pipe failure: 1), it aborts the pipe instead: the reader "
        "fails (\"writer lost\") after the data passed on before.",
    )
    write.add_argument("name", metavar="NAME", help="the pipe's name (1 to 255 bytes of UTF-8)")
    write.set_defaults(command_parser=write)
    read = commands.add_parser(
        "read",
        parents=[common],
        help="copy a pipe to standard output",
        description="Copy pipe NAME to standard output until the end of the stream (all "
        "writers closed): exit status 0. Data is written out as soon as it arrives. If the "
        "stream is cut (a writer was lost: it was interrupted, killed or failed) or the pipe "
        "fails, exit status 1 with the broker's reason on standard error, after the data "
        "that came before. Ends quietly (status 0) when standard output is closed. SIGINT: "
        "exit status 130, SIGTERM: 143.",
    )
    read.add_argument("name", metavar="NAME", help="the pipe's name (1 to 255 bytes of UTF-8)")
    read.set_defaults(command_parser=read)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # a usage error after the command is told with the usage of that command
    command_parser = args.command_parser
    if extra:
        command_parser.error(f"unrecognized arguments: {' '.join(extra)}")
    broker = getattr(args, "broker", client.DEFAULT_BROKER)
    timeout = getattr(args, "timeout", None)
    address = getattr(args, "endpoint", None)
    try:
        name = client.check_pipe_name(os.fsencode(args.name))
        client.check_broker_name(broker)
    except (ValueError, TypeError) as exc:
        command_parser.error(str(exc))
    meter = progress.Progress(label=f"zpipes {args.command}:") if progress.wanted(
        getattr(args, "progress", False)) else None
    old_term = _raise_on_sigterm()
    try:
        if args.command == "write":
            return _write(name, broker, timeout, address, meter)
        return _read(name, broker, timeout, address, meter)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except Terminated:
        return EXIT_TERMINATED
    except ZpipesError as exc:
        if meter is not None:
            meter.finish()  # what moved, then why it stopped
        _complain(str(exc))
        return EXIT_FAILED
    finally:
        if meter is not None:
            meter.finish()
        if old_term is not None:
            signal.signal(signal.SIGTERM, old_term)


class Terminated(BaseException):
    """SIGTERM arrived: raised like KeyboardInterrupt for SIGINT, so that the pipe end is
    aborted on the way out (dying of the signal would drop the connection too, but leave
    nothing to say why)."""


def _on_sigterm(signum: int, frame: Any) -> None:
    raise Terminated()


def _raise_on_sigterm() -> Any:
    """Make SIGTERM raise :class:`Terminated`; the previous handler (None: not the main
    thread, or SIGTERM is ignored, which stays so)."""
    try:
        if signal.getsignal(signal.SIGTERM) is signal.SIG_IGN:
            return None
        return signal.signal(signal.SIGTERM, _on_sigterm)
    except ValueError:  # not the main thread
        return None


def _write(name: bytes, broker: str, timeout: float | None, address: str | None,
           meter: progress.Progress | None = None) -> int:
    """Copy standard input into the pipe; close it at the end of the input, abort it (the
    readers fail) on anything else."""
    _grow_os_pipe(STDIN)
    if meter is not None:
        meter.total = _input_size(STDIN)
    pipe = client.PipeWriter(name, broker, timeout, endpoint=address)
    try:
        try:
            while True:
                sent = pipe.write_from(STDIN)
                if not sent:
                    break
                if meter is not None:
                    meter.add(sent)
        except OSError as exc:
            if isinstance(exc, ZpipesError):
                raise
            _quiet_abort(pipe)
            _complain(f"cannot read standard input: {exc.strerror or exc}")
            return EXIT_FAILED
        pipe.close()  # waits for the last WRITE_OK and CLOSE_OK; aborts if that fails
        return EXIT_OK
    except BaseException:
        _quiet_abort(pipe)
        raise


def _read(name: bytes, broker: str, timeout: float | None, address: str | None,
          meter: progress.Progress | None = None) -> int:
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
            if meter is not None:
                meter.add(len(view))
        pipe.close()
        return EXIT_OK
    except BaseException:
        _quiet_abort(pipe)
        raise


def _quiet_abort(pipe: client.PipeReader | client.PipeWriter) -> None:
    """Abort the pipe end at once (a writer's readers fail), with SIGINT and SIGTERM held
    off so that a second signal cannot leave it half done."""
    if pipe.closed:
        return
    held = {}
    for signum in (signal.SIGINT, signal.SIGTERM):
        try:
            held[signum] = signal.signal(signum, signal.SIG_IGN)
        except ValueError:  # not the main thread
            pass
    try:
        pipe.abort()
    except Exception:  # the error that brought us here is the one to report
        pass
    finally:
        for signum, old in held.items():
            signal.signal(signum, old)


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


def _input_size(fd: int) -> int | None:
    """Bytes left to read on ``fd`` if it is a regular file (else None: unknown)."""
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None
        return max(0, info.st_size - os.lseek(fd, 0, os.SEEK_CUR))
    except OSError:
        return None


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
