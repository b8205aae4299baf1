"""The ``zbroker`` command: run a broker, or a management sub-command.

    zbroker [NAME] [--config FILE] [--log-level LEVEL] [--animate]
    zbroker check-config [FILE]

A first argument that names a sub-command (:func:`commands`: the broker's own, BUILTIN, and
those the installed services contribute) runs that sub-command; one that is close to a
sub-command's name is refused as its typo (``zbroker -- NAME`` runs a broker of that name);
anything else is the broker's own command line. A sub-command is a
:class:`zbroker.command.Command` (its parser, and what it does with the arguments); a service
gives its own through its plug-in class (``Service.commands``), and they are listed in
``--help``, the man page and the completion with the broker's. (So a broker cannot be named
like a sub-command.)
"""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Sequence
from typing import Any

from zbroker import logs
from zbroker.cli.commands import MANAGEMENT_COMMANDS
from zbroker.cli.common import error
from zbroker.command import Command
from zbroker.config import (
    CONFIG_SEARCH_PATH,
    LOG_LEVELS,
    ConfigError,
    find_config_file,
    load_config,
)
from zpipes.version import VersionAction

DESCRIPTION = """\
Run a zbroker: one process per host that hosts ZeroMQ messaging services. The first service
is ZPIPES, reliable named pipes: `zpipes write NAME` and `zpipes read NAME` find the broker
by its name and talk to it on its ZPIPES endpoint, by default ipc://@/zpipes/NAME (an
abstract IPC socket: nothing appears in the file system; key services.zpipes.endpoint).
The broker's name must be unique on the host; a second broker of the same name fails to
start."""

EPILOG = f"""\
config:
  Without --config the broker reads {" then ".join(CONFIG_SEARCH_PATH)}, else runs on
  the embedded defaults. The command line wins over the file. See zbroker.cfg.example.

signals:
  SIGTERM, SIGINT (Ctrl-C)  stop the broker (exit status 0)
  SIGHUP                    re-read the config file and reopen the log file; a broken config
                            is refused and the broker keeps running on the one it has

commands (NAME: the broker's name, default broker.name of the config):
  zbroker check-config [FILE]   check a config file as the broker's start does, and exit
                                (status 0 if it would start)
  zbroker keygen FILE           write a CURVE key pair for the cluster (cluster.key_file)
  zbroker join-token [NAME]     what to run on another host to join this broker's cluster
  zbroker status [NAME]         uptime, services, clients, pipes, log outputs
  zbroker top [NAME] [--once]   a live view: pipes, queues and peers, the busiest first
  zbroker get [KEY] [NAME]      settings of the running broker
  zbroker set KEY VALUE [NAME]  change one setting of the running broker (until reload)
  zbroker reload [NAME]         re-read the config file (as SIGHUP does)
  zbroker stop [NAME]           stop the broker (as SIGTERM does)
{{services}}  zbroker logs [-f] [--level L] [--pipe P] [NAME]   show and follow the broker's events
  zbroker init DIR              write the example config, queue config, systemd unit,
                                logrotate/rsyslog files, dashboard, man pages, completion
  zbroker completion SHELL      print the shell completion (bash, zsh, tcsh)
  Each takes --json for scripts and --help for more.

a cluster in two commands:
  On the first host, `zbroker local --cluster` starts a clustered broker: it makes the
  cluster's key (~/.config/zbroker/cluster-NAME.key, mode 0600) and writes the cluster's join
  file beside it (cluster-NAME.join, mode 0600: the key and this broker's address), and
  prints what to run on other hosts. Copy the join file to another host and run there
  `zbroker local --join-file cluster-NAME.join`: that broker installs the key and joins.
  `zbroker join-token` on a member prints it again. The join file holds the cluster's key:
  whoever has it can join; keep it private and delete the copy once the key is installed.
  --advertise ADDRESS names this host's address when the one chosen is not the right one.

exit status: 0 after a clean stop, 1 if the broker could not start (the reason is printed
on standard error as "zbroker: ..."), 2 on a usage error or a bad join token."""


