"""``--version`` for every command of the distribution (zbroker, zpipes, pzq), looked up only
when asked for: importlib.metadata costs a tenth of a second of every start otherwise."""

from __future__ import annotations

import argparse

DISTRIBUTION = "zbroker"  # zpipes and pzq are installed with it


def version() -> str:
    import importlib.metadata  # here, not at the top: see above

    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return "(version unknown: not installed)"


class VersionAction(argparse.Action):
    """``--version``: ``<command> <version>`` on standard output (as argparse's own), exit 0."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS,
                 default: str = argparse.SUPPRESS, help: str | None = None) -> None:
        super().__init__(option_strings, dest, nargs=0, default=default,
                         help=help or "show the version and exit")

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        print(f"{parser.prog.split()[0]} {version()}")
        parser.exit()
