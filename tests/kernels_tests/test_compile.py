"""torch.compile over the operators: whole graphs forward and backward, dispatch modes, reduce-overhead.

On the CPU (interpreter): a patched layer with the gated GEMM and an MoE block compiles with fullgraph
through forward and backward, in a forced graph mode, against torch; the graphs Inductor would capture
hold no cudagraph-unsafe node but the experts' weight gradient; a signature's first eager call runs its
graph winner too. On a GPU: ``torch.compile(mode="reduce-overhead")`` captures and replays the layer, in
inference and in training, on the graph winners.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
import torch
from torch import nn
from _helpers import DEVICE, LlamaMLP, relative_error

import kernels
from kernels import _modes, ops

FP32_TOLERANCE = 1e-4  # relative L2 error; the interpreter's fp32 dot is exact to ~1e-7 here
FP16_TOLERANCE = 1e-2  # relative L2 error of fp16 results; the interpreter measures ~3e-4 per GEMM

_error = relative_error

pytestmark = pytest.mark.usefixtures("own_database")  # an empty table: calls take cuBLAS or defaults

SPIED = ("matmul", "matmul_bias", "gated_matmul", "moe_matmul", "grouped_matmul")


class _GatedMLP(nn.Module):
    """A SwiGLU MLP: gate and up stacked (one gated GEMM), then a biased down projection, and the residual."""

    def __init__(self, hidden: int, ffn: int) -> None:
        super().__init__()
        self.gate_up = nn.Parameter(torch.randn(2 * ffn, hidden) * hidden ** -0.5)  # [Wg; Wu] as nn.Linear keeps them
        self.down = nn.Linear(ffn, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        return x + self.down(ops.gated_matmul(rows, self.gate_up.t())).reshape(x.shape)

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        """The same in torch (call it on an unpatched copy)."""
        w_gate, w_up = self.gate_up.chunk(2)
        return x + self.down(nn.functional.silu(x @ w_gate.t()) * (x @ w_up.t()))


class _Layer(nn.Module):
    """The MLP, then an MoE block: once patched, every operator a model meets. Every expert is chosen
    (top_k = experts), so that rounding differences between ours and torch cannot flip a routing choice."""

    def __init__(self, hidden: int, ffn: int, experts: int) -> None:
        super().__init__()
        self.mlp = _GatedMLP(hidden, ffn)
        self.moe = kernels.nn.MoE(hidden, ffn, experts=experts, top_k=experts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.mlp(x)
        return h + self.moe(h)

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        h = self.mlp.reference(x)
        return h + self.moe.reference(h)


@dataclass(frozen=True)
class _Call:
    name: str
    mode: str  # the dispatch mode the call's winner comes from
    capturing: bool


def _spy(monkeypatch: pytest.MonkeyPatch, capturing: Callable[[], bool]) -> list[_Call]:
    """Note each dispatch the operators make (they look kernels._eager.<name> up per call) with its mode."""
    calls: list[_Call] = []
    for name in SPIED:
        real = getattr(kernels, name)

        def spy(*args, _real=real, _name=name, **kwargs):
            on_cuda = args[0][0].is_cuda if isinstance(args[0], list) else args[0].is_cuda
            calls.append(_Call(_name, _modes.current(on_cuda), on_cuda and capturing()))
            return _real(*args, **kwargs)

        monkeypatch.setattr(kernels, name, spy)
        monkeypatch.setattr(kernels._eager, name, spy)  # where the operators look it up, per call
    return calls


def _capturing_backend(graphs: dict[str, torch.fx.GraphModule]):
    """aot_eager that keeps the forward and backward graphs it runs."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    def keep(kind: str):
        def compiler(gm: torch.fx.GraphModule, example_inputs: list):
            graphs[kind] = gm
            return make_boxed_func(gm.forward)
        return compiler

    return aot_autograd(fw_compiler=keep("forward"), bw_compiler=keep("backward"))


