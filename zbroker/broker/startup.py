"""What keeps the broker from starting (StartupError), and the private directory it makes
before anything else (its run directory, each service's below it)."""

from __future__ import annotations

import os
import stat
from pathlib import Path


class StartupError(Exception):
    """The broker cannot start; the message is for the operator."""


def make_private_dir(path: Path) -> list[Path]:
    """Create ``path`` and missing parents with mode 0700; returns the directories created.

    Raises StartupError if it cannot, or if ``path`` belongs to another user, or its parent
    to another user than root (someone else could then swap it).
    """
    created: list[Path] = []
    try:
        for p in reversed([p for p in (path, *path.parents) if not p.exists()]):
            try:
                p.mkdir(mode=0o700)
                created.append(p)
            except FileExistsError:  # made meanwhile by someone else: checked below
                pass
        st = path.stat()
        parent_uid = path.parent.stat().st_uid
    except OSError as exc:
        raise StartupError(f"cannot create run directory {str(path)!r}: "
                           f"{exc.strerror or exc}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise StartupError(f"run directory {str(path)!r} exists and is not a directory")
    uid = os.geteuid()
    if st.st_uid != uid or parent_uid not in (uid, 0):
        owner = st.st_uid if st.st_uid != uid else parent_uid
        raise StartupError(f"run directory {str(path)!r} or its parent belongs to another user "
                           f"(uid {owner}); set broker.run_dir to a directory of your own")
    if st.st_mode & 0o077:
        os.chmod(path, 0o700)
    return created
