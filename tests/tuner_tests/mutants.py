"""Deliberately broken variants of every kernel family, to prove that the search's check rejects them.

Each mutant is the family's real Triton kernel with one bug of the kinds a launcher or kernel edit makes: a
reduction length, row count or column count one short, a last K tile never loaded, a split-K sum that leaves
out a slice, a group's or expert's offset off by one, a gated epilogue with gate and up swapped, a bias added
twice. ``Mutant.spec()`` is the family's KernelSpec with the broken run in place of its own, so the check
under test is exactly the one the search runs (kernels/_check.py ``check_config``).

``problem`` and ``config`` are the small shapes the CPU tests run under the interpreter; ``gpu_problem`` a real
one (scripts/calibrate_check.py runs every mutant there on the GPU, for docs/RELIABILITY.md's table).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl

import kernels
from kernels import Config, KernelSpec, Problem, epilogue, gemm, grouped, moe, moe_gated
from kernels._gemm_triton import _grouped_tile, _store_tile, _tile_dot


@dataclass(frozen=True)
class Mutant:
    """One bug in one family: a broken ``run`` and the config and problems it is shown on."""

    kernel: str
    bug: str
    run: Callable[[Config, tuple], Any]
    config: Config
    problem: str  # a small problem key (CPU, interpreter)
    gpu_problem: str  # a real one
    gpu_config: Config | None = None  # where the small problem's config does not suit the real one

    @property
    def name(self) -> str:
        return f"{self.kernel}: {self.bug}"

    def spec(self) -> KernelSpec:
        return dataclasses.replace(kernels.get_kernel(self.kernel), run=self.run)

    def cpu_case(self, dtype: str) -> tuple[Problem, Config]:
        return Problem.from_key(self.kernel, f"{dtype}:{self.problem}"), self.config

    def gpu_case(self, dtype: str) -> tuple[Problem, Config]:
        return Problem.from_key(self.kernel, f"{dtype}:{self.gpu_problem}"), self.gpu_config or self.config


# ------------------------------------------------------------------------------------------------- matmul

def _tiled(m_short: int = 0, n_short: int = 0, k_of: Callable[[int, int], int] = lambda k, bk: k):
    """The tiled kernel launched as the real launcher would, but over ``m_short`` fewer rows, ``n_short`` fewer
    columns and ``k_of(K, BLOCK_K)`` of K."""
    def run(config: Config, inputs: tuple) -> torch.Tensor:
        a, b = inputs
        (m, k), n = a.shape, b.shape[1]
        c = torch.empty((m, n), dtype=a.dtype, device=a.device)
        consts = gemm._constexprs(config, a, b, c)
        m, n, k = m - m_short, n - n_short, k_of(k, config["BLOCK_K"])
        consts["EVEN_K"] = k % config["BLOCK_K"] == 0
        grid = (triton.cdiv(m, config["BLOCK_M"]) * triton.cdiv(n, config["BLOCK_N"]),)
        gemm._tiled_kernel[grid](a, b, c, m, n, k, *a.stride(), *b.stride(), *c.stride(), **consts)
        return c
    return run


@triton.jit
def _splitk_missing_slice(a_ptr, b_ptr, c_ptr, partial_ptr, arrivals_ptr, M, N, K,
                          stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                          GROUP_SIZE_M: tl.constexpr, SPLIT_K: tl.constexpr, EVEN_K: tl.constexpr,
                          INDEX_64: tl.constexpr, DOT_PRECISION: tl.constexpr, ALIGN: tl.constexpr,
                          C_ALIGN: tl.constexpr, WRAP_ALIGNED: tl.constexpr):
    """kernels/_gemm_triton.py ``_splitk_kernel``, whose last program sums SPLIT_K - 1 of the slices."""
    tile_id = tl.program_id(0)
    split = tl.program_id(1)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid_m, pid_n = _grouped_tile(tile_id, num_pid_m, num_pid_n, GROUP_SIZE_M)
    k_blocks = tl.cdiv(K, BLOCK_K)
    per_split = tl.cdiv(k_blocks, SPLIT_K)
    k_begin = split * per_split
    k_end = min(k_begin + per_split, k_blocks)
    acc = _tile_dot(a_ptr, b_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                    pid_m, pid_n, k_begin, k_end,
                    BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, INDEX_64, DOT_PRECISION, ALIGN, WRAP_ALIGNED)
    local = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    tile_base = partial_ptr + tile_id.to(tl.int64) * (SPLIT_K * BLOCK_M * BLOCK_N)
    tl.store(tile_base + split * (BLOCK_M * BLOCK_N) + local, acc)
    tl.debug_barrier()
    arrived = tl.atomic_add(arrivals_ptr + tile_id, 1, sem="acq_rel")
    if arrived == SPLIT_K - 1:
        total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for s in tl.static_range(SPLIT_K - 1):  # the bug: the last slice is left out
            total += tl.load(tile_base + s * (BLOCK_M * BLOCK_N) + local, cache_modifier=".cg")
        _store_tile(c_ptr, total, M, N, stride_cm, stride_cn, pid_m, pid_n, BLOCK_M, BLOCK_N, INDEX_64, C_ALIGN)
        tl.atomic_xchg(arrivals_ptr + tile_id, 0)


def _splitk_missing_slice_run(config: Config, inputs: tuple) -> torch.Tensor:
    a, b = inputs
    (m, k), n = a.shape, b.shape[1]
    c = torch.empty((m, n), dtype=a.dtype, device=a.device)
    bm, bn, split = config["BLOCK_M"], config["BLOCK_N"], config["SPLIT_K"]
    tiles = triton.cdiv(m, bm) * triton.cdiv(n, bn)
    partial, arrivals = gemm._WORKSPACE.get(a.device, tiles * split * bm * bn, tiles)
    _splitk_missing_slice[(tiles, split)](a, b, c, partial, arrivals, m, n, k, *a.stride(), *b.stride(), *c.stride(),
                                          **gemm._constexprs(config, a, b, c, SPLIT_K=split))
    return c


def _gemv_k_short(config: Config, inputs: tuple) -> torch.Tensor:
    """The one-row kernel with K one short."""
    a, b = inputs
    (m, k), n = a.shape, b.shape[1]
    c = torch.empty((m, n), dtype=a.dtype, device=a.device)
    bn, bk = config["GEMV_BLOCK_N"], config["GEMV_BLOCK_K"]
    gemm._gemv_kernel[(triton.cdiv(n, bn), m)](a, b, c, m, n, k - 1, *a.stride(), *b.stride(), *c.stride(),
                                                BLOCK_N=bn, BLOCK_K=bk, EVEN_K=(k - 1) % bk == 0, INDEX_64=False,
                                                num_warps=config.num_warps, num_stages=config.num_stages)
    return c


def _tma_k_short(config: Config, inputs: tuple) -> torch.Tensor:
    """The persistent TMA kernel whose A descriptor is one K column short (TMA fills past it with zeros)."""
    a, b = inputs
    c = torch.empty((a.shape[0], b.shape[1]), dtype=a.dtype, device=a.device)
    launch = gemm.TmaLaunch(config, a, b, c)
    (shape, strides, block), *rest = launch.layouts
    launch.layouts = (([shape[0], shape[1] - 1], strides, block), *rest)
    launch(a, b, c)
    return c


def _repack_k_short(config: Config, inputs: tuple) -> torch.Tensor:
    """repack whose padding copy takes one K column fewer (zeros where the last one belongs)."""
    a, b = inputs
    c = torch.empty((a.shape[0], b.shape[1]), dtype=a.dtype, device=a.device)
    launch = gemm.RepackLaunch(config, a, b, c)
    m, n, k, *rest = launch.pad_args
    launch.pad_args = (m, n, k - 1, *rest)
    launch(a, b, c)
    return c


_TILED = Config.make(VARIANT="tiled", BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, GROUP_SIZE_M=1, SPLIT_K=1, NUM_SM=132,
                     FLATTEN=False, EPILOGUE_SUBTILE=False, num_warps=4, num_stages=2)
_TILED_GPU = _TILED.replace(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_SIZE_M=8, num_warps=8, num_stages=4)
_SPLITK = _TILED.replace(VARIANT="splitk", SPLIT_K=3)
_SPLITK_GPU = _TILED.replace(VARIANT="splitk", BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, SPLIT_K=4, num_stages=4)
_TMA = gemm.SPACE.canonical(_TILED.replace(VARIANT="tma", NUM_SM=32))
_TMA_GPU = _TILED_GPU.replace(VARIANT="tma", NUM_SM=132)
_REPACK = _TILED.replace(VARIANT="repack")
_REPACK_GPU = _TILED_GPU.replace(VARIANT="repack")
_GEMV = gemm.SPACE.canonical(Config.make(VARIANT="gemv", BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, GROUP_SIZE_M=1, SPLIT_K=1,
                                         NUM_SM=132, FLATTEN=False, EPILOGUE_SUBTILE=False, GEMV_BLOCK_N=2,
                                         GEMV_BLOCK_K=256, num_warps=4, num_stages=2))
_GEMV_GPU = _GEMV.replace(GEMV_BLOCK_N=4, GEMV_BLOCK_K=2048)


def _last_tile_dropped(k: int, bk: int) -> int:
    return (triton.cdiv(k, bk) - 1) * bk


MATMUL_MUTANTS = [
    Mutant("matmul", "last K tile dropped", _tiled(k_of=_last_tile_dropped), _TILED, "nn:33x40x80",
           "nn:4096x4096x4096", _TILED_GPU),
    Mutant("matmul", "last K element dropped", _tiled(k_of=lambda k, bk: k - 1), _TILED, "nn:33x40x80",
           "nt:4096x4096x4096", _TILED_GPU),
    Mutant("matmul", "last row skipped", _tiled(m_short=1), _TILED, "nn:33x40x80", "nn:4097x4096x1024", _TILED_GPU),
    Mutant("matmul", "last column skipped", _tiled(n_short=1), _TILED, "nn:33x40x80", "nn:4096x4097x1024",
           _TILED_GPU),
    Mutant("matmul", "TMA: A's descriptor one K column short", _tma_k_short, _TMA, "nn:33x40x80", "nt:4096x4096x4096",
           _TMA_GPU),
    Mutant("matmul", "repack: padding copy one K column short", _repack_k_short, _REPACK, "nn:20x24x37",
           "nn:3333x257x4099", _REPACK_GPU),
    Mutant("matmul", "split-K sum misses a slice", _splitk_missing_slice_run, _SPLITK, "nn:16x40x80",
           "nt:16x4096x8192", _SPLITK_GPU),
    Mutant("matmul", "one-row (gemv) K one short", _gemv_k_short, _GEMV, "nt:1x40x300", "nt:1x4096x8192", _GEMV_GPU),
]


# ---------------------------------------------------------------------------------------- grouped_matmul

def _grouped_with_edit(edit: Callable[[Any, int], None]):
    """The grouped kernel on a table that ``edit(table, groups)`` changed (layout: kernels/grouped.py)."""
    def run(config: Config, inputs: tuple) -> list[torch.Tensor]:
        As, Bs = inputs
        plan = grouped._plan(grouped.signature(As, Bs), config["BLOCK_M"], config["BLOCK_N"])
        edit(plan.table, len(plan.outputs))
        table = grouped._to_device(plan.table, As[0].device, False)
        c = torch.empty(plan.c_elements, dtype=As[0].dtype, device=As[0].device)
        grid = (min(config["NUM_SM"], plan.total_tiles),)
        grouped._grouped_matmul_kernel[grid](table, c, len(plan.outputs), BLOCK_M=config["BLOCK_M"],
                                             BLOCK_N=config["BLOCK_N"], BLOCK_K=config["BLOCK_K"],
                                             num_warps=config.num_warps, num_stages=config.num_stages, **plan.flags)
        return plan.views(c)
    return run


def _last_row_field(table: Any, groups: int, field: int) -> int:
    return groups + 1 + (groups - 1) * 12 + field  # prefix of groups + 1 entries, then 12 fields per problem


def _c_offset_off_by_one(table: Any, groups: int) -> None:
    table[_last_row_field(table, groups, 2)] -= 1


def _last_tile_uncounted(table: Any, groups: int) -> None:
    table[groups] -= 1  # the running tile count ends one short: the last group's last tile is never taken


_GROUPED = Config.make(BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, NUM_SM=4, num_warps=4, num_stages=2)
_GROUPED_GPU = Config.make(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, NUM_SM=132, num_warps=8, num_stages=4)
_GROUPS = "nn:16x32x48+20x40x64+9x24x40"
_GROUPS_GPU = "nn:" + "+".join(f"{m}x1536x4096" for m in (128, 384, 1000, 2048, 512, 257, 640, 1024))

GROUPED_MUTANTS = [
    Mutant("grouped_matmul", "last group's C offset off by one", _grouped_with_edit(_c_offset_off_by_one), _GROUPED,
           _GROUPS, _GROUPS_GPU, _GROUPED_GPU),
    Mutant("grouped_matmul", "tile count one short (last group's last tile)", _grouped_with_edit(_last_tile_uncounted),
           _GROUPED, _GROUPS, _GROUPS_GPU, _GROUPED_GPU),
]


# -------------------------------------------------------------------------------------------- moe_matmul

def _moe_ends_one_short(config: Config, inputs: tuple) -> torch.Tensor:
    x, w, offsets = inputs[:3]
    return moe.run_checked(config, x, w, offsets - 1)


def _moe_offsets_one_early(config: Config, inputs: tuple) -> torch.Tensor:
    """Expert e's end read from the element before its own (the offsets pointer one element off)."""
    x, w, offsets = inputs[:3]
    shifted = offsets.as_strided(offsets.shape, offsets.stride(), offsets.storage_offset() - 1)
    return moe.run_checked(config, x, w, shifted)


