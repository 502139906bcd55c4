"""Mixture-of-experts GEMM: out[rows of e] = x[rows of e] @ w[e] for every expert e, in one launch.

The MoE layout of ``torch._grouped_mm``: tokens sorted by expert in one row-major buffer ``x`` [T, K],
the experts' weights in one tensor ``w`` [E, K, N] (any strides; ``w = w_nk.transpose(1, 2)`` for
weights stored [E, N, K]), and ``offsets`` [E] on the device, the running end row of each expert
(int32 or int64). Nothing about the routing crosses to the host: ``NUM_SM`` programs walk the
experts' tiles reading ``offsets`` themselves, so a call costs one launch and one output allocation,
with no pointer table built, copied or even looked up. That is the point of this entry over
``grouped_matmul``, whose list of separate tensors needs a device table of pointers.

Tuning shares ``grouped_matmul``'s search space (the tile code is the same); a problem is the group of
the experts' GEMMs, ``M_e x N x K``. At dispatch the split of T over experts is on the device, so the
config is looked up by what the host knows, (T, E, N, K): the group distance compares GEMM count,
flops and mean sizes, all of which any split of T shares, so a tuned group with the same T, E, N, K
is found at distance 0 whatever its skew.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ._check import LOUD, hard_split
from ._device import current_device, interpreter_enabled
from ._launch import DirectLaunch, LruCache
from ._modes import MODES
from ._record_mode import RECORDER as _REC
from .dispatch import DISPATCHER
from ._spec import Config, DeviceInfo, KernelSpec, Problem, is_baseline
from . import grouped
from .gemm import overlapping
from .grouped import _DTYPE_NAMES, _TORCH_DTYPES, _VECTOR, _cdiv, default_config, distance, tile_product

KERNEL = "moe_matmul"
DTYPES = tuple(_DTYPE_NAMES)  # the dtypes it takes: float16 and bfloat16

_OFFSET_DTYPES = (torch.int32, torch.int64)



def _tiles_fit_tokens(config: Config, problem: Problem, device: DeviceInfo) -> str | None:
    """grouped_matmul's tile-size rule with M the token count: any one expert may get every token."""
    tokens = sum(m for m, _, _ in problem.shapes)
    _, n, k = problem.shapes[0] if problem.shapes else (0, 0, 0)
    return grouped._tiles_fit_problem(config, Problem(KERNEL, problem.dtype, problem.layout, ((tokens, n, k),)),
                                      device)


def _num_sm_fills_device(config: Config, problem: Problem, device: DeviceInfo) -> str | None:
    """grouped_matmul's idle-SM rule, on the fewest tiles any split of the tokens has (all in one expert)."""
    tokens = sum(m for m, _, _ in problem.shapes)
    n = problem.shapes[0][1] if problem.shapes else 0
    fewest = _cdiv(tokens, int(config["BLOCK_M"])) * _cdiv(n, int(config["BLOCK_N"]))
    return grouped.idle_sms(fewest, int(config["NUM_SM"]), device)


# grouped_matmul's space with the rules that depend on each expert's M (the tile-size bound, "NUM_SM
# above the tile count is redundant", "enough programs for the SMs") replaced by what holds for every
# split of T: the split changes from call to call, and a config tuned on one split must stay usable
# for any other with the same (T, E, N, K).
_PER_EXPERT_RULES = (grouped._tiles_fit_problem, grouped._num_sm_fills_device)
SPACE = dataclasses.replace(grouped.SPACE, constraints=(_tiles_fit_tokens, _num_sm_fills_device) + tuple(
    c for c in grouped.SPACE.constraints if c not in _PER_EXPERT_RULES), folds=())


