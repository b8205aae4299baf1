"""The broker's typed configuration: YAML in, frozen dataclasses out.

Every setting has an embedded default, so the broker runs without any file. A file only
names what differs. Loading is strict: an unknown key, a value of the wrong type or out of
range is a :class:`ConfigError` whose message names the file, the key path, the bad value
and what is allowed, e.g.::

    /etc/zbroker/zbroker.cfg: log.level: got 'loud', expected one of: debug, info, warning, error

The schema is the dataclasses below, read top to bottom. Each leaf is a ``setting`` with its
default and a parser; each section is a ``section``. To add a shared section, write its
dataclass and add one ``section(...)`` field to its parent; loading, validation, unknown-key
errors and :func:`config_diff` follow by themselves.

The sections under ``services`` are not here: each is its service's own
(``Service.config_section``, built of the pieces above), and ``services`` has one per service
plug-in installed (zbroker.services), found when the schema is first needed. A name under
``services`` that no plug-in has is an unknown key, as any other.

Resolved at load time: ``{name}`` in ``broker.run_dir`` and ``log.file`` becomes the broker
name (and in a service's keys, by its section's ``resolved(broker_name)`` if it has one), and
``broker.run_dir`` gets its default (``$XDG_RUNTIME_DIR/zbroker/<name>``, else
``/tmp/zbroker-<uid>/<name>``). So a loaded Config holds what the broker uses: sizes are ints
(bytes), durations floats (seconds), paths Paths.

Tests and tools that need more sections can subclass Config and pass ``schema=`` to
:func:`load_config` / :func:`parse_config`; the broker reloads with the schema it was given.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("console", "json")
#: how lines go to a syslog server (zbroker/logs/syslog.py writes them)
SYSLOG_FORMATS = ("auto", "rfc5424", "rfc3164")
SYSLOG_TRANSPORTS = ("udp", "tcp", "unix")
SYSLOG_PORT = 514


#: Where the broker looks for its config when not given one, in order.
CONFIG_SEARCH_PATH: tuple[str, ...] = ("./zbroker.cfg", "/etc/zbroker/zbroker.cfg")

SYSLOG_FACILITIES = ("kern", "user", "mail", "daemon", "auth", "syslog", "lpr", "news", "uucp",
                     "cron", "authpriv", "ftp", *(f"local{i}" for i in range(8)))
ENDPOINT_TRANSPORTS = ("tcp", "ipc", "inproc")
SERVED_TRANSPORTS = ("tcp", "ipc")  # the endpoints served over the broker's own ZMTP code


class ConfigError(Exception):
    """The config cannot be used. The message is for the operator, ready to print.

    ``key`` is the dotted key path at fault (or None), ``source`` the file (or None).
    """

    def __init__(self, message: str, *, key: str | None = None, source: str | None = None,
                 problems: Sequence[ConfigError] = ()):
        super().__init__(message)
        self.key = key
        self.source = source
        #: every problem found, each its own ConfigError (a file's schema errors are all
        #: reported at once: the message is theirs, a line each)
        self.problems: list[ConfigError] = list(problems) or [self]


class Invalid(ValueError):
    """Raised by a parser: the argument says what would have been allowed."""


# --- parsers: raw YAML value -> typed value, or Invalid("what is allowed") -------------------

Parser = Callable[[Any], Any]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def integer(minimum: int | None = None, maximum: int | None = None) -> Parser:
    what = _bounds("an integer", minimum, maximum)

    def parse(value: Any) -> int:
        if not _is_int(value) or not _within(value, minimum, maximum):
            raise Invalid(what)
        return value

    return parse


def boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise Invalid("true or false")
    return value


def choice(*allowed: str) -> Parser:
    def parse(value: Any) -> str:
        if value not in allowed:
            raise Invalid("one of: " + ", ".join(allowed))
        return value

    return parse


def duration(*, above: float = 0.0) -> Parser:
    """Seconds, int or float, strictly greater than ``above``."""
    what = f"a number of seconds > {above:g}"

    def parse(value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise Invalid(what)
        if not math.isfinite(value) or value <= above:
            raise Invalid(what)
        return float(value)

    return parse


_SIZE_UNITS = {
    "": 1, "b": 1,
    "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
}
_SIZE_RE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*")


def parse_size(text: str) -> int:
    """``"16 MiB"`` -> 16777216. Units (any case): B, KiB, MiB, GiB, TiB, kB, MB, GB, TB.
    Raises ValueError when the text is not a size or not a whole number of bytes."""
    m = _SIZE_RE.fullmatch(text)
    unit = _SIZE_UNITS.get(m.group(2).lower()) if m else None
    if m is None or unit is None:
        raise ValueError(f"not a size: {text!r}")
    number = m.group(1)
    if "." not in number:
        return int(number) * unit
    whole, frac = number.split(".")
    numerator = int(whole + frac) * unit
    denominator = 10 ** len(frac)
    if numerator % denominator:
        raise ValueError(f"not a whole number of bytes: {text!r}")
    return numerator // denominator


def size(minimum: int = 0, maximum: int | None = None) -> Parser:
    what = _bounds('a size in bytes, as an integer or a string like "512KiB" or "16 MiB"',
                   minimum, maximum, _format_size)

    def parse(value: Any) -> int:
        if _is_int(value):
            n = value
        elif isinstance(value, str):
            try:
                n = parse_size(value)
            except ValueError:
                raise Invalid(what) from None
        else:
            raise Invalid(what)
        if not _within(n, minimum, maximum):
            raise Invalid(what)
        return n

    return parse


def broker_name(value: Any) -> str:
    if not isinstance(value, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", value):
        raise Invalid("a name of 1 to 64 letters, digits, '.', '_' or '-', "
                       "starting with a letter or digit")
    return value


def _template(what: str, value: Any) -> str:
    """A string in which ``{name}`` is the only placeholder."""
    if not isinstance(value, str) or not value:
        raise Invalid(what)
    if re.search(r"[{}]", value.replace("{name}", "")):
        raise Invalid(what + "; {name} is the only placeholder")
    return value


def endpoint(value: Any, transports: tuple[str, ...] = ENDPOINT_TRANSPORTS) -> str:
    what = ("a ZeroMQ endpoint such as 'ipc://@/zpipes/{name}' or 'tcp://*:5670' "
            "(transport " + ", ".join(transports) + ")")
    value = _template(what, value)
    transport, sep, address = value.partition("://")
    if not sep or transport not in transports or not address:
        raise Invalid(what)
    return value


def served_endpoint(value: Any) -> str:
    """An endpoint the broker serves with its own ZMTP code (the ZPIPES client endpoint and
    every pzq endpoint): tcp or ipc, which other processes can reach; not inproc."""
    return endpoint(value, SERVED_TRANSPORTS)


def optional_served_endpoint(value: Any) -> str | None:
    return None if value is None else served_endpoint(value)


def optional_path(value: Any) -> str | None:
    if value is None:
        return None
    return _template("a path, or null", value)


def _bounds(what: str, lo: int | None, hi: int | None,
            fmt: Callable[[int], str] = str) -> str:
    if lo is not None and hi is not None:
        return f"{what}, from {fmt(lo)} to {fmt(hi)}"
    if lo is not None:
        return f"{what} >= {fmt(lo)}"
    if hi is not None:
        return f"{what} <= {fmt(hi)}"
    return what


def _within(n: int, lo: int | None, hi: int | None) -> bool:
    return (lo is None or n >= lo) and (hi is None or n <= hi)


def _format_size(n: int) -> str:
    for unit, mult in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= mult and n % mult == 0:
            return f"{n // mult}{unit}"
    return str(n)


# --- the schema ----------------------------------------------------------------------------


def setting(default: Any, parse: Parser) -> Any:
    """A leaf of the schema: its default (an already-parsed value) and its parser."""
    return field(default=default, metadata={"parse": parse})


def section(cls: type | Callable[[], type]) -> Any:
    """A nested section of the schema: its dataclass, or a function that makes it when it is
    first needed (``services``: the plug-ins' sections)."""
    if isinstance(cls, type):
        return field(default_factory=cls, metadata={"section": cls})
    return field(default_factory=lambda: cls()(), metadata={"section": cls})


def _section_of(f: dataclasses.Field[Any]) -> type:
    cls = f.metadata["section"]
    return cls if isinstance(cls, type) else cls()


@dataclass(frozen=True)
class BrokerConfig:
    name: str = setting("local", broker_name)
    #: null -> $XDG_RUNTIME_DIR/zbroker/<name> or /tmp/zbroker-<uid>/<name>; a Path once loaded
    run_dir: Path | None = setting(None, optional_path)


# --- syslog targets: where log.syslog.target sends (zbroker/logs/syslog.py writes) ----------


@dataclass(frozen=True)
class Target:
    transport: str  # udp, tcp, unix
    host: str = ""
    port: int = 0
    path: str = ""

    def __str__(self) -> str:
        if self.transport == "unix":
            return f"unix://{self.path}"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.transport}://{host}:{self.port}"


