"""The ``zpipes read|write`` commands as real processes (``python -m zpipes``) against a real
broker: binary-safe streaming, exit statuses, a closed standard output, Ctrl-C, interactive
use, and ``--help``. Every wait is bounded.
"""

from __future__ import annotations

import hashlib
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from helpers import broker_env, read_within, wait_for

import zpipes

MiB = 1 << 20
WAIT = 30.0  # seconds: the longest any command of these tests may run


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return broker_env(tmp_path)


def _default_sigint() -> None:
    # A test run started in the background may have SIGINT ignored, which a child inherits
    # (and Python then never raises KeyboardInterrupt): give the command the usual default.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def zpipes_cmd(env: dict[str, str], *args: str, stdin: Any = subprocess.PIPE,
               stdout: Any = subprocess.PIPE) -> subprocess.Popen[bytes]:
    """Start ``python -m zpipes ARGS`` (not waiting for it)."""
    return subprocess.Popen([sys.executable, "-m", "zpipes", *args], stdin=stdin,
                            stdout=stdout, stderr=subprocess.PIPE, env=env,
                            preexec_fn=_default_sigint)


def run_zpipes(env: dict[str, str], args: Sequence[str], input: bytes = b"",
               timeout: float = WAIT) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "zpipes", *args], input=input,
                          capture_output=True, env=env, timeout=timeout)


def finish(proc: subprocess.Popen[bytes], timeout: float = WAIT) -> tuple[int, bytes]:
    """Wait for a command started by ``zpipes_cmd``: (exit status, standard error). Its
    standard output must be read already, or not be a pipe."""
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout)
        raise AssertionError(f"{proc.args} still running after {timeout}s; stderr: "
                             f"{proc.stderr.read()!r}") from None
    return proc.returncode, proc.stderr.read()


def assert_quiet_failure(status: int, err: bytes, *words: str) -> None:
    """Exit status 1 and one line on standard error: "zpipes: ...", no traceback."""
    text = err.decode(errors="replace")
    assert status == 1, text
    assert text.startswith("zpipes: ") and text.count("\n") == 1, text
    assert "Traceback" not in text
    for word in words:
        assert word in text, text


def kill_all(*procs: subprocess.Popen[bytes]) -> None:
    """Clean-up: kill what still runs, reap it, close its pipes."""
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(WAIT)
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                try:
                    stream.close()
                except BrokenPipeError:
                    pass


# --- streaming -------------------------------------------------------------------------------


def test_binary_safe_round_trip(broker, env):
    data = bytes(range(256)) * 64 + b"\r\n\0\x1a\xff" + os.urandom(MiB) + b"no newline at end"
    reader = zpipes_cmd(env, "read", "--broker", broker.name, "bin", stdin=subprocess.DEVNULL)
    writer = run_zpipes(env, ["write", "--broker", broker.name, "bin"], input=data)
    assert writer.returncode == 0 and writer.stderr == b""
    out, err = reader.communicate(timeout=WAIT)
    assert reader.returncode == 0 and err == b""
    assert out == data


def wait_attached(broker: Any, pipe: str, role: str = "reader") -> None:
    """Wait until the broker logged that a ``role`` ("reader" or "writer") opened ``pipe``."""
    def attached() -> bool:
        return any("pipe opened" in line and f"pipe={pipe} " in line and f"role={role}" in line
                   for line in broker.stderr().splitlines())

    wait_for(attached, WAIT, f"a {role} of pipe {pipe!r} in the broker's log")


def test_empty_input_gives_an_empty_stream(broker, env):
    reader = zpipes_cmd(env, "read", "--broker", broker.name, "empty", stdin=subprocess.DEVNULL)
    # as with a FIFO, a writer that came and went before the reader opened is not seen
    wait_attached(broker, "empty")
    writer = run_zpipes(env, ["write", "--broker", broker.name, "empty"], input=b"")
    assert writer.returncode == 0
    out, err = reader.communicate(timeout=WAIT)
    assert (reader.returncode, out, err) == (0, b"", b"")


def test_256mib_of_random_data_sha256_agrees(broker, env):
    """``head -c 256M /dev/urandom | zpipes write p`` and ``zpipes read p | sha256sum``."""
    blocks = 256
    reader = zpipes_cmd(env, "read", "--broker", broker.name, "big", stdin=subprocess.DEVNULL)
    writer = zpipes_cmd(env, "write", "--broker", broker.name, "big",
                        stdout=subprocess.DEVNULL)
    sent = hashlib.sha256()
    feeding_error: list[BaseException] = []

    def feed() -> None:
        try:
            for _ in range(blocks):
                block = os.urandom(MiB)
                sent.update(block)
                writer.stdin.write(block)
            writer.stdin.close()
        except BaseException as exc:  # reported below
            feeding_error.append(exc)

    feeder = threading.Thread(target=feed, daemon=True)
    start = time.monotonic()
    feeder.start()
    try:
        got = hashlib.sha256()
        size = 0
        fd = reader.stdout.fileno()
        while True:
            assert time.monotonic() - start < 120, f"only {size} bytes after 120 s"
            if not select.select([fd], [], [], 5)[0]:
                continue
            piece = os.read(fd, MiB)
            if not piece:
                break
            got.update(piece)
            size += len(piece)
        feeder.join(WAIT)
        assert not feeding_error, feeding_error
        assert size == blocks * MiB
        assert got.hexdigest() == sent.hexdigest()
        assert finish(writer) == (0, b"")
        assert finish(reader) == (0, b"")
    finally:
        kill_all(writer, reader)