@triton.jit
def _moe_kernel(x_ptr, w_ptr, c_ptr, offs_ptr, T, E, N, K, stride_xm, stride_xk, stride_we, stride_wk, stride_wn,
                stride_cm, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                X_K_UNIT: tl.constexpr, W_K_UNIT: tl.constexpr, W_N_UNIT: tl.constexpr, ALIGNED: tl.constexpr,
                GATED: tl.constexpr):
    """Program p takes tiles p, p + num_programs, ... of all experts in order (expert-major, then M, then N).
    N is the output's width: with GATED, w holds 2N columns, the gate's then the up's."""
    if X_K_UNIT:
        stride_xk = 1
    if W_K_UNIT:
        stride_wk = 1
    if W_N_UNIT:
        stride_wn = 1
    if ALIGNED:  # the host checked these; they let loads along the unit axis use 16-byte vectors
        stride_xm = tl.multiple_of(stride_xm, 8)
        stride_we = tl.multiple_of(stride_we, 8)
        stride_cm = tl.multiple_of(stride_cm, 8)
        N = tl.multiple_of(N, 8)
        K = tl.multiple_of(K, 8)
    tiles_n = tl.cdiv(N, BLOCK_N)
    tile = tl.program_id(0)
    tiles_before = tile * 0  # tiles of the experts before this one (an int32 tensor, as the loop needs)
    row_start = tile * 0
    w_expert = w_ptr  # advanced one expert per step: 64-bit pointer arithmetic, no int32 product to overflow
    for e in range(0, E):
        # Clamped to [row_start, T]: offsets past the buffer or going backwards cannot make a program
        # read or write outside x and out; such an expert just gets fewer (or no) rows.
        row_end = tl.maximum(tl.minimum(tl.load(offs_ptr + e).to(tl.int32), T), row_start)
        expert_tiles = tl.cdiv(row_end - row_start, BLOCK_M) * tiles_n
        while tile < tiles_before + expert_tiles:
            local = tile - tiles_before
            offs_m = row_start + (local // tiles_n) * BLOCK_M + tl.arange(0, BLOCK_M)
            offs_n = (local % tiles_n) * BLOCK_N + tl.arange(0, BLOCK_N)
            if GATED:
                _gated_tile(x_ptr, w_expert, c_ptr, offs_m, offs_n, row_end, N, K, stride_xm, stride_xk, stride_wk,
                            stride_wn, stride_cm, BLOCK_M, BLOCK_N, BLOCK_K)
            else:
                tile_product(x_ptr, w_expert, c_ptr, offs_m, offs_n, row_end, N, K, stride_xm, stride_xk, stride_wk,
                             stride_wn, stride_cm, BLOCK_M, BLOCK_N, BLOCK_K)
            tile += tl.num_programs(0)
        tiles_before += expert_tiles
        row_start = row_end
        w_expert += stride_we


@triton.jit
def _gated_tile(x_ptr, w_ptr, c_ptr, offs_m, offs_n, M, N, K, stride_xm, stride_xk, stride_wk, stride_wn, stride_cm,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """C[offs_m, offs_n] = silu(X @ W[:, offs_n]) * (X @ W[:, N + offs_n]): ``tile_product`` with the gate's and
    the up's columns of one tile in the same program, so each x tile is loaded once for both and the [T, 2N]
    product never reaches memory. Rows >= M and columns >= N are masked; C's column stride is 1."""
    offs_k = tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :] * stride_xk
    gate_ptrs = w_ptr + offs_k[:, None] * stride_wk + offs_n[None, :] * stride_wn
    up_ptrs = gate_ptrs + N * stride_wn
    mask_m = offs_m[:, None] < M
    mask_n = offs_n[None, :] < N
    gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k * BLOCK_K
        x = tl.load(x_ptrs, mask=mask_m & (offs_k[None, :] < k_left), other=0.0)
        mask_w = (offs_k[:, None] < k_left) & mask_n
        gate = tl.dot(x, tl.load(gate_ptrs, mask=mask_w, other=0.0), gate)
        up = tl.dot(x, tl.load(up_ptrs, mask=mask_w, other=0.0), up)
        x_ptrs += BLOCK_K * stride_xk
        gate_ptrs += BLOCK_K * stride_wk
        up_ptrs += BLOCK_K * stride_wk
    out = gate * tl.sigmoid(gate) * up  # in fp32, rounded once, as the dense gated epilogue
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :]
    tl.store(c_ptrs, out.to(c_ptr.dtype.element_ty), mask=mask_m & mask_n)


