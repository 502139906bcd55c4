"""Dense GEMM: every variant against a float64 reference, on odd shapes, strides and dtypes, and its errors.

Runs under Triton's interpreter on a CPU or compiled on a GPU; tiles stay at 16/32 so that each
interpreted test takes a fraction of a second.
"""

from __future__ import annotations

import pytest
import torch

from kernels import gemm
from kernels._device import current_device, interpreter_enabled
from kernels._spec import BASELINE, Config, Problem
from kernels.gemm import MATMUL, check_operands, layout_letter, matmul_with, problem_of

ON_GPU = torch.cuda.is_available() and not interpreter_enabled()
TORCH_DTYPES = {"fp16": torch.float16, "fp32": torch.float32}

# Relative L2 error ||out - ref|| / ||ref|| against a float64 reference. fp16: rounding the output costs
# ~3e-4 (interpreter measured 2e-4 on these shapes). fp32: TF32 tensor cores on the GPU (~3e-4, as bench's
# TOLERANCE); the interpreter computes in true fp32 (measured ~1e-7).
TOLERANCE = {"fp16": 5e-3, "fp32": 5e-3 if ON_GPU else 1e-5}

_BASE = dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, GROUP_SIZE_M=4, SPLIT_K=1, NUM_SM=132, FLATTEN=False,
             EPILOGUE_SUBTILE=False, num_warps=4, num_stages=2)


def _config(variant: str, **changes) -> Config:
    return Config.from_dict({"VARIANT": variant, **_BASE, **changes})


VARIANT_CONFIGS = {
    "tiled": _config("tiled"),
    "tiled-32x32": _config("tiled", BLOCK_M=32, GROUP_SIZE_M=1, num_stages=3),
    "splitk2": _config("splitk", SPLIT_K=2),
    "splitk3": _config("splitk", SPLIT_K=3, GROUP_SIZE_M=1),
    "tma": _config("tma", NUM_SM=32),
    "tma-subtile-flatten": _config("tma", NUM_SM=32, EPILOGUE_SUBTILE=True, FLATTEN=True),
    "repack": _config("repack"),
    "repack-splitk3": _config("repack", SPLIT_K=3, GROUP_SIZE_M=1),
}
# Shapes that the tiled and split-K kernels take with any strides: edges in M, N and K, K not a
# multiple of BLOCK_K (nor, for split-K, of SPLIT_K * BLOCK_K).
ODD_SHAPES = [(1, 1, 1), (17, 33, 65), (33, 47, 70)]


def _rand(rows: int, cols: int, dtype: str, device, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, cols, generator=gen) / max(cols, 1) ** 0.25).to(TORCH_DTYPES[dtype]).to(device)


def _reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.matmul(a.detach().cpu().double(), b.detach().cpu().double())


def _assert_matmul(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, dtype: str) -> None:
    ref = _reference(a, b)
    assert out.shape == ref.shape and out.dtype == a.dtype and out.device == a.device
    result = out.detach().cpu().double()
    assert torch.isfinite(result).all(), "some output elements were never written"
    if ref.numel() == 0:
        return
    error = (result - ref).norm() / ref.norm().clamp_min(1e-30)
    assert error <= TOLERANCE[dtype], f"relative error {error:.3g} on {tuple(a.shape)} @ {tuple(b.shape)}"


def _poisoned(m: int, n: int, like: torch.Tensor) -> torch.Tensor:
    return torch.full((m, n), float("nan"), dtype=like.dtype, device=like.device)


# ------------------------------------------------------------------------------------------ correctness

