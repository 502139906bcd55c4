"""Tokens sorted by expert on the device (no host sync, static sizes): the step between a router and ``moe_matmul``.

``kernels.nn`` (its ``MoE`` block and ``route``) and ``kernels.hf`` (transformers' experts) both sort this way.
"""

from __future__ import annotations

import torch

__all__ = ["sort_by_expert"]

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
