"""The metrics endpoint does not trust its clients to be quick, few or well-formed: thousands
that connect and say nothing (or half a request) against a broker under a small open-file
limit leave it alive, its management socket and a scrape from elsewhere answered, its
descriptors and threads bounded, and are let go once their time to send a request is over;
connections past the cap are hung up unread; a request head too long, or another method than
GET or HEAD, is answered with an HTTP error; a process out of descriptors neither dies nor
spins, and serves again once it has some. Real brokers and sockets; the slow clients are this
test process's own sockets."""

from __future__ import annotations

import gzip
import http.client
import json
import os
import resource
import select
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator

import pytest
from helpers import (
    broker_env,
    free_port,
    logged_broker,
    run_zbroker,
    unique_name,
    wait_for,
    write_config,
)
from metrics_helpers import scrape_text
from test_zpipes_guard import limit_files

from zbroker.metrics import HEAD_TIMEOUT_S, MAX_CONNECTIONS, MAX_HEAD_BYTES, MAX_PER_SOURCE

SLOW_CLIENTS = 2000
BROKER_FILES = 1200  # the broker's open-file limit: less than the slow clients
HALF_HEAD = b"GET /metrics HTTP/1.1\r\nHost: broker\r\n"  # no blank line: it never ends
SCRAPER = "127.0.0.2"  # a source of its own (all of 127/8 is loopback)


def status(name: str, cwd) -> dict:
    r = run_zbroker(["status", name, "--json"], cwd=cwd)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def thread_count(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("Threads:"))


class Peaks:
    """The most descriptors and threads a process had, looked at every 20 ms meanwhile."""

    def __init__(self, pid: int) -> None:
        self.pid, self.fds, self.threads = pid, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> Peaks:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _watch(self) -> None:
        while not self._stop.wait(0.02):
            try:
                self.fds = max(self.fds, fd_count(self.pid))
                self.threads = max(self.threads, thread_count(self.pid))
            except (OSError, StopIteration):
                return


