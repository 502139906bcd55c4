"""scripts/replay.py on a tiny synthetic sweep with a known unique optimum: subspace, counting, targets."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import optuna
import pytest

from kernels import Config, Param, Problem, SearchSpace
from kernels.gemm import MATMUL

optuna.logging.set_verbosity(optuna.logging.WARNING)
pytestmark = pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")

from scripts import replay  # scripts/ is a plain folder; pytest puts the repository root on the path

H100 = replay.DEVICES["NVIDIA H100 80GB HBM3"]
PROBLEM = Problem.from_key("matmul", "fp16:nn:16x4096x4096")
# The optimum; BLOCK_M=32 is invalid for M=16, so the sampler draws invalid configs too, and with one
# row of tiles GROUP_SIZE_M=8 folds to 1 (one tile order), so the sampler draws folded configs too.
OPTIMUM = dict(BLOCK_K=128, num_warps=4, num_stages=4)


def _tiny_space() -> SearchSpace:
    """18 valid tiled configs of PROBLEM (72 points): the dense GEMM's params, constraints and folds."""
    values = dict(VARIANT=("tiled", "splitk"), BLOCK_M=(16, 32), BLOCK_N=(64,), BLOCK_K=(64, 128, 256),
                  GROUP_SIZE_M=(1, 8), SPLIT_K=(1, 2), NUM_SM=(132,), FLATTEN=(False, True),
                  EPILOGUE_SUBTILE=(False,), num_warps=(2, 4), num_stages=(3, 4, 5))
    return dataclasses.replace(MATMUL.space, params=tuple(Param(n, v) for n, v in values.items()))


TINY = dataclasses.replace(MATMUL, space=_tiny_space())


def _time_ms(config: Config) -> float:
    """One minimum, at OPTIMUM, and no ties."""
    return (0.020 + 0.004 * (config["BLOCK_K"] != 128) + 0.002 * abs(config.num_stages - 4)
            + 0.001 * (config.num_warps != 4)
            + 0.0001 * config["BLOCK_K"] / 256)


def _tiled_configs() -> list[Config]:
    return [c for c in TINY.space.enumerate(PROBLEM, H100) if c["VARIANT"] == "tiled"]


def _write_sweep(path: Path, configs: list[Config], failing: list[Config] = ()) -> str:
    rows = [{"config": c.as_dict(), "status": "compile_error" if c in failing else "ok",
             "time_ms": None if c in failing else _time_ms(c), "reason": "boom" if c in failing else ""}
            for c in configs]
    doc = {"kernel": "matmul", "problem": PROBLEM.key, "device": H100.name, "variant": "tiled",
           "space_size": len(configs), "swept": len(rows), "complete": True, "baseline_ms": 0.03,
           "torch": "test", "triton": "test", "date": "2026-11-23", "rows": rows}
    path.write_text(json.dumps(doc))
    return str(path)


