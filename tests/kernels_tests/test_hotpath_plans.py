"""The plan cache against concurrent clears, and ``out=`` on a cuBLAS plan, from real SQLite files.

A clear (``use_database``, ``clear_cache``, the refresh thread) may land while a signature resolves or
while the tuner pins a plan; the plan resolved under the old tables must not outlive it. The other
thread's call is made at the exact point the race needs, from inside the dispatcher's own ``choose``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from _helpers import DEVICE
from test_dispatch import SPLITK, TILED, make_record

import kernels
from db import Store
from kernels import BASELINE, Config, _plans
from kernels.dispatch import DISPATCHER

KEY = "fp16:nn:16x32x64"  # M x N x K of the operands below


def _database(path: Path, config: Config, key: str = KEY) -> str:
    """A SQLite file whose record says ``config`` won ``key`` on this device, in both modes."""
    url = f"sqlite:///{path}"
    device = kernels.current_device(torch.device(DEVICE))
    with Store(url) as store:
        for mode in kernels.MODES:
            store.put(make_record(device, key, config, mode=mode), on_conflict="replace")
    return url


@pytest.fixture
def two_databases(tmp_path: Path) -> tuple[str, str]:
    """(split-K won, tiled won); dispatch reads the first, no shipped table; the default again after."""
    urls = _database(tmp_path / "one.db", SPLITK), _database(tmp_path / "two.db", TILED)
    kernels.use_database(urls[0], use_shipped=False)
    yield urls
    kernels.use_database(None)


def _operands(dtype: torch.dtype = torch.float16) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return (torch.randn(16, 64, generator=g).to(dtype=dtype, device=DEVICE),
            torch.randn(64, 32, generator=g).to(dtype=dtype, device=DEVICE))


def _variant(a: torch.Tensor, b: torch.Tensor) -> str | None:
    plan = _plans.plan_of(a, b, kernels.EAGER)
    return None if plan is None else plan.config.get("VARIANT")


def _once(action: Callable[[], None], choose: Callable) -> Callable:
    """``choose``, that runs ``action`` (another thread's call) after its first answer."""
    done = []

    def racing(*args, **kwargs):
        choice = choose(*args, **kwargs)
        if not done:
            done.append(True)
            action()
        return choice
    return racing


def test_plan_resolved_across_a_database_switch_is_not_kept(two_databases, monkeypatch) -> None:
    one, two = two_databases
    a, b = _operands()
    switch = lambda: kernels.use_database(two, use_shipped=False)  # noqa: E731
    monkeypatch.setattr(DISPATCHER, "choose", _once(switch, DISPATCHER.choose))
    kernels.matmul(a, b)  # resolved split-K from one.db while the switch to two.db landed
    kernels.matmul(a, b)
    assert _variant(a, b) == "tiled"


def test_plan_resolved_across_a_clear_cache_is_served_once_not_kept(two_databases, monkeypatch) -> None:
    a, b = _operands()
    # The refresh thread's clear lands while the call resolves: its plan may predate a new winner.
    monkeypatch.setattr(DISPATCHER, "choose", _once(kernels.clear_cache, DISPATCHER.choose))
    c = kernels.matmul(a, b)
    torch.testing.assert_close(c.float(), a.float() @ b.float(), atol=2e-2, rtol=2e-2)  # fp16 outputs
    assert _plans.plan_of(a, b, kernels.EAGER) is None  # the next call resolves under the new tables


def test_pinning_block_that_spans_a_database_switch_restores_no_stale_plan(two_databases) -> None:
    one, two = two_databases
    a, b = _operands()
    kernels.matmul(a, b)
    assert _variant(a, b) == "splitk"
    with _plans.pinning([TILED], a, b) as (install,):
        install()
        kernels.matmul(a, b)
        kernels.use_database(two, use_shipped=False)  # the refresh thread or another thread, mid-tuning
    assert _plans.plan_of(a, b, kernels.EAGER) is None  # dropped, not the split-K plan of one.db
    kernels.matmul(a, b)
    assert _variant(a, b) == kernels.explain("matmul", kernels.MATMUL.problem_of(a, b)).config["VARIANT"] == "tiled"


def test_pinning_block_without_a_clear_restores_the_plan_before_it(two_databases) -> None:
    a, b = _operands()
    kernels.matmul(a, b)
    before = _plans.plan_of(a, b, kernels.EAGER)
    with _plans.pinning([TILED], a, b) as (install,):
        install()
        kernels.matmul(a, b)
    assert _plans.plan_of(a, b, kernels.EAGER) is before


@pytest.fixture
def cublas_won(tmp_path: Path) -> None:
    """Dispatch reads a file where cuBLAS won the fp32 problem of the operands below."""
    kernels.use_database(_database(tmp_path / "cublas.db", BASELINE, "fp32:nn:16x32x64"), use_shipped=False)
    yield
    kernels.use_database(None)


@pytest.mark.usefixtures("cublas_won")
@pytest.mark.parametrize("shape, dtype", [((4, 4), torch.float32), ((16, 32), torch.float64)], ids=["shape", "dtype"])
def test_out_of_the_wrong_shape_or_dtype_on_a_cublas_plan_raises_as_on_a_triton_plan(shape, dtype) -> None:
    a, b = _operands(torch.float32)
    out = torch.empty(shape, dtype=dtype, device=DEVICE)
    kernels.matmul(a, b)
    assert _plans.plan_of(a, b, kernels.EAGER) is torch.mm
    with pytest.raises((ValueError, TypeError), match="out (has shape|is torch.float64)"):
        kernels.matmul(a, b, out=out)
    assert tuple(out.shape) in ((4, 4), (16, 32))  # not resized


@pytest.mark.usefixtures("cublas_won")
def test_out_of_the_right_shape_on_a_cublas_plan_is_written() -> None:
    a, b = _operands(torch.float32)
    out = torch.empty(32, 16, device=DEVICE).t()  # a transposed view: distinct elements, so the kernels take it too
    assert kernels.matmul(a, b, out=out) is out
    torch.testing.assert_close(out, a @ b)
