"""The MoE gate/up product with the SiLU gating fused: out[rows of e] = silu(x @ w[e][:, :N]) * (x @ w[e][:, N:]).

``moe_matmul``'s operands and layout (tokens sorted by expert in ``x`` [T, K], the experts' weights in ``w``
[E, K, 2N] of any strides, ``offsets`` [E] on the device), with the gate's N columns first and the up's after
them, as transformers keeps an experts module's ``gate_up_proj`` ([E, 2N, K]; ``w = gate_up_proj.transpose(1,
2)``) and as ``gated_matmul`` stacks its B. One launch writes the [T, N] gated product: each program computes
a tile's gate and up columns together (kernels/moe.py ``_gated_tile``), so x is read once for both and the
[T, 2N] intermediate that ``moe_matmul`` then ``silu_mul`` would write and read again never reaches memory.

A kernel of its own for the tuner ("moe_gated_matmul": its own records, problems, check and dispatch), as
``gated_matmul`` is beside ``matmul``. A problem is the group of the experts' ``M_e x N x K`` GEMMs with N the
output's width (the gate's, as ``gated_matmul``'s). Dispatch looks the config up by what the host knows, (T, E,
N, K), as for ``moe_matmul``. The baseline is the strongest stock path: ``torch._grouped_mm`` over the stacked
weights (a loop of torch.matmul where torch does not run it), then torch's silu and multiply.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Sequence

import torch

from . import grouped, moe
from ._device import current_device
from ._modes import MODES
from ._record_mode import RECORDER as _REC
from ._spec import Config, DeviceInfo, KernelSpec, Problem, is_baseline
from .dispatch import DISPATCHER
from .grouped import _DTYPE_NAMES, _ELEMENT_SIZE, _MAX_ACCUMULATORS_PER_THREAD

__all__ = ["KERNEL", "MOE_GATED_MATMUL", "moe_gated_matmul_with", "problem_of"]

KERNEL = "moe_gated_matmul"


# ---------------------------------------------------------------------------------------------- the space

def _fits_shared_memory(config: Config, problem: Problem, device: DeviceInfo) -> str | None:
    """grouped_matmul's rule with two weight tiles per stage: a program holds a tile's gate and up columns."""
    bm, bn, bk = (int(config[name]) for name in ("BLOCK_M", "BLOCK_N", "BLOCK_K"))
    need = config.num_stages * (bm * bk + 2 * bk * bn) * _ELEMENT_SIZE
    if need > device.shared_memory_bytes:
        return (f"{config.num_stages} stages of a {bm}x{bk} x tile and two {bk}x{bn} weight tiles (gate, up) need "
                f"{need} bytes of shared memory; {device.alias} has {device.shared_memory_bytes}")
    return None


def _fits_registers(config: Config, problem: Problem, device: DeviceInfo) -> str | None:
    """grouped_matmul's accumulator limit with two accumulators, the gate's and the up's."""
    per_thread = 2 * int(config["BLOCK_M"]) * int(config["BLOCK_N"]) // (32 * config.num_warps)
    if per_thread > _MAX_ACCUMULATORS_PER_THREAD:
        return (f"{per_thread} fp32 accumulators per thread (gate and up) spill past {_MAX_ACCUMULATORS_PER_THREAD}; "
                "use more warps or smaller blocks")
    return None


# moe_matmul's space (its parameters and its rules for any split of the tokens over the experts), with the
# shared-memory and register rules of a program that holds matching gate and up columns: BLOCK_N of the
# output's N columns, and the same BLOCK_N of the up half N columns further in.
_SINGLE_TILE_RULES = (grouped._fits_shared_memory, grouped._fits_registers)
SPACE = dataclasses.replace(moe.SPACE, constraints=(_fits_shared_memory, _fits_registers) + tuple(
    c for c in moe.SPACE.constraints if c not in _SINGLE_TILE_RULES))