@pytest.fixture
def sweep_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A complete sweep of the tiny space's tiled configs, replayed as if it were the GEMM's space."""
    monkeypatch.setattr(replay.kernels, "get_kernel", lambda name: TINY)
    replay.load_sweep.cache_clear()
    replay.sampled_space.cache_clear()
    yield _write_sweep(tmp_path / "sweep.json", _tiled_configs())
    replay.load_sweep.cache_clear()
    replay.sampled_space.cache_clear()


def test_variant_space_fixes_the_variant_and_what_it_ignores() -> None:
    space = replay.variant_space(MATMUL.space, "tiled")
    assert space.names == MATMUL.space.names
    assert space.constraints == MATMUL.space.constraints and space.ignored == MATMUL.space.ignored
    for name, value in dict(VARIANT="tiled", SPLIT_K=1, NUM_SM=132, FLATTEN=False, EPILOGUE_SUBTILE=False).items():
        assert space.param(name).values == (value,)
    assert space.param("BLOCK_K").values == MATMUL.space.param("BLOCK_K").values


def test_random_search_with_the_space_size_as_budget_measures_every_config_and_finds_the_best(sweep_path) -> None:
    size = len(_tiled_configs())
    assert size == 18 and {c["GROUP_SIZE_M"] for c in _tiled_configs()} == {1}
    run = replay.replay(sweep_path, "random", "cold", seed=0, budget=size)
    assert run.measured == run.counted == size, "repeats are answered from the study and do not count"
    assert run.best_fraction == 1.0
    assert all(1 <= trials <= size for trials in run.to_target)
    assert run.to_target[0] <= run.to_target[1]


def test_a_target_never_reached_counts_as_budget_plus_one(sweep_path) -> None:
    run = replay.replay(sweep_path, "random", "cold", seed=1, budget=1)
    assert run.counted == 1 and run.best_fraction < 0.98
    assert run.to_target == (2, 2)


def test_invalid_configs_are_pruned_and_not_counted(sweep_path) -> None:
    run = replay.replay(sweep_path, "random", "cold", seed=1, budget=15)
    assert run.pruned_invalid == 0, "BLOCK_M=32, invalid for M=16, is cut from what the sampler draws"
    assert replay.sampled_space(sweep_path).param("BLOCK_M").values == (16,)
    assert TINY.space.param("BLOCK_M").values == (16, 32)
    assert run.counted == run.measured == 15
    assert run.pruned_not_swept == 0


def test_configs_missing_from_an_incomplete_sweep_are_pruned_and_reported(tmp_path, sweep_path) -> None:
    # A pair of values missing (each value swept in other configs), so that narrowing keeps both.
    partial = _write_sweep(tmp_path / "partial.json",
                           [c for c in _tiled_configs() if c["BLOCK_K"] != 64 or c.num_stages == 5])
    run = replay.replay(partial, "random", "cold", seed=1, budget=10)
    assert run.pruned_not_swept > 0
    assert run.counted == 10


def test_failed_configs_count_as_trials(tmp_path, sweep_path) -> None:
    configs = _tiled_configs()
    optimum = min(configs, key=_time_ms)
    path = _write_sweep(tmp_path / "failing.json", configs, failing=[c for c in configs if c != optimum])
    assert replay.load_sweep(path).results[configs[0]].status == "compile_error"
    run = replay.replay(path, "random", "cold", seed=0, budget=len(configs))
    assert run.measured == run.counted == len(configs), "every failure was one trial of the budget"
    assert run.best_fraction == 1.0


def test_seeded_search_measures_the_kernels_seeds_in_the_subspace_first(sweep_path) -> None:
    warm = replay.warm_configs(replay.load_sweep(sweep_path))
    seed = Config.make(VARIANT="tiled", BLOCK_M=16, BLOCK_N=64, BLOCK_K=256, GROUP_SIZE_M=1, SPLIT_K=1, NUM_SM=132,
                       FLATTEN=False, EPILOGUE_SUBTILE=False, num_warps=4, num_stages=5)
    assert warm == [seed], ("the default (BLOCK_N=128) and the other variants' seeds lie outside the subspace; "
                            "the seed's GROUP_SIZE_M=8 folds to 1")
    run = replay.replay(sweep_path, "random", "seeded", seed=0, budget=1)
    best = min(map(_time_ms, _tiled_configs()))
    assert run.best_fraction == pytest.approx(best / _time_ms(seed))


def test_main_prints_a_table_and_writes_json(tmp_path, sweep_path, capsys) -> None:
    out = tmp_path / "replay.json"
    assert replay.main(["--sweeps", sweep_path, "--seeds", "2", "--budget", "10", "--samplers", "random,tpe",
                        "--jobs", "1", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "| random | cold | 2 |" in text and "| tpe | seeded | 2 |" in text
    report = json.loads(out.read_text())
    assert set(report["sweeps"][0]["summary"]) == {"random/cold", "random/seeded", "tpe/cold", "tpe/seeded"}
    assert report["sweeps"][0]["stats"]["configs_within"] == {"0.98": 1, "0.995": 1}


def test_rows_of_one_launch_are_one_config_timed_by_their_median_and_confirmation_wins(tmp_path, sweep_path) -> None:
    configs = _tiled_configs()
    first, second = configs[0], configs[1]
    rows = [{"config": c.as_dict(), "status": "ok", "time_ms": _time_ms(c), "reason": ""} for c in configs]
    # Three more timings of the first config's launch under GROUP_SIZE_M values that fold to it.
    rows += [{"config": first.replace(GROUP_SIZE_M=8).as_dict(), "status": "ok", "time_ms": t, "reason": ""}
             for t in (0.1, 0.2, 0.3)]
    rows[1]["confirmed_ms"] = rows[1]["time_ms"] * 1.1  # the second config's median over confirmation rounds
    rows[2]["confirmed_ms"] = rows[2]["time_ms"] * 2.0  # a disturbed confirmation (1.15x the search's rule)
    doc = json.loads(Path(sweep_path).read_text())
    doc["rows"] = rows
    path = tmp_path / "folded.json"
    path.write_text(json.dumps(doc))
    sweep = replay.load_sweep(str(path))
    assert len(sweep.results) == len(configs) and sweep.stale == 0
    assert sweep.results[first].time_ms == pytest.approx((0.1 + 0.2) / 2), "median of 4 timings of one launch"
    assert sweep.results[second].time_ms == pytest.approx(_time_ms(second) * 1.1)
    assert sweep.results[configs[2]].time_ms == pytest.approx(_time_ms(configs[2])), "disturbed: not used"


def test_model_warm_start_never_sees_the_replayed_problem() -> None:
    root = Path(__file__).resolve().parents[2] / "benchmarks" / "sweeps"
    target = str(root / "subspaces" / "matmul-fp16-nn-1024x768x512-tiled.json")
    assert replay.model_warm_configs(target, (target,)) == []  # its own sweep is all the data: nothing left
    chosen = replay.model_warm_configs(target, (str(root / "matmul-*.json"),))
    sweep = replay.load_sweep(target)
    assert len(chosen) == len(replay.warm_configs(sweep)) == len(set(chosen))
    assert all(sweep.results[c].ok for c in chosen)
