"""When hosts do not link, the brokers say why, where the operator looks: a refused handshake
names the peer and the likely cause, once (then it is counted), ``zbroker status`` names each
contact not answering and each peer refused, and a seed that does not answer is said so
(see netns.py for the testbed)."""

from __future__ import annotations

import json
import subprocess
import time

import netns
import pytest

why_not = netns.available()
pytestmark = pytest.mark.skipif(why_not is not None, reason=str(why_not))


@pytest.fixture
def bed(tmp_path):
    made = []

    def make(hosts):
        testbed = netns.Testbed(hosts, tmp_path)
        made.append(testbed)
        return testbed

    yield make
    for testbed in made:
        testbed.close()


def events(host, name):
    return [e for e in host.log_events() if e.get("event") == name]


def status(host):
    return json.loads(host.zbroker("status", "--json"))["cluster"]


def wait_until(what, timeout=15.0):
    deadline = time.monotonic() + timeout
    while not (found := what()):
        assert time.monotonic() < deadline, "not within the time"
        time.sleep(0.2)
    return found


def test_brokers_with_different_keys_name_each_other_and_the_cause_once(bed, tmp_path):
    from zbroker.cluster.security import generate_key_file

    a, b = bed(2).hosts
    for host in (a, b):
        generate_key_file(host.dir / "cluster.key")
        host.start_broker({"cluster": {"key_file": str(host.dir / "cluster.key"),
                                       "insecure": False, "discovery": False,
                                       "peers": [a.endpoint, b.endpoint]},
                           "metrics": {"bind": "127.0.0.1:9464"}}, wait=False)
    for host in (a, b):
        host.wait_for_log("broker started", timeout=15)
    for host, other in ((a, b), (b, a)):
        # we refuse its connections: named by where they come from, not by our own address
        host.wait_for_log("cluster connection refused", timeout=15, peer=other.endpoint,
                          why="another cluster key")
        # and it refuses our link to it
        host.wait_for_log("cluster link refused", timeout=15, peer=other.endpoint,
                          why="another cluster key")
    fix = events(a, "cluster connection refused")[0]["fix"]
    assert str(a.dir / "cluster.key") in fix and "zbroker reload" in fix
    # several refusals a second go on: counted, not logged
    def refused_both_ways(times: int) -> bool:
        refusals = {r["refused_by"]: r["times"] for r in status(a)["refusals"]}
        return refusals.get("us", 0) > times and refusals.get("the peer", 0) > times

    wait_until(lambda: refused_both_ways(5))
    for host, other in ((a, b), (b, a)):
        lines = [e for e in host.log_events() if "refused" in e.get("event", "")]
        assert sorted((e["event"], e["peer"]) for e in lines) == [
            ("cluster connection refused", other.endpoint),
            ("cluster link refused", other.endpoint)], lines
    cluster = status(a)
    refusals = {r["refused_by"]: r for r in cluster["refusals"]}
    assert refusals["us"]["peer"] == refusals["the peer"]["peer"] == b.endpoint
    assert refusals["us"]["times"] > 5 and refusals["the peer"]["times"] > 5, refusals
    assert cluster["refused"] >= refusals["us"]["times"] + refusals["the peer"]["times"]
    text = a.zbroker("status")
    # one line for the peer, both sides together, with the fix (it was three lines)
    assert text.count(b.endpoint) == 1 and str(b.address) not in text.replace(
        b.endpoint, ""), text
    assert f"{b.endpoint} refused both ways: another cluster key, since " in text, text
    assert " times); fix: copy " in text and "zbroker reload" in text, text
    assert "not answering" not in text and "handshakes refused" in text, text
    # and a client's timeout names the host, once (it said "2 refused" and named none)
    said = zpipes_timeout(a, "read", "xhost")
    assert said.endswith(f"(this broker has no peers; it and {b.address} refuse each other "
                         "(another cluster key): see zbroker status)\n"), said
    scrape = a.python("import urllib.request; print(urllib.request.urlopen("
                      "'http://127.0.0.1:9464/metrics').read().decode())",
                      stdout=subprocess.PIPE)
    samples = {line.rpartition(" ")[0]: float(line.rpartition(" ")[2])
               for line in scrape.communicate(timeout=30)[0].decode().splitlines()
               if line.startswith("zbroker_cluster_")}
    assert samples['zbroker_cluster_handshakes_refused_total{by="us"}'] > 5, samples
    assert samples['zbroker_cluster_handshakes_refused_total{by="peer"}'] > 5, samples
    assert samples["zbroker_cluster_contacts_not_answering"] == 1, samples


