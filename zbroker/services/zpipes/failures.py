"""Why a stream or a request failed: the text its client is told, and its kind, a label of
the bounded set FAILURE_KINDS that the metrics count failed ends by. The kind is given where
the failure is made (a lost peer, the budget, a writer gone), and carried with the text; it is
read out of text only for what a peer broker says (its DETACH carries text), at the link. No
I/O."""

from __future__ import annotations

#: the kinds of failure, the label set of failed ends in the metrics
FAILURE_KINDS = ("writer_lost", "peer_lost", "broker_stopping", "chunk_too_large",
                 "buffers_full", "other")

PEER_LOST = "peer lost"
WRITER_LOST = "writer lost: "  # what a reader's failure starts with when a writer broke it


class Failure(str):
    """A failure's text (a ``str``: what its client is told), with its ``kind``."""

    kind: str

    def __new__(cls, text: str, kind: str) -> Failure:
        failure = super().__new__(cls, text)
        failure.kind = kind if kind in FAILURE_KINDS else "other"
        return failure


def kind_of(reason: str) -> str:
    """A failure's kind: its own, or "other" for a text that carries none."""
    kind: str = getattr(reason, "kind", "other")
    return kind


def writer_lost(failure: str) -> Failure:
    """What the readers of a writer whose stream broke with ``failure`` are told: the
    writer was lost, through a lost peer when that is why."""
    return Failure(WRITER_LOST + failure,
                   "peer_lost" if kind_of(failure) == "peer_lost" else "writer_lost")


def peer_lost(label: str) -> Failure:
    """What the ends a lost peer broke are told: which broker, on which host."""
    return Failure(f"{PEER_LOST}: broker {label}" if label else PEER_LOST, "peer_lost")


def from_peer(text: str | None) -> Failure | None:
    """A failure a peer broker tells (a DETACH's), which is text: its kind read from it."""
    if text is None:
        return None
    if text.startswith(PEER_LOST) or text.startswith(WRITER_LOST + PEER_LOST):
        return Failure(text, "peer_lost")
    if text.startswith(WRITER_LOST):
        return Failure(text, "writer_lost")
    if text == BROKER_STOPPING:
        return Failure(text, "broker_stopping")
    return Failure(text, "other")


BROKER_STOPPING = Failure("broker stopping", "broker_stopping")
