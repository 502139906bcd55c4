"""Rotary position embeddings in one launch: what transformers' ``apply_rotary_pos_emb`` computes on an
attention's queries and keys, ``x * cos + rotate_half(x) * sin`` for both, as one Triton kernel in place of
torch's ten launches (for each of q and k: a product, a negation, a concatenation, a product, a sum).

In an eager decode step each of those launches is host time, 10 a layer. ``kernels.hf.fuse_rotary`` puts a
stand-in (``fused_rotary``) in place of a transformers modeling module's ``apply_rotary_pos_emb`` once
``apply_rotary`` has given the same bits as that function on random inputs; the stand-in runs the kernel for the
attention modules of patched models only (``ACTIVE``).

The kernel rounds where torch's ops round: each product is rounded to the inputs' dtype before the sum, and the
sum rounded again, each in float32 first as torch computes half-precision arithmetic (compiled with
``enable_fp_fusion=False``, which keeps those roundings). So the outputs are torch's,
bit for bit, for float16 and bfloat16 inputs; float32 and mixed dtypes keep torch's ops (a fused multiply-add
would round once where torch rounds twice).
"""

from __future__ import annotations

import threading
from typing import Callable

import torch
import triton
import triton.language as tl

from ._launch import BoundedDict, DirectLaunch
from ._routing import _aligned, _on_triton

__all__ = ["ACTIVE", "apply_rotary", "fused_rotary", "rotary_reference"]

_DTYPES = (torch.float16, torch.bfloat16)
_IS_COMPILING = torch.compiler.is_compiling  # not ``torch.`` in traced code: docs/PYTORCH.md, "Guards"
# One program holds a position's heads of q (and of k) in registers, [heads, head_dim] at a time.
MAX_HEAD_DIM = 1024


