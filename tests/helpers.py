"""Running real broker processes in tests.

    b = spawn_broker(tmp_path, config={"log": {"level": "debug"}})
    b.wait_until_up()            # the ZPIPES endpoint accepts connections
    assert b.stop() == 0         # SIGTERM, then the exit status

Every broker gets a unique name (never "local"), runs with its own config file, its working
directory and XDG_RUNTIME_DIR in the test's temporary directory, and its standard error in a
file (``b.stderr()``). Every wait has a deadline. The ``start_broker`` and ``broker`` fixtures
(conftest.py) kill whatever is still running at teardown.
"""

from __future__ import annotations

import os
import random
import select
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_ENDPOINT = "ipc://@/zpipes/{name}"
UP_TIMEOUT = 10.0  # seconds for a broker to start listening
STOP_TIMEOUT = 10.0  # seconds for a broker to exit after a signal


def unique_name(prefix: str = "t") -> str:
    """A broker name no other test (or test run) uses."""
    return f"{prefix}{os.getpid()}-{uuid.uuid4().hex[:8]}"


def wait_for(predicate: Callable[[], Any], timeout: float, what: str,
             interval: float = 0.02) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


async def wait_for_async(predicate: Callable[[], Any], timeout: float, what: str,
                         interval: float = 0.005) -> Any:
    """:func:`wait_for` on an event loop: the loop runs on between the polls."""
    import asyncio

    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(interval)


def wait_steady(measure: Callable[[], int], timeout: float, what: str, tolerance: int = 0,
                interval: float = 0.2) -> int:
    """Poll ``measure`` until two readings ``interval`` apart differ by at most
    ``tolerance`` (a process's memory or descriptors once it has settled); the last one."""
    last: int | None = None

    def steady() -> bool:
        nonlocal last
        before, last = last, measure()
        return before is not None and abs(last - before) <= tolerance

    wait_for(steady, timeout, f"{what} to hold steady", interval=interval)
    assert last is not None
    return last


def assert_writer_lost(error: Exception) -> None:
    """A reader's error says its writer was lost: the stream was cut, not whole."""
    from zpipes import PipeFailed

    assert isinstance(error, PipeFailed), repr(error)  # not a timeout, not the connection
    assert error.reason.startswith("writer lost"), repr(error)
    assert "writer lost" in str(error), repr(error)


def through_a_pipe(broker: str, pipe: str, data: bytes, timeout: float = 10.0) -> bytes:
    """Write ``data`` into ``pipe`` of ``broker`` (the client library) while a thread reads
    it; returns what the reader got."""
    import threading

    import zpipes

    got: list[bytes] = []

    def read() -> None:
        with zpipes.open(pipe, "r", broker=broker, timeout=timeout) as r:
            got.append(r.read())

    reader = threading.Thread(target=read)
    reader.start()
    with zpipes.open(pipe, "w", broker=broker, timeout=timeout) as w:
        w.write(data)
    reader.join(timeout)
    return got[0] if got else b""


def cut(data: bytes, sizes: list[int]) -> list[bytes]:
    """``data`` in pieces of the given sizes, cycling; the last piece takes what is left."""
    pieces, pos, i = [], 0, 0
    while pos < len(data):
        pieces.append(data[pos : pos + sizes[i % len(sizes)]])
        pos += sizes[i % len(sizes)]
        i += 1
    return pieces


def read_within(fd: int, size: int, timeout: float) -> bytes:
    """``size`` bytes from ``fd`` (fewer at end of file); fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    got = b""
    while len(got) < size:
        left = deadline - time.monotonic()
        assert left > 0, f"got only {got!r} of {size} bytes within {timeout}s"
        if select.select([fd], [], [], left)[0]:
            piece = os.read(fd, size - len(got))
            if not piece:
                break
            got += piece
    return got


def socket_address(endpoint: str) -> tuple[int, Any]:
    """(address family, address) to reach a ZeroMQ ipc:// or tcp:// endpoint with a plain
    socket. ``ipc://@name`` is the abstract socket "\\0name"."""
    transport, _, address = endpoint.partition("://")
    if transport == "ipc":
        return socket.AF_UNIX, "\0" + address[1:] if address.startswith("@") else address
    if transport == "tcp":
        host, _, port = address.rpartition(":")
        host = "127.0.0.1" if host in ("*", "0.0.0.0", "") else host.strip("[]")
        return socket.AF_INET6 if ":" in host else socket.AF_INET, (host, int(port))
    raise ValueError(f"cannot probe endpoint {endpoint!r}")


