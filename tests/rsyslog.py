"""A real rsyslog daemon for tests: unprivileged ports on 127.0.0.1, its own config file, one
output file with each record's fields on a line.

    server = RsyslogServer(tmp_path).start()     # or the ``rsyslog`` fixture
    server.udp, server.tcp, server.unix           # targets: "udp://127.0.0.1:PORT", ...
    server.wait_for_records(lambda recs: ..., timeout=5)
    server.pause(); server.resume()               # SIGSTOP / SIGCONT: a server that stops reading

Each line of the output file is one record: ``pri|app|procid|msgid|structured data|msg``.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from helpers import free_port

REPO_ROOT = Path(__file__).resolve().parents[1]
START_TIMEOUT = 10.0
SEP = "\x1f"  # between fields in the output file (never in a record: escaped by rsyslog)


def find_rsyslogd() -> str | None:
    return shutil.which("rsyslogd", path=os.pathsep.join(
        [os.environ.get("PATH", ""), "/usr/sbin", "/sbin"]))


def ensure_rsyslogd() -> str | None:
    """rsyslogd's path, installing the package first (scripts/ensure-test-deps) if missing."""
    found = find_rsyslogd()
    if found is None:
        script = REPO_ROOT / "scripts" / "ensure-test-deps"
        try:
            subprocess.run([str(script)], timeout=600, check=False)
        except (OSError, subprocess.TimeoutExpired):
            pass
        found = find_rsyslogd()
    return found


@dataclass
class Record:
    pri: int
    app: str
    procid: str
    msgid: str
    sd: str
    msg: str


CONFIG = """\
global(workDirectory="{dir}" maxMessageSize="64k")
module(load="imudp")
module(load="imtcp")
module(load="imuxsock" SysSock.Use="off")
input(type="imudp" address="127.0.0.1" port="{udp}")
input(type="imtcp" address="127.0.0.1" port="{tcp}")
input(type="imuxsock" Socket="{sock}" UseSpecialParser="off" ParseHostname="on")
template(name="fields" type="string"
         string="%pri%{sep}%app-name%{sep}%procid%{sep}%msgid%{sep}%structured-data%{sep}%msg%\\n")
action(type="omfile" file="{out}" template="fields")
"""


class RsyslogServer:
    def __init__(self, directory: Path, binary: str):
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.binary = binary
        self.out = self.dir / "records.txt"
        self.sock = self.dir / "log.sock"
        self.proc: subprocess.Popen[bytes] | None = None
        self.udp_port = self.tcp_port = 0

    @property
    def udp(self) -> str:
        return f"udp://127.0.0.1:{self.udp_port}"

    @property
    def tcp(self) -> str:
        return f"tcp://127.0.0.1:{self.tcp_port}"

    @property
    def unix(self) -> str:
        return f"unix://{self.sock}"

    def start(self, udp_port: int = 0, tcp_port: int = 0) -> RsyslogServer:
        """Start on the given ports, else on free ones."""
        self.udp_port = udp_port or free_port(socket.SOCK_DGRAM)
        self.tcp_port = tcp_port or free_port(socket.SOCK_STREAM)
        conf = self.dir / "rsyslog.conf"
        conf.write_text(CONFIG.format(dir=self.dir, udp=self.udp_port, tcp=self.tcp_port,
                                      sock=self.sock, out=self.out, sep=SEP))
        log = open(self.dir / "rsyslogd.stderr", "wb")
        self.proc = subprocess.Popen(
            [self.binary, "-n", "-f", str(conf), "-i", str(self.dir / "rsyslogd.pid")],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        log.close()
        deadline = time.monotonic() + START_TIMEOUT
        while not self._ready():
            if self.proc.poll() is not None:
                raise RuntimeError(f"rsyslogd exited with status {self.proc.returncode}: "
                                   f"{(self.dir / 'rsyslogd.stderr').read_text()}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"rsyslogd not ready after {START_TIMEOUT}s")
            time.sleep(0.05)
        return self

    def _ready(self) -> bool:
        if not self.sock.exists():
            return False
        with socket.socket() as s:
            s.settimeout(0.5)
            try:
                s.connect(("127.0.0.1", self.tcp_port))
            except OSError:
                return False
        # the UDP input: a probe must come out
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.sendto(b"<14>1 - - probe - - - probe", ("127.0.0.1", self.udp_port))
        time.sleep(0.05)
        return any(r.app == "probe" for r in self.records())

    def records(self, app: str | None = None) -> list[Record]:
        try:
            text = self.out.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return []
        found = []
        for line in text.splitlines():
            parts = line.split(SEP)
            if len(parts) != 6:
                continue
            rec = Record(int(parts[0]), *parts[1:])
            if app is None or rec.app == app:
                found.append(rec)
        return found

    def wait_for_records(self, predicate, timeout: float = 5.0, app: str | None = "zbroker"):
        """Poll the output until ``predicate(records)`` is truthy; returns the records."""
        deadline = time.monotonic() + timeout
        while True:
            recs = self.records(app)
            if predicate(recs):
                return recs
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout}s waiting for syslog records; "
                                     f"have {len(recs)}: {recs[-5:]}")
            time.sleep(0.05)

    def pause(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
