"""The install carries what it needs: a wheel built from a copy of this tree, installed in a
fresh virtual environment (its dependencies from the package index, as a user's would be;
nothing of the repository on its path), runs the commands of the README and writes out the
operating files, man pages and completion (``zbroker init``)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml
from helpers import REPO_ROOT, free_port, unique_name, wait_for

pytestmark = pytest.mark.slow

SHARED = ("zbroker.cfg.example", "queues.cfg", "zbroker.service", "zbroker.logrotate",
          "zbroker.rsyslog.conf", "zbroker.grafana.json", "LICENSE")


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(the wheel, the venv's bin directory)."""
    base = tmp_path_factory.mktemp("install")
    src = base / "src"
    shutil.copytree(REPO_ROOT, src, symlinks=True, ignore=shutil.ignore_patterns(
        ".venv", ".git", "__pycache__", "*.egg-info", "build", "dist"))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run = dict(capture_output=True, text=True, env=env, timeout=600)
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w",
                        str(base / "dist"), str(src)], **run)
    assert r.returncode == 0, r.stderr
    (wheel,) = (base / "dist").glob("zbroker-*.whl")
    r = subprocess.run([sys.executable, "-m", "venv", str(base / "venv")], **run)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([str(base / "venv" / "bin" / "pip"), "install", "-q", str(wheel)], **run)
    assert r.returncode == 0, r.stderr
    return wheel, base / "venv" / "bin"


