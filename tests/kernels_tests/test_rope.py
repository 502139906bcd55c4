"""Rotary embeddings in one launch (kernels/rope.py): the kernel gives torch's bits for transformers' formula, in
the layouts attention modules pass, and declines what it does not compute exactly.

Real kernels: under Triton's interpreter on the CPU (float16 bit for bit; its bfloat16 casts truncate where a GPU
rounds, so bfloat16 is compared bit for bit in the GPU-marked test only), on the GPU where there is one.
"""

from __future__ import annotations

import pytest
import torch
from _helpers import DEVICE

from kernels import rope
from kernels._device import interpreter_enabled


def _operands(batch: int, heads: int, kv_heads: int, positions: int, dim: int, dtype: torch.dtype,
              seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Queries and keys as attention modules make them ([B, S, heads, D] viewed as [B, heads, S, D]), and the
    cos and sin of random angles in transformers' layout ([B, S, D], the angles repeated over both halves)."""
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, positions, heads, dim, generator=generator).to(dtype).transpose(1, 2)
    k = torch.randn(batch, positions, kv_heads, dim, generator=generator).to(dtype).transpose(1, 2)
    angles = torch.rand(batch, positions, dim // 2, generator=generator) * 1000
    angles = torch.cat((angles, angles), dim=-1)
    return tuple(t.to(DEVICE) for t in (q, k, angles.cos().to(dtype), angles.sin().to(dtype)))


SHAPES = [  # (batch, heads, kv heads, positions, head_dim)
    (1, 4, 2, 1, 16),  # a decode step, grouped keys
    (2, 3, 1, 5, 64),  # a batch of prompts, one key head
    (1, 6, 6, 3, 24),  # a head_dim that is no power of two: the block masks its tail
]


@pytest.mark.parametrize("shape", SHAPES)
def test_float16_rotary_is_torchs_bit_for_bit_and_laid_out_alike(shape: tuple[int, ...]) -> None:
    q, k, cos, sin = _operands(*shape, torch.float16)
    got = rope.apply_rotary(q, k, cos, sin)
    assert got is not None
    for ours, torchs in zip(got, rope.rotary_reference(q, k, cos, sin)):
        assert torch.equal(ours, torchs)
        assert [s for s, n in zip(ours.stride(), ours.shape) if n > 1] == \
            [s for s, n in zip(torchs.stride(), torchs.shape) if n > 1]


def test_contiguous_operands_and_a_cos_shared_over_the_batch() -> None:
    q, k, cos, sin = _operands(3, 2, 2, 4, 32, torch.float16)
    q, k = q.contiguous(), k.contiguous()
    cos, sin = cos[:1].expand(3, -1, -1), sin[:1].expand(3, -1, -1)  # one position list for every row
    got = rope.apply_rotary(q, k, cos, sin)
    assert got is not None and got[0].is_contiguous()
    for ours, torchs in zip(got, rope.rotary_reference(q, k, cos, sin)):
        assert torch.equal(ours, torchs)


@pytest.mark.skipif(interpreter_enabled(), reason="the interpreter's bfloat16 casts truncate; a GPU rounds")
@pytest.mark.gpu
@pytest.mark.parametrize("shape", SHAPES + [(4, 32, 8, 1, 128), (1, 32, 8, 512, 128)])
def test_bfloat16_rotary_is_torchs_bit_for_bit_on_the_gpu(shape: tuple[int, ...]) -> None:
    q, k, cos, sin = _operands(*shape, torch.bfloat16)
    got = rope.apply_rotary(q, k, cos, sin)
    assert got is not None
    for ours, torchs in zip(got, rope.rotary_reference(q, k, cos, sin)):
        assert torch.equal(ours, torchs)


def test_bfloat16_under_the_interpreter_is_within_its_truncation() -> None:
    q, k, cos, sin = _operands(2, 3, 1, 5, 64, torch.bfloat16)
    got = rope.apply_rotary(q, k, cos, sin)
    assert got is not None
    for ours, torchs in zip(got, rope.rotary_reference(q, k, cos, sin)):
        # three roundings, each at most one unit of bfloat16's 8 bits off
        assert torch.allclose(ours.float(), torchs.float(), rtol=3 * 2 ** -7, atol=1e-2)


def test_what_the_kernel_does_not_compute_exactly_is_declined() -> None:
    q, k, cos, sin = _operands(1, 2, 1, 3, 16, torch.float16)
    assert rope.apply_rotary(q.float(), k.float(), cos.float(), sin.float()) is None  # an FMA rounds once
    assert rope.apply_rotary(q, k, cos.float(), sin.float()) is None  # mixed dtypes promote
    assert rope.apply_rotary(q, k, cos[..., :8], sin[..., :8]) is None  # partial rotary (Phi's, GLM's)
    assert rope.apply_rotary(q, k, cos, sin, unsqueeze_dim=2) is None  # [B, S, heads, D] operands
    assert rope.apply_rotary(q[..., :15], k[..., :15], cos[..., :15], sin[..., :15]) is None  # odd head_dim
    assert rope.apply_rotary(q.transpose(2, 3), k, cos, sin) is None  # head_dim not the unit stride
    wanting = q.float().requires_grad_().half()
    assert rope.apply_rotary(wanting, k, cos, sin) is None  # a gradient: the kernel has no backward
    with torch.no_grad():
        assert rope.apply_rotary(wanting, k, cos, sin) is not None


def test_the_stand_in_runs_the_kernel_or_the_function_it_replaced() -> None:
    calls = []

    def original(q, k, cos, sin, unsqueeze_dim=1):
        calls.append(unsqueeze_dim)
        return rope.rotary_reference(q, k, cos, sin, unsqueeze_dim)

    fused = rope.fused_rotary(original)
    assert fused.__wrapped__ is original and fused.fused_by_kernels
    q, k, cos, sin = _operands(1, 2, 1, 3, 16, torch.float16)
    fused(q, k, cos, sin)
    assert calls == [1]  # outside a patched attention module's forward: the function it replaced
    rope.ACTIVE.on = True  # what kernels.hf.RotaryAttention sets during its forward
    try:
        for out in (fused(q, k, cos, sin), fused(q, k, cos, sin, 1), fused(q, k, cos, sin, unsqueeze_dim=1)):
            assert all(torch.equal(a, b) for a, b in zip(out, rope.rotary_reference(q, k, cos, sin)))
        assert calls == [1]  # the kernel took all three
        fused(q.transpose(1, 2), k.transpose(1, 2), cos, sin, unsqueeze_dim=2)
        fused(q.float(), k.float(), cos.float(), sin.float())
    finally:
        rope.ACTIVE.on = False
    assert calls == [1, 2, 1]


def test_the_stand_in_traces_torchs_ops_under_torch_compile() -> None:
    fused = rope.fused_rotary(rope.rotary_reference)
    q, k, cos, sin = _operands(1, 2, 1, 3, 16, torch.float16)
    rope.ACTIVE.on = True
    try:
        explained = torch._dynamo.explain(fused)(q, k, cos, sin)
        assert explained.graph_break_count == 0
        compiled = torch.compile(fused, fullgraph=True, backend="eager")
        out = compiled(q, k, cos, sin)
    finally:
        rope.ACTIVE.on = False
    assert all(torch.equal(a, b) for a, b in zip(out, rope.rotary_reference(q, k, cos, sin)))