def _calls_of(gm: torch.fx.GraphModule, op: str) -> int:
    return sum(node.op == "call_function" and str(node.target).startswith(f"triton_tuner.{op}.")
               for node in gm.graph.nodes)


# ------------------------------------------------------------------------------------- CPU: whole graphs

def test_compiled_gated_matmul_forward_and_backward_trace_whole_through_the_tuned_matmul() -> None:
    x = torch.randn(7, 20, device=DEVICE)
    w_gate, w_up = torch.randn(2, 12, 20, device=DEVICE).div(20 ** 0.5)
    dy = torch.randn(7, 12, device=DEVICE)
    leaves = [t.clone().requires_grad_() for t in (x, w_gate, w_up)]
    graphs: dict[str, torch.fx.GraphModule] = {}
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    step = torch.compile(lambda x, wg, wu: ops.gated_matmul(x, torch.cat([wg, wu]).t()), fullgraph=True,
                         backend=_capturing_backend(graphs))
    step(*leaves).backward(dy)
    assert not torch._dynamo.utils.counters["graph_break"]
    assert _calls_of(graphs["forward"], "gated_matmul") == 1
    assert _calls_of(graphs["backward"], "matmul") == 3  # the recomputed [G U], dx and [dWg dWu]
    theirs = [t.clone().requires_grad_() for t in (x, w_gate, w_up)]
    (nn.functional.silu(theirs[0] @ theirs[1].t()) * (theirs[0] @ theirs[2].t())).backward(dy)
    for mine, ref in zip(leaves, theirs):
        assert _error(mine.grad, ref.grad) < FP32_TOLERANCE


def test_a_fused_mlp_compiles_whole_to_one_gated_call_and_trains_through_its_own_forward() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(LlamaMLP(16, 24), nn.Linear(16, 16)).to(DEVICE)
    plain = copy.deepcopy(model)
    kernels.patch(model, everywhere=True)
    assert isinstance(model[0], kernels.nn.FusedMLP)
    x = torch.randn(2, 5, 16, device=DEVICE)
    for training in (False, True):
        graphs: dict[str, torch.fx.GraphModule] = {}
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        compiled = torch.compile(model, fullgraph=True, backend=_capturing_backend(graphs))
        with torch.set_grad_enabled(training):
            out = compiled(x)
            expected = plain(x)
        assert not torch._dynamo.utils.counters["graph_break"]
        assert _error(out, expected) < FP32_TOLERANCE
        # Inference: the gate and up projections are one gated call, then down_proj and the output Linear.
        # Training (a gradient for the weights): the module's own forward, its three Linears and the output's.
        assert _calls_of(graphs["forward"], "gated_matmul") == (0 if training else 1)
        assert _calls_of(graphs["forward"], "linear") == (4 if training else 2)
        if training:
            out.square().sum().backward()
            expected.square().sum().backward()
            for name, p in plain.named_parameters():
                assert _error(dict(model.named_parameters())[name].grad, p.grad) < FP32_TOLERANCE, name
    torch._dynamo.reset()


@dataclass
class _GraphModeStep:
    """One compiled forward and backward of the patched layer in forced graph mode, and torch's."""

    graphs: dict[str, torch.fx.GraphModule]
    calls: list[_Call]
    graph_breaks: int
    out: torch.Tensor
    expected: torch.Tensor
    grads: dict[str, tuple[torch.Tensor, torch.Tensor]]  # parameter name: (ours, torch's)


@pytest.fixture(scope="module")
def graph_mode_step(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_GraphModeStep]:
    kernels.use_database(f"sqlite:///{tmp_path_factory.mktemp('compile') / 'tuner.db'}", use_shipped=False)
    try:
        with pytest.MonkeyPatch.context() as monkeypatch:  # the spies go when the step is done
            step = _run_graph_mode_step(monkeypatch)
    finally:
        kernels.use_database(None)
        torch._dynamo.reset()
    yield step


