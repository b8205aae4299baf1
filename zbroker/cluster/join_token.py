"""Join tokens: what another host needs to join a cluster, in one line of text (no I/O).

A token carries the cluster's name, one or a few seeds (the cluster endpoints of members to
say HELLO to first) and the cluster's CURVE key pair, so that one file copied to a new host
and one command there (``zbroker local --join-file FILE``) make it a member::

    zbjoin1.<base64url of the JSON fields>.<check>

``check`` is the first 8 hex digits of the SHA-256 of the JSON: a token cut short or with a
character changed on the way is said to be garbled, not read as another one. The number after
``zbjoin`` is the token's version: a token of another version is refused by name.

The token holds the cluster's secret key: whoever has it can join. It is kept in files of
mode 0600 and read from a file or standard input rather than the command line, where ``ps``
shows it to every user of the host.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from dataclasses import dataclass

import zmq

from zbroker.cluster.membership import endpoint_problem

VERSION = 1
PREFIX = "zbjoin"
MAX_TOKEN = 4096  # characters: a few seeds and two keys take a few hundred
MAX_SEEDS = 16
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_TOKEN = re.compile(r"zbjoin(\d{1,6})\.([A-Za-z0-9_-]*={0,2})\.([0-9a-f]{8})")


class JoinTokenError(ValueError):
    """A token that cannot be used; the message says why, in one line."""


@dataclass(frozen=True)
class JoinToken:
    cluster: str  # the cluster's name (cluster.name)
    seeds: tuple[str, ...]  # tcp://HOST:PORT of members, to say HELLO to
    public: bytes  # the cluster's CURVE key pair, Z85 (40 characters each)
    secret: bytes


def encode(token: JoinToken) -> str:
    """The one-line text of ``token`` (checked as decode checks it)."""
    _check(token)
    body = json.dumps({"cluster": token.cluster, "seeds": list(token.seeds),
                       "public": token.public.decode(), "secret": token.secret.decode()},
                      separators=(",", ":"), sort_keys=True).encode()
    text = base64.urlsafe_b64encode(body).decode().rstrip("=")
    return f"{PREFIX}{VERSION}.{text}.{_digest(body)}"


def decode(text: str) -> JoinToken:
    """The token in ``text`` (blanks around it are ignored); JoinTokenError saying what is
    wrong with it otherwise."""
    text = text.strip()
    if not text:
        raise JoinTokenError("the join token is empty")
    if len(text) > MAX_TOKEN:
        raise JoinTokenError(f"not a zbroker join token: longer than {MAX_TOKEN} characters")
    version = re.match(r"zbjoin(\d{1,6})\.", text)
    if version is None:
        raise JoinTokenError("not a zbroker join token (one starts with 'zbjoin1.'; "
                             "'zbroker join-token' on a member prints one)")
    if int(version.group(1)) != VERSION:
        raise JoinTokenError(f"a join token of version {int(version.group(1))}, and this "
                             f"zbroker reads version {VERSION}: make the token with a zbroker "
                             "of the same version")
    m = _TOKEN.fullmatch(text)
    if m is None:
        raise JoinTokenError("the join token is garbled (cut short, or changed on the way): "
                             "copy it again")
    try:
        body = base64.urlsafe_b64decode(m.group(2) + "=" * (-len(m.group(2)) % 4))
    except (binascii.Error, ValueError):
        raise JoinTokenError("the join token is garbled (not base64): copy it again") from None
    if _digest(body) != m.group(3):
        raise JoinTokenError("the join token is garbled (its check does not match): "
                             "copy it again")
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        raise JoinTokenError("the join token is garbled (not JSON): copy it again") from None
    if not isinstance(data, dict):
        raise JoinTokenError("the join token holds no fields")
    missing = [k for k in ("cluster", "seeds", "public", "secret") if k not in data]
    if missing:
        raise JoinTokenError(f"the join token lacks {', '.join(missing)}")
    seeds = data["seeds"]
    if not isinstance(seeds, list) or not all(isinstance(s, str) for s in seeds):
        raise JoinTokenError("the join token's seeds are not a list of endpoints")
    if not all(isinstance(data[k], str) for k in ("cluster", "public", "secret")):
        raise JoinTokenError("the join token's cluster, public and secret are not all text")
    token = JoinToken(data["cluster"], tuple(seeds), data["public"].encode(),
                      data["secret"].encode())
    _check(token)
    return token


def _digest(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()[:8]


def _check(token: JoinToken) -> None:
    if not _NAME.fullmatch(token.cluster):
        raise JoinTokenError(f"the join token's cluster name {token.cluster[:80]!r} is not a "
                             "name of 1 to 64 letters, digits, '.', '_' or '-'")
    if not token.seeds:
        raise JoinTokenError("the join token names no seed (no member to say HELLO to)")
    if len(token.seeds) > MAX_SEEDS:
        raise JoinTokenError(f"the join token names more than {MAX_SEEDS} seeds")
    for seed in token.seeds:
        problem = endpoint_problem(seed, "tcp")
        if problem is not None:
            raise JoinTokenError(f"the join token's seed {seed[:80]!r}: "
                                 + problem.replace("its endpoint", "endpoint"))
    if len(token.public) != 40 or len(token.secret) != 40:
        raise JoinTokenError("the join token's keys are not 40 Z85 characters each")
    try:
        derived = zmq.curve_public(token.secret)
    except (zmq.ZMQError, ValueError):
        raise JoinTokenError("the join token's secret key is not a Z85 key") from None
    if derived != token.public:
        raise JoinTokenError("the join token's public key does not match its secret key")
