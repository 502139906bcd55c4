"""A MoE router's softmax, top-k and renormalization in one launch (``kernels._routing.top_k_softmax``): the same
experts as torch's ops, the same scores within a rounding, and what it declines.

Real kernels: under Triton's interpreter on the CPU, on the GPU where there is one.
"""

from __future__ import annotations

import pytest
import torch
from _helpers import DEVICE

from kernels._routing import top_k_softmax, top_k_softmax_reference


def _logits(rows: int, experts: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, experts, generator=torch.Generator().manual_seed(seed)).to(dtype).to(DEVICE)


@pytest.mark.parametrize("rows,experts,k", [(1, 128, 8), (5, 8, 2), (3, 60, 4), (17, 64, 1), (2, 512, 8)])
@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_the_same_experts_and_scores_as_torchs_softmax_and_topk(rows: int, experts: int, k: int,
                                                                 renormalize: bool, dtype: torch.dtype) -> None:
    logits = _logits(rows, experts, dtype)
    for scores_dtype in (dtype, torch.float32):
        got = top_k_softmax(logits, k, renormalize, scores_dtype)
        assert got is not None
        scores, chosen = got
        want_scores, want_chosen = top_k_softmax_reference(logits, k, renormalize, scores_dtype)
        assert scores.dtype == scores_dtype and chosen.dtype == torch.int64
        # the same experts but among equal probabilities (float16 logits over 512 experts tie), whose order
        # torch.topk leaves open
        probabilities = torch.softmax(logits, dim=-1, dtype=torch.float32)
        assert torch.equal(probabilities.gather(1, chosen), probabilities.gather(1, want_chosen))
        assert torch.allclose(scores.float(), want_scores.float(), rtol=1e-5 if scores_dtype == torch.float32
                              else 1e-3, atol=1e-7)


def test_equal_probabilities_choose_the_lowest_experts_largest_first() -> None:
    logits = torch.tensor([[0.0, 2.0, 1.0, 2.0, 1.0, 1.0, -3.0]], device=DEVICE)
    scores, chosen = top_k_softmax(logits, 4, renormalize=False, dtype=torch.float32)
    assert chosen.tolist() == [[1, 3, 2, 4]]  # torch.topk's CUDA kernel takes the k-th value's ties by index
    probabilities = torch.softmax(logits, dim=-1)
    assert torch.allclose(scores, probabilities[:, [1, 3, 2, 4]])


def test_what_the_kernel_does_not_take_is_declined() -> None:
    logits = _logits(4, 16, torch.float32)
    assert top_k_softmax(_logits(2, 2048, torch.float32), 2, True, torch.float32) is None  # past 1024 experts
    assert top_k_softmax(logits.t().contiguous().t(), 2, True, torch.float32) is None  # not laid out along E
    assert top_k_softmax(logits, 17, True, torch.float32) is None  # k past the experts
    assert top_k_softmax(logits.double(), 2, True, torch.float32) is None
    assert top_k_softmax(logits[None], 2, True, torch.float32) is None  # [rows, E] only
    wanting = logits.clone().requires_grad_()
    assert top_k_softmax(wanting, 2, True, torch.float32) is None  # a gradient: no backward
    with torch.no_grad():
        assert top_k_softmax(wanting, 2, True, torch.float32) is not None
    empty = top_k_softmax(logits[:0], 2, True, torch.float16)
    assert empty is not None and empty[0].shape == (0, 2) and empty[0].dtype == torch.float16
