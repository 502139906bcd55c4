"""scripts/fallback_eval.py: leave-one-model-out picks of dispatch's untuned rule, scored by each problem's trials.

The database is synthetic: four corpus problems of two tuned models, with records and Optuna studies
whose times are made-up stand-ins for GPU timings, chosen so that each pick of the rule is known.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from types import ModuleType

import optuna
import pytest

from db import Record, Store
from kernels import Config, DeviceInfo, Problem, dispatch
from kernels.gemm import MATMUL
from tuner import corpus
from tuner.search import study_name

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
H200 = DeviceInfo("NVIDIA H200", "h200", "9.0", 132, 232_448)

# Phi-3-mini and DeepSeek-V2-Lite shapes (tuner/corpus.py); transfer distances: P1-Q1 0.585,
# P1-Q2 0.827 (Q1-Q2 are one model, never each other's evidence); P2 is 2 or more from all.
P1, P2 = "bf16:nt:32x3072x3072", "bf16:nt:32x3072x8192"
Q1, Q2 = "bf16:nt:32x3072x2048", "bf16:nt:32x2048x2048"

_TILED = dict(VARIANT="tiled", BLOCK_M=16, BLOCK_N=64, BLOCK_K=256, GROUP_SIZE_M=8, SPLIT_K=1, NUM_SM=132,
              FLATTEN=False, EPILOGUE_SUBTILE=False, num_warps=4, num_stages=5)
TMA = Config.from_dict({**_TILED, "VARIANT": "tma"})  # host-heavy: a fast graph win does not carry to eager
CHEAP = Config.from_dict({**_TILED, "BLOCK_N": 32})  # tiled: the cheap direct launch of host-bound eager calls
MARGINAL = Config.from_dict({**_TILED, "num_stages": 4})  # wins by 3% only


@pytest.fixture(scope="module")
def fallback_eval() -> Iterator[ModuleType]:
    sys.path.insert(0, str(SCRIPTS))
    try:
        import fallback_eval
        yield fallback_eval
    finally:
        sys.path.remove(str(SCRIPTS))


def _record(key: str, mode: str, config: Config | None, time_ms: float, cublas_ms: float) -> Record:
    """A plausible record: ``config`` None means cuBLAS won."""
    problem = Problem.from_key("matmul", key)
    won = {"VARIANT": "cublas"} if config is None else config.as_dict()
    return Record(device_name=H200.name, device_alias=H200.alias, compute_capability=H200.compute_capability,
                  sm_count=H200.sm_count, kernel="matmul", problem_key=key, dtype=problem.dtype,
                  layout=problem.layout, shapes=problem.shapes, config=won,
                  time_ms=time_ms, tflops=problem.flops / (time_ms * 1e-3) / 1e12, cublas_ms=cublas_ms,
                  triton_config=None if config is None else config.as_dict(), triton_ms=time_ms,
                  torch_version="2.11.0", triton_version="3.6.0", cuda_version="12.8", trials=4,
                  created_at=datetime(2026, 11, 24, tzinfo=timezone.utc), mode=mode)


def _study(storage: optuna.storages.RDBStorage, key: str, cublas: dict[str, float],
           trials: list[tuple[Config, float, float]], status: str = "ok") -> None:
    """A quick-tune study: cuBLAS per mode, and (config, eager_ms, graph_ms) per trial. Each config is
    stored with GROUP_SIZE_M=4, as a problem with two rows of 16-row tiles folds it, where the records
    hold the portable 8: the script must compare canonical forms."""
    problem = Problem.from_key("matmul", key)
    study = optuna.create_study(study_name=study_name(H200, problem), storage=storage)
    for mode, ms in cublas.items():
        study.set_user_attr(f"{mode}_cublas_ms", ms)
    for config, eager_ms, graph_ms in trials:
        stored = config.replace(GROUP_SIZE_M=4)
        assert MATMUL.space.canonical(stored, problem) == MATMUL.space.canonical(config, problem)
        study.add_trial(optuna.trial.create_trial(value=graph_ms, user_attrs={
            "config": str(stored), "status": status, "eager_ms": eager_ms, "graph_ms": graph_ms}))


@pytest.fixture
def synthetic_db(db_url: str) -> str:
    """Records and studies of P1, P2 (Phi-3-mini) and Q1, Q2 (DeepSeek-V2-Lite); times in ms, synthetic."""
    models = {e.problem.key: e.model for e in corpus.entries("tuned")}
    assert [models[k] for k in (P1, P2, Q1, Q2)] == ["Phi-3-mini"] * 2 + ["DeepSeek-V2-Lite"] * 2
    with Store(db_url) as store:
        store.put_many([
            _record(P1, "graph", TMA, 0.010, 0.012),  # a clear graph win, but too fast to carry to eager
            _record(P1, "eager", CHEAP, 0.010, 0.015),  # a clear host-bound eager win (cuBLAS 15 us)
            _record(P2, "graph", None, 0.030, 0.030),
            _record(P2, "eager", None, 0.032, 0.032),
            _record(Q1, "graph", None, 0.010, 0.010),
            _record(Q1, "eager", None, 0.015, 0.015),
            _record(Q2, "graph", MARGINAL, 0.0097, 0.010),  # 3%: evidence only at a 2% margin
            _record(Q2, "eager", None, 0.015, 0.015),
        ])
    storage = optuna.storages.RDBStorage(db_url)
    _study(storage, P1, {"eager": 0.015, "graph": 0.012}, [(TMA, 0.020, 0.010), (CHEAP, 0.010, 0.011)])
    _study(storage, P2, {"eager": 0.032, "graph": 0.030}, [(CHEAP, 0.040, 0.035)])
    _study(storage, Q1, {"eager": 0.015, "graph": 0.010}, [(TMA, 0.020, 0.008), (CHEAP, 0.012, 0.009)])
    _study(storage, Q2, {"eager": 0.015, "graph": 0.010}, [(TMA, 0.020, 0.0125), (MARGINAL, 0.016, 0.0097)])
    # A config that failed its check is no timing, however fast it looked.
    failed = optuna.load_study(study_name=study_name(H200, Problem.from_key("matmul", Q1)), storage=storage)
    failed.add_trial(optuna.trial.create_trial(value=0.001, user_attrs={
        "config": str(MARGINAL), "status": "wrong", "eager_ms": 0.001, "graph_ms": 0.001}))
    storage.engine.dispose()
    return db_url


def _run(module: ModuleType, url: str, mode: str, setting) -> dict[str, tuple[str, float | None]]:
    device, entries = module.load_records(module.readonly_url(url), None)
    measured = module.load_measured(module.readonly_url(url), device)
    return {o.problem: (o.source, o.speedup) for o in module.simulate(measured, entries, device, mode, setting)}


def test_shipped_rule_takes_only_the_near_clear_graph_win_and_scores_it_on_the_problems_own_trials(
        fallback_eval, synthetic_db) -> None:
    got = _run(fallback_eval, synthetic_db, "graph", fallback_eval.Setting(0.7, 0.05))
    assert got[Q1] == (f"nearest:{P1}", pytest.approx(0.010 / 0.008))  # TMA from the other model, 0.585 away
    assert all(got[k][0].startswith("cublas") and got[k][1] == 1.0 for k in (P1, P2, Q2))


def test_a_problems_table_holds_no_record_of_its_own_model(fallback_eval, synthetic_db) -> None:
    _, entries = fallback_eval.load_records(fallback_eval.readonly_url(synthetic_db), None)
    assert {key for key, _ in fallback_eval.table_without(entries, "DeepSeek-V2-Lite")} == {P1, P2}
    assert len(fallback_eval.table_without(entries, "DeepSeek-V2-Lite")) == 4  # both modes of each


def test_nearer_limit_below_the_distance_leaves_cublas(fallback_eval, synthetic_db) -> None:
    got = _run(fallback_eval, synthetic_db, "graph", fallback_eval.Setting(0.5, 0.05))
    assert {source.split(":")[0] for source, _ in got.values()} == {"cublas"}


def test_wide_limit_refuses_a_transfer_predicted_to_lose_and_a_small_margin_takes_an_untimed_config(
        fallback_eval, synthetic_db) -> None:
    wide = _run(fallback_eval, synthetic_db, "graph", fallback_eval.Setting(1.0, 0.05))
    # Within reach at 1.0 (0.83 away), but P1's TMA won by 20% on a grid of one wave whose programs walk 12 K
    # steps; on Q2 they walk 8 while cuBLAS's bytes shrink 2.2x: predicted 0.81x (its own trial: 0.8x).
    assert wide[Q2][0].startswith("cublas") and wide[Q2][1] == 1.0
    assert wide[P1][1] == 1.0  # Q2's 3% win is no evidence at 5%
    small = _run(fallback_eval, synthetic_db, "graph", fallback_eval.Setting(1.0, 0.02))
    assert small[P1] == (f"nearest:{Q2}", None)  # P1 never timed MARGINAL: unknown, not 1.0


def test_eager_takes_the_host_bound_win_not_the_host_heavy_graph_win_unless_switched_off(
        fallback_eval, synthetic_db) -> None:
    on = _run(fallback_eval, synthetic_db, "eager", fallback_eval.Setting(0.7, 0.05, host_bound=True))
    assert on[Q1] == (f"eager-near:{P1}", pytest.approx(0.015 / 0.012))
    off = _run(fallback_eval, synthetic_db, "eager", fallback_eval.Setting(0.7, 0.05, host_bound=False))
    assert off[Q1][1] == 1.0 and off[Q1][0].startswith("cublas")
    assert dispatch.HOST_BOUND_MS == 0.04 and dispatch.UNTUNED_NEAR_WEIGHTS == 0.5  # the shipped values are back


def test_summary_counts_picks_losses_and_unknowns_and_oracle_bounds_them(fallback_eval, synthetic_db) -> None:
    url = fallback_eval.readonly_url(synthetic_db)
    device, entries = fallback_eval.load_records(url, None)
    measured = fallback_eval.load_measured(url, device)
    summaries = {s.label: s for s in fallback_eval.evaluate(measured, entries, device, "graph")[0]}
    near = summaries["near 0.7, margin 5%"]
    assert (near.problems, near.triton, near.known, near.unknown, near.under) == (4, 1, 4, 0, 0)
    assert near.geomean == pytest.approx(1.25 ** 0.25)
    shipped = summaries[fallback_eval.SHIPPED.label]  # 0.5: Q1's source, 0.585 away, is too far
    assert shipped.label == "near 0.5, margin 5%" and (shipped.triton, shipped.geomean) == (0, 1.0)
    wide = summaries["near 1, margin 2%"]
    # Q1 takes P1's TMA (1.25x); P1 MARGINAL, untimed there (unknown); Q2 no longer P1's TMA, which ran 0.8x
    # there: its critical path shrinks less than cuBLAS's bytes (dispatch._carried_speedup).
    assert (wide.triton, wide.known, wide.unknown, wide.under) == (2, 3, 1, 0)
    assert [o.problem for o in wide.worst] == [Q1]
    oracle = summaries["oracle (own portfolio)"]
    # Q1's failed 1 us trial is not its best: TMA's 8 us is; P2's trials all lose, so cuBLAS.
    assert oracle.geomean == pytest.approx(math.prod([0.012 / 0.010, 1.0, 0.010 / 0.008, 0.010 / 0.0097]) ** 0.25)
    assert summaries["always cublas"].geomean == 1.0


def test_main_prints_both_modes_writes_json_and_leaves_the_database_as_it_was(
        fallback_eval, synthetic_db, tmp_path, capsys) -> None:
    path = Path(synthetic_db.removeprefix("sqlite:///"))
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    out = tmp_path / "fallback.json"
    assert fallback_eval.main(["--db", synthetic_db, "--json", str(out)]) == 0
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before
    printed = capsys.readouterr().out
    assert "### eager" in printed and "### graph" in printed and "near 0.5, margin 5% (shipped)" in printed
    report = json.loads(out.read_text())
    assert set(report["modes"]) == {"eager", "graph"}
    assert len(report["modes"]["graph"]["summaries"]) == 4 * 3 + 2  # the grid, oracle, always cuBLAS
    assert len(report["modes"]["eager"]["summaries"]) == 4 * 3 * 2 + 2  # host-bound on and off


def test_missing_database_is_an_error_and_no_file_is_created(fallback_eval, tmp_path, capsys) -> None:
    missing = tmp_path / "nowhere" / "tuner.db"
    assert fallback_eval.main(["--db", f"sqlite:///{missing}"]) == 2
    assert "no database at" in capsys.readouterr().err
    assert not missing.exists() and not missing.parent.exists()