def test_a_peer_we_do_not_know_of_is_named_by_its_address(bed, tmp_path):
    """Only b names a as its seed: a refuses b's connections, and says who b is by the
    address they come from (libzmq's event names only a's own endpoint)."""
    from zbroker.cluster.security import generate_key_file

    a, b = bed(2).hosts
    for host in (a, b):
        generate_key_file(host.dir / "cluster.key")
    a.start_broker({"cluster": {"key_file": str(a.dir / "cluster.key"), "insecure": False,
                                "discovery": False}})
    b.start_broker({"cluster": {"key_file": str(b.dir / "cluster.key"), "insecure": False,
                                "discovery": False, "peers": [a.endpoint]}})
    a.wait_for_log("cluster connection refused", timeout=15, peer=b.address,
                   why="another cluster key")
    b.wait_for_log("cluster link refused", timeout=15, peer=a.endpoint,
                   why="another cluster key")
    b.wait_for_log("cluster seed not answering", timeout=15, seed=a.endpoint,
                   why="refused: another cluster key")
    # b knocks again and again meanwhile: counted, not logged
    wait_until(lambda: any(r["times"] > 3 for r in status(a)["refusals"]))
    refused = [e for e in a.log_events() if "refused" in e.get("event", "")]
    assert [(e["event"], e["peer"]) for e in refused] == [
        ("cluster connection refused", b.address)], refused
    refusals = status(a)["refusals"]
    assert [(r["peer"], r["refused_by"]) for r in refusals] == [(b.address, "us")], refusals
    assert refusals[0]["times"] > 3
    assert f"{b.address} refused: another cluster key, since " in a.zbroker("status")


def test_a_keyless_broker_and_a_keyed_one_say_which_has_no_key(bed, tmp_path):
    from zbroker.cluster.security import generate_key_file

    a, c = bed(2).hosts
    generate_key_file(tmp_path / "cluster.key")
    peers = {"discovery": False, "peers": [a.endpoint, c.endpoint]}
    a.start_broker({"cluster": {**peers, "key_file": str(tmp_path / "cluster.key"),
                                "insecure": False}})
    c.start_broker({"cluster": {**peers, "insecure": True}})
    a.wait_for_log("cluster connection refused", timeout=15, peer=c.endpoint,
                   why="the peer runs without a key (cluster.insecure)")
    # (its link may first have been closed by c before a saw why: guessed, then found)
    wait_until(lambda: [e for e in a.log_events()
                        if e.get("event") in ("cluster link refused",
                                              "cluster link refused, cause found")
                        and e.get("peer") == c.endpoint
                        and e.get("why") == "the peer runs without a key (cluster.insecure)"])
    c.wait_for_log("cluster connection refused", timeout=15, peer=a.endpoint,
                   why="this broker has no key (cluster.insecure), the peer has one")
    c.wait_for_log("cluster link refused", timeout=15, peer=a.endpoint,
                   why="this broker has no key (cluster.insecure), the peer has one")
    assert all("cluster.key_file" in e["fix"] for e in events(c, "cluster link refused"))


def test_a_seed_not_answering_is_said_once_named_and_then_that_it_answers(bed):
    a, b = bed(2).hosts
    nobody = "tcp://10.231.0.9:5670"
    seeds = {"discovery": False, "peers": [a.endpoint, b.endpoint, nobody]}  # (a: itself)
    a.start_broker({"cluster": seeds})
    a.wait_for_log("cluster seed not answering", timeout=10, seed=nobody)
    a.wait_for_log("cluster seed not answering", timeout=10, seed=b.endpoint)
    text = a.zbroker("status")
    assert f"{nobody} (seed) not answering since " in text, text
    assert f"{b.endpoint} (seed) not answering since " in text, text
    b.start_broker({"cluster": {"discovery": False}})
    a.wait_for_log("cluster seed answers", timeout=15, seed=b.endpoint)
    time.sleep(2)  # a window in which a seed would be said again: none is
    said = [e for e in a.log_events() if e.get("event", "").startswith("cluster seed")]
    assert sorted((e["event"], e["seed"]) for e in said) == [
        ("cluster seed answers", b.endpoint), ("cluster seed not answering", b.endpoint),
        ("cluster seed not answering", nobody)], said
    assert said[-1]["event"] == "cluster seed answers"
    cluster = status(a)
    assert [c["endpoint"] for c in cluster["not_answering"]] == [nobody]
    assert cluster["not_answering"][0]["seed"] is True
    assert cluster["not_answering"][0]["seconds"] > 3


