"""The services a broker can host: plug-ins, found by their entry points (``registry.py``).
ZPIPES (``zpipes/``) and pzq (``pzq/``) are registered so, by this package's own metadata.

This package imports nothing itself, so that a service's cores (``zbroker.services.*.core``,
the ZPIPES core modules) import as light as they are; ``installed`` and ``PluginError`` are
``registry.py``'s, loaded on first use."""

from __future__ import annotations

from typing import Any

__all__ = ["GROUP", "PluginError", "installed"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import registry

        return getattr(registry, name)
    raise AttributeError(f"module 'zbroker.services' has no attribute {name!r}")
