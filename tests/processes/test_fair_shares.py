"""Fair shares of the broker's buffers: another local user's 30 writers each send a 4 MiB
WRITE on a pipe nobody reads (120 MiB asked of a 64 MiB budget) and hold it; that user gets
at most its share (clients.max_buffered_per_source: half), the rest of its WRITEs are refused
with the reason, and a 64 MiB stream of this user's, written beside them, is read whole.
Before the shares, the hostile writers took the whole budget and the stream was cut ("the
broker's buffers for all clients are full")."""

from __future__ import annotations

import hashlib
import os
import subprocess
import textwrap
import threading

from helpers import AS_NOBODY, logged_broker, needs_nobody, unique_name, wait_for, write_config

import zpipes

#: ``python3 -c HOGS COUNT NAME WANT``: COUNT raw ZMTP connections to the abstract ipc socket
#: NAME, each opening pipe "hog-N" as its writer and sending one 4 MiB WRITE (no reader: it
#: waits); then reads what comes back on each (OUTPUT_OK, and WRITE_FAILED or nothing) until
#: WANT were refused (or 30 s), prints how many WRITEs were refused, and holds the
#: connections until its standard input closes
HOGS = textwrap.dedent("""
    import select, socket, struct, sys, time
    count, name, want = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    body = b"\\x05READY" + b"\\x0bSocket-Type" + (6).to_bytes(4, "big") + b"DEALER"
    hello = (b"\\xff" + bytes(8) + b"\\x7f" + b"\\x03\\x00" + b"NULL" + bytes(16) + bytes(32)
             + bytes([4, len(body)]) + body)
    def frame(data):
        if len(data) < 256:
            return bytes([0, len(data)]) + data
        return b"\\x02" + struct.pack(">Q", len(data)) + data
    chunk = b"h" * (4 << 20)
    socks = []
    for i in range(count):
        s = socket.socket(socket.AF_UNIX)
        s.connect("\\0" + name)
        pipe = b"hog-%d" % i
        s.sendall(hello + frame(b"\\xaa\\xa0\\x04" + bytes([len(pipe)]) + pipe)
                  + frame(b"\\xaa\\xa0\\x0c" + struct.pack(">I", len(chunk)) + chunk
                          + struct.pack(">I", 0)))
        socks.append(s)
    # the broker takes or refuses each: read until WANT were refused (WRITE_FAILED), or
    # every connection was refused or ended, or 30 s have gone by
    got = {s: b"" for s in socks}
    refused, ended = set(), set()
    deadline = time.monotonic() + 30
    while len(refused) < want and time.monotonic() < deadline:
        waiting = [s for s in socks if s not in refused and s not in ended]
        if not waiting:
            break
        for s in select.select(waiting, [], [], 0.2)[0]:
            try:
                data = s.recv(65536)
            except OSError:
                data = b""
            got[s] += data
            if b"\\xaa\\xa0\\x0f" in got[s]:  # WRITE_FAILED
                refused.add(s)
            elif not data:
                ended.add(s)
    print(len(refused), flush=True)
    sys.stdin.read()
""")

HOGS_N = 30


@needs_nobody
def test_one_users_writers_cannot_take_everyones_buffers(tmp_path):
    name = unique_name("fair")
    cfg = write_config(tmp_path / "zbroker.cfg", {
        "clients": {"max_buffered": "64MiB"},
        "services": {"zpipes": {"allow": {"users": ["*"]}}}})
    broker, log_path = logged_broker(tmp_path, name, cfg)
    hogs = None
    try:
        wait_for(lambda: "zpipes bound" in log_path.read_text(), 30, "the broker to start")
        # its share is 32 MiB: 8 WRITEs of 4 MiB at most are held, the others refused
        hogs = subprocess.Popen([*AS_NOBODY, "-c", HOGS, str(HOGS_N), f"/zpipes/{name}",
                                 str(HOGS_N - 8)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                cwd=tmp_path)
        refused = int(hogs.stdout.readline())
        assert refused >= HOGS_N - 8, f"only {refused} of {HOGS_N} hostile WRITEs refused"
        assert "services.zpipes.max_buffered_per_source" in log_path.read_text()

        # this user's stream goes through beside them
        endpoint = f"ipc://@/zpipes/{name}"
        data = os.urandom(1 << 20) * 64
        digest = {}

        def read() -> None:
            h, n = hashlib.sha256(), 0
            with zpipes.open("stream", "r", endpoint=endpoint, timeout=30) as r:
                while chunk := r.read(1 << 20):
                    h.update(chunk)
                    n += len(chunk)
            digest["read"] = (n, h.hexdigest())

        reader = threading.Thread(target=read)
        reader.start()
        with zpipes.open("stream", "w", endpoint=endpoint, timeout=30) as w:
            for i in range(0, len(data), 1 << 20):
                w.write(data[i:i + (1 << 20)])
        reader.join(60)
        assert digest.get("read") == (len(data), hashlib.sha256(data).hexdigest())
    finally:
        if hogs is not None:
            hogs.kill()
        broker.kill()
        broker.wait()