def zpipes_timeout(host, *args, input=b""):
    proc = host.zpipes(*args, "--timeout", "1", stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE)
    out, err = proc.communicate(input, timeout=30)
    assert proc.returncode == 1, (out, err)
    return err.decode()


def test_a_timeout_says_when_the_broker_has_no_peers(bed):
    """As on two hosts whose brokers do not link: the timeouts of ``zpipes`` say that the
    broker has no peers; once they link, a timeout is only a timeout."""
    a, b = bed(2).hosts
    a.start_broker()  # zeroconf, as `zbroker local --cluster`; alone on its network
    hint = "(this broker has no peers: see zbroker status)"
    assert zpipes_timeout(a, "write", "xhost", input=b"hi\n") == \
        f"zpipes: no reader attached to pipe 'xhost' within 1 s {hint}\n"
    assert zpipes_timeout(a, "read", "xhost").endswith(f"timed out after 1 s {hint}\n")
    b.start_broker()
    a.bed.wait_for_cluster()
    assert zpipes_timeout(a, "read", "xhost").endswith("timed out after 1 s\n")


def test_a_client_with_the_clusters_public_key_but_not_its_secret_is_refused_by_name(bed):
    """Who knows the cluster's public key but not its secret passes CURVE and is refused by
    our ZAP handler: named by its address, once, then counted."""
    from zbroker.cluster.security import generate_key_file

    a, b = bed(2).hosts
    key = a.dir / "cluster.key"
    public = generate_key_file(key)
    a.start_broker({"cluster": {"key_file": str(key), "insecure": False, "discovery": False}})
    stranger = b.python(
        "import sys, time, zmq\n"
        "pub, sec = zmq.curve_keypair()\n"
        "s = zmq.Context().socket(zmq.DEALER)\n"
        "s.curve_publickey, s.curve_secretkey = pub, sec\n"
        "s.curve_serverkey = sys.argv[1].encode()\n"
        "s.setsockopt(zmq.RECONNECT_IVL, 100)\n"
        "s.connect(sys.argv[2])\n"
        "time.sleep(30)\n", public, a.endpoint)
    a.wait_for_log("cluster connection refused", timeout=15, peer=b.address,
                   why="not the cluster key")
    time.sleep(2)  # a window in which a second line would come: none does
    stranger.kill()
    refused = [e for e in a.log_events() if "refused" in e.get("event", "")]
    assert [(e["event"], e["peer"]) for e in refused] == [
        ("cluster connection refused", b.address)], refused
    (refusal,) = status(a)["refusals"]
    assert (refusal["peer"], refusal["why"], refusal["refused_by"]) == (
        b.address, "not the cluster key", "us")


def test_a_seed_named_by_another_address_of_its_host_answers(bed):
    """The seed names b by a second address of its host; b says it is at its first (where
    a's HELLO came in). b answers at the seed: no false "not answering", in the log or the
    status."""
    a, b = bed(2).hosts
    other = "10.231.0.102"
    subprocess.run(["ip", "-n", b.ns, "addr", "add", f"{other}/24", "dev", "eth0"], check=True)
    b.start_broker({"cluster": {"discovery": False}})
    a.start_broker({"cluster": {"discovery": False, "peers": [f"tcp://{other}:5670"]}})
    a.bed.wait_for_cluster()
    time.sleep(4)  # past the seeds' grace
    assert not [e for e in a.log_events() if e.get("event", "").startswith("cluster seed")]
    cluster = status(a)
    assert cluster["not_answering"] == [] and cluster["pending_contacts"] == 0, cluster
    assert "not answering" not in a.zbroker("status")
