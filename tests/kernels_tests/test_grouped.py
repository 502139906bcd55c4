"""The persistent grouped GEMM: correctness on odd groups, its errors, its search space and its spec.

Runs under Triton's interpreter (TRITON_INTERPRET=1) on a CPU, or compiled on a GPU; tiles stay small so
that each interpreted test takes well under a few seconds.
"""

from __future__ import annotations

import random

import pytest
import torch

from kernels import grouped
from kernels._device import CPU, current_device, interpreter_enabled
from kernels._spec import BASELINE, Config, DeviceInfo, Problem
from kernels.grouped import GROUPED_MATMUL, SPACE, default_config, grouped_matmul_with, problem_of

DEVICE = "cuda" if torch.cuda.is_available() and not interpreter_enabled() else "cpu"

# ||out - ref|| / ||ref|| for fp16/bf16 outputs of an fp32-accumulated GEMM: rounding the output alone
# costs ~5e-4 (fp16) / ~4e-3 (bf16); the interpreter measured ~2e-4 on these groups.
TOLERANCE = {"fp16": 1e-2, "bf16": 2e-2}

H100 = DeviceInfo(name="NVIDIA H100 80GB HBM3", alias="h100", compute_capability="9.0", sm_count=132,
                  shared_memory_bytes=232_448)
A10 = DeviceInfo(name="NVIDIA A10", alias="a10", compute_capability="8.6", sm_count=72,
                 shared_memory_bytes=101_376)

ODD_GROUP = ((1, 1, 1), (17, 33, 65), (64, 16, 48), (0, 8, 8), (8, 0, 8), (5, 7, 0))

# Small tiles keep the interpreter fast. With 16x32 tiles ODD_GROUP has 10 tiles, with 32x32 6 tiles,
# so NUM_SM=4 makes programs loop and NUM_SM=16 leaves programs (clipped from the grid) idle.
SMALL_CONFIGS = (
    Config.make(num_warps=2, num_stages=2, BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, NUM_SM=4),
    Config.make(num_warps=4, num_stages=3, BLOCK_M=32, BLOCK_N=32, BLOCK_K=32, NUM_SM=16),
    Config.make(num_warps=4, num_stages=2, BLOCK_M=16, BLOCK_N=64, BLOCK_K=64, NUM_SM=8),
    Config.make(num_warps=4, num_stages=4, BLOCK_M=64, BLOCK_N=32, BLOCK_K=128, NUM_SM=4),
)


def _problem(shapes=ODD_GROUP, layout: str = "nn", dtype: str = "fp16") -> Problem:
    return Problem("grouped_matmul", dtype, layout, tuple(shapes))


