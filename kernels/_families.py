"""The package's own kernel families by name: what ``kernels.KERNELS`` is, importable without the package."""

from __future__ import annotations

from ._spec import KernelSpec
from .epilogue import GATED_MATMUL, MATMUL_BIAS
from .gemm import MATMUL
from .grouped import GROUPED_MATMUL
from .moe import MOE_MATMUL
from .moe_gated import MOE_GATED_MATMUL

KERNELS: dict[str, KernelSpec] = {spec.name: spec for spec in (MATMUL, GROUPED_MATMUL, MOE_MATMUL, MATMUL_BIAS,
                                                                GATED_MATMUL, MOE_GATED_MATMUL)}
