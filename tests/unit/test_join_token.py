"""Join tokens (zbroker/cluster/join_token.py) and what a joining host does with one
(zbroker/cluster/joining.py): the codec's round trip and its refusals, each one line that says
what is wrong; reading a token from a file or standard input; installing its key (0600, never
over a named key file that holds another); the seed a member writes into its join file."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import stat
from pathlib import Path

import pytest
import zmq

from zbroker.cli import advertise_endpoint
from zbroker.cluster import joining
from zbroker.cluster.join_token import JoinToken, JoinTokenError, decode, encode
from zbroker.cluster.security import generate_key_file, load_key_file


def token(**changes) -> JoinToken:
    public, secret = zmq.curve_keypair()
    fields = {"cluster": "default", "seeds": ("tcp://10.77.0.1:5670",), "public": public,
              "secret": secret, **changes}
    return JoinToken(**fields)


def raw(fields: dict, version: int = 1) -> str:
    """A token of ``fields`` as they are, valid or not (encode refuses invalid ones)."""
    body = json.dumps(fields).encode()
    text = base64.urlsafe_b64encode(body).decode().rstrip("=")
    return f"zbjoin{version}.{text}.{hashlib.sha256(body).hexdigest()[:8]}"


def refusal(text: str) -> str:
    with pytest.raises(JoinTokenError) as info:
        decode(text)
    message = str(info.value)
    assert "\n" not in message and message
    return message


def test_round_trip():
    t = token(cluster="prod-1.eu", seeds=("tcp://10.0.0.7:5670", "tcp://[fd00::7]:5671"))
    text = encode(t)
    assert text.startswith("zbjoin1.") and len(text) < 400 and text.isascii()
    assert decode(text) == t
    assert decode(f"  {text}\n") == t  # as pasted or read from a file


@pytest.mark.parametrize("text,words", [
    ("", "empty"),
    ("   \n", "empty"),
    ("hello", "not a zbroker join token"),
    ("SWMTKN-1-abc", "not a zbroker join token"),
    ("x" * 5000, "longer than"),
])
def test_what_is_no_token_at_all_is_said_so(text, words):
    assert words in refusal(text)


def test_a_token_of_another_version_is_named_by_its_version():
    t = token()
    fields = {"cluster": t.cluster, "seeds": list(t.seeds), "public": t.public.decode(),
              "secret": t.secret.decode()}
    message = refusal(raw(fields, version=2))
    assert "version 2" in message and "reads version 1" in message
    assert "version 7" in refusal("zbjoin7.whatever")


def test_a_garbled_token_is_said_to_be_garbled():
    text = encode(token())
    head, body, check = text.split(".")
    cut = text[: len(text) - 20]
    changed = f"{head}.{body[:30]}{'A' if body[30] != 'A' else 'B'}{body[31:]}.{check}"
    for bad in (cut, changed, text + "x", f"{head}.{body}", f"{head}.{body}.{check[:-1]}",
                text.replace(".", " ", 1), f"{head}.{body}!.{check}"):
        message = refusal(bad)
        assert "garbled" in message or "not a zbroker join token" in message, (bad, message)
    assert "check does not match" in refusal(changed)


@pytest.mark.parametrize("missing", ["cluster", "seeds", "public", "secret"])
def test_a_token_without_a_field_names_it(missing):
    t = token()
    fields = {"cluster": t.cluster, "seeds": list(t.seeds), "public": t.public.decode(),
              "secret": t.secret.decode()}
    del fields[missing]
    assert refusal(raw(fields)) == f"the join token lacks {missing}"


def test_fields_of_the_wrong_kind_are_refused():
    t = token()
    good = {"cluster": t.cluster, "seeds": list(t.seeds), "public": t.public.decode(),
            "secret": t.secret.decode()}
    other = zmq.curve_keypair()
    cases = [
        ({**good, "seeds": []}, "names no seed"),
        ({**good, "seeds": "tcp://10.0.0.1:5670"}, "not a list"),
        ({**good, "seeds": [5670]}, "not a list"),
        ({**good, "seeds": ["tcp://*:5670"]}, "not tcp://HOST:PORT"),
        ({**good, "seeds": ["ipc://@/x"]}, "not a tcp:// endpoint"),
        ({**good, "seeds": ["tcp://10.0.0.1:99999"]}, "not tcp://HOST:PORT"),
        ({**good, "seeds": [f"tcp://10.0.0.{i}:5670" for i in range(17)]}, "more than 16"),
        ({**good, "cluster": ""}, "cluster name"),
        ({**good, "cluster": "a b"}, "cluster name"),
        ({**good, "cluster": 3}, "not all text"),
        ({**good, "public": "short"}, "40 Z85 characters"),
        ({**good, "public": other[0].decode()}, "does not match"),
        ({**good, "secret": "!" * 40}, "secret key"),
    ]
    for fields, words in cases:
        message = refusal(raw(fields))
        assert words in message, (fields, message)
    assert "no fields" in refusal(raw([1, 2]))  # type: ignore[arg-type]


def test_encode_refuses_what_decode_would():
    with pytest.raises(JoinTokenError):
        encode(token(seeds=()))
    with pytest.raises(JoinTokenError):
        encode(token(cluster="no/slash"))


# --- reading a token ----------------------------------------------------------------------


def test_a_token_is_read_from_a_file_with_comments_or_from_standard_input(tmp_path):
    t = token()
    path = tmp_path / "cluster-default.join"
    path.write_text(joining.join_file_text(t))
    assert path.read_text().startswith("# zbroker join token")
    assert joining.read_token(file=str(path)) == t
    assert joining.read_token("-", stdin=io.StringIO(encode(t) + "\n")) == t
    assert joining.read_token(encode(t)) == t


def test_standard_input_is_read_up_to_the_token_line():
    """(a terminal need not end its input: the line of the token is enough)"""
    t = token()
    stdin = io.StringIO(f"# pasted\n\n{encode(t)}\nwhat follows is not read\n")
    assert joining.read_token("-", stdin=stdin) == t
    assert stdin.read() == "what follows is not read\n"


def test_the_join_file_is_named_after_the_key_file_beside_it(tmp_path):
    assert joining.join_file_path(tmp_path / "cluster-default.key") == (
        tmp_path / "cluster-default.join")
    assert joining.join_file_path("/etc/zbroker/prod.key") == Path("/etc/zbroker/prod.join")
    assert joining.join_file_path("/k/key.join") == Path("/k/key.join.join")


def test_reading_a_bad_token_says_where_it_came_from(tmp_path):
    with pytest.raises(JoinTokenError, match="cannot read the join file /nonexistent/x: No such"):
        joining.read_token(file="/nonexistent/x")
    path = tmp_path / "j"
    path.write_text("zbjoin1.abc.12345678\n")
    with pytest.raises(JoinTokenError, match=f"^the join file {path}: the join token is garbled"):
        joining.read_token(file=str(path))
    path.write_text(f"{encode(token())}\n{encode(token())}\n")
    with pytest.raises(JoinTokenError, match="more than one line"):
        joining.read_token(file=str(path))
    with pytest.raises(JoinTokenError, match="^standard input: the join token is empty"):
        joining.read_token("-", stdin=io.StringIO(""))


def test_a_join_file_that_is_not_a_regular_file_is_refused_at_once(tmp_path):
    """A FIFO held the broker's start for ever (reading it waits for a writer)."""
    fifo = tmp_path / "cluster.join"
    os.mkfifo(fifo)
    with pytest.raises(JoinTokenError, match="is not a regular file"):
        joining.read_token(file=str(fifo))  # (a blocking open would hang here)
    with pytest.raises(JoinTokenError, match="is not a regular file"):
        joining.read_token(file=str(tmp_path))  # a directory