def _assert_close(outs: list[torch.Tensor], refs: list[torch.Tensor], dtype: str) -> None:
    assert len(outs) == len(refs)
    for i, (out, ref) in enumerate(zip(outs, refs)):
        assert out.shape == ref.shape, f"output {i}"
        assert out.dtype == {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
        err = (out.float() - ref).norm().item()
        assert err <= TOLERANCE[dtype] * max(ref.norm().item(), 1e-6), f"output {i} {tuple(ref.shape)}: error {err}"


def _run_and_check(config: Config, problem: Problem, seed: int = 0) -> None:
    inputs = GROUPED_MATMUL.make_inputs(problem, DEVICE, seed)
    _assert_close(GROUPED_MATMUL.run(config, inputs), GROUPED_MATMUL.reference(inputs), problem.dtype)


# ------------------------------------------------------------------------------------------ correctness

@pytest.mark.parametrize("layout", ["nn", "nt", "tn", "tt"])
@pytest.mark.parametrize("config", SMALL_CONFIGS, ids=str)
def test_odd_group_matches_torch_in_fp16(layout: str, config: Config) -> None:
    _run_and_check(config, _problem(layout=layout))


def test_operands_with_general_strides_match_torch() -> None:
    gen = torch.Generator().manual_seed(1)
    big = [torch.randn(80, 70, generator=gen).half().to(DEVICE) for _ in range(4)]
    # Views that are neither row- nor column-major: (20, 35), (17, 33) and (35, 24), (33, 24).
    As = [big[0][:40:2, ::2], big[1][1:18, 3:68:2]]
    Bs = [big[2][:35, ::3], big[3][::2, ::3][:33]]
    assert problem_of(As, Bs).layout == "nn"
    config = SMALL_CONFIGS[0]
    _assert_close(grouped_matmul_with(config, As, Bs), [a.float() @ b.float() for a, b in zip(As, Bs)], "fp16")


def _flags(As: list[torch.Tensor], Bs: list[torch.Tensor]) -> dict[str, bool]:
    return grouped._plan(grouped.signature(As, Bs), 16, 32).flags


def test_aligned_group_takes_the_hinted_path_and_matches_torch() -> None:
    problem = _problem([(24, 64, 40), (8, 32, 16), (0, 16, 8), (1, 8, 8)], layout="nt")
    As, Bs = GROUPED_MATMUL.make_inputs(problem, DEVICE, 3)
    assert _flags(As, Bs) == dict(A_M_UNIT=False, A_K_UNIT=True, B_K_UNIT=True, B_N_UNIT=False, ALIGNED=True)
    _run_and_check(SMALL_CONFIGS[2], problem, seed=3)


def test_alignment_promise_holds_only_for_aligned_bases_strides_and_contiguous_extents() -> None:
    x = torch.randn(64, 64, generator=torch.Generator().manual_seed(0)).half().to(DEVICE)
    b = x[:24, :16]
    assert _flags([x[:8, :24]], [b])["ALIGNED"]
    assert _flags([x[:5, :24]], [b])["ALIGNED"]  # M runs along rows of a row-major A: any M will do
    assert not _flags([x[:8, :24]], [x[:24, :17]])["ALIGNED"]  # N is contiguous in B and C
    assert not _flags([x[:8, :20]], [x[:20, :16]])["ALIGNED"]  # K is contiguous in A
    assert not _flags([x[:8, 1:25]], [b])["ALIGNED"]  # A starts 2 bytes past a 16-byte boundary
    assert not _flags([x.view(-1)[:480].view(8, 60)[:, :24]], [b])["ALIGNED"]  # row stride 60
    column_major = _flags([x[:24, :8].t()], [b])
    assert column_major["A_M_UNIT"] and not column_major["A_K_UNIT"] and column_major["ALIGNED"]
    assert not _flags([x[:24, :5].t()], [b])["ALIGNED"]  # M is contiguous in A = x.t()


def test_more_programs_than_tiles_and_fewer_give_the_same_result() -> None:
    problem = _problem([(40, 70, 33), (3, 100, 20)])
    inputs = GROUPED_MATMUL.make_inputs(problem, DEVICE, 5)
    few, many = (SMALL_CONFIGS[0].replace(NUM_SM=n) for n in (4, 264))  # 15 tiles
    assert torch.equal(GROUPED_MATMUL.run(few, inputs)[0], GROUPED_MATMUL.run(many, inputs)[0])


def test_k_zero_writes_zeros_and_empty_m_or_n_give_empty_outputs(monkeypatch: pytest.MonkeyPatch) -> None:
    empty = torch.empty

    def poisoned(*args, **kwargs) -> torch.Tensor:  # so zeros in C must come from the kernel
        t = empty(*args, **kwargs)
        return t.fill_(float("nan")) if t.is_floating_point() else t

    monkeypatch.setattr(torch, "empty", poisoned)
    ones = [torch.ones(*shape, dtype=torch.float16, device=DEVICE) for shape in ((3, 0), (0, 4), (5, 4), (0, 6),
                                                                                (4, 2), (4, 0))]
    outs = grouped_matmul_with(SMALL_CONFIGS[0], ones[:3], ones[3:])
    assert [tuple(o.shape) for o in outs] == [(3, 6), (0, 2), (5, 0)]
    assert torch.equal(outs[0], torch.zeros(3, 6, dtype=torch.float16, device=DEVICE))


def test_group_without_tiles_launches_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    class NoLaunch:
        def __getitem__(self, grid):
            raise AssertionError(f"launched with grid {grid}")

    monkeypatch.setattr(grouped, "_grouped_matmul_kernel", NoLaunch())
    As = [torch.ones(0, 4, dtype=torch.float16, device=DEVICE), torch.ones(3, 0, dtype=torch.float16, device=DEVICE)]
    Bs = [torch.ones(4, 2, dtype=torch.float16, device=DEVICE), torch.ones(0, 0, dtype=torch.float16, device=DEVICE)]
    assert [tuple(o.shape) for o in grouped_matmul_with(SMALL_CONFIGS[0], As, Bs)] == [(0, 2), (3, 0)]


def test_baseline_config_runs_the_torch_loop() -> None:
    inputs = GROUPED_MATMUL.make_inputs(_problem([(5, 6, 7)]), DEVICE, 0)
    assert torch.equal(grouped_matmul_with(BASELINE, *inputs)[0], torch.matmul(inputs[0][0], inputs[1][0]))


def test_default_config_is_correct_on_the_odd_group() -> None:
    problem = _problem(layout="nt")
    _run_and_check(default_config(problem, CPU), problem)


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda", reason="needs a GPU: the interpreter's bf16 tl.dot is wrong (GPU.md)")
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("layout", ["nn", "nt"])
def test_group_matches_torch_on_the_gpu(dtype: str, layout: str) -> None:
    shapes = ODD_GROUP + ((256, 512, 1024), (1000, 136, 4096), (128, 1536, 4096))
    problem = _problem(shapes, layout=layout, dtype=dtype)
    configs = SMALL_CONFIGS + (default_config(problem, current_device(DEVICE)),
                               Config.make(num_warps=8, num_stages=3, BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, NUM_SM=132))
    for config in configs:
        _run_and_check(config, problem, seed=7)


# ---------------------------------------------------------------------------------------------- errors

def _fp16(*shape: int) -> torch.Tensor:
    return torch.zeros(*shape, dtype=torch.float16)


@pytest.mark.parametrize("As, Bs, error, words", [
    ([_fp16(2, 3)], [_fp16(3, 2), _fp16(3, 2)], ValueError, ["equally long", "1 and 2"]),
    ([], [], ValueError, ["non-empty"]),
    (_fp16(2, 3), [_fp16(3, 2)], TypeError, ["list or tuple", "Tensor"]),
    ([_fp16(2, 3), "x"], [_fp16(3, 2), _fp16(3, 2)], TypeError, ["As[1]", "str"]),
    ([_fp16(2, 3, 1)], [_fp16(3, 2)], ValueError, ["As[0]", "(2, 3, 1)", "2-D"]),
    ([_fp16(1, 1)] * 2 + [torch.zeros(2, 3)], [_fp16(1, 1)] * 2 + [torch.zeros(3, 2)], TypeError,
     ["float16 or bfloat16", "torch.float32 at As[2]", ".half()"]),
    ([_fp16(2, 3)], [_fp16(3, 2).bfloat16()], TypeError, ["one dtype", "torch.bfloat16", "Bs[0]"]),
    ([_fp16(2, 3), _fp16(4, 5)], [_fp16(3, 2), _fp16(6, 2)], ValueError, ["As[1]", "(4, 5)", "Bs[1]", "(6, 2)"]),
    ([_fp16(2, 3)], [torch.zeros(3, 2, dtype=torch.float16, device="meta")], ValueError,
     ["one device", "Bs[0] is on meta", ".to("]),
])
def test_bad_operands_raise_errors_that_name_them(As, Bs, error: type, words: list[str]) -> None:
    with pytest.raises(error) as info:
        problem_of(As, Bs)
    for word in words:
        assert word in str(info.value)


def test_config_outside_the_space_is_refused_with_the_reason() -> None:
    inputs = GROUPED_MATMUL.make_inputs(_problem([(4, 4, 4)]), DEVICE, 0)
    with pytest.raises(ValueError, match="BLOCK_M=24 is not one of"):
        grouped_matmul_with(SMALL_CONFIGS[0].replace(BLOCK_M=24), *inputs)


# ------------------------------------------------------------------------------------ problem and spec

@pytest.mark.parametrize("layout", ["nn", "nt", "tn", "tt"])
def test_problem_of_inputs_round_trips_through_its_key(layout: str) -> None:
    problem = _problem(layout=layout, dtype="bf16")
    assert problem_of(*GROUPED_MATMUL.make_inputs(problem, "cpu", 0)) == problem
    assert Problem.from_key("grouped_matmul", problem.key) == problem


def test_make_inputs_is_seeded_and_scaled_to_unit_outputs() -> None:
    problem = _problem([(64, 64, 1024)], layout="nt")
    first, again, other = (GROUPED_MATMUL.make_inputs(problem, "cpu", seed) for seed in (1, 1, 2))
    assert torch.equal(first[1][0], again[1][0]) and not torch.equal(first[1][0], other[1][0])
    assert first[1][0].stride(0) == 1  # B = w.t()
    assert 0.5 < GROUPED_MATMUL.reference(first)[0].std().item() < 2.0


def test_baseline_agrees_with_reference() -> None:
    inputs = GROUPED_MATMUL.make_inputs(_problem(), "cpu", 0)
    _assert_close(GROUPED_MATMUL.baseline(inputs), GROUPED_MATMUL.reference(inputs), "fp16")


def _random_problem(rng: random.Random) -> Problem:
    dims = lambda: rng.choice([0, 1, 7, 16, 100, 1000, 4096, 20000])  # noqa: E731
    shapes = tuple((dims(), dims(), dims()) for _ in range(rng.randint(1, 6)))
    return _problem(shapes, layout=rng.choice(["nn", "nt"]), dtype=rng.choice(["fp16", "bf16"]))


@pytest.mark.parametrize("device", [CPU, H100, A10], ids=lambda d: d.alias)
def test_default_config_is_valid_for_any_problem(device: DeviceInfo) -> None:
    rng = random.Random(0)
    for _ in range(300):
        problem = _random_problem(rng)
        config = default_config(problem, device)
        assert SPACE.violation(config, problem, device) is None, f"{config} for {problem}"


def test_default_config_takes_one_program_per_sm_and_fewer_stages_where_memory_is_short() -> None:
    problem = _problem([(4096, 4096, 4096)] * 4)
    big = dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, NUM_SM=132, num_warps=4, num_stages=4)
    assert default_config(problem, H100) == Config.from_dict(big)
    assert default_config(problem, A10) == Config.from_dict({**big, "NUM_SM": 66, "num_stages": 3})
    assert default_config(problem, CPU) == Config.make(num_warps=4, num_stages=3, BLOCK_M=64, BLOCK_N=64,
                                                       BLOCK_K=32, NUM_SM=4)


