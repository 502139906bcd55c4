"""The public functions' eager bodies by name: where the operators of kernels/ops.py find them, per call.

Each lives in its family's module; this only names them, so that ops imports no package above it. A spy set
here (``monkeypatch.setattr(kernels._eager, "matmul", spy)``) sees every call an operator makes.
"""

from __future__ import annotations

from ._grouped_dispatch import grouped_matmul, moe_gated_matmul, moe_matmul
from ._plans import matmul
from .epilogue import gated_matmul, matmul_bias

__all__ = ["gated_matmul", "grouped_matmul", "matmul", "matmul_bias", "moe_gated_matmul", "moe_matmul"]