def broker_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="zbroker",
        usage="%(prog)s [NAME] [--config FILE] [--log-level LEVEL] [--animate] [--cluster]\n"
              "       [--join-file FILE | --join TOKEN|-] [--advertise ADDRESS] [--metrics ADDR]\n"
              "       %(prog)s COMMAND [ARGS]",
        description=DESCRIPTION,
        epilog=EPILOG.replace("{services}", "".join(
            f"  zbroker {line}\n" for c in services_commands().values() for line in c.usage)),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("name", metavar="NAME", nargs="?",
                        help="the broker's name, unique on this host (default: broker.name "
                             "of the config, 'local')")
    parser.add_argument("--config", "-c", metavar="FILE", help="config file (YAML)")
    parser.add_argument("--log-level", "-l", metavar="LEVEL", choices=LOG_LEVELS,
                        help="log level: " + ", ".join(LOG_LEVELS) + " (key log.level)")
    parser.add_argument("--animate", action="store_true",
                        help="trace every ZPIPES state machine transition (key "
                             "services.zpipes.animate)")
    parser.add_argument("--cluster", action="store_true",
                        help="join the cluster: find peer brokers (zeroconf and cluster.peers) "
                             "and route pipes between hosts (key cluster.enabled; off by "
                             "default, so a standalone broker announces nothing)")
    parser.add_argument("--advertise", metavar="ADDRESS",
                        help="the address other hosts reach this broker's cluster socket at: "
                             "HOST, HOST:PORT or tcp://HOST:PORT (key cluster.advertise; "
                             "default: the address the broker's traffic comes from, and in "
                             "the join file an address of this host that is not loopback)")
    join = parser.add_mutually_exclusive_group()
    join.add_argument("--join-file", metavar="FILE",
                      help="join the cluster of the join token in FILE (what a member "
                           "prints at its start, or `zbroker join-token` on it, tells you to "
                           "copy): implies --cluster, takes the cluster's name, installs its "
                           "key as this host's (mode 0600) and says HELLO to the member it "
                           "names; zeroconf still finds the brokers of this subnet")
    join.add_argument("--join", metavar="TOKEN",
                      help="the same with the token itself; '-': read it from standard input "
                           "(a token on the command line shows in ps to every user of the "
                           "host: prefer --join-file or -)")
    parser.add_argument("--metrics", metavar="ADDR",
                        help="serve Prometheus metrics over HTTP on ADDR: PORT (on 127.0.0.1), "
                             "HOST:PORT or [IPv6]:PORT (key metrics.bind; off by default)")
    parser.add_argument("--version", action=VersionAction)
    return parser


def overrides_from(args: argparse.Namespace) -> dict[str, Any]:
    """The config keys the command line sets, nested like the config file."""
    over: dict[str, dict[str, Any]] = {}
    if args.name is not None:
        over.setdefault("broker", {})["name"] = args.name
    if args.log_level is not None:
        over.setdefault("log", {})["level"] = args.log_level
    if args.animate:
        over.setdefault("services", {}).setdefault("zpipes", {})["animate"] = True
    if args.cluster:
        over.setdefault("cluster", {})["enabled"] = True
    if args.metrics is not None:
        over.setdefault("metrics", {})["bind"] = args.metrics
    return over


def advertise_endpoint(text: str, bind: str) -> str:
    """``--advertise``: HOST, HOST:PORT or tcp://HOST:PORT (an IPv6 host in brackets when a
    port follows) as an endpoint, with the port of ``bind`` (cluster.bind) when none is
    given. ValueError if it is none of those."""
    bad = ValueError(f"--advertise: not an address: {text!r} (HOST, HOST:PORT or "
                     "tcp://HOST:PORT)")
    address = text.removeprefix("tcp://")
    if address.startswith("["):
        host, _, rest = address[1:].partition("]")
        if rest and not rest.startswith(":"):
            raise bad
        port = rest[1:]
    elif address.count(":") == 1:
        host, _, port = address.partition(":")
    else:  # a host alone (or an IPv6 address without brackets)
        host, port = address, ""
    if not host or "*" in host or "/" in host or any(c.isspace() for c in address) \
            or port and not (port.isdigit() and 0 < int(port) < 65536) \
            or address.endswith(":"):
        raise bad
    if ":" in host:
        host = f"[{host}]"
    return f"tcp://{host}:{port or bind.rpartition(':')[2]}"


