"""The pipe directory without sockets: cores that speak it, wired in memory. Every scenario of
test_cluster_core.py runs again between such brokers; then what the directory adds: the cost of
opening a pipe, homes that move when members come and go without failing a pipe that does not
touch a lost broker, a lost home, messages that overtake each other, and a cluster mixing
brokers with and without the directory."""

from __future__ import annotations

import random

import pytest
import test_cluster_core as base
from zpipes_cluster import Cluster

from zbroker.services.zpipes import peering
from zbroker.services.zpipes.directory import Directory, home_of
from zpipes import protocol as p


def directory_cluster(names, **config):
    """test_cluster_core's cluster, with brokers that speak the directory."""
    return Cluster(names, directory=True, **config)


@pytest.fixture(autouse=True)
def directory_brokers(monkeypatch):
    monkeypatch.setattr(base, "Cluster", directory_cluster)


@pytest.fixture
def c():
    cl = directory_cluster("ABC")
    cl.join_all()
    return cl


SCENARIOS = [name for name in dir(base) if name.startswith("test_")
             and name != "test_stream_and_end_across_brokers"]  # asserts the broadcast itself


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_cross_broker_scenario_holds_with_the_directory(scenario, c):
    fn = getattr(base, scenario)
    params = getattr(fn, "pytestmark", [])
    cases = [dict(zip([a.strip() for a in m.args[0].split(",")], v if isinstance(v, tuple)
                      else (v,), strict=True))
             for m in params if m.name == "parametrize" for v in m.args[1]] or [{}]
    for case in cases:
        kwargs = dict(case)
        if "c" in fn.__code__.co_varnames[:fn.__code__.co_argcount]:
            kwargs["c"] = directory_cluster("ABC")
            kwargs["c"].join_all()
        fn(**kwargs)


def test_stream_and_end_across_brokers_nothing_left_anywhere(c):
    c.send("B", b"r", p.Input(b"x"))
    c.send("A", b"w", p.Output(b"x"))
    c.send("B", b"r", p.Read(100, 0))
    c.send("A", b"w", p.Write(b"hello", 0))
    c.send("A", b"w", p.Close())
    c.send("B", b"r", p.Read(100, 0))
    assert c.replies("B", b"r") == [p.InputOk(), p.ReadOk(b"hello"), p.ReadEnd()]
    c.send("B", b"r", p.Close())
    assert all(s.pipes.pipes == {} for s in c.servers.values())
    assert all(s.directory.held.entries() == 0 for s in c.servers.values())


def open_pipe(net, name, writer, reader, data=b""):
    net.send(reader, b"r-" + name, p.Input(name))
    net.send(writer, b"w-" + name, p.Output(name))
    if data:
        net.send(writer, b"w-" + name, p.Write(data, 0))


def test_opening_a_pipe_costs_at_most_4_messages_at_20_brokers():
    net = Cluster([f"b{i:02d}" for i in range(20)], directory=True)
    net.join_all()
    rng = random.Random(1)
    costs = []
    for i in range(200):
        writer, reader = rng.sample(sorted(net.servers), 2)
        before = net.control_messages()
        if i % 2:
            open_pipe(net, b"p%d" % i, writer, reader)
        else:  # writer first
            net.send(writer, b"w-p%d" % i, p.Output(b"p%d" % i))
            net.send(reader, b"r-p%d" % i, p.Input(b"p%d" % i))
        costs.append(net.control_messages() - before)
        net.send(writer, b"w-p%d" % i, p.Write(b"x", 0))
        net.send(reader, b"r-p%d" % i, p.Read(10, 0))
        assert net.replies(reader, b"r-p%d" % i)[-1] == p.ReadOk(b"x")
    assert max(costs) <= 4, costs
    assert 2 < sum(costs) / len(costs)  # the home is mostly a third broker
    # and each broker holds only the ends that concern it: its own, proxies of the ends they
    # met, and what it is home of
    for s in net.servers.values():
        assert len(s.pipes.pipes) < 60


def streams(net, pipes):
    """Each (name, writer, reader) writes one more chunk; True for those that got it."""
    ok = {}
    for name, writer, reader in pipes:
        net.send(writer, b"w-" + name, p.Write(b"more", 0))
        net.send(reader, b"r-" + name, p.Read(100, 0))
        ok[name] = net.replies(reader, b"r-" + name)[-1] == p.ReadOk(b"more")
    return ok


