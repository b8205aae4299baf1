"""Why brokers do not link, as the operator is to be told: handshakes refused (by peer and
cause) and seeds that do not answer. No I/O, no clock: the caller passes the time.

A refused handshake is seen on either side of a link:

    ours     a peer connected to our peer socket and we refused it
    theirs   we connected to a peer (a seed, a discovered one) and it refused us

and libzmq says how it failed (an event and a protocol error code), from which
handshake.cause (the libzmq layer's) tells the likely reason: another cluster key, a key on one
side only, or something else.

What is kept here is the diagnosis: which peer refused, on which side, for which cause, whether
that cause is sure (libzmq said it) or guessed (the connection only closed), a guess said and
then corrected, how many times and since when (``zbroker status``, the metrics, a client's
hint), and which seeds answer. How often a line of it goes out is not decided here but by the
log budget (zbroker/logs/budget.py, its BUDGET rate): each refusal of a peer said once is
said again, as it comes (AGAIN), and each look at a seed said not to answer that still does
not (STILL), under the budget of its episode (:func:`budget`); the budget lets out the first
line of an episode at once, then one a minute, which says how many it held back. An episode
is a refusal from its first until its peer links (or it is forgotten), a seed's silence from
when it stopped answering until it answers: a new one is a new trouble, said at once. What
ends or corrects an episode (a seed that answers, the sure cause after a guess) is said once
per episode, and needs no budget.

Two waits are kept here, since they decide what is said and not how often:

* GUESS_WAIT: a cause guessed from a closed connection is not said at once, since the sure
  one often comes a moment later (libzmq's event of the other side); said after the wait if
  none came. Saying the guess at once and the cause a moment after would be two lines for one
  trouble, one of them wrong.
* SEED_GRACE: a seed that has not answered yet is not a trouble until it could have: every
  broker starts with its seeds unanswered.
"""

from __future__ import annotations

from dataclasses import dataclass

ANOTHER_KEY = "another cluster key"
PEER_NO_KEY = "the peer runs without a key (cluster.insecure)"
NO_KEY_HERE = "this broker has no key (cluster.insecure), the peer has one"
KEY_REFUSED = "our key was refused"
NOT_OUR_KEY = "not the cluster key"

OURS, THEIRS = "ours", "theirs"  # who refused: we refused its connection, it refused ours
GUESS_WAIT = 2.0  # seconds a guessed cause waits for a sure one before it is said
SEED_GRACE = 3.0  # seconds a seed may take to answer before it is said not to
MAX_REFUSALS = 256  # refusals kept (a flood from many addresses keeps the latest)
#: the log budget's rate of the lines said again (zbroker/logs/budget.py: RATES)
BUDGET = "troubles"
#: what is to be said of a refusal: its first line (at once, or after the guess's wait), the
#: sure cause found after a guess was said, one more of it (under its episode's budget)
FIRST, FOUND, AGAIN = "first", "cause found", "again"


CLOSED = "handshake failed (the connection closed)"


def advice(why: str, key_file: str | None) -> str:
    """What the operator can do about a refusal of cause ``why``."""
    if why == ANOTHER_KEY:
        where = key_file or "the key file"
        return (f"copy {where} from a member of the cluster (or ours to the peer), "
                f"then run zbroker reload on the broker that got the new key")
    if why == PEER_NO_KEY:
        return (f"give the peer the cluster key{f' ({key_file})' if key_file else ''} "
                f"(cluster.key_file), or run every broker without one")
    if why == NO_KEY_HERE:
        return "set cluster.key_file to the cluster's key (and not cluster.insecure)"
    return "see 'zbroker status' on both brokers"


@dataclass
class Refusal:
    """Handshakes of one peer refused, on one side of the link."""

    peer: str  # its endpoint (our link's), or the address it connected from
    why: str
    side: str  # OURS or THEIRS
    since: float
    last: float
    times: int = 0
    sure: bool = True  # ``why`` is what libzmq said, not a guess from a closed connection
    said: bool = False  # its first line was said (a guess waits for its sure cause)
    corrected: bool = False  # a guess was said, and then another, sure cause came


def budget(what: str, since: float) -> str:
    """The log budget of the lines of one episode of a trouble (``what``: a side and a peer,
    or a seed) that began at ``since``: the first line of it goes out at once (another
    episode of the same peer or seed is another trouble), the ones said again at the
    budget's rate."""
    return f"{BUDGET}:{what} {since!r}"