def run_broker(argv: Sequence[str]) -> int:
    from zbroker.broker import Broker, StartupError
    from zbroker.cluster.join_token import JoinTokenError
    from zbroker.service import ServiceError

    args = broker_parser().parse_args(argv)
    token = None
    if args.join is not None or args.join_file is not None:
        from zbroker.cluster.joining import read_token

        try:
            token = read_token(args.join, args.join_file)
        except JoinTokenError as exc:
            error(str(exc))
            return 2
    overrides = overrides_from(args)
    if token is not None:  # its cluster, with a key
        overrides.setdefault("cluster", {}).update(enabled=True, name=token.cluster,
                                                   insecure=False)
    try:
        config = load_config(args.config, overrides)
        if args.advertise is not None:
            try:
                advertised = advertise_endpoint(args.advertise, config.cluster.bind)
            except ValueError as exc:
                error(str(exc))
                return 2
            overrides.setdefault("cluster", {})["advertise"] = advertised
            config = load_config(args.config, overrides)
    except ConfigError as exc:
        error(str(exc))
        return 1
    standalone_note = None
    if token is None and not config.cluster.enabled:
        try:
            config, standalone_note = _cluster_of_before(args, config, overrides)
        except ConfigError as exc:
            error(str(exc))
            return 1
    installed = None
    if token is not None:
        from zbroker.cluster.joining import install_key
        from zbroker.cluster.security import KeyFileError

        try:
            installed = install_key(token, config.cluster.key_file)
        except KeyFileError as exc:
            error(str(exc))
            return 1
    try:
        logs.configure(config.log.level, config.log.format, config.log.file,
                       syslog=config.log.syslog)
    except OSError as exc:
        from zbroker.config_checks import config_problems

        # every problem, as check-config says them (the log file's among them, when a check
        # finds it)
        error("\n".join(config_problems(config))
              or f"cannot open log file {str(config.log.file)!r}: {exc.strerror or exc}")
        return 1
    if standalone_note is not None:
        level, event, fields = standalone_note
        getattr(logs.get_logger(), level)(event, **fields)
    broker = Broker(config, config_path=args.config, overrides=overrides,
                    seeds=token.seeds if token is not None else ())
    if token is not None and installed is not None:
        _say_joined(broker.log, token, installed, args)
    try:
        return broker.run_forever()
    except (ServiceError, StartupError, ConfigError) as exc:
        if config.log.file is not None:
            broker.log.error("broker failed to start", name=config.broker.name, reason=str(exc))
        error(str(exc))
        return 1
    except KeyboardInterrupt:  # Ctrl-C before the broker's own handler was in place
        return 130
    finally:
        logs.shutdown()  # bounded: lets syslog send its last records


