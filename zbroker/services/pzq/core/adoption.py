"""The copies a pzq queue takes over (adopts): a lost origin's messages, held here as
replicas, enter the queue. No I/O.

A copy taken over is written to the queue's log as a new message, with no producer waiting;
the replication core (replication.py) is told :class:`Adopted` once it is written, and only
then drops it from the replica log. A copy may be a message the queue holds already: its
own (come back under another key), or one taken over here before from another holder; then
it is not stored twice, and no claim is made for it (nobody is told to drop anything). Its
new key starts with the first key the message had (wire.adopted_key), so that it is known
when it comes back again; and the first keys of the replicated messages that left the queue
delivered are kept a while, so that a copy of one of them is known as delivered.

:class:`Adoption` keeps that bookkeeping; it reads the queue's messages and ids, changes
neither, and returns the Adopted actions for the queue core (queue.py) to record.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pzq import wire
from zbroker.services.pzq.core.actions import Adopted
from zbroker.services.pzq.core.id_window import IdWindow
from zbroker.services.pzq.core.messages import Message

MAX_DONE_ROOTS = 16_384  # delivered replicated messages known again if taken over later


class Adoption:
    def __init__(self, messages: dict[int, Message], keys: dict[bytes, int], ids: IdWindow):
        """The queue's messages by seq, its seqs by key and its idempotence window."""
        self.messages = messages
        self.keys = keys
        self.ids = ids
        #: seq -> the tokens of the copies it takes over (adopt), each with its Adopted's
        #: claim: Adopted once that seq is written
        self.adopting: dict[int, list[tuple[Any, bool]]] = {}
        #: the first key of each message taken over (wire.root_key) -> its seq here, to know
        #: it when it comes back under another key (entries of messages gone are let go)
        self.roots: dict[bytes, int] = {}
        #: the first keys of the last MAX_DONE_ROOTS replicated messages that left the queue
        #: delivered, oldest first (not kept across a restart)
        self.done_roots: dict[bytes, None] = {}

    def recovered(self, key: bytes, seq: int) -> None:
        """Message ``seq`` was found in the log at start under ``key``."""
        if wire.ADOPTED in key:
            self.roots[wire.root_key(key)] = seq

    def delivered(self, key: bytes) -> None:
        """A replicated message was ACKed by a consumer here: a copy of it taken over later
        is known as delivered (adopt). (Not one a peer said it took: that peer has it.)"""
        done = self.done_roots
        done[wire.root_key(key)] = None
        if len(done) > MAX_DONE_ROOTS:
            del done[next(iter(done))]

    def held(self, msg_id: bytes, copy_key: bytes | None, token: Any, head: int
             ) -> tuple[bool, Adopted | None]:
        """Is the copy ``msg_id`` (its key at its origin ``copy_key``) a message held here,
        or one delivered before? (held, the Adopted to give now, if any): a message held
        but not written yet gives it once it is."""
        prior, claim = self.ids.get(msg_id), True
        if prior is None and copy_key is not None:
            root = wire.root_key(copy_key)
            if root in self.done_roots:  # delivered here before: its origin may drop it
                return True, Adopted(token, True)
            prior, claim = self.keys.get(root), False
            if prior is None and (seq := self.roots.get(root)) is not None:
                m = self.messages.get(seq)
                if m is not None and wire.root_key(m.key) == root:
                    prior = seq
        if prior is None:
            return False, None
        if prior in self.adopting or (prior in self.messages and prior >= head):
            self.adopting.setdefault(prior, []).append((token, claim))
            return True, None
        return True, Adopted(token, True, claim)

    def taking(self, seq: int, key: bytes, token: Any, copied: bool) -> None:
        """The copy ``token`` is to be stored as message ``seq`` under ``key`` (``copied``:
        an adopted key, wire.adopted_key); Adopted once that seq is written."""
        if copied:
            self._keep_root(wire.root_key(key), seq)
        self.adopting[seq] = [(token, True)]

    def written(self, seqs: Iterable[int], ok: bool) -> list[Adopted]:
        """The log wrote these seqs (or failed to): the copies that waited for them."""
        adopting = self.adopting
        return [Adopted(token, ok, claim)
                for seq in seqs for token, claim in adopting.pop(seq, ())]

    def _keep_root(self, root: bytes, seq: int) -> None:
        """Remember ``root`` as message ``seq``'s, letting go of the roots of messages gone
        once they outnumber those held; ``seq`` itself is not in the queue yet, and kept."""
        roots = self.roots
        roots[root] = seq
        if len(roots) > 64 and len(roots) > 2 * len(self.messages):
            held = self.messages
            self.roots = {r: s for r, s in roots.items() if s in held or s == seq}
