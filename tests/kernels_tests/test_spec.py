"""The shared values: Config printing and parsing, Problem keys, SearchSpace checks and enumeration,
and the soundness of the kernels' default and seed configs."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch
import triton
import triton.language as tl

from kernels import grouped, moe
from kernels._gemm_triton import _grouped_tile
from kernels._device import CPU
from kernels._spec import (BASELINE, HALF_SIBLING_PENALTY, Config, DeviceInfo, Param, Problem, SearchSpace, is_baseline,
                           parse_shape)
from kernels.gemm import MATMUL, SPACE, default_config, seed_configs

H100 = DeviceInfo(name="NVIDIA H100 80GB HBM3", alias="h100", compute_capability="9.0", sm_count=132,
                  shared_memory_bytes=232_448)
A100 = DeviceInfo(name="NVIDIA A100-SXM4-80GB", alias="a100", compute_capability="8.0", sm_count=108,
                  shared_memory_bytes=166_912)
# The ~99 KiB per-block opt-in limit of A10/A10G/L4/L40/RTX 30xx-40xx cards (and _gpu_info's fallback).
A10 = DeviceInfo(name="NVIDIA A10", alias="a10", compute_capability="8.6", sm_count=72,
                 shared_memory_bytes=101_376)

TILED = dict(VARIANT="tiled", BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, GROUP_SIZE_M=4, SPLIT_K=1, NUM_SM=132,
             FLATTEN=False, EPILOGUE_SUBTILE=False, num_warps=4, num_stages=2)


def _gemm(m: int, n: int, k: int, dtype: str = "fp16", layout: str = "nn") -> Problem:
    return Problem("matmul", dtype, layout, ((m, n, k),))


def _tiled(**changes) -> Config:
    return Config.from_dict({**TILED, **changes})


# ------------------------------------------------------------------------------------------------ Config

@pytest.mark.parametrize("config", [
    Config.make(BLOCK_M=128, BLOCK_N=64, BLOCK_K=64, GROUP_SIZE_M=8, num_warps=4, num_stages=3),
    _tiled(),
    _tiled(VARIANT="tma", FLATTEN=True, EPILOGUE_SUBTILE=True, NUM_SM=66),
    BASELINE,
    Config.make(num_warps=8, num_stages=5),
])
def test_config_parses_back_from_its_printed_form(config: Config) -> None:
    assert Config.parse(str(config)) == config
    assert str(Config.parse(str(config))) == str(config)


def test_config_prints_like_triton_config() -> None:
    config = Config.make(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=4)
    assert str(config) == "BLOCK_M: 128, BLOCK_N: 64, num_warps: 8, num_stages: 4"


def test_config_parse_keeps_value_types() -> None:
    config = Config.parse("VARIANT: splitk, FLATTEN: False, EPILOGUE_SUBTILE: True, BLOCK_M: 16, num_warps: 2")
    assert config["VARIANT"] == "splitk"
    assert config["FLATTEN"] is False and config["EPILOGUE_SUBTILE"] is True
    assert config["BLOCK_M"] == 16 and isinstance(config["BLOCK_M"], int)
    assert config.num_warps == 2 and config.num_stages == 3  # Triton's default where not given


def test_config_parse_rejects_item_without_colon() -> None:
    with pytest.raises(ValueError, match="NAME: VALUE"):
        Config.parse("BLOCK_M: 16, BLOCK_N 32")


def test_config_equality_and_hash_ignore_parameter_order() -> None:
    a = Config.make(BLOCK_M=16, BLOCK_N=32, num_warps=2)
    b = Config.make(num_warps=2, BLOCK_N=32, BLOCK_M=16)
    assert a == b and hash(a) == hash(b)
    assert len({a, b}) == 1
    assert a != a.replace(BLOCK_M=32)


def test_config_round_trips_through_dict() -> None:
    config = _tiled(VARIANT="splitk", SPLIT_K=3, num_warps=8, num_stages=5)
    values = config.as_dict()
    assert values["num_warps"] == 8 and values["num_stages"] == 5 and values["SPLIT_K"] == 3
    assert Config.from_dict(values) == config
    values["BLOCK_M"] = 999  # as_dict hands out a copy
    assert config["BLOCK_M"] == 16


def test_config_from_dict_defaults_launch_options() -> None:
    config = Config.from_dict({"BLOCK_M": 64})
    assert (config.num_warps, config.num_stages) == (4, 3)


def test_config_missing_parameter_error_lists_the_ones_it_has() -> None:
    with pytest.raises(KeyError, match="no parameter 'SPLIT_K'; it has BLOCK_N, num_warps"):
        Config.make(BLOCK_N=32)["SPLIT_K"]
    assert Config.make(BLOCK_N=32).get("SPLIT_K", 1) == 1


def test_baseline_is_recognised_only_for_cublas_variant() -> None:
    assert is_baseline(BASELINE) and is_baseline(Config.from_dict({"VARIANT": "cublas"}))
    assert not is_baseline(_tiled())
    assert MATMUL.outside(BASELINE) is None  # cuBLAS may be stored though it is no point of the space


# ----------------------------------------------------------------------------------------------- Problem

@pytest.mark.parametrize("kernel, key", [
    ("matmul", "fp16:nn:16x4096x4096"),
    ("matmul", "fp32:tt:0x1x7"),
    ("matmul", "bf16:nt:1x1x1"),
    ("grouped_matmul", "fp16:nn:16x32x32+8x16x32+0x16x16"),
])
def test_problem_key_round_trips(kernel: str, key: str) -> None:
    problem = Problem.from_key(kernel, key)
    assert problem.key == key
    assert Problem.from_key(kernel, problem.key) == problem
    assert problem.kernel == kernel


def test_grouped_key_keeps_every_shape_in_order() -> None:
    problem = Problem.from_key("grouped_matmul", "fp16:nt:16x32x32+8x16x32")
    assert problem.shapes == ((16, 32, 32), (8, 16, 32))
    assert problem.flops == 2 * (16 * 32 * 32 + 8 * 16 * 32)
    with pytest.raises(ValueError, match="2 GEMMs"):
        problem.shape


@pytest.mark.parametrize("key", ["fp16:nn", "fp16:nn:16x32", "fp16:nn:16x32xq", "fp16:nn:1x2x3:4", "fp16:nn:-1x2x3"])
def test_malformed_problem_key_names_the_form(key: str) -> None:
    with pytest.raises(ValueError, match="DTYPE:LAYOUT:MxNxK"):
        Problem.from_key("matmul", key)


@pytest.mark.parametrize("dtype, layout, shapes, message", [
    ("fp64", "nn", ((1, 1, 1),), "fp16, bf16, fp32"),
    ("fp16", "nx", ((1, 1, 1),), "'n'/'t'"),
    ("fp16", "nnn", ((1, 1, 1),), "two letters"),
    ("fp16", "nn", (), "one or more"),
    ("fp16", "nn", ((1, -1, 1),), ">= 0"),
])
def test_problem_rejects_bad_fields_with_the_allowed_values(dtype, layout, shapes, message) -> None:
    with pytest.raises(ValueError, match=message):
        Problem("matmul", dtype, layout, shapes)


def test_parse_shape_reads_mxnxk() -> None:
    assert parse_shape("4096x4096x512") == (4096, 4096, 512)
    assert parse_shape("16X32X0") == (16, 32, 0)


@pytest.mark.parametrize("text", ["16x32", "16x32x32x1", "axbxc", "16x-1x32", "", "16*32*32"])
def test_parse_shape_error_names_the_wanted_form(text: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_shape(text)
    assert "MxNxK" in str(info.value) and repr(text) in str(info.value)


def test_problem_bytes_moved_counts_each_operand_once() -> None:
    assert _gemm(2, 3, 4).bytes_moved(2) == (2 * 4 + 4 * 3 + 2 * 3) * 2


# ------------------------------------------------------------------------------------------- SearchSpace

SMALL = SearchSpace(
    params=(Param("VARIANT", ("a", "b")), Param("X", (1, 2, 3)), Param("Y", (10, 20)), Param("num_warps", (4,)),
            Param("num_stages", (2,))),
    constraints=(lambda c, p, d: "X=3 is too big" if c["X"] == 3 else None,),
    ignored={"VARIANT": {"a": {"Y": 10}}},
)


def test_outside_names_unknown_missing_and_disallowed_parameters() -> None:
    assert SMALL.outside(Config.make(VARIANT="a", X=1, Y=10, num_warps=4, num_stages=2)) is None
    assert "unknown parameter(s) Z" in SMALL.outside(Config.make(VARIANT="a", X=1, Y=10, Z=0, num_warps=4,
                                                                 num_stages=2))
    assert "parameter Y is missing" in SMALL.outside(Config.make(VARIANT="a", X=1, num_warps=4, num_stages=2))
    reason = SMALL.outside(Config.make(VARIANT="a", X=7, Y=10, num_warps=4, num_stages=2))
    assert "X=7" in reason and "1, 2, 3" in reason
    assert "num_warps=8" in SMALL.outside(Config.make(VARIANT="a", X=1, Y=10, num_warps=8, num_stages=2))


def test_violation_reports_constraint_reason_after_membership() -> None:
    problem = _gemm(1, 1, 1)
    assert SMALL.violation(Config.make(VARIANT="b", X=3, Y=20, num_warps=4, num_stages=2), problem, CPU) \
        == "X=3 is too big"


def test_canonical_folds_parameters_the_switch_ignores() -> None:
    folded = SMALL.canonical(Config.make(VARIANT="a", X=1, Y=20, num_warps=4, num_stages=2))
    assert folded["Y"] == 10
    kept = Config.make(VARIANT="b", X=1, Y=20, num_warps=4, num_stages=2)
    assert SMALL.canonical(kept) is kept


def test_enumerate_lists_each_valid_canonical_config_once() -> None:
    configs = list(SMALL.enumerate(_gemm(1, 1, 1), CPU))
    # a: X in {1, 2} with Y folded; b: X in {1, 2} times Y in {10, 20}
    assert len(configs) == 6 == len(set(configs))
    assert all(c["X"] != 3 for c in configs)
    assert all(c["Y"] == 10 for c in configs if c["VARIANT"] == "a")


def test_gemm_tiled_canonical_folds_split_k_and_tma_options() -> None:
    config = _tiled(SPLIT_K=4, NUM_SM=66, FLATTEN=True, EPILOGUE_SUBTILE=True)
    canonical = SPACE.canonical(config)
    assert canonical == _tiled()
    assert SPACE.canonical(_tiled(VARIANT="splitk", SPLIT_K=4))["SPLIT_K"] == 4
    assert SPACE.canonical(_tiled(VARIANT="tma", SPLIT_K=4))["SPLIT_K"] == 1


def test_gemm_enumerate_yields_only_valid_canonical_distinct_configs() -> None:
    problem = _gemm(16, 32, 64)
    configs = list(SPACE.enumerate(problem, CPU))
    assert configs, "a small problem must leave some configs"
    assert len(configs) == len(set(configs))
    for config in configs:
        assert SPACE.violation(config, problem, CPU) is None, config
        assert SPACE.canonical(config) == config
    assert {c["VARIANT"] for c in configs} == {"tiled", "splitk", "tma"}


def test_enumerated_configs_are_the_ones_from_dict_builds() -> None:
    # enumerate builds its configs without from_dict (it makes ~150,000 for a matmul problem): each must print,
    # compare and hash as from_dict's, launch options defaulted where the space has none.
    problem = _gemm(16, 32, 64)
    for space in (SPACE, SMALL):
        for config in space.enumerate(problem, CPU):
            again = Config.from_dict(config.as_dict())
            assert str(again) == str(config) and again == config and hash(again) == hash(config)
            assert type(config.num_warps) is int and type(config.num_stages) is int
    assert {c.num_stages for c in SMALL.enumerate(problem, CPU)} == {2}  # the space's own value
    bare = SearchSpace(params=(Param("X", (1, 2)),))
    assert [(c.num_warps, c.num_stages) for c in bare.enumerate(problem, CPU)] == [(4, 3)] * 2  # Triton's defaults


def test_gemm_rules_out_tiles_larger_than_the_problem() -> None:
    problem = _gemm(16, 32, 32)
    reason = SPACE.violation(_tiled(BLOCK_M=64), problem, CPU)
    assert reason and "BLOCK_M=64" in reason
    assert "BLOCK_K=64" in SPACE.violation(_tiled(BLOCK_K=64), problem, CPU)
    # The smallest block is never ruled out, however small the problem.
    assert SPACE.violation(_tiled(), _gemm(1, 1, 1), CPU) is None


def test_gemm_rules_out_shared_memory_overflow() -> None:
    tiny = DeviceInfo(name="tiny", alias="tiny", compute_capability="9.0", sm_count=8, shared_memory_bytes=16_384)
    problem = _gemm(128, 128, 128)
    big = _tiled(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_warps=8, num_stages=4)
    assert SPACE.violation(big, problem, H100) is None
    reason = SPACE.violation(big, problem, tiny)
    assert reason and "shared memory" in reason and "16 KiB" in reason
    assert all(SPACE.violation(c, problem, tiny) is None for c in SPACE.enumerate(_gemm(16, 32, 32), tiny))


def test_gemm_rules_out_register_spills() -> None:
    reason = SPACE.violation(_tiled(BLOCK_M=256, BLOCK_N=256, BLOCK_K=32, num_warps=2), _gemm(256, 256, 32), H100)
    assert reason and "spill" in reason


@pytest.mark.parametrize("changes, problem, device, message", [
    (dict(VARIANT="splitk", SPLIT_K=1), _gemm(16, 32, 128), CPU, "SPLIT_K >= 2"),
    (dict(VARIANT="splitk", SPLIT_K=8), _gemm(16, 32, 128), CPU, "K blocks"),
    (dict(VARIANT="tma"), _gemm(32, 64, 47), CPU, "16-byte aligned"),
    (dict(VARIANT="tma"), _gemm(32, 64, 48, layout="tn"), CPU, "row-major A"),
    (dict(VARIANT="tma"), _gemm(32, 64, 48), A100, "compute capability"),
    (dict(VARIANT="tma", NUM_SM=264), _gemm(4096, 4096, 4096), DeviceInfo("NVIDIA L4", "l4", "9.0", 58, 101_376),
     "NUM_SM=264"),
])
def test_gemm_variant_constraints_explain_themselves(changes, problem, device, message) -> None:
    reason = SPACE.violation(_tiled(**changes), problem, device)
    assert reason and message in reason


def test_gemm_tma_allowed_on_aligned_row_major_problem() -> None:
    assert SPACE.violation(_tiled(VARIANT="tma", NUM_SM=32), _gemm(32, 64, 48), CPU) is None
    assert SPACE.violation(_tiled(VARIANT="tma", NUM_SM=132), _gemm(32, 64, 48, layout="nt"), H100) is None


def _random_problems(kernel: str, count: int, seed: int):
    rng = random.Random(seed)
    dims = lambda: rng.choice([0, 1, 2, 3, 15, 16, 17, rng.randint(0, 300), rng.randint(0, 9000)])  # noqa: E731
    for _ in range(count):
        if kernel == "matmul":
            shapes = ((dims(), dims(), dims()),)
            dtype = rng.choice(["fp16", "bf16", "fp32"])
        else:
            shapes = tuple((dims(), dims(), dims()) for _ in range(rng.randint(1, 5)))
            dtype = rng.choice(["fp16", "bf16"])
        yield Problem(kernel, dtype, rng.choice(["nn", "nt", "tn", "tt"]), shapes)


@pytest.mark.parametrize("device", [CPU, H100, A100], ids=lambda d: d.alias)
def test_gemm_default_config_is_valid_for_random_problems(device: DeviceInfo) -> None:
    for problem in _random_problems("matmul", 400, seed=1):
        config = default_config(problem, device)
        assert SPACE.violation(config, problem, device) is None, (problem.key, str(config))
        assert SPACE.canonical(config) == config


def test_gemm_default_config_fits_shared_memory_of_a10_class_gpus() -> None:
    problem = _gemm(4096, 4096, 4096, dtype="fp32")
    assert SPACE.violation(default_config(problem, A10), problem, A10) is None


@pytest.mark.parametrize("device", [CPU, H100, A10], ids=lambda d: d.alias)
def test_grouped_default_config_is_valid_for_random_problems(device: DeviceInfo) -> None:
    for problem in _random_problems("grouped_matmul", 300, seed=2):
        config = grouped.default_config(problem, device)
        assert grouped.SPACE.violation(config, problem, device) is None, (problem.key, str(config))


@pytest.mark.parametrize("device", [CPU, H100, A100, A10], ids=lambda d: d.alias)
def test_gemm_seed_configs_are_valid_canonical_and_distinct(device: DeviceInfo) -> None:
    for problem in _random_problems("matmul", 200, seed=3):
        seeds = seed_configs(problem, device)
        assert len(seeds) == len(set(seeds))
        for config in seeds:
            assert SPACE.violation(config, problem, device) is None, (problem.key, str(config))
            assert SPACE.canonical(config) == config
    assert seed_configs(_gemm(16, 4096, 4096), H100), "a Hopper problem of the public suite has seeds"


@pytest.mark.parametrize("device", [CPU, H100, A100, A10], ids=lambda d: d.alias)
@pytest.mark.parametrize("spec", [grouped.GROUPED_MATMUL, moe.MOE_MATMUL], ids=lambda s: s.name)
def test_grouped_and_moe_seed_configs_are_valid_canonical_and_distinct(spec, device: DeviceInfo) -> None:
    for problem in _random_problems("grouped_matmul", 200, seed=4):
        problem = dataclasses.replace(problem, kernel=spec.name)
        seeds = spec.seeds(problem, device)
        assert len(seeds) == len(set(seeds))
        for config in seeds:
            assert spec.space.violation(config, problem, device) is None, (problem.key, str(config))
            assert spec.space.canonical(config) == config
    group = Problem(spec.name, "bf16", "nt", tuple((m, 768, 2048) for m in (1024, 16, 0, 512)))
    assert spec.seeds(group, H100), "a Hopper MoE group has seeds"
    assert spec.seeds(group, CPU) == [], "no large tiles for the interpreter"


def test_transfer_distance_reaches_the_other_half_type_but_not_fp32_or_another_layout() -> None:
    fp16 = _gemm(16, 32, 32)
    bf16 = _gemm(16, 32, 32, dtype="bf16")
    assert MATMUL.transfer_distance(fp16, fp16) == 0
    assert MATMUL.transfer_distance(fp16, bf16) == HALF_SIBLING_PENALTY
    assert MATMUL.transfer_distance(bf16, _gemm(32, 32, 32)) == pytest.approx(1.0 + HALF_SIBLING_PENALTY)
    assert MATMUL.transfer_distance(fp16, _gemm(32, 32, 32)) == pytest.approx(1.0)
    assert MATMUL.transfer_distance(fp16, _gemm(16, 32, 32, dtype="fp32")) == float("inf"), "fp32 tiles differ"
    assert MATMUL.transfer_distance(fp16, _gemm(16, 32, 32, dtype="bf16", layout="nt")) == float("inf")


def test_gemm_distance_is_infinite_across_dtype_or_layout() -> None:
    p = _gemm(16, 32, 32)
    assert MATMUL.distance(p, p) == 0
    assert MATMUL.distance(p, _gemm(32, 32, 32)) == pytest.approx(1.0)
    assert MATMUL.distance(p, _gemm(16, 32, 32, dtype="fp32")) == float("inf")
    assert MATMUL.distance(p, _gemm(16, 32, 32, layout="nt")) == float("inf")


# --------------------------------------------------------------------------- problem folds (dense GEMM)

def test_gemm_folds_group_sizes_that_give_one_tile_order() -> None:
    one_row = _gemm(16, 4096, 4096)  # BLOCK_M=16: one row of tiles, every GROUP_SIZE_M walks it alike
    assert SPACE.canonical(_tiled(GROUP_SIZE_M=8), one_row)["GROUP_SIZE_M"] == 1
    eight_rows = _gemm(1000, 1000, 1000)  # BLOCK_M=128: 8 rows of tiles
    assert SPACE.canonical(_tiled(BLOCK_M=128, GROUP_SIZE_M=16), eight_rows)["GROUP_SIZE_M"] == 8
    assert SPACE.canonical(_tiled(BLOCK_M=128, GROUP_SIZE_M=4), eight_rows)["GROUP_SIZE_M"] == 4
    one_column = _gemm(1000, 32, 1000)  # one column of tiles: the walk is row by row whatever the group
    assert SPACE.canonical(_tiled(BLOCK_M=64, GROUP_SIZE_M=8), one_column)["GROUP_SIZE_M"] == 1
    assert SPACE.canonical(_tiled(GROUP_SIZE_M=8))["GROUP_SIZE_M"] == 8, "no problem, no fold"


def test_gemm_folds_program_counts_at_or_above_the_tile_count() -> None:
    tma = _tiled(VARIANT="tma", BLOCK_N=128, NUM_SM=264, GROUP_SIZE_M=1)
    problem = _gemm(16, 4096, 4096)  # 32 tiles of 16x128
    assert SPACE.canonical(tma, problem)["NUM_SM"] == 32
    assert SPACE.canonical(tma.replace(BLOCK_N=32), problem)["NUM_SM"] == 132  # 128 tiles: 132 is the least >= 128
    assert SPACE.canonical(tma.replace(BLOCK_N=32, NUM_SM=66), problem)["NUM_SM"] == 66
    assert SPACE.canonical(_tiled(NUM_SM=132), problem)["NUM_SM"] == 132, "the tiled kernel keeps its fixed value"


@pytest.mark.parametrize("shape", [(16, 4096, 4096), (1000, 1000, 1000), (64, 256, 512), (100, 32, 64)])
def test_gemm_enumerate_lists_each_launch_once(shape) -> None:
    problem = _gemm(*shape)
    folded = list(SPACE.enumerate(problem, H100))
    unfolded = dataclasses.replace(SPACE, folds=())
    every = list(unfolded.enumerate(problem, H100))
    assert len(folded) == len(set(folded)) and set(folded) <= set(every)
    assert {SPACE.canonical(c, problem) for c in every} == set(folded), "each config's fold is listed"
    assert all(SPACE.canonical(c, problem) == c for c in folded)
    assert len(folded) < len(every)


@triton.jit
def _walk(out_ptr, num_pid_m, num_pid_n, GROUP_SIZE_M: tl.constexpr):
    """Writes each program's (pid_m, pid_n) as the dense kernels compute it."""
    tile = tl.program_id(0)
    pid_m, pid_n = _grouped_tile(tile, num_pid_m, num_pid_n, GROUP_SIZE_M)
    tl.store(out_ptr + 2 * tile, pid_m)
    tl.store(out_ptr + 2 * tile + 1, pid_n)