def user_env(home: Path, **extra: str) -> dict[str, str]:
    """A user's environment on a fresh machine: no path into this repository."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "ZPIPES_BROKER", "VIRTUAL_ENV")}
    env.update(HOME=str(home), XDG_RUNTIME_DIR=str(home / "run"),
               XDG_CONFIG_HOME=str(home / "config"), XDG_DATA_HOME=str(home / "data"), **extra)
    (home / "run").mkdir(parents=True, exist_ok=True)
    return env


def test_the_wheel_carries_the_license_and_the_operating_files(installed):
    wheel, _ = installed
    names = zipfile.ZipFile(wheel).namelist()
    assert any(re.fullmatch(r"zbroker-[^/]+\.dist-info/licenses/LICENSE", n) for n in names)
    for name in SHARED:
        assert f"zbroker/share/{name}" in names, name
    license_text = zipfile.ZipFile(wheel).read("zbroker/share/LICENSE").decode()
    assert license_text.startswith("Mozilla Public License Version 2.0")


def test_every_command_says_its_version_from_the_wheel(installed, tmp_path):
    _, bin_dir = installed
    for command in ("zbroker", "zpipes", "pzq"):
        r = subprocess.run([str(bin_dir / command), "--version"], capture_output=True,
                           text=True, env=user_env(tmp_path), cwd=tmp_path, timeout=60)
        assert r.returncode == 0 and re.fullmatch(rf"{command} \d+\.\d+\.\d+\n", r.stdout), r


def test_init_writes_the_operating_files_man_pages_and_completion(installed, tmp_path):
    _, bin_dir = installed
    env = user_env(tmp_path)
    target = tmp_path / "etc-zbroker"
    r = subprocess.run([str(bin_dir / "zbroker"), "init", str(target)], capture_output=True,
                       text=True, env=env, cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr
    written = {Path(line).relative_to(target).as_posix() for line in r.stdout.split()}
    assert {"zbroker.cfg", "queues.cfg", "zbroker.service", "zbroker.logrotate",
            "zbroker.rsyslog.conf", "zbroker.grafana.json", "LICENSE",
            "man/man1/zbroker.1", "man/man1/zpipes.1", "man/man1/pzq.1",
            "completion/bash/zbroker", "completion/zsh/zpipes"} <= written
    for cfg in ("zbroker.cfg", "queues.cfg"):  # as the broker's start would take them
        c = subprocess.run([str(bin_dir / "zbroker"), "check-config", str(target / cfg)],
                           capture_output=True, text=True, env=env, timeout=60)
        assert c.returncode == 0 and c.stdout.endswith(": OK\n"), c
    unit = (target / "zbroker.service").read_text()
    assert f"ExecStart={bin_dir / 'zbroker'} --config {target.resolve() / 'zbroker.cfg'}" \
        in unit
    if shutil.which("systemd-analyze"):
        v = subprocess.run(["systemd-analyze", "verify", str(target / "zbroker.service")],
                           capture_output=True, text=True, timeout=60)
        assert v.returncode == 0, v.stderr
    for command in ("zbroker", "zpipes", "pzq"):
        page = (target / "man" / "man1" / f"{command}.1").read_text()
        assert page.startswith(f'.TH {command.upper()} "1"'), page[:200]
        assert re.search(rf"^\.SH NAME\n{command} \\- \S", page, re.M), page[:300]
        b = subprocess.run(["bash", "-c", f"source {target / 'completion' / 'bash' / command}"
                                          f" && complete -p {command}"],
                           capture_output=True, text=True, timeout=60)
        assert b.returncode == 0 and command in b.stdout, b
    man = (target / "man" / "man1" / "zbroker.1").read_text()
    for sub in ("status", "queue", "init", "top"):  # the sub-commands, from their parsers
        assert f"zbroker {sub}" in man, sub
    again = subprocess.run([str(bin_dir / "zbroker"), "init", str(target)],
                           capture_output=True, text=True, env=env, timeout=120)
    assert again.returncode == 1 and "--force" in again.stderr, again
    forced = subprocess.run([str(bin_dir / "zbroker"), "init", str(target), "--force"],
                            capture_output=True, text=True, env=env, timeout=120)
    assert forced.returncode == 0, forced.stderr


def test_the_readme_flows_run_from_the_wheel(installed, tmp_path):
    """A broker with the queues of the examples, named pipes from the shell and from the
    client library, a queue's messages in and out, status, top, stop."""
    _, bin_dir = installed
    name = unique_name("wheel")
    env = user_env(tmp_path, ZPIPES_BROKER=name,
                   PATH=os.pathsep.join([str(bin_dir), os.environ.get("PATH", "")]))
    subprocess.run([str(bin_dir / "zbroker"), "init", str(tmp_path / "files")], check=True,
                   capture_output=True, env=env, timeout=120)
    # the queues' ports moved to free ones (tests run side by side), defaults included
    ports: dict[str, int] = {}
    text = re.sub(r"tcp://127\.0\.0\.1:(\d+)",
                  lambda m: f"tcp://127.0.0.1:{ports.setdefault(m[1], free_port())}",
                  (tmp_path / "files" / "queues.cfg").read_text())
    doc = yaml.safe_load(text)
    for queue, settings in doc["services"]["pzq"]["queues"].items():
        settings = doc["services"]["pzq"]["queues"][queue] = dict(settings or {})
        settings["data_dir"] = str(tmp_path / "data" / queue)
        for key in ("receive_endpoint", "send_endpoint", "stream_endpoint"):
            settings.setdefault(key, f"tcp://127.0.0.1:{free_port()}")
    (tmp_path / "zbroker.cfg").write_text(yaml.safe_dump(doc))
    broker = subprocess.Popen([str(bin_dir / "zbroker"), name, "--config",
                               str(tmp_path / "zbroker.cfg")], cwd=tmp_path, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        def sh(script: str) -> str:
            r = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", script], cwd=tmp_path,
                               env=env, capture_output=True, text=True, timeout=60)
            assert r.returncode == 0, (script, r.stdout, r.stderr)
            return r.stdout

        wait_for(lambda: subprocess.run([str(bin_dir / "zbroker"), "status", name],
                                        capture_output=True, env=env, cwd=tmp_path,
                                        timeout=30).returncode == 0, 30, "the broker")
        assert sh("zpipes read logs > got & printf 'ok\\nERROR disk full\\n' | "
                  "zpipes write logs; wait $!; grep ERROR got; rm got") == "ERROR disk full\n"
        script = ("import threading, zpipes\n"
                  "def produce():\n"
                  "    with zpipes.open('lib', 'w') as w:\n"
                  "        w.write(b'hello\\n')\n"
                  "t = threading.Thread(target=produce); t.start()\n"
                  "with zpipes.open('lib', 'r', timeout=10) as r:\n"
                  "    print(list(r))\n"
                  "t.join()\n")
        assert sh(f"python -c \"{script}\"") == "[b'hello\\n']\n"
        sh("printf 'a\\nb\\n' | zbroker queue put jobs")
        assert sh("zbroker queue get jobs -n 0 -t 1") == "a\nb\n"
        assert "ZPIPES: " in sh(f"zbroker top {name} --once")
        assert "pid" in sh(f"zbroker status {name}")
        sh(f"zbroker stop {name}")
        assert broker.wait(30) == 0
    finally:
        if broker.poll() is None:
            broker.send_signal(signal.SIGKILL)
            broker.wait()