def _cluster_of_before(args: Any, config: Any, overrides: dict[str, Any]
                       ) -> tuple[Any, tuple[str, str, dict[str, Any]] | None]:
    """A broker whose config leaves the cluster off: clustered again if it was (its snapshot,
    cluster/snapshot.py), unless its config file turns the cluster off; then, or when it
    holds a cluster key, what it says of running standalone. Returns the config it starts
    with (``overrides`` updated) and what to log of it (level, event, fields), or None."""
    from zbroker.cluster import snapshot
    from zbroker.cluster.security import default_key_path

    path = snapshot.snapshot_path(config.broker.name)
    try:
        before = snapshot.load(path)
    except ValueError as exc:
        return config, ("warning", "cluster snapshot ignored: running standalone",
                        {"reason": str(exc)})
    if before is not None and not _file_turns_cluster_off(args.config):
        overrides.setdefault("cluster", {}).update(snapshot.rejoin_overrides(before)["cluster"])
        return load_config(args.config, overrides), (
            "info", "rejoining the cluster this broker was a member of",
            {"cluster": before.cluster, "snapshot": str(path),
             "members": len(before.members)})
    if before is not None:
        return config, ("warning", "running standalone: the config file sets cluster.enabled "
                        "false, yet this broker was a member of a cluster (remove the setting "
                        "to rejoin it, or delete the snapshot to forget it)",
                        {"cluster": before.cluster, "snapshot": str(path)})
    key = default_key_path(config.cluster.name)
    if key.exists():
        return config, ("warning", "running standalone with a cluster key installed: start with "
                        "--cluster (or cluster.enabled: true) to join its cluster",
                        {"cluster": config.cluster.name, "key_file": str(key)})
    return config, None


def _file_turns_cluster_off(config_path: str | None) -> bool:
    """Whether the config file (the one given, else the one found) says
    ``cluster: {enabled: false}`` in so many words."""
    import yaml

    from zbroker.config import find_config_file

    file = config_path or find_config_file()
    if file is None:
        return False
    try:
        with open(file, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except (OSError, yaml.YAMLError):
        return False
    cluster = data.get("cluster") if isinstance(data, dict) else None
    return isinstance(cluster, dict) and cluster.get("enabled") is False


def _say_joined(log: Any, token: Any, installed: tuple[Any, str], args: Any) -> None:
    """Log what a join token did here: the key installed, kept or replaced; and a join file
    others can read."""
    import os

    path, done = installed
    fields = {"cluster": token.cluster, "key_file": str(path), "seeds": list(token.seeds)}
    if done == "replaced":
        log.warning("cluster key replaced by the join token's", **fields,
                    old_key=f"{path}.old")
    else:
        log.info("cluster key installed from the join token" if done == "installed" else
                 "cluster key already the join token's", **fields)
    if args.join_file is not None:
        try:
            mode = os.stat(args.join_file).st_mode
        except OSError:
            return
        if mode & 0o077:
            log.warning("the join file can be read by other users: it holds the cluster key "
                        "(chmod 600 it, or delete it: the key is installed)",
                        file=args.join_file)
    elif args.join not in (None, "-"):
        log.warning("the join token was on the command line, where ps shows it to every user "
                    "of this host: next time use --join-file FILE or --join -")


def _check_config_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="zbroker check-config",
        description="Validate a zbroker config file as the broker's start does (all but what "
                    "needs binding: a port another process holds is found only then): print "
                    "OK, or each problem on a line with the key(s) at fault, and exit with "
                    "status 0 or 1; every problem of the file at once. Without FILE, check "
                    "the file of the running broker that the management commands would find "
                    "here, else the file a broker started here would read: "
                    + ", then ".join(CONFIG_SEARCH_PATH) + ".",
    )
    parser.add_argument("file", metavar="FILE", nargs="?", help="the config file to check")
    return parser


def _check_config(args: argparse.Namespace) -> int:
    from zbroker.config_checks import config_problems

    which = ""
    path = args.file
    if path is None:
        running = _running_config()
        if running is not None:
            name, path = running
            which = (f" (the config of the running broker {name!r})" if path else
                     f"the running broker {name!r} runs on the embedded defaults, and so "
                     f"would a broker started here")
        else:
            path = find_config_file()
    try:
        config = load_config(path) if path is not None else load_config(None, search=())
        problems = config_problems(config)
    except ConfigError as exc:
        error(str(exc))
        return 1
    for note in config.notes:
        error(f"{path}: note: {note}")
    if problems:
        for problem in problems:
            error(f"{path}: {problem}" if path is not None else problem)
        return 1
    if path is None:
        print(f"OK: {which}" if which else "OK: no config file found (looked for "
              + ", ".join(CONFIG_SEARCH_PATH) + "); the broker would run on the embedded "
              "defaults")
    else:
        print(f"{path}: OK{which}")
    return 0