_TARGET_WHAT = ('a syslog target "udp://HOST[:PORT]", "tcp://HOST[:PORT]" or '
                '"unix:///PATH" (e.g. "udp://127.0.0.1:514", "unix:///dev/log")')


def parse_target(text: Any) -> Target:
    """``"udp://127.0.0.1:514"`` -> Target. Raises ValueError saying what is allowed."""
    if not isinstance(text, str):
        raise ValueError(_TARGET_WHAT)
    transport, sep, rest = text.partition("://")
    if not sep or transport not in SYSLOG_TRANSPORTS or not rest:
        raise ValueError(_TARGET_WHAT)
    if transport == "unix":
        if not rest.startswith("/"):
            raise ValueError(_TARGET_WHAT + "; a unix path is absolute")
        return Target("unix", path=rest)
    m = re.fullmatch(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)(?::(\d{1,5}))?", rest)
    if m is None:
        raise ValueError(_TARGET_WHAT)
    port = int(m.group(2)) if m.group(2) else SYSLOG_PORT
    if not 1 <= port <= 65535:
        raise ValueError(_TARGET_WHAT + "; the port is from 1 to 65535")
    return Target(transport, host=m.group(1).strip("[]"), port=port)


def syslog_target(value: Any) -> str | None:
    """null (no syslog), or ``udp://HOST[:PORT]``, ``tcp://HOST[:PORT]``, ``unix:///PATH``."""
    if value is None:
        return None
    try:
        return str(parse_target(value))
    except ValueError as exc:
        raise Invalid(str(exc)) from None