def endpoint_accepts(endpoint: str) -> bool:
    """True if something listens on the endpoint (a plain connect succeeds)."""
    family, address = socket_address(endpoint)
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        try:
            s.connect(address)
        except OSError:
            return False
        return True


def rss_bytes(pid: int) -> int:
    """The resident memory of process ``pid``, from /proc."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def broker_env(tmp_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    env["XDG_RUNTIME_DIR"] = str(tmp_dir)
    env["XDG_CONFIG_HOME"] = str(tmp_dir / "config")  # a cluster key made there, not in ~
    env["XDG_STATE_HOME"] = str(tmp_dir / "state")  # and what it remembers of its cluster
    env.pop("NO_COLOR", None)
    env.pop("ZPIPES_BROKER", None)  # the tests name their brokers
    env.pop("ZPIPES_PROGRESS", None)
    return env


@dataclass
class BrokerProcess:
    name: str
    endpoint: str
    proc: subprocess.Popen[bytes]
    dir: Path  # working directory, XDG_RUNTIME_DIR, config and stderr files
    config_path: Path | None
    stderr_path: Path
    _stderr_file: Any = field(default=None, repr=False)

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def run_dir(self) -> Path:
        """The default run directory (given XDG_RUNTIME_DIR as set by broker_env)."""
        return self.dir / "zbroker" / self.name

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stderr(self) -> str:
        return self.stderr_path.read_text(encoding="utf-8", errors="replace")

    def wait_until_up(self, timeout: float = UP_TIMEOUT) -> BrokerProcess:
        """Wait until the endpoint accepts connections; fail early if the broker exits."""
        def up() -> bool:
            if not self.alive():
                raise AssertionError(f"broker {self.name} exited with status "
                                     f"{self.proc.returncode} before it was up:\n{self.stderr()}")
            return endpoint_accepts(self.endpoint)

        wait_for(up, timeout, f"broker {self.name} to listen on {self.endpoint}")
        return self

    def send_signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def wait(self, timeout: float = STOP_TIMEOUT) -> int:
        """The exit status; fails (after killing it) if the broker runs on past ``timeout``."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"broker {self.name} still running after {timeout}s; "
                                 f"killed. stderr:\n{self.stderr()}") from None
        finally:
            if self.proc.returncode is not None:
                self._close()

    def stop(self, signum: int = signal.SIGTERM, timeout: float = STOP_TIMEOUT) -> int:
        """Send ``signum`` and return the exit status."""
        if self.alive():
            self.send_signal(signum)
        return self.wait(timeout)

    def kill(self) -> None:
        """SIGKILL if still running (teardown)."""
        if self.alive():
            self.proc.kill()
            self.proc.wait(STOP_TIMEOUT)
        self._close()

    def _close(self) -> None:
        if self._stderr_file is not None:
            self._stderr_file.close()
            self._stderr_file = None


def write_config(path: Path, config: dict[str, Any] | str) -> Path:
    """Write a config dict as YAML (a str is written as is)."""
    text = config if isinstance(config, str) else yaml.safe_dump(config, sort_keys=False)
    path.write_text(text, encoding="utf-8")
    return path


def spawn_broker(tmp_dir: Path, name: str | None = None,
                 config: dict[str, Any] | str | None = None,
                 args: Sequence[str] = ()) -> BrokerProcess:
    """Start ``python -m zbroker NAME --config FILE *args`` (not waiting for it).

    ``config``: a dict (written as YAML), a str (written as is), or None (an empty file: the
    embedded defaults; the broker never reads a config of the machine it runs on).
    """
    name = name or unique_name()
    bdir = tmp_dir / f"broker-{name}"
    bdir.mkdir(parents=True, exist_ok=True)
    config_path = write_config(bdir / "zbroker.cfg", config if config is not None else "")
    stderr_path = bdir / "stderr.txt"
    stderr_file = open(stderr_path, "wb")  # a file, never a pipe that could fill up
    proc = subprocess.Popen(
        [sys.executable, "-m", "zbroker", name, "--config", str(config_path), *args],
        cwd=bdir, env=broker_env(bdir), stdin=subprocess.DEVNULL,
        stdout=stderr_file, stderr=stderr_file,
    )
    return BrokerProcess(name=name, endpoint=_endpoint(config, name), proc=proc, dir=bdir,
                         config_path=config_path, stderr_path=stderr_path,
                         _stderr_file=stderr_file)


def _endpoint(config: Any, name: str) -> str:
    template = DEFAULT_ENDPOINT
    if isinstance(config, dict):
        zpipes = (config.get("services") or {}).get("zpipes") or {}
        if isinstance(zpipes, dict) and isinstance(zpipes.get("endpoint"), str):
            template = zpipes["endpoint"]
    return template.replace("{name}", name)


