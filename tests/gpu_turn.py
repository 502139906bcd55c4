"""Whose turn it is on the GPU when pytest-xdist runs the suite in several processes on one GPU machine.

Tests that assert on timings (marked ``timing``) take the GPU alone. The other workers' kernels share the GPU
by time slices, and an eager block timed across another process's slice read 3.4x its twin (H200, 2026-11-29,
torch 2.11.0+cu130, triton 3.6.0, ``pytest -n 8 tests/tuner_tests/test_timing.py tests/kernels_tests``).

Every test holds a shared lock on one file, a timing test an exclusive one. A timing test first takes the
turnstile and keeps it until it ends, and every test passes through the turnstile before its shared lock: the
tests that start after a timing test began to wait queue behind it, rather than keep the shared lock held for
ever between them (flock queues nobody). A process that dies lets its locks go.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from collections.abc import Iterator

LOCK = os.path.join(tempfile.gettempdir(), f"triton-tuner-tests-gpu-{os.getuid()}.lock")


@contextlib.contextmanager
def gpu_turn(alone: bool, path: str = LOCK) -> Iterator[None]:
    """Hold the GPU shared (``alone=False``) or to this process alone until the block ends."""
    with open(path + ".turnstile", "a") as turnstile, open(path, "a") as lock:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        if not alone:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        fcntl.flock(lock, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
            if alone:
                fcntl.flock(turnstile, fcntl.LOCK_UN)
