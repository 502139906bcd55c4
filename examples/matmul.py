"""Triton's matrix-multiplication tutorial with its CUDA configs list, tuned with ``kernels.autotune``.

Grouped ("super-grouping") program order for L2 reuse; fp32 accumulation; fp16 out.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

import kernels
from kernels import Key, Launch

from ._common import device, dtype_of


def _config(m: int, n: int, k: int, stages: int, warps: int) -> triton.Config:
    return triton.Config({"BLOCK_SIZE_M": m, "BLOCK_SIZE_N": n, "BLOCK_SIZE_K": k, "GROUP_SIZE_M": 8},
                         num_stages=stages, num_warps=warps)


# The tutorial's list for CUDA GPUs (fp16), in its order.
CONFIGS = [_config(128, 256, 64, 3, 8), _config(64, 256, 32, 4, 4), _config(128, 128, 32, 4, 4),
           _config(128, 64, 32, 4, 4), _config(64, 128, 32, 4, 4), _config(128, 32, 32, 4, 4),
           _config(64, 32, 32, 5, 2), _config(32, 64, 32, 5, 2),
           # fp8 entries of the tutorial's list
           _config(128, 256, 128, 3, 8), _config(256, 128, 128, 3, 8), _config(256, 64, 128, 4, 4),
           _config(64, 256, 128, 4, 4), _config(128, 128, 128, 4, 4), _config(128, 64, 64, 4, 4),
           _config(64, 128, 64, 4, 4), _config(128, 32, 64, 4, 4)]


def _inputs(key: Key) -> Launch:
    m, n, k = int(key["M"]), int(key["N"]), int(key["K"])
    dtype = dtype_of(key.dtypes[0])
    a = torch.randn(m, k, device=device(), dtype=dtype)
    b = torch.randn(k, n, device=device(), dtype=dtype)
    c = torch.empty(m, n, device=device(), dtype=dtype)
    grid = lambda meta: (triton.cdiv(m, meta["BLOCK_SIZE_M"]) * triton.cdiv(n, meta["BLOCK_SIZE_N"]),)
    return Launch(grid, (a, b, c, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0),
                         c.stride(1)), {"ACTIVATION": ""})


@kernels.autotune(configs=CONFIGS, key=["M", "N", "K"], inputs=_inputs)
@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                  BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
                  GROUP_SIZE_M: tl.constexpr, ACTIVATION: tl.constexpr):
    pid = tl.program_id(axis=0)
    num_pid_m = tl.cdiv(M, BLOCK_SIZE_M)
    num_pid_n = tl.cdiv(N, BLOCK_SIZE_N)
    num_pid_in_group = GROUP_SIZE_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_SIZE_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_SIZE_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m
    offs_am = (pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)) % M
    offs_bn = (pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)) % N
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    a_ptrs = a_ptr + (offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak)
    b_ptrs = b_ptr + (offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn)
    accumulator = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_SIZE_K)):
        a = tl.load(a_ptrs, mask=offs_k[None, :] < K - k * BLOCK_SIZE_K, other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < K - k * BLOCK_SIZE_K, other=0.0)
        accumulator = tl.dot(a, b, accumulator)
        a_ptrs += BLOCK_SIZE_K * stride_ak
        b_ptrs += BLOCK_SIZE_K * stride_bk
    if ACTIVATION == "leaky_relu":
        accumulator = leaky_relu(accumulator)
    c = accumulator.to(c_ptr.dtype.element_ty)
    offs_cm = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    offs_cn = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    c_ptrs = c_ptr + stride_cm * offs_cm[:, None] + stride_cn * offs_cn[None, :]
    c_mask = (offs_cm[:, None] < M) & (offs_cn[None, :] < N)
    tl.store(c_ptrs, c, mask=c_mask)


@triton.jit
def leaky_relu(x):
    return tl.where(x >= 0, x, 0.01 * x)


def matmul(a: torch.Tensor, b: torch.Tensor, activation: str = "", kernel=matmul_kernel) -> torch.Tensor:
    assert a.shape[1] == b.shape[0], "incompatible dimensions"
    m, k = a.shape
    _, n = b.shape
    c = torch.empty((m, n), device=a.device, dtype=torch.float16)
    grid = lambda meta: (triton.cdiv(m, meta["BLOCK_SIZE_M"]) * triton.cdiv(n, meta["BLOCK_SIZE_N"]),)
    kernel[grid](a, b, c, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
                 ACTIVATION=activation)
    return c