# -------------------------------------------------------------------------------------------- operands

def check_operands(x: object, w: object, offsets: object) -> None:
    """Raise the TypeError/ValueError that names the bad operand and the fix."""
    for name, t in (("x", x), ("w", w), ("offsets", offsets)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"moe_matmul takes torch tensors; {name} is a {type(t).__name__}")
    if x.dim() != 2 or w.dim() != 3:
        raise ValueError(f"moe_matmul takes x as [tokens, K] and w as [experts, K, N]; got x {tuple(x.shape)} "
                         f"and w {tuple(w.shape)}")
    if x.dtype not in _DTYPE_NAMES or w.dtype != x.dtype:
        raise TypeError(f"moe_matmul takes float16 or bfloat16 x and w of one dtype; got {x.dtype} and {w.dtype}; "
                        "cast both with .half() or .bfloat16()")
    if offsets.dim() != 1 or offsets.dtype not in _OFFSET_DTYPES or offsets.shape[0] != w.shape[0]:
        raise ValueError(f"moe_matmul takes offsets as a 1-D int32 (or int64) tensor with one end row per expert "
                         f"({w.shape[0]}); got {offsets.dtype} of shape {tuple(offsets.shape)}")
    if x.shape[1] != w.shape[1]:
        raise ValueError(f"x has K={x.shape[1]} but w has K={w.shape[1]} (w is [experts, K, N]; for weights "
                         "stored [experts, N, K] pass w.transpose(1, 2))")
    if not (x.device == w.device == offsets.device):
        raise ValueError(f"moe_matmul takes x, w and offsets on one device; got {x.device}, {w.device} and "
                         f"{offsets.device}")


def operands_ok(x: object, w: object, offsets: object) -> bool:
    """The hot path's check: True when ``check_operands`` would pass, without building messages."""
    return (isinstance(x, torch.Tensor) and isinstance(w, torch.Tensor) and isinstance(offsets, torch.Tensor)
            and x.dim() == 2 and w.dim() == 3 and offsets.dim() == 1 and x.dtype in _DTYPE_NAMES
            and w.dtype == x.dtype and offsets.dtype in _OFFSET_DTYPES and offsets.shape[0] == w.shape[0]
            and x.shape[1] == w.shape[1] and x.device == w.device == offsets.device)


def weight_layout(w: torch.Tensor) -> str:
    """``n`` for [E, K, N] row-major experts, ``t`` for experts stored [E, N, K] (w = w_nk.transpose(1, 2))."""
    k, n = w.shape[1], w.shape[2]
    return "t" if w.stride(1) == 1 and k > 1 and not (w.stride(2) == 1 and n > 1) else "n"


def balanced_problem(dtype: str, layout: str, tokens: int, experts: int, n: int, k: int) -> Problem:
    """The group of E GEMMs with T split as evenly as it goes: what dispatch knows of a call."""
    base, extra = divmod(tokens, experts)
    return Problem(KERNEL, dtype, layout, tuple((base + (e < extra), n, k) for e in range(experts)))


def problem_of(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor) -> Problem:
    """The exact group a call poses; reads ``offsets`` on the host (a sync), so the tuner uses it, not dispatch."""
    check_operands(x, w, offsets)
    ends = _ends((x, w, offsets))
    shapes = tuple((end - start, w.shape[2], w.shape[1]) for start, end in zip([0] + ends[:-1], ends))
    return Problem(KERNEL, _DTYPE_NAMES[x.dtype], "n" + weight_layout(w), shapes)


def _check_problem(problem: Problem) -> None:
    if len({(n, k) for _, n, k in problem.shapes}) != 1:
        raise ValueError(f"a {KERNEL} group shares one N and one K over its experts; got {problem.key!r}. "
                         "Groups of unrelated shapes are grouped_matmul's")
    if problem.layout[0] != "n":
        raise ValueError(f"{KERNEL} takes x row-major (layout n?); got layout {problem.layout!r}")


