"""scripts/bench_dispatch.py keeps what it measured when a SIGTERM stops it (``timeout``, a GPU session's hard
limit): the rows finished by then, and the name of what stopped it. The measuring is a stand-in here (no GPU to
time on); the signal is a real one, sent to this process."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from kernels import Problem

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import bench_dispatch  # noqa: E402

PROBLEMS = [Problem.from_key("matmul", f"fp16:nt:{m}x64x64") for m in (1, 8, 32, 128)]


def _stand_in(stop_at: int, seen: list[str]):
    """A measure that returns a row per problem and sends this process SIGTERM at its ``stop_at``-th call."""

    def measure_one(problem: Problem) -> dict:
        seen.append(problem.key)
        if len(seen) == stop_at:
            os.kill(os.getpid(), signal.SIGTERM)
        return {"problem": problem.key}

    return measure_one


def test_a_sigterm_keeps_the_rows_finished_before_it_and_names_itself() -> None:
    seen: list[str] = []
    before = signal.getsignal(signal.SIGTERM)
    passes, stopped = bench_dispatch.measure_passes(PROBLEMS, _stand_in(3, seen), passes=1)
    assert stopped == "SIGTERM"
    assert [row["problem"] for row in passes[0]] == [p.key for p in PROBLEMS[:2]]
    assert seen == [p.key for p in PROBLEMS[:3]], "nothing measured after the signal"
    assert signal.getsignal(signal.SIGTERM) is before, "the caller's SIGTERM handler is back"


def test_a_run_with_no_signal_measures_every_problem_in_every_pass() -> None:
    seen: list[str] = []
    passes, stopped = bench_dispatch.measure_passes(PROBLEMS, _stand_in(0, seen), passes=2, pause_s=0)
    assert stopped is None
    assert [[row["problem"] for row in rows] for rows in passes] == [[p.key for p in PROBLEMS]] * 2


def test_a_stop_in_a_later_pass_leaves_that_pass_short() -> None:
    """main() keeps the problems every pass finished (zip of the passes): here the first one."""
    seen: list[str] = []
    passes, stopped = bench_dispatch.measure_passes(PROBLEMS, _stand_in(len(PROBLEMS) + 2, seen), passes=2,
                                                    pause_s=0)
    assert stopped == "SIGTERM"
    assert [len(rows) for rows in passes] == [len(PROBLEMS), 1]
    assert len(list(zip(*passes))) == 1
