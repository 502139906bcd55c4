"""Triton's layer-norm tutorial (forward), tuned with ``kernels.autotune`` over the column block and warps.

One program per row: a first pass for the mean, a second for the variance, a third to normalise, scale and shift,
each over the row in BLOCK_SIZE chunks. ``layer_norm_space_kernel`` is the same kernel tuned over a space.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

import kernels
from kernels import Key, Launch, Space

from ._common import device, dtype_of, rows

CONFIGS = [triton.Config({"BLOCK_SIZE": b}, num_warps=w) for b in (256, 1024) for w in (4, 8)]

# The space: a block of up to the row's next power of two (a bigger one only masks lanes), any warp count
# that leaves each thread at least one element, and 1 to 3 pipeline stages.
SPACE = Space({"BLOCK_SIZE": [64, 128, 256, 512, 1024, 2048, 4096, 8192], "num_warps": [1, 2, 4, 8, 16],
               "num_stages": [1, 2, 3]},
              constraints=(lambda c, k: c["BLOCK_SIZE"] <= max(64, triton.next_power_of_2(int(k["N"]))),
                           lambda c, k: c["BLOCK_SIZE"] >= 32 * c["num_warps"]))


def _inputs(key: Key) -> Launch:
    n_rows, n = rows(), int(key["N"])
    dtype = dtype_of(key.dtypes[0])
    x = torch.randn(n_rows, n, device=device(), dtype=dtype)
    w = torch.rand(n, device=device(), dtype=dtype)
    b = torch.randn(n, device=device(), dtype=dtype)
    y = torch.empty_like(x)
    mean = torch.empty(n_rows, device=device(), dtype=torch.float32)
    rstd = torch.empty(n_rows, device=device(), dtype=torch.float32)
    return Launch((n_rows,), (x, y, w, b, mean, rstd, x.stride(0), n, 1e-5))


@triton.jit
def layer_norm_fwd(X, Y, W, B, Mean, Rstd, stride, N, eps, BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(0)
    X += row * stride
    Y += row * stride
    acc = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
    for start in range(0, N, BLOCK_SIZE):
        cols = start + tl.arange(0, BLOCK_SIZE)
        acc += tl.load(X + cols, mask=cols < N, other=0.0).to(tl.float32)
    mean = tl.sum(acc, axis=0) / N
    acc = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
    for start in range(0, N, BLOCK_SIZE):
        cols = start + tl.arange(0, BLOCK_SIZE)
        x = tl.load(X + cols, mask=cols < N, other=0.0).to(tl.float32)
        centred = tl.where(cols < N, x - mean, 0.0)
        acc += centred * centred
    rstd = 1 / tl.sqrt(tl.sum(acc, axis=0) / N + eps)
    tl.store(Mean + row, mean)
    tl.store(Rstd + row, rstd)
    for start in range(0, N, BLOCK_SIZE):
        cols = start + tl.arange(0, BLOCK_SIZE)
        mask = cols < N
        w = tl.load(W + cols, mask=mask)
        b = tl.load(B + cols, mask=mask)
        x = tl.load(X + cols, mask=mask, other=0.0).to(tl.float32)
        y = (x - mean) * rstd * w + b
        tl.store(Y + cols, y, mask=mask)


layer_norm_kernel = kernels.autotune(configs=CONFIGS, key=["N"], inputs=_inputs,
                                     name="examples.layer_norm.layer_norm_kernel")(layer_norm_fwd)
# Given configs become the space's warm starts: the space search starts from the list's best.
layer_norm_space_kernel = kernels.autotune(configs=CONFIGS, key=["N"], space=SPACE, inputs=_inputs,
                                           name="examples.layer_norm.layer_norm_space_kernel")(layer_norm_fwd)


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float = 1e-5,
               kernel=layer_norm_kernel) -> torch.Tensor:
    x2 = x.reshape(-1, x.shape[-1])
    y = torch.empty_like(x2)
    mean = torch.empty(x2.shape[0], device=x.device, dtype=torch.float32)
    rstd = torch.empty_like(mean)
    kernel[(x2.shape[0],)](x2, y, weight, bias, mean, rstd, x2.stride(0), x2.shape[1], eps)
    return y.reshape(x.shape)