@dataclass(frozen=True)
class SyslogConfig:
    #: null: no syslog; else where to send: udp://HOST[:PORT], tcp://HOST[:PORT], unix:///PATH
    target: str | None = setting(None, syslog_target)
    facility: str = setting("daemon", choice(*SYSLOG_FACILITIES))
    #: auto: rfc3164 for unix:// (what /dev/log daemons expect), rfc5424 for udp and tcp
    format: str = setting("auto", choice(*SYSLOG_FORMATS))
    queue: int = setting(10_000, integer(minimum=1, maximum=1_000_000))  # records held


@dataclass(frozen=True)
class LogConfig:
    level: str = setting("info", choice(*LOG_LEVELS))
    format: str = setting("console", choice(*LOG_FORMATS))
    file: Path | None = setting(None, optional_path)  # None: stderr
    syslog: SyslogConfig = section(SyslogConfig)


def optional(parse: Parser) -> Parser:
    """null, or what ``parse`` takes."""
    def parse_optional(value: Any) -> Any:
        if value is None:
            return None
        try:
            return parse(value)
        except Invalid as exc:
            raise Invalid(f"null, or {exc}") from None

    return parse_optional


@dataclass(frozen=True)
class ClientsConfig:
    """The connections of the whole process: every ZMTP endpoint's together (ZPIPES's and
    pzq's). What a service allows its clients is in its own section (services.zpipes)."""

    max_clients: int = setting(10_000, integer(minimum=1))
    #: connections of one source (a uid on ipc, a host on tcp); null: half of max_clients
    max_per_source: int | None = setting(None, optional(integer(minimum=1)))


def id_list(what: str, lookup: Callable[[Any], Any], star: bool) -> Parser:
    allowed = f"a list of {what} names or numbers" + (', or "*" for anyone' if star else "")

    def parse(value: Any) -> tuple[int | str, ...] | None:
        if value is None:
            return None
        if not isinstance(value, list) or not all(
                isinstance(v, str) or _is_int(v) and v >= 0 for v in value):
            raise Invalid(allowed)
        out = []
        for v in value:
            if v == "*" and not star:
                raise Invalid(allowed)
            try:
                out.append(lookup(v))
            except KeyError:
                raise Invalid(f"{allowed}; there is no {what} {v!r} on this host") from None
        return tuple(out)

    return parse


