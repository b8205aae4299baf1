"""The management sub-commands of ``zbroker``: status, get, set, reload, stop, logs (and top,
in top.py).

Each finds the broker by its name: the control socket is ``<run_dir>/ctl``, the run directory
being the one the broker's config gives (``--config FILE`` as for the broker, else the same
search, with NAME as ``broker.name``), or ``--run-dir DIR``. Human output by default,
``--json`` for scripts. Exit status 0 on success, 1 when the broker is not running or refuses
(the reason on standard error as "zbroker: ..."), 2 on a usage error.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import yaml

from zbroker.cli.common import (
    command_parser,
    common_options,
    duration,
    error,
    locate,
    not_answering,
    plural,
    seconds_argument,
    trouble_lines,
)
from zbroker.cli.top import top_command
from zbroker.command import Command
from zbroker.config import (
    LOG_LEVELS,
    ConfigError,
)
from zbroker.management import CommandError, NoAccess, NotRunning, follow_logs, request


def _call(args: argparse.Namespace, message: dict[str, Any]) -> tuple[int, Any]:
    try:
        name, run_dir = locate(args)
        return 0, request(run_dir, name, message)
    except (ConfigError, NotRunning, NoAccess, CommandError) as exc:
        error(str(exc))
        return 1, None


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, default=str))


def _show(value: Any) -> str:
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    return str(value)


# --- status --------------------------------------------------------------------------------



def _service_lines(name: str, status: dict[str, Any]) -> list[str]:
    """A service's lines: its own ``status_lines`` if this host has the plug-in (a broker
    may have one that this command cannot load), else each key on a line."""
    from zbroker.service import generic_status_lines
    from zbroker.services import PluginError, installed

    try:
        service = installed().get(name)
    except PluginError:
        service = None
    return (service.status_lines(status) if service is not None
            else generic_status_lines(status))


def format_status(status: dict[str, Any]) -> str:
    """The human form of a broker's status."""
    lines = [f"broker {status['name']} (pid {status['pid']}), up "
             f"{duration(status['uptime'])}",
             f"  config: {status['config'] or 'embedded defaults'}",
             f"  run dir: {status['run_dir']}",
             f"  metrics: {status.get('metrics') or 'off (metrics.bind)'}"]
    for name, service in status["services"].items():
        service = dict(service)
        head = f"{name}: {service.pop('endpoint')}" if "endpoint" in service else f"{name}:"
        lines.append(head)
        lines += _service_lines(name, service)
    cluster = status.get("cluster")
    if cluster:
        peers = cluster.get("peers") or []
        pending = not_answering(cluster)
        security = ("" if "insecure" not in cluster else
                    ", INSECURE: no key" if cluster["insecure"] else
                    f", key {cluster.get('key_file')}")
        refused = cluster.get("refused")
        lines.append(f"cluster: {cluster.get('endpoint')}, {plural(len(peers), 'peer')}"
                     + (f", {plural(pending, 'contact')} not answering" if pending else "")
                     + security
                     + (f", {plural(refused, 'handshake')} refused" if refused else ""))
        for peer in peers:
            rtt = peer.get("rtt_s")
            who = (f"{peer.get('name')}@{peer['host']}" if peer.get("host")
                   else peer.get("name"))
            lines.append(f"  {who} ({peer.get('id')}) {peer.get('endpoint')}, "
                         f"last heard {peer.get('last_heard_s')}s ago"
                         + (f", round trip {rtt * 1000:.2f} ms" if rtt is not None else ""))
        lines += trouble_lines(cluster)
    log = status["logs"]
    lines.append(f"logs: level {log['level']}, {log['format']} to "
                 f"{log['file'] or 'standard error'}"
                 + (", animate" if log.get("animate") else "")
                 + (f", {log['write_errors']} write errors" if log.get("write_errors") else "")
                 + (f", {log['repeats_collapsed']} repeated warnings counted, not written"
                    if log.get("repeats_collapsed") else ""))
    syslog = log.get("syslog")
    if syslog:
        state = "connected" if syslog["connected"] else (
            f"not connected: {syslog['last_error']}" if syslog["last_error"] else "connecting")
        lines.append(f"  syslog: {syslog['target']} ({syslog['format']}, {syslog['facility']}, "
                     f"{state}): {syslog['sent']} sent, {syslog['dropped']} dropped, "
                     f"{syslog['queued']}/{syslog['queue']} queued")
    else:
        lines.append("  syslog: off")
    management = status.get("management")
    if management:
        lines.append(f"  followers: {management['followers']} (zbroker logs -f), "
                     f"{management.get('followers_dropped', 0)} events dropped for them")
    return "\n".join(lines)