_MOE = "nt:" + "+".join(["5x32x64"] * 5)
_MOE_GPU = "nt:" + "+".join(["512x1536x4096"] * 8)

MOE_MUTANTS = [
    Mutant("moe_matmul", "every end row one short", _moe_ends_one_short, _GROUPED, _MOE, _MOE_GPU, _GROUPED_GPU),
    Mutant("moe_matmul", "offsets read one element early", _moe_offsets_one_early, _GROUPED, _MOE, _MOE_GPU,
           _GROUPED_GPU),
]


# -------------------------------------------------------------------------------------- moe_gated_matmul

def _moe_gate_up_swapped(config: Config, inputs: tuple) -> torch.Tensor:
    """The fused MoE kernel reading the up half as the gate and the gate half as the up."""
    x, w, offsets = inputs[:3]
    half = w.shape[2] // 2
    return moe_gated.run_checked(config, x, torch.cat([w[:, :, half:], w[:, :, :half]], dim=2), offsets)


def _moe_gated_ends_one_short(config: Config, inputs: tuple) -> torch.Tensor:
    x, w, offsets = inputs[:3]
    return moe_gated.run_checked(config, x, w, offsets - 1)


MOE_GATED_MUTANTS = [
    Mutant("moe_gated_matmul", "gate and up swapped", _moe_gate_up_swapped, _GROUPED, _MOE, _MOE_GPU, _GROUPED_GPU),
    Mutant("moe_gated_matmul", "every end row one short", _moe_gated_ends_one_short, _GROUPED, _MOE, _MOE_GPU,
           _GROUPED_GPU),
]


