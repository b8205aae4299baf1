"""What an install carries beside the commands: ``zbroker init DIR`` writes out the operating
files (example config, queue config, systemd unit, logrotate and rsyslog files, Grafana
dashboard, license), man pages and shell completion; ``zbroker completion SHELL`` prints the
completion of one command.

The files are package data (``zbroker/share``: links to ``config/`` and the top folder in the
repository, files in a wheel). The man pages and completions are made from the commands'
own argparse parsers, by argparse-manpage and shtab, so that they say what ``--help`` says.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections.abc import Callable
from importlib import resources
from pathlib import Path

from zbroker.cli.common import error

#: the operating files, as ``zbroker init`` names them (the example config becomes the config)
SHARED = {"zbroker.cfg": "zbroker.cfg.example", "zbroker.cfg.example": "zbroker.cfg.example",
          "queues.cfg": "queues.cfg", "zbroker.service": "zbroker.service",
          "zbroker.logrotate": "zbroker.logrotate",
          "zbroker.rsyslog.conf": "zbroker.rsyslog.conf",
          "zbroker.grafana.json": "zbroker.grafana.json", "LICENSE": "LICENSE"}
COMMANDS = ("zbroker", "zpipes", "pzq")
SHELLS = ("bash", "zsh", "tcsh")


def shared_text(name: str) -> str:
    """A file of zbroker/share, as installed."""
    return resources.files("zbroker").joinpath("share", name).read_text(encoding="utf-8")


# --- the parsers -------------------------------------------------------------------------------


#: how the ``zbroker`` command's whole parser is made (the CLI's, with every sub-command's
#: under it, services' included): given by the caller, which knows them
ParserMaker = Callable[[], argparse.ArgumentParser]


def parser_for(command: str, zbroker_parser: ParserMaker) -> argparse.ArgumentParser:
    if command == "zbroker":
        return zbroker_parser()
    if command == "zpipes":
        from zpipes.cli import build_parser

        return build_parser()
    from zbroker.services.pzq.commands.standalone import parser

    return parser()


# --- man pages and completion ------------------------------------------------------------------


#: the NAME line of each man page
SUMMARY = {"zbroker": "a ZeroMQ broker hosting named pipes (ZPIPES) and queues (pzq), and its "
                      "management commands",
           "zpipes": "copy standard input into a named pipe of a zbroker, or a pipe to "
                     "standard output",
           "pzq": "a standalone pzq queue: persistent store and forward for ZeroMQ"}


def man_page(command: str, zbroker_parser: ParserMaker) -> str:
    from argparse_manpage.manpage import Manpage

    from zpipes.version import version

    return str(Manpage(parser_for(command, zbroker_parser), {
        "project_name": "zbroker", "version": version(), "manual_title": "zbroker manual",
        "manual_section": "1", "description": SUMMARY[command], "url": "", "authors": []}))


def completion(command: str, shell: str, zbroker_parser: ParserMaker) -> str:
    import shtab

    return shtab.complete(parser_for(command, zbroker_parser), shell=shell)


# --- zbroker init ------------------------------------------------------------------------------


def unit_for_this_install(text: str, config: Path) -> str:
    """The systemd unit with ExecStart naming this install's zbroker and ``config``."""
    exe = shutil.which("zbroker") or str(Path(sys.executable).with_name("zbroker"))
    return text.replace("ExecStart=/usr/local/bin/zbroker --config /etc/zbroker/zbroker.cfg",
                        f"ExecStart={exe} --config {config}")


def planned(target: Path, zbroker_parser: ParserMaker) -> dict[Path, Callable[[], str]]:
    """What ``zbroker init`` writes into ``target``, by path: a function giving its text."""
    out: dict[Path, Callable[[], str]] = {}
    for name, source in SHARED.items():
        if name == "zbroker.service":
            out[target / name] = (lambda s=source: unit_for_this_install(
                shared_text(s), target.resolve() / "zbroker.cfg"))
        else:
            out[target / name] = lambda s=source: shared_text(s)
    for command in COMMANDS:
        out[target / "man" / "man1" / f"{command}.1"] = (
            lambda c=command: man_page(c, zbroker_parser))
        for shell in ("bash", "zsh"):
            out[target / "completion" / shell / command] = (
                lambda c=command, sh=shell: completion(c, sh, zbroker_parser))
    return out


def init_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="zbroker init",
        description="Write what an install needs beside the commands into DIR: zbroker.cfg "
                    "(the example config, every key with its default), queues.cfg, the "
                    "systemd unit (naming this install's zbroker and DIR/zbroker.cfg), the "
                    "logrotate and rsyslog files, the Grafana dashboard, the license, man "
                    "pages (man/man1) and bash and zsh completion (completion/SHELL/COMMAND). "
                    "Nothing is overwritten without --force.",
        epilog="e.g. `zbroker init /etc/zbroker`, then `install -m 644 "
               "/etc/zbroker/zbroker.service /etc/systemd/system/`, `cp -r "
               "/etc/zbroker/man/man1 /usr/local/share/man/`, `cp "
               "/etc/zbroker/completion/bash/* /usr/share/bash-completion/completions/`.")
    parser.add_argument("dir", metavar="DIR", help="where to write (made if missing)")
    parser.add_argument("--force", action="store_true", help="overwrite files already there")
    return parser


def init(args: argparse.Namespace, zbroker_parser: ParserMaker) -> int:
    target = Path(args.dir)
    plan = planned(target, zbroker_parser)
    there = [str(p) for p in plan if p.exists()]
    if there and not args.force:
        error(f"init: {len(there)} of the files are there already (--force overwrites "
              f"them): {', '.join(there[:4])}{' ...' if len(there) > 4 else ''}")
        return 1
    try:
        texts = {path: make() for path, make in plan.items()}
        for path, text in texts.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text(text, encoding="utf-8")
            os.replace(tmp, path)
    except OSError as exc:
        error(f"init: cannot write into {target}: {exc.strerror or exc}")
        return 1
    for path in texts:
        print(path)
    return 0


def completion_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="zbroker completion",
        description="Print the shell completion of a command, made from its parser: e.g. "
                    "`eval \"$(zbroker completion bash)\"` in ~/.bashrc, or save it where "
                    "your shell looks (zbroker init writes them all).")
    parser.add_argument("shell", choices=SHELLS)
    parser.add_argument("--command", choices=COMMANDS, default="zbroker",
                        help="the command to complete (default zbroker)")
    return parser


def print_completion(args: argparse.Namespace, zbroker_parser: ParserMaker) -> int:
    sys.stdout.write(completion(args.command, args.shell, zbroker_parser))
    return 0