def rotary_reference(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                     unsqueeze_dim: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' formula in torch's ops (the tests compare ``apply_rotary`` with it)."""
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)

    def rotate_half(x: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        return torch.cat((-x[..., half:], x[..., :half]), dim=-1)

    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


@triton.jit
def _rotate(x_ptr, out_ptr, b, s, heads, x_sb, x_sh, x_ss, o_sb, o_sh, o_ss, cos, sin, offs_d, partner, first,
            HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    for h0 in range(0, heads, BLOCK_H):
        offs_h = h0 + tl.arange(0, BLOCK_H)
        live = (offs_h[:, None] < heads) & (offs_d[None, :] < 2 * HALF)
        row = x_ptr + b * x_sb + s * x_ss + offs_h[:, None] * x_sh
        x = tl.load(row + offs_d[None, :], mask=live, other=0.0)
        other = tl.load(row + partner[None, :], mask=live, other=0.0).to(tl.float32)
        rotated = tl.where(first[None, :], -other, other)  # rotate_half: (-x2, x1); a negation is exact
        # Rounded as torch's ops round: each product to x's dtype, then the sum.
        a = (x.to(tl.float32) * cos[None, :]).to(x.dtype)
        c = (rotated * sin[None, :]).to(x.dtype)
        out = (a.to(tl.float32) + c.to(tl.float32)).to(x.dtype)
        tl.store(out_ptr + b * o_sb + s * o_ss + offs_h[:, None] * o_sh + offs_d[None, :], out, mask=live)


@triton.jit
def _rotary_kernel(q_ptr, k_ptr, cos_ptr, sin_ptr, q_out_ptr, k_out_ptr, positions, q_heads, k_heads,
                   q_sb, q_sh, q_ss, k_sb, k_sh, k_ss, qo_sb, qo_sh, qo_ss, ko_sb, ko_sh, ko_ss, c_sb, c_ss,
                   HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    pid = tl.program_id(0)
    b = (pid // positions).to(tl.int64)
    s = (pid % positions).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)
    in_row = offs_d < 2 * HALF
    first = offs_d < HALF
    partner = tl.where(first, offs_d + HALF, offs_d - HALF)
    cos = tl.load(cos_ptr + b * c_sb + s * c_ss + offs_d, mask=in_row, other=0.0).to(tl.float32)
    sin = tl.load(sin_ptr + b * c_sb + s * c_ss + offs_d, mask=in_row, other=0.0).to(tl.float32)
    _rotate(q_ptr, q_out_ptr, b, s, q_heads, q_sb, q_sh, q_ss, qo_sb, qo_sh, qo_ss, cos, sin, offs_d, partner,
            first, HALF, BLOCK_H, BLOCK_D)
    _rotate(k_ptr, k_out_ptr, b, s, k_heads, k_sb, k_sh, k_ss, ko_sb, ko_sh, ko_ss, cos, sin, offs_d, partner,
            first, HALF, BLOCK_H, BLOCK_D)


# (the operands' shapes, strides and dtype, device): a signature's ready launch
_LAUNCHES: BoundedDict = BoundedDict(1024)


def _takes(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> bool:
    """Whether the kernel computes what torch's ops would for these operands: [B, heads, S, D] queries and
    keys (any strides but a unit one along D), [B, S, D] cos and sin laid out alike, one half-precision dtype,
    one device, no gradient wanted (the kernel has no backward), no autocast."""
    if q.dim() != 4 or k.dim() != 4 or cos.dim() != 3 or cos.shape != sin.shape or cos.stride() != sin.stride():
        return False
    batch, _, positions, dim = q.shape
    if (k.shape[0] != batch or k.shape[2] != positions or k.shape[3] != dim or cos.shape != (batch, positions, dim)
            or dim % 2 or dim > MAX_HEAD_DIM or q.stride(3) != 1 or k.stride(3) != 1 or cos.stride(2) != 1):
        return False
    dtype = q.dtype
    if dtype not in _DTYPES or k.dtype != dtype or cos.dtype != dtype or sin.dtype != dtype:
        return False
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or cos.requires_grad or sin.requires_grad):
        return False
    device = q.device
    return (_on_triton(q) and k.device == device and cos.device == device and sin.device == device
            and not torch._C._is_any_autocast_enabled() and _aligned(q, k, cos, sin))


def apply_rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 unsqueeze_dim: int = 1) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin)`` with cos and sin unsqueezed at
    ``unsqueeze_dim`` (1: q and k are [B, heads, S, D]), in one launch, bit for bit torch's; None where the
    kernel does not take these operands (``_takes``; another ``unsqueeze_dim``): the caller runs torch's ops.
    The outputs are laid out as torch's would be (as q and k)."""
    if unsqueeze_dim != 1 or not _takes(q, k, cos, sin):
        return None
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    batch, q_heads, positions, dim = q.shape
    if q_out.numel() == 0 or k_out.numel() == 0:
        return q_out, k_out
    key = (q.shape, q.stride(), k.shape, k.stride(), q_out.stride(), k_out.stride(), cos.stride(), q.dtype,
           q.device)
    launch = _LAUNCHES.get(key)
    if launch is None:
        block_d = triton.next_power_of_2(dim)
        block_h = max(1, min(triton.next_power_of_2(max(q_heads, k.shape[1])), 4096 // block_d))
        launch = _LAUNCHES[key] = DirectLaunch(_rotary_kernel, (batch * positions,), dict(
            HALF=dim // 2, BLOCK_H=block_h, BLOCK_D=block_d, num_warps=4 if block_h * block_d >= 2048 else 2,
            # without it the compiler drops the products' rounding and fuses them into the sum (an FMA): on an
            # H200 (2026-11-29, torch 2.11.0+cu130, triton 3.6.0, docs/runs/2026-11-29-h200-rotary-router/
            # j-rotary-variants-probe.py) 24% of the outputs then differed from torch's by a unit or two
            enable_fp_fusion=False))
    launch(q, k, cos, sin, q_out, k_out, positions, q_heads, k.shape[1],
           q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
           q_out.stride(0), q_out.stride(1), q_out.stride(2), k_out.stride(0), k_out.stride(1), k_out.stride(2),
           cos.stride(0), cos.stride(1))
    return q_out, k_out


class _Active(threading.local):
    on = False  # set while a patched attention module's forward runs, in this thread


ACTIVE = _Active()


def fused_rotary(original: Callable) -> Callable:
    """A stand-in for ``original`` (a modeling module's ``apply_rotary_pos_emb(q, k, cos, sin,
    unsqueeze_dim=1)``) that runs ``apply_rotary`` where a patched attention module calls it (``ACTIVE``; the
    module's class is shared with unpatched models, which keep ``original``) and the kernel takes the call,
    ``original`` elsewhere (under tracing too: Inductor fuses torch's ops itself)."""

    def apply_rotary_pos_emb(q, k, cos, sin, *args, **kwargs):
        # The trace check first: Dynamo folds it, so a compiled graph never reads ACTIVE (a thread-local) and has
        # nothing of it to guard.
        if not _IS_COMPILING() and ACTIVE.on and len(args) + len(kwargs) <= 1 \
                and (not kwargs or "unsqueeze_dim" in kwargs):
            out = apply_rotary(q, k, cos, sin, args[0] if args else kwargs.get("unsqueeze_dim", 1))
            if out is not None:
                return out
        return original(q, k, cos, sin, *args, **kwargs)

    apply_rotary_pos_emb.__wrapped__ = original  # type: ignore[attr-defined]
    apply_rotary_pos_emb.__doc__ = original.__doc__
    apply_rotary_pos_emb.fused_by_kernels = True  # type: ignore[attr-defined]
    return apply_rotary_pos_emb
