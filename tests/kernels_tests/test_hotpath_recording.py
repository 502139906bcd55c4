"""Record mode's blocks nest, and a call racing a block's start still has its counts written.

Each recording writes into its own real SQLite file; the rows are read back with sqlite3.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from _helpers import DEVICE
from test_dispatch import SPLITK, make_record

import kernels
from db import Store
from kernels._record_mode import RECORDER

KEY = "fp16:nn:16x32x64"  # M x N x K of the operands below


@pytest.fixture
def dispatch_db(tmp_path: Path) -> Iterator[str]:
    """Dispatch reads a file where split-K won KEY (a Triton plan: dispatch resolves, so it records)."""
    url = f"sqlite:///{tmp_path / 'dispatch.db'}"
    with Store(url) as store:
        for mode in kernels.MODES:
            store.put(make_record(kernels.current_device(torch.device(DEVICE)), KEY, SPLITK, mode=mode),
                      on_conflict="replace")
    kernels.use_database(url, use_shipped=False)
    yield url
    kernels.use_database(None)


@pytest.fixture(autouse=True)
def recorder_off() -> Iterator[None]:
    """Leave the process's recorder as found (off), whatever the test left started."""
    if RECORDER.on:
        pytest.skip("TUNER_RECORD=1 records this whole process; these tests start and stop the recorder")
    yield
    while RECORDER.on:
        RECORDER.stop()
    kernels.clear_cache()


def _operands() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return (torch.randn(16, 64, generator=g).half().to(DEVICE),
            torch.randn(64, 32, generator=g).half().to(DEVICE))


def _recorded(path: Path) -> list[tuple[str, int]]:
    """(problem key, calls) rows recorded into the SQLite file at ``path``; none if nothing was written."""
    if not path.exists():
        return []
    with sqlite3.connect(path) as connection:
        tables = {row[0] for row in connection.execute("select name from sqlite_master where type='table'")}
        if "tuner_recorded" not in tables:
            return []
        return connection.execute("select problem_key, calls from tuner_recorded").fetchall()


@pytest.mark.usefixtures("dispatch_db")
def test_recording_block_inside_process_wide_recording_gives_it_back_its_url(tmp_path: Path) -> None:
    a, b = _operands()
    process, block = tmp_path / "process.db", tmp_path / "block.db"
    RECORDER.start(f"sqlite:///{process}")  # what TUNER_RECORD=1 does at import
    kernels.clear_cache()
    kernels.matmul(a, b)
    with kernels.recording(f"sqlite:///{block}"):
        for _ in range(3):
            kernels.matmul(a, b)
    assert RECORDER.on, "the block switched off the process-wide recording"
    assert RECORDER._url == f"sqlite:///{process}"
    kernels.matmul(a, b)
    RECORDER.stop()
    assert _recorded(block) == [(KEY, 3)]
    assert _recorded(process) == [(KEY, 2)]


@pytest.mark.usefixtures("dispatch_db")
def test_nested_recording_blocks_each_write_their_own_calls(tmp_path: Path) -> None:
    a, b = _operands()
    outer, inner = tmp_path / "outer.db", tmp_path / "inner.db"
    with kernels.recording(f"sqlite:///{outer}"):
        kernels.matmul(a, b)
        with kernels.recording(f"sqlite:///{inner}"):
            kernels.matmul(a, b)
            kernels.matmul(a, b)
        assert RECORDER.on
        kernels.matmul(a, b)
    assert not RECORDER.on
    assert _recorded(inner) == [(KEY, 2)]
    assert _recorded(outer) == [(KEY, 2)]


def test_call_that_lands_while_a_recording_block_starts_is_written(dispatch_db: str, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = _operands()
    path = tmp_path / "recorded.db"
    start = RECORDER.start

    def start_after_another_threads_call(*args, **kwargs) -> None:
        kernels.matmul(a, b)  # another thread's call, between the block's clear and its start (before the fix)
        start(*args, **kwargs)

    monkeypatch.setattr(RECORDER, "start", start_after_another_threads_call)
    with kernels.recording(f"sqlite:///{path}"):
        for _ in range(5):
            kernels.matmul(a, b)
    assert _recorded(path) == [(KEY, 5)]


def test_recorder_start_refuses_a_flush_period_that_is_not_a_positive_finite_number() -> None:
    for flush_s in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="flush_s=.*e.g. 30"):
            RECORDER.start(flush_s=flush_s)
    assert not RECORDER.on


