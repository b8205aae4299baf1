"""A link between two brokers reset again and again while a stream crosses it (two hosts in
network namespaces): whatever the resets take, a reader gets the stream whole or is told it
was cut, never a stream with a hole in it, and a writer told OK had its stream delivered."""

from __future__ import annotations

import contextlib
import subprocess
import threading
import time

import netns
import pytest
from test_cluster_netns import reader, testbed, wait_attached, writer  # noqa: F401

why_not = netns.available()
pytestmark = pytest.mark.skipif(why_not is not None, reason=str(why_not))


@contextlib.contextmanager
def resetting(a, b, every=0.01):
    """Meanwhile, ``a``'s connections to ``b``'s cluster port are reset every ``every`` s."""
    stop = threading.Event()

    def reset():
        while not stop.is_set():
            subprocess.run(["ip", "netns", "exec", a.ns, "ss", "-tnK", "dst",
                            f"{b.address}:5670"], capture_output=True)
            stop.wait(every)

    thread = threading.Thread(target=reset, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def write_in_bursts(w, lines, burst=10, pause=0.2):
    """Lines in bursts with pauses between them (a link made again meanwhile takes sends
    again: nothing refused shows what a reset took). False if the writer is gone."""
    try:
        for i in range(0, len(lines), burst):
            w.stdin.write(b"".join(lines[i:i + burst]))
            w.stdin.flush()
            time.sleep(pause)
        w.stdin.close()
    except BrokenPipeError:
        return False
    return True


@pytest.mark.parametrize("run", range(3))
def test_a_stream_across_a_link_reset_again_and_again_is_whole_or_said_cut(testbed, run):  # noqa: F811
    a, b = testbed(2).hosts
    pipe = f"resets{run}"
    r = reader(b, pipe)
    wait_attached(a, pipe, "reader")
    lines = [b"line %04d\n" % i for i in range(60)]
    whole = b"".join(lines)
    with resetting(a, b):
        w = writer(a, pipe)
        write_in_bursts(w, lines)
        written = w.wait(30)
    try:
        out, err = r.communicate(timeout=10)
        read = r.returncode
    except subprocess.TimeoutExpired:  # still waiting for a writer: none reached it
        r.kill()
        out, err = r.communicate()
        read = None
    werr = w.stderr.read()
    print(f"writer {written} {werr!r}; reader {read} {len(out)} B {err!r}")
    assert whole.startswith(out), "the reader got a stream with a hole in it"
    if read == 0:
        assert out == whole
    elif read is None:
        assert out == b"" and written != 0, "the writer was told OK, its reader got nothing"
    else:
        assert b"lost" in err
    if written == 0:
        assert read == 0 and out == whole, "the writer was told OK for a stream cut on the way"
    else:  # it failed, and says how: never that its broker, which is fine, was lost
        assert b"peer lost" in werr
