"""The cost model and the fallback policy on synthetic observations whose right answer is known.

The synthetic world: a thin-tile config runs at 0.8x cuBLAS's time up to 64 rows and 1.5x beyond;
a wide-tile config at 1.3x up to 64 rows and 0.9x beyond; a mediocre one at 1.1x everywhere.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from db import Store
from kernels._costmodel import KINDS, CostModel, Observation, fit
from kernels._fallback import choose_fallback
from kernels._spec import BASELINE, Config, Problem

_BASE = dict(GROUP_SIZE_M=8, SPLIT_K=1, NUM_SM=132, FLATTEN=False, EPILOGUE_SUBTILE=False)
THIN = Config.from_dict({**_BASE, "VARIANT": "tiled", "BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 256,
                         "num_warps": 4, "num_stages": 5})
WIDE = Config.from_dict({**_BASE, "VARIANT": "tma", "BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64,
                         "num_warps": 8, "num_stages": 3})
MEH = Config.from_dict({**_BASE, "VARIANT": "tiled", "BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64,
                        "num_warps": 4, "num_stages": 3})


def true_ratio(config: Config, m: int) -> float:
    if config == THIN:
        return 0.8 if m <= 64 else 1.5
    if config == WIDE:
        return 1.3 if m <= 64 else 0.9
    return 1.1


def problem(m: int, n: int, k: int, dtype: str = "fp16") -> Problem:
    return Problem("matmul", dtype, "nt", ((m, n, k),))


def world(modes: tuple[str, ...] = ("graph",)) -> list[Observation]:
    rows = []
    for mode in modes:
        for m in (1, 8, 32, 128, 512, 2048):
            for n, k in ((1024, 1024), (4096, 4096), (1024, 4096)):
                cublas = 1e-6 * m * n * k + 0.01
                rows += [Observation(problem(m, n, k), c, mode, cublas * true_ratio(c, m), cublas)
                         for c in (THIN, WIDE, MEH)]
    return rows


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("m,best", [(16, THIN), (4, THIN), (1024, WIDE), (4096, WIDE)])
def test_rank_puts_the_known_best_config_first_on_an_unseen_problem(kind: str, m: int, best: Config) -> None:
    model = fit(world(), kind=kind)
    ranked = model.rank(problem(m, 2048, 2048), [MEH, THIN, WIDE])
    assert ranked[0][0] == best
    assert [r for _, r in ranked] == sorted(r for _, r in ranked)


@pytest.mark.parametrize("kind", KINDS)
def test_predicted_ratio_is_near_the_truth_between_observed_shapes(kind: str) -> None:
    model = fit(world(), kind=kind)
    assert model.predict_ratio(problem(16, 2048, 2048), THIN) == pytest.approx(0.8, rel=0.15)
    assert model.predict_ratio(problem(1024, 2048, 2048), WIDE) == pytest.approx(0.9, rel=0.15)


def test_cublas_predicts_itself_and_an_unknown_mode_is_refused() -> None:
    model = fit(world(("graph",)))
    assert model.predict_ratio(problem(16, 2048, 2048), BASELINE) == 1.0
    with pytest.raises(KeyError, match="eager"):
        model.predict_ratio(problem(16, 2048, 2048), THIN, "eager")


def test_modes_are_learnt_apart() -> None:
    rows = world(("graph",)) + [Observation(o.problem, o.config, "eager", o.cublas_ms * 2.0, o.cublas_ms)
                                for o in world(("graph",))]
    model = fit(rows)
    assert model.predict_ratio(problem(16, 2048, 2048), THIN, "eager") == pytest.approx(2.0, rel=0.05)
    assert model.predict_ratio(problem(16, 2048, 2048), THIN, "graph") == pytest.approx(0.8, rel=0.15)


@pytest.mark.parametrize("kind", KINDS)
def test_json_round_trip_predicts_the_same(kind: str) -> None:
    model = fit(world(("graph", "eager")), kind=kind)
    again = CostModel.from_json(model.to_json())
    for m in (3, 100, 5000):
        for config in (THIN, WIDE, MEH):
            for mode in ("graph", "eager"):
                assert again.predict_ratio(problem(m, 3000, 1500), config, mode) == pytest.approx(
                    model.predict_ratio(problem(m, 3000, 1500), config, mode), rel=1e-9)


def test_from_json_refuses_another_format_version() -> None:
    with pytest.raises(ValueError, match="refit"):
        CostModel.from_json('{"format": 99, "kind": "knn", "points": {}}')


def test_observation_refuses_a_bad_mode_and_non_positive_times() -> None:
    with pytest.raises(ValueError, match="mode"):
        Observation(problem(1, 2, 3), THIN, "warm", 1.0, 1.0)
    with pytest.raises(ValueError, match="positive"):
        Observation(problem(1, 2, 3), THIN, "graph", 0.0, 1.0)


@pytest.mark.parametrize("time_ms,cublas_ms", [(math.inf, 1.0), (1.0, math.inf), (math.nan, 1.0)])
def test_observation_refuses_non_finite_times(time_ms: float, cublas_ms: float) -> None:
    # One infinite time made every ridge weight NaN, and every prediction with them: the fallback then took
    # a config predicted at NaN, which no comparison with the margin refuses.
    with pytest.raises(ValueError, match="positive, finite times"):
        Observation(problem(1, 2, 3), THIN, "graph", time_ms, cublas_ms)


def test_fallback_is_cublas_where_the_model_predicts_nan() -> None:
    fitted = fit(world(), kind="ridge")
    group = fitted.ridge["graph"]["matmul:nt"]
    broken = CostModel("ridge", fitted.points,
                       {"graph": {"matmul:nt": {**group, "weights": [math.nan] * len(group["weights"])}}})
    assert math.isnan(broken.predict_ratio(problem(1024, 2048, 2048), MEH))
    assert choose_fallback(problem(1024, 2048, 2048), "graph", [MEH, THIN, WIDE], broken) is None


@pytest.mark.parametrize("kind", KINDS)
def test_fp32_observations_do_not_move_a_half_type_prediction(kind: str) -> None:
    # The ridge features told bf16 from fp16 but not fp32 from fp16: fp32 rows 2.5x slower against cuBLAS moved
    # every fp16 prediction by about that (THIN at 16 rows from 0.71x to 1.12x, no longer a win).
    half = world()
    fp32 = [Observation(problem(*o.problem.shape, "fp32"), o.config, o.mode, o.time_ms * 2.5, o.cublas_ms)
            for o in half]
    alone, mixed = fit(half, kind=kind), fit(half + fp32, kind=kind)
    for m in (16, 1024):
        for config in (THIN, WIDE, MEH):
            asked = problem(m, 2048, 2048)
            assert mixed.predict_ratio(asked, config) == pytest.approx(alone.predict_ratio(asked, config), rel=0.05)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("kernel,layout", [("matmul", "nn"), ("gated_matmul", "nt")])
def test_observations_of_another_layout_or_kernel_do_not_move_a_prediction(kind: str, kernel: str, layout: str) -> None:
    # The ridge learner had no feature for the layout or the kernel: nn or gated trials 2.5x slower against cuBLAS
    # moved every nt matmul prediction by about that, where knn counts them infinitely far.
    half = world()
    other = [Observation(Problem(kernel, o.problem.dtype, layout, o.problem.shapes), o.config, o.mode,
                         o.time_ms * 2.5, o.cublas_ms) for o in half]
    alone, mixed = fit(half, kind=kind), fit(half + other, kind=kind)
    for m in (16, 1024):
        for config in (THIN, WIDE, MEH):
            asked = problem(m, 2048, 2048)
            assert mixed.predict_ratio(asked, config) == pytest.approx(alone.predict_ratio(asked, config), rel=1e-6)
    assert math.isinf(alone.predict_ratio(Problem(kernel, "fp16", layout, ((16, 2048, 2048),)), THIN)), \
        "nothing observed of that kernel and layout: nothing to predict from"


def test_a_config_matches_its_observations_whatever_the_order_of_its_values() -> None:
    reordered = Config.from_dict(dict(reversed(list(THIN.as_dict().items()))))
    assert str(reordered) != str(THIN)
    model = fit(world())
    assert model.evidence(problem(32, 1024, 1024), reordered) == 0.0
    assert model.predict_ratio(problem(32, 1024, 1024), reordered) == model.predict_ratio(problem(32, 1024, 1024), THIN)


def test_evidence_is_the_distance_to_the_nearest_observation_of_that_config() -> None:
    model = fit(world())
    assert model.evidence(problem(32, 1024, 1024), THIN) == 0.0
    assert model.evidence(problem(32, 1024, 1024, "bf16"), THIN) == 1.0  # the other half type
    assert model.evidence(Problem("matmul", "fp16", "nn", ((32, 1024, 1024),)), THIN) == math.inf


# ---------------------------------------------------------------------------------------------
# The fallback policy, with candidates read from a real SQLite store of synthetic records
# ---------------------------------------------------------------------------------------------

def _candidates(tmp_path: Path, configs: list[Config]) -> list[Config]:
    """Store one record per config (as tuned winners on other problems), read their configs back."""
    from tests.db_tests.conftest import make_record

    with Store(str(tmp_path / "tuner.db")) as store:
        for i, config in enumerate(configs):
            values = config.as_dict()
            store.put(make_record(m=2 ** i, n=8192, k=8192, config=values, triton_config=values))
        return [Config.from_dict(r.triton_config) for r in store.records(device="h100", kernel="matmul")]


def test_fallback_picks_the_config_predicted_to_win_with_evidence(tmp_path: Path) -> None:
    candidates = _candidates(tmp_path, [MEH, WIDE, THIN])
    model = fit(world())
    assert choose_fallback(problem(16, 2048, 2048), "graph", candidates, model, margin=0.05) == THIN
    assert choose_fallback(problem(1024, 2048, 2048), "graph", candidates, model, margin=0.05) == WIDE


def test_fallback_is_cublas_where_no_config_beats_it_by_the_margin(tmp_path: Path) -> None:
    candidates = _candidates(tmp_path, [MEH, WIDE, THIN])
    model = fit(world())
    # WIDE is predicted 0.9x on large M: a 15% margin asks 0.87x
    assert choose_fallback(problem(1024, 2048, 2048), "graph", candidates, model, margin=0.15) is None
    assert choose_fallback(problem(16, 2048, 2048), "graph", [MEH], model) is None


def test_fallback_is_cublas_without_evidence_near_the_problem(tmp_path: Path) -> None:
    candidates = _candidates(tmp_path, [THIN])
    model = fit(world())
    far = problem(16, 65536, 65536)  # 4 factors of 2 beyond every observation in N and K
    assert model.predict_ratio(far, THIN) < 0.98  # predicted to win by the margin...
    assert choose_fallback(far, "graph", candidates, model, margin=0.02) is None  # ...but nothing measured near
    assert choose_fallback(problem(16, 2048, 2048), "eager", candidates, model) is None  # no eager data


def test_fallback_is_cublas_with_no_records_or_no_model(tmp_path: Path) -> None:
    assert choose_fallback(problem(16, 2048, 2048), "graph", _candidates(tmp_path, []), fit(world())) is None
    assert choose_fallback(problem(16, 2048, 2048), "graph", [THIN], None) is None


def _gemv(block_n: int, block_k: int) -> Config:
    return Config.from_dict({**_BASE, "GROUP_SIZE_M": 1, "VARIANT": "gemv", "BLOCK_M": 16, "BLOCK_N": 32,
                             "BLOCK_K": 32, "GEMV_BLOCK_N": block_n, "GEMV_BLOCK_K": block_k,
                             "num_warps": 4, "num_stages": 2})


@pytest.mark.parametrize("kind", KINDS)
def test_gemv_configs_are_told_apart_by_their_own_blocks(kind: str) -> None:
    # gemv's BLOCK_M/N/K are folded placeholders: the model must see GEMV_BLOCK_N/K and the variant, or every
    # gemv config would look alike, and like a 16x32x32 tiled tile.
    good, poor = _gemv(4, 2048), _gemv(1, 256)
    rows = []
    for n, k in ((1024, 4096), (4096, 4096), (8192, 8192), (2048, 8192)):
        cublas = 1e-6 * n * k + 0.01
        rows += [Observation(problem(1, n, k), good, "graph", cublas * 0.9, cublas),
                 Observation(problem(1, n, k), poor, "graph", cublas * 1.4, cublas),
                 Observation(problem(1, n, k), MEH, "graph", cublas * 1.6, cublas)]
    model = fit(rows, kind=kind)
    ranked = model.rank(problem(1, 6144, 6144), [poor, MEH, good])
    assert ranked[0][0] == good and ranked[0][1] < 0.95
    assert choose_fallback(problem(1, 6144, 6144), "graph", [poor, MEH, good], model) == good


def test_the_epilogue_kernels_row_loop_is_described_by_its_own_blocks_as_gemv_is() -> None:
    """gated_matmul's and matmul_bias's one-row loop has no VARIANT and placeholder BLOCK_M/N/K (16x32x32 in every
    such config): its features are its GEMV_BLOCK_N columns and GEMV_BLOCK_K run, and the gemv variant, so two
    of them that differ only there are not one point to the model."""
    from kernels._costmodel import _config_vector, config_distance, features

    row = dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, GROUP_SIZE_M=1, num_warps=4, num_stages=2)
    narrow = Config.from_dict({**row, "GEMV_BLOCK_N": 2, "GEMV_BLOCK_K": 1024})
    wide = Config.from_dict({**row, "GEMV_BLOCK_N": 8, "GEMV_BLOCK_K": 4096})
    gemv = Config.from_dict({**_BASE, **row, "VARIANT": "gemv", "GEMV_BLOCK_N": 2, "GEMV_BLOCK_K": 1024})
    assert config_distance(narrow, wide) > 0
    assert config_distance(narrow, gemv) == pytest.approx(0.0, abs=0.3)  # GROUP_SIZE_M differs, nothing else
    assert list(_config_vector(narrow)[:3]) == [0.0, 1.0, 10.0]  # log2 of 1 row, 2 columns, 1024 of K
    gated = Problem("gated_matmul", "bf16", "nt", ((1, 4096, 4096),))
    assert (features(gated, narrow) != features(gated, wide)).any()