@pytest.fixture
def room_for_the_clients() -> Iterator[None]:
    """This process's soft open-file limit raised to hold the slow clients (then put back)."""
    before = resource.getrlimit(resource.RLIMIT_NOFILE)
    hard = before[1]
    want = fd_count(os.getpid()) + SLOW_CLIENTS + 100
    if hard != resource.RLIM_INFINITY and hard < want:
        pytest.skip(f"needs an open-file limit of {want}; the hard limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(before[0], want), hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, before)


def accept_queue(port: int) -> int:
    """Connections waiting to be accepted on the TCP listener of ``port`` (IPv4)."""
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            cols = line.split()
            if cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                return int(cols[4].split(":")[1], 16)
    raise AssertionError(f"nothing listens on port {port}")


def connect_from(sources: list[str], n: int, port: int, batch: int = 32
                 ) -> list[socket.socket]:
    """``n`` connections to 127.0.0.1:``port``, from each of ``sources`` in turn, begun
    (non-blocking) and left to complete; ``batch`` at a time, the next when the listener
    has taken them (past its backlog, the kernel would drop some unseen by the broker)."""
    socks = []
    for i in range(n):
        s = socket.socket()
        s.setblocking(False)
        s.bind((sources[i % len(sources)], 0))
        s.connect_ex(("127.0.0.1", port))
        socks.append(s)
        if (i + 1) % batch == 0:
            wait_for(lambda: accept_queue(port) == 0, 10, "the broker to accept", 0.002)
    return socks


def wait_connected(socks: list[socket.socket], timeout: float) -> None:
    """Until each of ``socks`` is connected (or already hung up); every fourth then sends
    half a request head."""
    waiting = {s.fileno(): (i, s) for i, s in enumerate(socks)}
    poller = select.poll()
    for fd in waiting:
        poller.register(fd, select.POLLOUT)
    deadline = time.monotonic() + timeout
    while waiting and time.monotonic() < deadline:
        for fd, _ in poller.poll(200):
            poller.unregister(fd)
            i, s = waiting.pop(fd)
            if i % 4 == 0 and not s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                try:
                    s.send(HALF_HEAD)
                except OSError:  # hung up already
                    pass
    assert not waiting, f"{len(waiting)} connections not made within {timeout} s"


def hung_up(s: socket.socket) -> bool:
    """Whether the broker closed ``s`` (it must have sent nothing: there was no request)."""
    try:
        data = s.recv(4096)
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True
    assert data == b"", data[:200]
    return True


def wait_hung_up(socks: list[socket.socket], timeout: float) -> None:
    left = {s.fileno(): s for s in socks}
    poller = select.poll()
    for fd in left:
        poller.register(fd, select.POLLIN)
    deadline = time.monotonic() + timeout
    while left and time.monotonic() < deadline:
        for fd, _ in poller.poll(200):
            if hung_up(left[fd]):
                poller.unregister(fd)
                del left[fd]
    assert not left, f"{len(left)} connections still open after {timeout} s"


def scrape_from(source: str, port: int, headers: dict[str, str] | None = None,
                method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body) of a request from address ``source``."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10, source_address=(source, 0))
    try:
        c.request(method, "/metrics", headers=headers or {})
        r = c.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        c.close()


def start(tmp_path, config: dict | None = None, files: int | None = None):
    """A broker with its metrics on a free loopback port, under an open-file limit of
    ``files`` if given: (process, log path, port, name)."""
    port = free_port()
    name = unique_name("slow")
    cfg = write_config(tmp_path / "zbroker.cfg", {
        "metrics": {"bind": f"127.0.0.1:{port}"}, **(config or {})})
    broker, log = logged_broker(tmp_path, name, cfg,
                                preexec_fn=limit_files(files) if files else None)
    wait_for(lambda: broker.poll() is not None or "broker started" in log.read_text(), 30,
             "the broker to start")
    assert broker.poll() is None, log.read_text()
    return broker, log, port, name


def test_thousands_of_slow_clients_leave_the_broker_and_its_scrapes_going(
        tmp_path, room_for_the_clients):
    broker, log, port, name = start(tmp_path, {"clients": {"max_clients": 600}},
                                    files=BROKER_FILES)
    # fewer sources than the cap holds at their share each: room is left for the scraper
    sources = [f"127.0.0.{3 + i}" for i in range(MAX_CONNECTIONS // MAX_PER_SOURCE - 1)]
    clients: list[socket.socket] = []
    try:
        fds, threads = fd_count(broker.pid), thread_count(broker.pid)
        with Peaks(broker.pid) as peaks:
            began = time.monotonic()
            clients = connect_from(sources, SLOW_CLIENTS, port)
            wait_connected(clients, 30)
            # while they are open
            assert broker.poll() is None, log.read_text()[-3000:]
            code, _, body = scrape_from(SCRAPER, port)
            assert code == 200 and b"zbroker_uptime_seconds" in body
            endpoint = status(name, tmp_path)["metrics_endpoint"]
            assert endpoint["connections"] <= len(sources) * MAX_PER_SOURCE, endpoint
            assert endpoint["refused"]["too many from one source"] >= 1, endpoint
        assert peaks.fds <= fds + MAX_CONNECTIONS + 20, (fds, peaks.fds)
        assert peaks.threads <= threads + 2, (threads, peaks.threads)
        # past the time to send a request, none is left open
        wait_hung_up(clients, HEAD_TIMEOUT_S + 15)
        took = time.monotonic() - began
        wait_for(lambda: status(name, tmp_path)["metrics_endpoint"]["connections"] == 0, 10,
                 "the connections to be closed")
        assert broker.poll() is None
        code, _, body = scrape_from(SCRAPER, port)
        assert code == 200 and b"zbroker_uptime_seconds" in body
        text = log.read_text()
        assert "Too many open files" not in text and "Traceback" not in text
        refused = text.count("metrics connection refused")
        assert 1 <= refused <= took + 2, refused  # at most once a second, not once each
    finally:
        for s in clients:
            s.close()
        broker.kill()
        broker.wait(10)


def test_connections_past_the_cap_are_hung_up_unread(tmp_path):
    broker, log, port, name = start(tmp_path)
    sources = [f"127.0.0.{3 + i}" for i in range(MAX_CONNECTIONS // MAX_PER_SOURCE + 2)]
    clients: list[socket.socket] = []
    try:
        # one past its share from the first source, then each source to its share, one
        # after another: the last two find no place
        clients = connect_from(sources[:1], MAX_PER_SOURCE + 1, port)
        wait_connected(clients, 10)
        wait_hung_up(clients[MAX_PER_SOURCE:], 5)
        taken = clients[:MAX_PER_SOURCE]
        rest = [s for source in sources[1:] for s in connect_from([source], MAX_PER_SOURCE, port)]
        clients += rest
        wait_connected(rest, 10)
        taken += rest[:MAX_CONNECTIONS - MAX_PER_SOURCE]
        wait_hung_up(rest[MAX_CONNECTIONS - MAX_PER_SOURCE:], 5)
        endpoint = status(name, tmp_path)["metrics_endpoint"]
        assert endpoint["connections"] == MAX_CONNECTIONS
        assert endpoint["refused"]["too many clients"] == 2 * MAX_PER_SOURCE
        assert endpoint["refused"]["too many from one source"] == 1
        for s in taken:  # taken, and waiting for a request
            assert not hung_up(s)
            s.close()  # (the broker reads the end: their places are free again)
        wait_for(lambda: status(name, tmp_path)["metrics_endpoint"]["connections"] == 0, 10,
                 "the places to be given back")
        assert b"zbroker_uptime_seconds" in scrape_from(sources[0], port)[2]
    finally:
        for s in clients:
            s.close()
        broker.kill()
        broker.wait(10)


def exchange(port: int, request: bytes) -> bytes:
    """What the endpoint answers to ``request`` before it closes (5 s at most)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(request)
        got = b""
        while chunk := s.recv(65536):
            got += chunk
    return got


def test_a_head_too_long_and_other_methods_get_an_http_error(tmp_path):
    broker, log, port, name = start(tmp_path)
    try:
        filler = b"X-Filler: " + b"a" * 2 * MAX_HEAD_BYTES + b"\r\n"
        cases = [
            (b"GET /metrics HTTP/1.1\r\nHost: b\r\n" + filler + b"\r\n", b"431 "),
            (b"DELETE /metrics HTTP/1.1\r\nHost: b\r\n\r\n", b"405 "),
            # a body that is never read does not cost the client its answer
            (b"POST /metrics HTTP/1.1\r\nHost: b\r\nContent-Length: 9000\r\n\r\n"
             + b"x" * 9000, b"405 "),
            (b"hello there\r\n\r\n", b"400 "),
        ]
        for request, status_code in cases:
            began = time.monotonic()
            answer = exchange(port, request)
            assert answer.startswith(b"HTTP/1.1 " + status_code), answer[:200]
            assert b"\r\nConnection: close\r\n" in answer
            assert time.monotonic() - began < 3
        assert b"\r\nAllow: GET, HEAD\r\n" in exchange(port, cases[1][0])
        assert "zbroker_uptime_seconds" in scrape_text(port)  # and the endpoint goes on
        refused = status(name, tmp_path)["metrics_endpoint"]["refused"]
        assert refused["bad request"] == 5
    finally:
        broker.kill()
        broker.wait(10)


def test_get_and_head_answer_as_prometheus_client_does(tmp_path):
    broker, log, port, name = start(tmp_path)
    try:
        code, headers, body = scrape_from("127.0.0.1", port, {"Accept-Encoding": "gzip"})
        assert code == 200 and headers["content-encoding"] == "gzip"
        assert headers["content-type"].startswith("text/plain; version=0.0.4")
        text = gzip.decompress(body)
        assert b"zbroker_uptime_seconds" in text and b"process_open_fds" in text
        code, headers, body = scrape_from("127.0.0.1", port, method="HEAD")
        assert code == 200 and body == b"" and int(headers["content-length"]) > 0
        code, headers, _ = scrape_from(
            "127.0.0.1", port, {"Accept": "application/openmetrics-text; version=1.0.0"})
        assert headers["content-type"].startswith("application/openmetrics-text")
        answer = exchange(port, b"GET / HTTP/1.0\r\n\r\n")  # any path
        assert answer.startswith(b"HTTP/1.1 200 ") and b"zbroker_uptime_seconds" in answer
    finally:
        broker.kill()
        broker.wait(10)


# --- a process out of descriptors ------------------------------------------------------------

OUT_OF_FILES = textwrap.dedent("""
    import asyncio, os
    from zbroker import logs
    from zbroker.metrics import MetricsServer
    from zbroker.runtime import event_loop

    logs.configure()  # to standard error
    SNAPSHOT = {"name": "t", "version": "0", "python": "3", "started": 0.0, "uptime": 1.0,
                "reloads": {"ok": 0, "refused": 0}}

    async def line(loop):
        got = loop.create_future()
        loop.add_reader(0, lambda: got.done() or got.set_result(os.read(0, 100)))
        await got
        loop.remove_reader(0)

    async def main():
        loop = asyncio.get_running_loop()
        server = MetricsServer(loop, lambda: SNAPSHOT)
        server.start("127.0.0.1:0")
        hog = []
        while True:  # every descriptor left
            try:
                hog.append(os.open("/dev/null", os.O_RDONLY))
            except OSError:
                break
        print(server.url, flush=True)
        await line(loop)
        for fd in hog:
            os.close(fd)
        await line(loop)

    event_loop.run(main())
""")


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_out_of_descriptors_the_endpoint_waits_then_serves_again(tmp_path, loop):
    env = {**broker_env(tmp_path), "ZBROKER_EVENT_LOOP": loop}
    server = subprocess.Popen([sys.executable, "-c", OUT_OF_FILES], env=env, cwd=tmp_path,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, preexec_fn=limit_files(256))
    try:
        url = server.stdout.readline().decode().strip()
        assert url.startswith("http://127.0.0.1:"), server.stderr.read().decode()
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: b\r\n\r\n")  # waits in the backlog
            cpu = cpu_seconds(server.pid)
            time.sleep(3)  # a window of 3 s: its CPU time while the connection waits
            assert server.poll() is None
            assert cpu_seconds(server.pid) - cpu < 0.2  # it rests: no spinning on accept
            server.stdin.write(b"free\n")
            server.stdin.flush()
            answer = s.recv(65536)  # accepted within a pause, and answered
            assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]
        server.stdin.write(b"end\n")
        server.stdin.flush()
        assert server.wait(10) == 0
        err = server.stderr.read().decode()
        assert "Traceback" not in err, err
        assert 1 <= err.count("cannot accept connections") <= 5, err
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(10)