def default_config(problem: Problem, device: DeviceInfo) -> Config:
    """moe_matmul's default, with fewer stages (then the smallest tile) where two weight tiles do not fit."""
    config = moe.default_config(problem, device)
    for stages in range(config.num_stages, 1, -1):
        candidate = config.replace(num_stages=stages)
        if SPACE.violation(candidate, problem, device) is None:
            return candidate
    return config.replace(BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, num_warps=4, num_stages=2)


def seed_configs(problem: Problem, device: DeviceInfo) -> list[Config]:
    """grouped_matmul's Hopper-good tiles, kept where this kernel's space allows them."""
    return grouped.seed_configs(problem, device, SPACE)


# -------------------------------------------------------------------------------------------- operands

def check_operands(x: object, w: object, offsets: object) -> None:
    """moe_matmul's checks, and w's columns the gate's and the up's halves."""
    moe.check_operands(x, w, offsets)
    if w.shape[2] % 2:
        raise ValueError(f"{KERNEL} takes w as [experts, K, 2N], the gate's N columns then the up's; got w "
                         f"{tuple(w.shape)} with an odd number of columns")


def operands_ok(x: object, w: object, offsets: object) -> bool:
    """The hot path's check: True when ``check_operands`` would pass, without building messages."""
    return moe.operands_ok(x, w, offsets) and w.shape[2] % 2 == 0


def stacked(problem: Problem) -> Problem:
    """The ``moe_matmul`` problem of the gate and up products before the gating (2N columns)."""
    return Problem(moe.KERNEL, problem.dtype, problem.layout, tuple((m, 2 * n, k) for m, n, k in problem.shapes))


