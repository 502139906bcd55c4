"""A router's top-k choice, tokens sorted by expert on the device (no host sync, static sizes), and the experts' rows
summed back per token: the steps before ``moe_matmul``, and after it.

``kernels.nn`` (its ``MoE`` block and ``route``) and ``kernels.hf`` (transformers' experts) both sort this way;
``kernels.hf`` combines with ``combine``, and its routers choose with ``top_k_softmax``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from . import _device
from ._launch import BoundedDict, DirectLaunch

__all__ = ["Sorted", "combine", "sort_by_expert", "top_k_softmax", "top_k_softmax_reference"]

# torch's functions as this module's own names: not ``torch.`` in traced code (docs/PYTORCH.md, "Guards")
_IS_COMPILING = torch.compiler.is_compiling
_GRAD_ENABLED = torch.is_grad_enabled

# Rows are sorted by expert by counting (a running count per expert, one scan) rather than by torch.sort
# where that pays: on the H100 a Mixtral block's 4096 routed rows took 37-39 us in torch's radix sort, eager
# and compiled alike (scripts/probes/layer_profile.py, retired at 1996844, 2026-11-26, docs/BENCHMARKS.md).
# Under torch.compile the count's few steps fuse into a few kernels; run eagerly they are several
# launches, which a decode step's handful of rows does not repay (there torch.sort is one or two), so eager
# calls count only from _COUNTING_ROWS rows (a threshold between decode and prefill, not tuned), and only
# where Triton does not sort them (``_in_triton``, below: most eager calls). Past
# _COUNTING_CELLS (many experts and many tokens) the [E, rows] count table outgrows a sort.
_COUNTING_CELLS = 1 << 22
_COUNTING_ROWS = 1024


def _counting(rows: int, experts: int) -> bool:
    return 0 < rows * experts <= _COUNTING_CELLS and (rows >= _COUNTING_ROWS or _IS_COMPILING())


class Sorted(NamedTuple):
    """Routed rows sorted by expert. A row is a (token, slot) pair, ``token * top_k + slot``."""

    perm: torch.Tensor  # [T * k] int64: the row at each sorted place
    position: torch.Tensor  # [T * k] int64: each row's sorted place (perm's inverse)
    offsets: torch.Tensor  # [E] int32: each expert's end place (what moe_matmul takes)
    counts: torch.Tensor  # [E] int64: each expert's rows
    token: torch.Tensor  # [T * k] int64: the token of the row at each sorted place (perm // top_k)


def sort_by_expert(flat: torch.Tensor, experts: int, top_k: int = 1) -> Sorted:
    """The rows ``flat`` [T * k] (each row's expert, ``top_k`` rows a token) sorted by expert, on the device (no
    host sync, static sizes), stably (torch.sort's order)."""
    rows = flat.shape[0]
    if _in_triton(flat, experts):
        return _sort_in_triton(flat, experts, top_k)
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
    return Sorted(perm, position, offsets, counts, perm // top_k if top_k > 1 else perm)


# ------------------------------------------------------------------------------------------ eagerly, in Triton

# Eagerly, up to _TRITON_ROWS routed rows over up to _TRITON_EXPERTS experts are sorted by Triton: torch.sort
# and the count around it cost 110-125 us of host time per call at decode sizes, and the counting sort's torch
# ops 180-380 us from 1024 rows, where transformers' batched_mm took 120-145 us for the whole experts call at
# one token (H200, Qwen3-30B-A3B's 128 experts, 2026-11-28, torch 2.11.0+cu130, triton 3.6.0; docs/BENCHMARKS.md
# "A benchmark's first minute, and the experts' sort"). A stable counting sort: count each expert's rows, then
# walk the rows in blocks, keeping each expert's next free place.
# - Up to _ONE_PROGRAM_ROWS (decode steps): one program does both passes, one launch (20-27 us of host time).
#   Its GPU time grows with the rows: 6 us at 8 rows, 29 us at 512, 48 at 1024, 184 at 4096 on that H200.
# - Past it: chunks of CHUNK rows in parallel, two launches: each chunk counts its rows per expert, then each
#   chunk places its rows after the earlier chunks' rows of the same expert (39-63 us of host time, 22-29 us
#   of GPU time from 1024 to 32768 rows).
# Past _TRITON_ROWS, torch's ops (one wave of chunk programs holds that many rows on an H100 or H200).
_ONE_PROGRAM_ROWS = 512
_TRITON_ROWS = 32768
_TRITON_EXPERTS = 512
SORT_BLOCK = 64
CHUNK = 256
_SORTS = BoundedDict(64)


@triton.jit
def _count_rows(expert_ptr, begin, end, EXPERTS: tl.constexpr, BLOCK: tl.constexpr):
    """Each expert's rows among rows [begin, end): [EXPERTS] int32."""
    lanes = tl.arange(0, BLOCK)
    bins = tl.arange(0, EXPERTS)
    counts = tl.zeros([EXPERTS], dtype=tl.int32)
    for start in range(begin, end, BLOCK):
        mine = start + lanes
        # Rows past the end read as expert EXPERTS, which no bin holds.
        expert = tl.load(expert_ptr + mine, mask=mine < end, other=EXPERTS)
        counts += tl.sum((expert[:, None] == bins[None, :]).to(tl.int32), axis=0)
    return counts


@triton.jit
def _chunk_count_kernel(expert_ptr, chunk_counts_ptr, rows, EXPERTS: tl.constexpr, BLOCK: tl.constexpr,
                        CHUNK: tl.constexpr):
    """Program c: each expert's rows in chunk c, into chunk_counts[c, :]."""
    chunk = tl.program_id(0)
    begin = chunk * CHUNK
    counts = _count_rows(expert_ptr, begin, tl.minimum(begin + CHUNK, rows), EXPERTS, BLOCK)
    tl.store(chunk_counts_ptr + chunk * EXPERTS + tl.arange(0, EXPERTS), counts)


@triton.jit
def _sort_kernel(expert_ptr, chunk_counts_ptr, perm_ptr, position_ptr, token_ptr, counts_ptr, offsets_ptr, rows,
                 experts, chunks, TOP_K: tl.constexpr, BLOCK: tl.constexpr, EXPERTS: tl.constexpr,
                 CHUNK: tl.constexpr, CHUNKED: tl.constexpr):
    """Places the rows of chunk ``program_id`` (all rows in one program unless CHUNKED): a row's place is its
    expert's start, plus its expert's rows in earlier chunks, earlier blocks and earlier in its own block
    (stable). Writes position (row -> place), perm (place -> row), token (place -> row // TOP_K), and from
    program 0 each expert's count and end (offsets)."""
    pid = tl.program_id(0)
    bins = tl.arange(0, EXPERTS)
    if CHUNKED:
        counts = tl.zeros([EXPERTS], dtype=tl.int32)
        earlier_chunks = tl.zeros([EXPERTS], dtype=tl.int32)
        for chunk in range(0, chunks):
            theirs = tl.load(chunk_counts_ptr + chunk * EXPERTS + bins)
            counts += theirs
            earlier_chunks += tl.where(chunk < pid, theirs, 0)
        begin = pid * CHUNK
        end = tl.minimum(begin + CHUNK, rows)
    else:
        counts = _count_rows(expert_ptr, 0, rows, EXPERTS, BLOCK)
        earlier_chunks = tl.zeros([EXPERTS], dtype=tl.int32)
        begin = pid * 0
        end = rows
    ends = tl.cumsum(counts, axis=0)
    if pid == 0:
        tl.store(counts_ptr + bins, counts.to(tl.int64), mask=bins < experts)
        tl.store(offsets_ptr + bins, ends, mask=bins < experts)
    free = ends - counts + earlier_chunks  # each expert's next free place
    lanes = tl.arange(0, BLOCK)
    for start in range(begin, end, BLOCK):
        mine = start + lanes
        live = mine < end
        expert = tl.load(expert_ptr + mine, mask=live, other=EXPERTS)
        hit = expert[:, None] == bins[None, :]  # [BLOCK, EXPERTS]
        first = tl.sum(tl.where(hit, free[None, :], 0), axis=1)  # free[expert]
        earlier = tl.sum(((expert[None, :] == expert[:, None]) & (lanes[None, :] < lanes[:, None])).to(tl.int32),
                         axis=1)
        place = (first + earlier).to(tl.int64)
        tl.store(position_ptr + mine, place, mask=live)
        tl.store(perm_ptr + place, mine.to(tl.int64), mask=live)
        tl.store(token_ptr + place, (mine // TOP_K).to(tl.int64), mask=live)
        free += tl.sum(hit.to(tl.int32), axis=0)


def _aligned(*tensors: torch.Tensor) -> bool:
    """What a direct launch promises Triton (kernels/_launch.py): 16-byte aligned data, as a fresh tensor has."""
    addresses = 0
    for t in tensors:
        addresses |= t.data_ptr()
    return addresses & 15 == 0


def _on_triton(t: torch.Tensor) -> bool:
    return t.is_cuda or (t.is_cpu and _device.INTERPRETED)


def _in_triton(flat: torch.Tensor, experts: int) -> bool:
    # Asked first while tracing: a traced tensor has no address to check.
    return (not _IS_COMPILING() and 0 < flat.shape[0] <= _TRITON_ROWS
            and 0 < experts <= _TRITON_EXPERTS and flat.dtype == torch.int64 and flat.is_contiguous()
            and _on_triton(flat) and _aligned(flat))


def _sort_in_triton(flat: torch.Tensor, experts: int, top_k: int) -> Sorted:
    rows = flat.shape[0]
    # One allocation for the four int64 outputs (perm, position, token, counts), each part 16-byte aligned.
    span = -(-max(rows, experts) // 2) * 2
    out = torch.empty(4 * span, dtype=torch.int64, device=flat.device)
    perm, position, token = out[:rows], out[span:span + rows], out[2 * span:2 * span + rows]
    counts = out[3 * span:3 * span + experts]
    offsets = torch.empty(experts, dtype=torch.int32, device=flat.device)
    key = (rows, experts, top_k, flat.device)
    launches = _SORTS.get(key)
    if launches is None:
        launches = _SORTS[key] = _sort_launches(rows, experts, top_k)
    one_program, *chunked = launches
    if one_program is not None:
        one_program(flat, offsets, perm, position, token, counts, offsets, rows, experts, 1)  # no chunk counts
    else:
        count_chunks, place_chunks, chunk_cells, chunks = chunked
        chunk_counts = torch.empty(chunk_cells, dtype=torch.int32, device=flat.device)
        count_chunks(flat, chunk_counts, rows)
        place_chunks(flat, chunk_counts, perm, position, token, counts, offsets, rows, experts, chunks)
    return Sorted(perm, position, offsets, counts, token)


def _sort_launches(rows: int, experts: int, top_k: int) -> tuple:
    """(the one-program launch, None...) or (None, the chunks' count launch, their place launch, the chunk
    counts' size, the chunks). Worked out once per size: triton.cdiv and next_power_of_2 are JIT-aware
    functions that cost microseconds per host call (kernels/gemm.py ``_cdiv``)."""
    bins = triton.next_power_of_2(experts)
    options = dict(TOP_K=top_k, BLOCK=SORT_BLOCK, EXPERTS=bins, CHUNK=CHUNK)
    if rows <= _ONE_PROGRAM_ROWS:
        return (DirectLaunch(_sort_kernel, (1,), dict(options, CHUNKED=False)), None, None, 0, 1)
    chunks = triton.cdiv(rows, CHUNK)
    return (None, DirectLaunch(_chunk_count_kernel, (chunks,), dict(EXPERTS=bins, BLOCK=SORT_BLOCK, CHUNK=CHUNK)),
            DirectLaunch(_sort_kernel, (chunks,), dict(options, CHUNKED=True)), chunks * bins, chunks)


# ------------------------------------------------------------------------------------------------- combine

# The experts' rows back to their tokens, weighted and summed in one launch: down[position] gathered, times the
# router's weights, summed over k, cast: four launches in torch, 30-40 us of host time eagerly (H200, as above).
COMBINE_BLOCK = 1024
_COMBINES = BoundedDict(64)


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
    wants_grad = _GRAD_ENABLED() and (rows.requires_grad or weights.requires_grad)
    if _IS_COMPILING() or wants_grad or not (
            _on_triton(rows) and rows.stride(1) == 1 and weights.is_contiguous() and position.is_contiguous()
            and tokens > 0 and _aligned(rows, position, weights)):
        slots = rows[position].view(tokens, top_k, hidden)
        return (slots * weights.unsqueeze(-1)).sum(1).to(dtype)
    out = torch.empty(tokens, hidden, dtype=dtype, device=rows.device)
    key = (tokens, top_k, hidden, rows.stride(0), rows.dtype, weights.dtype, dtype, rows.device)
    launch = _COMBINES.get(key)
    if launch is None:
        launch = _COMBINES[key] = DirectLaunch(
            _combine_kernel, (tokens, triton.cdiv(hidden, COMBINE_BLOCK)), dict(TOP_K=top_k, BLOCK=COMBINE_BLOCK))
    launch(rows, position, weights, out, hidden, rows.stride(0), hidden)
    return out


# ------------------------------------------------------------------------------------------ a router's choice

# transformers' top-k routers (Mixtral's, Qwen2/3-MoE's, OLMoE's) compute, after their logits' GEMM, a softmax in
# float32, torch.topk, optionally the chosen probabilities' renormalization, and a cast: four to five launches of
# a decode step's host time, 118 us of a Qwen3-30B-A3B router's at one token on an H200 (2026-11-29, torch
# 2.11.0+cu130, triton 3.6.0, scripts/moe_host_cost.py), where one launch does it all. One program takes a row of logits.
_ROUTER_EXPERTS = 1024  # a row of logits in one program's registers
_ROUTERS = BoundedDict(256)


def top_k_softmax_reference(logits: torch.Tensor, k: int, renormalize: bool,
                            dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The routers' formula in torch's ops: (scores [rows, k] in ``dtype``, experts [rows, k] int64)."""
    probabilities = torch.softmax(logits, dim=-1, dtype=torch.float32)
    scores, experts = torch.topk(probabilities, k, dim=-1)
    if renormalize:
        scores = scores / scores.sum(dim=-1, keepdim=True)
    return scores.to(dtype), experts


@triton.jit
def _top_k_softmax_kernel(logits_ptr, scores_ptr, experts_ptr, experts, stride, K: tl.constexpr,
                          BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr, RENORMALIZE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_E)
    live = offs < experts
    logits = tl.load(logits_ptr + row * stride + offs, mask=live, other=float("-inf")).to(tl.float32)
    exps = tl.where(live, tl.exp(logits - tl.max(logits, axis=0)), 0.0)
    probabilities = exps / tl.sum(exps, axis=0)  # torch's softmax: exp(x - max) / sum
    # k rounds of the largest left; among equal probabilities the lowest expert first, as torch.topk's CUDA
    # kernel takes the values equal to the k-th in index order
    left = tl.where(live, probabilities, -1.0)
    slots = tl.arange(0, BLOCK_K)
    scores = tl.zeros([BLOCK_K], dtype=tl.float32)
    chosen = tl.zeros([BLOCK_K], dtype=tl.int32)
    for slot in tl.static_range(K):
        best = tl.max(left, axis=0)
        expert = tl.min(tl.where(left == best, offs, BLOCK_E), axis=0)
        scores = tl.where(slots == slot, best, scores)
        chosen = tl.where(slots == slot, expert, chosen)
        left = tl.where(offs == expert, -1.0, left)
    if RENORMALIZE:
        scores = scores / tl.sum(scores, axis=0)
    tl.store(scores_ptr + row * K + slots, scores.to(scores_ptr.dtype.element_ty), mask=slots < K)
    tl.store(experts_ptr + row * K + slots, chosen.to(tl.int64), mask=slots < K)


def top_k_softmax(logits: torch.Tensor, k: int, renormalize: bool,
                  dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``top_k_softmax_reference`` in one launch: each row's ``k`` most probable experts under a float32
    softmax of ``logits`` [rows, E], largest first, their probabilities (renormalized to sum to one with
    ``renormalize``) in ``dtype``. None where the kernel does not take the operands (the caller runs torch's
    ops): a gradient wanted (no backward), another device or dtype, more than 1024 experts, logits not laid out
    along E, misaligned data."""
    if logits.dim() != 2 or _GRAD_ENABLED() and logits.requires_grad:
        return None
    rows, experts = logits.shape
    if (not 0 < k <= experts <= _ROUTER_EXPERTS or logits.dtype not in (torch.float16, torch.bfloat16, torch.float32)
            or dtype not in (torch.float16, torch.bfloat16, torch.float32) or logits.stride(1) != 1
            or not _on_triton(logits) or not _aligned(logits)):
        return None
    scores = torch.empty(rows, k, dtype=dtype, device=logits.device)
    chosen = torch.empty(rows, k, dtype=torch.int64, device=logits.device)
    if rows == 0:
        return scores, chosen
    key = (rows, experts, logits.stride(0), k, renormalize, logits.dtype, dtype, logits.device)
    launch = _ROUTERS.get(key)
    if launch is None:
        launch = _ROUTERS[key] = DirectLaunch(_top_k_softmax_kernel, (rows,), dict(
            K=k, BLOCK_E=triton.next_power_of_2(experts), BLOCK_K=triton.next_power_of_2(k),
            RENORMALIZE=renormalize, num_warps=4 if experts > 256 else 2))
    launch(logits, scores, chosen, experts, logits.stride(0))
    return scores, chosen
