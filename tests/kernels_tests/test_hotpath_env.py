"""Durations from the environment: a value that is no valid number of seconds warns, naming the variable
and a valid example, and keeps the default; never a traceback at import or a thread that spins or dies.

Each case imports kernels in a fresh process with the variable set (they are read once, at import).
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

import kernels

ROOT = Path(__file__).resolve().parents[2]
INVALID = ["nan", "inf", "0", "-5", "1e300", "five"]  # 1e300 s is past threading.TIMEOUT_MAX

# Long enough for a flush or refresh thread started with the bad value to fail or spin visibly.
_SETTLE_S = 0.5


def _import_kernels(tmp_path: Path, probe: str, **env: str) -> subprocess.CompletedProcess:
    """Run ``import kernels`` then ``probe`` in a fresh interpreter with ``env`` added."""
    code = f"import time, kernels\ntime.sleep({_SETTLE_S})\n{probe}"
    environ = {**os.environ, "TRITON_INTERPRET": "1", "TUNER_DB": f"sqlite:///{tmp_path / 'tuner.db'}", **env}
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=environ, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("value", INVALID)
def test_invalid_tuner_db_ttl_s_warns_and_leaves_refresh_off(tmp_path: Path, value: str) -> None:
    probe = "print('refreshing' if kernels._REFRESHER._thread is not None else 'off')"
    result = _import_kernels(tmp_path, probe, TUNER_DB_TTL_S=value)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "off"
    assert "TUNER_DB_TTL_S" in result.stderr and "e.g. TUNER_DB_TTL_S=300" in result.stderr
    assert "Traceback" not in result.stderr and "Exception in thread" not in result.stderr


def test_valid_tuner_db_ttl_s_starts_the_refresh(tmp_path: Path) -> None:
    result = _import_kernels(tmp_path, "print(kernels._REFRESHER._thread.is_alive())", TUNER_DB_TTL_S="300")
    assert (result.returncode, result.stdout.strip(), result.stderr) == (0, "True", "")


@pytest.mark.parametrize("value", INVALID)
def test_invalid_tuner_record_flush_s_warns_and_flushes_every_30_s(tmp_path: Path, value: str) -> None:
    probe = ("from kernels._record_mode import RECORDER, env_flush_s\n"
             "print(RECORDER.on, RECORDER._thread.is_alive(), env_flush_s())")
    result = _import_kernels(tmp_path, probe, TUNER_RECORD="1", TUNER_RECORD_FLUSH_S=value)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[:2] == ["True", "True"]
    assert "TUNER_RECORD_FLUSH_S" in result.stderr and "e.g. TUNER_RECORD_FLUSH_S=30" in result.stderr
    assert "Traceback" not in result.stderr and "Exception in thread" not in result.stderr


@pytest.mark.parametrize("ttl_s", [0.0, -1.0, math.nan, math.inf])
def test_refresh_every_refuses_a_ttl_that_is_not_a_positive_finite_number(ttl_s: float) -> None:
    with pytest.raises(ValueError, match="positive, finite number of seconds; pass e.g. 300"):
        kernels.refresh_every(ttl_s)
    assert kernels._REFRESHER._thread is None


def test_refresh_every_from_two_threads_at_once_leaves_one_refresh_thread_that_stop_ends() -> None:
    """Two threads starting the refresh at once (two workers of a server each calling refresh_every) raced in
    Refresher.start: one joined the other's thread before it had started (RuntimeError), or both started one and
    the first was orphaned, clearing the caches for ever after refresh_every(None)."""
    import threading

    from kernels._refresh import Refresher

    errors: list[BaseException] = []
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible: the race shows within a few rounds
    try:
        for _ in range(100):
            refresher, barrier = Refresher(), threading.Barrier(2)

            def start() -> None:
                barrier.wait()
                try:
                    refresher.start(3600.0, lambda: None)
                except BaseException as exc:  # noqa: BLE001 - collected for the assertion below
                    errors.append(exc)

            starters = [threading.Thread(target=start) for _ in range(2)]
            for thread in starters:
                thread.start()
            for thread in starters:
                thread.join()
            refresher.stop()
            left = [t for t in threading.enumerate() if t.name == "tuner-refresh" and t.is_alive()]
            for thread in left:
                thread.join(timeout=1.0)  # stop()'s join has returned: a live one is an orphan, unless it is ending
            assert not errors, errors[0]
            assert not [t for t in left if t.is_alive()], "an orphaned refresh thread outlived stop()"
    finally:
        sys.setswitchinterval(switch)
