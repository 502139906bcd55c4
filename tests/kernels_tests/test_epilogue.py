"""Fused epilogues: bias in the GEMM and the SiLU-gated gate/up product, against torch, and as tuner kernels.

fp32 and fp16 on the CPU under the interpreter (its bf16 dot is wrong, GPU.md); every dtype on a GPU.
"""

from __future__ import annotations


import pytest
import torch
from _helpers import DEVICE, relative_error

import kernels
from kernels._device import current_device
from kernels._spec import Config, Problem
from kernels.epilogue import gated_matmul_with, matmul_bias_with

TOLERANCE = {"fp32": 1e-4, "fp16": 1e-2, "bf16": 2e-2}  # relative L2 error; the interpreter's fp16 ~3e-4
# On a GPU the kernels' fp32 dot runs in TF32 (gemm._dot_precision), as torch's own matmul may: the
# H100 measured 6.9e-4 (matmul_bias) and 1.6e-3 (gated_matmul) on the pinning test's 16x32x64.
TF32_TOLERANCE = 3e-3
SMALL = Config.make(BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, GROUP_SIZE_M=4, num_warps=2, num_stages=2)


def _tolerance(dtype: str) -> float:
    return TF32_TOLERANCE if dtype == "fp32" and DEVICE == "cuda" else TOLERANCE[dtype]


pytestmark = pytest.mark.usefixtures("own_database")


_error = relative_error


CPU_DTYPES = ["fp32", "fp16"]


@pytest.mark.parametrize("kernel", ["matmul_bias", "gated_matmul"])
@pytest.mark.parametrize("dtype", CPU_DTYPES)
@pytest.mark.parametrize("layout", ["nn", "nt"])
def test_epilogue_kernel_matches_its_reference(kernel: str, dtype: str, layout: str) -> None:
    spec = kernels.get_kernel(kernel)
    problem = Problem(kernel, dtype, layout, ((20, 40, 72),))  # no dimension a tile multiple
    inputs = spec.make_inputs(problem, DEVICE, 0)
    assert spec.problem_of(*inputs) == problem
    out = spec.run(SMALL, inputs)
    assert out.shape == (20, 40)
    tolerance = _tolerance(dtype)
    assert _error(out, spec.reference(inputs)) < tolerance
    assert _error(spec.baseline(inputs), spec.reference(inputs)) < tolerance


def test_dispatched_epilogues_match_torch() -> None:
    a = torch.randn(9, 48, device=DEVICE).half()
    w_gate, w_up = torch.randn(2, 24, 48, device=DEVICE).div(48 ** 0.5).half()
    bias = torch.randn(24, device=DEVICE).half()
    expected_bias = a.float() @ w_gate.float().t() + bias.float()
    assert _error(kernels.matmul_bias(a, w_gate.t(), bias), expected_bias) < TOLERANCE["fp16"]
    stacked = torch.cat([w_gate, w_up]).t()  # [K, 2N]: gate columns first
    expected = torch.nn.functional.silu(a.float() @ w_gate.float().t()) * (a.float() @ w_up.float().t())
    assert _error(kernels.gated_matmul(a, stacked), expected) < TOLERANCE["fp16"]


def test_default_configs_are_in_the_space_and_fit() -> None:
    device = current_device()
    for kernel in ("matmul_bias", "gated_matmul"):
        spec = kernels.get_kernel(kernel)
        for shape in ((1, 4096, 4096), (8192, 28672, 8192), (5, 7, 3)):
            problem = Problem(kernel, "bf16", "nt", (shape,))
            config = spec.default_config(problem, device)
            assert spec.outside(config) is None
            assert spec.space.violation(config, problem, device) is None


def test_gated_matmul_rejects_an_odd_stacked_width() -> None:
    a, b = torch.randn(4, 8), torch.randn(8, 7)
    with pytest.raises(ValueError, match="2N"):
        gated_matmul_with(SMALL, a, b)


