"""Autograd through the public calls: a Triton plan records the same backward a cuBLAS plan would.

Whichever config won a signature, ``kernels.matmul`` on an operand that requires grad (grad mode on) must
return a tensor autograd can differentiate; calls that cannot (``out=``, ``grouped_matmul``) must say so.
fp32 matmul and fp16 moe_matmul on the CPU under the interpreter, dispatched from a real SQLite file.
"""

from __future__ import annotations

import pytest
import torch
from _helpers import DEVICE, relative_error
from test_dispatch import TILED, make_record

import kernels
from db import Store
from kernels import _plans

# Relative L2 error: the interpreter's fp32 dot is exact to ~1e-7 (test_autograd.py); on a GPU the Triton kernels
# take fp32 operands through TF32 (kernels/gemm.py, _dot_precision), 8e-4 here on an H200 (2026-11-28).
FP32_TOLERANCE = 1e-4 if torch.device(DEVICE).type == "cpu" else 3e-3
FP16_TOLERANCE = 1e-2  # relative L2 error of fp16 outputs; the interpreter measures ~3e-4 (test_autograd.py)
KEY = "fp32:nn:16x32x64"  # M x N x K of the operands below

pytestmark = pytest.mark.usefixtures("own_database")


@pytest.fixture
def tiled_won(db_url: str) -> None:
    """The test's database says a Triton tile won KEY in both modes."""
    device = kernels.current_device(torch.device(DEVICE))
    with Store(db_url) as store:
        for mode in kernels.MODES:
            store.put(make_record(device, KEY, TILED, mode=mode), on_conflict="replace")
    kernels.clear_cache()


def _operands(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(16, 64, generator=g).to(DEVICE), torch.randn(64, 32, generator=g).to(DEVICE)


@pytest.mark.usefixtures("tiled_won")
def test_matmul_on_a_triton_plan_records_a_backward_that_matches_torch() -> None:
    a, b = _operands()
    kernels.matmul(a, b)  # the signature's plan is built without grad: a Triton one
    assert _plans.plan_of(a, b, kernels.EAGER) is not torch.mm
    ours = [a.clone().requires_grad_(), b.clone().requires_grad_()]
    theirs = [a.clone().requires_grad_(), b.clone().requires_grad_()]
    c = kernels.matmul(*ours)
    assert c.grad_fn is not None
    weight = torch.randn(16, 32, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    (c * weight).sum().backward()
    (torch.mm(*theirs) * weight).sum().backward()
    for mine, ref in zip(ours, theirs):
        assert relative_error(mine.grad, ref.grad) < FP32_TOLERANCE


@pytest.mark.usefixtures("tiled_won")
def test_matmul_of_a_frozen_weight_records_a_backward_for_the_activation_only() -> None:
    a, b = _operands()
    a.requires_grad_()
    c = kernels.matmul(a, b)
    c.sum().backward()
    assert relative_error(a.grad, torch.ones(16, 32, device=DEVICE) @ b.t()) < FP32_TOLERANCE


@pytest.mark.usefixtures("tiled_won")
def test_matmul_under_no_grad_records_nothing_and_runs_the_plan() -> None:
    a, b = _operands()
    a.requires_grad_()
    with torch.no_grad():
        c = kernels.matmul(a, b)
    assert c.grad_fn is None and not c.requires_grad
    assert relative_error(c, a.detach() @ b) < FP32_TOLERANCE


@pytest.mark.usefixtures("tiled_won")
def test_matmul_with_out_and_an_operand_requiring_grad_raises_like_torch() -> None:
    a, b = _operands()
    out = torch.empty(16, 32, device=DEVICE)
    with pytest.raises(RuntimeError, match=r"out=.*automatic differentiation.*no_grad"):
        kernels.matmul(a.requires_grad_(), b, out=out)
    with torch.no_grad():  # the way out the message names
        assert kernels.matmul(a, b, out=out) is out


def _moe_operands() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    rows, n, k = (3, 0, 6, 2), 16, 24
    x = torch.randn(sum(rows), k, generator=g).half().to(DEVICE)
    w = torch.randn(len(rows), k, n, generator=g).div(k ** 0.5).half().to(DEVICE)
    offsets = torch.tensor(rows).cumsum(0).to(torch.int32).to(DEVICE)
    return x, w, offsets


def test_moe_matmul_of_tokens_requiring_grad_records_a_backward_that_matches_torch() -> None:
    x, w, offsets = _moe_operands()
    x_ours = x.clone().requires_grad_()
    y = kernels.moe_matmul(x_ours, w, offsets)
    assert y.grad_fn is not None
    y.float().sum().backward()
    ends = [0] + offsets.tolist()
    w_cpu = w.float().cpu()
    ref = torch.cat([torch.ones(e - s, w.shape[2]) @ w_cpu[i].t() for i, (s, e) in enumerate(zip(ends, ends[1:]))])
    assert relative_error(x_ours.grad.float().cpu(), ref) < FP16_TOLERANCE


def test_moe_matmul_with_out_and_an_operand_requiring_grad_raises() -> None:
    x, w, offsets = _moe_operands()
    out = torch.empty(x.shape[0], w.shape[2], dtype=x.dtype, device=DEVICE)
    with pytest.raises(RuntimeError, match=r"out=.*no_grad"):
        kernels.moe_matmul(x, w.requires_grad_(), offsets, out=out)


def test_grouped_matmul_of_an_operand_requiring_grad_says_it_has_no_backward() -> None:
    a, b = (t.half() for t in _operands())  # the grouped kernel takes fp16/bf16
    with pytest.raises(RuntimeError, match=r"no backward.*torch.no_grad\(\)"):
        kernels.grouped_matmul([a.requires_grad_()], [b])
    with torch.no_grad():
        (c,) = kernels.grouped_matmul([a], [b])
    assert relative_error(c.float(), a.detach().float() @ b.float()) < FP16_TOLERANCE
