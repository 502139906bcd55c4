"""Tokens sorted by expert on the device (no host sync, static sizes), and the experts' rows summed back per token:
the steps between a router and ``moe_matmul``, and after it.

``kernels.nn`` (its ``MoE`` block and ``route``) and ``kernels.hf`` (transformers' experts) both sort this way;
``kernels.hf`` combines with ``combine``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import _device
from ._launch import DirectLaunch, LruCache

__all__ = ["combine", "sort_by_expert"]

# Rows are sorted by expert by counting (a running count per expert, one scan) rather than by torch.sort
# where that pays: on the H100 a Mixtral block's 4096 routed rows took 37-39 us in torch's radix sort, eager
# and compiled alike (scripts/probes/layer_profile.py, retired at 1996844, 2026-11-26, docs/BENCHMARKS.md). Under torch.compile the count's few steps fuse into a few kernels; run eagerly they are several
# launches, which a decode step's handful of rows does not repay (there torch.sort is one or two), so eager
# calls count only from _COUNTING_ROWS rows (a threshold between decode and prefill, not tuned). Past
# _COUNTING_CELLS (many experts and many tokens) the [E, rows] count table outgrows a sort.
_COUNTING_CELLS = 1 << 22
_COUNTING_ROWS = 1024


def _counting(rows: int, experts: int) -> bool:
    return 0 < rows * experts <= _COUNTING_CELLS and (rows >= _COUNTING_ROWS or torch.compiler.is_compiling())


def sort_by_expert(flat: torch.Tensor, experts: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The (token, slot) rows ``flat`` [T * k] (each row's expert) sorted by expert, on the device (no host
    sync, static sizes): (perm, position, offsets, counts) as ``_Routed`` names them."""
    rows = flat.shape[0]
    if _ranking(flat, experts):
        return _rank_by_expert(flat, experts)
    index = torch.arange(rows, device=flat.device)
    if _counting(rows, experts):
        # A stable counting sort: a row's place is its expert's start plus how many rows of that expert
        # come before it. All sizes are static, so torch.compile traces it whole.
        hits = (torch.arange(experts, device=flat.device)[:, None] == flat[None, :]).to(torch.int32)
        running = hits.cumsum(1, dtype=torch.int32)  # [E, rows]: rows of each expert up to each row
        counts = running[:, -1].to(torch.int64)
        before = running.gather(0, flat[None, :]).squeeze(0).to(torch.int64) - 1
        position = (torch.cumsum(counts, 0) - counts)[flat] + before
        perm = torch.empty_like(index).scatter_(0, position, index)
    else:
        sorted_experts, perm = torch.sort(flat, stable=True)
        # scatter_add, not bincount: its output size is static, so torch.compile traces it without a break.
        counts = torch.zeros(experts, dtype=torch.int64, device=flat.device).scatter_add_(
            0, sorted_experts, torch.ones_like(sorted_experts))
        position = torch.empty_like(index).scatter_(0, perm, index)
    offsets = torch.cumsum(counts, 0).to(torch.int32)
    return perm, position, offsets, counts


# ---------------------------------------------------------------------------------------------- decode sizes

# A decode step's few routed rows (up to _COUNTING_ROWS) are sorted by one Triton launch that ranks every row
# against every other: eagerly, torch.sort and the count around it cost 112-123 us of host time per call on
# the H200 box, as many launches (Qwen3-30B-A3B's 8 to 512 routed rows over 128 experts, 2026-11-28,
# torch 2.11.0+cu130, triton 3.6.0), where the whole experts call of batched_mm took 142 us. The rows fit one
# loop of RANK_BLOCK-wide compares per program; the work (rows x (rows + experts) compares) is nothing to the GPU.
RANK_BLOCK = 64
_RANKS = LruCache(capacity=64)


@triton.jit
def _rank_kernel(expert_ptr, perm_ptr, position_ptr, counts_ptr, offsets_ptr, rows, experts,
                 BLOCK: tl.constexpr):
    """Programs below cdiv(rows, BLOCK) place a block of rows: a row's place is the number of rows of a lower
    expert, plus those of its own expert before it (a stable sort). The others count a block of experts'
    rows (counts) and the rows up to each expert's end (offsets)."""
    pid = tl.program_id(0)
    row_programs = tl.cdiv(rows, BLOCK)
    lanes = tl.arange(0, BLOCK)
    if pid < row_programs:
        mine = pid * BLOCK + lanes
        live = mine < rows
        expert = tl.load(expert_ptr + mine, mask=live, other=0)
        place = tl.zeros([BLOCK], dtype=tl.int64)
        for start in range(0, rows, BLOCK):
            theirs = start + lanes
            # Rows past the end read as expert ``experts``: after every real one, so never before a row.
            other = tl.load(expert_ptr + theirs, mask=theirs < rows, other=experts)
            before = (other[None, :] < expert[:, None]) | \
                ((other[None, :] == expert[:, None]) & (theirs[None, :] < mine[:, None]))
            place += tl.sum(before.to(tl.int64), axis=1)
        tl.store(position_ptr + mine, place, mask=live)
        tl.store(perm_ptr + place, mine.to(tl.int64), mask=live)
    else:
        # Named apart from the branch above: compiled Triton wants a name to keep one type across branches.
        counted = (pid - row_programs) * BLOCK + lanes
        up_to = tl.zeros([BLOCK], dtype=tl.int64)
        count = tl.zeros([BLOCK], dtype=tl.int64)
        for start in range(0, rows, BLOCK):
            theirs = start + lanes
            other = tl.load(expert_ptr + theirs, mask=theirs < rows, other=experts)
            up_to += tl.sum((other[None, :] <= counted[:, None]).to(tl.int64), axis=1)
            count += tl.sum((other[None, :] == counted[:, None]).to(tl.int64), axis=1)
        tl.store(counts_ptr + counted, count, mask=counted < experts)
        tl.store(offsets_ptr + counted, up_to.to(tl.int32), mask=counted < experts)