# ----------------------------------------------------------------------------------- the fused epilogues

def _epilogue_launch(m_short: int = 0, n_short: int = 0, k_short: int = 0, swap: bool = False):
    """The epilogue kernel launched as ``epilogue._launch`` does, over fewer rows, columns or K, or with the
    gate and up halves of B swapped."""
    def run(config: Config, inputs: tuple) -> torch.Tensor:
        a, b = inputs[:2]
        bias = inputs[2] if len(inputs) == 3 else None
        gated = bias is None
        if swap:
            half = b.shape[1] // 2
            b = torch.cat([b[:, half:], b[:, :half]], dim=1)
        (m, k), n = a.shape, b.shape[1] // 2 if gated else b.shape[1]
        c = a.new_empty((m, n))
        m, n, k = m - m_short, n - n_short, k - k_short
        bm, bn, bk = config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"]
        epilogue._epilogue_kernel[(triton.cdiv(m, bm) * triton.cdiv(n, bn),)](
            a, b, c, bias if bias is not None else c, m, n, k, *a.stride(), *b.stride(), *c.stride(),
            BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_SIZE_M=config["GROUP_SIZE_M"], EVEN_K=k % bk == 0,
            INDEX_64=False, DOT_PRECISION=gemm._dot_precision(a), HAS_BIAS=bias is not None, GATED=gated,
            num_warps=config.num_warps, num_stages=config.num_stages)
        return c
    return run


