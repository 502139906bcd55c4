"""The layers bench_layers.py measures: a Llama-style decoder layer and a Mixtral-style MoE block, in plain
torch, with random weights at real dimensions (no downloads). ``kernels.patch`` makes the decoder layer's
Linears ours and its SiLU-gated MLP a ``kernels.nn.FusedMLP`` (gate and up in one gated kernel), as it
does for a user's model."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

import kernels


@dataclass(frozen=True)
class DecoderDims:
    hidden: int = 8192  # Llama-3 70B
    heads: int = 64
    kv_heads: int = 8
    ffn: int = 28672
    context: int = 2048  # KV-cache length a decode step attends to


@dataclass(frozen=True)
class MoEDims:
    hidden: int = 4096  # Mixtral 8x7B
    ffn: int = 14336
    experts: int = 8
    top_k: int = 2


class RMSNorm(nn.Module):
    def __init__(self, dim: int, **factory) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim, **factory))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5)).to(x.dtype) * self.weight


class MLP(nn.Module):
    def __init__(self, hidden: int, ffn: int, **factory) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, ffn, bias=False, **factory)
        self.up_proj = nn.Linear(hidden, ffn, bias=False, **factory)
        self.down_proj = nn.Linear(ffn, hidden, bias=False, **factory)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Pre-norm attention (grouped-query, SDPA) and SwiGLU MLP. ``forward(x)`` with x [B, T, H]: prefill
    when ``cache`` is None (causal over the T tokens), else decode (T = 1 per sequence, attending to a
    fixed-length KV cache whose last slot the step writes)."""

    def __init__(self, dims: DecoderDims, **factory) -> None:
        super().__init__()
        self.dims = dims
        self.head_dim = dims.hidden // dims.heads
        kv = dims.kv_heads * self.head_dim
        self.input_norm = RMSNorm(dims.hidden, **factory)
        self.q_proj = nn.Linear(dims.hidden, dims.hidden, bias=False, **factory)
        self.k_proj = nn.Linear(dims.hidden, kv, bias=False, **factory)
        self.v_proj = nn.Linear(dims.hidden, kv, bias=False, **factory)
        self.o_proj = nn.Linear(dims.hidden, dims.hidden, bias=False, **factory)
        self.post_norm = RMSNorm(dims.hidden, **factory)
        self.mlp = MLP(dims.hidden, dims.ffn, **factory)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=p.shape[1] ** -0.5)
        self.cache: tuple[torch.Tensor, torch.Tensor] | None = None

    def make_cache(self, batch: int) -> None:
        d = self.dims
        p = self.q_proj.weight
        shape = (batch, d.kv_heads, d.context, self.head_dim)
        self.cache = (torch.randn(shape, device=p.device, dtype=p.dtype), torch.randn(shape, device=p.device,
                                                                                      dtype=p.dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        d = self.dims
        h = self.input_norm(x)
        q = self.q_proj(h).view(b, t, d.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(h).view(b, t, d.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(h).view(b, t, d.kv_heads, self.head_dim).transpose(1, 2)
        if self.cache is not None:
            k_cache, v_cache = self.cache
            k_cache[:, :, -t:].copy_(k)
            v_cache[:, :, -t:].copy_(v)
            k, v, causal = k_cache, v_cache, False
        else:
            causal = True
        # Grouped-query attention inside SDPA, as current model code writes it: repeating K and V for
        # every query head (the older way) copied the whole cache per step and made a 32-sequence
        # decode step mostly copies (3.5 ms; docs/BENCHMARKS.md, 2026-11-24).
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
        x = x + self.o_proj(attn.transpose(1, 2).reshape(b, t, d.hidden))
        return x + self.mlp(self.post_norm(x))


class TorchMoE(kernels.nn.MoE):
    """The same block and weights as ``kernels.nn.MoE``, its expert GEMMs through torch: ``torch._grouped_mm``
    where this torch has it and the GPU takes it (bf16, sm90), else a loop over experts."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        grouped = getattr(torch, "_grouped_mm", None)
        if grouped is None or x.device.type != "cuda" or x.dtype != torch.bfloat16:
            return self.reference(x)
        tokens = x.reshape(-1, x.shape[-1])
        order, weights, offsets, _ = kernels.nn.route(self.gate(tokens), self.top_k)
        rows = tokens[order]
        gate = grouped(rows, self.w1.transpose(1, 2), offs=offsets)
        up = grouped(rows, self.w3.transpose(1, 2), offs=offsets)
        down = grouped(F.silu(gate) * up, self.w2.transpose(1, 2), offs=offsets)
        return torch.zeros_like(tokens).index_add_(0, order, down * weights[:, None]).reshape(x.shape)


class OursMoE(kernels.nn.MoE):
    """``kernels.nn.MoE`` (three ``moe_matmul`` launches) with the router's Linear patched too."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        kernels.patch(self)