@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
@pytest.mark.parametrize("shape", ODD_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("variant", ["tiled", "tiled-32x32", "splitk2", "splitk3", "repack", "repack-splitk3"])
def test_pointer_variants_match_reference_on_odd_shapes(variant, shape, dtype, torch_device) -> None:
    m, n, k = shape
    a, b = _rand(m, k, dtype, torch_device, 1), _rand(k, n, dtype, torch_device, 2)
    out = matmul_with(VARIANT_CONFIGS[variant], a, b, out=_poisoned(m, n, a))
    _assert_matmul(out, a, b, dtype)


@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
@pytest.mark.parametrize("variant", ["tiled", "splitk2", "splitk3", "tma", "repack"])
def test_output_allocated_fresh_has_every_element_written(variant, dtype, torch_device) -> None:
    a, b = _rand(33, 96, dtype, torch_device, 3), _rand(96, 40, dtype, torch_device, 4)
    _assert_matmul(matmul_with(VARIANT_CONFIGS[variant], a, b), a, b, dtype)


def _operand(kind: str, rows: int, cols: int, dtype: str, device, seed: int) -> torch.Tensor:
    """A (rows, cols) operand laid out as ``kind`` says."""
    if kind == "row-major":
        return _rand(rows, cols, dtype, device, seed)
    if kind == "transposed":  # x.t() / w.t(): column-major
        return _rand(cols, rows, dtype, device, seed).t()
    if kind == "strided-cols":  # x[:, ::2]: neither stride is 1
        return _rand(rows, 2 * cols, dtype, device, seed)[:, ::2]
    if kind == "row-slice":  # rows of a wider matrix, pointer offset by one element
        return _rand(rows, cols + 3, dtype, device, seed)[:, 1:cols + 1]
    if kind == "wide-row-slice":  # W[:, :cols] of a 64-column W: 16-byte aligned rows, odd width
        return _rand(rows, 64, dtype, device, seed)[:, :cols]
    if kind == "transposed-slice":  # column-major with 16-byte aligned columns, odd height
        return _rand(cols, 64, dtype, device, seed)[:, :rows].t()
    raise AssertionError(kind)


@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
@pytest.mark.parametrize("a_kind, b_kind", [
    ("transposed", "row-major"),
    ("row-major", "transposed"),  # B = w.t() of an nn.Linear weight
    ("transposed", "transposed"),
    ("strided-cols", "row-major"),
    ("row-major", "strided-cols"),
    ("row-slice", "row-slice"),
    # Aligned rows, with the contiguous dimension (33 or 17) not a multiple of 16 bytes: a 16-byte
    # vector across the tile's wrap would be misaligned on the GPU (wrap_aligned).
    ("row-major", "wide-row-slice"),
    ("transposed-slice", "row-major"),
])
@pytest.mark.parametrize("variant", ["tiled", "splitk3", "tma", "repack", "repack-splitk3"])
def test_any_strides_give_the_right_result(variant, a_kind, b_kind, dtype, torch_device) -> None:
    m, n, k = 17, 33, 70
    a = _operand(a_kind, m, k, dtype, torch_device, 5)
    b = _operand(b_kind, k, n, dtype, torch_device, 6)
    out = matmul_with(VARIANT_CONFIGS[variant], a, b, out=_poisoned(m, n, a))
    _assert_matmul(out, a, b, dtype)


# Rows of 8 fp16 (or 4 fp32) elements' multiples that are not multiples of 16 elements: 16-byte
# aligned, which Triton cannot see, so the launcher passes the ALIGN hints (alignment_hints).
@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
@pytest.mark.parametrize("a_kind, b_kind", [("row-major", "row-major"), ("row-major", "transposed"),
                                            ("transposed", "row-major"), ("transposed", "transposed")])
@pytest.mark.parametrize("variant", ["tiled", "splitk3"])
def test_rows_aligned_to_16_bytes_but_not_16_elements_give_the_right_result(variant, a_kind, b_kind, dtype,
                                                                            torch_device) -> None:
    m, n, k = 24, 40, 104
    a = _operand(a_kind, m, k, dtype, torch_device, 7)
    b = _operand(b_kind, k, n, dtype, torch_device, 8)
    c = _poisoned(m, n, a)
    assert gemm.alignment_hints(a, b, c) == (16 // a.element_size(),) * 2
    _assert_matmul(matmul_with(VARIANT_CONFIGS[variant], a, b, out=c), a, b, dtype)


def test_wrap_is_claimed_aligned_only_where_vectors_cannot_straddle_it(torch_device) -> None:
    def operands(a_kind, b_kind, m=17, n=33, k=64):
        return _operand(a_kind, m, k, "fp16", torch_device, 1), _operand(b_kind, k, n, "fp16", torch_device, 2)

    assert gemm.wrap_aligned(*operands("row-major", "row-major", n=40))
    assert not gemm.wrap_aligned(*operands("row-major", "wide-row-slice"))   # N = 33 along B's rows
    assert gemm.wrap_aligned(*operands("row-major", "transposed"))           # B by columns: N not contiguous
    assert not gemm.wrap_aligned(*operands("transposed-slice", "row-major", n=40))  # M = 17 along A's columns
    assert gemm.wrap_aligned(*operands("transposed", "row-major", m=24, n=40))


def test_alignment_hints_only_where_triton_cannot_see_them(torch_device) -> None:
    def hints(m, n, k, dtype=torch.float16, b_transposed=False):
        a = torch.empty((m, k), dtype=dtype, device=torch_device)
        b = torch.empty((n, k), dtype=dtype, device=torch_device).t() if b_transposed else \
            torch.empty((k, n), dtype=dtype, device=torch_device)
        return gemm.alignment_hints(a, b, torch.empty((m, n), dtype=dtype, device=torch_device))

    assert hints(1000, 1000, 1000) == (8, 8)          # 2,000-byte rows: aligned, 1000 % 16 = 8
    assert hints(1000, 1000, 1000, b_transposed=True) == (8, 8)
    assert hints(64, 4096, 4096) == (1, 1)            # Triton specializes multiples of 16 itself
    assert hints(3333, 257, 4099) == (1, 1)           # odd rows: no hint would be true
    assert hints(16, 257, 1000, b_transposed=True) == (8, 1)  # A and B rows aligned, C's (257) not
    assert hints(16, 1000, 1000, dtype=torch.float32) == (4, 4)
    strided = torch.empty((16, 2000), dtype=torch.float16, device=torch_device)[:, ::2]
    b = torch.empty((1000, 1000), dtype=torch.float16, device=torch_device)
    assert gemm.alignment_hints(strided, b, torch.empty((16, 1000), dtype=torch.float16,
                                                        device=torch_device))[0] == 1  # no unit stride


@pytest.mark.parametrize("layout, valid", [("nn", True), ("nt", True), ("tn", True)])
def test_repack_is_in_the_space_only_where_rows_are_misaligned(layout, valid) -> None:
    from kernels._device import CPU
    config = VARIANT_CONFIGS["repack"]
    odd = Problem("matmul", "fp16", layout, ((3333, 257, 4099),))
    aligned = Problem("matmul", "fp16", layout, ((1000, 1000, 1000),))
    assert MATMUL.space.violation(config, odd, CPU) is None
    reason = MATMUL.space.violation(config, aligned, CPU)
    assert reason is not None and "16-byte aligned" in reason


@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
@pytest.mark.parametrize("b_kind", ["row-major", "transposed"])
@pytest.mark.parametrize("variant", ["tma", "tma-subtile-flatten"])
def test_tma_on_aligned_rows_uses_descriptors(variant, b_kind, dtype, torch_device, monkeypatch) -> None:
    fallbacks = []
    monkeypatch.setattr(gemm, "_launch_tiled", lambda *args: fallbacks.append(args))
    m, n, k = 32, 64, 48  # every row a multiple of 16 bytes in fp16 and fp32
    a = _rand(m, k, dtype, torch_device, 7)
    b = _operand(b_kind, k, n, dtype, torch_device, 8)
    problem = problem_of(a, b)
    assert MATMUL.space.violation(VARIANT_CONFIGS[variant], problem, current_device(torch_device)) is None
    out = matmul_with(VARIANT_CONFIGS[variant], a, b, out=_poisoned(m, n, a))
    assert not fallbacks, "aligned row-major operands must not fall back to the tiled kernel"
    _assert_matmul(out, a, b, dtype)


@pytest.mark.parametrize("a_kind, b_kind", [
    ("transposed", "row-major"),  # TMA needs row-major A
    ("row-slice", "row-major"),  # A's base pointer is 2 bytes past 16-byte alignment
    ("row-major", "strided-cols"),  # B has no unit stride
])
def test_tma_falls_back_to_tiled_on_operands_it_cannot_describe(a_kind, b_kind, torch_device, monkeypatch) -> None:
    calls = []
    tiled = gemm._launch_tiled
    monkeypatch.setattr(gemm, "_launch_tiled", lambda *args: (calls.append(args[0]), tiled(*args)))
    m, n, k = 32, 64, 48
    a = _operand(a_kind, m, k, "fp16", torch_device, 9)
    b = _operand(b_kind, k, n, "fp16", torch_device, 10)
    out = matmul_with(VARIANT_CONFIGS["tma"], a, b, out=_poisoned(m, n, a))
    assert calls == [VARIANT_CONFIGS["tma"]]
    _assert_matmul(out, a, b, "fp16")


def test_tma_falls_back_on_misaligned_k(torch_device) -> None:
    a, b = _rand(32, 47, "fp16", torch_device, 11), _rand(47, 64, "fp16", torch_device, 12)
    _assert_matmul(matmul_with(VARIANT_CONFIGS["tma"], a, b), a, b, "fp16")


@pytest.mark.parametrize("variant", ["splitk2", "splitk3"])
def test_splitk_twice_in_a_row_rearms_arrival_counters(variant, torch_device) -> None:
    # The counters are zeroed once at allocation; the second call is right only if the last
    # program of each tile reset its counter (else no program sums the tile and C stays NaN).
    config = VARIANT_CONFIGS[variant]
    for seed in (13, 14):
        a, b = _rand(33, 47, "fp16", torch_device, seed), _rand(47, 70, "fp16", torch_device, seed + 100)
        out = matmul_with(config, a, b, out=_poisoned(33, 70, a))
        _assert_matmul(out, a, b, "fp16")
        _, arrivals = gemm._WORKSPACE.get(a.device, 0, 0)  # this stream's, as the call used it
        assert int(arrivals.count_nonzero()) == 0


def test_splitk_workspace_grows_for_a_larger_problem(torch_device) -> None:
    config = VARIANT_CONFIGS["splitk2"]
    for m, n, k in ((1, 1, 64), (70, 70, 64), (17, 33, 65)):
        a, b = _rand(m, k, "fp16", torch_device, m), _rand(k, n, "fp16", torch_device, n)
        _assert_matmul(matmul_with(config, a, b), a, b, "fp16")


@pytest.mark.parametrize("layout", ["nn", "nt"])
def test_the_repack_launch_pads_both_operands_in_one_kept_buffer(layout: str, torch_device) -> None:
    """What a repack plan runs (RepackLaunch): both padding copies in one launch into this stream's
    scratch buffer, then the kernel. A second call with new operands reuses the buffer and is right."""
    config = VARIANT_CONFIGS["repack"]
    m, n, k = 33, 20, 47  # K rows of 94 bytes: not 16-byte aligned
    results = []
    for seed in (21, 22):
        a = _rand(m, k, "fp16", torch_device, seed)
        b = _rand(n, k, "fp16", torch_device, seed + 1).t() if layout == "nt" else _rand(k, n, "fp16", torch_device, seed + 1)
        if seed == 21:
            launch = gemm.RepackLaunch(config, a, b, _poisoned(m, n, a))
        out = _poisoned(m, n, a)
        launch(a, b, out)
        _assert_matmul(out, a, b, "fp16")
        results.append(launch._views[0])
    assert results[0] is results[1], "the scratch buffer is kept, not allocated per call"


def test_scratch_grows_by_doubling_per_stream_and_keeps_what_a_side_stream_outgrew(monkeypatch) -> None:
    """The stream query is a stand-in here (the CPU has no CUDA streams): it names the current stream."""
    current = {"stream": 0}
    monkeypatch.setattr(gemm, "_raw_stream", lambda index: current["stream"])
    monkeypatch.setattr(gemm, "_capturing", lambda: False)  # stand-in: nothing captures here
    scratch, cuda = gemm._Scratch(), torch.device("cuda", 0)
    made: list[int] = []

    def make(size: int, kept: bool) -> list[int]:
        assert kept, "outside a capture every buffer is a kept one"
        made.append(size)
        return [size]

    first = scratch.get("x", cuda, 100, make)
    assert scratch.get("x", cuda, 60, make) is first and made == [100]
    scratch.get("x", cuda, 150, make)  # outgrown on the default stream: dropped
    assert made == [100, 200] and scratch._outgrown == []
    current["stream"] = 7  # a side stream, where graphs are captured: its own buffer, outgrown ones kept
    side = scratch.get("x", cuda, 10, make)
    assert side is not first and made[-1] == 10
    scratch.get("x", cuda, 11, make)
    assert made[-1] == 20 and scratch._outgrown == [side]


@pytest.mark.parametrize("variant", ["tiled", "splitk2", "tma", "repack"])
@pytest.mark.parametrize("shape", [(0, 16, 32), (16, 0, 32), (0, 0, 0), (16, 32, 0), (1, 1, 0)],
                         ids=lambda s: "x".join(map(str, s)))
def test_empty_dimensions_give_empty_or_zero_result(variant, shape, torch_device) -> None:
    m, n, k = shape
    a, b = _rand(m, k, "fp16", torch_device, 16), _rand(k, n, "fp16", torch_device, 17)
    out = matmul_with(VARIANT_CONFIGS[variant], a, b, out=_poisoned(m, n, a))
    assert out.shape == (m, n) and out.dtype == torch.float16
    assert torch.equal(out.cpu(), torch.zeros(m, n, dtype=torch.float16))


def test_baseline_config_runs_torch_matmul(torch_device, monkeypatch) -> None:
    for variant in gemm._LAUNCHERS:
        monkeypatch.setitem(gemm._LAUNCHERS, variant, lambda *args: pytest.fail("a Triton kernel was launched"))
    a, b = _rand(5, 7, "fp32", torch_device, 18), _rand(7, 3, "fp32", torch_device, 19)
    assert torch.equal(matmul_with(BASELINE, a, b), torch.matmul(a, b))


def test_spec_reference_and_inputs_follow_the_problem_layout(torch_device) -> None:
    problem = Problem("matmul", "fp16", "tn", ((17, 33, 65),))
    a, b = MATMUL.make_inputs(problem, torch_device, 0)
    assert a.shape == (17, 65) and b.shape == (65, 33)
    assert layout_letter(a) + layout_letter(b) == "tn"
    assert problem_of(a, b) == problem
    again, _ = MATMUL.make_inputs(problem, torch_device, 0)
    assert torch.equal(a, again), "inputs are a function of the seed"
    assert not torch.equal(a, MATMUL.make_inputs(problem, torch_device, 1)[0])
    ref = MATMUL.reference((a, b))
    assert ref.dtype == torch.float32
    _assert_matmul(MATMUL.run(VARIANT_CONFIGS["tiled"], (a, b)), a, b, "fp16")


@pytest.mark.parametrize("shape, expected", [((4, 8), "n"), ((1, 8), "n"), ((8, 1), "n")])
def test_layout_letter_of_row_major_and_degenerate_shapes(shape, expected) -> None:
    assert layout_letter(torch.empty(shape)) == expected


def test_layout_letter_of_transposed_views() -> None:
    assert layout_letter(torch.empty(8, 4).t()) == "t"
    assert layout_letter(torch.empty(4, 16)[:, ::2]) == "n"  # general strides share the row-major key


@pytest.mark.parametrize("variant", [
    "tiled", "splitk2",
    "tma",
])
def test_out_with_strided_columns_gets_the_result(variant, torch_device) -> None:
    a, b = _rand(32, 48, "fp16", torch_device, 21), _rand(48, 64, "fp16", torch_device, 22)
    out = torch.full((32, 128), float("nan"), dtype=torch.float16, device=torch_device)[:, ::2]
    assert matmul_with(VARIANT_CONFIGS[variant], a, b, out=out) is out
    _assert_matmul(out, a, b, "fp16")


def test_out_of_the_wrong_shape_is_rejected(torch_device) -> None:
    a, b = _rand(32, 48, "fp16", torch_device, 23), _rand(48, 64, "fp16", torch_device, 24)
    # A view into a larger buffer, so that the writes past it stay inside memory this test owns.
    buffer = torch.zeros(64 * 64, dtype=torch.float16, device=torch_device)
    with pytest.raises(ValueError, match="out"):
        matmul_with(VARIANT_CONFIGS["tiled"], a, b, out=buffer[:4].view(2, 2))
    assert int(buffer[4:].count_nonzero()) == 0, "the kernel wrote past out"


def test_out_of_another_dtype_is_rejected(torch_device) -> None:
    a, b = _rand(32, 48, "fp16", torch_device, 25), _rand(48, 64, "fp16", torch_device, 26)
    with pytest.raises(TypeError, match="out"):
        matmul_with(VARIANT_CONFIGS["tiled"], a, b, out=torch.empty(32, 64, device=torch_device))


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["tiled", "splitk3", "tma"])
def test_bf16_matches_reference_on_gpu(variant, torch_device) -> None:
    # Under the interpreter tl.dot on bf16 is garbage (GPU.md), so bf16 is checked compiled only.
    gen = torch.Generator().manual_seed(20)
    a = torch.randn(32, 48, generator=gen).to(torch.bfloat16).to(torch_device)
    b = torch.randn(48, 64, generator=gen).to(torch.bfloat16).to(torch_device)
    out = matmul_with(VARIANT_CONFIGS[variant], a, b, out=_poisoned(32, 64, a))
    ref = _reference(a, b)
    error = (out.cpu().double() - ref).norm() / ref.norm()
    assert torch.isfinite(out).all() and error <= 3e-2  # bf16 output rounding ~3e-3 (bench.TOLERANCE)


# ----------------------------------------------------------------------------------------------- errors

def test_mismatched_inner_dimensions_suggest_transposing_b() -> None:
    with pytest.raises(ValueError, match="inner dimensions") as info:
        check_operands(torch.empty(4, 8, dtype=torch.float16), torch.empty(4, 8, dtype=torch.float16))
    assert "b.t()" in str(info.value) and "(4, 8)" in str(info.value)


@pytest.mark.parametrize("dtype", [torch.int32, torch.float64, torch.int8])
def test_unsupported_dtype_is_a_type_error_naming_it(dtype) -> None:
    with pytest.raises(TypeError, match="float16, bfloat16 or float32") as info:
        matmul_with(VARIANT_CONFIGS["tiled"], torch.zeros(4, 4, dtype=dtype), torch.zeros(4, 4, dtype=dtype))
    assert str(dtype) in str(info.value)


def test_mixed_dtypes_are_a_type_error() -> None:
    with pytest.raises(TypeError, match="same dtype"):
        check_operands(torch.zeros(4, 4, dtype=torch.float16), torch.zeros(4, 4, dtype=torch.float32))


@pytest.mark.parametrize("a_shape, b_shape, name", [((2, 4, 4), (4, 4), "a"), ((4, 4), (4,), "b"),
                                                   ((), (4, 4), "a")])
def test_non_2d_operand_is_a_value_error_with_reshape_hint(a_shape, b_shape, name) -> None:
    with pytest.raises(ValueError, match="2-D") as info:
        check_operands(torch.zeros(a_shape, dtype=torch.float16), torch.zeros(b_shape, dtype=torch.float16))
    assert f"{name} has shape" in str(info.value) and "reshape" in str(info.value)


def test_non_tensor_operand_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="b is a list"):
        check_operands(torch.zeros(2, 2, dtype=torch.float16), [[1.0, 2.0], [3.0, 4.0]])
    with pytest.raises(TypeError, match="a is a ndarray"):
        import numpy as np

        check_operands(np.zeros((2, 2)), torch.zeros(2, 2))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device beside the CPU")