# --- installing its key -------------------------------------------------------------------


@pytest.fixture
def config_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    return tmp_path / "config" / "zbroker"


def test_the_key_is_installed_private_kept_or_replaced_with_the_old_one_aside(config_home):
    t = token()
    path, done = joining.install_key(t, None)
    assert (path, done) == (config_home / "cluster-default.key", "installed")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(config_home.stat().st_mode) == 0o700
    assert load_key_file(path) == (t.public, t.secret)
    assert joining.install_key(t, None) == (path, "kept")
    other = token()
    assert joining.install_key(other, None) == (path, "replaced")
    assert load_key_file(path) == (other.public, other.secret)
    assert load_key_file(f"{path}.old") == (t.public, t.secret)


def test_a_named_key_file_with_another_key_is_not_overwritten(tmp_path, config_home):
    named = tmp_path / "mine.key"
    generate_key_file(named)
    before = named.read_bytes()
    with pytest.raises(Exception, match="holds another key than the join token's"):
        joining.install_key(token(), str(named))
    assert named.read_bytes() == before
    fresh = tmp_path / "fresh.key"
    t = token()
    assert joining.install_key(t, str(fresh)) == (fresh, "installed")
    assert load_key_file(fresh) == (t.public, t.secret)


def test_the_join_file_is_written_private(tmp_path):
    path = tmp_path / "d" / "cluster-x.join"
    joining.write_private(path, "secret\n")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    joining.write_private(path, "again\n")
    assert path.read_text() == "again\n" and [p.name for p in path.parent.iterdir()] == [
        "cluster-x.join"]


