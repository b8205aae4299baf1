"""``--progress`` of ``zpipes write|read`` and ``zbroker queue put``, as real processes through
a real broker (and a standalone pzq): standard output is byte for byte the same with and
without it, and standard error carries the progress — one summary line when it is not a
terminal, a line redrawn in place (carriage returns) when it is.
"""

from __future__ import annotations

import os
import pty
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import broker_env
from test_zpipes_cli import WAIT, finish, kill_all, zpipes_cmd

MiB = 1 << 20


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return broker_env(tmp_path)


def transfer(env: dict[str, str], broker: str, pipe: str, source: Path, *flags: str,
             stderr_fd: int | None = None) -> tuple[bytes, bytes, bytes]:
    """Copy ``source`` (a regular file on the writer's standard input) through ``pipe``:
    (reader's stdout, reader's stderr, writer's stderr)."""
    reader = zpipes_cmd(env, "read", "--broker", broker, pipe, *flags, stdin=subprocess.DEVNULL)
    try:
        with open(source, "rb") as f:
            writer = subprocess.Popen(
                [sys.executable, "-m", "zpipes", "write", "--broker", broker, pipe, *flags],
                stdin=f, stdout=subprocess.PIPE,
                stderr=stderr_fd if stderr_fd is not None else subprocess.PIPE, env=env)
        wout, werr = writer.communicate(timeout=WAIT)
        assert writer.returncode == 0 and wout == b"", werr
        out, rerr = reader.communicate(timeout=WAIT)
        assert reader.returncode == 0, rerr
        return out, rerr, werr or b""
    finally:
        kill_all(reader)


def test_progress_goes_to_stderr_only_and_stdout_is_the_same(broker, env, tmp_path):
    data = os.urandom(3 * MiB + 123)
    source = tmp_path / "data.bin"
    source.write_bytes(data)
    plain, rerr, werr = transfer(env, broker.name, "plain", source)
    assert plain == data and rerr == b"" and werr == b""

    shown, rerr, werr = transfer(env, broker.name, "shown", source, "--progress")
    assert shown == plain
    # not a terminal: one summary line each, no carriage return
    assert re.fullmatch(rb"zpipes write: 3\.0 MiB  \S+ \S+/s  0:\d\d:\d\d  100%\n", werr), werr
    assert re.fullmatch(rb"zpipes read: 3\.0 MiB  \S+ \S+/s  0:\d\d:\d\d\n", rerr), rerr

    by_env = dict(env, ZPIPES_PROGRESS="1")
    again, rerr, werr = transfer(by_env, broker.name, "env", source)
    assert again == plain
    assert werr.startswith(b"zpipes write: 3.0 MiB") and rerr.startswith(b"zpipes read: ")


def test_progress_is_redrawn_in_place_on_a_terminal(broker, env, tmp_path):
    source = tmp_path / "data.bin"
    source.write_bytes(os.urandom(MiB))
    main, tty_end = pty.openpty()
    try:
        out, _, _ = transfer(env, broker.name, "tty", source, "--progress", stderr_fd=tty_end)
        os.close(tty_end)
        tty_end = -1
        shown = b""
        while True:
            try:
                piece = os.read(main, 65536)
            except OSError:  # EIO: the terminal's other end is closed and all is read
                break
            if not piece:
                break
            shown += piece
    finally:
        os.close(main)
        if tty_end >= 0:
            os.close(tty_end)
    assert out == source.read_bytes()
    assert shown.startswith(b"\rzpipes write: ") and shown.endswith(b"\r\n"), shown
    assert shown.rstrip().rsplit(b"\r", 1)[-1].startswith(b"zpipes write: 1.0 MiB"), shown
    assert b"100%" in shown


def test_queue_put_progress(start_pzq, tmp_path):
    q = start_pzq()
    lines = b"".join(b"message %d\n" % i for i in range(500))
    env = broker_env(tmp_path)

    def put(*flags: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run([sys.executable, "-m", "zbroker", "queue", "put", "jobs",
                               "--receive", q.receive, *flags], input=lines,
                              capture_output=True, env=env, timeout=WAIT, cwd=tmp_path)

    plain = put()
    assert plain.returncode == 0 and plain.stderr == b"", plain.stderr
    shown = put("--progress")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout == plain.stdout == b""
    assert re.fullmatch(rb"zbroker queue put: 500 messages  [^\n]*100%\n", shown.stderr), \
        shown.stderr


def test_finish_after_a_failure_still_says_what_moved(broker, env):
    # no reader: the write times out; the summary comes first, then the one-line reason
    writer = zpipes_cmd(env, "write", "--broker", broker.name, "lonely", "--timeout", "1",
                        "--progress")
    writer.stdin.write(b"x" * 1000)
    writer.stdin.close()
    status, err = finish(writer)
    lines = err.decode().splitlines()
    assert status == 1 and len(lines) == 2, err
    assert lines[0].startswith("zpipes write: 1000 B")
    assert lines[1] == "zpipes: no reader attached to pipe 'lonely' within 1 s"
