"""CURVE for the cluster link: one key pair shared by the brokers of a cluster.

Every broker's peer socket is a CURVE server with the cluster's secret key, and every link to a
peer is a CURVE client with the same key pair, so traffic is encrypted and only holders of the
key can connect. Our own ZAP handler admits exactly the cluster's public key, and a monitor on
the peer socket logs connections that fail the handshake (e.g. a broker without the key).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
import zmq
from zmq.utils import z85

from zbroker.runtime.zmq_reader import SocketReader

ZAP_ENDPOINT = "inproc://zeromq.zap.01"


class KeyFileError(Exception):
    """A cluster key file that cannot be used; the message says why."""


def generate_key_file(path: str | os.PathLike[str]) -> str:
    """Write a new cluster key pair to ``path`` (mode 0600); returns the public key."""
    public, secret = zmq.curve_keypair()
    write_key_file(path, public, secret)
    return public.decode()


def write_key_file(path: str | os.PathLike[str], public: bytes, secret: bytes) -> None:
    """Write a cluster key pair to ``path``, which must not exist (mode 0600)."""
    fd = os.open(Path(path), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("# zbroker cluster key pair: copy this file to every broker of the cluster\n")
        yaml.safe_dump({"public": public.decode(), "secret": secret.decode()}, f)


def cluster_keys(cfg: Any) -> tuple[tuple[bytes, bytes] | None, Path | None, bool]:
    """The key pair a cluster config (cluster.*) asks for: ((public, secret), its file,
    whether the file was made now), or (None, None, False) for a cluster without a key
    (cluster.insecure and no key_file). The default file is made on first use; KeyFileError
    if a key cannot be had."""
    if not cfg.key_file and cfg.insecure:
        return None, None, False
    if cfg.key_file:
        path = Path(cfg.key_file)
        return load_key_file(path), path, False
    path = default_key_path(cfg.name)
    keys, made = load_or_create_key_file(path)
    return keys, path, made


def default_key_path(cluster: str) -> Path:
    """Where a broker keeps the key of cluster ``cluster`` when cluster.key_file is not set:
    in the user's config directory, so that every broker of this user on this host shares it."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "zbroker" / f"cluster-{cluster}.key"


def load_or_create_key_file(path: Path) -> tuple[tuple[bytes, bytes], bool]:
    """The key pair in ``path``, made there first if there is none: ((public, secret),
    whether it was made now). The file appears whole or not at all (written aside, then
    linked), so brokers starting together all end up with the same key."""
    if not path.exists():
        try:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            aside = path.with_name(f".{path.name}.{os.getpid()}")
            aside.unlink(missing_ok=True)
            generate_key_file(aside)
            try:
                os.link(aside, path)
                return load_key_file(path), True
            except FileExistsError:
                pass  # another broker made it first: that one is the key
            finally:
                aside.unlink(missing_ok=True)
        except OSError as exc:
            raise KeyFileError(f"cannot make the cluster key file {path}: "
                               f"{exc.strerror or exc} (set cluster.key_file, see 'zbroker "
                               f"keygen')") from None
    return load_key_file(path), False


def load_key_file(path: str | os.PathLike[str]) -> tuple[bytes, bytes]:
    """(public, secret) Z85 keys from a key file; KeyFileError with a clear reason otherwise."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise KeyFileError(f"cannot read cluster key file {path}: {exc}") from None
    if not isinstance(data, dict) or not all(isinstance(data.get(k), str)
                                             for k in ("public", "secret")):
        raise KeyFileError(f"cluster key file {path}: expected 'public' and 'secret' keys")
    public, secret = data["public"].encode(), data["secret"].encode()
    if len(public) != 40 or len(secret) != 40:
        raise KeyFileError(f"cluster key file {path}: keys must be 40 Z85 characters")
    try:
        derived = zmq.curve_public(secret)
    except zmq.ZMQError as exc:
        raise KeyFileError(f"cluster key file {path}: bad secret key ({exc})") from None
    if derived != public:
        raise KeyFileError(f"cluster key file {path}: the public key does not match the secret")
    return public, secret


class Guard:
    """The ZAP handler for one broker's peer socket: only the cluster's key is admitted (the
    handshakes that fail are watched by the cluster node, which names their peers)."""

    def __init__(self, ctx: zmq.Context, loop: Any, log: Any, public: bytes) -> None:
        self.public = public
        self._loop, self._log = loop, log
        self._zap = ctx.socket(zmq.ROUTER)
        self._zap.setsockopt(zmq.LINGER, 0)
        self._zap.bind(ZAP_ENDPOINT)
        self._readers = [SocketReader(loop, self._zap, self._on_zap)]
        self._readers[0].start()
        self.refused = 0
        #: called with the address of each client refused (else each is logged)
        self.on_refused: Callable[[str], None] | None = None

    def close(self) -> None:
        try:  # at once, so that a new guard can bind it (closing lets it go later)
            self._zap.unbind(ZAP_ENDPOINT)
        except zmq.ZMQError:
            pass
        for reader in self._readers:
            reader.stop()
            reader.sock.close(linger=0)
        self._readers.clear()

    def _on_zap(self, frames: list[bytes]) -> None:
        # [routing id, "", version, request id, domain, address, identity, mechanism, creds]
        if len(frames) < 8:
            return
        rid, _, version, request_id, _domain, address, _identity, mechanism = frames[:8]
        client_key = frames[8] if len(frames) > 8 else b""
        ok = mechanism == b"CURVE" and z85.encode(client_key) == self.public
        if not ok and self.on_refused is not None:
            self.refused += 1
            self.on_refused(address.decode(errors="replace"))
        elif not ok:
            self.refused += 1
            self._log.warning("cluster connection refused", address=address.decode(),
                              mechanism=mechanism.decode(), reason="not the cluster key")
        self._zap.send_multipart([rid, b"", version, request_id,
                                  b"200" if ok else b"400",
                                  b"OK" if ok else b"not the cluster key", b"", b""])
