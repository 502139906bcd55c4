"""Quick tuning: a portfolio per problem, timed in both modes, both winners stored, every timing kept
as a trial of the problem's study (real SQLite file, real kernels: on the GPU where there is one, else
under the interpreter)."""

from __future__ import annotations

import optuna
import pytest

import kernels
from db import Store
from kernels import Config, Problem
from tuner.quick import default_portfolio, quick_tune
from tuner.search import open_study

PROBLEM = Problem.from_key("matmul", "fp16:nn:16x32x32")
_BASE = dict(VARIANT="tiled", GROUP_SIZE_M=1, SPLIT_K=1, NUM_SM=132, FLATTEN=False, EPILOGUE_SUBTILE=False,
             num_warps=4, num_stages=2)
PORTFOLIO = [Config.from_dict({**_BASE, "BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32}),
             Config.from_dict({**_BASE, "BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32, "num_stages": 3})]
CANONICAL = [kernels.MATMUL.space.canonical(c, PROBLEM) for c in PORTFOLIO]


@pytest.fixture
def device(torch_device) -> kernels.DeviceInfo:
    """Where the kernels run: CPU tensors on a machine with a GPU get no interpreter."""
    return kernels.current_device(torch_device)


def _won(record, device: kernels.DeviceInfo) -> bool:
    """Whether ``record``'s winner is one the contest could pick: a portfolio config, or on a GPU cuBLAS too
    (on the CPU the interpreter's times decide no contest: the best portfolio config is stored)."""
    config = Config.from_dict(record.config)
    if kernels.is_baseline(config):
        return not device.is_cpu
    return kernels.MATMUL.space.canonical(config, PROBLEM) in CANONICAL


def test_quick_tune_stores_a_winner_per_mode_and_keeps_every_timing(db_url, device) -> None:
    with Store(db_url) as store:
        results = quick_tune(kernels.MATMUL, [PROBLEM], device, store, portfolio=lambda p, d: PORTFOLIO)
        assert [r.measured for r in results] == [2]
        stored = {r.mode: r for r in store.records(kernel="matmul")}
        assert set(stored) == {"eager", "graph"}
        assert all(_won(r, device) for r in stored.values())
        study = open_study(optuna.storages.RDBStorage(db_url), device, PROBLEM)
        trials = study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
        assert len(trials) == 2 and all(t.user_attrs["portfolio"] for t in trials)
        assert all(t.user_attrs["graph_ms"] > 0 and t.user_attrs["eager_ms"] > 0 for t in trials)
        assert quick_tune(kernels.MATMUL, [PROBLEM], device, store, portfolio=lambda p, d: PORTFOLIO) == [], \
            "a problem with both winners is not tuned again"
        again = quick_tune(kernels.MATMUL, [PROBLEM], device, store, portfolio=lambda p, d: PORTFOLIO,
                           skip_tuned=False)
        assert [r.measured for r in again] == [0], "configs timed before are not timed again"


def test_default_portfolio_is_valid_and_distinct_for_thin_and_wide_problems() -> None:
    h100 = kernels.DeviceInfo("NVIDIA H100 80GB HBM3", "h100", "9.0", 132, 232448)
    for key in ("bf16:nt:1x4096x4096", "bf16:nt:8192x28672x8192", "fp16:nt:32x576x2048"):
        problem = Problem.from_key("matmul", key)
        configs = default_portfolio(problem, h100)
        assert 8 <= len(configs) == len(set(configs))
        assert all(kernels.MATMUL.space.violation(c, problem, h100) is None for c in configs)


def test_redecide_stores_a_record_per_mode_from_the_candidates_and_cublas(db_url, device) -> None:
    from tuner.quick import redecide

    outside = Config.from_dict({**_BASE, "BLOCK_M": 512, "BLOCK_N": 32, "BLOCK_K": 32})  # too tall: skipped
    records = redecide(kernels.MATMUL, PROBLEM, device, [*PORTFOLIO, PORTFOLIO[0], outside, kernels.BASELINE])
    assert set(records) == {"eager", "graph"}
    for mode, record in records.items():
        assert record.mode == mode and record.problem_key == PROBLEM.key and record.cublas_ms > 0
        assert _won(record, device)
    with Store(db_url) as store:  # what scripts/redecide.py does with them: they are valid records
        store.put_many(list(records.values()), on_conflict="replace")
        assert {r.mode for r in store.records(kernel="matmul")} == {"eager", "graph"}
    only_cublas = redecide(kernels.MATMUL, PROBLEM, device, [kernels.BASELINE, outside])
    assert all(kernels.is_baseline(Config.from_dict(r.config)) for r in only_cublas.values())


@pytest.mark.parametrize("tokens", [2, 16, 64, 4096])
def test_the_portfolio_of_an_moe_problem_is_never_empty_and_thin_for_decode(tokens) -> None:
    """An MoE decode step (a token or two per expert) had no valid seed, so its quick tuning timed nothing."""
    from kernels._spec import DeviceInfo
    from tuner.quick import default_portfolio

    h100 = DeviceInfo("NVIDIA H100 80GB HBM3", "h100", "9.0", 132, 232448)
    spec = kernels.get_kernel("moe_matmul")
    problem = kernels.moe.balanced_problem("bf16", "nt", tokens, 8, 14336, 4096)
    portfolio = default_portfolio(problem, h100)
    assert portfolio and all(spec.space.violation(c, problem, h100) is None for c in portfolio)
    assert spec.default_config(problem, h100) in portfolio
    if tokens <= 64:
        assert any(c["BLOCK_M"] == 16 for c in portfolio), "thin tiles for a stream of weights"