# --------------------------------------------------------------------------------------------- launcher

def run_checked(config: Config, x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor,
                out: torch.Tensor | None = None) -> torch.Tensor:
    """Launch ``config`` on operands ``operands_ok`` passed. Rows at or past ``offsets[-1]`` are not written."""
    return run_tiles(config, x, w, offsets, out, gated=False)


def run_tiles(config: Config, x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor, out: torch.Tensor | None,
              gated: bool) -> torch.Tensor:
    """``_moe_kernel`` over the experts' tiles of a fresh or given ``out``: [T, N], or with ``gated``
    silu(x @ w[:, :, :N]) * (x @ w[:, :, N:]), [T, N] for w [E, K, 2N] (``moe_gated_matmul``, kernels/moe_gated.py)."""
    if x.device.type == "cpu" and not interpreter_enabled():
        name = "moe_gated_matmul" if gated else KERNEL
        raise ValueError(f"{name} got CPU tensors, but Triton kernels run on the GPU; move them with .cuda(), "
                         "or set TRITON_INTERPRET=1 before triton is imported to run the interpreter")
    tokens, k = x.shape
    experts, n = w.shape[0], w.shape[2] // 2 if gated else w.shape[2]
    if out is None:
        out = torch.empty((tokens, n), dtype=x.dtype, device=x.device)
    elif out.shape != (tokens, n) or out.dtype != x.dtype or out.stride(1) != 1 or overlapping(out):
        raise ValueError(f"out must be a row-major-rows {tokens}x{n} {x.dtype} tensor whose elements are distinct; "
                         f"got {tuple(out.shape)} {out.dtype} with strides {out.stride()}")
    if tokens == 0 or n == 0 or experts == 0:
        return out
    launch, ints = _launch_of(config, x, w, out, offsets, gated)
    launch(x, w, out, offsets, *ints)
    return out


def _launch_of(config: Config, x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, offsets: torch.Tensor,
               gated: bool) -> tuple[DirectLaunch, tuple[int, ...]]:
    """The ready launch of ``config`` for these operands, and its integer arguments (after the four tensors)."""
    ints = (x.shape[0], w.shape[0], out.shape[1], x.shape[1], *x.stride(), *w.stride(), out.stride(0))
    # Triton specializes a launch on its integers and on each tensor's dtype and 16-byte alignment;
    # a key holding all of them names calls that one compiled kernel serves alike (x, w and out share
    # one dtype; offsets may be int32 or int64).
    key = (gated, config, x.dtype, offsets.dtype, x.device, *ints, x.data_ptr() % 16, w.data_ptr() % 16,
           out.data_ptr() % 16, offsets.data_ptr() % 16)
    return LAUNCHES.get_or_make(key, lambda: _prepare(config, x, w, out, offsets, gated)), ints


