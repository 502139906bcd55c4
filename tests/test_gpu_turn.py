"""tests/gpu_turn.py with real processes and real file locks: shared holders overlap, a timing test waits for
them and then runs alone, a test that starts while it waits goes after it, and a killed holder lets go. Each
step waits for the state it needs (events, the turnstile's lock), not for a fixed time, so a loaded machine
only makes it slower."""

from __future__ import annotations

import fcntl
import multiprocessing
import time

from tests.gpu_turn import gpu_turn


def _hold(path: str, alone: bool, release, stamps, name: str) -> None:
    with gpu_turn(alone, path):
        stamps[name + " in"] = time.monotonic()
        release.wait(60)
        stamps[name + " out"] = time.monotonic()


def _wait_until(predicate, what: str) -> None:
    deadline = time.monotonic() + 60
    while not predicate():
        assert time.monotonic() < deadline, f"{what} never came"
        time.sleep(0.01)


def _turnstile_held(path: str) -> bool:
    with open(path + ".turnstile", "a") as turnstile:
        try:
            fcntl.flock(turnstile, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(turnstile, fcntl.LOCK_UN)
        return False


def test_a_timing_test_waits_for_the_shared_holders_and_the_next_test_waits_for_it(tmp_path) -> None:
    ctx = multiprocessing.get_context("fork")
    path = str(tmp_path / "gpu.lock")
    with ctx.Manager() as manager:
        stamps, shared_go, timing_go, later_go = manager.dict(), ctx.Event(), ctx.Event(), ctx.Event()
        later_go.set()
        holders = [ctx.Process(target=_hold, args=(path, False, shared_go, stamps, f"shared {i}")) for i in (1, 2)]
        for process in holders:
            process.start()
        _wait_until(lambda: "shared 1 in" in stamps and "shared 2 in" in stamps, "both shared holders")
        timing = ctx.Process(target=_hold, args=(path, True, timing_go, stamps, "timing"))
        timing.start()
        _wait_until(lambda: _turnstile_held(path), "the timing test at the turnstile")
        later = ctx.Process(target=_hold, args=(path, False, later_go, stamps, "later"))
        later.start()
        time.sleep(0.3)
        assert "timing in" not in stamps and "later in" not in stamps, dict(stamps)  # both wait
        shared_go.set()
        _wait_until(lambda: "timing in" in stamps, "the timing test's turn")
        time.sleep(0.3)
        assert "later in" not in stamps, dict(stamps)  # the timing test runs alone
        timing_go.set()
        for process in (*holders, timing, later):
            process.join(60)
            assert process.exitcode == 0
        got = dict(stamps)
    assert got["timing in"] >= max(got["shared 1 out"], got["shared 2 out"]), got
    assert got["later in"] >= got["timing out"], got


def test_a_holder_killed_mid_test_lets_the_gpu_go(tmp_path) -> None:
    ctx = multiprocessing.get_context("fork")
    path = str(tmp_path / "gpu.lock")
    with ctx.Manager() as manager:
        stamps, never, go = manager.dict(), ctx.Event(), ctx.Event()
        go.set()
        stuck = ctx.Process(target=_hold, args=(path, True, never, stamps, "stuck"))
        stuck.start()
        _wait_until(lambda: "stuck in" in stamps, "the holder")
        stuck.kill()
        stuck.join(10)
        after = ctx.Process(target=_hold, args=(path, True, go, stamps, "after"))
        after.start()
        after.join(30)
        assert after.exitcode == 0 and "after out" in stamps