def test_homes_move_on_join_and_leave_and_only_pipes_of_the_lost_broker_fail():
    net = Cluster([f"b{i:02d}" for i in range(20)], directory=True)
    net.join_all()
    rng = random.Random(2)
    pipes, half = [], []
    for i in range(300):
        name = b"s%d" % i
        writer, reader = rng.sample(sorted(net.servers), 2)
        if i % 3 == 0:  # a reader alone: its writer comes after the members changed
            net.send(reader, b"r-" + name, p.Input(name))
            half.append((name, reader))
            continue
        open_pipe(net, name, writer, reader, b"start")
        net.send(reader, b"r-" + name, p.Read(100, 0))
        assert net.replies(reader, b"r-" + name)[-1] == p.ReadOk(b"start")
        pipes.append((name, writer, reader))
    homes = {name: net.home(name) for name, *_ in pipes}
    net.join("new")
    moved = sum(net.home(name) != homes[name] for name in homes)
    assert 0 < moved < len(homes) / 5  # about 1/21 of them
    victim = "b07"
    net.lose(victim)
    survivors = [x for x in pipes if victim not in x[1:]]
    assert all(streams(net, survivors).values())
    for name, writer, reader in pipes:
        if victim == writer:
            net.send(reader, b"r-" + name, p.Read(100, 0))
            assert net.replies(reader, b"r-" + name)[-1] == p.ReadFailed(
                "writer lost: " + net.lost(victim))
    # a writer opened now finds the reader that registered with a home since moved or lost
    for name, reader in half:
        if reader == victim:
            continue
        writer = rng.choice([n for n in sorted(net.servers) if n != reader])
        net.send(writer, b"w-" + name, p.Output(name))
        net.send(writer, b"w-" + name, p.Write(b"late", 0))
        net.send(reader, b"r-" + name, p.Read(100, 0))
        assert net.replies(reader, b"r-" + name)[-1] == p.ReadOk(b"late"), (name, reader)
    # and streams end as streams do
    for name, writer, reader in survivors:
        net.send(writer, b"w-" + name, p.Close())
        net.send(reader, b"r-" + name, p.Read(100, 0))
        assert net.replies(reader, b"r-" + name)[-1] == p.ReadEnd()


def test_a_lost_home_fails_no_pipe_whose_ends_are_alive():
    net = Cluster("ABCDE", directory=True)
    net.join_all()
    name = next(b"h%d" % i for i in range(100) if net.home(b"h%d" % i) == "E")
    open_pipe(net, name, "A", "B", b"one")
    net.lose("E")
    net.send("A", b"w-" + name, p.Write(b"two", 0))
    net.send("A", b"w-" + name, p.Close())
    net.send("B", b"r-" + name, p.Read(100, 0))
    net.send("B", b"r-" + name, p.Read(100, 0))
    assert net.replies("B", b"r-" + name) == [p.InputOk(), p.ReadOk(b"onetwo"), p.ReadEnd()]
    # a second reader elsewhere registers with the new home and meets the next writer
    net.send("C", b"r2", p.Input(name))
    net.send("D", b"w2", p.Output(name))
    net.send("D", b"w2", p.Write(b"three", 0))
    net.send("C", b"r2", p.Read(100, 0))
    assert net.replies("C", b"r2")[-1] == p.ReadOk(b"three")


