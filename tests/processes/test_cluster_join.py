"""A clustered broker's join file and join line, and reloads of its cluster key, with one real
broker on loopback and zeroconf off (nothing is announced on the machine's network; two
hosts joining and relinking are in tests/namespaces/test_readme_cluster_netns.py)."""

from __future__ import annotations

import json
import shutil
import stat

import yaml
from helpers import free_port, run_zbroker, wait_for

from zbroker.cluster.join_token import decode
from zbroker.cluster.joining import read_token
from zbroker.cluster.security import generate_key_file, load_key_file


def zb(b, *args):
    return run_zbroker([*args, b.name], cwd=b.dir)


def loopback_cluster(port: int, **cluster) -> dict:
    return {"cluster": {"enabled": True, "discovery": False,
                        "bind": f"tcp://127.0.0.1:{port}", **cluster}}


def test_a_clustered_broker_says_how_to_join_and_keeps_the_join_file_private(start_broker):
    port = free_port()
    b = start_broker(config=loopback_cluster(port), args=["--advertise", "192.0.2.7"])
    wait_for(lambda: "--join-file" in b.stderr(), 10, "the join line")
    key = b.dir / "config" / "zbroker" / "cluster-default.key"
    join = key.with_name("cluster-default.join")
    for path in (key, join):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    said = b.stderr()
    assert (f"To add a host to this cluster, copy {join} to it (it holds the cluster key: keep "
            f"it private), then run there:\n    zbroker {b.name} --join-file "
            "cluster-default.join\n") in said
    assert "loopback" not in said  # the advertised address is the seed
    token = read_token(file=str(join))
    assert token.seeds == (f"tcp://192.0.2.7:{port}",) and token.cluster == "default"
    assert (token.public, token.secret) == load_key_file(key)

    r = zb(b, "join-token", "--token")
    assert r.returncode == 0, r.stderr
    assert decode(r.stdout) == token
    r = zb(b, "join-token")
    assert r.returncode == 0 and f"copy {join} to it" in r.stdout
    r = zb(b, "join-token", "--json")
    assert json.loads(r.stdout)["seeds"] == [f"tcp://192.0.2.7:{port}"]


def test_a_seed_on_loopback_is_said_to_be_of_no_use_to_other_hosts(start_broker):
    b = start_broker(config=loopback_cluster(free_port()))
    r = zb(b, "join-token")
    assert r.returncode == 0, r.stderr
    assert "is a loopback address that no other host reaches: name this host's address " \
           "with --advertise ADDRESS" in r.stdout


def test_reload_applies_a_new_key_all_or_nothing_and_names_what_needs_a_restart(
        start_broker, tmp_path):
    port = free_port()
    first = tmp_path / "first.key"
    generate_key_file(first)
    config = loopback_cluster(port, key_file=str(first))
    b = start_broker(config=config)
    wait_for(lambda: "cluster join file written" in b.stderr(), 10, "the cluster")

    def reload_with(**cluster):
        cfg = {**config, "cluster": {**config["cluster"], **cluster},
               "clients": {"timeout": 9}}
        b.config_path.write_text(yaml.safe_dump(cfg))
        return zb(b, "reload")

    # a key file that cannot be read: nothing of the file is applied
    r = reload_with(key_file=str(tmp_path / "missing.key"))
    assert r.returncode == 1
    # (found by the checks start runs, before anything is applied)
    assert r.stderr.startswith("zbroker: reload refused: cluster.key_file: cannot read cluster "
                               f"key file {tmp_path / 'missing.key'}"), r.stderr
    assert zb(b, "get", "clients.timeout").stdout == "60.0\n"

    # another key: applied, the cluster node starts anew with it on the same port
    second = tmp_path / "second.key"
    generate_key_file(second)
    r = reload_with(key_file=str(second))
    assert r.returncode == 0, r.stderr
    assert r.stdout == (f"reloaded {b.config_path}: changed clients.timeout, "
                        "cluster.key_file; the cluster key changed: the peers are linked "
                        "anew with it\n")
    wait_for(lambda: b.stderr().count("cluster started") == 2, 10, "the node started anew")
    status = json.loads(zb(b, "status", "--json").stdout)
    assert status["cluster"]["key_file"] == str(second)
    assert status["cluster"]["endpoint"] == f"tcp://127.0.0.1:{port}"
    assert read_token(file=str(tmp_path / "second.join")).public == load_key_file(second)[0]

    # the same key in another file: taken without linking anew
    third = tmp_path / "third.key"
    shutil.copy(second, third)
    r = reload_with(key_file=str(third))
    assert r.stdout == f"reloaded {b.config_path}: changed cluster.key_file\n", r.stderr
    assert json.loads(zb(b, "status", "--json").stdout)["cluster"]["key_file"] == str(third)
    assert b.stderr().count("cluster started") == 2

    # the key file's contents replaced: applied too
    third.unlink()
    generate_key_file(third)
    r = reload_with(key_file=str(third))
    assert r.stdout == (f"reloaded {b.config_path}: nothing changed; the cluster key changed: "
                        "the peers are linked anew with it\n"), r.stderr
    wait_for(lambda: b.stderr().count("cluster started") == 3, 10, "the node started anew")

    # what needs a restart: named by a reload, refused by a set
    other = free_port()
    r = reload_with(key_file=str(third), bind=f"tcp://127.0.0.1:{other}")
    assert r.returncode == 0 and r.stdout.endswith(
        "restart needed for: cluster.bind (the broker runs on their values of before until it "
        "restarts)\n"), r.stdout
    assert zb(b, "get", "cluster.bind").stdout == f"tcp://127.0.0.1:{port}\n"
    r = zb(b, "set", "cluster.peer_timeout", "5")
    assert (r.returncode, r.stderr) == (1, "zbroker: set: cluster.peer_timeout: these keys "
                                           "only change with a restart: "
                                           "cluster.peer_timeout\n")
    assert b.alive()
