"""Backward through the tuned kernels against torch's gradients.

fp32 matmul and gated_matmul on the CPU under the interpreter (the kernels do not take float64, so there is
no gradcheck); moe_matmul in fp16 (the MoE kernels take fp16/bf16 only), compared in fp32 against a loop of
torch GEMMs.
"""

from __future__ import annotations


import pytest
import torch
from _helpers import DEVICE, relative_error

import kernels
from kernels import ops

FP32_TOLERANCE = 1e-4  # relative L2 error; the interpreter's fp32 dot is exact to ~1e-7 here
FP16_TOLERANCE = 1e-2  # relative L2 error of fp16 outputs; the interpreter measures ~3e-4
# gated_matmul's gradients in bf16 against fp32 torch: its two roundings of [G U] and [dG dU] measure
# <= 3.6e-3 (fp16: 4.4e-4) when emulated in torch on the CPU (128x256 @ 256x384, 5 seeds).
GATED_GPU_TOLERANCE = {torch.float16: 1e-2, torch.bfloat16: 2e-2}


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
    patched = kernels.patch(torch.nn.Sequential(torch.nn.Linear(12, 7)), everywhere=True).to(DEVICE)[0]
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


def _gated_leaves(m: int, n: int, k: int, device: str, dtype: torch.dtype, seed: int) -> list[torch.Tensor]:
    """x [M, K], the gate and up weights [N, K] as nn.Linear keeps them, and an incoming gradient [M, N]."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g)
    w_gate, w_up = torch.randn(2, n, k, generator=g).div(k ** 0.5)
    dy = torch.randn(m, n, generator=g)
    return [t.to(device=device, dtype=dtype) for t in (x, w_gate, w_up, dy)]


def _gated_grads(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, dy: torch.Tensor,
                 stacked_as_linear: bool) -> tuple[torch.Tensor, ...]:
    leaves = [t.detach().clone().requires_grad_() for t in (x, w_gate, w_up)]
    b = torch.cat(leaves[1:]).t() if stacked_as_linear else torch.cat(leaves[1:]).t().contiguous()
    return torch.autograd.grad(ops.gated_matmul(leaves[0], b), leaves, dy)


def _torch_gated_grads(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor,
                       dy: torch.Tensor) -> tuple[torch.Tensor, ...]:
    leaves = [t.detach().float().cpu().requires_grad_() for t in (x, w_gate, w_up)]
    y = torch.nn.functional.silu(leaves[0] @ leaves[1].t()) * (leaves[0] @ leaves[2].t())
    return torch.autograd.grad(y, leaves, dy.float().cpu())


@pytest.mark.parametrize("stacked_as_linear", [True, False], ids=["nt", "nn"])
def test_gated_matmul_gradients_match_torch_in_fp32(stacked_as_linear: bool) -> None:
    x, w_gate, w_up, dy = _gated_leaves(9, 12, 20, DEVICE, torch.float32, seed=6)  # no dimension a tile multiple
    ours = _gated_grads(x, w_gate, w_up, dy, stacked_as_linear)
    for mine, ref in zip(ours, _torch_gated_grads(x, w_gate, w_up, dy)):
        assert _error(mine, ref) < FP32_TOLERANCE


def test_gated_matmul_backward_is_three_tuned_matmul_problems(monkeypatch: pytest.MonkeyPatch) -> None:
    shapes = []
    real = kernels.matmul

    def spy(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        shapes.append((tuple(a.shape), tuple(b.shape)))
        return real(a, b, out=out)

    x, w_gate, w_up, dy = _gated_leaves(5, 8, 12, DEVICE, torch.float32, seed=7)
    # On a GPU, a signature's first call also runs its graph winner once (ops._call, for a later capture):
    # a first step warms every signature, the spy watches the second.
    _gated_grads(x, w_gate, w_up, dy, stacked_as_linear=True)
    monkeypatch.setattr(kernels._eager, "matmul", spy)  # the operators look the eager body up there, per call
    _gated_grads(x, w_gate, w_up, dy, stacked_as_linear=True)
    assert shapes == [((5, 12), (12, 16)),  # [G U] = x @ [Wg Wu], recomputed
                      ((5, 16), (16, 12)),  # dx = [dG dU] @ [Wg Wu]^T
                      ((12, 5), (5, 16))]  # [dWg dWu] = x^T @ [dG dU]


def test_gated_matmul_gradient_for_x_alone_skips_the_weights_gemm(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real = kernels.matmul
    x, w_gate, w_up, dy = _gated_leaves(5, 8, 16, DEVICE, torch.float32, seed=8)
    x.requires_grad_()
    torch.autograd.grad(ops.gated_matmul(x, torch.cat([w_gate, w_up]).t()), (x,), dy)  # warms (see above)
    monkeypatch.setattr(kernels._eager, "matmul", lambda a, b, out=None: calls.append(1) or real(a, b, out=out))
    (grad,) = torch.autograd.grad(ops.gated_matmul(x, torch.cat([w_gate, w_up]).t()), (x,), dy)
    assert len(calls) == 2
    assert _error(grad, _torch_gated_grads(x, w_gate, w_up, dy)[0]) < FP32_TOLERANCE


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gated_matmul_gradients_match_torch_on_the_gpu(dtype: torch.dtype) -> None:
    x, w_gate, w_up, dy = _gated_leaves(128, 192, 256, "cuda", dtype, seed=9)
    ours = _gated_grads(x, w_gate, w_up, dy, stacked_as_linear=True)
    for mine, ref in zip(ours, _torch_gated_grads(x, w_gate, w_up, dy)):
        assert mine.dtype == dtype
        assert _error(mine, ref) < GATED_GPU_TOLERANCE[dtype]


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


def test_a_backward_on_another_thread_keeps_the_mode_its_forward_was_forced_to(monkeypatch) -> None:
    """On a GPU, autograd runs the backward on its own device thread, where the forward thread's
    ``dispatch_mode`` does not reach. Here the backward runs on a thread of ours, which is the same
    situation on the CPU; its GEMMs must still get the forced mode's winners."""
    import threading

    from kernels import _modes

    modes: list[str] = []
    real = kernels.matmul

    def spy(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        modes.append(_modes.current(a.is_cuda))
        return real(a, b, out=out)

    a = torch.randn(6, 8, device=DEVICE, requires_grad=True)
    b = torch.randn(8, 4, device=DEVICE, requires_grad=True)
    monkeypatch.setattr(kernels._eager, "matmul", spy)  # where the operators look it up, per call
    with kernels.dispatch_mode(kernels.GRAPH):
        out = ops.matmul(a, b)
    backward = threading.Thread(target=lambda: out.sum().backward())
    backward.start()
    backward.join()
    assert modes[0] == kernels.GRAPH and len(modes) >= 3
    assert set(modes[1:]) == {kernels.GRAPH}, f"the backward's GEMMs ran in {modes[1:]}"
    torch.testing.assert_close(a.grad, torch.ones(6, 4, device=DEVICE) @ b.detach().t())
    # Nothing forced: the capture check decides, eager here. On a GPU a signature's first unforced call
    # also runs its graph winner once (ops._call, for a later capture): warm those first.
    ops.matmul(a, b).sum().backward()
    modes.clear()
    ops.matmul(a, b).sum().backward()
    assert set(modes) == {kernels.EAGER}


def test_a_frozen_weight_keeps_no_activation_for_the_backward() -> None:
    """As torch's linear: the input is saved only for the weight's gradient (LoRA, frozen backbones)."""
    from kernels import ops

    torch.manual_seed(5)
    weight = torch.randn(16, 32)  # frozen
    x = torch.randn(8, 32, requires_grad=True)
    saved: list[torch.Tensor] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: (saved.append(t), t)[1], lambda t: t):
        out = ops.linear(x, weight, None)
    assert all(t is not x for t in saved), "x was saved though no gradient needs it"
    out.square().sum().backward()
    assert torch.allclose(x.grad, (2 * (x @ weight.t())) @ weight, rtol=1e-4, atol=1e-4)
