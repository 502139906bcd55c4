"""kernels/_check.py: the element-wise bound, the inputs with loud edges, the poisoned allocations."""

from __future__ import annotations

import math

import pytest
import torch

import kernels
from kernels import Problem
from kernels._check import (LOUD, MARGIN, OUTPUT_ROUNDOFF, check_outputs, element_bound, hard_split, loud_edges,
                            margin_for, poisoned)
from tuner.bench import relative_error

# The relative L2 error the search allowed before the element-wise check (tuner/bench.py until 2026-11-28).
OLD_BF16_TOLERANCE = 3e-2


def _product(m: int, n: int, k: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    a = (torch.randn(m, k, generator=gen) * k ** -0.25).bfloat16()
    b = (torch.randn(k, n, generator=gen) * k ** -0.25).bfloat16()
    return a, b


def _reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a.double() @ b.double()).float()


def test_a_correctly_rounded_result_passes_in_every_dtype() -> None:
    a, b = _product(64, 48, 512)
    ref = _reference(a, b)
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        verdict = check_outputs(ref.to(dtype), ref, dtype, k=512)
        assert verdict.ok and verdict.error <= 1.0 / MARGIN * 1.01, (dtype, verdict)


def test_a_dropped_last_k_element_passes_the_old_rule_and_fails_this_one() -> None:
    """The issue's first case, on plain random inputs (no loud edges): K = 2048, bf16."""
    a, b = _product(64, 64, 2048)
    ref = _reference(a, b)
    dropped = (a[:, :-1].float() @ b[:-1].float()).bfloat16()
    assert relative_error(dropped, ref) <= OLD_BF16_TOLERANCE
    verdict = check_outputs(dropped, ref, "bf16", k=2048)
    assert not verdict.ok and "its bound" in verdict.reason


def test_an_unwritten_last_row_of_zeros_passes_the_old_rule_and_fails_this_one() -> None:
    """The issue's second case: M = 4097, the last row left as zeros by the memory it was given."""
    a, b = _product(4097, 8, 16)
    ref = _reference(a, b)
    out = ref.bfloat16()
    out[-1] = 0
    assert relative_error(out, ref) <= OLD_BF16_TOLERANCE
    verdict = check_outputs(out, ref, "bf16", k=16)
    assert not verdict.ok and verdict.reason.startswith("element [4096, ")


def test_one_element_a_few_roundings_off_fails_and_is_named() -> None:
    a, b = _product(32, 32, 256)
    ref = _reference(a, b)
    out = ref.half()
    out[7, 9] = float(ref[7, 9]) * (1 + 4 * MARGIN * OUTPUT_ROUNDOFF["fp16"]) + 0.05
    verdict = check_outputs(out, ref, "fp16", k=256)
    assert not verdict.ok
    assert verdict.reason.startswith("element [7, 9] is ") and "(1 of 1024 elements over)" in verdict.reason


def test_nan_inf_and_shape_mismatches_fail() -> None:
    ref = torch.ones(4, 4)
    for bad in (math.nan, math.inf):
        out = ref.clone()
        out[3, 3] = bad
        verdict = check_outputs(out, ref, "fp32", k=4)
        assert not verdict.ok and "element [3, 3]" in verdict.reason
    assert check_outputs(torch.ones(4, 3), ref, "fp32").error == math.inf
    assert check_outputs([ref], [ref, ref], "fp32").error == math.inf
    assert check_outputs(torch.zeros(0, 4), torch.zeros(0, 4), "fp32").ok


def test_a_list_names_the_output_that_fails() -> None:
    refs = [torch.ones(2, 3), torch.full((3, 2), 2.0)]
    outs = [refs[0].clone(), refs[1].clone()]
    outs[1][2, 1] = 2.5
    verdict = check_outputs(outs, refs, "fp16", k=8)
    assert not verdict.ok and verdict.reason.startswith("output 1: element [2, 1]")


