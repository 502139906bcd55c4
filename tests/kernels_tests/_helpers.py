"""What the operator, autograd, nn and epilogue tests share: where they run, how close is right, and the
gated MLP (in transformers' shape) the nn and compile tests patch."""

from __future__ import annotations

import torch

from kernels._device import interpreter_enabled

DEVICE = "cuda" if torch.cuda.is_available() and not interpreter_enabled() else "cpu"


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float32 on the CPU (0/0 counts as exact)."""
    return float((out.float().cpu() - ref.float().cpu()).norm() / ref.float().cpu().norm().clamp_min(1e-6))


class LlamaMLP(torch.nn.Module):
    """The shape of transformers' LlamaMLP (Mistral, Qwen2 alike): SiLU of the gate times the up projection."""

    def __init__(self, hidden: int = 16, ffn: int = 24, act: torch.nn.Module | None = None) -> None:
        super().__init__()
        self.gate_proj = torch.nn.Linear(hidden, ffn, bias=False)
        self.up_proj = torch.nn.Linear(hidden, ffn, bias=False)
        self.down_proj = torch.nn.Linear(ffn, hidden, bias=False)
        self.act_fn = act if act is not None else torch.nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))
