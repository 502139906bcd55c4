"""What the operator, autograd, nn and epilogue tests share: where they run and how close is right."""

from __future__ import annotations

import torch

from kernels._device import interpreter_enabled

DEVICE = "cuda" if torch.cuda.is_available() and not interpreter_enabled() else "cpu"


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float32 on the CPU (0/0 counts as exact)."""
    return float((out.float().cpu() - ref.float().cpu()).norm() / ref.float().cpu().norm().clamp_min(1e-6))
