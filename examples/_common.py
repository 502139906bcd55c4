"""What the examples share: the device inputs are made on, and a row count for offline search."""

from __future__ import annotations

import os

import torch


def device() -> str:
    """CUDA where a GPU runs the kernels, the CPU under the interpreter."""
    return "cpu" if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0") or not torch.cuda.is_available() else "cuda"


def rows() -> int:
    """Rows of the inputs an offline search makes: a GPU-sized batch, or a few under the interpreter."""
    return 4 if device() == "cpu" else 4096


def dtype_of(name: str) -> torch.dtype:
    return getattr(torch, name)
