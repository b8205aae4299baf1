"""The installed zbroker's version, looked up only when asked for (importlib.metadata costs
a tenth of a second of every start otherwise)."""

from __future__ import annotations


def version() -> str:
    import importlib.metadata  # here: a tenth of a second of every start otherwise

    try:
        return importlib.metadata.version("zbroker")
    except importlib.metadata.PackageNotFoundError:
        import zbroker

        return getattr(zbroker, "__version__", "(version unknown: not installed)")
