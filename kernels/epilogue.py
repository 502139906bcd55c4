"""GEMMs that do more per byte they move: a bias added in the epilogue, and the SiLU-gated gate/up product.

Two kernel families, each a problem of its own for the tuner (its own KernelSpec, space, reference):
- ``matmul_bias``: C = A @ B + bias, bias [N] broadcast over rows (``nn.Linear``'s forward in one launch);
- ``gated_matmul``: C = silu(A @ Bg) * (A @ Bu), with the gate and up weights stacked in one B [K, 2N]
  (columns 0..N the gate, N..2N the up; ``w = torch.cat([w_gate, w_up]).t()`` for weights kept as
  ``nn.Linear`` keeps them). One program computes both accumulators of its tile, so A is read once and
  the [M, 2N] intermediate never reaches memory.
Both share the tiled kernel's inner loop (``_gemm_triton._tile_dot``); the problem's N is the output width.
For one row of A against a K-major B, ``GEMV_BLOCK_N`` > 0 runs the matmul ``gemv`` variant's loop instead
(``_gemm_triton._gemv_row``: 1-8 columns per program, long runs of K, no tensor cores): a decode step's
gate/up projection is more than half of a decoder layer's weight bytes.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import torch
import triton
import triton.language as tl

from ._check import loud_edges
from ._gemm_triton import _gemv_row, _grouped_tile, _tile_dot, _tile_offsets
from ._launch import SLOT_A, SLOT_B, SLOT_BIAS, SLOT_C, DirectLaunch
from . import _device, _modes, _native
from ._device import current_device
from ._record_mode import RECORDER as _REC
from ._spec import BASELINE, Config, DeviceInfo, KernelSpec, Param, Problem, SearchSpace, is_baseline, log_distance
from .dispatch import DISPATCHER, TORCH_HOST_FLOOR_MS
from .gemm import (_GEMV_MAX_ROWS, DTYPE_NAMES, GEMV_SEEDS, LAUNCHES, TORCH_DTYPES, _dot_precision, _needs_int64,
                   gemv_blocks_fit, gemv_unsupported, layout_letter)

__all__ = ["GATED_MATMUL", "MATMUL_BIAS", "BiasError", "gated_matmul", "gated_matmul_with", "matmul_bias", "matmul_bias_with"]

SPACE = SearchSpace(params=(
    Param("BLOCK_M", (16, 32, 64, 128, 256)),
    Param("BLOCK_N", (32, 64, 128, 256)),
    Param("BLOCK_K", (32, 64, 128)),
    Param("GROUP_SIZE_M", (1, 4, 8, 16)),
    Param("num_warps", (2, 4, 8)),
    Param("num_stages", (2, 3, 4, 5)),
    # 0: tensor-core tiles (BLOCK_M/N/K); 1-8: the one-row loop with this many columns per program and
    # GEMV_BLOCK_K of K per step. Added after tables were shipped: a config stored before leaves both out.
    Param("GEMV_BLOCK_N", (0, 1, 2, 4, 8), default=0),
    Param("GEMV_BLOCK_K", (256, 512, 1024, 2048, 4096), default=256),
))
# The one-row loop's tile placeholders, and the tiled kernel's (left out of its configs, as before gemv).
_IGNORED = {"GEMV_BLOCK_N": {0: {"GEMV_BLOCK_N": 0, "GEMV_BLOCK_K": 256},
                             **{n: {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_SIZE_M": 1}
                                for n in (1, 2, 4, 8)}}}


def _is_gemv(config: Config) -> bool:
    return bool(config.get("GEMV_BLOCK_N", 0))


@triton.jit
def _epilogue_kernel(a_ptr, b_ptr, c_ptr, bias_ptr, M, N, K,
                     stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     GROUP_SIZE_M: tl.constexpr, EVEN_K: tl.constexpr, INDEX_64: tl.constexpr,
                     DOT_PRECISION: tl.constexpr, HAS_BIAS: tl.constexpr, GATED: tl.constexpr):
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid_m, pid_n = _grouped_tile(tl.program_id(0), num_pid_m, num_pid_n, GROUP_SIZE_M)
    acc = _tile_dot(a_ptr, b_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                    pid_m, pid_n, 0, tl.cdiv(K, BLOCK_K),
                    BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, INDEX_64, DOT_PRECISION, 1, False)
    offs_m, offs_n = _tile_offsets(pid_m, pid_n, BLOCK_M, BLOCK_N, INDEX_64)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
    if GATED:  # the up half of B starts N columns in
        up = _tile_dot(a_ptr, b_ptr + N * stride_bn, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                       pid_m, pid_n, 0, tl.cdiv(K, BLOCK_K),
                       BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, INDEX_64, DOT_PRECISION, 1, False)
        acc = acc * tl.sigmoid(acc) * up
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


@triton.jit
def _epilogue_gemv_kernel(a_ptr, b_ptr, c_ptr, bias_ptr, M, N, K,
                          stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                          BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
                          INDEX_64: tl.constexpr, HAS_BIAS: tl.constexpr, GATED: tl.constexpr):
    """The epilogues on one row of A per program row (grid: column blocks x rows), gemv's loop for the dots."""
    pid_n = tl.program_id(0)
    row = tl.program_id(1)
    if INDEX_64:
        row = row.to(tl.int64)
    a_row = a_ptr + row * stride_am
    acc = _gemv_row(a_row, b_ptr, N, K, stride_ak, stride_bk, stride_bn, pid_n, BLOCK_N, BLOCK_K, EVEN_K, INDEX_64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)
    if GATED:  # the up half of B starts N columns in
        up = _gemv_row(a_row, b_ptr + N * stride_bn, N, K, stride_ak, stride_bk, stride_bn, pid_n,
                       BLOCK_N, BLOCK_K, EVEN_K, INDEX_64)
        acc = acc * tl.sigmoid(acc) * up
    tl.store(c_ptr + row * stride_cm + offs_n * stride_cn, acc.to(c_ptr.dtype.element_ty), mask=offs_n < N)


