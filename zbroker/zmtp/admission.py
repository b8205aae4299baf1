"""Who a ZMTP endpoint takes, and how many connections the process holds in all.

Every connection is a file descriptor, and libzmq (still used for the broker's management and
cluster sockets) aborts the whole process when it cannot get one. So the process keeps one
:class:`ConnectionBudget` for the connections of every endpoint it serves with ZMTP, below its
open-file limit less a reserve for its own files and sockets (``limits.FD_RESERVE``); a
connection past it is hung up before a byte of it is read, whichever endpoint it came to.
No one source takes it all: a source (a uid on ipc, a host on tcp) holds at most a share of
it (``clients.max_per_source``, half of it by default), so that a local user or a remote host
that floods the broker leaves room for everyone else.

Each endpoint has an :class:`Admission`: the budget, who may connect over ipc (a
:class:`~zbroker.runtime.local_access.Policy`, checked against the kernel's SO_PEERCRED), the time a
connection has to finish its handshake, and its :class:`~zbroker.zmtp.refusals.Refusals`.
The decisions are taken here, without I/O; :mod:`zbroker.zmtp.server` reads the credentials.
"""

from __future__ import annotations

import os
import resource
from collections import OrderedDict
from typing import Any

from zbroker.runtime.limits import FD_RESERVE
from zbroker.runtime.local_access import PeerCredentials, Policy, user_name

#: seconds a connection may take to finish the ZMTP handshake (libzmq's ZMQ_HANDSHAKE_IVL
#: does the same), so that connections that say nothing cannot keep the places of clients
HANDSHAKE_TIMEOUT_S = 10.0
NOT_ALLOWED = "not allowed"
TOO_MANY = "too many clients"
SOURCE_FULL = "too many from one source"
NO_HANDSHAKE = "no handshake"
BROKEN = "protocol error"
TAKING_AGAIN = "taking again"  # not a refusal: the budget's line that refusals stopped
REFUSED_USERS_REMEMBERED = 1024  # uids whose refusal was logged (each is logged once)


