"""The custom operators: schema, fakes and autograd registration (opcheck), torch.compile without a graph break.

Runs under Triton's interpreter on a CPU (fp32/fp16 only: the interpreter's bf16 dot is wrong, GPU.md), or
compiled on a GPU. The GPU-marked tests capture each operator in a CUDA graph and replay it.
"""

from __future__ import annotations


import pytest
import torch
from _helpers import DEVICE, relative_error

import kernels
from kernels import ops

TOLERANCE = {torch.float32: 1e-4, torch.float16: 1e-2}  # relative L2 error; the interpreter measures ~3e-4 in fp16


pytestmark = pytest.mark.usefixtures("own_database")  # an empty table: calls take cuBLAS or defaults


_error = relative_error


def _moe_inputs(rows: tuple[int, ...] = (3, 0, 5), n: int = 16, k: int = 24, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(sum(rows), k, generator=g).half().to(DEVICE)
    w_nk = torch.randn(len(rows), n, k, generator=g).div(k ** 0.5).half().to(DEVICE)
    offsets = torch.tensor(rows).cumsum(0).to(torch.int32).to(DEVICE)
    return x, w_nk.transpose(1, 2), offsets


def _moe_reference(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    ends = offsets.tolist()
    out = torch.zeros(x.shape[0], w.shape[2])
    for e, (start, end) in enumerate(zip([0] + ends[:-1], ends)):
        out[start:end] = x[start:end].float().cpu() @ w[e].float().cpu()
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_matmul_operator_passes_opcheck(dtype: torch.dtype) -> None:
    a = torch.randn(8, 16, dtype=dtype, device=DEVICE)
    b = torch.randn(12, 16, dtype=dtype, device=DEVICE).t()  # B as nn.Linear keeps it
    torch.library.opcheck(torch.ops.triton_tuner.matmul.default, (a, b))
    if dtype == torch.float32:
        torch.library.opcheck(torch.ops.triton_tuner.matmul.default, (a.requires_grad_(), b.requires_grad_()))


def test_matmul_out_operator_writes_out_and_passes_opcheck() -> None:
    a, b = torch.randn(8, 16, device=DEVICE), torch.randn(16, 12, device=DEVICE)
    out = torch.empty(8, 12, device=DEVICE)
    torch.library.opcheck(torch.ops.triton_tuner.matmul_out.default, (a, b, out))
    torch.ops.triton_tuner.matmul_out(a, b, out)
    assert _error(out, a @ b) < TOLERANCE[torch.float32]
    assert torch.ops.triton_tuner.matmul_out.default._schema.arguments[2].alias_info.is_write


def test_grouped_matmul_operator_passes_opcheck() -> None:
    As = [torch.randn(m, 16, device=DEVICE).half() for m in (4, 9)]
    Bs = [torch.randn(16, n, device=DEVICE).half() for n in (8, 12)]
    torch.library.opcheck(torch.ops.triton_tuner.grouped_matmul.default, (As, Bs))
    for c, a, b in zip(ops.grouped_matmul(As, Bs), As, Bs):
        assert _error(c, a.float() @ b.float()) < TOLERANCE[torch.float16]


def test_moe_matmul_operator_passes_opcheck_and_zeroes_rows_past_the_last_expert() -> None:
    x, w, offsets = _moe_inputs()
    torch.library.opcheck(torch.ops.triton_tuner.moe_matmul.default, (x, w, offsets))
    torch.library.opcheck(torch.ops.triton_tuner.moe_matmul.default, (x, w, offsets, True))  # no output fill
    short = offsets.clone()
    short[-1] = 6  # the last two rows belong to no expert
    out = ops.moe_matmul(x, w, short)
    assert _error(out, _moe_reference(x, w, short)) < TOLERANCE[torch.float16]
    assert not out[6:].any()


def test_moe_matmul_out_operator_passes_opcheck() -> None:
    x, w, offsets = _moe_inputs()
    out = torch.zeros(x.shape[0], w.shape[2], dtype=x.dtype, device=DEVICE)
    torch.library.opcheck(torch.ops.triton_tuner.moe_matmul_out.default, (x, w, offsets, out))
    assert torch.ops.triton_tuner.moe_matmul_out.default._schema.arguments[3].alias_info.is_write


class _Block(torch.nn.Module):
    """A tiny model with a plain MLP and an MoE: what patch() and torch.compile must handle together."""

    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(16, 32)
        self.down = torch.nn.Linear(32, 16, bias=False)
        self.moe = kernels.nn.MoE(16, 24, experts=4, top_k=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.down(torch.nn.functional.silu(self.up(x)))
        return h + self.moe(h.half()).float()


def test_compiled_patched_model_has_no_graph_break_and_matches_torch() -> None:
    torch.manual_seed(0)
    model = _Block().to(DEVICE)
    model.moe.half()
    x = torch.randn(2, 3, 16, device=DEVICE)
    with torch.no_grad():
        h = x + model.down(torch.nn.functional.silu(model.up(x)))
        expected = h + model.moe.reference(h.half()).float()
        kernels.patch(model, everywhere=True)
        torch._dynamo.reset()
        compiled = torch.compile(model, fullgraph=True, backend="aot_eager")  # fullgraph: a break raises
        got = compiled(x)
    assert isinstance(model.up, kernels.nn.Linear)
    assert _error(got, expected) < TOLERANCE[torch.float16]


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["matmul", "matmul_out", "grouped_matmul", "moe_matmul"])
def test_operator_captured_in_a_cuda_graph_replays_new_inputs(op: str) -> None:
    a, b = torch.randn(64, 128, device="cuda").half(), torch.randn(256, 128, device="cuda").half().t()
    x, w, offsets = _moe_inputs(rows=(40, 0, 24), n=128, k=64)
    out = torch.empty(64, 256, device="cuda", dtype=torch.half)
    calls = {
        "matmul": lambda: ops.matmul(a, b),
        "matmul_out": lambda: (ops.matmul_out(a, b, out), out)[1],
        "grouped_matmul": lambda: ops.grouped_matmul([a, a[:32]], [b, b])[1],
        "moe_matmul": lambda: ops.moe_matmul(x, w, offsets),
    }
    references = {
        "matmul": lambda: a.float() @ b.float(), "matmul_out": lambda: a.float() @ b.float(),
        "grouped_matmul": lambda: a[:32].float() @ b.float(), "moe_matmul": lambda: _moe_reference(x, w, offsets),
    }
    ops.warm_for_capture(calls[op])  # outside the capture: resolve and compile both modes' configs
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        result = calls[op]()
    for t in (a, x):
        t.copy_(torch.randn_like(t))
    graph.replay()
    torch.cuda.synchronize()
    assert _error(result.cpu(), references[op]().cpu()) < TOLERANCE[torch.float16]


@pytest.mark.parametrize("with_bias", [True, False])
def test_linear_operator_passes_opcheck_with_autograd(with_bias: bool) -> None:
    x = torch.randn(6, 16, device=DEVICE, requires_grad=True)
    w = torch.randn(12, 16, device=DEVICE, requires_grad=True)
    bias = torch.randn(12, device=DEVICE, requires_grad=True) if with_bias else None
    torch.library.opcheck(torch.ops.triton_tuner.linear.default, (x, w, bias))
    assert _error(ops.linear(x, w, bias), torch.nn.functional.linear(x, w, bias)) < TOLERANCE[torch.float32]


def test_gated_matmul_operator_passes_opcheck() -> None:
    a = torch.randn(6, 16, device=DEVICE).half()
    b = torch.randn(24, 16, device=DEVICE).div(4).half().t()
    torch.library.opcheck(torch.ops.triton_tuner.gated_matmul.default, (a, b))


def test_gated_matmul_operator_passes_opcheck_with_autograd() -> None:
    a = torch.randn(6, 16, device=DEVICE, requires_grad=True)
    b = torch.randn(24, 16, device=DEVICE).div(4).t().requires_grad_()
    torch.library.opcheck(torch.ops.triton_tuner.gated_matmul.default, (a, b))


# ----------------------------------------------------------------------------------- direct eager calls

def test_eager_inference_calls_skip_the_operator_and_everything_else_goes_through_it(monkeypatch) -> None:
    """``linear_call`` runs the operator's body directly only where nothing could tell: no gradient, plain
    tensors, no mode watching, no compile. The operator is observed by wrapping the module's global."""
    from torch.utils._python_dispatch import TorchDispatchMode

    seen: list[str] = []
    real = ops.linear
    monkeypatch.setattr(ops, "linear", lambda *args: seen.append("op") or real(*args))
    x, weight = torch.randn(4, 8), torch.randn(6, 8, requires_grad=True)
    expected = torch.nn.functional.linear(x, weight.detach())

    with torch.no_grad():
        torch.testing.assert_close(ops.linear_call(x, weight, None), expected)
    assert seen == [], "an inference call skips the operator's dispatch"

    out = ops.linear_call(x, weight, None)  # a gradient is wanted: autograd needs the operator
    assert seen == ["op"] and out.requires_grad
    out.sum().backward()
    torch.testing.assert_close(weight.grad, torch.ones(4, 6).t() @ x)

    class Watch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with torch.no_grad(), Watch():
        ops.linear_call(x, weight, None)
    assert seen == ["op", "op"], "a dispatch mode sees the operator"