@pytest.mark.parametrize("seed", range(40))
def test_messages_overtaking_each_other_lose_no_data_and_leave_nothing(seed):
    """Links are independent: a writer's DATA may come before the home's INTRODUCE, a
    DETACH before it, an introduction of an end closed meanwhile after its close."""
    rng = random.Random(seed)
    net = Cluster("ABCDE", directory=True)
    net.join_all()
    clients = {}
    ops = []
    for i in range(12):
        name = b"o%d" % (i % 4)
        writer, reader = rng.sample("ABCDE", 2)
        wid, rid = b"w%d" % i, b"r%d" % i
        clients[i] = (name, writer, reader, wid, rid)
        ops.append((0, i, reader, rid, p.Input(name)))
        ops.append((1, i, writer, wid, p.Output(name)))
        ops += [(2 + k, i, writer, wid, p.Write(b"%d;" % i, 0)) for k in range(3)]
        ops.append((5, i, writer, wid, p.Close()))
    ops.sort(key=lambda op: (op[0], rng.random()))  # every reader opens before any writer
    for _, _, broker, client, msg in ops:
        net.send(broker, client, msg, pump=False)
        for _ in range(rng.randrange(4)):
            net.step(rng)
    net.pump()
    reached = set()
    for i, (_, _, reader, _, rid) in clients.items():
        got = b""
        for _ in range(40):
            net.send(reader, rid, p.Read(1000, 0))
            last = net.replies(reader, rid)[-1]
            if not isinstance(last, p.ReadOk):
                break
            got += last.chunk
        # it ends, or waits (no answer: no stream reached it, e.g. every writer of its pipe
        # cut its stream before it started, or closed before the reader's registration came)
        assert last == p.ReadEnd() or (last == p.InputOk() and not got), (i, last)
        parts = got.split(b";")[:-1]
        for j in set(parts):  # all or none of each writer, in order
            assert parts.count(j) == 3, (i, got)
        reached |= set(parts)
    # every writer whose writes were taken reached a reader (a CLOSE pipelined behind a WRITE
    # that still waits for a reader, or for the home's answer, cuts a stream never started)
    accepted = {b"%d" % i for i, (_, writer, _, wid, _) in clients.items()
                if net.replies(writer, wid).count(p.WriteOk()) == 3}
    assert accepted <= reached and len(accepted) > len(clients) / 2
    for _, _, reader, _, rid in clients.values():
        net.send(reader, rid, p.Close())
    assert all(s.pipes.pipes == {} for s in net.servers.values())
    assert all(s.directory.held.entries() == 0 for s in net.servers.values())


@pytest.mark.parametrize("seed", range(40))
def test_ends_closed_before_their_introduction_leave_nothing_behind(seed):
    """Ends that open and close while their registrations and introductions are on the way:
    once everything has arrived, no broker holds anything of them, and a reader that stays
    meets the writers that stay."""
    rng = random.Random(seed)
    net = Cluster("ABCDE", directory=True)
    net.join_all()
    lists = []
    for i in range(30):
        role = rng.choice("rw")
        broker, cid, name = rng.choice("ABCDE"), b"%s%d" % (role.encode(), i), b"q%d" % (i % 3)
        ops = [(broker, cid, p.Input(name) if role == "r" else p.Output(name))]
        if role == "w" and rng.random() < 0.3:
            ops.append((broker, cid, p.Write(b"", 0)))
        ops.append((broker, cid, p.Close()))
        lists.append(ops)
    interleave(net, lists, rng)
    net.pump()
    assert all(s.pipes.pipes == {} for s in net.servers.values()), \
        {n: {k: (list(v.readers), list(v.writers)) for k, v in s.pipes.pipes.items()}
         for n, s in net.servers.items()}
    assert all(s.directory.held.entries() == 0 for s in net.servers.values())
    net.send("A", b"keep-r", p.Input(b"q0"))
    net.send("B", b"keep-w", p.Output(b"q0"))
    net.send("B", b"keep-w", p.Write(b"still", 0))
    net.send("A", b"keep-r", p.Read(10, 0))
    assert net.replies("A", b"keep-r")[-1] == p.ReadOk(b"still")


@pytest.mark.parametrize("seed", range(30))
def test_members_changing_while_messages_are_in_flight_fail_no_pipe(seed):
    """A broker joins and a broker with no pipe end (only homes) is lost while registrations,
    introductions and data are on their way: every stream still ends whole."""
    rng = random.Random(seed)
    net = Cluster("ABCDE", directory=True)
    net.join_all()
    lists = []
    for i in range(10):
        name, writer, reader = b"m%d" % (i % 5), *rng.sample("ABCD", 2)
        wid, rid = b"w%d" % i, b"r%d" % i
        lists.append([(reader, rid, p.Input(name))])
        lists.append([(writer, wid, p.Output(name))]
                     + [(writer, wid, p.Write(b"%d;" % i, 0)) for _ in range(3)])
    changes = [lambda: net.join("F"), lambda: net.lose("E")]
    rng.shuffle(changes)
    at = sorted(rng.sample(range(1, 40), 2))
    def change_at(n):
        if at and n == at[0]:
            at.pop(0)
            changes.pop()()

    interleave(net, lists, rng, after=change_at)
    while changes:
        changes.pop()()
    net.pump()
    writers = [(b, c) for b, s in net.servers.items() for c in s.clients if c[:1] == b"w"]
    for broker, client in writers:
        assert net.replies(broker, client).count(p.WriteOk()) == 3, (broker, client)
        net.send(broker, client, p.Close())
    readers = [(b, c) for b, s in net.servers.items() for c in s.clients if c[:1] == b"r"]
    reached = set()
    for broker, client in readers:
        got, last = b"", None
        for _ in range(40):
            net.send(broker, client, p.Read(1000, 0))
            last = net.replies(broker, client)[-1]
            if not isinstance(last, p.ReadOk):
                break
            got += last.chunk
        assert last == p.ReadEnd(), (broker, client, last)
        parts = got.split(b";")[:-1]
        assert all(parts.count(j) == 3 for j in parts), got
        reached |= set(parts)
        net.send(broker, client, p.Close())
    assert reached == {b"%d" % i for i in range(10)}
    assert all(s.pipes.pipes == {} for s in net.servers.values())
    assert all(s.directory.held.entries() == 0 for s in net.servers.values())