def test_operands_on_different_devices_are_a_value_error() -> None:
    with pytest.raises(ValueError, match="move both to one device"):
        check_operands(torch.zeros(4, 4, dtype=torch.float16),
                       torch.zeros(4, 4, dtype=torch.float16, device="cuda"))


@pytest.mark.parametrize("kind", ["row-major", "transposed", "row-slice"])
def test_padding_copy_keeps_values_and_zero_fills_the_rest(kind, torch_device) -> None:
    """repack's one copy (_pad_pair_kernel): A into the buffer's first rows, B^T into the rows after
    them, each zero past K, whatever either operand's layout and alignment."""
    config = VARIANT_CONFIGS["repack"]
    m, k, n = 5, 7, 6
    a, b = _operand(kind, m, k, "fp16", torch_device, 9), _operand(kind, k, n, "fp16", torch_device, 10)
    launch = gemm.RepackLaunch(config, a, b, _poisoned(m, n, a))
    launch._views[0].fill_(float("nan"))  # the copy must write every element, zeros included
    out = _poisoned(m, n, a)
    launch(a, b, out)
    _, a_padded, b_padded = launch._views
    k_padded = config["BLOCK_K"]
    assert a_padded.shape == (m, k_padded) and b_padded.shape == (k_padded, n)
    assert torch.equal(a_padded[:, :k].cpu(), a.cpu()) and not a_padded[:, k:].any()
    assert torch.equal(b_padded[:k].cpu(), b.cpu()) and not b_padded[k:].any()
    _assert_matmul(out, a, b, "fp16")


