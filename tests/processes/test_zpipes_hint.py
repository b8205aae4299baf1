"""A timeout says when the broker's cluster may be why: a broker in a cluster without peers adds
"this broker has no peers: see zbroker status" to the timeouts of ``zpipes`` and of the client
library (sync and asyncio); a standalone broker adds nothing (zpipes/hint.py). Real broker
processes; the cluster's socket on loopback, no discovery."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest
import zmq
from helpers import broker_env, free_port

import zpipes
import zpipes.aio
from zpipes import hint
from zpipes import protocol as p

HINT = "(this broker has no peers: see zbroker status)"


@pytest.fixture
def env(tmp_path):
    return broker_env(tmp_path)


@pytest.fixture
def clustered(start_broker):
    return start_broker(config={"cluster": {
        "enabled": True, "discovery": False, "insecure": True,
        "bind": f"tcp://127.0.0.1:{free_port()}"}})


def zpipes_cli(env, *args, input=b""):
    result = subprocess.run([sys.executable, "-m", "zpipes", *args], input=input,
                            capture_output=True, env=env, timeout=30)
    return result.returncode, result.stderr.decode()


def test_the_cli_timeouts_of_a_clustered_broker_without_peers_say_so(clustered, env):
    status, err = zpipes_cli(env, "write", "--broker", clustered.name, "--timeout", "1",
                             "xhost", input=b"hi\n")
    assert status == 1
    assert err == f"zpipes: no reader attached to pipe 'xhost' within 1 s {HINT}\n"
    status, err = zpipes_cli(env, "read", "--broker", clustered.name, "--timeout", "1",
                             "xhost")
    assert status == 1
    assert err.endswith(f"timed out after 1 s {HINT}\n") and err.count("\n") == 1, err


def test_a_standalone_broker_adds_no_hint(broker, env):
    status, err = zpipes_cli(env, "write", "--broker", broker.name, "--timeout", "1", "solo",
                             input=b"hi\n")
    assert (status, err) == (1, "zpipes: no reader attached to pipe 'solo' within 1 s\n")
    status, err = zpipes_cli(env, "read", "--broker", broker.name, "--timeout", "1", "solo")
    assert status == 1 and err.endswith("timed out after 1 s\n") and "(" not in err, err


def test_the_library_timeouts_carry_the_hint(clustered, broker):
    with pytest.raises(zpipes.PipeTimeout) as raised:
        with zpipes.open("lib", "r", broker=clustered.name, timeout=0.5) as r:
            r.read(1)
    assert str(raised.value).endswith(HINT)
    with pytest.raises(zpipes.PipeTimeout) as raised:
        with zpipes.open("lib", "r", broker=broker.name, timeout=0.5) as r:
            r.read(1)
    assert "(" not in str(raised.value)

    async def read(broker_name):
        async with await zpipes.aio.open("lib", "r", broker=broker_name, timeout=0.5) as r:
            await r.read(1)

    with pytest.raises(zpipes.PipeTimeout) as raised:
        asyncio.run(read(clustered.name))
    assert str(raised.value).endswith(HINT)


def test_the_hint_exchange_beside_the_zpipes_protocol(clustered):
    """HINT is answered on any connection, with nothing else asked first; the pipes' own
    messages are as they were (a broker of before answers HINT with INVALID: no hint)."""
    ctx = zmq.Context()
    try:
        sock = ctx.socket(zmq.DEALER)
        sock.connect(clustered.endpoint)
        sock.send(hint.QUERY)
        assert sock.poll(5000)
        assert hint.decode_reply(sock.recv()) == "this broker has no peers: see zbroker status"
        sock.send(p.encode(p.Ping()))  # the same connection still speaks ZPIPES
        assert sock.poll(5000) and p.decode_reply([sock.recv()]) == p.PingOk()
        sock.close(linger=0)
    finally:
        ctx.term()
    assert hint.decode_reply(p.encode(p.Invalid())) is None
    assert hint.decode_reply(hint.encode_reply("x" * 300)) == "x" * 255
