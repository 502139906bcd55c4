"""Whether a kernel's output is right, element by element: the one rule every candidate, stored winner and
user kernel is held to, and the inputs that make a missed element show.

Each element must lie within its own bound of a float32 (float64 on the CPU) reference::

    |out - ref| <= margin * (u_out * |ref| + u_prod * (|ref| + s) + u_acc * sqrt(K) * s) + floor

- ``u_out``: the unit roundoff of the output's dtype (round to nearest): the final cast alone moves an
  element by up to ``u_out * |ref|``. bf16 2^-8, fp16 2^-11, fp32 2^-24.
- ``u_prod``: the relative error of one product as the tensor cores form it. fp16 and bf16 products are
  exact in fp32 (0); fp32 inputs run as TF32 (10 stored bits), which may truncate each operand: up to
  2 * 2^-10 per product, half of it a bias that scales with the value itself (hence ``|ref|``), half a
  random part that sums over K like the value does (hence the scale ``s``). 0 where fp32 products are
  fp32 FMAs: the one-row loop (matmul's gemv, the epilogues' GEMV_BLOCK_N > 0) and cuBLAS.
- ``u_acc * sqrt(K)``: fp32 accumulation (2^-24) in another order than the reference's, a random walk
  over K steps whose size is the element's scale.
- ``s``: the element's scale, the size a correct result has there: for a 2-D output the rank-one estimate
  ``rms(row i) * rms(column j) / rms(all)``, so that a loud row or column (the inputs below make some)
  scales its own elements and not the quiet ones; for other shapes the RMS of the whole output.
- ``floor``: half the spacing of the dtype's subnormals, so that an exact zero's neighbours pass.
- ``margin``: how far above the derivation a correct kernel may land: 4 (8 for the TF32 gated epilogue,
  whose two accumulators' errors multiply). docs/RELIABILITY.md has the derivation and the measurements.

A missing element is then far outside its bound, however large the output: ``check_inputs`` make the last
K column, the last row and column of every operand pair (and so of the last group or expert) four times
as large as the rest, and ``poisoned()`` makes every fresh output NaN until the kernel writes it.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ._spec import Config, KernelSpec, Problem, is_baseline, is_row_loop

__all__ = ["CheckResult", "LOUD", "MARGIN", "check_config", "check_outputs", "element_bound", "hard_split",
           "loud_edges", "margin_for", "poisoned", "runs_on_tf32"]

# Unit roundoff of each output dtype, round to nearest: |fl(x) - x| <= u |x|.
OUTPUT_ROUNDOFF = {"fp16": 2.0 ** -11, "bf16": 2.0 ** -8, "fp32": 2.0 ** -24}
# Relative error of one product on the tensor cores: fp16/bf16 significands (11, 8 bits) multiply exactly
# into fp32; fp32 inputs are cut to TF32 (11 significant bits, possibly truncated: 2^-10 each, two operands).
PRODUCT_ROUNDOFF = {"fp16": 0.0, "bf16": 0.0, "fp32": 2 * 2.0 ** -10}
ACCUMULATE_ROUNDOFF = 2.0 ** -24  # the fp32 accumulator

# Set by the GPU calibration (NVIDIA H100 80GB HBM3, torch 2.11.0+cu130, triton 3.6.0, 2026-11-28:
# `scripts/calibrate_check.py --budget-s 130` over 784 valid configs, and `python -m tuner verify` over the shipped
# H100 table's 1138 winners; docs/RELIABILITY.md section 5). From first principles a correct kernel lands at about
# 1 in units of the bound without margin; on the GPU the worst valid dense config needed 7.8 (a TMA tile of
# bf16 8192x8192x28672; the calibration's own worst was 3.98 at K = 14336), so twice that: 16. Mutants landed at
# 187 (fp32) to 10^5 (fp16, bf16) times the first-principles bound of margin 4, so a margin of 16 still rejects
# each by 47x or more.
MARGIN = 16.0
# silu(A @ Bg) * (A @ Bu) compounds both accumulators' errors, each scaled by the other factor: in fp16 and bf16
# valid gated configs needed up to 27 (shipped fp16 8x27648x5120; 11.5 in the calibration), so 64. fp32's needed
# 4.2, within the default (its TF32 products carry their own term in the bound).
# The fused MoE gate/up product (moe_gated_matmul) computes the same silu(g) * u from two accumulators: the dense
# kernel's margin until a GPU calibration measures its own.
_MARGINS = {("gated_matmul", "fp16"): 64.0, ("gated_matmul", "bf16"): 64.0,
            ("moe_gated_matmul", "fp16"): 64.0, ("moe_gated_matmul", "bf16"): 64.0}

# How much larger the edges of check inputs are than the rest: a dropped last K element then moves its
# outputs by 16 times a typical product, a skipped last row or column misses values 4 times the others.
LOUD = 4.0

DTYPE_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}


def margin_for(kernel: str, dtype: str, config: Any = None) -> float:
    """The margin of ``kernel`` on ``dtype`` (a variant of ``config`` may get its own once measured)."""
    variant = config.get("VARIANT") if config is not None and hasattr(config, "get") else None
    return _MARGINS.get((kernel, dtype, variant), _MARGINS.get((kernel, dtype), MARGIN))


@dataclass(frozen=True)
class CheckResult:
    """The verdict on one output: ``error`` is the worst element's distance from the reference in units of
    its bound (right: <= 1; NaN or inf when an element is not finite, or a shape differs)."""

    error: float
    reason: str = ""  # where and by how much, when wrong

    @property
    def ok(self) -> bool:
        return self.error <= 1.0  # NaN fails too


def _dtype_name(dtype: Any, out: torch.Tensor) -> str:
    if dtype is None:
        dtype = out.dtype
    name = DTYPE_NAMES.get(dtype, dtype)
    if name not in OUTPUT_ROUNDOFF:
        raise ValueError(f"dtype {dtype!r} has no bound; use fp16, bf16 or fp32 (or their torch dtypes)")
    return name


# Elements compared per pass: a 4096x28672 output checked whole would make ~8 float32 temporaries of 470 MB,
# and fourteen compile workers checking at once would fill an 80 GB GPU. Per pass, each is at most 16 MB.
_CHUNK = 1 << 22


@dataclass(frozen=True)
class _Scale:
    """What an element's scale is made of: rms(all), and for a matrix rms of each row and of each column."""

    total: float
    rows: torch.Tensor | None = None  # [M, 1]
    cols: torch.Tensor | None = None  # [1, N]

    def of(self, start: int, stop: int, like: torch.Tensor) -> torch.Tensor:
        """The scale of rows [start, stop): rms(row) * rms(column) / rms(all), or the RMS of the whole."""
        if self.rows is None or self.total == 0.0:
            return torch.full_like(like, self.total)
        return self.rows[start:stop] * self.cols / self.total