def test_explicit_repack_calls_run_the_plans_launch(torch_device) -> None:
    """matmul_with (and out=) runs RepackLaunch as a plan does: one kept per operand layout."""
    config = VARIANT_CONFIGS["repack"]
    gemm.LAUNCHES.clear()
    a, b = _rand(9, 13, "fp16", torch_device, 3), _rand(13, 11, "fp16", torch_device, 4)
    for _ in range(2):
        _assert_matmul(matmul_with(config, a, b), a, b, "fp16")
    launches = [entry for entry in gemm.LAUNCHES._entries.values() if isinstance(entry, gemm.RepackLaunch)]
    assert len(launches) == 1


# ------------------------------------------------------------------------------- split-K counters, captured

def test_a_capture_without_a_kept_buffer_gets_one_of_its_own_for_the_call(monkeypatch) -> None:
    """A buffer allocated while the stream captures belongs to that graph's pool: kept by a cache, it would
    be a live block torch.compile's CUDA-graph trees refuse (or hand out again). So the capture gets a
    buffer for its call alone, and nothing is kept; split-K's counters are zeroed in it (a node of the
    graph, before the kernel on every replay). The stream query and the capture check are stand-ins here
    (the CPU has no CUDA streams): they say what CUDA would."""
    state = {"capturing": True}
    monkeypatch.setattr(gemm, "_raw_stream", lambda index: 5)
    monkeypatch.setattr(gemm, "_capturing", lambda: state["capturing"])
    scratch, cuda = gemm._Scratch(), torch.device("cuda", 0)
    made: list[tuple[int, bool]] = []

    def make(size: int, kept: bool) -> list[int]:
        made.append((size, kept))
        return [size]

    assert scratch.get("x", cuda, 100, make) == [100] and made == [(100, False)]
    assert scratch._held == {}, "a capture's buffer is not kept"
    state["capturing"] = False
    kept = scratch.get("x", cuda, 100, make)
    assert made[-1] == (100, True) and scratch._held
    state["capturing"] = True
    assert scratch.get("x", cuda, 60, make) is kept and len(made) == 2, "a kept buffer large enough serves the capture"

    partial, counters = gemm._splitk_buffers(torch.device("cpu"), 1 << 12, kept=False)
    assert partial.numel() == 1 << 12 and counters.numel() == 16 and counters.eq(0).all()


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU (this machine has none)")
def test_split_k_graphs_captured_on_a_fresh_stream_are_right_in_any_replay_order() -> None:
    """Two graphs captured one after another on a new stream (sharing a pool), each with a split-K
    workspace of its own from that pool, zeroed by a node of its graph. Replaying the second first must
    not read unzeroed counters."""
    config = VARIANT_CONFIGS["splitk3"]
    gen = torch.Generator().manual_seed(31)
    a = torch.randn(64, 1024, generator=gen).half().cuda()
    b = torch.randn(1024, 256, generator=gen).half().cuda()
    ref = torch.matmul(a.float(), b.float())
    matmul_with(config, a, b)  # compiled and loaded outside the captures
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    first, second = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with torch.cuda.graph(first, stream=stream):
        out_first = matmul_with(config, a, b)
    with torch.cuda.graph(second, stream=stream, pool=first.pool()):
        out_second = matmul_with(config, a, b)
    assert ("splitk", a.device.index, stream.cuda_stream) not in gemm._SCRATCH._held, \
        "a workspace allocated in a capture is its graph's, not kept"
    out_second.zero_()
    second.replay()
    torch.cuda.synchronize()
    assert torch.allclose(out_second.float(), ref, rtol=2e-2, atol=2e-1)
    first.replay()
    second.replay()
    torch.cuda.synchronize()
    assert torch.allclose(out_first.float(), ref, rtol=2e-2, atol=2e-1)
    assert torch.allclose(out_second.float(), ref, rtol=2e-2, atol=2e-1)


