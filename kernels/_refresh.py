"""Refresh the tuned tables on a TTL: a daemon thread clears the dispatch caches every ``ttl_s`` seconds,
so a long-running process (an inference server reading a shared PostgreSQL) picks up new winners
without any check on the hot path. After a refresh each call signature pays one cache miss (one
table read per kernel and device, then one resolve per signature).

Off by default: a process that captures CUDA graphs should refresh explicitly (``kernels.clear_cache()``)
between captures instead, so that no table is reloaded while a graph is being captured.
``TUNER_DB_TTL_S`` in the environment turns it on at import.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)


class Refresher:
    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def start(self, ttl_s: float, clear: Callable[[], None]) -> None:
        """Call ``clear`` every ``ttl_s`` seconds from now on (replacing an earlier TTL)."""
        if ttl_s <= 0:
            raise ValueError(f"refresh TTL {ttl_s} s must be positive; pass e.g. 300 (five minutes)")
        self.stop()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ttl_s, clear, self._stop), daemon=True,
                                        name="tuner-refresh")
        self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None

    @staticmethod
    def _run(ttl_s: float, clear: Callable[[], None], stop: threading.Event) -> None:
        while not stop.wait(ttl_s):
            log.debug("refreshing the tuned tables (TTL %.0f s)", ttl_s)
            clear()


REFRESHER = Refresher()


def env_ttl_s() -> float | None:
    text = os.environ.get("TUNER_DB_TTL_S", "").strip()
    if not text:
        return None
    try:
        return float(text)
    except ValueError:
        log.warning("TUNER_DB_TTL_S=%r is not a number of seconds; tables load once", text)
        return None
