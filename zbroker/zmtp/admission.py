"""Who a ZMTP endpoint takes, and how many connections the process holds in all.

Every connection is a file descriptor, and libzmq (still used for the broker's management and
cluster sockets) aborts the whole process when it cannot get one. So the process keeps one
:class:`ConnectionBudget` for the connections of every endpoint it serves with ZMTP, below its
open-file limit less a reserve for its own files and sockets (``limits.FD_RESERVE``); a
connection past it is hung up before a byte of it is read, whichever endpoint it came to.

Each endpoint has an :class:`Admission`: the budget, who may connect over ipc (a
:class:`~zbroker.local_access.Policy`, checked against the kernel's SO_PEERCRED), the time a
connection has to finish its handshake, and its :class:`~zbroker.zmtp.refusals.Refusals`.
The decisions are taken here, without I/O; :mod:`zbroker.zmtp.server` reads the credentials.
"""

from __future__ import annotations

import resource
from collections import OrderedDict
from typing import Any

from zbroker.limits import FD_RESERVE
from zbroker.local_access import PeerCredentials, Policy

#: seconds a connection may take to finish the ZMTP handshake (libzmq's ZMQ_HANDSHAKE_IVL
#: does the same), so that connections that say nothing cannot keep the places of clients
HANDSHAKE_TIMEOUT_S = 10.0
NOT_ALLOWED = "not allowed"
TOO_MANY = "too many clients"
NO_HANDSHAKE = "no handshake"
BROKEN = "protocol error"
REFUSED_USERS_REMEMBERED = 1024  # uids whose refusal was logged (each is logged once)


def fd_budget() -> int:
    """Connections that fit under the open-file limit now in force, less the reserve."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        return 1 << 20
    return max(soft - FD_RESERVE, 0)


class ConnectionBudget:
    """The ZMTP connections of the whole process, every endpoint's together, and their
    limit (at most what the open-file limit leaves: see :func:`fd_budget`)."""

    def __init__(self, limit: int | None = None) -> None:
        self.limit = fd_budget() if limit is None else limit
        self.open = 0

    def set_limit(self, limit: int) -> None:
        """At most ``limit`` connections from now on (those open above it stay)."""
        self.limit = min(limit, fd_budget())

    def take(self) -> bool:
        if self.open >= self.limit:
            return False
        self.open += 1
        return True

    def give_back(self) -> None:
        self.open -= 1


#: the process's budget, shared by every endpoint (a process has one open-file limit)
PROCESS_BUDGET = ConnectionBudget()


class Admission:
    """The door of one endpoint. ``what``: whose connections they are, as the log says it
    (``zpipes``, ``pzq producer`` ...). ``policy``: who may connect over ipc (None: anyone
    who can reach the socket)."""

    def __init__(self, what: str, refusals: Any, policy: Policy | None = None,
                 budget: ConnectionBudget | None = None,
                 handshake_timeout: float = HANDSHAKE_TIMEOUT_S) -> None:
        self.what = what
        self.refusals = refusals
        self.policy = policy
        self.budget = PROCESS_BUDGET if budget is None else budget
        self.handshake_timeout = handshake_timeout
        self._full = False  # the budget refused a connection (logged once per episode)
        self._users_logged: OrderedDict[int, None] = OrderedDict()

    def set_policy(self, policy: Policy | None) -> None:
        self.policy = policy
        self._users_logged.clear()

    def admit(self, peer: PeerCredentials | None, ipc: bool) -> str | None:
        """Take a connection just accepted (then :meth:`release` it when it ends), or say
        why not. ``peer``: who is at the other end of an ipc connection (None if the kernel
        could not say: it is gone)."""
        if ipc:
            if peer is None:
                return "gone"
            if self.policy is not None and not self.policy.allows(peer):
                self._refuse_user(peer)
                return NOT_ALLOWED
        if not self.budget.take():
            self._full = True
            self.refusals.note(TOO_MANY, f"{self.what} connection refused: too many clients; "
                               "newer connections are hung up until some go",
                               max_clients=self.budget.limit, open=self.budget.open)
            return TOO_MANY
        if self._full:
            self._full = False
            self.refusals.log.info(f"{self.what} takes connections again",
                                   **self.refusals.context,
                                   refused=self.refusals.count(TOO_MANY))
        return None

    def refused(self) -> dict[str, int]:
        """Connections refused or dropped, by reason (every reason, 0 if none)."""
        return {reason: self.refusals.count(reason)
                for reason in (NOT_ALLOWED, TOO_MANY, NO_HANDSHAKE, BROKEN)}

    def release(self) -> None:
        """A connection :meth:`admit` took has ended."""
        self.budget.give_back()

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

    def no_handshake(self, peer: str) -> None:
        """A connection was dropped: no handshake within the timeout."""
        self.refusals.note(NO_HANDSHAKE, f"{self.what} connection dropped: no ZMTP handshake "
                           f"within {self.handshake_timeout:g} s", level="info", peer=peer)

    def broken(self, peer: str, reason: str) -> None:
        """A connection was dropped: it broke the protocol."""
        self.refusals.note(BROKEN, f"{self.what} connection refused", peer=peer,
                           reason=reason)
