"""``kernels.patch`` runs an attention module's query, key and value projections as one GEMM (``SharedInput``).

On the CPU these run the kernels under the interpreter, in float32; the same tests run on the GPU."""

from __future__ import annotations

import copy
import pickle
import sys

import pytest
import torch
from torch import nn

import kernels
import kernels.nn
from _helpers import DEVICE, relative_error as _error

FP32_TOLERANCE = 1e-4


class _Attention(nn.Module):
    """transformers' Llama attention in small: grouped query heads (2 query heads, 1 key/value head of 8)."""

    def __init__(self, hidden: int = 16, bias: bool = False, names: tuple[str, ...] = ("q_proj", "k_proj", "v_proj")
                 ) -> None:
        super().__init__()
        self.names = names
        self.head_dim = 8
        for name, width in zip(names, (hidden, 8, 8)):
            setattr(self, name, nn.Linear(hidden, width, bias=bias))
        self.o_proj = nn.Linear(hidden, hidden, bias=False)

    def forward(self, x: torch.Tensor, memory: torch.Tensor | None = None) -> torch.Tensor:
        b, t, _ = x.shape
        source = x if memory is None else memory  # cross-attention: keys and values from another input
        q, k, v = (getattr(self, name) for name in self.names)
        queries = q(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        keys = k(source).view(b, source.shape[1], -1, self.head_dim).transpose(1, 2)
        values = v(source).view(b, source.shape[1], -1, self.head_dim).transpose(1, 2)
        keys, values = (s.repeat_interleave(queries.shape[1] // s.shape[1], dim=1) for s in (keys, values))
        attn = nn.functional.scaled_dot_product_attention(queries, keys, values)
        return self.o_proj(attn.transpose(1, 2).reshape(b, t, -1))


def _matmul_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    """The (a, b) shapes of each kernels.matmul and kernels.matmul_bias call from here on (spies: the calls run)."""
    calls: list[tuple] = []
    for name in ("matmul", "matmul_bias"):
        real = getattr(kernels, name)

        def spy(a, b, *rest, real=real):
            calls.append((tuple(a.shape), tuple(b.shape)))
            return real(a, b, *rest)

        monkeypatch.setattr(kernels, name, spy)
        monkeypatch.setattr(kernels._eager, name, spy)  # where the operators look it up, per call
    return calls


def _patched(bias: bool = False) -> tuple[nn.Module, nn.Module]:
    """A seeded attention, patched, and its unpatched twin."""
    torch.manual_seed(0)
    attention = _Attention(bias=bias).to(DEVICE)
    plain = _twin(attention)
    kernels.patch(attention, everywhere=True)
    return attention, plain


def _twin(module: nn.Module) -> nn.Module:
    """An unpatched copy with the same weights, for torch's answer."""
    plain = type(module)(bias=module.q_proj.bias is not None if hasattr(module, "q_proj") else False,
                         names=module.names).to(DEVICE)
    plain.load_state_dict(module.state_dict())
    return plain


@pytest.mark.parametrize("names", [("q_proj", "k_proj", "v_proj"), ("wq", "wk", "wv"), ("query", "key", "value"),
                                   ("q", "k", "v")])
@pytest.mark.parametrize("bias", [False, True])
def test_patch_runs_the_query_key_and_value_projections_as_one_gemm(monkeypatch, names, bias) -> None:
    torch.manual_seed(0)
    attention = _Attention(bias=bias, names=names).to(DEVICE)
    params = dict(attention.named_parameters())
    state = {name: t.clone() for name, t in attention.state_dict().items()}
    x = torch.randn(2, 3, 16, device=DEVICE)
    with torch.no_grad():
        expected = attention(x)
    kernels.patch(attention, everywhere=True)
    members = [getattr(attention, name) for name in names]
    assert all(type(m) is kernels.nn.SharedInputLinear for m in members)
    assert dict(attention.named_parameters()) == params  # the very same objects
    assert all(torch.equal(attention.state_dict()[name], t) for name, t in state.items())
    # Each weight is now rows of one [32, 16] storage: the stacked weight is a view, not a copy.
    base = members[0].weight.data_ptr()
    assert [m.weight.data_ptr() - base for m in members] == [0, 16 * 16 * 4, 24 * 16 * 4]
    calls = _matmul_calls(monkeypatch)
    with torch.no_grad():
        got = attention(x)
    # One GEMM for q, k and v ([6, 16] @ [16, 32]), one for o_proj (a signature's first call on a GPU also
    # runs its graph winner, to warm it: the same shapes twice).
    assert set(calls) == {((6, 16), (16, 32)), ((6, 16), (16, 16))}
    assert _error(got, expected) < FP32_TOLERANCE
    kernels.unpatch(attention)
    assert all(type(m) is nn.Linear for m in members)
    with torch.no_grad():
        assert _error(attention(x), expected) < FP32_TOLERANCE


def test_cross_attention_stops_fusing_and_every_call_stays_right(monkeypatch, caplog) -> None:
    """Keys and values from another input: the first call's stacked product is of no use to them, the group
    stops fusing, and from then on each projection runs its own GEMM."""
    attention, plain = _patched()
    x, memory = torch.randn(1, 3, 16, device=DEVICE), torch.randn(1, 5, 16, device=DEVICE)
    group = attention.q_proj.__dict__["_shared"]
    with torch.no_grad(), caplog.at_level("INFO", logger="kernels.nn"):
        assert _error(attention(x, memory), plain(x, memory)) < FP32_TOLERANCE
        assert not group.fusing and group.pending is None  # nothing held
        assert "not called on one input" in caplog.text
        calls = _matmul_calls(monkeypatch)
        assert _error(attention(x, memory), plain(x, memory)) < FP32_TOLERANCE
        assert _error(attention(x), plain(x)) < FP32_TOLERANCE
    assert ((3, 16), (16, 32)) not in calls and ((3, 16), (16, 16)) in calls and ((5, 16), (16, 8)) in calls


def test_an_input_written_in_place_between_the_projections_gets_a_new_product() -> None:
    attention, plain = _patched()
    x = torch.randn(4, 16, device=DEVICE)
    with torch.no_grad():
        q = attention.q_proj(x)
        x.mul_(2)  # the same tensor object, new values: its version counter moved
        k = attention.k_proj(x)
        v = attention.v_proj(x)
        assert _error(q, plain.q_proj(x / 2)) < FP32_TOLERANCE
        assert _error(k, plain.k_proj(x)) < FP32_TOLERANCE
        assert _error(v, plain.v_proj(x)) < FP32_TOLERANCE


def test_a_projection_called_twice_on_one_input_gets_the_same_answer() -> None:
    attention, plain = _patched()
    x = torch.randn(4, 16, device=DEVICE)
    with torch.no_grad():
        for name in ("q_proj", "q_proj", "k_proj", "v_proj", "v_proj"):
            assert _error(getattr(attention, name)(x), getattr(plain, name)(x)) < FP32_TOLERANCE
        assert attention.q_proj.__dict__["_shared"].fusing


def test_training_runs_each_projection_with_torchs_gradients() -> None:
    """A gradient wanted for the weights: each member runs its own GEMM (the stacked weight is no Parameter)."""
    attention, plain = _patched(bias=True)
    x = torch.randn(2, 3, 16, device=DEVICE)
    attention(x).square().sum().backward()
    plain(x).square().sum().backward()
    mine = dict(attention.named_parameters())
    for name, p in plain.named_parameters():  # the key's bias gets ~0 (softmax ignores a shift): atol
        assert torch.allclose(mine[name].grad, p.grad, rtol=1e-4, atol=1e-6), name


def test_threads_sharing_one_patched_module_each_get_their_own_inputs_products() -> None:
    """Two threads call one attention at once: on the same inputs (the group keeps fusing, and both threads
    serve themselves from one pending product), then each on its own. Every answer must be its input's. (The
    group reads its pending product as one tuple, so a thread never finds it half replaced; the interleaving that
    would catch a half-replaced state is a few bytecodes wide, which this test seldom hits: it guards the answers,
    not that race.) float64: torch computes the stacked product (the kernels take no float64), so the threads
    race in the group's logic alone."""
    import threading

    torch.manual_seed(0)
    attention = _Attention(bias=True).to(DEVICE, torch.float64)
    plain = _twin(attention).to(torch.float64)
    kernels.patch(attention, everywhere=True)
    shared = [torch.randn(2, 3, 16, device=DEVICE, dtype=torch.float64) for _ in range(200)]
    inputs = [shared + [torch.randn_like(shared[0]) for _ in range(50)] for _ in range(2)]
    with torch.no_grad():
        expected = [[plain(x) for x in xs] for xs in inputs]
    errors: list[str] = []

    def run(worker: int) -> None:
        with torch.no_grad():
            for i, x in enumerate(inputs[worker]):
                try:
                    if _error(attention(x), expected[worker][i]) > 1e-12:
                        errors.append(f"thread {worker}, call {i}: another input's product")
                except Exception as exc:  # noqa: BLE001 (any failure in a thread is the test's to report)
                    errors.append(f"thread {worker}, call {i}: {exc!r}")

    threads = [threading.Thread(target=run, args=(w,)) for w in range(2)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter can: races show
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    assert not errors, errors[:3]


def test_frozen_weights_give_the_input_its_gradient_through_the_stacked_gemm(monkeypatch) -> None:
    torch.manual_seed(0)
    attention = _Attention().to(DEVICE).requires_grad_(False)
    plain = _twin(attention).requires_grad_(False)
    kernels.patch(attention, everywhere=True)
    x = torch.randn(2, 3, 16, device=DEVICE, requires_grad=True)
    theirs = x.detach().clone().requires_grad_()
    out = attention(x)
    assert attention.q_proj.__dict__["_shared"].pending is None  # all three served: nothing held
    out.square().sum().backward()
    plain(theirs).square().sum().backward()
    assert _error(x.grad, theirs.grad) < FP32_TOLERANCE


def test_the_group_follows_new_weights_a_cast_a_copy_and_a_pickle() -> None:
    torch.manual_seed(0)
    attention = _Attention(bias=True).to(DEVICE)
    kernels.patch(attention, everywhere=True)
    x = torch.randn(1, 4, 16, device=DEVICE)

    def check(module: nn.Module, tolerance: float = FP32_TOLERANCE) -> None:
        plain = _twin(module).to(module.q_proj.weight.dtype)
        xx = x.to(module.q_proj.weight.dtype)
        with torch.no_grad():
            assert _error(module(xx), plain(xx)) < tolerance

    with torch.no_grad():
        attention.load_state_dict({k: torch.randn_like(v) for k, v in attention.state_dict().items()})
    check(attention)
    attention.load_state_dict({k: torch.randn_like(v) for k, v in attention.state_dict().items()}, assign=True)
    check(attention)
    attention.v_proj.bias.data = torch.randn_like(attention.v_proj.bias)
    check(attention)
    attention.k_proj.weight.data = torch.randn_like(attention.k_proj.weight)
    with torch.inference_mode():  # not stacked under inference_mode: each member's own GEMM, right
        check(attention)
    check(attention)
    assert attention.k_proj.weight.data_ptr() == attention.q_proj.weight.data_ptr() + 16 * 16 * 4
    attention.half()  # stacked again by the cast itself: no old fp32 storage kept until a next call
    joint = attention.q_proj.__dict__["_shared"].joint
    assert joint is not None and joint.weight.dtype == torch.float16
    assert attention.v_proj.weight.data_ptr() == attention.q_proj.weight.data_ptr() + 24 * 16 * 2
    assert all(p.dtype == torch.float16 for p in joint.params)
    check(attention, 1e-2)
    for copied in (copy.deepcopy(attention), pickle.loads(pickle.dumps(attention))):
        assert type(copied.q_proj) is kernels.nn.Linear  # a copy is not fused: patch it again
        check(copied, 1e-2)
    assert type(attention.q_proj) is kernels.nn.SharedInputLinear
    check(attention, 1e-2)


def test_patch_leaves_projections_that_cannot_share_one_gemm_alone() -> None:
    mixed = _Attention(bias=True)
    mixed.v_proj = nn.Linear(16, 8, bias=False)  # biases on two of three
    other_width = _Attention()
    other_width.k_proj = nn.Linear(12, 8, bias=False)
    partial = _Attention()
    del partial.v_proj
    for module in (mixed, other_width, partial):
        kernels.patch(module, everywhere=True)
        assert not any(type(m) is kernels.nn.SharedInputLinear for m in module.modules())
    plain = _Attention()
    kernels.patch(plain, fuse_qkv=False, everywhere=True)
    assert type(plain.q_proj) is kernels.nn.Linear


def test_patch_says_how_many_groups_it_fused(caplog) -> None:
    model = nn.Sequential(_Attention(), _Attention(names=("wq", "wk", "wv"))).to(DEVICE)
    with caplog.at_level("INFO", logger="kernels.nn"):
        kernels.patch(model, everywhere=True)
    assert "8 nn.Linear patched, 0 SiLU-gated MLPs fused, 2 query/key/value groups fused" in caplog.text


def _compiled(module: nn.Module) -> tuple[nn.Module, list[torch.fx.GraphModule]]:
    """``module`` compiled whole (after a reset of Dynamo's caches), and the graphs Dynamo hands its backend."""
    graphs: list[torch.fx.GraphModule] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list) -> torch.fx.GraphModule:
        graphs.append(gm)
        return gm

    torch._dynamo.reset()
    return torch.compile(module, fullgraph=True, backend=backend), graphs


def test_compiled_attention_traces_one_gemm_for_query_key_and_value() -> None:
    attention, plain = _patched(bias=True)
    x = torch.randn(2, 3, 16, device=DEVICE)
    torch._dynamo.utils.counters.clear()
    compiled, graphs = _compiled(attention)
    with torch.no_grad():
        for _ in range(2):
            assert _error(compiled(x), plain(x)) < FP32_TOLERANCE
    assert not torch._dynamo.utils.counters["graph_break"]
    assert len(graphs) == 1
    linears = [n for n in graphs[0].graph.nodes if n.op == "call_function" and "linear" in str(n.target)]
    assert len(linears) == 2  # the stacked q, k, v and o_proj
    assert attention.q_proj.__dict__["_shared"].pending is None
    torch._dynamo.reset()


def test_compiled_attention_after_a_member_gets_a_new_weight_runs_that_member_alone() -> None:
    """Traced, each member asks about its own Parameters (the group reads none of them there: docs/PYTORCH.md,
    "Guards"). A new Parameter for one member makes the compiled call trace again, where that member runs its
    own GEMM and the others keep the stacked one; every answer is torch's."""
    attention, plain = _patched(bias=True)
    x = torch.randn(2, 3, 16, device=DEVICE)
    compiled, graphs = _compiled(attention)
    with torch.no_grad():
        assert _error(compiled(x), plain(x)) < FP32_TOLERANCE
        fresh = torch.randn(8, 16, device=DEVICE)
        attention.k_proj.weight = nn.Parameter(fresh.clone())
        plain.k_proj.weight = nn.Parameter(fresh.clone())
        for _ in range(2):
            assert _error(compiled(x), plain(x)) < FP32_TOLERANCE
    assert len(graphs) == 2, "the new Parameter failed a guard: traced again"
    linears = [n for n in graphs[1].graph.nodes if n.op == "call_function" and "linear" in str(n.target)]
    assert len(linears) == 3  # the stacked q, k, v (q's and v's columns), k's own, and o_proj
    assert attention.q_proj.__dict__["_shared"].pending is None, "k's waiting bit was taken: nothing left pending"
    torch._dynamo.reset()


@pytest.mark.gpu
def test_a_patched_attention_captured_in_a_cuda_graph_replays_new_inputs() -> None:
    torch.manual_seed(5)
    attention = _Attention(hidden=256, bias=True).cuda().half()
    attention.head_dim = 128  # two query heads, one key/value head of 128
    for name, width in (("k_proj", 128), ("v_proj", 128)):
        setattr(attention, name, nn.Linear(256, width, bias=True).cuda().half())
    plain = copy.deepcopy(attention)
    kernels.patch(attention, everywhere=True)
    assert type(attention.q_proj) is kernels.nn.SharedInputLinear
    x = torch.randn(4, 8, 256, device="cuda").half()
    with torch.no_grad():
        kernels.ops.warm_for_capture(attention, x)  # resolve and compile both modes' configs outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = attention(x)
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
        assert _error(y, plain(x)) < 1e-2
