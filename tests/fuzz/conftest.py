"""Hypothesis profiles for the fuzz suite, and the time limit that makes a hang a failure.

HYPOTHESIS_PROFILE=ci (the default): few examples per target, derandomized, so CI is fast and repeatable.
HYPOTHESIS_PROFILE=long: twenty times as many, with fresh randomness (docs/RELIABILITY.md has the figures).
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator

from hypothesis import HealthCheck, settings

settings.register_profile("ci", deadline=None, derandomize=True, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
settings.register_profile("long", deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")
settings.load_profile(PROFILE)
SCALE = 20 if PROFILE == "long" else 1


def examples(ci: int) -> int:
    """How many examples a target runs: ``ci`` in CI, twenty times more under the long profile."""
    return ci * SCALE


class Hang(Exception):
    """A fuzz case ran past its time limit: a hang is a failure."""


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise ``Hang`` in this (main) thread if the block runs longer than ``seconds``."""
    def expire(signum, frame):
        raise Hang(f"a fuzz case ran past its {seconds:g} s limit")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
