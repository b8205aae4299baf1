"""The typed config: defaults, the example file, parsing and every validation error."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from zbroker.config import (
    Config,
    ConfigError,
    config_diff,
    default_config,
    find_config_file,
    load_config,
    parse_config,
    parse_size,
    schema_keys,
    with_setting,
)
from zbroker.services.zpipes.config import MAX_CHUNK_LIMIT

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = REPO_ROOT / "zbroker.cfg.example"


@pytest.fixture(autouse=True)
def _no_xdg(monkeypatch):
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)


def load_text(tmp_path: Path, text: str, overrides: dict | None = None) -> Config:
    path = tmp_path / "zbroker.cfg"
    path.write_text(text)
    return load_config(path, overrides)


def error_of(tmp_path: Path, text: str, overrides: dict | None = None) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_text(tmp_path, text, overrides)
    return info.value


# --- defaults --------------------------------------------------------------------------------


def test_embedded_defaults():
    c = default_config()
    assert c.broker.name == "local"
    assert c.broker.run_dir == Path(f"/tmp/zbroker-{os.getuid()}/local")
    assert c.log.level == "info"
    assert c.log.format == "console"
    assert c.log.file is None
    z = c.services.zpipes
    assert z.animate is False
    assert z.client_timeout == 60.0 and isinstance(z.client_timeout, float)
    assert c.clients.max_clients == 10_000
    assert z.max_pipelined == 64
    assert z.max_pipelined_bytes == 8 * 1024 * 1024
    assert c.notes == ()
    assert c.services.zpipes.enabled is True
    assert c.services.zpipes.endpoint == "ipc://@/zpipes/local"
    assert c.services.zpipes.capacity == 1024 * 1024
    assert c.services.zpipes.max_chunk == 16 * 1024 * 1024
    assert c.source is None


def test_no_file_anywhere_gives_the_defaults(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert load_config(None, search=[tmp_path / "none.cfg"]) == default_config()
    assert load_config(None, search=[]).source is None


def test_search_path_takes_the_first_existing_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    second = tmp_path / "etc.cfg"
    second.write_text("log: {level: error}\n")
    search = ["./zbroker.cfg", str(second)]
    assert find_config_file(search) == second
    assert load_config(None, search=search).log.level == "error"
    (tmp_path / "zbroker.cfg").write_text("log: {level: debug}\n")
    c = load_config(None, search=search)
    assert c.log.level == "debug" and c.source == Path("zbroker.cfg")


def test_run_dir_defaults_to_xdg_runtime_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert default_config("b1").broker.run_dir == tmp_path / "zbroker" / "b1"


def test_name_placeholders_are_resolved(tmp_path):
    c = load_text(tmp_path, """
broker: {name: alpha, run_dir: "/var/run/zb/{name}"}
log: {file: "/var/log/zbroker-{name}.log"}
services: {zpipes: {endpoint: "tcp://*:5670"}}
""")
    assert c.broker.run_dir == Path("/var/run/zb/alpha")
    assert c.log.file == Path("/var/log/zbroker-alpha.log")
    assert c.services.zpipes.endpoint == "tcp://*:5670"
    c = load_text(tmp_path, "broker: {name: beta}\n")
    assert c.services.zpipes.endpoint == "ipc://@/zpipes/beta"


def test_config_is_frozen():
    c = default_config()
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.log.level = "debug"  # type: ignore[misc]


# --- the example file ------------------------------------------------------------------------


def test_example_file_is_exactly_the_defaults():
    c = load_config(EXAMPLE)
    assert c == default_config()
    assert config_diff(default_config(), c) == []


def _yaml_keys(data: dict, prefix: str = "") -> list[str]:
    keys = []
    for k, v in data.items():
        if isinstance(v, dict):
            keys += _yaml_keys(v, f"{prefix}{k}.")
        else:
            keys.append(f"{prefix}{k}")
    return keys


def test_example_file_shows_every_key():
    assert _yaml_keys(yaml.safe_load(EXAMPLE.read_text())) == schema_keys()


# --- sizes and durations ---------------------------------------------------------------------


@pytest.mark.parametrize("text, expected", [
    ("1MiB", 1 << 20), ("16 MiB", 16 << 20), ("512KiB", 512 << 10), ("1GiB", 1 << 30),
    ("2 gib", 2 << 30), ("1tib", 1 << 40), ("100", 100), ("100B", 100), ("1kB", 1000),
    ("3MB", 3_000_000), ("1.5KiB", 1536), (" 8 MiB ", 8 << 20),
])
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "MiB", "1.3B", "1 parsec", "-1KiB", "1e3", "0x10", "1 2"])
def test_parse_size_rejects(text):
    with pytest.raises(ValueError):
        parse_size(text)


@given(n=st.integers(min_value=0, max_value=2**40),
       unit=st.sampled_from([("", 1), ("B", 1), ("KiB", 1024), ("MiB", 1 << 20),
                             ("GiB", 1 << 30), ("kB", 1000), ("MB", 10**6)]),
       space=st.sampled_from(["", " "]))
def test_parse_size_any_integer_and_unit(n, unit, space):
    suffix, factor = unit
    assert parse_size(f"{n}{space}{suffix}") == n * factor


def test_sizes_accept_ints_and_strings(tmp_path):
    c = load_text(tmp_path, """