def interleave(net, lists, rng, after=None):
    """Send each client's commands (``lists`` of ``(broker, client, message)``) in order,
    the clients interleaved at random, with 0-2 random link deliveries after each; ``after``
    is called with the number of commands sent so far."""
    n = 0
    while lists:
        ops = rng.choice(lists)
        broker, client, msg = ops.pop(0)
        if not ops:
            lists.remove(ops)
        net.send(broker, client, msg, pump=False)
        for _ in range(rng.randrange(3)):
            net.step(rng)
        n += 1
        if after is not None:
            after(n)


def test_a_writer_whose_close_overtakes_its_introduction_ends_only_the_readers_it_met():
    net = Cluster("ABC", directory=True)
    net.join_all()
    name = next(b"c%d" % i for i in range(100) if net.home(b"c%d" % i) == "C")
    net.send("B", b"r", p.Input(name))  # registered with C
    net.send("A", b"w", p.Output(name), pump=False)
    net.deliver("A", "C")  # C introduces w to B and r to A, at once
    net.deliver("C", "A")  # only A's introduction arrives
    net.send("A", b"w", p.Close(), pump=False)  # it closes, telling B, which it met
    net.deliver("A", "B")  # the DETACH overtakes C's introduction to B
    net.send("B", b"late", p.Input(name), pump=False)  # opened after w closed
    net.send("B", b"r", p.Read(10, 0), pump=False)
    net.send("B", b"late", p.Read(10, 0), pump=False)
    assert net.replies("B", b"r") == [p.InputOk()]  # B knows nothing of w yet: it waits
    net.pump()
    assert net.replies("B", b"r") == [p.ReadEnd()]  # w was attached to r, and closed
    assert net.replies("B", b"late") == [p.InputOk()]  # never met w: waits for a writer
    assert net.servers["B"].pipes.pipes[name].writers == {}


def test_a_writer_with_a_reader_beside_it_waits_for_the_readers_registered_elsewhere():
    """A reader on B registered before the writer on A opened is in the writer's audience,
    even though a reader on A could have taken the stream before the home's answer came."""
    net = Cluster("ABC", directory=True)
    net.join_all()
    name = next(b"w%d" % i for i in range(100) if net.home(b"w%d" % i) == "C")
    net.send("B", b"far", p.Input(name))
    net.send("A", b"near", p.Input(name))
    before = net.control_messages()
    net.send("A", b"w", p.Output(name), pump=False)
    net.send("A", b"w", p.Write(b"all of it", 0), pump=False)  # before the home answered
    assert net.replies("A", b"w") == [p.OutputOk()]  # it waits
    net.pump()
    assert net.replies("A", b"w") == [p.WriteOk()]
    assert net.control_messages() - before == 4  # REGISTER, REGISTERED, INTRODUCE x2
    for broker, client in (("A", b"near"), ("B", b"far")):
        net.send(broker, client, p.Read(100, 0))
        assert net.replies(broker, client)[-1] == p.ReadOk(b"all of it"), broker


