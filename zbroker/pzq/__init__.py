"""The old place of pzq in the broker. The service is ``zbroker.services.pzq`` now, beside
ZPIPES, and the Python client the package ``pzq``; what users named here still works:
``from zbroker.pzq.client import Producer`` and ``python -m zbroker.pzq`` (the standalone
queue)."""