def _launch(config: Config, a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, n: int,
            gated: bool) -> torch.Tensor:
    """The epilogue kernel on these operands, launched directly after its first call (kernels/_launch.py):
    Triton's own launch path costs 16-30 us of host time per call on the H100 boxes, 2-3x the kernel of
    a decode step's gated projection."""
    m, k = a.shape
    c = a.new_empty((m, n))
    if m == 0 or n == 0:
        return c
    launch = LAUNCHES.get_or_make(_launch_key(config, a, b, bias, gated),
                                  lambda: _epilogue_launch(config, a, b, c, bias, gated))
    launch(a, b, c, bias if bias is not None else c, m, n, k,
           a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1))
    return c


def _launch_key(config: Config, a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, gated: bool) -> tuple:
    """Everything Triton specializes an epilogue launch on (C is [M, N] row-major, fresh: 16-byte aligned)."""
    m, k = a.shape
    n = b.shape[1] // 2 if gated else b.shape[1]  # the output's width
    return ("epilogue", config, gated, bias is not None, a.dtype, a.device, m, n, k, *a.stride(),
            *b.stride(), a.data_ptr() % 16, b.data_ptr() % 16,
            None if bias is None else (bias.dtype, bias.data_ptr() % 16))


def _epilogue_launch(config: Config, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, bias: torch.Tensor | None,
                     gated: bool) -> DirectLaunch:
    m, k = a.shape
    if _is_gemv(config):
        if m > _GEMV_MAX_ROWS:  # one program row per row of A, on a grid axis CUDA caps there
            raise ValueError(f"GEMV_BLOCK_N > 0 runs a row of programs per row of A, at most {_GEMV_MAX_ROWS}; A has "
                             f"{m} rows: use a config with GEMV_BLOCK_N=0 (tensor-core tiles)")
        bn, bk = config["GEMV_BLOCK_N"], config["GEMV_BLOCK_K"]
        return DirectLaunch(_epilogue_gemv_kernel, (triton.cdiv(c.shape[1], bn), m), dict(
            BLOCK_N=bn, BLOCK_K=bk, EVEN_K=k % bk == 0, INDEX_64=_needs_int64(a, b, c), HAS_BIAS=bias is not None,
            GATED=gated, num_warps=config.num_warps, num_stages=config.num_stages))
    bm, bn = config["BLOCK_M"], config["BLOCK_N"]
    grid = (triton.cdiv(m, bm) * triton.cdiv(c.shape[1], bn),)
    return DirectLaunch(_epilogue_kernel, grid, dict(
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=config["BLOCK_K"], GROUP_SIZE_M=config["GROUP_SIZE_M"],
        EVEN_K=k % config["BLOCK_K"] == 0, INDEX_64=_needs_int64(a, b, c), DOT_PRECISION=_dot_precision(a),
        HAS_BIAS=bias is not None, GATED=gated, num_warps=config.num_warps, num_stages=config.num_stages))


def _check(name: str, a: Any, b: Any, columns_per_output: int) -> None:
    for label, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor) or t.dim() != 2:
            raise TypeError(f"{name} takes 2-D torch tensors; {label} is {getattr(t, 'shape', type(t).__name__)}")
        if t.dtype not in DTYPE_NAMES:
            raise TypeError(f"{name} takes float16, bfloat16 or float32; {label} is {t.dtype}")
    if a.dtype != b.dtype or a.device != b.device:
        raise TypeError(f"{name}: a and b must share dtype and device; got {a.dtype}/{a.device}, {b.dtype}/{b.device}")
    if a.shape[1] != b.shape[0] or b.shape[1] % columns_per_output:
        raise ValueError(f"{name}: a is {tuple(a.shape)} and b {tuple(b.shape)}; b must be [K, "
                         f"{'2N (gate then up)' if columns_per_output == 2 else 'N'}] with K = a's columns")