class Ready(NamedTuple):
    """What a repeated eager call of one signature runs, worked out once (``ready``), so that the call makes
    one dict lookup before its launch (kernels/_grouped_dispatch.py): the dispatcher's ``changes`` count it
    was made under (a clear, another database or a pin makes it stale), the dispatch key (record mode counts
    it), the launch specialized for 16-byte aligned x, w, offsets and output, with its integer arguments and
    the output's width; or, where the baseline won, ``kernel`` None. ``checked``: the family's own launch
    with this config, for whatever the kernel cannot take (the baseline, an unaligned operand); or, where the
    baseline is one ``torch._grouped_mm`` call on such operands, that call alone."""
    changes: int
    key: tuple
    kernel: DirectLaunch | None
    ints: tuple[int, ...]
    width: int
    checked: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def ready(config: Config, key: tuple, changes: int, x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor,
          gated: bool, checked: Callable[..., torch.Tensor]) -> Ready | None:
    """The ``Ready`` of a call whose operands passed ``operands_ok`` (``checked(config, x, w, offsets)`` is its
    family's launch), or None where a call like it must take the whole path: no rows, experts or columns, an
    operand not 16-byte aligned, or a tensor on neither the GPU nor the CPU (the interpreter's)."""
    width = w.shape[2] // 2 if gated else w.shape[2]
    if not (x.is_cuda or x.is_cpu) or x.shape[0] == 0 or w.shape[0] == 0 or width == 0 or \
            (x.data_ptr() | w.data_ptr() | offsets.data_ptr()) & 15:
        return None
    checked_call = functools.partial(checked, config)
    if is_baseline(config):
        # Where the baseline is torch._grouped_mm itself, the call is that, with nothing around it: at a decode
        # step's 8 routed rows the checked launch's few checks cost 6-8 us of host time above torch._grouped_mm's
        # 27-29 (H200, 2026-11-29, torch 2.11.0+cu130, triton 3.6.0; docs/runs/2026-11-29-h200-moe-ready-plans).
        if not gated and offsets.dtype == torch.int32 and _grouped_mm_takes(x, w):  # int32: no cast either
            checked_call = grouped_mm_call
        return Ready(changes, key, None, (), width, checked_call)
    out = torch.empty((x.shape[0], width), dtype=x.dtype, device=x.device)  # a fresh output's strides and alignment
    kernel, ints = _launch_of(config, x, w, out, offsets, gated)
    return Ready(changes, key, kernel, ints, width, checked_call)


