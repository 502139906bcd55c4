"""Refresh the tuned tables on a TTL: a daemon thread clears the dispatch caches every ``ttl_s`` seconds,
so a long-running process (an inference server reading a shared PostgreSQL) picks up new winners
without any check on the hot path. After a refresh each call signature pays one cache miss (one
table read per kernel and device, then one resolve per signature).

Off by default: a process that captures CUDA graphs should refresh explicitly (``kernels.clear_cache()``)
between captures instead, so that no table is reloaded while a graph is being captured.
``TUNER_DB_TTL_S`` in the environment turns it on at import; a value that is not a positive, finite
number of seconds leaves it off (the default), with a warning that names the variable and a valid value.
"""

from __future__ import annotations

import logging
import math
import os
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)


class Refresher:
    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        # start and stop from several threads at once (workers each calling refresh_every): without it one joined
        # a thread another had not started yet, or two threads started and one was never stopped.
        self._lock = threading.Lock()

    def start(self, ttl_s: float, clear: Callable[[], None]) -> None:
        """Call ``clear`` every ``ttl_s`` seconds from now on (replacing an earlier TTL)."""
        if not valid_seconds(ttl_s):  # nan or 0 would spin the thread, inf raise OverflowError inside it
            raise ValueError(f"refresh TTL {ttl_s!r} s must be a positive, finite number of seconds; "
                             "pass e.g. 300 (five minutes), or None to stop refreshing")
        with self._lock:
            self._stop_locked()
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._run, args=(ttl_s, clear, self._stop), daemon=True,
                                            name="tuner-refresh")
            self._thread.start()

    def stop(self) -> None:
        with self._lock:
            self._stop_locked()

    def _stop_locked(self) -> None:
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


def valid_seconds(value: object) -> bool:
    """Whether ``value`` can time a background thread's wait: a positive, finite number of seconds that
    ``threading.Event.wait`` accepts (above ``threading.TIMEOUT_MAX`` it raises OverflowError)."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            and 0 < value <= threading.TIMEOUT_MAX)


def env_seconds(name: str, example: str, otherwise: str) -> float | None:
    """The seconds set in environment variable ``name``; None where it is unset, or (with a warning
    that names it, a valid value and ``otherwise``, what happens instead) not a valid duration.

    A warning, not an error: a mistyped tuning knob must not stop the workload importing kernels."""
    text = os.environ.get(name, "").strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if valid_seconds(value):
        return value
    log.warning("%s=%r is not a positive, finite number of seconds; %s. Set e.g. %s=%s", name, text, otherwise,
                name, example)
    return None


def env_ttl_s() -> float | None:
    """``TUNER_DB_TTL_S``: None (no refresh) where it is unset or invalid."""
    return env_seconds("TUNER_DB_TTL_S", "300", "the tables load once (no refresh)")
