"""The old name of pzq's Python client, which is the package ``pzq`` now (``pzq.client``):
``from zbroker.pzq.client import Producer`` still works."""

from pzq.client import (  # noqa: F401  (re-exported)
    Consumer,
    Message,
    Producer,
    ProducerError,
    StreamConsumer,
    StreamError,
    StreamMessage,
    StreamRange,
    monitor,
)