services: {zpipes: {capacity: "64 KiB", max_chunk: 4GiB - 1, max_pipelined_bytes: 4096}}
""".replace("4GiB - 1", str(MAX_CHUNK_LIMIT)))
    assert c.services.zpipes.max_pipelined_bytes == 4096
    assert c.services.zpipes.capacity == 65536
    assert c.services.zpipes.max_chunk == MAX_CHUNK_LIMIT


@pytest.mark.parametrize("value, expected", [("60", 60.0), ("0.25", 0.25), ("1.0e-3", 0.001)])
def test_durations_accept_ints_and_floats(tmp_path, value, expected):
    c = load_text(tmp_path, f"services: {{zpipes: {{client_timeout: {value}}}}}\n")
    z = c.services.zpipes
    assert z.client_timeout == expected and isinstance(z.client_timeout, float)


# --- every validation error, with the key path, the bad value and what is allowed ------------

def zp(keys: str) -> str:
    """A services.zpipes section of ``keys``, as YAML."""
    return "services: {zpipes: {" + keys + "}}"


ZP = "services.zpipes."

BAD_VALUES = [
    # (yaml, key, bad value as shown, what is allowed)
    ("broker: {name: ''}", "broker.name", "''", "a name of 1 to 64 letters"),
    ("broker: {name: a/b}", "broker.name", "'a/b'", "a name of 1 to 64 letters"),
    ("broker: {name: 42}", "broker.name", "42", "a name of"),
    ("broker: {name: " + "x" * 65 + "}", "broker.name", "'xxx", "1 to 64"),
    ("broker: {run_dir: 7}", "broker.run_dir", "7", "a path, or null"),
    ("broker: {run_dir: '/x/{uid}'}", "broker.run_dir", "'/x/{uid}'", "{name} is the only"),
    ("log: {level: verbose}", "log.level", "'verbose'", "one of: debug, info, warning, error"),
    ("log: {level: INFO}", "log.level", "'INFO'", "one of: debug, info, warning, error"),
    ("log: {format: xml}", "log.format", "'xml'", "one of: console, json"),
    ("log: {file: [a]}", "log.file", "a list", "a path, or null"),
    (zp("animate: 'maybe'"), ZP + "animate", "'maybe'", "true or false"),
    (zp("animate: 1"), ZP + "animate", "1", "true or false"),
    (zp("client_timeout: 0"), ZP + "client_timeout", "0", "a number of seconds > 0"),
    (zp("client_timeout: -5"), ZP + "client_timeout", "-5", "a number of seconds > 0"),
    (zp("client_timeout: '60s'"), ZP + "client_timeout", "'60s'", "a number of seconds > 0"),
    (zp("client_timeout: true"), ZP + "client_timeout", "True", "a number of seconds > 0"),
    (zp("client_timeout: .inf"), ZP + "client_timeout", "inf", "a number of seconds > 0"),
    (zp("client_timeout: .nan"), ZP + "client_timeout", "nan", "a number of seconds > 0"),
    (zp("client_timeout: null"), ZP + "client_timeout", "null", "a number of seconds > 0"),
    ("clients: {max_clients: 0}", "clients.max_clients", "0", "an integer >= 1"),
    ("clients: {max_clients: 1.5}", "clients.max_clients", "1.5", "an integer >= 1"),
    ("clients: {max_clients: '10'}", "clients.max_clients", "'10'", "an integer >= 1"),
    (zp("max_pipelined: -1"), ZP + "max_pipelined", "-1", "an integer >= 1"),
    (zp("max_pipelined: false"), ZP + "max_pipelined", "False", "an integer"),
    (zp("max_pipelined_bytes: 0"), ZP + "max_pipelined_bytes", "0",
     "a size in bytes"),
    (zp("max_pipelined_bytes: 8 MiBs"), ZP + "max_pipelined_bytes", "'8 MiBs'",
     '"512KiB" or "16 MiB"'),
    ("services: {zpipes: {enabled: 'no'}}", "services.zpipes.enabled", "'no'", "true or false"),
    ("services: {zpipes: {endpoint: 'udp://x:1'}}", "services.zpipes.endpoint", "'udp://x:1'",
     "transport tcp, ipc)"),
    # served by the broker's own ZMTP code, which other processes reach by tcp or ipc only
    ("services: {zpipes: {endpoint: 'inproc://zp'}}", "services.zpipes.endpoint",
     "'inproc://zp'", "transport tcp, ipc)"),
    ("cluster: {bind: 'udp://x:1'}", "cluster.bind", "'udp://x:1'",
     "transport tcp, ipc, inproc)"),
    ("services: {zpipes: {endpoint: 'zpipes'}}", "services.zpipes.endpoint", "'zpipes'",
     "a ZeroMQ endpoint"),
    ("services: {zpipes: {endpoint: 'ipc://'}}", "services.zpipes.endpoint", "'ipc://'",
     "a ZeroMQ endpoint"),
    ("services: {zpipes: {endpoint: 'ipc://@/z/{broker}'}}", "services.zpipes.endpoint",
     "'ipc://@/z/{broker}'", "{name} is the only placeholder"),
    ("services: {zpipes: {capacity: 0.5}}", "services.zpipes.capacity", "0.5", "a size"),
    ("services: {zpipes: {capacity: 0}}", "services.zpipes.capacity", "0", ">= 1"),
    ("services: {zpipes: {max_chunk: 4GiB}}", "services.zpipes.max_chunk", "'4GiB'",
     "from 1 to 4294967295"),
    ("services: {pzq: {defaults: {sync_max_bytes: 100}}}", "services.pzq.defaults.sync_max_bytes",
     "100", ">= 4KiB"),
]


@pytest.mark.parametrize("text, key, shown, allowed", BAD_VALUES)
def test_bad_value_message_names_file_key_value_and_allowed(tmp_path, text, key, shown, allowed):
    err = error_of(tmp_path, text + "\n")
    message = str(err)
    assert message.startswith(f"{tmp_path / 'zbroker.cfg'}: {key}: got {shown}"), message
    assert allowed in message.partition(", expected ")[2], message
    assert err.key == key
    assert err.source == str(tmp_path / "zbroker.cfg")


def test_fractional_sizes_are_fine_when_whole(tmp_path):
    c = load_text(tmp_path, "services: {zpipes: {capacity: 1.5MiB}}\n")
    assert c.services.zpipes.capacity == 3 << 19


@pytest.mark.parametrize("text, key, fragments", [
    ("colour: blue", "colour", ["unknown key 'colour'", "at the top level",
                                "broker, log, clients, cluster, metrics, services"]),
    ("clients: {max_client: 5}", "clients.max_client", ["unknown key 'clients.max_client'",
                                                        "did you mean 'max_clients'?",
                                                        "under 'clients'", "max_per_source"]),
    ("services: {pzz: {enabled: true}}", "services.pzz", ["unknown key 'services.pzz'",
                                                          "did you mean 'pzq'?",
                                                          "known keys under 'services': zpipes"]),
    ("services: {zpipes: {capacity: 1, size: 2}}", "services.zpipes.size",
     ["unknown key 'services.zpipes.size'"]),
])
def test_unknown_keys_are_errors(tmp_path, text, key, fragments):
    err = error_of(tmp_path, text + "\n")
    for fragment in fragments:
        assert fragment in str(err), str(err)
    assert err.key == key


@pytest.mark.parametrize("text, fragments", [
    ("- a\n- b\n", ["got a list, expected a mapping of sections"]),
    ("just words\n", ["got 'just words', expected a mapping of sections"]),
    ("log: debug\n", ["log: got 'debug', expected a mapping of keys (level, format, file, "
                      "syslog)"]),
    ("services: {zpipes: on}\n", ["services.zpipes: got True, expected a mapping"]),
    ("log: {level: [debug\n", ["not valid YAML", "line 2"]),
    ("log:\n  level: info\n  level: debug\n", ["line 3, column 3", "duplicate key 'level'"]),
    ("\tlog: x\n", ["not valid YAML", "line 1"]),
])
def test_malformed_files(tmp_path, text, fragments):
    err = str(error_of(tmp_path, text))
    assert err.startswith(str(tmp_path / "zbroker.cfg") + ": ")
    for fragment in fragments:
        assert fragment in err, err


def test_empty_file_and_empty_sections_mean_defaults(tmp_path):
    assert load_text(tmp_path, "") == default_config()
    assert load_text(tmp_path, "# nothing\n") == default_config()
    assert load_text(tmp_path, "log:\nservices:\n  zpipes:\n") == default_config()


def test_missing_or_unreadable_file(tmp_path):
    with pytest.raises(ConfigError, match=r"cannot read config file '.*nope.cfg': No such file"):
        load_config(tmp_path / "nope.cfg")
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path)  # a directory
    (tmp_path / "bin.cfg").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "bin.cfg")


# --- overrides (the command line) ------------------------------------------------------------


def test_overrides_win_over_the_file(tmp_path):
    c = load_text(tmp_path, "broker: {name: filename}\nlog: {level: error, format: json}\n",
                  {"broker": {"name": "cli"}, "log": {"level": "debug"},
                   "services": {"zpipes": {"animate": True}}})
    assert c.broker.name == "cli"
    assert c.log.level == "debug" and c.log.format == "json"
    assert c.services.zpipes.animate is True
    assert c.services.zpipes.endpoint == "ipc://@/zpipes/cli"


def test_bad_override_is_blamed_on_the_command_line(tmp_path):
    err = error_of(tmp_path, "", {"broker": {"name": "no spaces"}})
    assert str(err).startswith("command line: broker.name: got 'no spaces'")


def test_an_override_does_not_hide_a_broken_section(tmp_path):
    err = error_of(tmp_path, "broker: 5\n", {"broker": {"name": "cli"}})
    assert "broker: got 5, expected a mapping of keys (name, run_dir)" in str(err)


def test_a_queue_endpoint_is_tcp_or_ipc():
    with pytest.raises(ConfigError, match=r"send_endpoint: got 'inproc://q', .*\(transport "
                                          r"tcp, ipc\)"):
        parse_config({"services": {"pzq": {"queues": {"q": {"send_endpoint": "inproc://q"}}}}})


def test_parse_config_from_data():
    c = parse_config({"services": {"zpipes": {"endpoint": "ipc://@/zp-{name}"}}},
                     {"broker": {"name": "n1"}})
    assert c.services.zpipes.endpoint == "ipc://@/zp-n1"
    with pytest.raises(ConfigError, match=r"^config: services.zpipes.client_timeout"):
        parse_config({"services": {"zpipes": {"client_timeout": 0}}})


# --- comparing -------------------------------------------------------------------------------


def test_config_diff_lists_changed_keys_in_schema_order():
    old = default_config()
    new = parse_config({"services": {"zpipes": {"capacity": 5}}, "log": {"level": "debug"}})
    assert config_diff(old, new) == ["log.level", "services.zpipes.capacity"]
    assert config_diff(new, new) == []


def test_schema_keys():
    assert schema_keys() == [
        "broker.name", "broker.run_dir",
        "log.level", "log.format", "log.file",
        "log.syslog.target", "log.syslog.facility", "log.syslog.format", "log.syslog.queue",
        "clients.max_clients", "clients.max_per_source",
        "cluster.enabled", "cluster.name", "cluster.bind", "cluster.advertise",
        "cluster.discovery", "cluster.peers", "cluster.peer_timeout", "cluster.key_file",
        "cluster.insecure",
        "metrics.bind",
        "services.zpipes.enabled", "services.zpipes.endpoint", "services.zpipes.capacity",
        "services.zpipes.max_chunk", "services.zpipes.allow.users",
        "services.zpipes.allow.groups", "services.zpipes.client_timeout",
        "services.zpipes.max_pipelined", "services.zpipes.max_pipelined_bytes",
        "services.zpipes.max_buffered", "services.zpipes.max_buffered_per_source",
        "services.zpipes.animate", "services.zpipes.pipe_series",
        "services.pzq.enabled",
        *(f"services.pzq.defaults.{k}" for k in (
            "mode", "stream_endpoint", "retention_bytes", "retention_seconds",
            "receive_endpoint", "send_endpoint", "credit_endpoint", "monitor_endpoint",
            "data_dir", "sync",
            "sync_window", "sync_max_bytes", "segment_size", "ack_timeout", "reaper_frequency",
            "inflight_window", "inflight_size", "max_message_size", "max_backlog",
            "idempotence_window", "idempotence_bytes", "max_frames", "replicas",
            "replication_timeout", "peers", "node_timeout", "replica_sources",
            "max_replica_origins")),
        "services.pzq.queues",
    ]


def test_zpipes_allow_takes_names_and_numbers_and_refuses_unknown_ones():
    c = parse_config({"services": {"zpipes": {"allow": {"users": ["root", 1234, "*"],
                                                        "groups": ["root", "5"]}}}})
    assert c.services.zpipes.allow.users == (0, 1234, "*")
    assert c.services.zpipes.allow.groups == (0, 5)
    assert parse_config(None).services.zpipes.allow.groups is None  # the broker's own group
    with pytest.raises(ConfigError, match="services.zpipes.allow.users.*no user 'no-such-u'"):
        parse_config({"services": {"zpipes": {"allow": {"users": ["no-such-u"]}}}})
    with pytest.raises(ConfigError, match="services.zpipes.allow.groups"):
        parse_config({"services": {"zpipes": {"allow": {"groups": ["*"]}}}})
    with pytest.raises(ConfigError, match="services.zpipes.allow.users"):
        parse_config({"services": {"zpipes": {"allow": {"users": "alice"}}}})


def test_pzq_queue_defaults_agree_everywhere():
    """The broker's config, a queue's QueueSettings, its Limits, its Store and the standalone
    pzq command start from the same defaults."""
    import inspect

    from zbroker.services.pzq.commands import standalone
    from zbroker.services.pzq.core.queue import Limits
    from zbroker.services.pzq.settings import QueueSettings
    from zbroker.services.pzq.store import Store

    config = default_config().services.pzq.defaults
    settings = {f.name: f.default for f in dataclasses.fields(QueueSettings)
                if f.default is not dataclasses.MISSING}
    for name, value in settings.items():
        assert getattr(config, name) == value, name
    for field in dataclasses.fields(Limits):
        if hasattr(config, field.name):
            assert getattr(config, field.name) == field.default, field.name
    store = inspect.signature(Store).parameters
    assert (store["sync"].default, store["sync_window"].default, store["segment_size"].default,
            store["max_batch_bytes"].default) == (config.sync, config.sync_window,
                                                  config.segment_size, config.sync_max_bytes)
    args = standalone.parser().parse_args([])
    s = standalone.settings_from_args(args)
    for name in ("sync", "sync_window", "sync_max_bytes", "segment_size", "ack_timeout",
                 "reaper_frequency", "inflight_window", "inflight_size", "max_message_size",
                 "max_backlog", "idempotence_bytes", "max_frames", "replicas",
                 "replication_timeout", "node_timeout", "mode", "receive_endpoint",
                 "send_endpoint", "stream_endpoint", "credit_endpoint", "replica_sources",
                 "max_replica_origins", "retention_bytes", "retention_seconds"):
        assert getattr(s, name) == getattr(config, name), name
    assert args.log_level == default_config().log.level


# --- keys that moved into a service's section ----------------------------------------------


def test_a_key_that_moved_works_by_its_old_name_and_the_new_one_is_said(tmp_path):
    c = load_text(tmp_path, "clients: {timeout: 5, max_clients: 7}\nlog: {animate: true}\n"
                            "metrics: {pipe_series: 3}\n")
    z = c.services.zpipes
    assert (z.client_timeout, z.animate, z.pipe_series) == (5.0, True, 3)
    assert c.clients.max_clients == 7  # (the process's: it stays)
    assert c.notes == (
        "clients.timeout is now services.zpipes.client_timeout (the old name works for now)",
        "log.animate is now services.zpipes.animate (the old name works for now)",
        "metrics.pipe_series is now services.zpipes.pipe_series (the old name works for now)")


def test_a_bad_value_under_an_old_name_is_named_as_the_file_names_it(tmp_path):
    err = error_of(tmp_path, "clients: {timeout: -5}\n")
    assert "clients.timeout (now services.zpipes.client_timeout): got -5, expected a number " \
           "of seconds > 0" in str(err)


def test_a_key_given_under_both_names_is_refused(tmp_path):
    err = error_of(tmp_path, "clients: {max_buffered: 1MiB}\n"
                             "services: {zpipes: {max_buffered: 2MiB}}\n")
    assert "clients.max_buffered and services.zpipes.max_buffered are both given" in str(err)


def test_set_by_an_old_name_sets_the_new_key():
    c = with_setting(default_config(), "clients.max_pipelined", 9)
    assert c.services.zpipes.max_pipelined == 9