# --- the seed a member names --------------------------------------------------------------


def test_the_seed_is_the_advertised_endpoint_or_an_address_of_this_host():
    assert joining.seed_endpoint("tcp://10.1.2.3:5670", "tcp://0.0.0.0:5670") == (
        "tcp://10.1.2.3:5670", False)
    assert joining.seed_endpoint("tcp://127.0.0.1:5670", "tcp://127.0.0.1:5670") == (
        "tcp://127.0.0.1:5670", True)
    seed, loopback = joining.seed_endpoint("tcp://*:5671", "tcp://0.0.0.0:5671")
    assert seed.endswith(":5671") and "*" not in seed and "0.0.0.0" not in seed
    host = seed[len("tcp://"):].rpartition(":")[0]
    assert loopback == host.startswith("127.")


def test_a_join_file_names_this_broker_first_then_the_seeds_it_was_given():
    assert joining.usable_seeds(["tcp://10.0.0.2:5670", "tcp://10.0.0.1:5670", "ipc://@/x",
                                 "tcp://*:5670", "tcp://10.0.0.2:5670"]) == (
        "tcp://10.0.0.2:5670", "tcp://10.0.0.1:5670")
    assert len(joining.usable_seeds(f"tcp://10.0.1.{i}:5670" for i in range(40))) == 16


@pytest.mark.parametrize("text,endpoint", [
    ("10.0.0.5", "tcp://10.0.0.5:5670"),
    ("10.0.0.5:6000", "tcp://10.0.0.5:6000"),
    ("tcp://host.example:6000", "tcp://host.example:6000"),
    ("fd00::5", "tcp://[fd00::5]:5670"),
    ("[fd00::5]:6000", "tcp://[fd00::5]:6000"),
])
def test_advertise_takes_a_host_with_or_without_a_port(text, endpoint):
    assert advertise_endpoint(text, "tcp://*:5670") == endpoint


@pytest.mark.parametrize("text", ["", "*", "tcp://*:5670", "ipc://x", "10.0.0.5:", "h:0",
                                  "h:port", "a b", "[fd00::5]x"])
def test_advertise_refuses_what_is_no_address(text):
    with pytest.raises(ValueError, match="--advertise: not an address"):
        advertise_endpoint(text, "tcp://*:5670")