def test_a_new_recording_writes_none_of_an_earlier_ones_unwritten_counts(tmp_path: Path) -> None:
    """Calls an ended recording counted but never wrote (here: a problem it never saw resolved, as a CPU call
    with no interpreter) are not written into the next recording's database. Found when this file ran after
    tests/kernels_tests/test_dispatch.py's record-mode test: 2 of its calls landed in this file's database."""
    key = ("a signature", "nobody resolved while the first recording ran")
    first, second = tmp_path / "first.db", tmp_path / "second.db"
    RECORDER.start(f"sqlite:///{first}")
    RECORDER.counts[key] += 2
    RECORDER.stop()
    RECORDER.start(f"sqlite:///{second}")
    RECORDER.seen(key, "matmul", kernels.Problem.from_key("matmul", KEY), kernels.current_device(torch.device(DEVICE)))
    RECORDER.counts[key] += 1
    RECORDER.stop()
    assert _recorded(first) == []
    assert _recorded(second) == [(KEY, 1)]


def _recorded_by_kernel(path: Path) -> list[tuple[str, str, int]]:
    with sqlite3.connect(path) as connection:
        return sorted(connection.execute("select kernel, problem_key, calls from tuner_recorded").fetchall())


def test_recording_counts_every_call_of_the_fused_epilogues(own_database: None, tmp_path: Path) -> None:
    """matmul_bias and gated_matmul are problems dispatch resolves, as matmul's are: each call is counted,
    including those a ready call or addmm's remembered path serves after the first."""
    g = torch.Generator().manual_seed(1)
    a = torch.randn(16, 64, generator=g).half().to(DEVICE)
    b = torch.randn(64, 32, generator=g).half().to(DEVICE)
    bias = torch.randn(32, generator=g).half().to(DEVICE)
    path = tmp_path / "recorded.db"
    with kernels.recording(f"sqlite:///{path}"):
        for _ in range(3):
            kernels.matmul_bias(a, b, bias)
        for _ in range(4):
            kernels.gated_matmul(a, b)
    assert _recorded_by_kernel(path) == [("gated_matmul", "fp16:nn:16x16x64", 4), ("matmul_bias", KEY, 3)]


def test_an_epilogue_call_that_wants_a_gradient_is_counted_once(own_database: None, tmp_path: Path) -> None:
    """With a gradient wanted the call goes through the operator, whose body calls back in: counted once, not
    twice (on a GPU the operator's first call of a signature also runs the graph winner once, which is not the
    workload's call and is not counted: kernels/ops.py ``_warm``)."""
    g = torch.Generator().manual_seed(2)
    a = torch.randn(16, 64, generator=g).half().to(DEVICE).requires_grad_()
    b = torch.randn(64, 32, generator=g).half().to(DEVICE)
    path = tmp_path / "recorded.db"
    with kernels.recording(f"sqlite:///{path}"):
        kernels.gated_matmul(a, b)
    assert _recorded_by_kernel(path) == [("gated_matmul", "fp16:nn:16x16x64", 1)]


def test_the_graph_mode_warm_up_after_a_first_call_is_not_counted(own_database: None, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """On a GPU a signature's first call through the operators runs once more in graph mode, so that a later
    capture finds its graph winner compiled (kernels/ops.py ``_call``). Record mode counts the workload's calls:
    two calls, two counts, though the kernel ran three times. The CPU stands in for a device whose stream
    captures (as tests/kernels_tests/test_compile.py's warm-up tests do), never capturing."""
    from kernels import _modes, ops

    monkeypatch.setattr(ops, "_CAPTURABLE", ("cuda", "cpu"))
    monkeypatch.setattr(ops, "_UNWARMED", set())
    monkeypatch.setattr(_modes, "capturing", lambda: False)
    modes: list[str] = []
    real = kernels._eager.gated_matmul
    monkeypatch.setattr(kernels._eager, "gated_matmul",
                        lambda a, b: modes.append(_modes.current(True)) or real(a, b))  # where the operators look
    g = torch.Generator().manual_seed(3)
    a = torch.randn(16, 64, generator=g).half().to(DEVICE)
    b = torch.randn(64, 32, generator=g).half().to(DEVICE)
    path = tmp_path / "recorded.db"
    with kernels.recording(f"sqlite:///{path}"), torch.no_grad():
        for _ in range(2):
            ops.gated_matmul_call(a, b)
    assert modes == [_modes.EAGER, _modes.GRAPH, _modes.EAGER]  # the warm-up ran
    assert _recorded_by_kernel(path) == [("gated_matmul", "fp16:nn:16x16x64", 2)]
