"""Bad endpoints, paths and numbers on every command line: ``zbroker``, ``zbroker queue``,
``zpipes`` and ``pzq`` each answer with one line on standard error (after the usage, for a
usage error) and exit status 1 (a failure) or 2 (a usage error), never a Python traceback.
And the messages that name the right thing: the endpoint given, the path at fault, the
reason a writer timed out, the usage of the sub-command that was used.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from helpers import broker_env

WAIT = 30.0

# (command, arguments, exit status, words the last line of standard error must hold)
BAD = [
    ("zpipes", ["read", "x", "--endpoint", "bogus"], 1, ["'bogus'"]),
    ("zpipes", ["read", "x", "--endpoint", "tcp://host:notaport"], 1, ["tcp://host:notaport"]),
    ("zpipes", ["read", "x", "--endpoint", "tcp://127.0.0.1:1"], 1,
     ["no broker is running at tcp://127.0.0.1:1"]),
    ("zpipes", ["write", "x", "--endpoint", "ipc:///nonexistent/sock"], 1,
     ["ipc:///nonexistent/sock"]),
    ("zpipes", ["read", "x", "--timeout", "abc"], 2, ["zpipes read: error", "'abc'"]),
    ("zpipes", ["read", "x", "--timeout", "-1"], 2, ["zpipes read: error"]),
    ("zpipes", ["read", "x", "--broker", ""], 2, ["zpipes read: error"]),
    ("zpipes", ["read", "x", "--bogus"], 2, ["zpipes read: error", "--bogus"]),
    ("zpipes", ["write", ""], 2, ["zpipes write: error", "pipe name"]),
    ("pzq", ["--receive-dsn", "bogus"], 1, ["bogus"]),
    ("pzq", ["--send-dsn", "tcp://127.0.0.1:notaport"], 1, ["tcp://127.0.0.1:notaport"]),
    ("pzq", ["--monitor-dsn", "bogus"], 1, ["monitor", "bogus"]),
    ("pzq", ["--segment-size", "lots"], 2, ["--segment-size", "'lots'"]),
    ("pzq", ["--replicas", "abc"], 2, ["--replicas"]),
    ("pzq", ["--ack-timeout", "-5"], 2, ["--ack-timeout"]),
    ("pzq", ["--database", "/proc"], 1, ["/proc/lock"]),
    ("pzq", ["--database", "/etc/passwd"], 1, ["/etc/passwd", "not a directory"]),
    ("zbroker", ["--config", "/nonexistent.cfg"], 1, ["/nonexistent.cfg"]),
    ("zbroker", ["--config", "/etc"], 1, ["'/etc'", "Is a directory"]),
    ("zbroker", ["--config", "/etc/passwd"], 1, ["/etc/passwd", "characters)"]),
    ("zbroker", ["--log-level", "loud"], 2, ["--log-level"]),
    ("zbroker", ["status", "--config", "/nonexistent.cfg"], 1, ["/nonexistent.cfg"]),
    ("zbroker", ["status", "--run-dir", "/nonexistent"], 1, ["/nonexistent"]),
    ("zbroker", ["logs", "-n", "abc"], 2, ["zbroker logs: error"]),
    ("zbroker", ["stop", "--wait", "abc"], 2, ["zbroker stop: error"]),
    ("zbroker", ["set", "log.level", "debug", "--run-dir", "/nonexistent"], 1, ["/nonexistent"]),
    ("zbroker", ["check-config", "/etc"], 1, ["'/etc'"]),
    ("zbroker", ["keygen", "/nonexistent/dir/key"], 1, ["/nonexistent/dir/key"]),
    ("zbroker", ["keygen", "/etc/passwd"], 1, ["/etc/passwd", "exists"]),
    ("zbroker", ["queue"], 2, ["put|get"]),
    ("zbroker", ["queue", "put", "jobs", "--receive", "bogus"], 1, ["endpoint 'bogus'"]),
    ("zbroker", ["queue", "get", "jobs", "--send", "bogus"], 1, ["endpoint 'bogus'"]),
    ("zbroker", ["queue", "get", "jobs", "--stream", "bogus"], 1, ["endpoint 'bogus'"]),
    ("zbroker", ["queue", "get", "jobs", "--send", "tcp://a:b"], 1, ["'tcp://a:b'"]),
    ("zbroker", ["queue", "get", "jobs", "--count", "abc"], 2, ["zbroker queue get: error"]),
    ("zbroker", ["queue", "get", "jobs", "--timeout", "abc"], 2, ["zbroker queue get: error"]),
    ("zbroker", ["queue", "get", "jobs", "--from-offset", "-3"], 2, ["--from-offset"]),
    ("zbroker", ["queue", "get", "jobs", "--group", "a/b"], 2, ["--group", "'a/b'"]),
    ("zbroker", ["queue", "group", "delete", "events", ""], 2, ["bad group name ''"]),
    ("zbroker", ["queue", "group", "drop", "events"], 2, ["zbroker queue group: error"]),
    ("zbroker", ["queue", "group", "list", "events", "--stream", "bogus"], 1,
     ["endpoint 'bogus'"]),
    ("zbroker", ["queue", "put", "jobs", "--file", "/nonexistent", "--receive",
                 "tcp://127.0.0.1:1"], 1, ["/nonexistent"]),
    ("zbroker", ["queue", "put", "jobs", "--file", "/etc", "--receive", "tcp://127.0.0.1:1"],
     1, ["'/etc'"]),
    ("zbroker", ["queue", "put", "jobs", "--config", "/nonexistent.cfg"], 1,
     ["/nonexistent.cfg"]),
]

MODULES = {"zpipes": "zpipes", "pzq": "zbroker.services.pzq", "zbroker": "zbroker"}


def run(command: str, args: list[str], cwd: Path, input: bytes = b""
        ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", MODULES[command], *args], cwd=cwd,
                          env=broker_env(cwd), input=input.decode(), capture_output=True,
                          text=True, timeout=WAIT)


@pytest.mark.parametrize("command,args,status,words", BAD,
                         ids=[" ".join([c, *a]) for c, a, _, _ in BAD])
def test_bad_input_is_one_line_never_a_traceback(tmp_path, command, args, status, words):
    if command == "pzq" and "--database" not in args:
        args = [*args, "--database", str(tmp_path / "db")]
    r = run(command, args, tmp_path)
    assert "Traceback" not in r.stderr, r.stderr
    assert r.returncode == status, r.stderr
    lines = r.stderr.splitlines()
    if status == 1:
        assert len(lines) == 1, r.stderr  # the reason, and nothing else
    else:
        assert lines[0].startswith("usage: "), r.stderr  # the usage, then the reason
    for word in words:
        assert word in lines[-1], r.stderr
    assert r.stdout == ""


def test_zbroker_queue_usage_shows_the_actions(tmp_path):
    r = run("zbroker", ["queue"], tmp_path)
    assert r.stderr.startswith("usage: zbroker queue put|get NAME"), r.stderr
    assert r.stderr.splitlines()[-1] == ("zbroker queue: error: the following arguments are "
                                         "required: put|get|group")


def test_a_usage_error_of_zpipes_read_shows_the_usage_of_zpipes_read(tmp_path):
    for args in (["read", "x", "--bogus"], ["read", ""], ["read", "x", "--timeout", "0"]):
        r = run("zpipes", args, tmp_path)
        assert r.returncode == 2
        assert r.stderr.startswith("usage: zpipes read "), r.stderr
        assert r.stderr.splitlines()[-1].startswith("zpipes read: error: "), r.stderr


def test_pzq_names_the_path_and_the_real_problem(tmp_path):
    r = run("pzq", ["--database", "/proc"], tmp_path)
    assert "No such file or directory" not in r.stderr  # /proc exists
    assert "cannot create /proc/lock" in r.stderr
    r = run("pzq", ["--database", "/etc/passwd"], tmp_path)
    assert "File exists" not in r.stderr
    assert "/etc/passwd exists and is not a directory" in r.stderr


def test_a_write_nobody_reads_says_no_reader_attached(broker, tmp_path):
    r = run("zpipes", ["write", "t", "--broker", broker.name, "--timeout", "1"], tmp_path,
            input=b"hello\n")
    assert r.returncode == 1
    assert r.stderr == "zpipes: no reader attached to pipe 't' within 1 s\n"


def test_an_endpoint_given_is_named_not_the_default_broker(tmp_path):
    r = run("zpipes", ["read", "x", "--endpoint", "tcp://127.0.0.1:1"], tmp_path)
    assert r.returncode == 1
    assert "'local'" not in r.stderr
    assert r.stderr == ("zpipes: no broker is running at tcp://127.0.0.1:1 (nothing listens "
                        "there)\n")


def test_a_bad_join_token_is_one_line_and_exit_status_2(tmp_path):
    """Whatever is wrong with a join token (none at all, garbled, another version, a field
    missing, a file that cannot be read), the broker does not start: one line, status 2."""
    import base64
    import json

    body = json.dumps({"cluster": "default", "seeds": ["tcp://10.0.0.1:5670"]}).encode()
    import hashlib

    lacking = (f"zbjoin1.{base64.urlsafe_b64encode(body).decode().rstrip('=')}."
               f"{hashlib.sha256(body).hexdigest()[:8]}")
    (tmp_path / "empty.join").write_text("")
    cases = [
        (["--join-file", str(tmp_path / "none.join")], b"", "cannot read the join file"),
        (["--join-file", str(tmp_path / "empty.join")], b"", "the join token is empty"),
        (["--join", "-"], b"hello\n", "standard input: not a zbroker join token"),
        (["--join", "-"], b"zbjoin1.eyJjbHVzdGVy.0123abcd\n", "garbled"),
        (["--join", "zbjoin2.eyJjbHVzdGVy.0123abcd"], b"", "version 2"),
        (["--join", lacking], b"", "the join token lacks public, secret"),
    ]
    for args, stdin, words in cases:
        r = run("zbroker", ["local", *args], tmp_path, input=stdin)
        assert "Traceback" not in r.stderr, r.stderr
        assert r.returncode == 2, (args, r.stderr)
        assert r.stderr.count("\n") == 1 and r.stderr.startswith("zbroker: "), r.stderr
        assert words in r.stderr, (args, r.stderr)
        assert r.stdout == ""
    assert not (tmp_path / "config").exists()  # no key was installed anywhere
    r = run("zbroker", ["local", "--join", "-", "--join-file", "x"], tmp_path)
    assert r.returncode == 2 and "not allowed with argument" in r.stderr
    r = run("zbroker", ["local", "--cluster", "--advertise", "tcp://*:5670"], tmp_path)
    assert (r.returncode, r.stderr) == (2, "zbroker: --advertise: not an address: "
                                           "'tcp://*:5670' (HOST, HOST:PORT or "
                                           "tcp://HOST:PORT)\n")


def test_a_join_token_never_overwrites_a_named_key_file_with_another_key(tmp_path):
    """A good token, but cluster.key_file names a file with another key: refused before the
    broker starts (so nothing is announced on the network here), the file untouched."""
    import zmq

    from zbroker.cluster.join_token import JoinToken, encode
    from zbroker.cluster.security import generate_key_file

    key = tmp_path / "mine.key"
    generate_key_file(key)
    before = key.read_bytes()
    (tmp_path / "zbroker.cfg").write_text(f"cluster: {{key_file: {key}}}\n")
    public, secret = zmq.curve_keypair()
    (tmp_path / "c.join").write_text(encode(JoinToken("default", ("tcp://10.0.0.1:5670",),
                                                      public, secret)) + "\n")
    r = run("zbroker", ["local", "--join-file", "c.join"], tmp_path)
    assert r.returncode == 1, r.stderr
    assert r.stderr == (f"zbroker: cluster.key_file {key} holds another key than the join "
                        "token's: remove that setting (the token's key then goes to "
                        f"{tmp_path}/config/zbroker/cluster-default.key) or that file\n")
    assert key.read_bytes() == before
