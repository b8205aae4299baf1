"""Why hosts do not link, as the cluster core tells it: handshakes refused at our socket and on
our links (troubles.Refusals), each given to the peer it came from, seeds that do not answer
(troubles.Seeds), and what the status and a client's hint say of them. No I/O: the time, the
wall clock and the connections closed at our socket are passed in. Every refusal and every
look at a silent seed is a line; how many of them go out is the log budget's (its
``budget`` field, see troubles.py).
"""

from __future__ import annotations

import collections
import hmac
from collections.abc import Iterable
from typing import Any

from .. import troubles
from ..membership import Contact, Hello, Membership, endpoint_host
from .actions import Action, Clock, Log, LookUpClosed, Then

#: seconds between looks at what to tell of refusals and seeds, and how long a refusal is
#: shown in the status after the last of it
DIAGNOSE_EVERY = 1.0
REFUSAL_SHOWN = 30.0
#: seconds after a refusal at our socket before its peer is looked up (the refusals of that
#: while are looked up at once: a peer may retry ten times a second)
ATTRIBUTE_AFTER = 0.5
ATTRIBUTE_WITHIN = 2.0  # seconds a refusal at our socket may wait for its peer to be found


class Diagnosis:
    """What is known of the refusals and the seeds of one node (``membership``)."""

    def __init__(self, membership: Membership, seeds: Iterable[str], keyed: bool,
                 key_file: str | None, now: float, refusals: troubles.Refusals | None = None,
                 closed: set[tuple[str, int]] | None = None) -> None:
        self.membership = membership
        self.static: set[str] = set(seeds)  # cluster.peers and a join token's seeds
        self.keyed, self.key_file = keyed, key_file
        self.refusals = refusals if refusals is not None else troubles.Refusals()
        self.seeds = troubles.Seeds(sorted(self.static), now)
        #: refusals at our socket (cause, whether sure, when) until their peers are looked up
        self.unattributed: list[tuple[str, bool, float]] = []
        self.looking = False  # a LookUpClosed is asked for
        self.closed_seen: set[tuple[str, int]] = set(closed or ())  # looked at already
        #: seed -> id of the broker that answered there under another endpoint (its host's
        #: other address, a name): its seed answers, though no peer has that endpoint
        self.seed_answered: dict[str, str] = {}

    # --- refusals ------------------------------------------------------------------------------

    def refused(self, peer: str, why: str, side: str, now: float, times: int = 1,
                sure: bool = True) -> list[Action]:
        """``times`` handshakes of ``peer`` refused for ``why``: said (the first time at
        once, or once its guessed cause waited; the next under its episode's budget)."""
        noted = self.refusals.note(peer, why, side, now, times, sure)
        return [self._say_refused(*noted)] if noted is not None else []

    def socket_refused(self, why: str, sure: bool, now: float) -> list[Action]:
        """Our peer socket refused a handshake: which peer it was is looked up soon after (the
        event does not say; see tcp_table.py)."""
        self.unattributed.append((why, sure, now))
        if self.looking:
            return []
        self.looking = True
        return [LookUpClosed(ATTRIBUTE_AFTER)]

    def attribute(self, closed: set[tuple[str, int]], now: float) -> list[Action]:
        """Give the refusals at our socket to the peers whose connections we closed since the
        last look (``closed``: (host, port) of those closed at our port now), one connection
        each. A refusal whose connection is not in the table yet waits for the next look; one
        still not found after ATTRIBUTE_WITHIN is given to no one."""
        self.looking = False
        out: list[Action] = []
        hosts = collections.Counter(host for host, _ in closed - self.closed_seen)
        self.closed_seen = set(closed)
        waiting: list[tuple[str, bool, float]] = []
        for why, sure, when in self.unattributed:
            if not sure:  # the other side closed it first: no trace of it here, counted
                self.refusals.count(troubles.OURS)
                continue
            host = next((h for h, left in hosts.items() if left > 0), None)
            if host is not None:
                hosts[host] -= 1
                out += self.refused(self._peer_at(host), why, troubles.OURS, now)
            elif now - when < ATTRIBUTE_WITHIN:
                waiting.append((why, sure, when))
            else:
                out += self.refused("(address unknown)", why, troubles.OURS, now)
        self.unattributed = waiting
        if waiting:
            self.looking = True
            out.append(LookUpClosed(ATTRIBUTE_AFTER))
        return out

    def _peer_at(self, host: str) -> str:
        """A contact's endpoint on ``host``, if we have one, else the host."""
        for endpoint in self.membership.contacts:
            if endpoint.partition("://")[2].rpartition(":")[0].strip("[]") == host:
                return endpoint
        return host

    def _say_refused(self, what: str, r: troubles.Refusal) -> Log:
        """The line of a refusal: its first (troubles.FIRST), the cause found after a guess
        (FOUND), or one more of it (AGAIN, "still refused", with how many and since when)."""
        event = ("cluster connection" if r.side == troubles.OURS else "cluster link")
        budget = troubles.budget(f"{r.side} {r.peer}", r.since)
        if what == troubles.AGAIN:
            return Log("warning", f"{event} still refused",
                       {"peer": r.peer, "why": r.why, "times": r.times, "since": Then(r.since),
                        "budget": budget})
        fields = {"peer": r.peer, "why": r.why, "fix": troubles.advice(r.why, self.key_file)}
        if what == troubles.FOUND:
            # (once an episode: no budget; a line of its own name, so that the log's repeat
            # rule does not hold it back as a repeat of the guess)
            return Log("warning", f"{event} refused, cause found", fields)
        # (the first of its episode: its budget's first line, the ones after held back)
        return Log("warning", f"{event} refused", {**fields, "budget": budget})

    def dropped_why(self, dropped: list[str]) -> str:
        """Why contacts were given up: their brokers answered but refuse us, or not."""
        refusing = {endpoint_host(r.peer) for r in self.refusals.kept.values()}
        answered = [e for e in dropped if endpoint_host(e) in refusing]
        return ("its broker answered, but the handshake is refused (see zbroker status)"
                if len(answered) == len(dropped) else
                "no broker answered there in time, or more than "
                f"{self.membership.max_pending} were waiting")

    # --- seeds -----------------------------------------------------------------------------------

    def heard_at_seed(self, hello: Hello) -> None:
        """A HELLO that echoes our nonce for a seed comes from the broker that answered
        there, whatever endpoint it says it has (the seed may name its host by another
        address, or by a name)."""
        if not hello.echo:
            return
        for seed in self.static:
            if seed != hello.endpoint and hmac.compare_digest(hello.echo,
                                                              self.membership.nonce(seed)):
                self.seed_answered[seed] = hello.id

    def answering_seeds(self) -> set[str]:
        peers = self.membership.peers
        return {seed for seed, peer in self.seed_answered.items() if peer in peers}

    def unanswered(self) -> list[Contact]:
        """Contacts no peer answers at: not those of a seed a peer answered at under
        another endpoint."""
        answered = self.answering_seeds()
        return [c for c in self.membership.unanswered() if c.endpoint not in answered]

    # --- what is said ----------------------------------------------------------------------------

    def diagnose(self, now: float, wall: float) -> list[Action]:
        """What went on since: refusals of a guessed cause whose wait is over, seeds that do
        not answer (said at each look: under a budget) or answer now. ``wall``: the wall
        clock's time now (seconds since the epoch)."""
        out: list[Action] = []
        up = {p.endpoint for p in self.membership.peers.values()}
        self.refusals.linked(up | {e.partition("://")[2].rpartition(":")[0] for e in up}, now,
                             2 * DIAGNOSE_EVERY)
        out += [self._say_refused(troubles.FIRST, r) for r in self.refusals.due(now)]
        self.seeds.retain(self.static)  # (a seed that is this broker is none)
        for endpoint, what, since in self.seeds.check(up | self.answering_seeds(), now):
            fields: dict[str, Any] = {"seed": endpoint, "since": Clock(wall - (now - since)),
                                      "seconds": round(now - since, 1)}
            if what == troubles.Seeds.ANSWERS:  # (once a silence: no budget)
                out.append(Log("info", "cluster seed answers", fields))
            else:  # not answering, then still not: one episode, one budget
                fields["budget"] = troubles.budget(f"seed {endpoint}", since)
                refused = [r.why for r in self.refusals.current(now, REFUSAL_SHOWN)
                           if r.peer == endpoint]
                fields["why"] = (f"refused: {refused[0]}" if refused else
                                 "no broker of this cluster answers there (is it running? "
                                 "cluster.bind and a firewall on its host?)")
                out.append(Log("warning", f"cluster seed {what}", fields))
        return out

    def status(self, now: float, wall: float) -> dict[str, Any]:
        """For the status: each contact not answering and each peer refused, since when
        (wall clock, seconds since the epoch) and for how long."""
        return {
            "not_answering": [
                {"endpoint": c.endpoint, "since": round(wall - (now - c.since), 3),
                 "seconds": round(now - c.since, 3), "seed": c.endpoint in self.static}
                for c in self.unanswered()],
            "refusals": [
                {"peer": r.peer, "why": r.why, "refused_by": "us" if r.side == troubles.OURS
                 else "the peer", "since": round(wall - (now - r.since), 3),
                 "seconds": round(now - r.since, 3), "times": r.times,
                 "last_s": round(now - r.last, 3)}
                for r in self.refusals.current(now, REFUSAL_SHOWN)],
        }

    def hint(self, now: float) -> str:
        """A line for a client whose wait timed out, when links to other brokers are what
        may be missing: no peers, or peers refused ("" when nothing is wrong here)."""
        current = self.refusals.current(now, REFUSAL_SHOWN)
        # one host, whether named by its address or by its endpoint, is one broker
        hosts = sorted({endpoint_host(r.peer) for r in current})
        named = ", ".join(hosts[:3]) + (f" and {len(hosts) - 3} more" if len(hosts) > 3
                                        else "")
        why = current[0].why if current else ""
        if not self.membership.peers:
            what = "this broker has no peers"
            if hosts:
                what += f"; it and {named} refuse each other ({why})"
        elif hosts:
            what = f"this broker and {named} refuse each other ({why})"
        else:
            return ""
        return f"{what}: see zbroker status"