def _aligned(*tensors: torch.Tensor) -> bool:
    """What a direct launch promises Triton (kernels/_launch.py): 16-byte aligned data, as a fresh tensor has."""
    return all(t.data_ptr() % 16 == 0 for t in tensors)


def _on_triton(t: torch.Tensor) -> bool:
    return t.is_cuda or (t.is_cpu and _device.INTERPRETED)


def _ranking(flat: torch.Tensor, experts: int) -> bool:
    # Asked first while tracing: a traced tensor has no address to check.
    return (not torch.compiler.is_compiling() and 0 < flat.shape[0] < _COUNTING_ROWS and flat.dtype == torch.int64
            and flat.is_contiguous() and _on_triton(flat) and _aligned(flat))


def _rank_by_expert(flat: torch.Tensor, experts: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    rows = flat.shape[0]
    # One allocation for the three int64 outputs (perm, position, counts), each part 16-byte aligned.
    span = -(-max(rows, experts) // 2) * 2
    out = torch.empty(3 * span, dtype=torch.int64, device=flat.device)
    perm, position, counts = out[:rows], out[span:span + rows], out[2 * span:2 * span + experts]
    offsets = torch.empty(experts, dtype=torch.int32, device=flat.device)
    key = (rows, experts, flat.device)
    launch = _RANKS.get_or_make(key, lambda: DirectLaunch(
        _rank_kernel, (triton.cdiv(rows, RANK_BLOCK) + triton.cdiv(experts, RANK_BLOCK),), dict(BLOCK=RANK_BLOCK)))
    launch(flat, perm, position, counts, offsets, rows, experts)
    return perm, position, offsets, counts


# ------------------------------------------------------------------------------------------------- combine

# The experts' rows back to their tokens, weighted and summed in one launch: down[position] gathered, times the
# router's weights, summed over k, cast: four launches in torch, 30-40 us of host time eagerly (H200, as above).
COMBINE_BLOCK = 1024
_COMBINES = LruCache(capacity=64)


@triton.jit
def _combine_kernel(rows_ptr, position_ptr, weight_ptr, out_ptr, hidden, row_stride, out_stride,
                    TOP_K: tl.constexpr, BLOCK: tl.constexpr):
    token = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    live = cols < hidden
    total = tl.zeros([BLOCK], dtype=tl.float32)
    for slot in tl.static_range(TOP_K):
        row = tl.load(position_ptr + token * TOP_K + slot)
        weight = tl.load(weight_ptr + token * TOP_K + slot).to(tl.float32)
        total += weight * tl.load(rows_ptr + row * row_stride + cols, mask=live, other=0.0).to(tl.float32)
    tl.store(out_ptr + token * out_stride + cols, total.to(out_ptr.dtype.element_ty), mask=live)


def combine(rows: torch.Tensor, position: torch.Tensor, weights: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``sum_k weights[t, k] * rows[position[t * k + k']]`` per token t, in float32, returned in ``dtype``: [T, H].

    ``rows`` [T * k, H] the experts' outputs in sorted order, ``position`` [T * k] each (token, slot)'s row there,
    ``weights`` [T, k]. One Triton launch where the operands allow it; traced, with a gradient wanted (the launch
    has no backward) or on other operands, torch's gather and sum (no atomics), in the weights' dtype as
    transformers' own implementations sum (float32 where the router gives float32)."""
    tokens, top_k = weights.shape
    hidden = rows.shape[1]
    wants_grad = torch.is_grad_enabled() and (rows.requires_grad or weights.requires_grad)
    if torch.compiler.is_compiling() or wants_grad or not (
            _on_triton(rows) and rows.stride(1) == 1 and weights.is_contiguous() and position.is_contiguous()
            and tokens > 0 and _aligned(rows, position, weights)):
        slots = rows[position].view(tokens, top_k, hidden)
        return (slots * weights.unsqueeze(-1)).sum(1).to(dtype)
    out = torch.empty(tokens, hidden, dtype=dtype, device=rows.device)
    key = (tokens, top_k, hidden, rows.stride(0), rows.dtype, weights.dtype, dtype, rows.device)
    launch = _COMBINES.get_or_make(key, lambda: DirectLaunch(
        _combine_kernel, (tokens, triton.cdiv(hidden, COMBINE_BLOCK)), dict(TOP_K=top_k, BLOCK=COMBINE_BLOCK)))
    launch(rows, position, weights, out, hidden, rows.stride(0), hidden)
    return out