def _ask_and_show(args: argparse.Namespace, command: str,
                  show: Callable[[dict[str, Any]], str]) -> int:
    """Ask the broker ``command`` and print its answer: as JSON with --json, else as
    ``show`` puts it; the exit status of the call."""
    rc, result = _call(args, {"command": command})
    if rc == 0:
        _print_json(result) if args.json else print(show(result))
    return rc


def _status_parser() -> argparse.ArgumentParser:
    parser = command_parser("status", "[NAME] [--json]",
                     "Show what a running broker is doing: uptime, its services (for ZPIPES: "
                     "clients, pipes with their readers, writers and buffered bytes), its log "
                     "outputs (syslog: sent, dropped, queued records).")
    common_options(parser)
    return parser


status_command = Command("status", _status_parser,
                         lambda args: _ask_and_show(args, "status", format_status))


# --- get, set ------------------------------------------------------------------------------


def _get_parser() -> argparse.ArgumentParser:
    parser = command_parser("get", "[KEY] [NAME] [--json]",
                     "Show settings of a running broker: KEY is a dotted key of the config "
                     "(log.level) or a section (log); all settings without KEY.")
    parser.add_argument("key", metavar="KEY", nargs="?", help="e.g. log.level, clients, log")
    common_options(parser)
    return parser


def _get(args: argparse.Namespace) -> int:
    rc, result = _call(args, {"command": "get", "key": args.key})
    if rc == 0:
        if args.json:
            _print_json(result)
        elif len(result) == 1 and args.key in (*result, *_moved_to(result)):
            print(_show(next(iter(result.values()))))
        else:
            for key, value in result.items():
                print(f"{key}: {_show(value)}")
    return rc


def _moved_to(result: dict[str, Any]) -> list[str]:
    """The old names of the keys of ``result`` that moved (asked by an old name, a setting
    is answered by its new one)."""
    from zbroker.config import moved_keys

    return [old for old, new in moved_keys().items() if new in result]


get_command = Command("get", _get_parser, _get)


def parse_value(text: str) -> Any:
    """A value typed on the command line, read as YAML reads a scalar: ``30`` is a number,
    ``true`` a boolean, ``null`` nothing, anything else text."""
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    return value if value is None or isinstance(value, str | int | float | bool) else text


def _set_parser() -> argparse.ArgumentParser:
    parser = command_parser("set", "KEY VALUE [NAME] [--json]",
                     "Change one setting of a running broker, applied as a reload applies it; "
                     "an invalid value is refused with the reason. The change lasts until the "
                     "next reload (SIGHUP, zbroker reload) re-reads the config file: put it in "
                     "the file to keep it.")
    parser.add_argument("key", metavar="KEY", help="a dotted key, e.g. log.level")
    parser.add_argument("value", metavar="VALUE",
                        help="the value as in the config file, e.g. debug, 30, 1MiB, null")
    common_options(parser)
    return parser


def _set(args: argparse.Namespace) -> int:
    rc, result = _call(args, {"command": "set", "key": args.key,
                              "value": parse_value(args.value)})
    if rc == 0:
        if args.json:
            _print_json(result)
        else:
            print(f"{result['key']}: {_show(result['old'])} -> {_show(result['new'])} "
                  "(until the next reload, which reverts it to the config file: put it in the "
                  "file to keep it)")
    return rc


set_command = Command("set", _set_parser, _set)


# --- reload, stop --------------------------------------------------------------------------


def _reload_parser() -> argparse.ArgumentParser:
    parser = command_parser("reload", "[NAME] [--json]",
                     "Make a running broker re-read its config file, as SIGHUP does; a broken "
                     "config is refused (exit status 1, with the reason) and the broker keeps "
                     "the one it has.")
    common_options(parser)
    return parser


def format_reload(result: dict[str, Any]) -> str:
    """What a reload did, in words: the file, the keys applied, a new cluster key, and the
    keys whose new values wait for a restart."""
    line = f"reloaded {result['config'] or '(embedded defaults)'}"
    changed = result.get("changed")
    key_changed = result.get("cluster_key_changed")
    restart = result.get("restart_needed")
    if changed:
        line += f": changed {', '.join(changed)}"
        if key_changed:
            line += "; the cluster key changed: the peers are linked anew with it"
    elif key_changed:  # (never "nothing changed" beside what did)
        line += (": no setting changed, but the cluster key in its file did: the peers are "
                 "linked anew with it")
    elif restart:
        line += ": nothing applied now"
    elif changed is not None:
        line += ": nothing changed"
    if restart:
        line += ("\nrestart needed for: " + ", ".join(restart) + " (the broker runs on their "
                 "values of before until it restarts)")
    return line