def run_ready(plan: Ready, x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """``plan`` on operands of its signature: its kernel into a fresh output where they are aligned as it was
    specialized, else the checked launch."""
    kernel = plan.kernel
    if kernel is None or (x.data_ptr() | w.data_ptr() | offsets.data_ptr()) & 15:
        return plan.checked(x, w, offsets)
    out = torch.empty((x.shape[0], plan.width), dtype=x.dtype, device=x.device)
    kernel(x, w, out, offsets, *plan.ints)
    return out


def _prepare(config: Config, x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, offsets: torch.Tensor,
             gated: bool) -> DirectLaunch:
    """The grid and constexprs of ``config`` for operands like these (N: the output's width)."""
    tokens, k = x.shape
    experts = w.shape[0]
    n = out.shape[1]
    values = config.as_dict()
    block_m, block_n = int(values["BLOCK_M"]), int(values["BLOCK_N"])
    # The host does not know the split; each expert adds at most one partial row of tiles.
    most_tiles = (_cdiv(tokens, block_m) + experts) * _cdiv(n, block_n)
    sxm, sxk = x.stride()
    swe, swk, swn = w.stride()
    x_k_unit = sxk == 1 or k <= 1
    w_n_unit = swn == 1 or w.shape[2] <= 1
    w_k_unit = not w_n_unit and (swk == 1 or k <= 1)
    strides = [out.stride(0)] + [s for s, unit in ((sxm, False), (sxk, x_k_unit), (swe, False), (swk, w_k_unit),
                                                   (swn, w_n_unit)) if not unit]
    # n a multiple of 8 keeps a gated kernel's up half (N columns in) on 16-byte boundaries too.
    aligned = (all(t.data_ptr() % 16 == 0 for t in (x, w, out)) and n % _VECTOR == 0 and k % _VECTOR == 0
               and all(s % _VECTOR == 0 for s in strides))
    grid = (max(1, min(int(values["NUM_SM"]), most_tiles)),)
    return DirectLaunch(_moe_kernel, grid, dict(
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=values["BLOCK_K"], X_K_UNIT=x_k_unit, W_K_UNIT=w_k_unit,
        W_N_UNIT=w_n_unit, ALIGNED=aligned, GATED=gated, num_warps=values["num_warps"],
        num_stages=values["num_stages"]))


# Ready launches of run_checked, by config and everything Triton specializes on (see there).
LAUNCHES = LruCache()


def dispatch_key(x: torch.Tensor, w: torch.Tensor, mode: str) -> tuple:
    """What ``kernels.moe_matmul`` resolves a call by: (T, E, N, K), dtype, weight layout, device and mode."""
    return (x.device, x.dtype, x.shape[0], w.shape[0], w.shape[2], x.shape[1], weight_layout(w), mode)


def key_of(rows: int, w: torch.Tensor, mode: str) -> tuple:
    """``dispatch_key`` of a call of ``rows`` sorted rows on ``w``, for a caller deciding before it has them."""
    return (w.device, w.dtype, rows, w.shape[0], w.shape[2], w.shape[1], weight_layout(w), mode)


def resolve(key: tuple) -> Config:
    """The config dispatch runs for ``key`` (``dispatch_key``): the cached answer, else the tables' rule."""
    config = DISPATCHER.cached(key)
    if config is None:
        device = current_device(key[0])
        problem = balanced_problem(_DTYPE_NAMES[key[1]], "n" + key[6], *key[2:6])
        config = DISPATCHER.resolve(key, MOE_MATMUL, problem, device, key[-1])
        if _REC.on:  # a caller that asks first (kernels/hf.py) leaves the call itself a cached key: note it here
            _REC.seen(key, KERNEL, problem, device)
    return config


@contextlib.contextmanager
def pinning(configs: Sequence[Config], x: torch.Tensor, w: torch.Tensor) -> Iterator[list[Callable[[], None]]]:
    """One installer per config: after ``install()``, ``kernels.moe_matmul`` on operands shaped like ``x``
    and ``w`` runs that config in every mode, until another installer runs or the block ends. The tuner
    times the public call this way (as ``kernels._plans.pinning`` for matmul)."""
    with DISPATCHER.pinning([dispatch_key(x, w, mode) for mode in MODES], configs) as installers:
        yield installers


def moe_matmul_with(config: Config, x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor,
                    out: torch.Tensor | None = None) -> torch.Tensor:
    """``moe_matmul`` with an explicit config (``VARIANT=cublas``: the baseline)."""
    check_operands(x, w, offsets)
    reason = None if is_baseline(config) else SPACE.outside(config)
    if reason:
        raise ValueError(f"config '{config}' is not in the {KERNEL} search space: {reason}")
    return launch(config, x, w, offsets, out)


def launch(config: Config, x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor,
           out: torch.Tensor | None = None) -> torch.Tensor:
    """``config`` on checked operands; the baseline (which may read offsets on the host) for cuBLAS. As the
    kernel, the baseline leaves ``out``'s rows at or past the last end row as they were."""
    if not is_baseline(config):
        return run_checked(config, x, w, offsets, out)
    result = baseline((x, w, offsets))
    if out is None:
        return result
    # The baseline's own rows past the end are not ours to copy: a mask on the device (no host sync).
    return out.copy_(torch.where(_routed(x, offsets)[:, None], result, out))


def _routed(x: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """[T] bool: whether each row of x lies before the last end row (as ``_ends`` clamps: the largest offset),
    computed on the device."""
    rows = torch.arange(x.shape[0], device=x.device)
    if offsets.numel() == 0:
        return rows < 0
    return rows < offsets.max().to(device=x.device)


# --------------------------------------------------------------------------------------- the rest of the spec

def make_inputs(problem: Problem, torch_device: object, seed: int) -> tuple:
    """x [T, K] sorted by expert, w [E, K, N] (layout ``nt``: stored [E, N, K] and transposed), int32 offsets
    on the device, and the same end rows on the host, so that the loop baseline needs no sync to read them."""
    _check_problem(problem)
    if problem.dtype not in _TORCH_DTYPES:
        raise ValueError(f"{KERNEL} runs fp16 or bf16, not {problem.dtype}")
    dtype = _TORCH_DTYPES[problem.dtype]
    _, n, k = problem.shapes[0]
    tokens = sum(m for m, _, _ in problem.shapes)
    gen = torch.Generator(device=torch_device).manual_seed(seed)  # on the device: see grouped.make_inputs
    scale = max(k, 1) ** -0.25  # each output element about N(0, 1)
    x = (torch.randn((tokens, k), generator=gen, device=torch_device) * scale).to(dtype=dtype)
    experts = len(problem.shapes)
    if problem.layout[1] == "t":
        w = (torch.randn((experts, n, k), generator=gen, device=torch_device) * scale).to(dtype=dtype).transpose(1, 2)
    else:
        w = (torch.randn((experts, k, n), generator=gen, device=torch_device) * scale).to(dtype=dtype)
    ends = _routed_rows(problem, seed).cumsum(0)
    return x, w, ends.to(dtype=torch.int32, device=torch_device), tuple(ends.tolist())


def check_inputs(problem: Problem, torch_device: object, seed: int, halves: int = 1) -> tuple:
    """Inputs that expose an MoE kernel's misses (kernels/_check.py): the problem's tokens split with an empty
    first expert, a one-row expert and an empty one before the last (``hard_split``); x's last K column, last
    row and the last expert's rows loud, and each expert's last K row and last column; the offsets the last
    elements of their buffer, after a value no expert ends at (a read one before them takes it).

    ``halves=2``: w's columns are a gated kernel's gate then up halves (kernels/moe_gated.py), and only the
    gate's last column is made loud, not the last K row, as ``loud_edges`` does for the dense gated kernel:
    silu(g) * u multiplies two loud sums."""
    _, n, k = problem.shapes[0]
    tokens, experts = sum(m for m, _, _ in problem.shapes), len(problem.shapes)
    rows = hard_split(tokens, experts)
    x, w, _, _ = make_inputs(problem, torch_device, seed)
    ends = torch.tensor(rows).cumsum(0)
    last = int(ends[-2]) if experts > 1 else 0
    with torch.no_grad():
        edges = (w[:, -1:, :], w[:, :, -1:]) if halves == 1 else (w[:, :, n // 2 - 1:n // 2],)
        for t in (x[:, -1:], x[-1:], x[last:], *edges):
            t.mul_(LOUD)
    buffer = torch.full((experts + 1,), tokens + 7, dtype=torch.int32, device=torch_device)
    buffer[1:] = ends.to(dtype=torch.int32, device=torch_device)
    return x, w, buffer[1:], tuple(ends.tolist())


def _routed_rows(problem: Problem, seed: int) -> torch.Tensor:
    """Rows per expert for the timed inputs: the problem's own split, except where it is the balanced split
    that dispatch keys every call by (``balanced_problem``). A router never splits that evenly: each
    token's expert is then drawn at random, as an untrained router's are. Why: a tile as tall as the even
    share fits no expert that gets more, and re-reads that expert's weights per tile. Tuned on the even
    split, a 16-row tile ran a Mixtral block's 64-token decode step 1.18x slower than torch's grouped GEMM
    (H100, 2026-11-24, bench_layers)."""
    rows = [m for m, _, _ in problem.shapes]
    experts, tokens = len(rows), sum(rows)
    if experts < 2 or max(rows) - min(rows) > 1 or tokens < experts:
        return torch.tensor(rows)
    gen = torch.Generator().manual_seed(seed)
    chosen = torch.randint(0, experts, (tokens,), generator=gen)
    return torch.bincount(chosen, minlength=experts)


def _ends(inputs: tuple) -> list[int]:
    """End rows as the kernel clamps them, from the host copy where the inputs carry one."""
    x, _, offsets = inputs[:3]
    raw = inputs[3] if len(inputs) > 3 else offsets.tolist()
    ends, start = [], 0
    for value in raw:
        start = min(max(int(value), start), x.shape[0])
        ends.append(start)
    return ends


def reference(inputs: tuple) -> torch.Tensor:
    """float32 product of each expert's rows; rows past the last offset are left zero (and unchecked)."""
    x, w = inputs[:2]
    out = torch.zeros((x.shape[0], w.shape[2]), dtype=torch.float32, device=x.device)
    start = 0
    for e, end in enumerate(_ends(inputs)):
        out[start:end] = x[start:end].float() @ w[e].float()
        start = end
    return out


def _grouped_mm_serves(dtype: str, layout: str) -> bool:
    """Whether ``baseline`` runs ``torch._grouped_mm`` (no host sync) for problems of this dtype and layout."""
    return dtype == "bf16" and layout[1] == "t" and hasattr(torch, "_grouped_mm")


def _grouped_mm_is_one_launch(problem: Problem, device: DeviceInfo) -> bool:
    """Whether ``torch._grouped_mm`` runs ``problem`` on ``device`` as one kernel that never reads the offsets
    on the host: Hopper and Blackwell (compute capability 9.x and 10.x; elsewhere torch loops over the
    groups after copying the offsets to the host, or refuses), with N and K multiples of 8 (16-byte rows,
    which it requires). Where this holds, a far MoE problem runs it (``KernelSpec.baseline_when_far``)."""
    if device.is_cpu or not _grouped_mm_serves(problem.dtype, problem.layout):
        return False
    _, n, k = problem.shapes[0]
    return device.compute_capability.split(".")[0] in ("9", "10") and n % 8 == 0 and k % 8 == 0


def _grouped_mm_takes(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether ``baseline`` runs ``torch._grouped_mm`` on these operands: bf16 on a GPU, K-major weights."""
    return x.is_cuda and x.dtype == torch.bfloat16 and w.stride(1) == 1 and hasattr(torch, "_grouped_mm")


def grouped_mm_call(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """torch._grouped_mm on operands it takes (``_grouped_mm_takes``) with int32 offsets: a baseline plan that is
    this call alone (``ready``), which kernels/_grouped_dispatch.py hands to the C++ path."""
    return torch._grouped_mm(x, w, offs=offsets)


def baseline(inputs: tuple) -> torch.Tensor:
    """What a user has without us: ``torch._grouped_mm`` where torch runs it (bf16 on a GPU, K-major
    weights), else a loop of torch.matmul over the experts. int64 offsets (what torch.cumsum gives) are
    cast to int32 on the device: the loop would read them on the host, a sync no CUDA graph can capture."""
    x, w, offsets = inputs[:3]
    if _grouped_mm_takes(x, w):
        return torch._grouped_mm(x, w, offs=offsets if offsets.dtype == torch.int32 else offsets.to(torch.int32))
    # Zeros, not empty: rows past the last end row read 0 (this loop has read the offsets on the host anyway).
    out = torch.zeros((x.shape[0], w.shape[2]), dtype=x.dtype, device=x.device)
    start = 0
    for e, end in enumerate(_ends(inputs)):
        if end > start:
            torch.matmul(x[start:end], w[e], out=out[start:end])
        start = end
    return out


def run(config: Config, inputs: tuple) -> torch.Tensor:
    """``inputs`` from ``make_inputs`` (their offsets end at T, so every row is written) or checked operands."""
    return run_checked(config, *inputs[:3])


def seed_configs(problem: Problem, device: DeviceInfo) -> list[Config]:
    """grouped_matmul's Hopper-good tiles, kept where this kernel's space allows them."""
    return grouped.seed_configs(problem, device, SPACE)


MOE_MATMUL = KernelSpec(
    name=KERNEL,
    space=SPACE,
    dtypes=("fp16", "bf16"),
    problem_of=problem_of,
    make_inputs=make_inputs,
    reference=reference,
    run=run,
    baseline=baseline,
    default_config=default_config,
    distance=distance,
    seeds=seed_configs,
    check_problem=_check_problem,
    baseline_dispatchable=lambda problem: _grouped_mm_serves(problem.dtype, problem.layout),
    baseline_when_far=_grouped_mm_is_one_launch,
    check_inputs=check_inputs,
)

__all__ = ["DTYPES", "MOE_MATMUL", "balanced_problem", "moe_matmul_with", "problem_of", "weight_layout"]
