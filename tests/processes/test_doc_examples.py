"""The examples of README.md and docs/ run as written, against a real broker.

A fenced code block whose info string is ``sh example`` or ``python example`` is a runnable
example (GitHub shows it as plain ``sh`` or ``python``); every other block is only shown.
Each example runs in a directory of its own that holds a ``zbroker.cfg`` naming a broker
started for it (so ``zbroker status`` finds it as an operator's would) and a copy of
``docs/``, with ``$ZPIPES_BROKER`` naming the same broker (so that ``zpipes`` and
``zpipes.open`` use it rather than ``local``): shell blocks in bash with the venv's commands
first on PATH, as after ``source .venv/bin/activate``, Python blocks with the venv's Python.
Every run has a timeout.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO_ROOT, broker_env, unique_name

TIMEOUT = 60.0  # seconds any one example may take
FENCE = re.compile(r"^```(?P<info>[^\n`]*)\n(?P<body>.*?)^```[ \t]*$", re.M | re.S)
RUNNERS = {"sh", "python"}

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


EXAMPLES = examples()


def test_there_are_examples_in_the_readme():
    assert sum(1 for file, *_ in EXAMPLES if file == "README.md") >= 4
    assert any(lang == "python" for _, _, lang, _ in EXAMPLES)


@pytest.mark.parametrize("file,line,lang,code", EXAMPLES,
                         ids=[f"{f}:{n}" for f, n, _, _ in EXAMPLES])
def test_example_runs_as_written(start_broker, file, line, lang, code):
    name = unique_name("doc")
    b = start_broker(name=name, config={"broker": {"name": name}})
    work = b.dir  # holds the zbroker.cfg that names the broker
    shutil.copytree(REPO_ROOT / "docs", work / "docs")
    env = broker_env(work)
    env["ZPIPES_BROKER"] = name
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
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