def run_zbroker(args: Sequence[str], cwd: Path, timeout: float = 30.0
                ) -> subprocess.CompletedProcess[str]:
    """Run a zbroker command that exits by itself (``--help``, ``check-config``, a failing
    start) and return its result."""
    return subprocess.run([sys.executable, "-m", "zbroker", *args], cwd=cwd,
                          env=broker_env(cwd), capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def zpipes_connections(b: BrokerProcess) -> int:
    """How many connections the broker's ZPIPES endpoint has (``zbroker status``); 0 while
    it does not answer."""
    import json

    r = run_zbroker(["status", b.name, "--json"], cwd=b.dir)
    return json.loads(r.stdout)["services"]["zpipes"]["connections"] if r.returncode == 0 else 0


_HANDED_OUT: dict[int, None] = {}  # ports free_port gave lately, oldest first
_HANDED_OUT_REMEMBERED = 1000


def free_port(kind: int = socket.SOCK_STREAM) -> int:
    """A loopback port free now, below the kernel's ephemeral range: a port the kernel hands
    out itself (bind to 0) can be taken meanwhile by an outgoing connection's local port,
    and the queue's bind then fails with "Address already in use". A port given lately is
    not given again: a test that takes several before it starts what binds them must get
    different ones."""
    low = 20000
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            high = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        high = 32768
    high = max(low + 1000, high)
    # The suite runs on several workers at once: each takes its ports from its own share of
    # the range, so two workers never pick the same port in the moment before it is bound.
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:]
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    if worker.isdigit() and workers > 1:
        share = (high - low) // workers
        low += int(worker) % workers * share
        high = low + share
    for _ in range(200):
        port = random.randrange(low, high)
        if port in _HANDED_OUT:
            continue
        with socket.socket(socket.AF_INET, kind) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _HANDED_OUT[port] = None
        if len(_HANDED_OUT) > _HANDED_OUT_REMEMBERED:
            del _HANDED_OUT[next(iter(_HANDED_OUT))]
        return port
    raise RuntimeError("no free loopback port found")


#: connections that hold: ``python -c FLOOD COUNT SEND SOURCE TARGET...`` opens COUNT
#: connections to each TARGET (``@NAME``: an abstract ipc socket, else ``HOST:PORT``), from
#: SOURCE (a local address to bind, or ``-``), sending SEND's bytes (hex, ``-``: none) on
#: each; prints how many it holds, and holds them until its standard input closes
FLOOD = textwrap.dedent("""
    import socket, sys
    count, send, source = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    first = b"" if send == "-" else bytes.fromhex(send)
    held = []
    for target in sys.argv[4:]:
        for _ in range(count):
            if target.startswith("@"):
                s, address = socket.socket(socket.AF_UNIX), "\\0" + target[1:]
            else:
                host, port = target.rsplit(":", 1)
                s, address = socket.socket(socket.AF_INET), (host, int(port))
                if source != "-":
                    s.bind((source, 0))
            try:
                s.connect(address)
                if first:
                    s.sendall(first)
            except OSError:
                s.close()
                continue
            held.append(s)
    print(len(held), flush=True)
    sys.stdin.read()
""")


def logged_broker(tmp_path: Path, name: str, config: Path,
                  preexec_fn: Callable[[], None] | None = None
                  ) -> tuple[subprocess.Popen[bytes], Path]:
    """A broker process ``name`` started with ``config`` in ``tmp_path``, its log (its
    standard output and error) in ``broker.log`` there: (the process, the log's path)."""
    log_path = tmp_path / "broker.log"
    with open(log_path, "wb") as err:
        broker = subprocess.Popen([sys.executable, "-m", "zbroker", name, "--config", str(config)],
                                  cwd=tmp_path, env=broker_env(tmp_path), stdout=err,
                                  stderr=err, stdin=subprocess.DEVNULL, preexec_fn=preexec_fn)
    return broker, log_path


#: the start of a command line that runs the system's python3 as uid nobody (a user that is
#: another source to the broker), and the mark of a test that needs it
AS_NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3"]
needs_nobody = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"),
                                  reason="needs root and setpriv to run as another uid")


def dealer_hello() -> bytes:
    """What a ZMTP 3.0 DEALER with the NULL mechanism sends first: its greeting and READY
    (for raw clients written byte by byte)."""
    from zbroker.zmtp import codec
    from zpipes.zmtp import GREETING

    return GREETING + codec.ready_command(codec.DEALER)