def test_a_loud_row_does_not_loosen_the_bound_of_quiet_rows() -> None:
    """The scale is per element (row rms x column rms / rms): a row 100x larger, which makes the RMS of the
    whole 25x larger, leaves the other rows' bounds within a small factor of their own."""
    a, b = _product(16, 32, 64)
    ref = _reference(a, b)
    ref[-1] *= 100
    quiet = element_bound(ref, "fp32", 64)[:-1]
    alone = element_bound(ref[:-1], "fp32", 64)
    ratio = quiet / alone
    assert float(ref.square().mean().sqrt() / ref[:-1].square().mean().sqrt()) > 20
    assert 0.7 < float(ratio.median()) < 1.4 and float(ratio.max()) < 4
    out = ref.clone()
    out[3, 4] += 6 * float(alone[3, 4])
    assert not check_outputs(out, ref, "fp32", k=64).ok


def test_bound_grows_with_k_and_with_the_dtype_roundoff() -> None:
    ref = torch.randn(8, 8, generator=torch.Generator().manual_seed(1))
    assert bool((element_bound(ref, "fp32", 4096) > element_bound(ref, "fp32", 16)).all())
    assert bool((element_bound(ref, "bf16", 16) > element_bound(ref, "fp16", 16)).all())


def test_a_callers_rtol_replaces_the_derived_bound() -> None:
    ref = torch.ones(3, 3)
    out = ref * 1.10
    assert not check_outputs(out, ref, "fp32").ok  # the derived bound, TF32 included: about 0.06
    assert check_outputs(out, ref, "fp32", rtol=0.06).ok  # 0.10 <= 0.06 * (|ref| + scale) = 0.12
    assert not check_outputs(out, ref, "fp32", rtol=0.04).ok


def test_fp32_products_off_tensor_cores_get_no_tf32_allowance() -> None:
    from kernels._check import runs_on_tf32
    from kernels.gemm import seed_configs
    from kernels import BASELINE, described_device

    ref = torch.randn(8, 8, generator=torch.Generator().manual_seed(2))
    assert bool((element_bound(ref, "fp32", 64, tf32=False) < 0.01 * element_bound(ref, "fp32", 64)).all())
    h100 = described_device("NVIDIA H100 80GB HBM3", "9.0", 132)
    configs = seed_configs(Problem.from_key("matmul", "fp32:nt:1x4096x4096"), h100)
    kinds = {(c["VARIANT"], runs_on_tf32(c)) for c in configs}
    assert ("gemv", False) in kinds and ("splitk", True) in kinds
    assert all(tf32 == (variant != "gemv") for variant, tf32 in kinds)
    assert not runs_on_tf32(BASELINE)


def test_margin_per_family() -> None:
    assert margin_for("matmul", "bf16") == MARGIN
    assert margin_for("gated_matmul", "bf16") > MARGIN  # set by the GPU calibration (kernels/_check.py)


def test_unknown_dtype_is_refused_with_the_known_ones() -> None:
    with pytest.raises(ValueError, match="fp16, bf16 or fp32"):
        check_outputs(torch.ones(2), torch.ones(2), torch.float64)


# ----------------------------------------------------------------------------------------------- inputs

def test_poisoned_allocations_are_nan_and_the_switch_is_restored() -> None:
    before = torch.are_deterministic_algorithms_enabled()
    with poisoned():
        assert torch.isnan(torch.empty(5, 7, dtype=torch.float16)).all()
        assert torch.isnan(torch.empty(3, dtype=torch.float32)).all()
    assert torch.are_deterministic_algorithms_enabled() == before


