"""A stream queue's offsets file, ``<data_dir>/stream-offsets``: the groups' committed offsets
as JSON (stream.py says what it holds and decodes it), replaced durably."""

from __future__ import annotations

import json
import os
from pathlib import Path

from zbroker.services.pzq.core.stream import Offsets, decode_offsets, encode_offsets

OFFSETS_FILE = "stream-offsets"


def load_offsets(data_dir: Path) -> Offsets | None:
    """The offsets kept in ``data_dir``; None if none were ever committed. OSError if the
    file cannot be read or is not an offsets file."""
    try:
        data = json.loads((data_dir / OFFSETS_FILE).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise OSError(f"unreadable {OFFSETS_FILE}: {exc}") from None
    try:
        return decode_offsets(data)
    except ValueError as exc:
        raise OSError(f"unreadable {OFFSETS_FILE}: {exc}") from None


def save_offsets(data_dir: Path, offsets: Offsets) -> None:
    """Write the offsets durably (temporary file, fsync, rename, fsync of the directory).
    Blocking: run it in an executor."""
    path = data_dir / OFFSETS_FILE
    tmp = path.with_name(OFFSETS_FILE + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, json.dumps(encode_offsets(offsets)).encode() + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dir_fd = os.open(data_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
