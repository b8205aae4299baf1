"""A stand-in for Prometheus in the benchmarks: scrapes a metrics endpoint every ``interval``
seconds on a thread, and counts the scrapes (``with Scraper(port): ...``)."""

from __future__ import annotations

import threading
import urllib.request


class Scraper:
    def __init__(self, port: int, interval: float = 1.0) -> None:
        self.url = f"http://127.0.0.1:{port}/metrics"
        self.interval = interval
        self.scrapes = 0
        self.bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Scraper:
        import time

        deadline = time.monotonic() + 10  # the endpoint comes up just after the broker's sockets
        while True:
            try:
                urllib.request.urlopen(self.url, timeout=10).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)

    def _run(self) -> None:
        while True:
            with urllib.request.urlopen(self.url, timeout=10) as r:
                self.bytes += len(r.read())
            self.scrapes += 1
            if self._stop.wait(self.interval):
                return
