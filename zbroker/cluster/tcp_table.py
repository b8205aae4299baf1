"""Who a refused connection came from: the kernel's table of TCP connections (Linux).

libzmq's monitor tells of a handshake our peer socket refused, but names only our own
endpoint, never the peer's (its events name one address: the bound one). The connection it
refused is closed by us first, so the kernel keeps it a while (TIME_WAIT, 60 s on Linux) with
the peer's address: the connections at our port that we closed and that were not there before
are the refused ones. :func:`closed_at` reads them from ``/proc/net/tcp`` and ``tcp6``
(:func:`parse` does the reading of the text, with no I/O); elsewhere nothing is found, and a
refusal is said without its peer.
"""

from __future__ import annotations

import ipaddress

#: states of a connection this host closed first: FIN_WAIT1, FIN_WAIT2, TIME_WAIT, CLOSING
CLOSED_BY_US = frozenset({"04", "05", "06", "0B"})
TABLES = ("/proc/net/tcp", "/proc/net/tcp6")


def _address(text: str) -> tuple[str, int]:
    """``0100007F:1F90`` (the kernel's hex, each 32-bit word in host order) -> ("127.0.0.1",
    8080); an IPv4-mapped IPv6 address as its IPv4 form."""
    host, _, port = text.partition(":")
    raw = bytes.fromhex(host)
    packed = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    address = ipaddress.ip_address(packed)
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return str(address), int(port, 16)


def parse(text: str, port: int) -> set[tuple[str, int]]:
    """The remote (host, port) of the connections at local ``port`` that this host closed
    first, in the text of a /proc/net/tcp table (lines it cannot read are skipped)."""
    found = set()
    needle = f":{port:04X} "
    at = text.find(needle)
    # (only the lines that name the port are read: a host with many connections has a long
    # table, and this is read while a peer is refused, several times a second)
    while at >= 0:
        start = text.rfind("\n", 0, at) + 1
        end = text.find("\n", at)
        end = len(text) if end < 0 else end
        fields = text[start:end].split()
        at = text.find(needle, end)
        if len(fields) < 4 or fields[3] not in CLOSED_BY_US:
            continue
        try:
            if _address(fields[1])[1] == port:
                found.add(_address(fields[2]))
        except ValueError:
            continue
    return found


def closed_at(port: int) -> set[tuple[str, int]]:
    """The remote (host, port) of the connections at local ``port`` this host closed first,
    as the kernel has them now (none where there is no /proc/net/tcp)."""
    found: set[tuple[str, int]] = set()
    for table in TABLES:
        try:
            with open(table) as f:
                found |= parse(f.read(), port)
        except OSError:
            pass
    return found
