"""Why brokers do not link, as the operator is to be told: handshakes refused (by peer and
cause) and seeds that do not answer. Each is said once, then counted, with a summary at a
bounded rate. No I/O, no clock: the caller passes the time.

A refused handshake is seen on either side of a link:

    ours     a peer connected to our peer socket and we refused it
    theirs   we connected to a peer (a seed, a discovered one) and it refused us

and libzmq says how it failed (an event and a protocol error code), from which
handshake.cause (the libzmq layer's) tells the likely reason: another cluster key, a key on one
side only, or something else.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

ANOTHER_KEY = "another cluster key"
PEER_NO_KEY = "the peer runs without a key (cluster.insecure)"
NO_KEY_HERE = "this broker has no key (cluster.insecure), the peer has one"
KEY_REFUSED = "our key was refused"
NOT_OUR_KEY = "not the cluster key"

OURS, THEIRS = "ours", "theirs"  # who refused: we refused its connection, it refused ours
SUMMARY_EVERY = 60.0  # seconds between summary lines of one refusal or seed
GUESS_WAIT = 2.0  # seconds a guessed cause waits for a sure one before it is said
SEED_GRACE = 3.0  # seconds a seed may take to answer before it is said not to
MAX_REFUSALS = 256  # refusals kept (a flood from many addresses keeps the latest)


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
    told: int = 0  # ``times`` when last said (logged)
    told_at: float | None = None  # when last said; None: not said yet
    corrected: bool = False  # a guess was said, and then another, sure cause came


class Refusals:
    """The refused handshakes, by peer and side. The first of each is to be said at once (one
    whose cause is only guessed, after ``wait`` seconds: a sure cause may come meanwhile, and
    is said instead), the rest counted, and said as a summary at most every ``every``
    seconds. A sure cause that comes after a guess was said is said too."""

    def __init__(self, every: float = SUMMARY_EVERY, wait: float = GUESS_WAIT,
                 limit: int = MAX_REFUSALS) -> None:
        self.every, self.wait, self.limit = every, wait, limit
        self.kept: dict[tuple[str, str], Refusal] = {}
        self.total = {OURS: 0, THEIRS: 0}

    def count(self, side: str, times: int = 1) -> None:
        """Refusals of no known peer: only counted."""
        self.total[side] = self.total.get(side, 0) + times

    def note(self, peer: str, why: str, side: str, now: float, times: int = 1,
             sure: bool = True) -> Refusal | None:
        """``times`` handshakes of ``peer`` refused for ``why`` (``sure``: not a guess): the
        record if it is to be said now, else None (counted)."""
        self.count(side, times)
        key = (peer, side)
        found = self.kept.get(key)
        if found is None:
            found = self.kept[key] = Refusal(peer, why, side, now, now, 0, sure)
            if len(self.kept) > self.limit:
                del self.kept[min(self.kept, key=lambda k: self.kept[k].last)]
        elif sure and not found.sure:  # the cause found: said (again, if the guess was not it)
            if why != found.why:
                found.corrected, found.told_at = found.told_at is not None, None
            found.why, found.sure = why, True
        found.times += times
        found.last = now
        if found.told_at is None and found.sure:
            found.told, found.told_at = found.times, now
            return found
        return None

    def due(self, now: float) -> list[Refusal]:
        """Refusals to be said now: those of a guessed cause not said yet, after ``wait``,
        and those that went on since they were last said, ``every`` after; each is then
        counted as said (``told_at``: the first time, it was None)."""
        out = []
        for refusal in self.kept.values():
            if refusal.told_at is None:
                if now - refusal.since < self.wait:
                    continue
            elif refusal.times <= refusal.told or now - refusal.told_at < self.every:
                continue
            out.append(dataclasses.replace(refusal))  # as it was: told_at says which
            refusal.told, refusal.told_at = refusal.times, now
        return out

    def linked(self, peers: set[str], now: float, quiet: float) -> list[Refusal]:
        """The peers (endpoints or hosts) now linked: their refusals are over once none came
        for ``quiet`` seconds (returned, and forgotten; one that goes on, e.g. of another
        broker on a linked peer's host, is kept, and so not said again)."""
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
    told_at: float | None = None  # when it was last said not to answer


class Seeds:
    """The configured peers (``cluster.peers``): one that does not answer within ``grace`` is
    said so, then again every ``every`` seconds while it still does not, and once more when
    it answers."""

    NOT_ANSWERING, STILL, ANSWERS = "not answering", "still not answering", "answers"

    def __init__(self, endpoints: list[str], now: float, grace: float = SEED_GRACE,
                 every: float = SUMMARY_EVERY) -> None:
        self.grace, self.every = grace, every
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
                    if seed.told_at is not None:
                        out.append((endpoint, self.ANSWERS, seed.since))
                continue
            if endpoint in self._answering:  # it answered, and no longer does
                self._answering.discard(endpoint)
                self._seeds[endpoint] = seed = _Seed(now)
            if seed.told_at is None:
                if now - seed.since >= self.grace:
                    seed.told_at = now
                    out.append((endpoint, self.NOT_ANSWERING, seed.since))
            elif now - seed.told_at >= self.every:
                seed.told_at = now
                out.append((endpoint, self.STILL, seed.since))
        return out

    def retain(self, endpoints: set[str]) -> None:
        """Only these are seeds now (one found to be this broker itself is not)."""
        for endpoint in set(self._seeds) - endpoints:
            del self._seeds[endpoint]
            self._answering.discard(endpoint)

    def __contains__(self, endpoint: str) -> bool:
        return endpoint in self._seeds