def _run_graph_mode_step(monkeypatch: pytest.MonkeyPatch) -> _GraphModeStep:
    torch.manual_seed(0)
    model = _Layer(hidden=16, ffn=24, experts=3).to(DEVICE).half()  # the MoE kernels take fp16/bf16
    plain = copy.deepcopy(model)
    kernels.patch(model, everywhere=True)
    x = torch.randn(2, 5, 16, device=DEVICE).half()
    dy = torch.randn(2, 5, 16, device=DEVICE).half()
    calls = _spy(monkeypatch, capturing=lambda: False)
    graphs: dict[str, torch.fx.GraphModule] = {}
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = torch.compile(model, fullgraph=True, backend=_capturing_backend(graphs))
    # What a capture would make dispatch pick. Process-wide, as KERNELS_MODE=graph forces it: on a GPU,
    # autograd runs the backward on its own device thread, where a thread's dispatch_mode does not reach.
    monkeypatch.setattr(_modes, "ENV_MODE", kernels.GRAPH)
    out = compiled(x)
    out.backward(dy)
    monkeypatch.setattr(_modes, "ENV_MODE", None)
    expected = plain.reference(x)
    expected.backward(dy)
    grads = {name: (p.grad, dict(plain.named_parameters())[name].grad) for name, p in model.named_parameters()}
    return _GraphModeStep(graphs, calls, sum(torch._dynamo.utils.counters["graph_break"].values()), out.detach(),
                          expected.detach(), grads)


def test_graph_mode_step_compiles_without_a_graph_break_and_matches_torch(graph_mode_step: _GraphModeStep) -> None:
    assert graph_mode_step.graph_breaks == 0  # fullgraph=True would have raised on one, too
    assert _error(graph_mode_step.out, graph_mode_step.expected) < FP16_TOLERANCE
    for name, (mine, ref) in graph_mode_step.grads.items():
        assert _error(mine, ref) < FP16_TOLERANCE, name


def test_graph_mode_step_dispatches_every_gemm_with_the_graph_winners(graph_mode_step: _GraphModeStep) -> None:
    names = {call.name for call in graph_mode_step.calls}
    assert names == set(SPIED)  # grouped_matmul: the experts' weight gradient
    assert all(call.mode == kernels.GRAPH for call in graph_mode_step.calls)


def test_only_the_experts_weight_gradient_would_be_kept_out_of_cuda_graphs(graph_mode_step: _GraphModeStep) -> None:
    from torch._inductor.utils import is_cudagraph_unsafe_fx_node  # what reduce-overhead checks per node

    def unsafe(kind: str) -> list[str]:
        return [str(node.target) for node in graph_mode_step.graphs[kind].graph.nodes
                if node.op == "call_function" and is_cudagraph_unsafe_fx_node(node)]

    assert unsafe("forward") == []
    assert unsafe("backward") and set(unsafe("backward")) == {"triton_tuner.moe_weight_grad.default"}
    for op in ("matmul", "linear", "gated_matmul", "moe_matmul"):
        assert torch.Tag.cudagraph_unsafe not in getattr(torch.ops.triton_tuner, op).default.tags


# ------------------------------------------------------------------------------------- CPU: warm-up

@pytest.fixture
def cpu_as_capturable(monkeypatch: pytest.MonkeyPatch) -> dict[str, bool]:
    """Let the operators treat the CPU as a device whose stream captures, with a capture check we set."""
    state = {"capturing": False}
    monkeypatch.setattr(ops, "_CAPTURABLE", ("cuda", "cpu"))
    monkeypatch.setattr(ops, "_UNWARMED", set())
    monkeypatch.setattr(_modes, "capturing", lambda: state["capturing"])  # no CUDA here (see kernels/_modes.py)
    return state