# --- exit statuses ---------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["read", "write"])
def test_no_broker_exits_1_with_a_message_and_no_traceback(env, command):
    absent = f"absent-{os.getpid()}-{time.monotonic_ns()}"
    start = time.monotonic()
    result = run_zpipes(env, [command, "--broker", absent, "p"], input=b"data")
    assert time.monotonic() - start < 10
    assert_quiet_failure(result.returncode, result.stderr, "not running")
    assert result.stdout == b""


def test_writer_whose_reader_left_exits_1_no_readers(broker, env):
    writer = zpipes_cmd(env, "write", "--broker", broker.name, "left", stdout=subprocess.DEVNULL)
    try:
        with zpipes.open("left", "r", broker=broker.name, timeout=10) as reader:
            writer.stdin.write(b"first line\n")
            writer.stdin.flush()
            assert reader.readline() == b"first line\n"
        # the reader has gone: what the writer sends next has nowhere to go
        deadline = time.monotonic() + 10
        try:
            while writer.poll() is None and time.monotonic() < deadline:
                writer.stdin.write(b"more\n")
                writer.stdin.flush()
                time.sleep(0.02)
        except BrokenPipeError:
            pass  # the writer exited while we fed it
        status, err = finish(writer)
        assert_quiet_failure(status, err, "no readers")
    finally:
        kill_all(writer)


def test_read_timeout_exits_1_when_nothing_comes(broker, env):
    start = time.monotonic()
    result = run_zpipes(env, ["read", "--broker", broker.name, "--timeout", "0.5", "quiet"])
    assert 0.4 < time.monotonic() - start < 10
    assert_quiet_failure(result.returncode, result.stderr, "timed out")


@pytest.mark.parametrize("args", [
    [],
    ["read"],
    ["write"],
    ["copy", "p"],
    ["read", ""],
    ["read", "x" * 256],
    ["read", "p", "extra"],
    ["read", "--timeout", "soon", "p"],
    ["write", "--timeout", "0", "p"],
    ["read", "--no-such-option", "p"],
])
def test_usage_errors_exit_2(env, args):
    result = run_zpipes(env, args)
    text = result.stderr.decode()
    assert result.returncode == 2, text
    assert "usage:" in text and "Traceback" not in text


# --- ends of the command's life --------------------------------------------------------------


def test_closed_stdout_ends_read_quietly(broker, env):
    """``zpipes read p | head -c 10``: exit 0, nothing on standard error."""
    reader = zpipes_cmd(env, "read", "--broker", broker.name, "head", stdin=subprocess.DEVNULL)
    writer = zpipes_cmd(env, "write", "--broker", broker.name, "head",
                        stdout=subprocess.DEVNULL)
    try:
        writer.stdin.write(b"0123456789" * 1000 + b"\n")
        writer.stdin.flush()
        assert read_within(reader.stdout.fileno(), 10, WAIT) == b"0123456789"
        reader.stdout.close()  # what `head -c 10` does once it has its 10 bytes
        try:
            for _ in range(64):  # keep the data coming, as a producer in a pipeline would
                writer.stdin.write(os.urandom(64 * 1024))
                writer.stdin.flush()
                if reader.poll() is not None:
                    break
        except BrokenPipeError:
            pass
        status = reader.wait(WAIT)
        err = reader.stderr.read()
        assert (status, err) == (0, b"")
    finally:
        kill_all(writer, reader)


def test_closed_stdout_in_a_shell_pipeline_with_head(broker, env):
    script = (f'{sys.executable} -m zpipes read --broker {broker.name} sh | head -c 10; '
              'echo " status=${PIPESTATUS[0]}"')
    reader = subprocess.Popen(["bash", "-c", script], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, env=env)
    writer = zpipes_cmd(env, "write", "--broker", broker.name, "sh", stdout=subprocess.DEVNULL)
    try:
        try:
            for _ in range(200):
                writer.stdin.write(b"0123456789" * 6000)
                writer.stdin.flush()
                if reader.poll() is not None:
                    break
        except BrokenPipeError:
            pass
        out, err = reader.communicate(timeout=WAIT)
        assert out == b"0123456789 status=0\n"
        assert err == b""
    finally:
        kill_all(writer, reader)


