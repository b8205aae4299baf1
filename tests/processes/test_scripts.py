"""scripts/setup and scripts/test say what they do while they do it, and scripts/test lists the
slowest tests. Run on a copy of the scripts whose .venv holds stand-ins for python, pip and
ruff, mypy (which record how they were called): nothing is installed."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

from helpers import REPO_ROOT

STUB = """#!/bin/sh
echo "$(basename "$0") $*" >> "{log}"
"""


def make_tree(tmp_path: Path) -> tuple[Path, Path, dict[str, str]]:
    tree = tmp_path / "repo"
    shutil.copytree(REPO_ROOT / "scripts", tree / "scripts")
    shutil.copy(REPO_ROOT / "pyproject.toml", tree / "pyproject.toml")
    log = tmp_path / "calls.txt"
    bins = [tree / ".venv" / "bin", tmp_path / "system-bin"]
    for d in bins:
        d.mkdir(parents=True)
    # .venv's python, ruff and mypy; the system packages ensure-test-deps looks for
    for path in (bins[0] / "python", bins[0] / "ruff", bins[0] / "mypy", bins[1] / "rsyslogd",
                 bins[1] / "java", bins[1] / "ip", bins[1] / "prometheus", bins[1] / "tmux"):
        path.write_text(STUB.format(log=log))
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    env = dict(os.environ, PATH=os.pathsep.join([str(bins[1]), os.environ.get("PATH", "")]))
    return tree, log, env


def test_setup_prints_a_line_per_step(tmp_path):
    tree, log, env = make_tree(tmp_path)
    r = subprocess.run(["scripts/setup", "test"], cwd=tree, env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "setup: installing Python packages [test,spark] into .venv" in r.stderr
    assert "setup: Python packages installed" in r.stderr
    assert "python -m pip install --quiet -e .[test,spark]" in log.read_text()
    # the second time nothing is installed, and nothing is said
    again = subprocess.run(["scripts/setup", "test"], cwd=tree, env=env, capture_output=True,
                           text=True, timeout=60)
    assert again.returncode == 0 and again.stderr == ""


def test_test_script_says_its_steps_and_lists_the_slowest_tests(tmp_path):
    tree, log, env = make_tree(tmp_path)
    r = subprocess.run(["scripts/test", "tests/test_x.py"], cwd=tree, env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    for step in ("test: checking system packages", "test: ruff check", "test: mypy",
                 "test: running the tests"):
        assert step in r.stderr
    calls = log.read_text().splitlines()
    assert "ruff check ." in calls and "mypy " in calls
    # two workers, one test file per worker at a time
    assert calls[-1] == "python -m pytest -n 2 --dist loadfile --durations=15 tests/test_x.py"


def test_ci_runs_the_readme_test_command():
    ci = (REPO_ROOT / ".ci" / "run").read_text()
    assert [line for line in ci.splitlines() if line and not line.startswith(("#", "set ",
                                                                               "cd "))] \
        == ["scripts/test"]
    assert "\n    scripts/test\n" in (REPO_ROOT / "README.md").read_text()
