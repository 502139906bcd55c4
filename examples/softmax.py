"""Triton's fused-softmax tutorial, tuned with ``kernels.autotune`` over the warps per row.

One program per row; the row fits one block (BLOCK_SIZE is the next power of two of n_cols, as the tutorial sets it).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

import kernels
from kernels import Key, Launch

from ._common import device, dtype_of, rows

CONFIGS = [triton.Config({}, num_warps=w) for w in (1, 2, 4, 8, 16)]


def _inputs(key: Key) -> Launch:
    """A call for offline search: ``rows()`` rows of random normals with n_cols columns."""
    n_rows, n_cols = rows(), int(key["n_cols"])
    x = torch.randn(n_rows, n_cols, device=device(), dtype=dtype_of(key.dtypes[1]))
    y = torch.empty_like(x)
    return Launch((n_rows,), (y, x, x.stride(0), y.stride(0), n_rows, n_cols),
                  {"BLOCK_SIZE": triton.next_power_of_2(n_cols)})


@kernels.autotune(configs=CONFIGS, key=["n_cols"], inputs=_inputs)
@triton.jit
def softmax_kernel(output_ptr, input_ptr, input_row_stride, output_row_stride, n_rows, n_cols,
                   BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < n_cols
    x = tl.load(input_ptr + row * input_row_stride + cols, mask=mask, other=-float("inf"))
    shifted = x - tl.max(x, axis=0)
    numerator = tl.exp(shifted)
    out = numerator / tl.sum(numerator, axis=0)
    tl.store(output_ptr + row * output_row_stride + cols, out, mask=mask)


def softmax(x: torch.Tensor, kernel=softmax_kernel) -> torch.Tensor:
    n_rows, n_cols = x.shape
    y = torch.empty_like(x)
    kernel[(n_rows,)](y, x, x.stride(0), y.stride(0), n_rows, n_cols, BLOCK_SIZE=triton.next_power_of_2(n_cols))
    return y