reload_command = Command("reload", _reload_parser,
                         lambda args: _ask_and_show(args, "reload", format_reload))


def _join_token_parser() -> argparse.ArgumentParser:
    parser = command_parser("join-token", "[NAME] [--token] [--json]",
                     "Say what to run on another host to join the cluster of a running "
                     "broker: the broker writes its cluster's join file again (its key and "
                     "this broker's cluster address, mode 0600) and this prints where it is "
                     "and the command. The file holds the cluster key: keep it private.")
    parser.add_argument("--token", action="store_true",
                        help="print only the token, e.g. for "
                             "`zbroker join-token --token | ssh HOST zbroker local --join -`")
    common_options(parser)
    return parser


def _join_token(args: argparse.Namespace) -> int:
    rc, result = _call(args, {"command": "join-token"})
    if rc == 0:
        if args.json:
            _print_json(result)
        else:
            print(result["token"] if args.token else result["instructions"])
    return rc


join_token_command = Command("join-token", _join_token_parser, _join_token)


def _stop_parser() -> argparse.ArgumentParser:
    parser = command_parser("stop", "[NAME] [--json] [--wait SECONDS]",
                     "Stop a running broker, as SIGTERM does, and return once its process has "
                     "exited. Exit status 1 if it is still running after --wait seconds.")
    common_options(parser)
    parser.add_argument("--wait", type=seconds_argument, default=10.0, metavar="SECONDS",
                        help="how long to wait for the broker to exit (default 10)")
    return parser


def _stop(args: argparse.Namespace) -> int:
    rc, result = _call(args, {"command": "stop"})
    if rc != 0:
        return rc
    name, _ = locate(args)
    pid = int(result["pid"])
    deadline = time.monotonic() + args.wait
    while not process_gone(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    gone = process_gone(pid)
    if args.json:
        _print_json({**result, "stopped": gone})
    elif gone:
        print(f"broker {name} (pid {pid}) stopped")
    if not gone:
        error(f"broker {name} (pid {pid}) was asked to stop but is still running after "
               f"{args.wait:g} s; see `zbroker logs {name}`, or kill it: kill -KILL {pid}")
        return 1
    return 0


stop_command = Command("stop", _stop_parser, _stop)


def process_gone(pid: int) -> bool:
    """True once process ``pid`` has exited: no such process, or a zombie (it has exited and
    waits for its parent to collect its status)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
        return state in (b"Z", b"X")
    except FileNotFoundError:
        return True
    except (OSError, IndexError):
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


# --- logs ----------------------------------------------------------------------------------


def _logs_parser() -> argparse.ArgumentParser:
    parser = command_parser("logs", "[-f] [--level LEVEL] [--pipe NAME] [-n LINES] [NAME] [--json]",
                     "Show a running broker's recent events and, with -f, follow new ones "
                     "until the broker stops (or Ctrl-C). Filtering is done by the broker. "
                     "A follower that reads too slowly loses events (it is told how many); it "
                     "never slows the broker. Only events at the broker's log.level or above "
                     "exist: `zbroker set log.level debug` to see more.")
    parser.add_argument("-f", "--follow", action="store_true", help="follow new events")
    parser.add_argument("--level", "-l", choices=LOG_LEVELS, help="lowest level shown")
    parser.add_argument("--pipe", "-p", metavar="PIPE", help="only events of this pipe")
    parser.add_argument("-n", "--lines", type=int, default=20, metavar="LINES",
                        help="recent events shown first (default 20)")
    common_options(parser)
    return parser


def _logs(args: argparse.Namespace) -> int:
    try:
        name, run_dir = locate(args)
        return follow_logs(run_dir, name, sys.stdout, format="json" if args.json else "console",
                           level=args.level, pipe=args.pipe, lines=max(args.lines, 0),
                           follow=args.follow)
    except (ConfigError, NotRunning, NoAccess, CommandError) as exc:
        error(str(exc))
        return 1
    except KeyboardInterrupt:
        return 0


logs_command = Command("logs", _logs_parser, _logs)


MANAGEMENT_COMMANDS: dict[str, Command] = {
    "status": status_command,
    "top": top_command,
    "get": get_command,
    "set": set_command,
    "reload": reload_command,
    "join-token": join_token_command,
    "stop": stop_command,
    "logs": logs_command,
}
