"""The examples of README.md and docs/ run as written, against a real broker.

A fenced code block whose info string is ``sh example`` or ``python example`` is a runnable
example (GitHub shows it as plain ``sh`` or ``python``); every other block is only shown.
Each example runs in a directory of its own that holds a ``zbroker.cfg`` naming a broker
started for it (so ``zbroker status`` finds it as an operator's would) and a copy of
``docs/``, with ``$ZPIPES_BROKER`` naming the same broker (so that ``zpipes`` and
``zpipes.open`` use it rather than ``local``): shell blocks in bash with the venv's commands
first on PATH, as after ``source .venv/bin/activate``, Python blocks with the venv's Python.
Every run has a timeout, and an example leaves nothing behind in its directory (run from the
repository, it would be left there).

A file that names a config of the repository in a comment, ``<!-- examples: config/X.cfg
-->``, has its examples run in their order, one after the other, against one broker started
with that config (its tcp ports moved to free ones and its queues' data to the test's
folder, so that tests running beside it do not meet), in one directory: each example may
rely on what those before it did, as a reader following the file would.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import REPO_ROOT, broker_env, free_port, run_zbroker, unique_name

TIMEOUT = 60.0  # seconds any one example may take
FENCE = re.compile(r"^```(?P<info>[^\n`]*)\n(?P<body>.*?)^```[ \t]*$", re.M | re.S)
RUNNERS = {"sh", "python"}
CONFIG_MARK = re.compile(r"^<!-- examples: (?P<config>\S+) -->$", re.M)

# What an example must print (stdout and stderr together), keyed by a piece of its text:
# examples whose effect is not only their exit status.
EXPECTED = {
    "zpipes read logs | grep ERROR": ["ERROR disk full"],
    "tar x -C restored": ["copied"],
    'zpipes.open("logs", "r"': ["b'hello\\n'"],
    "zpipes write big --progress": ["zpipes write: 4.0 MiB", "100%", "zpipes read: 4.0 MiB"],
    "zbroker set log.level debug": ["log.level: info -> debug", "reverts it", "reloaded",
                                    "zbroker.cfg: OK", "zbroker top: broker", "ZPIPES: "],
    "zbroker set metrics.bind": ["metrics: http://127.0.0.1:", "zbroker top: broker",
                                 "ZPIPES: "],
    'zbroker queue put jobs -f "$files/a.txt"': ["a\nb\nfirst\nsecond\n"],
    "zbroker queue group list events": ["e1\ne2\ne1\ne2\ne1\ne2\n",
                                        "queue 'events' had no message to get", "audit"],
}


def examples() -> list[tuple[str, int, str, str]]:
    """(file, line, language, code) of every runnable example."""
    found = []
    for path in [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]:
        text = path.read_text(encoding="utf-8")
        for m in FENCE.finditer(text):
            words = m.group("info").split()
            if len(words) == 2 and words[1] == "example":
                assert words[0] in RUNNERS, f"{path.name}: unknown example language {words[0]}"
                line = text.count("\n", 0, m.start()) + 1
                found.append((path.relative_to(REPO_ROOT).as_posix(), line, words[0],
                              m.group("body")))
    return found


def doc_configs() -> dict[str, str]:
    """file -> the repository config its examples run against (``<!-- examples: ... -->``)."""
    found = {}
    for path in [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]:
        m = CONFIG_MARK.search(path.read_text(encoding="utf-8"))
        if m:
            assert (REPO_ROOT / m.group("config")).is_file(), \
                f"{path.name} names {m.group('config')}, which is not in the repository"
            found[path.relative_to(REPO_ROOT).as_posix()] = m.group("config")
    return found


EXAMPLES = examples()
CONFIGS = doc_configs()
ALONE = [e for e in EXAMPLES if e[0] not in CONFIGS]  # each against a broker of its own


def test_there_are_examples_in_the_readme():
    assert sum(1 for file, *_ in EXAMPLES if file == "README.md") >= 4
    assert any(lang == "python" for _, _, lang, _ in EXAMPLES)


def test_the_queue_examples_run_against_the_shipped_queues_config():
    assert CONFIGS.get("docs/pzq.md") == "config/queues.cfg"
    assert sum(1 for file, *_ in EXAMPLES if file == "docs/pzq.md") >= 2
    r = run_zbroker(["check-config", "config/queues.cfg"], cwd=REPO_ROOT)
    assert (r.returncode, r.stdout, r.stderr) == (0, "config/queues.cfg: OK\n", "")
    config = yaml.safe_load((REPO_ROOT / "config/queues.cfg").read_text(encoding="utf-8"))
    queues = config["services"]["pzq"]["queues"]
    assert (queues["events"] or {}).get("mode") == "stream"
    assert (queues["jobs"] or {}).get("mode", "push") == "push"


def run_example(work: Path, env: dict[str, str], file: str, line: int, lang: str,
                code: str) -> None:
    """Run one example in ``work``; fail with what it printed unless it exits 0, prints what
    EXPECTED says, and leaves ``work`` as it found it."""
    before = sorted(p.name for p in work.iterdir())
    if lang == "sh":
        argv = ["bash", "-e", "-o", "pipefail", "-c", code]
    else:
        argv = [sys.executable, "-c", code]
    proc = subprocess.Popen(argv, cwd=work, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{file}:{line}: the example still ran after {TIMEOUT}s (it hangs)\n"
                    f"stdout: {out}\nstderr: {err}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    report = f"{file}:{line}: exit status {proc.returncode}\nstdout: {out}\nstderr: {err}"
    assert proc.returncode == 0, report
    assert "Traceback" not in err, report
    for piece, wanted in EXPECTED.items():
        if piece in code:
            for text in wanted:
                assert text in out + err, report
    left = sorted(p.name for p in work.iterdir())
    assert left == before, f"{file}:{line}: the example left {set(left) - set(before)}"


def example_env(work: Path, name: str) -> dict[str, str]:
    env = broker_env(work)
    env["ZPIPES_BROKER"] = name
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


@pytest.mark.parametrize("file,line,lang,code", ALONE,
                         ids=[f"{f}:{n}" for f, n, _, _ in ALONE])
def test_example_runs_as_written(start_broker, file, line, lang, code):
    name = unique_name("doc")
    b = start_broker(name=name, config={"broker": {"name": name}})
    work = b.dir  # holds the zbroker.cfg that names the broker
    shutil.copytree(REPO_ROOT / "docs", work / "docs")
    run_example(work, example_env(work, name), file, line, lang, code)


def on_free_ports(config: Any, data: Path) -> Any:
    """``config`` with the port of every ``tcp://127.0.0.1:PORT`` (its queues' default
    endpoints included) moved to a free one, the same port to the same free one, and each
    queue's data in ``data``."""
    ports: dict[str, int] = {}

    def move(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: move(v) for k, v in value.items()}
        if isinstance(value, list):
            return [move(v) for v in value]
        if isinstance(value, str):
            return re.sub(r"(?<=^tcp://127\.0\.0\.1:)\d{4,5}$",
                          lambda m: str(ports.setdefault(m.group(), free_port())), value)
        return value

    config = move(config)
    for queue, settings in (config.get("services", {}).get("pzq", {}).get("queues") or {}
                            ).items():
        settings = config["services"]["pzq"]["queues"][queue] = dict(settings or {})
        settings["data_dir"] = str(data / queue)
        for key in ("receive_endpoint", "send_endpoint", "stream_endpoint"):
            settings.setdefault(key, move(DEFAULT_QUEUE_ENDPOINTS[key]))
    return config


DEFAULT_QUEUE_ENDPOINTS = {"receive_endpoint": "tcp://127.0.0.1:11131",
                           "send_endpoint": "tcp://127.0.0.1:11132",
                           "stream_endpoint": "tcp://127.0.0.1:11133"}


@pytest.mark.parametrize("file", sorted(CONFIGS))
def test_examples_of_a_doc_run_in_order_against_its_config(start_broker, tmp_path, file):
    name = unique_name("doc")
    config = yaml.safe_load((REPO_ROOT / CONFIGS[file]).read_text(encoding="utf-8"))
    config = on_free_ports(config, tmp_path / "data")
    config.setdefault("broker", {})["name"] = name
    b = start_broker(name=name, config=config)
    work = b.dir  # holds the zbroker.cfg that names the broker
    env = example_env(work, name)
    ran = 0
    for example_file, line, lang, code in EXAMPLES:
        if example_file == file:
            run_example(work, env, example_file, line, lang, code)
            ran += 1
    assert ran >= 1
    assert b.stop() == 0
