"""Finding a running broker from the options of a command (NAME, --config, --run-dir): its
name and run directory, where its control socket is, as the broker's own config gives them."""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml

from zbroker.config import Config, ConfigError, find_config_file, load_config, parse_config


def locate(args: argparse.Namespace) -> tuple[str, Path]:
    """(broker name, run directory). Raises ConfigError when the config does not say them.

    A config file with errors elsewhere than in its ``broker`` section still locates the
    broker, and says nothing of them: a command that only finds the broker does not use
    the rest (``zbroker reload`` gets the errors from the broker, which reads the file)."""
    config, _ = load_for_locating(args.config, args.name)
    run_dir = Path(args.run_dir) if args.run_dir else config.broker.run_dir
    assert run_dir is not None
    return config.broker.name, run_dir


def load_for_locating(path: str | None, name: str | None) -> tuple[Config, ConfigError | None]:
    """The config of ``path`` (None: the broker's search) with broker ``name`` (if given), and
    None; or, when it has errors outside its ``broker`` section, a config of that section
    alone and the error, for a command that needs more of the config to report. Raises
    ConfigError when even the broker section cannot be read."""
    overrides = {"broker": {"name": name}} if name else None
    try:
        return load_config(path, overrides), None
    except ConfigError as exc:
        config = _broker_section_only(path, overrides)
        if config is None:
            raise
        return config, exc


def _broker_section_only(path: str | None, overrides: dict | None) -> Config | None:
    file = Path(path) if path else find_config_file()
    try:
        data = yaml.safe_load(file.read_text(encoding="utf-8")) if file else None
        broker = data.get("broker") if isinstance(data, dict) else None
        return parse_config({"broker": broker} if broker is not None else None, overrides)
    except (OSError, UnicodeDecodeError, yaml.YAMLError, ConfigError):
        return None
