"""A ``zbroker`` sub-command, the broker's own or a service's, and what every one of them
may use: error lines, a parser with the options that find a broker (NAME, --config,
--run-dir, --json; zbroker/locating.py finds it with them), seconds as an argument.

A service contributes its sub-commands through its plug-in class (``Service.commands``):
``zbroker NAME ...`` then runs the one named, ``--help`` lists it, and the man page and shell
completion have its parser. A command is its parser, made when asked (nothing is parsed to
get it), and what it does with the arguments parsed::

    Command("queue", parser, run, usage=("queue put|get QUEUE   put messages into ...",))
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable, Sequence


@dataclasses.dataclass(frozen=True)
class Command:
    """``zbroker NAME``: ``parser()`` makes its parser; ``run(args)`` does it and returns the
    exit status. ``usage``: its lines in ``zbroker --help``'s list of commands (each
    ``NAME ARGS   what it does``)."""

    name: str
    parser: Callable[[], argparse.ArgumentParser]
    run: Callable[[argparse.Namespace], int]
    usage: tuple[str, ...] = ()

    def __call__(self, argv: Sequence[str]) -> int:
        return self.run(self.parser().parse_args(argv))


def error(message: str) -> None:
    """``zbroker: `` and the message on standard error; each line of it so (one a problem)."""
    for line in message.splitlines() or [""]:
        print(f"zbroker: {line}", file=sys.stderr)


def command_parser(command: str, usage_args: str, description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"zbroker {command}", description=description)
    parser.usage = f"%(prog)s {usage_args}"
    return parser


def common_options(parser: argparse.ArgumentParser, json_flag: bool = True) -> None:
    parser.add_argument("name", metavar="NAME", nargs="?",
                        help="the broker's name (default: broker.name of the config, 'local')")
    parser.add_argument("--config", "-c", metavar="FILE",
                        help="the broker's config file, to find its run directory")
    parser.add_argument("--run-dir", metavar="DIR", help="the broker's run directory")
    if json_flag:
        parser.add_argument("--json", action="store_true", help="output JSON, for scripts")


def seconds_argument(text: str) -> float:
    """An argparse type: seconds, 0 or more."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < 1e9:
        raise argparse.ArgumentTypeError(f"expected seconds (0 or more), got {text!r}")
    return value
