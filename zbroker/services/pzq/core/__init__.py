"""pzq's cores: every decision of a queue, without I/O (no sockets, files, threads or clocks
of their own). Each takes events and returns what to do (``actions.py``); the server
(``zbroker/services/pzq/server.py``) and the store carry it out. Every module of this package is
held to that by tests/processes/test_pzq_core_imports.py, and to ``mypy --strict``."""
