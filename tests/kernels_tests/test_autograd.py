"""Backward through the tuned kernels against torch's gradients.

fp32 matmul on the CPU under the interpreter (the kernels do not take float64, so there is no gradcheck);
moe_matmul in fp16 (the MoE kernels take fp16/bf16 only), compared in fp32 against a loop of torch GEMMs.
"""

from __future__ import annotations


import pytest
import torch
from _helpers import DEVICE, relative_error

import kernels
from kernels import ops

FP32_TOLERANCE = 1e-4  # relative L2 error; the interpreter's fp32 dot is exact to ~1e-7 here
FP16_TOLERANCE = 1e-2  # relative L2 error of fp16 outputs; the interpreter measures ~3e-4


pytestmark = pytest.mark.usefixtures("own_database")


_error = relative_error


@pytest.mark.parametrize("b_transposed", [False, True], ids=["nn", "nt"])
def test_matmul_gradients_match_torch_in_fp32(b_transposed: bool) -> None:
    g = torch.Generator().manual_seed(1)
    a = torch.randn(9, 20, generator=g).to(DEVICE)
    b = (torch.randn(12, 20, generator=g).to(DEVICE).t() if b_transposed
         else torch.randn(20, 12, generator=g).to(DEVICE))
    weight = torch.randn(9, 12, generator=g).to(DEVICE)  # a loss whose gradient is not uniform
    ours = [t.detach().clone().requires_grad_() for t in (a, b)]
    theirs = [t.detach().clone().requires_grad_() for t in (a, b)]
    (ops.matmul(*ours) * weight).sum().backward()
    (torch.matmul(*theirs) * weight).sum().backward()
    for mine, ref in zip(ours, theirs):
        assert _error(mine.grad, ref.grad) < FP32_TOLERANCE


def test_matmul_gradient_of_a_sum_handles_an_expanded_incoming_gradient() -> None:
    a = torch.randn(5, 8, device=DEVICE, requires_grad=True)
    b = torch.randn(8, 6, device=DEVICE, requires_grad=True)
    ops.matmul(a, b).sum().backward()  # autograd hands back ones expanded: strides (0, 0)
    assert _error(a.grad, torch.ones(5, 6, device=DEVICE) @ b.detach().t()) < FP32_TOLERANCE
    assert _error(b.grad, a.detach().t() @ torch.ones(5, 6, device=DEVICE)) < FP32_TOLERANCE


def test_patched_linear_gradients_match_nn_linear() -> None:
    torch.manual_seed(2)
    plain = torch.nn.Linear(12, 7).to(DEVICE)
    patched = kernels.patch(torch.nn.Sequential(torch.nn.Linear(12, 7))).to(DEVICE)[0]
    patched.load_state_dict(plain.state_dict())
    x = torch.randn(2, 3, 12, device=DEVICE)
    x_ours, x_theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
    patched(x_ours).square().sum().backward()
    plain(x_theirs).square().sum().backward()
    assert _error(x_ours.grad, x_theirs.grad) < FP32_TOLERANCE
    for name in ("weight", "bias"):
        assert _error(getattr(patched, name).grad, getattr(plain, name).grad) < FP32_TOLERANCE


def test_moe_matmul_gradients_for_tokens_and_experts_match_torch() -> None:
    g = torch.Generator().manual_seed(3)
    rows, n, k = (3, 0, 6, 2), 16, 24
    x = torch.randn(sum(rows), k, generator=g).half().to(DEVICE)
    w_nk = torch.randn(len(rows), n, k, generator=g).div(k ** 0.5).half().to(DEVICE)
    offsets = torch.tensor(rows).cumsum(0).to(torch.int32).to(DEVICE)
    dy = torch.randn(sum(rows), n, generator=g).half().to(DEVICE)
    x_ours, w_ours = x.clone().requires_grad_(), w_nk.clone().requires_grad_()
    (ops.moe_matmul(x_ours, w_ours.transpose(1, 2), offsets).float() * dy.float()).sum().backward()
    x_ref, w_ref = x.float().cpu().requires_grad_(), w_nk.float().cpu().requires_grad_()
    ends = offsets.tolist()
    out = torch.cat([x_ref[s:e] @ w_ref[i].t() for i, (s, e) in enumerate(zip([0] + ends[:-1], ends))])
    (out * dy.float().cpu()).sum().backward()
    assert _error(x_ours.grad.cpu(), x_ref.grad) < FP16_TOLERANCE
    assert _error(w_ours.grad.cpu(), w_ref.grad) < FP16_TOLERANCE
    assert not w_ours.grad[1].any()  # the empty expert gets no gradient


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_matmul_gradients_match_torch_on_the_gpu(dtype: torch.dtype) -> None:
    a = torch.randn(128, 256, device="cuda", dtype=dtype, requires_grad=True)
    w = torch.randn(192, 256, device="cuda", dtype=dtype, requires_grad=True)
    dy = torch.randn(128, 192, device="cuda", dtype=dtype)
    ours = torch.autograd.grad(ops.matmul(a, w.t()), (a, w), dy)
    theirs = torch.autograd.grad(torch.matmul(a, w.t()), (a, w), dy)
    for mine, ref in zip(ours, theirs):
        assert _error(mine, ref) < FP16_TOLERANCE