def fd_budget() -> int:
    """Connections that fit under the open-file limit now in force, less the reserve."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        return 1 << 20
    return max(soft - FD_RESERVE, 0)


#: a source: ("uid", number) of an ipc peer, ("host", address) of a tcp one
Source = tuple[str, int | str]


class ConnectionBudget:
    """The ZMTP connections of the whole process, every endpoint's together, and their
    limit (at most what the open-file limit leaves: see :func:`fd_budget`); of them, each
    source holds at most ``per_source`` (None: half the limit)."""

    def __init__(self, limit: int | None = None, per_source: int | None = None) -> None:
        self.limit = fd_budget() if limit is None else limit
        self._per_source = per_source
        self.open = 0
        self.by_source: dict[Source, int] = {}

    @property
    def per_source(self) -> int:
        share = self._per_source if self._per_source is not None else self.limit // 2
        return max(1, min(share, self.limit))

    def set_limit(self, limit: int, per_source: int | None = None) -> None:
        """At most ``limit`` connections from now on, ``per_source`` of one source (those
        open above them stay)."""
        self.limit = min(limit, fd_budget())
        self._per_source = per_source

    def take(self, source: Source) -> str | None:
        """Count a connection of ``source`` in, or say why not (TOO_MANY, SOURCE_FULL)."""
        if self.open >= self.limit:
            return TOO_MANY
        held = self.by_source.get(source, 0)
        if held >= self.per_source:
            return SOURCE_FULL
        self.open += 1
        self.by_source[source] = held + 1
        return None

    def give_back(self, source: Source) -> None:
        self.open -= 1
        held = self.by_source[source] - 1
        if held:
            self.by_source[source] = held
        else:
            del self.by_source[source]


#: the process's budget, shared by every endpoint (a process has one open-file limit)
PROCESS_BUDGET = ConnectionBudget()


class Admission:
    """The door of one endpoint. ``what``: whose connections they are, as the log says it
    (``zpipes``, ``pzq producer`` ...). ``policy``: who may connect over ipc (None: anyone
    who can reach the socket)."""

    def __init__(self, what: str, refusals: Any, policy: Policy | None = None,
                 budget: ConnectionBudget | None = None,
                 handshake_timeout: float = HANDSHAKE_TIMEOUT_S, setting: str = "") -> None:
        """``setting``: the config key that says who may connect (told to those refused)."""
        self.what = what
        self.setting = setting
        self.refusals = refusals
        self.policy = policy
        self.budget = PROCESS_BUDGET if budget is None else budget
        self.handshake_timeout = handshake_timeout
        self._full = False  # the budget refused a connection (logged once per episode)
        self._users_logged: OrderedDict[int, None] = OrderedDict()

    def set_policy(self, policy: Policy | None) -> None:
        self.policy = policy
        self._users_logged.clear()

    def admit(self, peer: PeerCredentials | None, source: Source) -> str | None:
        """Take a connection of ``source`` just accepted (then :meth:`release` it when it
        ends), or say why not. ``peer``: who is at the other end of an ipc connection (None
        on tcp)."""
        if peer is not None and self.policy is not None and not self.policy.allows(peer):
            self._refuse_user(peer)
            return NOT_ALLOWED
        why = self.budget.take(source)
        if why == SOURCE_FULL:
            self.refusals.note(SOURCE_FULL, f"{self.what} connection refused: too many "
                               "connections from one source", source=describe(source),
                               max_per_source=self.budget.per_source)
            return why
        if why is not None:
            self._full = True
            self.refusals.note(TOO_MANY, f"{self.what} connection refused: too many clients; "
                               "newer connections are hung up until some go",
                               max_clients=self.budget.limit, open=self.budget.open)
            return TOO_MANY
        if self._full:
            # (at the budget's edge a connection taken and the next refused alternate: this
            # line has a budget too, or the churn would be a flood of it)
            self._full = False
            self.refusals.tell(TAKING_AGAIN, f"{self.what} takes connections again",
                               refused=self.refusals.count(TOO_MANY))
        return None

    def refused(self) -> dict[str, int]:
        """Connections refused or dropped, by reason (every reason, 0 if none)."""
        return {reason: self.refusals.count(reason)
                for reason in (NOT_ALLOWED, TOO_MANY, SOURCE_FULL, NO_HANDSHAKE, BROKEN)}

    def release(self, source: Source) -> None:
        """A connection of ``source`` that :meth:`admit` took has ended."""
        self.budget.give_back(source)

    def _refuse_user(self, peer: PeerCredentials) -> None:
        logged = self._users_logged
        if peer.uid in logged:  # once per user: never a flood of lines
            self.refusals.counts[NOT_ALLOWED] = self.refusals.count(NOT_ALLOWED) + 1
            return
        logged[peer.uid] = None
        if len(logged) > REFUSED_USERS_REMEMBERED:
            logged.popitem(last=False)
        allowed = self.policy.describe() if self.policy is not None else "anyone"
        self.refusals.note(NOT_ALLOWED, f"{self.what} connection refused: user not allowed",
                           peer=peer.describe(), allowed=allowed)

    def not_allowed_reason(self, peer: PeerCredentials) -> str:
        """What a user refused is told: who it is, who may, and which setting says so."""
        allowed = self.policy.describe() if self.policy is not None else "anyone"
        where = f"; the setting {self.setting} says who may" if self.setting else ""
        return (f"user not allowed: {user_name(peer.uid)} (uid {peer.uid}) may not use this "
                f"{self.what} endpoint of a broker run by {user_name(os.getuid())}; allowed: "
                f"{allowed}{where}")

    def no_handshake(self, peer: str) -> None:
        """A connection was dropped: no handshake within the timeout."""
        self.refusals.note(NO_HANDSHAKE, f"{self.what} connection dropped: no ZMTP handshake "
                           f"within {self.handshake_timeout:g} s", level="info", peer=peer)

    def broken(self, peer: str, reason: str) -> None:
        """A connection was dropped: it broke the protocol."""
        self.refusals.note(BROKEN, f"{self.what} connection refused", peer=peer,
                           reason=reason)


def describe(source: Source) -> str:
    kind, who = source
    if kind == "uid":
        return f"uid {who} ({user_name(int(who))})"
    return f"host {who}"
