"""RMSNorm in one launch: what a transformers decoder computes around each attention and MLP (and, in Qwen3, on
each head's queries and keys), as one Triton kernel in place of torch's six to eight elementwise and reduction
launches.

In an eager decode step each of those launches is host time (a 2-layer Qwen2.5-7B runs five norms a token, about
40 launches); in prefill each is a pass over the [rows, H] activations in float32. ``kernels.patch`` makes each
norm whose own forward computes one of ``FORMULAS`` a ``kernels.nn.FusedRMSNorm`` (checked at patch time on
random rows and a random weight), which calls ``rms_norm`` here.

The kernel computes in float32 as the modules do (the input cast up, the mean of squares, ``rsqrt``, the
weight's product) and rounds where the module's formula rounds. Its sum of squares is reduced in another order
than torch's ``mean``, so an output may differ from the module's by one unit in the last place of its dtype.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ._launch import BoundedDict, DirectLaunch
from ._routing import _aligned, _on_triton

__all__ = ["FORMULAS", "Formula", "rms_norm", "rms_norm_reference"]


class Formula(NamedTuple):
    """Where an RMSNorm rounds and what it multiplies by. ``normed`` is ``x * rsqrt(mean(x^2) + eps)`` in
    float32."""

    name: str
    round_first: bool  # normed rounded to x's dtype before the weight's product (Llama), else after it
    weight_offset: float  # the product is by (offset + weight): Gemma keeps its weight as an offset from 1


FORMULAS = (
    # transformers' Llama, Mistral, Qwen2/2.5/3, Phi-3, DeepSeek, Mixtral: weight * normed.to(x.dtype), in the
    # product's promoted dtype
    Formula("llama", round_first=True, weight_offset=0.0),
    # Gemma 2 and 3: (normed * (1 + weight.float())).to(x.dtype)
    Formula("gemma", round_first=False, weight_offset=1.0),
    # OLMo-2 and others: (weight * normed).to(x.dtype)
    Formula("scaled-then-rounded", round_first=False, weight_offset=0.0),
)

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# One program holds a row in registers; past this width the module keeps its own forward.
MAX_WIDTH = 32768


def output_dtype(formula: Formula, x: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    return torch.promote_types(x.dtype, weight.dtype) if formula.round_first else x.dtype


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float, formula: Formula) -> torch.Tensor:
    """``formula`` in torch's ops, as the modules write it (the patch-time check compares a module with these)."""
    normed = x.float()
    normed = normed * torch.rsqrt(normed.pow(2).mean(-1, keepdim=True) + eps)
    if formula.round_first:
        return weight * normed.to(x.dtype)
    return (normed * (formula.weight_offset + weight.float())).to(x.dtype)


@triton.jit
def _rms_norm_kernel(x_ptr, weight_ptr, out_ptr, cols, x_stride, out_stride, eps, BLOCK: tl.constexpr,
                     ROUND_FIRST: tl.constexpr, WEIGHT_OFFSET: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    live = offs < cols
    x = tl.load(x_ptr + row * x_stride + offs, mask=live, other=0.0).to(tl.float32)
    normed = x * tl.math.rsqrt(tl.sum(x * x, axis=0) / cols + eps)
    weight = tl.load(weight_ptr + offs, mask=live, other=0.0).to(tl.float32)
    if ROUND_FIRST:
        out = weight * normed.to(x_ptr.dtype.element_ty).to(tl.float32)
    else:
        out = normed * (weight + WEIGHT_OFFSET)
    tl.store(out_ptr + row * out_stride + offs, out.to(out_ptr.dtype.element_ty), mask=live)


# (rows, width, dtypes, device, formula): a signature's ready launch
_LAUNCHES: BoundedDict = BoundedDict(1024)


def _warps(block: int) -> int:
    return 16 if block >= 8192 else 8 if block >= 2048 else 4


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, formula: Formula) -> torch.Tensor | None:
    """``formula`` over the last dimension of ``x`` in one launch; None where the kernel does not take these
    operands (the caller then runs the module's own forward): a gradient wanted (the kernel has no backward),
    autocast on, another device or dtype, a non-contiguous or misaligned input, a width past ``MAX_WIDTH``."""
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
        return None
    width = weight.shape[0] if weight.dim() == 1 else -1
    if (x.dim() == 0 or x.shape[-1] != width or width > MAX_WIDTH or x.dtype not in _DTYPES
            or weight.dtype not in _DTYPES or not _on_triton(x) or x.device != weight.device
            or torch._C._is_any_autocast_enabled() or not x.is_contiguous() or not weight.is_contiguous()):
        return None
    if not _aligned(x, weight):  # the output is fresh, so aligned
        return None
    rows = x.numel() // width
    out = torch.empty(x.shape, dtype=output_dtype(formula, x, weight), device=x.device)
    if rows == 0:
        return out
    key = (rows, width, x.dtype, weight.dtype, out.dtype, x.device, formula)
    launch = _LAUNCHES.get(key)
    if launch is None:
        block = triton.next_power_of_2(width)
        launch = _LAUNCHES[key] = DirectLaunch(_rms_norm_kernel, (rows,), dict(
            BLOCK=block, ROUND_FIRST=formula.round_first, WEIGHT_OFFSET=formula.weight_offset,
            num_warps=_warps(block)))
    launch(x, weight, out, width, width, width, eps)
    return out
