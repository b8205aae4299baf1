"""The installed zbroker's version, looked up only when asked for (zpipes.version)."""

from __future__ import annotations

from zpipes.version import version

__all__ = ["version"]