def test_matmul_bias_rejects_a_bias_of_the_wrong_length() -> None:
    with pytest.raises(ValueError, match="bias has shape"):
        matmul_bias_with(SMALL, torch.randn(4, 8), torch.randn(8, 6), torch.randn(5))


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ["matmul_bias", "gated_matmul"])
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_epilogue_kernels_match_torch_on_the_gpu(kernel: str, dtype: str) -> None:
    spec = kernels.get_kernel(kernel)
    problem = Problem(kernel, dtype, "nt", ((257, 1000, 1032),))
    inputs = spec.make_inputs(problem, "cuda", 0)
    config = spec.default_config(problem, current_device())
    assert _error(spec.run(config, inputs), spec.reference(inputs)) < TOLERANCE[dtype]


@pytest.mark.parametrize("kernel", ["gated_matmul", "matmul_bias"])
@pytest.mark.parametrize("m", [1, 32, 2048])
def test_seeds_are_valid_thin_for_decode_and_respect_the_gated_register_limit(kernel, m) -> None:
    from kernels import get_kernel
    from kernels._spec import DeviceInfo, Problem

    h100 = DeviceInfo("NVIDIA H100 80GB HBM3", "h100", "9.0", 132, 232448)
    spec = get_kernel(kernel)
    problem = Problem(kernel, "bf16", "nt", ((m, 28672, 8192),))
    seeds = spec.seeds(problem, h100)
    assert len(seeds) >= 5 and len(set(seeds)) == len(seeds)
    assert all(spec.space.violation(c, problem, h100) is None and spec.outside(c) is None for c in seeds)
    assert all(c["BLOCK_M"] <= max(16, m) for c in seeds), "no tile taller than the problem needs"
    if m <= 128:
        assert any(c["BLOCK_M"] == 16 for c in seeds), "decode gets thin tiles"
    if kernel == "gated_matmul":  # two accumulators: 128x256 would spill at 8 warps
        assert all(2 * c["BLOCK_M"] * c["BLOCK_N"] // (32 * c.num_warps) <= 256 for c in seeds)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_the_gating_of_the_cublas_path_matches_torch_on_padded_rows(dtype: torch.dtype) -> None:
    """``silu_mul`` (the gated baseline's one-pass gating; the interpreter runs its kernel on the CPU) on
    an [M, 2N] whose rows are padded past 2N and whose N is no block multiple: the up half starts N
    columns into each row, wherever that row starts."""
    from kernels import _INTERPRETED
    from kernels.epilogue import silu_mul

    n = 1500
    c = torch.randn(7, 2 * n + 24, device=DEVICE, dtype=dtype)[:, :2 * n]
    out = silu_mul(c)
    assert out.shape == (7, n) and out.dtype == dtype and out.is_contiguous()
    expected = torch.nn.functional.silu(c[:, :n].float()) * c[:, n:].float()
    assert relative_error(out.float(), expected) < (1e-6 if dtype == torch.float32 else 1e-3)
    from kernels.gemm import LAUNCHES
    ran_triton = LAUNCHES.get(("silu_mul", 7, n, c.stride(0), dtype, c.device, c.data_ptr() % 16)) is not None
    assert ran_triton == (_INTERPRETED or DEVICE != "cpu"), "the kernel runs wherever Triton does"


def test_the_gated_baseline_is_one_gemm_and_the_one_pass_gating() -> None:
    """The baseline the tuner's contest times is what dispatch runs for a cuBLAS gated plan."""
    from kernels.epilogue import _baseline

    a = torch.randn(9, 40, device=DEVICE)
    b = torch.randn(40, 2 * 24, device=DEVICE)
    c = a @ b
    expected = torch.nn.functional.silu(c[:, :24]) * c[:, 24:]
    torch.testing.assert_close(_baseline((a, b)), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kernel", ["matmul_bias", "gated_matmul"])
def test_pinning_makes_the_public_call_run_each_config_then_restores_dispatch(kernel: str, monkeypatch) -> None:
    """What the tuner's eager timing runs (tuner/timing.py public_call): the public call, its config forced."""
    from kernels import BASELINE, epilogue

    spec = kernels.get_kernel(kernel)
    problem = Problem(kernel, "fp32", "nn", ((16, 32, 64),))
    inputs = spec.make_inputs(problem, DEVICE, 3)
    public = kernels.matmul_bias if kernel == "matmul_bias" else kernels.gated_matmul
    ran: list[Config] = []
    launch = epilogue._launch
    monkeypatch.setattr(epilogue, "_launch", lambda config, *args, **kw: (ran.append(config), launch(config, *args, **kw))[1])
    other = SMALL.replace(num_stages=3)
    with epilogue.pinning(spec, [SMALL, other, BASELINE], *inputs[:2]) as (small, wider, cublas):
        small()
        assert relative_error(public(*inputs), spec.reference(inputs)) <= _tolerance("fp32")
        wider()
        public(*inputs)
        cublas()
        public(*inputs)  # torch's path: no launch of ours
    assert ran == [SMALL, other]
    assert all(epilogue.DISPATCHER.cached(epilogue._key(spec, *inputs[:2], mode)) is None for mode in kernels.MODES), \
        "the pins are gone once the block is over"
    public(*inputs)  # dispatch decides again: no record, so this device's policy for an untuned problem
    device = current_device(torch.device(DEVICE))
    if device.is_cpu:  # the default config
        assert ran[-1] == spec.default_config(problem, device)
    else:  # cuBLAS (KernelSpec.baseline_when_untuned, dispatch._untuned_choice): no launch of ours
        assert ran == [SMALL, other]



def _spy_on_dispatch(monkeypatch) -> tuple[list[int], list[Config]]:
    """(one entry per resolve, the config of each launch through ``_launch``): the real functions, counted."""
    from kernels import epilogue

    resolved: list[int] = []
    real_resolve = epilogue._resolve
    monkeypatch.setattr(epilogue, "_resolve", lambda *args: (resolved.append(1), real_resolve(*args))[1])
    ran: list[Config] = []
    launch = epilogue._launch
    monkeypatch.setattr(epilogue, "_launch", lambda config, *args, **kw: (ran.append(config), launch(config, *args, **kw))[1])
    return resolved, ran

def test_a_signature_on_addmm_in_every_mode_skips_dispatch_until_its_answers_change(monkeypatch) -> None:
    """matmul_bias keeps signatures that dispatch sends to torch.addmm in both modes (epilogue._PATHS): a
    repeated call skips resolving. A new answer (a pin, kernels.clear_cache()) must be asked again."""
    from kernels import BASELINE, epilogue

    spec = kernels.MATMUL_BIAS
    inputs = spec.make_inputs(Problem("matmul_bias", "fp32", "nn", ((16, 32, 64),)), DEVICE, 5)
    resolved, ran = _spy_on_dispatch(monkeypatch)
    with epilogue.pinning(spec, [BASELINE, SMALL], *inputs[:2]) as (cublas, small):
        cublas()
        first = kernels.matmul_bias(*inputs)
        assert len(resolved) == 3, "the call's mode, then both modes once, to learn the signature"
        again = kernels.matmul_bias(*inputs)
        assert len(resolved) == 3 and torch.equal(again, first), "learnt: no resolving"
        assert relative_error(again, spec.reference(inputs)) <= _tolerance("fp32")
        small()  # a new answer: asked again, and it runs
        kernels.matmul_bias(*inputs)
        assert len(resolved) == 4 + 2 and ran == [SMALL], "the call's mode, then both modes for its ready calls"
        kernels.matmul_bias(*inputs)
        assert len(resolved) == 6 and ran == [SMALL], "the ready call: no resolving, no launch through _launch"
        cublas()
        kernels.matmul_bias(*inputs)
        kernels.clear_cache()  # forgets the pins too: this device's policy decides again
        kernels.matmul_bias(*inputs)
        assert len(resolved) > 7


def test_a_signature_on_addmm_in_eager_mode_alone_resolves_once_per_call_and_a_bad_b_is_named(monkeypatch) -> None:
    """Beside a kernel's graph winner (as the tuner's eager contest pins it, ``graph=``), addmm is not learnt as
    addmm in every mode: its first call resolves its mode, both modes to learn it, and both again to make its
    ready calls (epilogue._READY); later calls resolve nothing."""
    from kernels import BASELINE, epilogue

    spec = kernels.MATMUL_BIAS
    inputs = spec.make_inputs(Problem("matmul_bias", "fp32", "nn", ((16, 32, 64),)), DEVICE, 6)
    resolved: list[int] = []
    real_resolve = epilogue._resolve
    monkeypatch.setattr(epilogue, "_resolve", lambda *args: (resolved.append(1), real_resolve(*args))[1])
    with epilogue.pinning(spec, [BASELINE], *inputs[:2], graph=SMALL) as (install,):
        install()
        for mode in kernels.MODES:
            assert epilogue.DISPATCHER.cached(epilogue._key(spec, *inputs[:2], mode)) == (
                BASELINE if mode == kernels.EAGER else SMALL)
        first = kernels.matmul_bias(*inputs)
        assert len(resolved) == 3 + 2
        assert torch.equal(kernels.matmul_bias(*inputs), first) and len(resolved) == 5
    a, b, bias = inputs
    with epilogue.pinning(spec, [BASELINE], a, b) as (install,):
        install()
        kernels.matmul_bias(a, b, bias)  # learnt: addmm in both modes
        with pytest.raises(TypeError, match="float64"):  # the first call's check, not torch's addmm error
            kernels.matmul_bias(a, b.double(), bias)


# ----------------------------------------------------------------------------------- the one-row loop

def _gemv(block_n: int = 2, block_k: int = 256, warps: int = 2) -> Config:
    return Config.make(BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, GROUP_SIZE_M=1, GEMV_BLOCK_N=block_n,
                       GEMV_BLOCK_K=block_k, num_warps=warps, num_stages=2)


@pytest.mark.parametrize("kernel", ["matmul_bias", "gated_matmul"])
@pytest.mark.parametrize("dtype", CPU_DTYPES)
@pytest.mark.parametrize("shape", [(1, 40, 300), (1, 64, 512), (3, 33, 72)], ids=lambda s: "x".join(map(str, s)))
def test_the_one_row_loop_matches_its_reference(kernel: str, dtype: str, shape) -> None:
    # K runs that do and do not divide K, column blocks past N, and (forced) more than one row.
    spec = kernels.get_kernel(kernel)
    problem = Problem(kernel, dtype, "nt", (shape,))
    inputs = spec.make_inputs(problem, DEVICE, 0)
    out = spec.run(_gemv(4), inputs)
    assert out.shape == shape[:2]
    assert _error(out, spec.reference(inputs)) < _tolerance(dtype)


@pytest.mark.parametrize("kernel", ["matmul_bias", "gated_matmul"])
def test_the_one_row_loop_is_in_the_space_for_one_row_of_a_k_major_b_only(kernel: str) -> None:
    spec, device = kernels.get_kernel(kernel), current_device(torch.device("cpu"))
    config = spec.space.canonical(_gemv(4, 1024))
    one_row = Problem(kernel, "fp16", "nt", ((1, 4096, 4096),))
    assert spec.space.violation(config, one_row, device) is None
    assert "M = 8" in spec.space.violation(config, Problem(kernel, "fp16", "nt", ((8, 4096, 4096),)), device)
    assert "GEMV_BLOCK_N=0" in spec.space.violation(config, Problem(kernel, "fp16", "nn", ((1, 4096, 4096),)), device)
    assert any(c.get("GEMV_BLOCK_N") for c in spec.seeds(one_row, device))
    assert all(spec.space.violation(c, one_row, device) is None for c in spec.seeds(one_row, device))
    # A tensor-core config is written as before the loop existed, and one stored then is in the space.
    assert spec.space.canonical(SMALL.replace(GEMV_BLOCK_N=0, GEMV_BLOCK_K=2048)) == SMALL
    assert spec.space.violation(SMALL, one_row, device) is None
    enumerated = list(spec.space.enumerate(Problem(kernel, "fp16", "nt", ((1, 64, 512),)), device))
    assert any(c.get("GEMV_BLOCK_N") for c in enumerated)
    assert all("GEMV_BLOCK_K" not in c.as_dict() for c in enumerated if not c.get("GEMV_BLOCK_N"))


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ["matmul_bias", "gated_matmul"])
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_the_one_row_loop_matches_torch_and_replays_from_a_cuda_graph(kernel: str, dtype: str) -> None:
    spec = kernels.get_kernel(kernel)
    problem = Problem(kernel, dtype, "nt", ((1, 3000, 4104),))  # K not a run multiple, N not a block multiple
    inputs = spec.make_inputs(problem, "cuda", 0)
    config = spec.space.canonical(_gemv(4, 2048, warps=4))  # the gated kernel's two sums a column fit 4 warps
    assert spec.space.violation(config, problem, current_device()) is None
    assert _error(spec.run(config, inputs), spec.reference(inputs)) < TOLERANCE[dtype]
    spec.run(config, inputs)  # the direct launch from its second call on
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = spec.run(config, inputs)
    fresh = spec.make_inputs(problem, "cuda", 1)
    for held, new in zip(inputs, fresh):
        held.copy_(new)
    graph.replay()
    torch.cuda.synchronize()
    assert _error(out, spec.reference(fresh)) < TOLERANCE[dtype]


def test_a_gated_signature_runs_its_ready_calls_per_mode_until_dispatch_changes(monkeypatch) -> None:
    """A repeated gated call skips resolving and the launch cache (epilogue._READY): the eager winner outside
    a capture, the graph winner in graph mode, and the resolving path again for operands its kernel was not
    compiled for (another 16-byte alignment) and after dispatch's answers change."""
    from kernels import BASELINE, epilogue

    spec = kernels.GATED_MATMUL
    inputs = spec.make_inputs(Problem("gated_matmul", "fp32", "nn", ((16, 32, 64),)), DEVICE, 7)
    a, b = inputs[:2]
    expected = spec.reference(inputs)
    resolved, ran = _spy_on_dispatch(monkeypatch)
    with epilogue.pinning(spec, [SMALL], a, b, graph=BASELINE) as (install,):
        install()
        first = kernels.gated_matmul(a, b)
        assert ran == [SMALL] and len(resolved) == 1 + 2, "its mode, then both modes for the ready calls"
        again = kernels.gated_matmul(a, b)
        assert torch.equal(again, first) and ran == [SMALL] and len(resolved) == 3, "ready: no resolve, no _launch"
        assert relative_error(again, expected) <= _tolerance("fp32")
        with kernels.dispatch_mode(kernels.GRAPH):  # the graph winner, cuBLAS and the one-pass gating
            graph = kernels.gated_matmul(a, b)
        assert ran == [SMALL] and len(resolved) == 3
        assert relative_error(graph, expected) <= _tolerance("fp32")
        shifted = torch.empty(a.numel() + 1, device=DEVICE)[1:].view(a.shape).copy_(a)  # 4 bytes off 16
        assert shifted.data_ptr() % 16 != a.data_ptr() % 16
        assert relative_error(kernels.gated_matmul(shifted, b), expected) <= _tolerance("fp32")
        assert ran == [SMALL, SMALL] and len(resolved) == 4, "declined: the resolving path ran it"
        kernels.clear_cache()  # new answers: this device's policy, asked again and made ready again
        kernels.gated_matmul(a, b)
        assert len(resolved) == 4 + 3
        kernels.gated_matmul(a, b)
        assert len(resolved) == 7


def test_a_ready_bias_call_declines_a_bias_it_cannot_take() -> None:
    """A broadcast bias ([1, N]) on a Triton config's signature: the ready call declines it and the resolving
    path says what is wrong, as on the first call."""
    from kernels import epilogue

    spec = kernels.MATMUL_BIAS
    a, b, bias = spec.make_inputs(Problem("matmul_bias", "fp32", "nn", ((16, 32, 64),)), DEVICE, 8)
    with epilogue.pinning(spec, [SMALL], a, b) as (install,):
        install()
        first = kernels.matmul_bias(a, b, bias)
        assert relative_error(kernels.matmul_bias(a, b, bias), first) == 0
        with pytest.raises(ValueError, match="bias has shape"):
            kernels.matmul_bias(a, b, bias[None, :])
        assert relative_error(kernels.matmul_bias(a, b, bias.clone()), first) == 0
