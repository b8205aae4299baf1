"""A clustered broker's join file and join line, and reloads of its cluster key, with one real
broker on loopback and zeroconf off (nothing is announced on the machine's network; two
hosts joining and relinking are in tests/namespaces/test_readme_cluster_netns.py)."""

from __future__ import annotations

import json
import shutil
import stat

import yaml
from helpers import free_port, run_zbroker, unique_name, wait_for

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
    assert r.stdout == (f"reloaded {b.config_path}: changed cluster.key_file, "
                        "services.zpipes.client_timeout; the cluster key changed: the peers "
                        "are linked anew with it\n")
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
    assert r.stdout == (f"reloaded {b.config_path}: no setting changed, but the cluster key "
                        "in its file did: the peers are linked anew with it\n"), r.stderr
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


def peer_names(b) -> set[str]:
    r = zb(b, "status", "--json")
    return {p["name"] for p in json.loads(r.stdout)["cluster"]["peers"]} if r.returncode == 0 \
        else set()


def test_a_joined_broker_rejoins_with_its_plain_command_and_passes_on_only_answering_seeds(
        start_broker):
    """Reported: seeds from the join token were not kept, so a joined broker restarted with
    its plain command ran standalone, key installed, without a word; and a dead seed of a
    host's config was copied into its join file. Two brokers (each its own home) join, are
    killed and started again with their plain commands: they link again, from what each
    remembered (cluster/snapshot.py)."""
    a_port, b_port, dead = free_port(), free_port(), free_port()
    a_config = loopback_cluster(a_port)
    a = start_broker(config=a_config)
    wait_for(lambda: "cluster join file written" in a.stderr(), 10, "a's join file")
    join = a.dir / "config" / "zbroker" / "cluster-default.join"
    # the cluster's settings but not cluster.enabled: the join turns it on
    b_config = {"cluster": {"discovery": False, "bind": f"tcp://127.0.0.1:{b_port}",
                            "peers": [f"tcp://127.0.0.1:{dead}"]}}
    b = start_broker(config=b_config, args=["--join-file", str(join)])
    wait_for(lambda: b.name in peer_names(a) and a.name in peer_names(b), 20, "the join")

    # b's join file names b and its peer, not the seed of its config that never answered
    r = zb(b, "join-token", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["seeds"] == [f"tcp://127.0.0.1:{b_port}",
                                             f"tcp://127.0.0.1:{a_port}"]

    # both killed, then started with their plain commands (b: no join file, no cluster in
    # its config): they link again
    a.kill()
    b.kill()
    b = start_broker(name=b.name, config=b_config)
    a = start_broker(name=a.name, config=a_config)
    wait_for(lambda: b.name in peer_names(a) and a.name in peer_names(b), 20, "the rejoin")
    assert "rejoining the cluster this broker was a member of" in b.stderr()
    snapshot = json.loads((b.dir / "state" / "zbroker" / f"{b.name}.cluster.json").read_text())
    assert snapshot["cluster"] == "default"
    assert f"tcp://127.0.0.1:{a_port}" in snapshot["members"]

    # a config that turns the cluster off in so many words wins, and says what it leaves
    b.stop()
    b = start_broker(name=b.name, config={**b_config, "cluster": {**b_config["cluster"],
                                                                  "enabled": False}})
    assert "running standalone: the config file sets cluster.enabled false, yet this broker " \
           "was a member of a cluster" in b.stderr()
    assert zb(b, "status", "--json").returncode == 0
    assert b.name not in peer_names(a)

    # a broker with a cluster key and no cluster says so at start
    c_name = unique_name("c")
    key_dir = b.dir.parent / f"broker-{c_name}" / "config" / "zbroker"
    key_dir.mkdir(parents=True)
    shutil.copy(a.dir / "config" / "zbroker" / "cluster-default.key", key_dir)
    c = start_broker(name=c_name)
    assert "running standalone with a cluster key installed: start with --cluster" \
           in c.stderr(), c.stderr()