def _bias_twice(config: Config, inputs: tuple) -> torch.Tensor:
    a, b, bias = inputs
    return epilogue.matmul_bias_with(config, a, b, bias + bias)


_EPILOGUE = Config.make(BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, GROUP_SIZE_M=1, num_warps=4, num_stages=2)
_EPILOGUE_GPU = Config.make(BLOCK_M=64, BLOCK_N=128, BLOCK_K=64, GROUP_SIZE_M=8, num_warps=4, num_stages=4)

EPILOGUE_MUTANTS = [
    Mutant("matmul_bias", "bias added twice", _bias_twice, _EPILOGUE, "nn:33x40x80", "nt:512x4096x4096",
           _EPILOGUE_GPU),
    Mutant("matmul_bias", "last K element dropped", _epilogue_launch(k_short=1), _EPILOGUE, "nn:33x40x80",
           "nt:512x4096x4096", _EPILOGUE_GPU),
    Mutant("matmul_bias", "last column skipped", _epilogue_launch(n_short=1), _EPILOGUE, "nn:33x40x80",
           "nt:512x4097x4096", _EPILOGUE_GPU),
    Mutant("gated_matmul", "gate and up swapped", _epilogue_launch(swap=True), _EPILOGUE, "nn:17x24x48",
           "nt:512x14336x4096", _EPILOGUE_GPU),
    Mutant("gated_matmul", "last row skipped", _epilogue_launch(m_short=1), _EPILOGUE, "nn:17x24x48",
           "nt:513x14336x4096", _EPILOGUE_GPU),
]

MUTANTS = MATMUL_MUTANTS + GROUPED_MUTANTS + MOE_MUTANTS + MOE_GATED_MUTANTS + EPILOGUE_MUTANTS