def test_a_writer_waiting_for_its_home_goes_on_when_the_home_is_lost():
    """Its registration is answered by the new home; the readers elsewhere that the new home
    learns of only after that (their brokers register with it in turn) may miss the stream,
    all or none, like readers that came late."""
    net = Cluster("ABC", directory=True)
    net.join_all()
    name = next(b"l%d" % i for i in range(100) if net.home(b"l%d" % i) == "C")
    net.send("B", b"far", p.Input(name))
    net.send("A", b"near", p.Input(name))
    net.send("A", b"w", p.Output(name), pump=False)
    net.send("A", b"w", p.Write(b"x", 0), pump=False)
    net.lose("C")  # the REGISTER, on its way, is lost with its home
    assert net.replies("A", b"w") == [p.OutputOk(), p.WriteOk()]  # not stuck
    net.send("A", b"w", p.Close())
    for client in (b"far", b"far"):
        net.send("B", client, p.Read(100, 0))
    assert net.replies("B", b"far")[1:] in ([p.ReadOk(b"x"), p.ReadEnd()],
                                          [p.ReadEnd(), p.ReadEnd()])


def test_a_cluster_mixing_brokers_with_and_without_the_directory():
    net = Cluster("ABC", directory=True)
    net.add("L", directory=False)
    net.join_all()
    pairs = [(w, r) for w in "ABCL" for r in "ABCL" if w != r]
    for i, (w, r) in enumerate(pairs):
        open_pipe(net, b"m%d" % i, w, r, b"mixed")
        net.send(r, b"r-m%d" % i, p.Read(100, 0))
        assert net.replies(r, b"r-m%d" % i)[-1] == p.ReadOk(b"mixed"), (w, r)
    # the old broker is told of every end (ATTACH), directory brokers of none
    assert net.sent_by_kind[b"ATTACH"] == 3 * 2 * len(pairs) // 2
    assert net.servers["L"].pipes.pipes.keys() == {b"m%d" % i for i in range(len(pairs))}


def test_hostile_directory_messages_are_dropped():
    net = Cluster("AB", directory=True)
    net.join_all()
    b, a = net.servers["B"], net.life("B", "A")
    for frames in ([b"REGISTER"], [b"REGISTER", b"x"], [b"REGISTER", b"r" + b"\0" * 8],
                   [b"UNREGISTER", b"123"], [b"INTRODUCE", b"p", b"A"],
                   [b"INTRODUCE", b"p", b"A", b"z" * 9, b""],
                   [b"INTRODUCE", b"p", b"\xff", b"", b""],
                   [b"REGISTER"] + [b"r" + b"\0" * 8 + b"p"] * (peering.MAX_BATCH + 1)):
        b.peer_receive(a, frames, net.now)
    b.peer_receive("Z", [b"REGISTER", b"r" + b"\0" * 8 + b"p"], net.now)  # not a peer
    assert b.directory.held.entries() == 0
    open_pipe(net, b"ok", "A", "B", b"fine")
    net.send("B", b"r-ok", p.Read(10, 0))
    assert net.replies("B", b"r-ok")[-1] == p.ReadOk(b"fine")


def test_a_home_holds_a_bounded_number_of_entries_per_broker():
    d = Directory(max_per_owner=3)
    assert [d.register("x", "reader", e, b"p") for e in range(3)] == [[], [], []]
    assert d.register("x", "reader", 9, b"p") is None and d.refused == 1
    assert [m.end for m in d.register("y", "writer", 1, b"p")] == [0, 1, 2]
    assert d.drop_owner("x") == 3 and d.entries() == 1


def test_peering_directory_messages_round_trip():
    for msg in (peering.Register((("reader", 1, b"a", False), ("writer", 2**63, b"b" * 255, True))),
                peering.Unregister((1, 2, 3)), peering.Registered((7,)),
                peering.Introduce((peering.Group(b"a", "m1", (("writer", 5),), (1, 2)),
                                   peering.Group(b"b", "m2", (("reader", 6),), ())))):
        assert peering.decode([bytes(f) for f in peering.encode(msg)]) == msg


def test_rendezvous_moves_only_what_the_change_concerns():
    members = [f"m{i}" for i in range(50)]
    names = [b"n%d" % i for i in range(2000)]
    before = {n: home_of(n, members)[1] for n in names}
    after = {n: home_of(n, [*members, "new"])[1] for n in names}
    moved = [n for n in names if before[n] != after[n]]
    assert all(after[n] == "new" for n in moved) and 10 < len(moved) < 80
    gone = {n: home_of(n, members[1:])[1] for n in names}
    assert all(gone[n] == before[n] for n in names if before[n] != "m0")