def optional_endpoint(value: Any) -> str | None:
    return None if value is None else endpoint(value)


def seconds(value: Any) -> float:
    """A duration in seconds that may be 0."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
            or value < 0:
        raise Invalid("a number of seconds >= 0")
    return float(value)


def endpoint_list(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise Invalid("a list of ZeroMQ endpoints such as ['tcp://10.0.0.2:5670']")
    return tuple(endpoint(v) for v in value)


@dataclass(frozen=True)
class ClusterConfig:
    enabled: bool = setting(False, boolean)  # off: a standalone broker announces nothing
    name: str = setting("default", broker_name)  # only brokers of the same cluster pair up
    bind: str = setting("tcp://*:5670", endpoint)  # the peer socket
    advertise: str | None = setting(None, optional_endpoint)  # what peers connect to
    discovery: bool = setting(True, boolean)  # zeroconf announce and browse
    peers: tuple[str, ...] = setting((), endpoint_list)  # static peer endpoints
    peer_timeout: float = setting(3.0, duration())  # silence before a peer is lost
    #: the CURVE key pair shared by the cluster; none: the key file of the cluster's name in
    #: the user's config directory (~/.config/zbroker/cluster-NAME.key), made on first start
    key_file: str | None = setting(None, optional_path)
    #: no key at all: any host that says the cluster's name joins (trusted networks only)
    insecure: bool = setting(False, boolean)


METRICS_DEFAULT_HOST = "127.0.0.1"


def parse_bind(text: str) -> tuple[str, int]:
    """``"9670"`` -> ("127.0.0.1", 9670); ``"HOST:PORT"``, ``"[::1]:PORT"`` -> (host, port).
    Port 0: any free port. Raises ValueError when it is not such an address or the port is
    not 0..65535."""
    text = text.strip()
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = METRICS_DEFAULT_HOST, text
    elif host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host or not host:
        raise ValueError(f"not an address: {text!r}")
    if not port.isdigit() or not 0 <= int(port) < 65536 or not host or re.search(r"\s|/", host):
        raise ValueError(f"not an address: {text!r}")
    return host, int(port)


def metrics_bind(value: Any) -> str | None:
    what = ("null (off), or where to serve metrics: PORT (on 127.0.0.1), HOST:PORT or "
            "[IPv6]:PORT, e.g. 127.0.0.1:9670")
    if value is None:
        return None
    if _is_int(value):
        value = str(value)
    if not isinstance(value, str):
        raise Invalid(what)
    try:
        host, port = parse_bind(value)
    except ValueError:
        raise Invalid(what) from None
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclass(frozen=True)
class MetricsConfig:
    #: null: no metrics endpoint; else PORT (on 127.0.0.1), HOST:PORT or [IPv6]:PORT (port 0:
    #: any free one, which `zbroker status` shows)
    bind: str | None = setting(None, metrics_bind)


@dataclass(frozen=True)
class Config:
    broker: BrokerConfig = section(BrokerConfig)
    log: LogConfig = section(LogConfig)
    clients: ClientsConfig = section(ClientsConfig)
    cluster: ClusterConfig = section(ClusterConfig)
    metrics: MetricsConfig = section(MetricsConfig)
    #: a section per service plug-in (its Service.config_section), by the service's name
    services: Any = section(lambda: services_schema())
    #: the file this config was read from; None for the embedded defaults
    source: Path | None = field(default=None, compare=False)
    #: what the operator is told of the file beside its values: keys that moved (the old
    #: name still works), e.g. "clients.timeout is now services.zpipes.client_timeout"
    notes: tuple[str, ...] = field(default=(), compare=False)


def services_schema(registry: Mapping[str, type] | None = None) -> type:
    """The ``services`` section: one section per service of ``registry`` (name -> Service
    class; None: the plug-ins installed), the service's ``config_section``. Raises ConfigError
    when a plug-in cannot be loaded."""
    if registry is None:
        from .services import PluginError, installed

        try:
            registry = installed()
        except PluginError as exc:
            raise ConfigError(str(exc)) from None
    return _services_dataclass(tuple((name, service.config_section)
                                     for name, service in registry.items()))


@functools.cache
def _services_dataclass(sections: tuple[tuple[str, type], ...]) -> type:
    cls = dataclasses.make_dataclass(
        "ServicesConfig", [(name, section_cls, section(section_cls))
                           for name, section_cls in sections], frozen=True)
    cls.__module__ = __name__
    cls.unknown_key_note = "no service plug-in named {key!r} is installed"
    return cls


# --- loading -------------------------------------------------------------------------------


def find_config_file(search: Sequence[str | os.PathLike[str]] = CONFIG_SEARCH_PATH) -> Path | None:
    """The first existing file of ``search`` (relative names are from the current directory)."""
    for candidate in search:
        path = Path(candidate)
        if path.is_file():
            return path
    return None


def load_config(path: str | os.PathLike[str] | None, overrides: Mapping[str, Any] | None = None,
                *, search: Sequence[str | os.PathLike[str]] = CONFIG_SEARCH_PATH,
                schema: type[Config] = Config) -> Config:
    """Read and validate the config.

    ``path``: the file to read; if None, the first file of ``search`` that exists, else the
    embedded defaults. ``overrides``: values from the command line, nested like the file
    (``{"broker": {"name": "x"}}``); they win over the file. ``schema``: Config or a subclass
    of it with more sections.
    """
    file = Path(path) if path is not None else find_config_file(search)
    data: Any = None
    if file is not None:
        try:
            text = file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise ConfigError(f"cannot read config file {str(file)!r}: {reason}",
                              source=str(file)) from None
        data = _parse_yaml(text, str(file))
    return parse_config(data, overrides, source=file, schema=schema)


def parse_config(data: Any, overrides: Mapping[str, Any] | None = None, *,
                 source: str | os.PathLike[str] | None = None,
                 schema: type[Config] = Config) -> Config:
    """Validate already-parsed YAML data (None or a mapping) into a Config."""
    label = str(source) if source is not None else "config"
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"{label}: got {show(data)}, expected a mapping of sections "
                          f"({', '.join(_keys(schema))})", source=_opt(source))
    problems: list[ConfigError] = []
    data, moved = _moved(data, moved_keys(), label, _opt(source), problems)
    merged = _merge(data, overrides or {})
    cfg = _build(schema, merged, (), label, overrides or {}, _opt(source), problems)
    for old, new in moved:  # (a bad value is named as the file names it)
        problems = [ConfigError(str(p).replace(f": {new}: got", f": {old} (now {new}): got"),
                                key=p.key, source=p.source) if p.key == new else p
                    for p in problems]
    if problems:
        first = problems[0]
        raise ConfigError("\n".join(str(p) for p in problems), key=first.key,
                          source=first.source, problems=problems)
    cfg = _resolve(cfg)
    return dataclasses.replace(cfg, source=Path(source) if source is not None else None,
                               notes=tuple(f"{old} is now {new} (the old name works for now)"
                                           for old, new in moved))


def moved_keys() -> dict[str, str]:
    """Keys that moved into a service's section, old dotted key -> new (each service's
    ``moved_keys``): a file with the old name still works, and is told the new one."""
    from .services import PluginError, installed

    try:
        registry = installed()
    except PluginError:
        return {}
    return {old: f"services.{name}.{new}" for name, service in registry.items()
            for old, new in getattr(service, "moved_keys", {}).items()}


def _moved(data: Mapping[str, Any], moved: Mapping[str, str], label: str,
           source: str | None, problems: list[ConfigError]
           ) -> tuple[Mapping[str, Any], list[tuple[str, str]]]:
    """``data`` with the value of each moved key at its new key, and the (old, new) keys so
    moved; a key given under both names is a problem."""
    moved_here: list[tuple[str, str]] = []
    for old, new in moved.items():
        *head, last = old.split(".")
        node: Any = data
        for part in head:
            node = node.get(part) if isinstance(node, Mapping) else None
        if not isinstance(node, Mapping) or last not in node:
            continue
        value = node[last]
        data = _without(data, old.split("."))
        *new_head, new_last = new.split(".")
        there: Any = data
        for part in new_head:
            there = there.get(part) if isinstance(there, Mapping) else None
        if isinstance(there, Mapping) and new_last in there:
            problems.append(ConfigError(f"{label}: {old} and {new} are both given: {old} is "
                                        f"the old name of {new}; keep {new}", key=old,
                                        source=source))
            continue
        data = _merge(data, _nested(new.split("."), value))
        moved_here.append((old, new))
    return data, moved_here


def _without(data: Mapping[str, Any], path: list[str]) -> dict[str, Any]:
    out = dict(data)
    if len(path) == 1:
        out.pop(path[0], None)
    else:
        out[path[0]] = _without(out[path[0]], path[1:])
    return out


def _nested(path: list[str], value: Any) -> dict[str, Any]:
    return {path[0]: value if len(path) == 1 else _nested(path[1:], value)}


def default_config(name: str = "local") -> Config:
    """The embedded defaults (no file is read), for broker ``name``."""
    return parse_config(None, {"broker": {"name": name}})


def _opt(source: Any) -> str | None:
    return str(source) if source is not None else None


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys instead of keeping the last one."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if isinstance(key, str | int | float | bool) or key is None:
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _parse_yaml(text: str, label: str) -> Any:
    try:
        return yaml.load(text, Loader=_StrictLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{label}: {where}not valid YAML: {problem}", source=label) from None


def _merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merge(out[key], value)
        elif isinstance(value, Mapping) and out.get(key) is not None:
            pass  # the file's value is not a section: keep it, so that its error is reported
        else:
            out[key] = value
    return out


def _is_override(overrides: Mapping[str, Any], path: tuple[str, ...]) -> bool:
    node: Any = overrides
    for part in path:
        if not isinstance(node, Mapping) or part not in node:
            return False
        node = node[part]
    return True


def _build(cls: type, data: Any, path: tuple[str, ...], label: str,
           overrides: Mapping[str, Any], source: str | None,
           problems: list[ConfigError]) -> Any:
    """The section ``cls`` from ``data``; each problem found goes to ``problems`` (and the
    rest is still checked), the section then has its defaults where a value was wrong."""
    dotted = ".".join(path)
    if data is None:  # an empty section ("log:" and nothing under it)
        data = {}
    if not isinstance(data, Mapping):
        problems.append(ConfigError(
            f"{label}: {dotted}: got {show(data)}, expected a mapping of keys "
            f"({', '.join(_keys(cls))})", key=dotted, source=source))
        return cls()
    known = _keys(cls)
    for key in data:
        if key not in known:
            where = f"{dotted}.{key}" if dotted else str(key)
            hint = difflib.get_close_matches(str(key), known, n=1)
            did_you_mean = f" (did you mean {hint[0]!r}?)" if hint else ""
            parent = f"under {dotted!r}" if dotted else "at the top level"
            note = getattr(cls, "unknown_key_note", None)
            note = "; " + note.format(key=key) if note else ""
            problems.append(ConfigError(
                f"{label}: unknown key {where!r}{did_you_mean}; known keys {parent}: "
                f"{', '.join(known)}{note}", key=where, source=source))
    values: dict[str, Any] = {}
    for f in schema_fields(cls):
        if f.name not in data:
            continue
        sub = (*path, f.name)
        if "section" in f.metadata:
            values[f.name] = _build(_section_of(f), data[f.name], sub, label,
                                    overrides, source, problems)
            continue
        value = data[f.name]
        try:
            values[f.name] = f.metadata["parse"](value)
        except Invalid as exc:
            key = ".".join(sub)
            origin = "command line" if _is_override(overrides, sub) else label
            problems.append(ConfigError(f"{origin}: {key}: got {show(value)}, expected {exc}",
                                        key=key, source=source))
    return cls(**values)


def schema_fields(cls: type) -> list[dataclasses.Field[Any]]:
    return [f for f in dataclasses.fields(cls) if "parse" in f.metadata or "section" in f.metadata]


def _keys(cls: type) -> list[str]:
    return [f.name for f in schema_fields(cls)]


def show(value: Any) -> str:
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if value is None:
        return "null"
    text = repr(value)
    if len(text) > SHOW_MAX:  # a whole file that is not YAML mappings, say: its start
        return f"{text[:SHOW_MAX - 20]}... ({len(str(value))} characters)"
    return text


SHOW_MAX = 80  # characters of a bad value quoted in an error


def _resolve(cfg: Config) -> Config:
    name = cfg.broker.name
    run_dir = cfg.broker.run_dir
    if run_dir is None:
        xdg = os.environ.get("XDG_RUNTIME_DIR")
        base = Path(xdg) / "zbroker" if xdg else Path(f"/tmp/zbroker-{os.getuid()}")
        run_dir_path = base / name
    else:
        run_dir_path = Path(str(run_dir).replace("{name}", name)).expanduser().absolute()
    log_file = cfg.log.file
    log_path = Path(str(log_file).replace("{name}", name)).expanduser() if log_file else None
    services = {f.name: getattr(cfg.services, f.name) for f in schema_fields(type(cfg.services))}
    return dataclasses.replace(
        cfg,
        broker=dataclasses.replace(cfg.broker, run_dir=run_dir_path),
        log=dataclasses.replace(cfg.log, file=log_path),
        services=dataclasses.replace(cfg.services, **{
            key: section.resolved(name) for key, section in services.items()
            if hasattr(section, "resolved")}),
    )


# --- comparing configs ---------------------------------------------------------------------


def iter_settings(cfg: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, value) for every setting of a config or section, in schema order."""
    for f in schema_fields(type(cfg)):
        value = getattr(cfg, f.name)
        key = f"{prefix}{f.name}"
        if "section" in f.metadata:
            yield from iter_settings(value, key + ".")
        else:
            yield key, value