@pytest.mark.parametrize("signum,status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)],
                         ids=["SIGINT-130", "SIGTERM-143"])
@pytest.mark.parametrize("command", ["read", "write"])
def test_interrupted_command_exits_quietly(broker, env, command, signum, status):
    # read: waits for a writer; write: waits for input, then for a reader
    pipe = f"intr-{signum}"
    proc = zpipes_cmd(env, command, "--broker", broker.name, pipe)
    try:
        if command == "write":
            proc.stdin.write(b"waiting for a reader\n")
            proc.stdin.flush()
        wait_attached(broker, pipe, "writer" if command == "write" else "reader")
        time.sleep(0.2)  # a window: it stays, waiting
        assert proc.poll() is None
        proc.send_signal(signum)
        got, err = finish(proc, 10)
        assert got == status, err
        assert err == b""
    finally:
        kill_all(proc)


# --- a cut stream: the writer stopped before the end of its input ---------------------------


def outcome(proc: subprocess.Popen[bytes], timeout: float = WAIT) -> tuple[int, bytes, bytes]:
    """Wait for a command started by ``zpipes_cmd``: (exit status, the rest of its standard
    output, its standard error)."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate(timeout=timeout)
        raise AssertionError(f"{proc.args} still running after {timeout}s; "
                             f"stdout: {len(out)} bytes; stderr: {err!r}") from None
    return proc.returncode, out, err


def start_streaming(broker: Any, env: dict[str, str], pipe: str, data: bytes,
                    stdin: Any = subprocess.PIPE) -> tuple[Any, Any]:
    """A ``zpipes read`` and a ``zpipes write`` of ``pipe`` (standard input: ``stdin``; a pipe
    is fed ``data``); returns (reader, writer) once the reader has written out ``data``."""
    reader = zpipes_cmd(env, "read", "--broker", broker.name, pipe, stdin=subprocess.DEVNULL)
    wait_attached(broker, pipe)  # the reader is in the writer's stream from its start
    writer = zpipes_cmd(env, "write", "--broker", broker.name, pipe, stdin=stdin,
                        stdout=subprocess.DEVNULL)
    if stdin is subprocess.PIPE:
        writer.stdin.write(data)
        writer.stdin.flush()  # and the input stays open: no end of input
    return reader, writer


@pytest.mark.parametrize("signum, status", [
    (signal.SIGTERM, 143), (signal.SIGINT, 130), (signal.SIGKILL, -signal.SIGKILL)])
def test_interrupted_write_cuts_the_stream_and_read_exits_1_after_the_data(
        broker, env, signum, status):
    """A writer stopped by a signal aborts (or, killed, just loses its connection): its reader
    fails ("writer lost") after the data that came before, instead of exiting 0 as if the
    stream were whole."""
    data = os.urandom(100_000)
    reader, writer = start_streaming(broker, env, "cut", data)
    try:
        assert read_within(reader.stdout.fileno(), len(data), WAIT) == data
        writer.send_signal(signum)
        assert finish(writer) == (status, b"")
        read_status, rest, err = outcome(reader)
        assert rest == b""
        assert_quiet_failure(read_status, err, "writer lost")
    finally:
        kill_all(writer, reader)


def test_write_whose_input_fails_cuts_the_stream_and_exits_1(broker, env):
    """Reading standard input fails (here a TCP connection reset by its peer; a terminal that
    hangs up fails the same way, but may also just read as the end of input): the writer
    aborts and exits 1 with one line; its reader fails after the data that came before."""
    data = os.urandom(3000)
    with socket.create_server(("127.0.0.1", 0)) as server:
        source = socket.create_connection(server.getsockname())
        feed, _ = server.accept()
    try:
        reader, writer = start_streaming(broker, env, "eio", data, stdin=source.fileno())
    finally:
        source.close()  # the writer has its own copy
    try:
        feed.sendall(data)
        assert read_within(reader.stdout.fileno(), len(data), WAIT) == data
        # the input fails: a reset (linger 0), not an end of input
        feed.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        feed.close()
        status, err = finish(writer)
        assert_quiet_failure(status, err, "cannot read standard input",
                             "Connection reset by peer")
        read_status, rest, err = outcome(reader)
        assert rest == b""
        assert_quiet_failure(read_status, err, "writer lost")
    finally:
        feed.close()
        kill_all(writer, reader)


def test_complete_stream_read_exits_0_and_sha256_agrees(broker, env):
    """The end of the input ends the stream: the reader exits 0 with every byte."""
    data = os.urandom(3 * MiB + 17)
    reader = zpipes_cmd(env, "read", "--broker", broker.name, "whole", stdin=subprocess.DEVNULL)
    writer = None
    try:
        wait_attached(broker, "whole")
        writer = run_zpipes(env, ["write", "--broker", broker.name, "whole"], input=data)
        assert (writer.returncode, writer.stderr) == (0, b"")
        status, out, err = outcome(reader)
        assert (status, err) == (0, b"")
        assert hashlib.sha256(out).hexdigest() == hashlib.sha256(data).hexdigest()
    finally:
        kill_all(reader)


def test_broker_stopping_ends_read_with_status_1_and_a_message(start_broker, env):
    b = start_broker()
    reader = zpipes_cmd(env, "read", "--broker", b.name, "stop", stdin=subprocess.DEVNULL)
    try:
        wait_attached(b, "stop")
        time.sleep(0.2)  # a window: it stays, connected and waiting for a writer
        assert reader.poll() is None
        assert b.stop() == 0
        status, err = finish(reader, 15)
        assert_quiet_failure(status, err, "broker stopping")
        assert reader.stdout.read() == b""
    finally:
        kill_all(reader)


def test_read_exits_promptly_with_broker_stopping_when_the_broker_stops(start_broker, env):
    """The broker's "broker stopping" reaches the command (it once could be lost), and the
    command exits at once (it once sent CLOSE to the gone broker and waited 5 s)."""
    b = start_broker()
    reader = zpipes_cmd(env, "read", "--broker", b.name, "stop", stdin=subprocess.DEVNULL)
    try:
        wait_attached(b, "stop")
        time.sleep(0.2)  # a window: it stays, waiting for a writer
        assert reader.poll() is None
        assert b.stop() == 0
        stopped_at = time.monotonic()
        status, err = finish(reader, 15)
        assert time.monotonic() - stopped_at < 2.0
        assert_quiet_failure(status, err, "broker stopping")
    finally:
        kill_all(reader)


def test_broker_killed_ends_read_with_status_1_in_bounded_time(start_broker, env):
    b = start_broker()
    reader = zpipes_cmd(env, "read", "--broker", b.name, "kill", stdin=subprocess.DEVNULL)
    try:
        wait_attached(b, "kill")
        time.sleep(0.2)  # a window: it stays, waiting for a writer
        assert reader.poll() is None
        b.kill()
        killed_at = time.monotonic()
        status, err = finish(reader, 15)
        # the connection drops with the process: no need to wait for broker_timeout
        assert time.monotonic() - killed_at < 2.0
        assert_quiet_failure(status, err, "lost the connection")
    finally:
        kill_all(reader)


# --- interactive use -------------------------------------------------------------------------


def test_interactive_line_reaches_the_reader_within_0_2_s(broker, env):
    reader = zpipes_cmd(env, "read", "--broker", broker.name, "chat", stdin=subprocess.DEVNULL)
    writer = zpipes_cmd(env, "write", "--broker", broker.name, "chat",
                        stdout=subprocess.DEVNULL)
    out = reader.stdout.fileno()
    try:
        # both ends open and streaming: the first line may take as long as starting up takes
        writer.stdin.write(b"hello\n")
        writer.stdin.flush()
        assert read_within(out, 6, WAIT) == b"hello\n"
        delays = []
        for i in range(5):
            line = f"line {i}\n".encode()
            time.sleep(0.1)  # a pause, as one types: the writer is idle when the line comes
            start = time.monotonic()
            writer.stdin.write(line)
            writer.stdin.flush()  # stdin stays open: no more data, no end of input
            assert read_within(out, len(line), 5) == line
            delays.append(time.monotonic() - start)
        assert max(delays) < 0.2, delays
        writer.stdin.close()
        assert finish(writer) == (0, b"")
        assert finish(reader) == (0, b"")
    finally:
        kill_all(writer, reader)


# --- help ------------------------------------------------------------------------------------


@pytest.mark.parametrize("command, words", [
    ("read", ["NAME", "standard output", "--broker", "--timeout", "end of the stream",
              "exit status 1", "writer was lost", "143"]),
    ("write", ["NAME", "standard input", "--broker", "--timeout", "close", "aborts",
               "writer lost", "130", "143"]),
])
def test_help_of_each_sub_command_exits_0_and_explains(env, command, words):
    result = run_zpipes(env, [command, "--help"])
    text = result.stdout.decode()
    assert result.returncode == 0 and result.stderr == b""
    assert text.startswith(f"usage: zpipes {command}")
    for word in words:
        assert word in " ".join(text.split()), (word, text)


def test_top_level_help_lists_both_commands_and_exit_statuses(env):
    result = run_zpipes(env, ["--help"])
    text = " ".join(result.stdout.decode().split())
    assert result.returncode == 0
    for word in ("read", "write", "Exit status", "130", "143", "writer was lost"):
        assert word in text, text