def test_group_sizes_folded_together_walk_the_tiles_in_one_order() -> None:
    """The fold's premise, on the kernels' own tile walk (run by the interpreter or the GPU)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"

    def order(m: int, n: int, block_m: int, block_n: int, group: int) -> list[int]:
        rows, columns = -(-m // block_m), -(-n // block_n)
        out = torch.full((2 * rows * columns,), -1, dtype=torch.int32, device=device)
        _walk[(rows * columns,)](out, rows, columns, GROUP_SIZE_M=group)
        return out.tolist()

    for (m, n, block_m, block_n) in [(1000, 1000, 128, 64), (16, 512, 16, 32), (1000, 32, 64, 32)]:
        problem = _gemm(m, n, 64)
        by_fold: dict[int, list[int]] = {}
        for group in SPACE.param("GROUP_SIZE_M").values:
            config = _tiled(BLOCK_M=block_m, BLOCK_N=block_n, GROUP_SIZE_M=group)
            folded = SPACE.canonical(config, problem)["GROUP_SIZE_M"]
            walked = order(m, n, block_m, block_n, group)
            assert by_fold.setdefault(folded, walked) == walked, (m, n, group, folded)
    # And the test can tell orders apart: 8 rows of tiles walked in groups of 1 and of 4 differ.
    assert order(1000, 1000, 128, 64, 1) != order(1000, 1000, 128, 64, 4)


def test_portable_picks_the_equivalent_config_a_larger_problem_would_want() -> None:
    problem = _gemm(16, 4096, 4096)  # 32 tiles of 16x128
    tma = _tiled(VARIANT="tma", BLOCK_N=128, BLOCK_K=64, NUM_SM=32, GROUP_SIZE_M=1)
    preferred = MATMUL.portable_values(H100)
    stored = SPACE.portable(tma, problem, H100, preferred)
    assert (stored["NUM_SM"], stored["GROUP_SIZE_M"]) == (132, 8), "the SM count and the usual group"
    assert SPACE.canonical(stored, problem) == SPACE.canonical(tma, problem), "the same launch here"
    assert SPACE.violation(stored, problem, H100) is None
    bigger = _gemm(128, 4096, 4096)  # where it is reused: 256 tiles
    assert SPACE.canonical(stored, bigger)["NUM_SM"] == 132, "132 programs there, not 32"
    # Values that are not equivalent on the problem stay as they are.
    many_rows = _gemm(4096, 4096, 4096)
    kept = _tiled(VARIANT="tma", BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, NUM_SM=66, GROUP_SIZE_M=4)
    assert SPACE.portable(kept, many_rows, H100, preferred) == kept
    # A parameter the variant ignores is left alone.
    assert SPACE.portable(_tiled(), problem, H100, preferred)["NUM_SM"] == _tiled()["NUM_SM"]
    group = Problem("grouped_matmul", "fp16", "nn", ((1024, 1024, 1024),) * 4)  # 128 tiles of 128x256
    seed = Config.make(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, NUM_SM=128, num_warps=8, num_stages=4)
    assert grouped.SPACE.portable(seed, group, H100, grouped.GROUPED_MATMUL.portable_values(H100))["NUM_SM"] == 132
