"""Operands on a GPU that is not the current device: Triton's own launcher (the first call, the fallback)
launches on the current device, so the launch must make the operands' GPU current first."""

from __future__ import annotations

import pytest
import torch
from test_dispatch import TILED

import kernels
from kernels import gemm

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 GPUs"),
]


def _operands(device: str) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return (torch.randn(256, 512, generator=g).half().to(device),
            torch.randn(512, 128, generator=g).half().to(device))


def test_direct_launch_on_operands_of_another_gpu_runs_and_adopts_that_gpu() -> None:
    with torch.cuda.device(0):
        a, b = _operands("cuda:1")
        c = torch.empty(256, 128, dtype=a.dtype, device=a.device)
        launch, _ = gemm.direct_launch(TILED, a, b, c)
        m, k = a.shape
        n = b.shape[1]
        launch(a, b, c, m, n, k, *a.stride(), *b.stride(), *c.stride())  # the first call: Triton's launcher
        torch.cuda.synchronize(1)
        assert launch._device in (-1, 1)  # adopted (a compiled kernel) on the operands' GPU, or not at all
        torch.testing.assert_close(c.float(), a.float() @ b.float(), atol=2e-2, rtol=2e-2)
        assert torch.cuda.current_device() == 0  # the caller's device is given back


def test_matmul_of_operands_on_another_gpu_matches_torch_on_every_call() -> None:
    with torch.cuda.device(0):
        a, b = _operands("cuda:1")
        for _ in range(3):  # the first call builds the plan, the later ones run it
            c = kernels.matmul_with(TILED, a, b)
            torch.cuda.synchronize(1)
            assert c.device == a.device
            torch.testing.assert_close(c.float(), a.float() @ b.float(), atol=2e-2, rtol=2e-2)
            c = kernels.matmul(a, b)
            torch.cuda.synchronize(1)
            torch.testing.assert_close(c.float(), a.float() @ b.float(), atol=2e-2, rtol=2e-2)