def _scale_of(ref: torch.Tensor) -> _Scale:
    """The RMS of the whole (in float64), and of each row and column of a matrix, a chunk of rows at a time."""
    matrix = ref.dim() == 2 and min(ref.shape) >= 2
    flat = ref.reshape(ref.shape[0], -1) if matrix else ref.reshape(1, -1)
    step = max(1, _CHUNK // max(flat.shape[1], 1))
    total, rows = 0.0, []
    cols = torch.zeros(flat.shape[1], dtype=torch.float64, device=ref.device)
    for start in range(0, flat.shape[0], step):
        squares = flat[start:start + step].float().square()
        total += float(squares.sum(dtype=torch.float64))
        if matrix:
            rows.append(squares.mean(dim=1, keepdim=True))
            cols += squares.sum(dim=0, dtype=torch.float64)
    rms = math.sqrt(total / max(ref.numel(), 1))
    if not matrix:
        return _Scale(rms)
    return _Scale(rms, torch.cat(rows).sqrt(), (cols / flat.shape[0]).sqrt().float()[None, :])


def _bound(ref: torch.Tensor, scale: torch.Tensor, dtype: str, k: int, rtol: float | None,
           margin: float, tf32: bool) -> torch.Tensor:
    magnitude = ref.abs()
    floor = _FLOOR[dtype]
    if rtol is not None:
        return rtol * (magnitude + scale) + floor
    u_prod = PRODUCT_ROUNDOFF[dtype] if tf32 else 0.0
    relative = OUTPUT_ROUNDOFF[dtype] + u_prod
    absolute = u_prod + ACCUMULATE_ROUNDOFF * math.sqrt(max(k, 1))
    return margin * (relative * magnitude + absolute * scale) + floor


# Half the spacing of each dtype's subnormals: what rounding an exact zero's neighbour may cost.
_FLOOR = {name: torch.finfo(dtype).smallest_normal * OUTPUT_ROUNDOFF[name]
          for dtype, name in DTYPE_NAMES.items()}


def element_bound(ref: torch.Tensor, dtype: str, k: int, rtol: float | None = None,
                  margin: float = MARGIN, tf32: bool = True) -> torch.Tensor:
    """Each element's allowed distance from ``ref`` (float32), by the module's rule; with ``rtol``, a
    caller's own tolerance instead: ``rtol * (|ref| + s)``. The whole at once: for tests and reports."""
    ref = ref.float()
    scale = _scale_of(ref)
    if scale.rows is None:
        return _bound(ref, torch.full_like(ref, scale.total), dtype, k, rtol, margin, tf32)
    return _bound(ref, scale.of(0, ref.shape[0], ref), dtype, k, rtol, margin, tf32)


def check_outputs(out: Any, ref: Any, dtype: Any = None, k: int = 1, rtol: float | None = None,
                  margin: float = MARGIN, tf32: bool = True) -> CheckResult:
    """Compare ``out`` (a tensor or a list of them) with ``ref`` element by element.

    ``dtype``: the output's ("fp16", "bf16", "fp32" or a torch dtype; default: ``out``'s own); ``k``: the
    length of the reductions behind each element (a GEMM's K; the largest, for a group); ``rtol``: a
    tolerance of the caller's own, relative to each element and its scale, in place of the derived one;
    ``tf32``: whether fp32 products may have run on TF32 tensor cores (False: fp32 FMAs, a tighter bound).
    """
    outs = list(out) if isinstance(out, (list, tuple)) else [out]
    refs = list(ref) if isinstance(ref, (list, tuple)) else [ref]
    if len(outs) != len(refs):
        return CheckResult(math.inf, f"{len(outs)} outputs where the reference has {len(refs)}")
    worst = CheckResult(0.0)
    for index, (o, r) in enumerate(zip(outs, refs)):
        if tuple(o.shape) != tuple(r.shape):
            return CheckResult(math.inf, f"output {index} has shape {tuple(o.shape)}, the reference {tuple(r.shape)}")
        if o.numel() == 0:
            continue
        result = _check_one(o, r, _dtype_name(dtype, o), k, rtol, margin, tf32)
        if not result.error <= worst.error:  # NaN wins, and stays
            worst = CheckResult(result.error, f"output {index}: {result.reason}" if len(outs) > 1 else result.reason)
        if math.isnan(worst.error):
            break
    return worst


def _check_one(out: torch.Tensor, ref: torch.Tensor, dtype: str, k: int, rtol: float | None,
               margin: float, tf32: bool) -> CheckResult:
    scale = _scale_of(ref)
    if not math.isfinite(scale.total):
        return CheckResult(math.nan, "the reference itself is not finite")
    matrix = scale.rows is not None
    refs = ref.reshape(ref.shape[0], -1) if matrix else ref.reshape(1, -1)
    outs = out.reshape(refs.shape)
    step = max(1, _CHUNK // max(refs.shape[1], 1))
    worst, at, over = -1.0, (0, 0, 0.0), 0
    for start in range(0, refs.shape[0], step):
        r = refs[start:start + step].float()
        o = outs[start:start + step].float()
        bound = _bound(r, scale.of(start, start + r.shape[0], r), dtype, k, rtol, margin, tf32)
        ratio = (o - r).abs() / bound
        ratio = torch.where(torch.isfinite(o), torch.nan_to_num(ratio, nan=math.inf), math.inf)
        over += int((ratio > 1.0).sum())
        flat = int(torch.argmax(ratio))
        value = float(ratio.reshape(-1)[flat])
        if value > worst:
            row, col = divmod(flat, r.shape[1])
            worst, at = value, (start + row, col, float(bound[row, col]))
    if worst <= 1.0:
        return CheckResult(worst)
    row, col, bound_there = at
    index = row * refs.shape[1] + col
    where = [int(i) for i in torch.unravel_index(torch.tensor(index), tuple(out.shape))] if out.dim() else []
    got, want = float(out.reshape(-1)[index].float()), float(ref.reshape(-1)[index].float())
    return CheckResult(worst, f"element {where} is {got:.6g}, the reference {want:.6g}: {worst:.3g}x its bound "
                              f"of {bound_there:.3g} ({over} of {out.numel()} elements over)")


# ----------------------------------------------------------------------------------------- check inputs

def loud_edges(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None, halves: int = 1) -> None:
    """Make the edges of A [M, K] and B [K, N] (views of any layout, changed in place) LOUD times larger: A's
    last row and last column, B's last row and last column, and the bias's last element.

    With ``halves`` = 2 (the gated epilogue's B: gate, then up), the gate's last column, and not B's last row:
    silu(g) * u multiplies two loud sums, and with every edge loud the corner overflowed fp16 at small K
    (83,000 at K = 1, 37,000 at K = 16, over 20 seeds). A's loud K column alone still moves a dropped K
    element's outputs by 4 typical products."""
    with torch.no_grad():
        if a.shape[0] and a.shape[1]:
            a[-1, :] *= LOUD
            a[:, -1] *= LOUD
        if b.shape[0] and b.shape[1]:
            if halves == 1:
                b[-1, :] *= LOUD
            b[:, b.shape[1] // halves - 1] *= LOUD
        if bias is not None and bias.numel():
            bias[-1] *= LOUD


def hard_split(tokens: int, experts: int) -> list[int]:
    """Rows per expert that exercise an MoE kernel's edges: the first expert empty, the second a single row,
    the one before last empty, the rest shared, the last taking what is left (so its end row is T)."""
    rows = [0] * experts
    if experts == 0:
        return rows
    special = {0, 1, experts - 2} if experts >= 4 else {0, 1} if experts == 3 else {0} if experts == 2 else set()
    left = tokens
    if experts >= 2 and left:
        single = 1 if experts >= 3 else 0
        rows[single] = 1
        left -= 1
    fill = [e for e in range(experts) if e not in special] or [experts - 1]
    share, extra = divmod(left, len(fill))
    for i, e in enumerate(reversed(fill)):  # what does not divide goes to the last experts first
        rows[e] += share + (i < extra)
    return rows


@contextlib.contextmanager
def poisoned() -> Iterator[None]:
    """Inside the block every tensor torch allocates uninitialized (``torch.empty``, a kernel's output) is
    NaN (integers: their largest value), so an element the kernel never writes cannot pass as a value left
    in recycled memory. torch's deterministic mode does the filling; it is switched on for the block alone
    (warnings only: nothing is refused) and restored after. Process-wide: for a check, never a timing."""
    was = torch.are_deterministic_algorithms_enabled()
    was_warn = torch.is_deterministic_algorithms_warn_only_enabled()
    fill = torch.utils.deterministic.fill_uninitialized_memory
    torch.utils.deterministic.fill_uninitialized_memory = True
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.use_deterministic_algorithms(True, warn_only=True)
            yield
    finally:
        torch.use_deterministic_algorithms(was, warn_only=was_warn)
        torch.utils.deterministic.fill_uninitialized_memory = fill


def largest_k(shapes: Sequence[tuple[int, int, int]]) -> int:
    """The longest reduction of a problem's GEMMs."""
    return max((k for _, _, k in shapes), default=1)


# ------------------------------------------------------------------------------------ one config, checked

def check_config(spec: KernelSpec, problem: Problem, config: Config, device: Any, seed: int) -> CheckResult:
    """Run ``config`` of ``spec`` on ``problem``'s check inputs (edges loud, fresh per ``seed``) on the torch
    ``device``, outputs poisoned before the call, and check it against the reference: the search's check of
    every candidate, and ``tuner verify``'s of every stored winner. Exceptions of the run propagate."""
    inputs = spec.inputs_for_check(problem, device, seed)
    with poisoned():
        out = spec.execute(config, inputs)
    if getattr(device, "type", device) == "cuda":
        torch.cuda.synchronize()
    try:
        return check_outputs(out, spec.reference(inputs), problem.dtype, largest_k(problem.shapes),
                             margin=margin_for(spec.name, problem.dtype, config), tf32=runs_on_tf32(config))
    finally:
        _release(out)


def runs_on_tf32(config: Config) -> bool:
    """Whether ``config``'s fp32 products may run on TF32 tensor cores: not the one-row loop (fp32 FMAs), nor
    cuBLAS (torch.matmul keeps full fp32 unless the user allows TF32)."""
    return not (is_row_loop(config) or is_baseline(config))


def _release(out: Any) -> None:
    """NaN into what the kernel returned, so that a later candidate handed the same memory cannot pass on it."""
    for t in out if isinstance(out, (list, tuple)) else [out]:
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel():
            t.fill_(math.nan)