class Refusals:
    """The refused handshakes, by peer and side. The first of each is to be said at once (one
    whose cause is only guessed, after ``wait`` seconds: a sure cause may come meanwhile, and
    is said instead), each one after it again (the log budget bounds how many lines of them go
    out). A sure cause that comes after a guess was said is said too, once."""

    def __init__(self, wait: float = GUESS_WAIT, limit: int = MAX_REFUSALS) -> None:
        self.wait, self.limit = wait, limit
        self.kept: dict[tuple[str, str], Refusal] = {}
        self.total = {OURS: 0, THEIRS: 0}

    def count(self, side: str, times: int = 1) -> None:
        """Refusals of no known peer: only counted."""
        self.total[side] = self.total.get(side, 0) + times

    def note(self, peer: str, why: str, side: str, now: float, times: int = 1,
             sure: bool = True) -> tuple[str, Refusal] | None:
        """``times`` handshakes of ``peer`` refused for ``why`` (``sure``: not a guess): what
        is to be said of it now (FIRST, FOUND or AGAIN) and its record, or None (a guess that
        waits for its sure cause: counted)."""
        self.count(side, times)
        key = (peer, side)
        found = self.kept.get(key)
        what = AGAIN
        if found is None:
            found = self.kept[key] = Refusal(peer, why, side, now, now, 0, sure)
            if len(self.kept) > self.limit:
                del self.kept[min(self.kept, key=lambda k: self.kept[k].last)]
        elif sure and not found.sure:  # the cause found: said (again, if the guess was not it)
            if found.said and why != found.why:
                found.corrected, what = True, FOUND
            found.why, found.sure = why, True
        found.times += times
        found.last = now
        if not found.said:
            if not found.sure:
                return None
            found.said, what = True, FIRST
        return what, found

    def due(self, now: float) -> list[Refusal]:
        """Refusals of a guessed cause whose first line is to be said now, ``wait`` after
        their first (counted as said)."""
        out = []
        for refusal in self.kept.values():
            if not refusal.said and now - refusal.since >= self.wait:
                refusal.said = True
                out.append(refusal)
        return out

    def linked(self, peers: set[str], now: float, quiet: float) -> list[Refusal]:
        """The peers (endpoints or hosts) now linked: their refusals are over once none came
        for ``quiet`` seconds (returned, and forgotten; one that goes on, e.g. of another
        broker on a linked peer's host, is kept, and so not said anew)."""
        over = [r for r in self.kept.values() if r.peer in peers and now - r.last >= quiet]
        for refusal in over:
            del self.kept[(refusal.peer, refusal.side)]
        return over

    def current(self, now: float, within: float) -> list[Refusal]:
        """Refusals seen in the last ``within`` seconds, the oldest first."""
        return sorted((r for r in self.kept.values() if now - r.last <= within),
                      key=lambda r: r.since)


@dataclass
class _Seed:
    since: float  # not answering since
    said: bool = False  # it was said not to answer


class Seeds:
    """The configured peers (``cluster.peers``): one that does not answer within ``grace`` is
    said so, then again at each look while it still does not (the log budget bounds how many
    lines of it go out), and once more when it answers."""

    NOT_ANSWERING, STILL, ANSWERS = "not answering", "still not answering", "answers"

    def __init__(self, endpoints: list[str], now: float, grace: float = SEED_GRACE) -> None:
        self.grace = grace
        self._seeds = {e: _Seed(now) for e in endpoints}
        self._answering: set[str] = set()

    def check(self, answering: set[str], now: float) -> list[tuple[str, str, float]]:
        """What to say of the seeds now: (endpoint, NOT_ANSWERING | STILL | ANSWERS, since),
        ``answering``: the endpoints where a peer answers."""
        out = []
        for endpoint, seed in self._seeds.items():
            if endpoint in answering:
                if endpoint not in self._answering:
                    self._answering.add(endpoint)
                    if seed.said:
                        out.append((endpoint, self.ANSWERS, seed.since))
                continue
            if endpoint in self._answering:  # it answered, and no longer does
                self._answering.discard(endpoint)
                self._seeds[endpoint] = seed = _Seed(now)
            if seed.said:
                out.append((endpoint, self.STILL, seed.since))
            elif now - seed.since >= self.grace:
                seed.said = True
                out.append((endpoint, self.NOT_ANSWERING, seed.since))
        return out

    def retain(self, endpoints: set[str]) -> None:
        """Only these are seeds now (one found to be this broker itself is not)."""
        for endpoint in set(self._seeds) - endpoints:
            del self._seeds[endpoint]
            self._answering.discard(endpoint)

    def __contains__(self, endpoint: str) -> bool:
        return endpoint in self._seeds