def test_loud_edges_scale_the_last_k_row_and_column_of_each_operand() -> None:
    a, b = torch.ones(3, 5), torch.ones(5, 4)
    bias = torch.ones(4)
    loud_edges(a, b.t().contiguous().t(), bias)  # a transposed view of B is changed in place too
    assert a[0, 0] == 1 and a[-1, 0] == LOUD and a[0, -1] == LOUD and a[-1, -1] == LOUD * LOUD
    assert bias[-1] == LOUD and bias[0] == 1
    gated = torch.ones(5, 6)
    loud_edges(torch.ones(3, 5), gated, halves=2)
    assert gated[0, 2] == LOUD and gated[0, 5] == 1 and gated[0, 1] == 1 and gated[-1, 5] == 1


@pytest.mark.parametrize("tokens, experts", [(25, 5), (24, 4), (10, 3), (7, 2), (5, 1), (0, 4), (3, 8)])
def test_hard_split_has_empty_and_one_row_experts_and_ends_at_the_tokens(tokens: int, experts: int) -> None:
    rows = hard_split(tokens, experts)
    assert len(rows) == experts and sum(rows) == tokens and min(rows) >= 0
    if experts >= 3 and tokens >= 2:
        assert rows[0] == 0 and rows[1] == 1 and rows[-1] > 0
    if experts >= 4 and tokens >= 2:
        assert rows[-2] == 0


def test_moe_check_inputs_end_their_buffer_after_a_value_no_expert_ends_at(torch_device) -> None:
    spec = kernels.get_kernel("moe_matmul")
    problem = Problem.from_key("moe_matmul", "fp16:nt:" + "+".join(["5x32x64"] * 5))
    x, w, offsets, ends = spec.inputs_for_check(problem, torch_device, 0)
    assert ends == (0, 1, 13, 13, 25) and offsets.tolist() == list(ends)
    base = offsets.untyped_storage().nbytes() // offsets.element_size()
    assert offsets.storage_offset() + offsets.numel() == base, "the offsets are the last elements of their buffer"
    before = offsets.as_strided((1,), (1,), offsets.storage_offset() - 1)
    assert int(before) > x.shape[0]
    assert float(x[13:].float().abs().mean()) > 2 * float(x[1:13, :-1].float().abs().mean())


@pytest.mark.parametrize("kernel, key", [("matmul", "fp16:nn:16x32x64"), ("matmul_bias", "fp32:nt:16x32x64"),
                                         ("gated_matmul", "fp16:nn:16x32x64"),
                                         ("grouped_matmul", "fp16:nn:16x32x64+8x32x48")])
def test_check_inputs_are_make_inputs_with_loud_edges(kernel: str, key: str, torch_device) -> None:
    spec = kernels.get_kernel(kernel)
    problem = Problem.from_key(kernel, key)
    plain, loud = spec.make_inputs(problem, torch_device, 3), spec.inputs_for_check(problem, torch_device, 3)
    a_plain, a_loud = (plain[0][0], loud[0][0]) if kernel == "grouped_matmul" else (plain[0], loud[0])
    assert torch.equal(a_plain[0, :-1], a_loud[0, :-1])
    assert torch.allclose(a_loud[-1, :-1].float(), LOUD * a_plain[-1, :-1].float())
    assert torch.allclose(a_loud[:-1, -1].float(), LOUD * a_plain[:-1, -1].float())


def test_a_large_output_is_checked_a_few_rows_at_a_time_with_the_same_verdict(monkeypatch) -> None:
    from kernels import _check

    a, b = _product(40, 24, 128)
    ref = _reference(a, b)
    out = ref.half()
    out[33, 5] += 0.5
    out[2, 7] = math.nan
    whole = check_outputs(out, ref, "fp16", k=128)
    monkeypatch.setattr(_check, "_CHUNK", 48)  # two rows a pass
    chunked = check_outputs(out, ref, "fp16", k=128)
    assert chunked == whole and chunked.reason.startswith("element [2, 7] is nan") and "(2 of 960" in chunked.reason
    out[2, 7] = ref[2, 7]
    assert check_outputs(out, ref, "fp16", k=128).reason.startswith("element [33, 5]")