def _gated_modes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    modes: list[str] = []
    real = kernels.gated_matmul

    def spy(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        modes.append(_modes.current(True))
        return real(a, b)

    monkeypatch.setattr(kernels, "gated_matmul", spy)
    monkeypatch.setattr(kernels._eager, "gated_matmul", spy)  # where the operators look it up, per call
    return modes


def test_first_eager_call_of_a_signature_also_runs_its_graph_winner(cpu_as_capturable,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    modes = _gated_modes(monkeypatch)
    a, b = torch.randn(4, 8, device=DEVICE), torch.randn(8, 12, device=DEVICE)
    first = ops.gated_matmul(a, b)
    assert modes == [kernels.EAGER, kernels.GRAPH]
    assert torch.equal(ops.gated_matmul(a, b), first)
    assert modes == [kernels.EAGER, kernels.GRAPH, kernels.EAGER]  # once per signature


def test_no_extra_run_under_a_capture_or_a_forced_mode(cpu_as_capturable,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    modes = _gated_modes(monkeypatch)
    a, b = torch.randn(4, 8, device=DEVICE), torch.randn(8, 12, device=DEVICE)
    cpu_as_capturable["capturing"] = True
    ops.gated_matmul(a, b)
    assert modes == [kernels.GRAPH]
    cpu_as_capturable["capturing"] = False
    with kernels.dispatch_mode(kernels.EAGER):
        ops.gated_matmul(a[:3], b)
    assert modes == [kernels.GRAPH, kernels.EAGER]


# ------------------------------------------------------------------------------------- GPU: reduce-overhead

def _cuda_capturing() -> bool:
    return torch.cuda.is_current_stream_capturing()


@pytest.mark.gpu
def test_reduce_overhead_replays_the_patched_layer_on_the_graph_winners(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(1)
    model = _Layer(hidden=256, ffn=512, experts=4).cuda().half()
    plain = copy.deepcopy(model)
    kernels.patch(model, everywhere=True)
    calls = _spy(monkeypatch, _cuda_capturing)
    torch._dynamo.reset()
    compiled = torch.compile(model, mode="reduce-overhead", fullgraph=True)
    with torch.no_grad():
        for step in range(5):  # warm-up, capture, then replays
            x = torch.randn(4, 8, 256, device="cuda").half()
            out = compiled(x).clone()  # the next replay overwrites the graph's output
            assert _error(out, plain.reference(x)) < FP16_TOLERANCE, f"step {step}"
        captured = [call for call in calls if call.capturing]
        assert {call.name for call in captured} == {"matmul", "matmul_bias", "gated_matmul", "moe_matmul"}
        assert all(call.mode == kernels.GRAPH for call in captured)
        before = len(calls)
        compiled(torch.randn(4, 8, 256, device="cuda").half())
        assert len(calls) == before  # a replay: no Python dispatch at all
    torch._dynamo.reset()


@pytest.mark.gpu
def test_reduce_overhead_trains_the_gated_mlp_with_captured_backward_gemms(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(2)
    model = _GatedMLP(hidden=256, ffn=512).cuda().half()  # no MoE: its weight gradient is not capturable
    plain = copy.deepcopy(model)
    kernels.patch(model, everywhere=True)
    calls = _spy(monkeypatch, _cuda_capturing)
    torch._dynamo.reset()
    compiled = torch.compile(model, mode="reduce-overhead", fullgraph=True)
    for step in range(4):  # warm-up, capture, then replays (forward and backward each)
        x = torch.randn(64, 256, device="cuda").half()
        dy = torch.randn(64, 256, device="cuda").half()
        model.zero_grad(set_to_none=True)
        plain.zero_grad(set_to_none=True)
        compiled(x).backward(dy)
        plain.reference(x).backward(dy)
        for name, p in model.named_parameters():
            assert _error(p.grad, plain.get_parameter(name).grad) < FP16_TOLERANCE, f"step {step}: {name}"
    captured = [call for call in calls if call.capturing]
    assert {call.name for call in captured} == {"gated_matmul", "matmul_bias", "matmul"}  # matmul: the backward
    assert all(call.mode == kernels.GRAPH for call in captured)
    torch._dynamo.reset()


@pytest.mark.gpu
def test_reduce_overhead_keeps_split_k_scratch_right_across_shapes() -> None:
    """Split-K's scratch (partial tiles and counters, kernels/gemm.py ``_Scratch``) is first needed while
    torch.compile's CUDA-graph trees warm up and record, with the thread's allocations routed to their
    pool. Kept from that pool, it made the trees refuse the next shape's warm-up ("tensor(s) in the
    cudagraph pool not tracked as outputs", H100, 2026-11-24); kept buffers now come from outside any pool
    (kernels/_memory.py). Every shape's replays must stay right, shapes taking turns."""
    import contextlib

    from kernels import _plans
    from kernels.gemm import MATMUL

    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(2048, 512, bias=False), nn.ReLU(), nn.Linear(512, 2048, bias=False)).cuda().half()
    plain = copy.deepcopy(model)
    kernels.patch(model, everywhere=True)
    shapes = (16, 48)
    with contextlib.ExitStack() as pins:
        for m in shapes:  # split-K in both modes for every GEMM of the model, whatever the tables say
            for layer in (model[0], model[2]):
                a = torch.empty(m, layer.in_features, device="cuda", dtype=torch.float16)
                b = layer.weight.t()
                problem = MATMUL.problem_of(a, b)
                config = MATMUL.default_config(problem, kernels.current_device()).replace(
                    VARIANT="splitk", SPLIT_K=4, BLOCK_M=16, BLOCK_N=64, BLOCK_K=64, GROUP_SIZE_M=1)
                assert MATMUL.space.violation(config, problem, kernels.current_device()) is None
                (install,) = pins.enter_context(_plans.pinning([config], a, b))
                install()
        torch._dynamo.reset()
        compiled = torch.compile(model, mode="reduce-overhead", fullgraph=True, dynamic=False)
        with torch.no_grad():
            for step in range(8):  # each shape: warm-up, record, replays, shapes taking turns
                x = torch.randn(shapes[step % 2], 2048, device="cuda").half()
                out = compiled(x).clone()
                assert _error(out, plain(x)) < FP16_TOLERANCE, f"step {step}, {x.shape[0]} rows"
    torch._dynamo.reset()


def test_a_signature_first_called_under_a_forced_mode_is_warmed_at_its_first_auto_call(
        cpu_as_capturable, monkeypatch: pytest.MonkeyPatch) -> None:
    """A backward inherits its forward's forced mode: its first calls resolve with no warm-up. A later call
    in auto mode may be captured, so it runs the graph winner once then (and only then)."""
    modes = _gated_modes(monkeypatch)
    a, b = torch.randn(5, 8, device=DEVICE), torch.randn(8, 12, device=DEVICE)
    with kernels.dispatch_mode(kernels.EAGER):
        ops.gated_matmul(a, b)
    assert modes == [kernels.EAGER]
    ops.gated_matmul(a, b)
    assert modes == [kernels.EAGER, kernels.EAGER, kernels.GRAPH]
    ops.gated_matmul(a, b)
    assert modes == [kernels.EAGER, kernels.EAGER, kernels.GRAPH, kernels.EAGER]
    assert not ops._UNWARMED


def test_after_clear_cache_the_first_call_warms_the_graph_winner_again(cpu_as_capturable,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """After a re-tune, a capture must not trust a warm-up that ran the old graph winner."""
    modes = _gated_modes(monkeypatch)
    a, b = torch.randn(4, 8, device=DEVICE), torch.randn(8, 12, device=DEVICE)
    ops.gated_matmul(a, b)
    ops.gated_matmul(a, b)
    assert modes == [kernels.EAGER, kernels.GRAPH, kernels.EAGER]
    for forget in (kernels.clear_cache, lambda: kernels.use_database(None)):
        forget()
        del modes[:]
        ops.gated_matmul(a, b)
        assert modes == [kernels.EAGER, kernels.GRAPH]