def test_an_out_whose_elements_share_memory_is_refused(torch_device) -> None:
    """As torch's: an expanded out would take every row's result in one row (garbage)."""
    a, b = _rand(4, 32, "fp16", torch_device, 40), _rand(32, 16, "fp16", torch_device, 41)
    expanded = torch.empty(1, 16, dtype=torch.float16, device=torch_device).expand(4, 16)
    with pytest.raises(ValueError, match="share memory"):
        matmul_with(VARIANT_CONFIGS["tiled"], a, b, out=expanded)
    assert not gemm.overlapping(torch.empty(4, 16)) and not gemm.overlapping(torch.empty(16, 4).t())
    assert not gemm.overlapping(torch.empty(4, 20)[:, 2:18]) and gemm.overlapping(torch.empty(8).as_strided((4, 4), (1, 1)))


# ------------------------------------------------------------------------------------------ gemv

def _gemv(block_n: int = 2, block_k: int = 256, **changes) -> Config:
    return _config("gemv", **{"GROUP_SIZE_M": 1, "GEMV_BLOCK_N": block_n, "GEMV_BLOCK_K": block_k, **changes})


@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
@pytest.mark.parametrize("shape", [(1, 1, 1), (1, 77, 300), (1, 64, 512), (3, 50, 129)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("block_n", [1, 4])
def test_gemv_matches_reference(shape, block_n, dtype, torch_device) -> None:
    # K runs that do and do not divide K (EVEN_K), column blocks past N (wrapped loads, masked stores),
    # and more than one row of A: the kernel is right for any M, though the space offers it for M = 1 only.
    m, n, k = shape
    a, b = _rand(m, k, dtype, torch_device, 0), _rand(n, k, dtype, torch_device, 1).t()
    _assert_matmul(matmul_with(_gemv(block_n), a, b, out=_poisoned(m, n, a)), a, b, dtype)


@pytest.mark.parametrize("b_kind", ["row-major", "sliced"])
def test_gemv_takes_any_strides(b_kind, torch_device) -> None:
    a = _rand(1, 96, "fp16", torch_device, 0)
    b = _rand(96, 40, "fp16", torch_device, 1) if b_kind == "row-major" else _rand(50, 200, "fp16", torch_device, 1)[:, ::2].t()
    b = b[:96] if b_kind == "sliced" else b
    _assert_matmul(matmul_with(_gemv(2), a, b), a, b, "fp16")


def test_gemv_is_in_the_space_for_one_row_of_a_k_major_b_only(torch_device) -> None:
    device = current_device(torch_device)
    config = MATMUL.space.canonical(_gemv(4, 512))
    one_row = Problem("matmul", "fp16", "nt", ((1, 4096, 4096),))
    assert MATMUL.space.violation(config, one_row, device) is None
    eight_rows = Problem("matmul", "fp16", "nt", ((8, 4096, 4096),))
    assert "M = 8" in MATMUL.space.violation(config, eight_rows, device)
    row_major_b = Problem("matmul", "fp16", "nn", ((1, 4096, 4096),))
    assert "K-major B" in MATMUL.space.violation(config, row_major_b, device)
    too_long = MATMUL.space.canonical(_gemv(8, 4096, num_warps=2))
    assert "partial sums per thread" in MATMUL.space.violation(too_long, one_row, device)
    # Its seeds join the seeds of one-row problems, and only theirs.
    assert any(c["VARIANT"] == "gemv" for c in MATMUL.seeds(one_row, device))
    assert not any(c["VARIANT"] == "gemv" for c in MATMUL.seeds(eight_rows, device))


def test_gemv_folds_what_it_does_not_use_and_others_fold_its_blocks() -> None:
    folded = MATMUL.space.canonical(_gemv(2, 1024, BLOCK_M=64, BLOCK_N=128, BLOCK_K=256, SPLIT_K=4, GROUP_SIZE_M=8))
    assert (folded["BLOCK_M"], folded["BLOCK_N"], folded["BLOCK_K"], folded["SPLIT_K"]) == (16, 32, 32, 1)
    assert (folded["GEMV_BLOCK_N"], folded["GEMV_BLOCK_K"]) == (2, 1024)
    # The other variants leave gemv's blocks out, as configs stored before gemv existed do: one form.
    tiled = MATMUL.space.canonical(_config("tiled", GEMV_BLOCK_N=8, GEMV_BLOCK_K=4096))
    assert tiled == _config("tiled") and "GEMV_BLOCK_N" not in tiled.as_dict()
    one_row = Problem("matmul", "fp16", "nt", ((1, 64, 512),))
    enumerated = list(MATMUL.space.enumerate(one_row, current_device(torch.device("cpu"))))
    assert all(("GEMV_BLOCK_N" in c.as_dict()) == (c["VARIANT"] == "gemv") for c in enumerated)
    assert all(MATMUL.space.canonical(c, one_row) == c for c in enumerated[::50])


def test_a_config_stored_before_gemv_is_still_in_the_space(torch_device) -> None:
    # Tables and databases written before GEMV_BLOCK_N/GEMV_BLOCK_K existed leave them out.
    old = _config("tiled")
    assert "GEMV_BLOCK_N" not in old.as_dict()
    problem = Problem("matmul", "fp16", "nt", ((64, 256, 256),))
    assert MATMUL.space.violation(old, problem, current_device(torch_device)) is None
    assert MATMUL.space.canonical(old) == old