def problem_of(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor) -> Problem:
    """The exact group a call poses; reads ``offsets`` on the host (a sync), so the tuner uses it, not dispatch."""
    check_operands(x, w, offsets)
    group = moe.problem_of(x, w, offsets)
    return Problem(KERNEL, group.dtype, group.layout, tuple((m, n // 2, k) for m, n, k in group.shapes))


def _check_problem(problem: Problem) -> None:
    if len({(n, k) for _, n, k in problem.shapes}) != 1:
        raise ValueError(f"a {KERNEL} group shares one N and one K over its experts; got {problem.key!r}")
    if problem.layout[0] != "n":
        raise ValueError(f"{KERNEL} takes x row-major (layout n?); got layout {problem.layout!r}")


# --------------------------------------------------------------------------------------------- launcher

def run_checked(config: Config, x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor,
                out: torch.Tensor | None = None) -> torch.Tensor:
    """Launch ``config`` on operands ``operands_ok`` passed. Rows at or past ``offsets[-1]`` are not written."""
    return moe.run_tiles(config, x, w, offsets, out, gated=True)


def launch(config: Config, x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """``config`` on checked operands; the baseline for cuBLAS (``VARIANT=cublas``)."""
    return baseline((x, w, offsets)) if is_baseline(config) else run_checked(config, x, w, offsets)


def moe_gated_matmul_with(config: Config, x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """``moe_gated_matmul`` with an explicit config (``VARIANT=cublas``: the baseline)."""
    check_operands(x, w, offsets)
    reason = None if is_baseline(config) else SPACE.outside(config)
    if reason:
        raise ValueError(f"config '{config}' is not in the {KERNEL} search space: {reason}")
    return launch(config, x, w, offsets)


# --------------------------------------------------------------------------------------------- dispatch

def dispatch_key(x: torch.Tensor, w: torch.Tensor, mode: str) -> tuple:
    """What ``kernels.moe_gated_matmul`` resolves a call by: (T, E, N, K) with N the output's width, dtype,
    weight layout, device and mode; led by the kernel's name, so it never equals a ``moe_matmul`` key."""
    return (KERNEL, x.device, x.dtype, x.shape[0], w.shape[0], w.shape[2] // 2, x.shape[1], moe.weight_layout(w),
            mode)


def key_of(rows: int, w: torch.Tensor, mode: str) -> tuple:
    """``dispatch_key`` of a call of ``rows`` sorted rows on ``w``, for a caller deciding before it has them."""
    return (KERNEL, w.device, w.dtype, rows, w.shape[0], w.shape[2] // 2, w.shape[1], moe.weight_layout(w), mode)


def resolve(key: tuple) -> Config:
    """The config dispatch runs for ``key`` (``dispatch_key``): the cached answer, else the tables' rule; in
    record mode a miss notes what the key stands for (its calls are counted by the caller)."""
    config = DISPATCHER.cached(key)
    if config is None:
        device = current_device(key[1])
        problem = balanced_problem(_DTYPE_NAMES[key[2]], "n" + key[7], *key[3:7])
        config = DISPATCHER.resolve(key, MOE_GATED_MATMUL, problem, device, key[-1])
        if _REC.on:
            _REC.seen(key, KERNEL, problem, device)
    return config


def balanced_problem(dtype: str, layout: str, tokens: int, experts: int, n: int, k: int) -> Problem:
    """The group of E gated GEMMs with T split as evenly as it goes: what dispatch knows of a call."""
    return dataclasses.replace(moe.balanced_problem(dtype, layout, tokens, experts, n, k), kernel=KERNEL)


@contextlib.contextmanager
def pinning(configs: Sequence[Config], x: torch.Tensor, w: torch.Tensor) -> Iterator[list[Callable[[], None]]]:
    """One installer per config: after ``install()``, ``kernels.moe_gated_matmul`` on operands shaped like ``x``
    and ``w`` runs that config in every mode, until another installer runs or the block ends."""
    with DISPATCHER.pinning([dispatch_key(x, w, mode) for mode in MODES], configs) as installers:
        yield installers


# --------------------------------------------------------------------------------------- the rest of the spec

def make_inputs(problem: Problem, torch_device: object, seed: int) -> tuple:
    """``moe_matmul``'s inputs for the stacked problem: w [E, K, 2N], gate then up."""
    _check_problem(problem)
    return moe.make_inputs(stacked(problem), torch_device, seed)


def check_inputs(problem: Problem, torch_device: object, seed: int) -> tuple:
    """``moe_matmul``'s check inputs (a hard split of the tokens, offsets at the end of their buffer), with the
    gate's last column loud and not w's last K row (kernels/moe.py ``check_inputs``, ``halves=2``)."""
    _check_problem(problem)
    return moe.check_inputs(stacked(problem), torch_device, seed, halves=2)


def gating(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up over the halves of [T, 2N], in torch, as transformers' ``_default_apply_gate``."""
    gate, up = gate_up.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up


def reference(inputs: tuple) -> torch.Tensor:
    """The gating of the float32 product of each expert's rows; rows past the last offset are zero."""
    return gating(moe.reference(inputs))


def baseline(inputs: tuple) -> torch.Tensor:
    """What a user has without us: ``moe_matmul``'s baseline over the stacked weights (``torch._grouped_mm``
    where torch runs it, else a loop of torch.matmul), then torch's silu and multiply."""
    return gating(moe.baseline(inputs))


def run(config: Config, inputs: tuple) -> torch.Tensor:
    """``inputs`` from ``make_inputs`` (their offsets end at T, so every row is written) or checked operands."""
    return run_checked(config, *inputs[:3])


MOE_GATED_MATMUL = KernelSpec(
    name=KERNEL,
    space=SPACE,
    dtypes=("fp16", "bf16"),
    problem_of=problem_of,
    make_inputs=make_inputs,
    reference=reference,
    run=run,
    baseline=baseline,
    default_config=default_config,
    distance=grouped.distance,
    seeds=seed_configs,
    check_problem=_check_problem,
    # torch._grouped_mm's conditions are moe_matmul's (with N and 2N multiples of 8 alike).
    baseline_dispatchable=lambda problem: moe._grouped_mm_serves(problem.dtype, problem.layout),
    baseline_when_far=moe._grouped_mm_is_one_launch,
    check_inputs=check_inputs,
)