def matmul_bias_with(config: Config, a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """A @ B + bias with one explicit config."""
    _check("matmul_bias", a, b, 1)
    _check_bias(a, b, bias)
    return _launch(config, a, b, bias if bias.is_contiguous() else bias.contiguous(), b.shape[1], gated=False)


class BiasError(ValueError, RuntimeError):
    """A bias ``matmul_bias`` does not take. A ValueError; a RuntimeError too, which is what torch.addmm's
    refusal was where dispatch sent the call there, so code that caught that still does."""


def _check_bias(a: torch.Tensor, b: torch.Tensor, bias: Any) -> None:
    """Raise where ``bias`` is not one row of the output's width in a's dtype on a's device: every path of
    ``matmul_bias`` takes that and nothing else (torch.addmm would broadcast a [M, N] bias, a kernel would
    read another dtype), so what is accepted does not depend on which config won."""
    if not isinstance(bias, torch.Tensor):
        raise TypeError(f"matmul_bias takes a torch tensor bias; got {type(bias).__name__}")
    n = b.shape[1]
    if bias.shape != (n,):
        hint = "bias.reshape(-1)" if bias.numel() == n else "kernels.matmul(a, b) + bias (or torch.addmm)"
        raise BiasError(f"matmul_bias: bias has shape {tuple(bias.shape)}; it must be [{n}], one value per output "
                         f"column (b is {tuple(b.shape)}): pass {hint}")
    if bias.dtype != a.dtype:
        raise BiasError(f"matmul_bias: bias is {bias.dtype}, a and b {a.dtype}; pass bias.to({a.dtype})")
    if bias.device != a.device:
        raise BiasError(f"matmul_bias: bias is on {bias.device}, a and b on {a.device}; pass bias.to('{a.device}')")


def gated_matmul_with(config: Config, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """silu(A @ B[:, :N]) * (A @ B[:, N:]) with one explicit config; B is [K, 2N]."""
    _check("gated_matmul", a, b, 2)
    return _launch(config, a, b, None, b.shape[1] // 2, gated=True)


# ---------------------------------------------------------------------------------------------- the specs

def _fits_shared_memory(config: Config, problem: Problem, device: DeviceInfo) -> str | None:
    if _is_gemv(config):  # plain loads into registers
        return None
    size = 4 if problem.dtype == "fp32" else 2
    b_tiles = 2 if problem.kernel == "gated_matmul" else 1
    need = config.num_stages * (config["BLOCK_M"] + b_tiles * config["BLOCK_N"]) * config["BLOCK_K"] * size
    if need > device.shared_memory_bytes:
        return f"needs ~{need // 1024} KiB of shared memory, over the device's {device.shared_memory_bytes // 1024} KiB"
    return None


def _fits_registers(config: Config, problem: Problem, device: DeviceInfo) -> str | None:
    # The tiled kernel's measured limit (gemm._fits_registers), with the gated kernel's two accumulators.
    accumulators = 2 if problem.kernel == "gated_matmul" else 1
    per_thread = accumulators * config["BLOCK_M"] * config["BLOCK_N"] // (32 * config.num_warps)
    return None if per_thread <= 256 else f"{per_thread} fp32 accumulators per thread would spill"


def _gemv_fits(config: Config, problem: Problem, device: DeviceInfo) -> str | None:
    if not _is_gemv(config):
        return None
    reason = gemv_unsupported(problem)
    if reason:
        return f"GEMV_BLOCK_N > 0 {reason}: use GEMV_BLOCK_N=0"
    return gemv_blocks_fit(config, problem, accumulators=2 if problem.kernel == "gated_matmul" else 1)


SPACE = SearchSpace(params=SPACE.params, constraints=(_gemv_fits, _fits_shared_memory, _fits_registers),
                    ignored=_IGNORED)


def _make_inputs(kernel: str):
    def make_inputs(problem: Problem, device: Any, seed: int) -> tuple:
        m, n, k = problem.shapes[0]
        gen = torch.Generator(device=device).manual_seed(seed)
        dtype = TORCH_DTYPES[problem.dtype]
        scale = k ** -0.25  # C = O(1)

        def rand(*shape: int) -> torch.Tensor:
            return (torch.randn(shape, generator=gen, device=device) * scale).to(dtype)

        a = rand(k, m).t() if problem.layout[0] == "t" else rand(m, k)
        width = 2 * n if kernel == "gated_matmul" else n
        b = rand(width, k).t() if problem.layout[1] == "t" else rand(k, width)
        return (a, b) if kernel == "gated_matmul" else (a, b, rand(n))
    return make_inputs


def _make_check_inputs(kernel: str):
    make_inputs = _make_inputs(kernel)

    def check_inputs(problem: Problem, device: Any, seed: int) -> tuple:
        """``make_inputs`` with loud edges (kernels/_check.py): in B, the gate half's last column; the bias's
        last element."""
        inputs = make_inputs(problem, device, seed)
        loud_edges(inputs[0], inputs[1], inputs[2] if len(inputs) == 3 else None,
                   halves=2 if kernel == "gated_matmul" else 1)
        return inputs
    return check_inputs


def _reference(inputs: tuple) -> torch.Tensor:
    a, b = inputs[0].double() if inputs[0].device.type == "cpu" else inputs[0].float(), inputs[1]
    c = a @ b.to(a.dtype)
    if len(inputs) == 3:
        return (c + inputs[2].to(a.dtype)).float()
    n = c.shape[1] // 2
    return (torch.nn.functional.silu(c[:, :n]) * c[:, n:]).float()


_GATE_BLOCK = 1024


@triton.jit
def _silu_mul_kernel(c_ptr, out_ptr, n, stride_cm, stride_om, BLOCK: tl.constexpr):
    """out[m, :] = silu(c[m, :n]) * c[m, n:2n], in fp32, rounded once: one program per row and block."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = offs < n
    gate = tl.load(c_ptr + row * stride_cm + offs, mask=inside, other=0.0).to(tl.float32)
    up = tl.load(c_ptr + row * stride_cm + n + offs, mask=inside, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_om + offs, (gate * tl.sigmoid(gate) * up).to(out_ptr.dtype.element_ty), mask=inside)


def silu_mul(c: torch.Tensor) -> torch.Tensor:
    """silu(c[:, :N]) * c[:, N:] for a row-major [M, 2N] c, in one pass on a GPU (torch's ops elsewhere).

    Why not torch's: on the halves of one [M, 2N] buffer, ``F.silu(c[:, :N]) * c[:, N:]`` runs two
    strided (non-vectorized) kernels and writes an [M, N] intermediate; on the H100 the pair took
    0.37 ms at 2048x28672 against 0.19 for torch's own on separate contiguous gate and up outputs
    (docs/BENCHMARKS.md, 2026-11-24). This reads each half once and writes the product once."""
    m, n = c.shape[0], c.shape[1] // 2
    if not c.is_cuda:
        if not _device.INTERPRETED:
            return torch.nn.functional.silu(c[:, :n]) * c[:, n:]
    if c.stride(1) != 1 or m == 0 or n == 0:
        return torch.nn.functional.silu(c[:, :n]) * c[:, n:]
    out = c.new_empty((m, n))
    _silu_mul_launch(c)(c, out, n, c.stride(0), out.stride(0))
    return out


def _silu_mul_launch(c: torch.Tensor) -> DirectLaunch:
    """The gating pass's launch for an [M, 2N] c with unit column stride (made once per what Triton
    specializes on: sizes, c's row stride, dtype, device and alignment)."""
    m, n = c.shape[0], c.shape[1] // 2
    key = ("silu_mul", m, n, c.stride(0), c.dtype, c.device, c.data_ptr() % 16)
    return LAUNCHES.get_or_make(key, lambda: DirectLaunch(
        _silu_mul_kernel, (m, triton.cdiv(n, _GATE_BLOCK)), dict(BLOCK=_GATE_BLOCK, num_warps=4)))


def _baseline(inputs: tuple) -> torch.Tensor:
    """Without a Triton GEMM: torch.addmm, or one cuBLAS GEMM over the stacked weights and the gating
    (``silu_mul``). Dispatch runs it where it won, and the tuner's contest times it, so both see one thing."""
    if len(inputs) == 3:
        a, b, bias = inputs
        return torch.addmm(bias, a, b)
    return silu_mul(inputs[0] @ inputs[1])


def _problem_of(kernel: str):
    def problem_of(a: torch.Tensor, b: torch.Tensor, *rest: torch.Tensor) -> Problem:
        _check(kernel, a, b, 2 if kernel == "gated_matmul" else 1)
        n = b.shape[1] // 2 if kernel == "gated_matmul" else b.shape[1]
        return Problem(kernel, DTYPE_NAMES[a.dtype], layout_letter(a) + layout_letter(b), ((a.shape[0], n, a.shape[1]),))
    return problem_of


def default_config(problem: Problem, device: DeviceInfo) -> Config:
    """Tiles no larger than the problem; smaller for the gated kernel's two accumulators."""
    m, n, k = problem.shapes[0]
    bm = min(128 if problem.kernel == "matmul_bias" else 64, max(16, triton.next_power_of_2(max(m, 1))))
    bn = min(128, max(32, triton.next_power_of_2(max(n, 1))))
    bk = min(64, max(32, triton.next_power_of_2(max(k, 1))))
    config = Config.make(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_SIZE_M=8, num_warps=4 if bm * bn <= 64 * 128 else 8,
                         num_stages=3 if problem.dtype != "fp32" else 2)
    while SPACE.violation(config, problem, device) and config.num_stages > 2:
        config = config.replace(num_stages=config.num_stages - 1)
    return config


# Tiles for the quick tuner's portfolio and the search's first trials, (BLOCK_M, BLOCK_N, BLOCK_K,
# num_warps, num_stages): thin ones for decode (a stream of B, many programs in flight), the tiled
# matmul's Hopper-good ones for the rest. The space's register limit drops what the gated kernel's two
# accumulators cannot hold.
_THIN_TILES = ((16, 32, 128, 4, 5), (16, 64, 128, 4, 4), (16, 64, 64, 4, 5), (16, 128, 64, 4, 4),
               (16, 256, 64, 4, 3), (16, 32, 64, 2, 5), (32, 64, 128, 4, 4), (32, 32, 128, 4, 5),
               (64, 64, 128, 4, 4))
_WIDE_TILES = ((128, 128, 64, 8, 4), (128, 256, 64, 8, 3), (64, 128, 64, 4, 4), (128, 64, 64, 4, 4),
               (64, 256, 64, 8, 3), (128, 128, 32, 8, 5), (64, 64, 64, 4, 4))


def seed_configs(problem: Problem, device: DeviceInfo) -> list[Config]:
    """Configs measured first (by the search) or only (by the quick tuner's portfolio)."""
    m = problem.shapes[0][0]
    tiles = (_THIN_TILES if m <= 128 else ()) + _WIDE_TILES
    configs = [Config.make(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_SIZE_M=8, num_warps=warps, num_stages=stages)
               for bm, bn, bk, warps, stages in tiles if bm <= max(16, triton.next_power_of_2(max(m, 1)))]
    if m == 1 and problem.layout[1] == "t":  # the one-row loop, as the matmul gemv variant's seeds
        configs = [SPACE.canonical(Config.make(BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, GROUP_SIZE_M=1, GEMV_BLOCK_N=bn,
                                               GEMV_BLOCK_K=bk, num_warps=warps, num_stages=2))
                   for bn, bk, warps in GEMV_SEEDS] + configs
    return [c for c in configs if SPACE.violation(c, problem, device) is None]


def _distance(p: Problem, q: Problem) -> float:
    if p.kernel != q.kernel or p.dtype != q.dtype or p.layout != q.layout:
        return math.inf
    return log_distance(p.shapes[0], q.shapes[0])


def _spec(kernel: str, run: Any, baseline_host_floor_ms: float = 0.0) -> KernelSpec:
    return KernelSpec(name=kernel, space=SPACE, dtypes=("fp16", "bf16", "fp32"), problem_of=_problem_of(kernel),
                      make_inputs=_make_inputs(kernel), reference=_reference, run=run, baseline=_baseline,
                      default_config=default_config, distance=_distance, seeds=seed_configs,
                      baseline_when_untuned=True, baseline_host_floor_ms=baseline_host_floor_ms,
                      check_inputs=_make_check_inputs(kernel))


# The gated baseline is two launches from Python (torch.mm, then the gating pass): its cached call cost
# 1.87-2.15x torch.matmul's host time on the H100 (scripts/host_cost.py, 2026-11-26, docs/BENCHMARKS.md
# 2026-11-26), and torch.matmul's call took at least 11.5 us on every H100 and H200 box met
# (kernels.dispatch.TORCH_HOST_FLOOR_MS). 1.8 of those is its floor: on DeepSeek-V2-Lite's 2816x2048 MLP
# (18.5-18.9 us on the GPU) it ran 29-51 us a call eagerly, where the one-launch kernel ran 13-20 us, and
# the fast-host rule, comparing GPU times alone, had still given eager to cuBLAS.
GATED_BASELINE_HOST_FLOOR_MS = 1.8 * TORCH_HOST_FLOOR_MS

MATMUL_BIAS = _spec("matmul_bias", lambda config, inputs: matmul_bias_with(config, *inputs))
GATED_MATMUL = _spec("gated_matmul", lambda config, inputs: gated_matmul_with(config, *inputs),
                     GATED_BASELINE_HOST_FLOOR_MS)


# ---------------------------------------------------------------------------------------------- dispatch

def _resolve(spec: KernelSpec, a: torch.Tensor, b: torch.Tensor, mode: str | None = None) -> Config:
    """The config of this call: a repeated call signature is one dict lookup; its first call checks the
    operands (``problem_of``) and resolves. The key holds what the check reads, b's dtype and device
    included, so a cached signature is a checked one (building the Problem per call cost more host time
    than the launch's other Python)."""
    if mode is None:
        mode = _modes.current(a.is_cuda)  # the graph winner while the stream captures, else the eager one
    try:
        key = _key(spec, a, b, mode)
    except AttributeError:
        key = None  # not tensors: problem_of says so
    config = DISPATCHER.cached(key) if key is not None else None
    if config is not None:
        return config
    if a.device.type == "cpu" and not _device.INTERPRETED:
        return BASELINE  # no Triton on the CPU unless the interpreter is on
    problem = spec.problem_of(a, b)
    device = current_device(a.device)
    if _REC.on and key is not None:
        _REC.seen(key, spec.name, problem, device)
    return DISPATCHER.resolve(key, spec, problem, device, mode)


def _count(spec: KernelSpec, a: torch.Tensor, b: torch.Tensor) -> None:
    """Record mode: one more call of this signature in the current mode (the key ``_resolve`` notes on a
    miss). Counted before any shortcut (a ready call, addmm's path), which would otherwise skip the count;
    the C++ path serves nothing while recording (``Recorder.start`` suspends it)."""
    try:
        key = _key(spec, a, b, _modes.current(a.is_cuda))
    except AttributeError:
        return  # not tensors: the call raises below
    _REC.counts[key] += 1


def _key(spec: KernelSpec, a: torch.Tensor, b: torch.Tensor, mode: str) -> tuple:
    return (spec.name, a.shape, b.shape, a.stride(), b.stride(), a.dtype, b.dtype, a.device, b.device, mode)


@contextlib.contextmanager
def pinning(spec: KernelSpec, configs: Sequence[Config], a: torch.Tensor, b: torch.Tensor,
            graph: Config | None = None) -> Iterator[list[Callable[[], None]]]:
    """One installer per config: after ``install()``, ``matmul_bias`` or ``gated_matmul`` (``spec``'s public
    call) on operands shaped like ``a`` and ``b`` runs that config in every mode (eager mode alone where
    ``graph``, the graph winner dispatch will hold beside it, is given), until another installer runs or
    the block ends. The tuner times the public call this way, as ``kernels._plans.pinning`` for matmul: its
    host time is then the user's (the signature lookup, not the explicit call's checks)."""
    keys = [_key(spec, a, b, mode) for mode in _modes.MODES]
    with DISPATCHER.pinning(keys, configs) as installers:
        if graph is None:
            yield installers
            return
        graph_key = _key(spec, a, b, _modes.GRAPH)

        def install(put: Callable[[], None]) -> None:
            put()
            DISPATCHER._answer({graph_key: graph})  # the block's end restores it with the other keys

        yield [functools.partial(install, put) for put in installers]


class _Ready(NamedTuple):
    """A signature's calls made ready while ``DISPATCHER.changes`` reads ``changes``: the eager mode's and
    the graph mode's (one object where both modes run one config). A ready call returns None for operands
    it cannot take (another 16-byte alignment than its kernel was compiled for, another bias); the
    resolving path then serves them."""

    changes: int
    eager: Callable[..., torch.Tensor | None]
    graph: Callable[..., torch.Tensor | None]


# Ready calls by (kernel, a's and b's sizes, strides, dtypes, devices). A repeated epilogue call was the
# signature key, the dispatcher's lookup, then the launch key (about 20 fields with both operands' addresses)
# and the launch cache: a cached gated call cost 1.33x torch.matmul's host time on the H100
# (scripts/host_cost.py, 2026-11-26). A ready call checks the operands' alignment and launches with the
# sizes and strides its signature fixes.
_READY: dict[tuple, _Ready] = {}


def _ready_key(kernel: str, a: Any, b: Any) -> tuple | None:
    try:
        return (kernel, a.shape, b.shape, a.stride(), b.stride(), a.dtype, a.device, b.dtype, b.device)
    except AttributeError:
        return None  # not tensors: the resolving path says so


def _ready_call(key: tuple | None, a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor | None:
    """The ready call of ``key``'s signature on these operands, or None (none ready, or it declined)."""
    ready = _READY.get(key)
    if ready is None or ready.changes != DISPATCHER.changes:
        return None
    call = ready.eager
    if ready.graph is not call and _modes.current(a.is_cuda) == _modes.GRAPH:
        call = ready.graph
    return call(a, b, bias)


def _make_ready(key: tuple | None, spec: KernelSpec, changes: int, a: torch.Tensor, b: torch.Tensor,
                bias: torch.Tensor | None) -> None:
    """After a resolved call of ``key``'s signature, keep its ready calls (once per signature and change
    of the dispatcher's answers), where Triton runs (a GPU, or the interpreter) and the output has elements."""
    if key is None or DISPATCHER.changes != changes:
        return
    if a.device.type == "cpu":
        if not _device.INTERPRETED:
            return  # torch on the CPU: nothing to make ready
    ready = _READY.get(key)
    if ready is not None and ready.changes == changes:
        return  # these operands were declined (another alignment): they keep the resolving path
    gated = spec is GATED_MATMUL
    m, n = a.shape[0], b.shape[1] // 2 if gated else b.shape[1]
    if m == 0 or n == 0:
        return
    calls: dict[str, Callable[..., torch.Tensor | None]] = {}
    made: dict[Config, Callable[..., torch.Tensor | None]] = {}
    configs = {mode: _resolve(spec, a, b, mode) for mode in _modes.MODES}
    for mode, config in configs.items():
        if config not in made:
            made[config] = (_baseline_call(a, n, gated) if is_baseline(config)
                            else _triton_call(config, a, b, bias, n, gated))
        calls[mode] = made[config]
    if len(_READY) >= _PATHS_CAPACITY:
        _READY.clear()
    _READY[key] = _Ready(changes, calls[_modes.EAGER], calls[_modes.GRAPH])
    eager = configs[_modes.EAGER]
    if a.is_cuda and not is_baseline(eager):
        _hand_over(key, eager, configs[_modes.GRAPH] == eager, changes, a, b, bias, n, gated)


def _hand_over(key: tuple, config: Config, both: bool, changes: int, a: torch.Tensor, b: torch.Tensor,
               bias: torch.Tensor | None, n: int, gated: bool) -> None:
    """Hand a Triton eager plan's launch to the C++ path (kernels/_native.py), which then serves the
    signature's eager calls (and graph ones, where ``both``) while the dispatcher's answers stand. The ready
    call cost 0.97-1.10x torch.matmul's host time for a bias winner on the H100 hosts (docs/BENCHMARKS.md,
    2026-11-26); from C++ the launch reads no Python attribute. Only a launch compiled for
    16-byte aligned operands and bias, already made once (its first call adopted the compiled kernel)."""
    aligned = a.data_ptr() % 16 == 0 and b.data_ptr() % 16 == 0
    if bias is not None:
        aligned = aligned and bias.data_ptr() % 16 == 0 and bias.is_contiguous() and bias.shape == (n,)
    launch = LAUNCHES.get(_launch_key(config, a, b, bias, gated)) if aligned and _native.wanted() else None
    if launch is None or not launch.ready():
        return
    m, k = a.shape
    args = (a, b, a, a, m, n, k, *a.stride(), *b.stride(), n, 1)  # C and the bias are the call's own
    made = launch.native_launch(args, {0: SLOT_A, 1: SLOT_B, 2: SLOT_C, 3: SLOT_C if bias is None else SLOT_BIAS})
    if made is not None:  # key[1:7]: the ready key's (a's and b's sizes and strides, dtype, device), a plan key
        _native.remember_epilogue_launch(key[1:7], gated, both, changes, [made],
                                         None if bias is None else bias.dtype)


def _baseline_call(a: torch.Tensor, n: int, gated: bool) -> Callable[..., torch.Tensor]:
    """torch.addmm, or cuBLAS and the gating pass with the pass's launch made (cuBLAS's [M, 2N] output is
    fresh and row-major: one launch serves every call whose output is 16-byte aligned, as fresh ones are)."""
    if not gated:
        return lambda a, b, bias: torch.addmm(bias, a, b)
    if not a.is_cuda:
        return lambda a, b, bias: silu_mul(torch.mm(a, b))  # the interpreter: silu_mul's own checks
    m = a.shape[0]
    gating = _silu_mul_launch(a.new_empty((m, 2 * n)))

    def call(a: torch.Tensor, b: torch.Tensor, bias: None) -> torch.Tensor:
        c = torch.mm(a, b)
        if c.data_ptr() % 16:
            return silu_mul(c)
        out = c.new_empty((m, n))
        gating(c, out, n, 2 * n, n)
        return out
    return call


def _triton_call(config: Config, a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, n: int,
                 gated: bool) -> Callable[..., torch.Tensor | None]:
    """``config``'s launch on operands like these, with everything but the addresses fixed."""
    m, k = a.shape
    launch = LAUNCHES.get_or_make(_launch_key(config, a, b, bias, gated), lambda: _epilogue_launch(
        config, a, b, a.new_empty((m, n)), bias, gated))
    a_mod, b_mod = a.data_ptr() % 16, b.data_ptr() % 16
    sizes = (m, n, k, *a.stride(), *b.stride(), n, 1)  # C: [m, n] row-major
    if bias is None:
        def call(a: torch.Tensor, b: torch.Tensor, bias: None) -> torch.Tensor | None:
            if a.data_ptr() % 16 != a_mod or b.data_ptr() % 16 != b_mod:
                return None
            c = a.new_empty((m, n))
            launch(a, b, c, c, *sizes)
            return c
        return call
    bias_mod, bias_dtype, device, shape = bias.data_ptr() % 16, bias.dtype, a.device, (n,)

    def call_with_bias(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor) -> torch.Tensor | None:
        if (a.data_ptr() % 16 != a_mod or b.data_ptr() % 16 != b_mod or bias.dtype != bias_dtype
                or bias.shape != shape or bias.device != device or not bias.is_contiguous()
                or bias.data_ptr() % 16 != bias_mod):
            return None
        c = a.new_empty((m, n))
        launch(a, b, c, bias, *sizes)
        return c
    return call_with_bias


# What matmul_bias learnt of each signature: (DISPATCHER.changes then, whether dispatch sends it to
# torch.addmm in every mode). A repeated call of an addmm one (a small untuned layer, the common case
# on a GPU without records) then costs a short key and a lookup before addmm, where resolving cost about
# 6 us of host time (docs/PYTORCH.md, "Eager calls"); any other resolves once, as before. b's dtype and
# device are not in the key: addmm refuses a mismatch, and the error is then said as the check says it.
_PATHS: dict[tuple, tuple[int, bool]] = {}
_NATIVE = _native.NATIVE
_COMPILING = torch.compiler.is_dynamo_compiling  # Dynamo folds it to True while it traces (kernels/_plans.py)
_PATHS_CAPACITY = 4096  # as kernels/_plans.py: ever-new shapes must not grow memory for ever


def matmul_bias(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """A @ B + bias in one launch, with the config tuned for this problem (or torch.addmm where that won).

    ``bias`` is [N] in a's dtype on every path. Where a gradient is wanted for an operand, the call runs as
    ``torch.ops.triton_tuner.linear`` (same kernels, with a backward), and so does every call torch.compile traces."""
    if _COMPILING():  # traced: the operator, not this body (its caches and C++ path are the host's)
        return torch.ops.triton_tuner.linear(a, b.t(), bias)
    native = _NATIVE.try_addmm
    if native is not None:  # an addmm signature, served from C++ (kernels/_native.py), which leaves another
        c = native(a, b, bias)  # bias shape or dtype, and a Triton launch that would record no gradient, to us
        if c is not None:
            return c
    try:
        fits = bias.dtype is a.dtype and bias.shape == b.shape[1:]
    except AttributeError:
        fits = False  # not tensors: the checks below say so
    if not fits:
        _check("matmul_bias", a, b, 1)
        _check_bias(a, b, bias)
    if a.requires_grad or b.requires_grad or bias.requires_grad:
        if torch.is_grad_enabled():
            return torch.ops.triton_tuner.linear(a, b.t(), bias)  # registered by kernels/ops.py
    if _REC.on:  # after the redirect above, whose operator calls back here: one count per call
        _count(MATMUL_BIAS, a, b)
    try:
        key = (a.shape, b.shape, a.stride(), b.stride(), a.dtype, a.device)
    except AttributeError:
        key = None  # not tensors: _resolve says so
    changes = DISPATCHER.changes  # read first: answers that change while we resolve are not kept
    known = _PATHS.get(key)
    if known is not None and known[0] == changes:
        if known[1]:
            try:
                return torch.addmm(bias, a, b)
            except RuntimeError:  # b of another dtype or device: say so as the first call's check does
                _check("matmul_bias", a, b, 1)
                raise
        c = _ready_call(("matmul_bias", *key, b.dtype, b.device), a, b, bias)
        if c is not None:
            return c
    config = _resolve(MATMUL_BIAS, a, b)  # a and b checked on their signature's first call
    if key is not None and (known is None or known[0] != changes):
        # An eager call that runs a kernel needs no more asking: neither mode is addmm's to serve from C++.
        asked = is_baseline(config) or _modes.current(a.is_cuda) != _modes.EAGER
        on_addmm = {mode: asked and is_baseline(_resolve(MATMUL_BIAS, a, b, mode)) for mode in _modes.MODES}
        addmm = all(on_addmm.values())
        if len(_PATHS) >= _PATHS_CAPACITY:
            _PATHS.clear()
            _native.forget_addmm()  # what C++ serves stays a part of what _PATHS knows
        _PATHS[key] = (changes, addmm)
        if on_addmm[_modes.EAGER]:  # eager calls (graph ones too, where addmm) served from C++
            _native.remember_addmm(key, changes, a.device.type == "cuda", eager_only=not addmm)
    if is_baseline(config):
        c = _baseline((a, b, bias))
    elif bias.shape != (b.shape[1],) or bias.device != a.device or not bias.is_contiguous():
        return matmul_bias_with(config, a, b, bias)  # says what is wrong, or copies the bias
    else:
        c = _launch(config, a, b, bias, b.shape[1], gated=False)
    if key is not None and not _PATHS.get(key, (None, False))[1]:  # addmm in every mode is served above
        _make_ready(("matmul_bias", *key, b.dtype, b.device), MATMUL_BIAS, changes, a, b, bias)
    return c


def gated_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """silu(A @ B[:, :N]) * (A @ B[:, N:]) in one launch, with the config tuned for this problem. Where a
    gradient is wanted for A or B, the call runs as ``torch.ops.triton_tuner.gated_matmul`` (with a backward),
    and so does every call torch.compile traces."""
    if _COMPILING():  # traced: the operator, not this body
        return torch.ops.triton_tuner.gated_matmul(a, b)
    native = _NATIVE.try_gated
    if native is not None:  # a Triton signature handed over to C++ (kernels/_native.py); not a call that
        c = native(a, b)    # wants a gradient, which the launch would not record
        if c is not None:
            return c
    if getattr(a, "requires_grad", False) or getattr(b, "requires_grad", False):
        if torch.is_grad_enabled():
            return torch.ops.triton_tuner.gated_matmul(a, b)  # registered by kernels/ops.py
    if _REC.on:
        _count(GATED_MATMUL, a, b)
    key = _ready_key("gated_matmul", a, b)
    c = _ready_call(key, a, b, None)
    if c is not None:
        return c
    changes = DISPATCHER.changes  # read first: answers that change while we resolve are not kept
    config = _resolve(GATED_MATMUL, a, b)  # a and b checked on their signature's first call
    c = _baseline((a, b)) if is_baseline(config) else _launch(config, a, b, None, b.shape[1] // 2, gated=True)
    _make_ready(key, GATED_MATMUL, changes, a, b, None)
    return c