def test_default_config_shrinks_to_small_problems_and_falls_back_on_tiny_devices() -> None:
    problem = _problem([(5, 20, 9), (3, 1, 1)])
    config = default_config(problem, H100)
    assert (config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"], config["NUM_SM"]) == (16, 64, 32, 4)
    tiny = DeviceInfo(name="tiny", alias="tiny", compute_capability="7.5", sm_count=2, shared_memory_bytes=8192)
    large = _problem([(4096, 4096, 4096)])
    config = default_config(large, tiny)
    assert SPACE.violation(config, large, tiny) is None
    assert (config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"], config.num_stages) == (16, 32, 32, 2)


def test_every_problem_has_a_valid_config_on_every_device() -> None:
    for problem in (_problem([(1, 1, 1)]), _problem([(0, 0, 0)]), _problem([(8192, 8192, 8192)])):
        for device in (CPU, H100, A10):
            assert next(SPACE.enumerate(problem, device), None) is not None, f"{problem} on {device.alias}"


def _why(problem: Problem, device: DeviceInfo = H100, **values) -> str | None:
    base = dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, NUM_SM=4, num_warps=4, num_stages=3)
    return SPACE.violation(Config.make(**{**base, **values}), problem, device)


def test_constraints_rule_out_tiles_far_larger_than_the_problem() -> None:
    small = _problem([(5, 20, 9), (3, 1, 1)])
    assert "BLOCK_M=64" in _why(small)
    assert _why(small, BLOCK_M=16, BLOCK_N=64) is None  # 2 * next_pow2(20) = 64
    assert "BLOCK_N=128" in _why(small, BLOCK_M=16, BLOCK_N=128)
    assert "BLOCK_K=64" in _why(small, BLOCK_M=16, BLOCK_K=64)
    assert _why(_problem([(1, 1, 1)]), BLOCK_M=16, BLOCK_N=32, BLOCK_K=32) is None  # smallest tiles always fit


def test_constraints_rule_out_configs_the_hardware_cannot_hold() -> None:
    big = _problem([(8192, 8192, 8192)])
    assert "shared memory" in _why(big, BLOCK_M=256, BLOCK_N=256, BLOCK_K=128, num_warps=8, num_stages=2)
    assert "shared memory" in _why(big, A10, BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_stages=4, NUM_SM=132)
    assert _why(big, BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_stages=4, NUM_SM=132) is None
    assert "accumulators" in _why(big, BLOCK_M=256, BLOCK_N=256, num_warps=4)
    assert _why(big, BLOCK_M=256, BLOCK_N=256, num_warps=8, NUM_SM=132) is None


def test_constraints_bound_num_sm_by_device_and_by_tile_count() -> None:
    big = _problem([(8192, 8192, 8192)])
    assert _why(big, NUM_SM=264) is None
    assert "too many" in _why(big, A10, NUM_SM=264)
    assert "too many" in _why(big, CPU, NUM_SM=32)
    assert _why(big, CPU, NUM_SM=16) is None


def test_program_counts_above_the_tile_count_fold_to_the_least_that_covers_it() -> None:
    tiny = _problem([(20, 20, 20)])  # 1 tile of 32x32: NUM_SM=4 already gives each tile a program
    config = Config.make(BLOCK_M=32, BLOCK_N=32, BLOCK_K=32, NUM_SM=8, num_warps=4, num_stages=3)
    assert _why(tiny, BLOCK_M=32, BLOCK_N=32, NUM_SM=8) is None, "folded, not ruled out"
    assert SPACE.canonical(config, tiny)["NUM_SM"] == 4
    group = _problem([(1024, 1024, 1024)] * 4)  # 128 tiles of 128x256
    seed = Config.make(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, NUM_SM=132, num_warps=8, num_stages=3)
    assert SPACE.canonical(seed, group)["NUM_SM"] == 128
    assert SPACE.canonical(seed.replace(NUM_SM=66), group)["NUM_SM"] == 66, "fewer programs than tiles stay"
    folded = [c["NUM_SM"] for c in grouped.seed_configs(group, H100) if c["BLOCK_N"] == 256]
    assert folded == [128], "the 132-program seed stays, as one program per tile"
    from kernels import moe
    assert moe.SPACE.canonical(seed, group) == seed, "moe_matmul's tile count changes per call: no fold"


def test_constraints_rule_out_idle_sms_only_when_there_are_tiles_for_all() -> None:
    big = _problem([(8192, 8192, 8192)])  # 16,384 tiles of 64x64
    assert "leaves SMs idle" in _why(big, NUM_SM=66) and ">= 119" in _why(big, NUM_SM=66)
    assert _why(big, NUM_SM=128) is None, "a power of two just under the 132 SMs stays"
    assert _why(big, A10, NUM_SM=66) is None, "66 programs fill most of an A10's 72 SMs"
    assert _why(big, CPU, NUM_SM=4) is None
    group = _problem([(512, 512, 512)] * 4)  # 64 tiles of 128x128: fewer than the SMs
    assert _why(group, BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, NUM_SM=16) is None


def test_distance_grows_with_size_and_is_infinite_across_dtype_or_layout() -> None:
    p = _problem([(128, 256, 512)] * 4)
    assert GROUPED_MATMUL.distance(p, p) == 0
    near, far = _problem([(128, 256, 512)] * 5), _problem([(1024, 256, 512)] * 4)
    assert 0 < GROUPED_MATMUL.distance(p, near) < GROUPED_MATMUL.distance(p, far)
    assert GROUPED_MATMUL.distance(p, _problem(p.shapes, dtype="bf16")) == float("inf")
    assert GROUPED_MATMUL.distance(p, _problem(p.shapes, layout="nt")) == float("inf")


def test_same_operands_reuse_the_device_table_and_see_new_values(torch_device) -> None:
    import kernels

    grouped.TABLES.clear()
    problem = Problem("grouped_matmul", "fp16", "nn", ((16, 32, 32), (8, 32, 16)))
    As, Bs = grouped.make_inputs(problem, torch_device, 11)
    config = grouped.default_config(problem, current_device(torch_device))
    grouped.grouped_matmul_with(config, As, Bs)
    As[0].mul_(2.0)  # same addresses, new values: the cached table must still read the live tensors
    outs = grouped.grouped_matmul_with(config, As, Bs)
    assert len(grouped.TABLES) == 1, "the second call with the same operands built a new table"
    for out, a, b in zip(outs, As, Bs):
        ref = a.float() @ b.float()
        assert ((out.float() - ref).norm() / ref.norm()).item() < 1e-2
    other = [a.clone() for a in As]
    grouped.grouped_matmul_with(config, other, Bs)
    assert len(grouped.TABLES) == 2, "other operands must get a table of their own"
    kernels.clear_cache()
    assert len(grouped.TABLES) == 0


# ------------------------------------------------------------------------------------ the dispatch hot path

def test_repeated_call_reuses_config_table_and_layout_without_checking_again(torch_device, monkeypatch) -> None:
    import dataclasses

    import kernels

    kernels.clear_cache()
    problem = Problem("grouped_matmul", "fp16", "nn", ((16, 32, 32), (8, 32, 16), (0, 32, 8)))
    As, Bs = grouped.make_inputs(problem, torch_device, 12)
    checks = []
    spy = dataclasses.replace(GROUPED_MATMUL, problem_of=lambda *ops: checks.append(1) or problem_of(*ops))
    monkeypatch.setattr(kernels._grouped_dispatch, "GROUPED_MATMUL", spy)  # what kernels.grouped_matmul reads
    first = kernels.grouped_matmul(As, Bs)
    As[1].mul_(-1.0)  # same addresses, new values
    second = kernels.grouped_matmul(As, Bs)
    assert len(checks) == 1 and len(grouped.CALLS) == 1, "the second call found everything cached"
    assert first[1].data_ptr() != second[1].data_ptr(), "each call gets fresh outputs"
    _assert_close(second, [a.float() @ b.float() for a, b in zip(As, Bs)], "fp16")
    kernels.grouped_matmul([a.clone() for a in As], Bs)
    assert len(checks) == 2 and len(grouped.CALLS) == 2, "new operands take the checked path"
    kernels.use_database(None)
    assert len(grouped.CALLS) == 0, "another database may choose other configs"


def test_group_sharing_n_gets_one_stacked_output_buffer(torch_device) -> None:
    problem = Problem("grouped_matmul", "fp16", "nn", ((16, 32, 32), (0, 32, 16), (8, 32, 64)))
    As, Bs = grouped.make_inputs(problem, torch_device, 13)
    outs = grouped.grouped_matmul_with(SMALL_CONFIGS[0], As, Bs)
    assert [tuple(o.shape) for o in outs] == [(16, 32), (0, 32), (8, 32)]
    assert outs[2].data_ptr() == outs[0].data_ptr() + 16 * 32 * 2, "rows follow each other in one buffer"
    assert all(o.is_contiguous() for o in outs)
    _assert_close(outs, [a.float() @ b.float() for a, b in zip(As, Bs)], "fp16")
    mixed = grouped._plan(grouped.signature(*grouped.make_inputs(_problem(), torch_device, 0)), 16, 32)
    assert mixed.stacked_n is None and all(offset % 8 == 0 for offset, _, _ in mixed.outputs)


def test_operands_that_change_shape_after_a_cached_call_still_get_the_precise_error(torch_device) -> None:
    import kernels

    problem = Problem("grouped_matmul", "fp16", "nn", ((16, 32, 32),))
    As, Bs = grouped.make_inputs(problem, torch_device, 14)
    kernels.grouped_matmul(As, Bs)
    with pytest.raises(ValueError, match="2-D matrices"):
        kernels.grouped_matmul([As[0].unsqueeze(0)], Bs)
    with pytest.raises(TypeError, match="one dtype"):
        kernels.grouped_matmul(As, [Bs[0].view(torch.bfloat16)])