def _running_config() -> tuple[str, str | None] | None:
    """(name, config file or None for the embedded defaults) of the running broker that
    the management commands find from here; None if none answers."""
    from zbroker.cli.common import locate
    from zbroker.management import CommandError, NoAccess, NotRunning, request

    try:
        name, run_dir = locate(argparse.Namespace(config=None, name=None, run_dir=None))
        status = request(run_dir, name, {"command": "status"})
    except (ConfigError, NotRunning, NoAccess, CommandError, OSError):
        return None
    return name, status.get("config")


def _keygen_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="zbroker keygen",
        description="Write a new CURVE key pair for a cluster to FILE (mode 0600). Copy the "
                    "file to every broker of the cluster and name it in cluster.key_file: "
                    "cluster traffic is then encrypted, and a broker without the key cannot "
                    "join or send anything.",
    )
    parser.add_argument("file", metavar="FILE", help="where to write the key pair (must not "
                                                     "exist)")
    return parser


def _keygen(args: argparse.Namespace) -> int:
    from zbroker.cluster.security import generate_key_file

    try:
        public = generate_key_file(args.file)
    except FileExistsError:
        error(f"cannot write {args.file}: it exists (keygen never overwrites a file)")
        return 1
    except OSError as exc:
        error(f"cannot write {args.file}: {exc.strerror}")
        return 1
    print(f"{args.file}: cluster key pair written (public key {public})")
    return 0


def _install() -> Any:
    from zbroker.cli import install  # (argparse-manpage and shtab only when asked for)

    return install


#: the broker's own sub-commands, by name
BUILTIN: dict[str, Command] = {
    "check-config": Command("check-config", _check_config_parser, _check_config),
    "keygen": Command("keygen", _keygen_parser, _keygen),
    "init": Command("init", lambda: _install().init_parser(),
                    lambda args: _install().init(args, zbroker_parser)),
    "completion": Command("completion", lambda: _install().completion_parser(),
                          lambda args: _install().print_completion(args, zbroker_parser)),
    **MANAGEMENT_COMMANDS,
}


def services_commands() -> dict[str, Command]:
    """The sub-commands the installed services contribute (``Service.commands``), by name;
    none when the plug-ins cannot be loaded (a broker's start says why). A service's command
    named like one of the broker's, or another service's before it, is not taken."""
    from zbroker.services import PluginError, installed

    try:
        services = installed()
    except PluginError:
        return {}
    found: dict[str, Command] = {}
    for cls in services.values():
        for command in cls.commands():
            if command.name not in BUILTIN and command.name not in found:
                found[command.name] = command
    return found


def commands() -> dict[str, Command]:
    """Every sub-command, by name: the broker's, then the services'."""
    return {**BUILTIN, **services_commands()}


def zbroker_parser() -> argparse.ArgumentParser:
    """The broker's parser with every sub-command's under it (for man pages and completion:
    the command itself dispatches on its first word)."""
    parser = broker_parser()
    parser.prog = "zbroker"
    subs = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, command in commands().items():
        sub = command.parser()
        subs.add_parser(name, parents=[sub], add_help=False, conflict_handler="resolve",
                        help=(sub.description or "").split(". ")[0].split("\n")[0],
                        description=sub.description)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in BUILTIN:
        return BUILTIN[argv[0]](argv[1:])
    every = commands() if argv and not argv[0].startswith("-") else BUILTIN
    if argv and argv[0] in every:
        return every[argv[0]](argv[1:])
    if argv and (close := difflib.get_close_matches(argv[0], every, n=1, cutoff=0.75)):
        # a typo of a sub-command would start a broker of that name
        error(f"{argv[0]!r} is not a command: did you mean {close[0]!r}? (to run a broker "
              f"named {argv[0]!r}: zbroker -- {argv[0]})")
        return 2
    return run_broker(argv)
