"""The dispatch paths never make the host wait for the GPU once a call is warm.

A synchronizing call (a device-to-host copy, a blocking host-to-device copy) would stall every
caller's launch queue and make timings of small problems depend on the host; torch's sync debug
mode turns each one into an error. GPU only: the interpreter has no CUDA stream to wait on.
"""

from __future__ import annotations

import pytest
import torch

import kernels
from kernels import Problem

pytestmark = pytest.mark.gpu


def _no_sync_after_warm_up(call) -> None:
    call()  # first call: compile, dispatch table load, device tables built and cached
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            call()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_matmul_and_matmul_with_do_not_synchronize(dtype) -> None:
    a = torch.randn(16, 4096, device="cuda", dtype=dtype)
    w = torch.randn(4096, 4096, device="cuda", dtype=dtype)
    _no_sync_after_warm_up(lambda: kernels.matmul(a, w.t()))
    config = kernels.get_kernel("matmul").default_config(
        Problem("matmul", "fp16", "nt", ((16, 4096, 4096),)), kernels.current_device())
    _no_sync_after_warm_up(lambda: kernels.matmul_with(config, a, w.t()))


def test_grouped_matmul_does_not_synchronize() -> None:
    As = [torch.randn(m, 128, device="cuda", dtype=torch.bfloat16) for m in (128, 64, 0, 128)]
    Bs = [torch.randn(128, 128, device="cuda", dtype=torch.bfloat16) for _ in As]
    _no_sync_after_warm_up(lambda: kernels.grouped_matmul(As, Bs))


def test_moe_matmul_does_not_synchronize() -> None:
    x = torch.randn(384, 256, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4, 256, 128, device="cuda", dtype=torch.bfloat16)
    offsets = torch.tensor([128, 128, 320, 384], device="cuda", dtype=torch.int32)
    _no_sync_after_warm_up(lambda: kernels.moe_matmul(x, w, offsets))


@pytest.mark.parametrize("offsets_dtype", [torch.int32, torch.int64])
def test_an_untuned_far_bf16_moe_call_runs_torch_grouped_mm_without_a_sync(offsets_dtype, tmp_path) -> None:
    """A bf16 MoE problem with no record near (a fresh database, no shipped table) runs its baseline,
    torch._grouped_mm, on Hopper; int64 offsets (torch.cumsum's) are cast on the device, not read on the
    host. Elsewhere the Triton default runs, which never syncs either."""
    kernels.use_database(f"sqlite:///{tmp_path / 'empty.db'}", use_shipped=False)
    try:
        x = torch.randn(64, 4096, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(8, 14336, 4096, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
        offsets = torch.arange(8, 72, 8, device="cuda").to(offsets_dtype)
        _no_sync_after_warm_up(lambda: kernels.moe_matmul(x, w, offsets))
        problem = kernels.moe.balanced_problem("bf16", "nt", 64, 8, 14336, 4096)
        choice = kernels.explain("moe_matmul", problem, kernels.current_device(), "eager")
        hopper = torch.cuda.get_device_capability()[0] in (9, 10)
        assert kernels.is_baseline(choice.config) == hopper, choice
        ref = torch.stack([x[8 * e:8 * e + 8].float() @ w[e].float() for e in range(8)]).reshape(64, 14336)
        out = kernels.moe_matmul(x, w, offsets).float()
        assert ((out - ref).norm() / ref.norm()).item() < 2e-2
    finally:
        kernels.use_database(None)
