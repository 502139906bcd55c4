"""tests/gpu_turn.py with real processes and real file locks: shared holders overlap, a timing test waits for
them and then runs alone, and a test that starts while it waits goes after it."""

from __future__ import annotations

import multiprocessing
import time

from tests.gpu_turn import gpu_turn


def _hold(path: str, alone: bool, seconds: float, stamps, name: str) -> None:
    with gpu_turn(alone, path):
        stamps[name + " in"] = time.monotonic()
        time.sleep(seconds)
        stamps[name + " out"] = time.monotonic()


def _start(ctx, path: str, alone: bool, seconds: float, stamps, name: str):
    process = ctx.Process(target=_hold, args=(path, alone, seconds, stamps, name))
    process.start()
    return process


def _wait_for(stamps, key: str) -> None:
    deadline = time.monotonic() + 20
    while key not in stamps:
        assert time.monotonic() < deadline, f"{key} never came"
        time.sleep(0.01)


def test_a_timing_test_waits_for_the_shared_holders_and_the_next_test_waits_for_it(tmp_path) -> None:
    ctx = multiprocessing.get_context("fork")
    path = str(tmp_path / "gpu.lock")
    with ctx.Manager() as manager:
        stamps = manager.dict()
        first = _start(ctx, path, False, 1.0, stamps, "shared 1")
        second = _start(ctx, path, False, 1.0, stamps, "shared 2")
        _wait_for(stamps, "shared 1 in")
        _wait_for(stamps, "shared 2 in")
        timing = _start(ctx, path, True, 0.5, stamps, "timing")
        time.sleep(0.3)  # the timing test holds the turnstile and waits for the shared lock
        later = _start(ctx, path, False, 0.1, stamps, "later")
        for process in (first, second, timing, later):
            process.join(30)
            assert process.exitcode == 0
        got = dict(stamps)
    # the two shared holders ran at once
    assert got["shared 2 in"] < got["shared 1 out"] and got["shared 1 in"] < got["shared 2 out"], got
    # the timing test ran alone, after both
    assert got["timing in"] >= max(got["shared 1 out"], got["shared 2 out"]), got
    # the test that started while it waited went after it, not beside it
    assert got["later in"] >= got["timing out"], got


def test_a_holder_killed_mid_test_lets_the_gpu_go(tmp_path) -> None:
    ctx = multiprocessing.get_context("fork")
    path = str(tmp_path / "gpu.lock")
    with ctx.Manager() as manager:
        stamps = manager.dict()
        stuck = _start(ctx, path, True, 60.0, stamps, "stuck")
        _wait_for(stamps, "stuck in")
        stuck.kill()
        stuck.join(10)
        after = _start(ctx, path, True, 0.0, stamps, "after")
        after.join(10)
        assert after.exitcode == 0 and "after out" in stamps