def config_diff(old: Config, new: Config) -> list[str]:
    """The dotted keys whose values differ between two configs, in schema order."""
    new_values = dict(iter_settings(new))
    return [key for key, value in iter_settings(old) if new_values[key] != value]


def with_setting(cfg: Config, key: str, value: Any, *, origin: str = "set") -> Config:
    """``cfg`` with the one setting at dotted ``key`` set to ``value`` (as YAML would give it:
    ``"debug"``, ``30``, ``"1MiB"``, ``true``, ``None``), validated like a file's value; the
    message of the ConfigError names ``origin``, the key, the bad value and what is allowed.
    A key that moved is set under its new name."""
    key = moved_keys().get(key, key)
    parts = key.split(".")

    def replace(node: Any, i: int) -> Any:
        fields = {f.name: f for f in schema_fields(type(node))}
        dotted = ".".join(parts[: i + 1])
        f = fields.get(parts[i])
        if f is None:
            known = list(fields)
            hint = difflib.get_close_matches(parts[i], known, n=1)
            did_you_mean = f" (did you mean {hint[0]!r}?)" if hint else ""
            parent = f"under {'.'.join(parts[:i])!r}" if i else "at the top level"
            raise ConfigError(f"{origin}: unknown key {dotted!r}{did_you_mean}; known keys "
                              f"{parent}: {', '.join(known)}", key=dotted)
        if "section" in f.metadata:
            if i == len(parts) - 1:
                raise ConfigError(f"{origin}: {dotted!r} is a section, not a setting; its keys: "
                                  f"{', '.join(_keys(_section_of(f)))}", key=dotted)
            return dataclasses.replace(node, **{f.name: replace(getattr(node, f.name), i + 1)})
        if i != len(parts) - 1:
            raise ConfigError(f"{origin}: {dotted!r} is a setting, not a section", key=dotted)
        try:
            parsed = f.metadata["parse"](value)
        except Invalid as exc:
            raise ConfigError(f"{origin}: {key}: got {show(value)}, expected {exc}",
                              key=key) from None
        return dataclasses.replace(node, **{f.name: parsed})

    return _resolve(replace(cfg, 0))


def with_value(cfg: Any, key: str, value: Any) -> Any:
    """``cfg`` with the setting at dotted ``key`` replaced by ``value``, a value as a loaded
    config holds it (not parsed again: e.g. a running value put back)."""
    head, _, rest = key.partition(".")
    if not rest:
        return dataclasses.replace(cfg, **{head: value})
    return dataclasses.replace(cfg, **{head: with_value(getattr(cfg, head), rest, value)})


def schema_keys() -> list[str]:
    """Every dotted key of the schema."""
    return [key for key, _ in iter_settings(Config())]
