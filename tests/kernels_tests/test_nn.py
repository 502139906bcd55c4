"""kernels.nn: the patched Linear is an nn.Linear, patch/unpatch keep the Parameters, the MoE block is right."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from _helpers import DEVICE, LlamaMLP, relative_error

import kernels

FP32_TOLERANCE = 1e-4  # relative L2 error
FP16_TOLERANCE = 1e-2  # relative L2 error of fp16 outputs; the interpreter measures ~3e-4


pytestmark = pytest.mark.usefixtures("own_database")


_error = relative_error


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 24), torch.nn.GELU(), torch.nn.Linear(24, 8, bias=False)).to(DEVICE)


def test_patch_swaps_linears_in_place_and_keeps_the_same_parameters() -> None:
    model = _model()
    params = {name: p for name, p in model.named_parameters()}
    x = torch.randn(3, 5, 16, device=DEVICE)
    with torch.no_grad():
        expected = model(x)
        assert kernels.patch(model, everywhere=True) is model
        got = model(x)
    assert all(type(model[i]) is kernels.nn.Linear for i in (0, 2))
    assert all(isinstance(model[i], torch.nn.Linear) for i in (0, 2))
    assert {name: p for name, p in model.named_parameters()} == params  # the very same objects
    assert _error(got, expected) < FP32_TOLERANCE


def test_unpatch_restores_plain_linears() -> None:
    model = kernels.patch(_model(), everywhere=True)
    kernels.unpatch(model)
    assert all(type(model[i]) is torch.nn.Linear for i in (0, 2))


def test_patch_leaves_linear_subclasses_alone() -> None:
    class Scaled(torch.nn.Linear):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return 2 * super().forward(x)

    model = torch.nn.Sequential(Scaled(4, 4))
    kernels.patch(model, everywhere=True)
    assert type(model[0]) is Scaled


def test_linear_state_dict_round_trips_with_nn_linear() -> None:
    plain = torch.nn.Linear(16, 24).to(DEVICE)
    ours = kernels.nn.Linear(16, 24, device=DEVICE)
    assert ours.state_dict().keys() == plain.state_dict().keys()
    ours.load_state_dict(plain.state_dict())
    back = torch.nn.Linear(16, 24).to(DEVICE)
    back.load_state_dict(ours.state_dict())
    assert torch.equal(back.weight, plain.weight) and torch.equal(back.bias, plain.bias)
    x = torch.randn(4, 16, device=DEVICE)
    with torch.no_grad():
        assert _error(ours(x), plain(x)) < FP32_TOLERANCE


def test_linear_takes_fp16_and_leading_batch_dimensions() -> None:
    plain = torch.nn.Linear(32, 16).to(DEVICE).half()
    ours = kernels.patch(torch.nn.Sequential(torch.nn.Linear(32, 16)), everywhere=True).to(DEVICE).half()
    ours.load_state_dict({"0." + k: v for k, v in plain.state_dict().items()})
    x = torch.randn(2, 3, 4, 32, device=DEVICE).half()
    with torch.no_grad():
        got = ours(x)
        assert got.shape == (2, 3, 4, 16)
        assert _error(got, plain.float()(x.float())) < FP16_TOLERANCE


def test_route_sorts_rows_by_expert_with_running_end_offsets() -> None:
    logits = torch.tensor([[0.0, 5.0, 1.0], [3.0, 0.0, 2.0], [0.0, 1.0, 4.0]])
    order, weights, offsets, counts = kernels.nn.route(logits, top_k=2)
    assert offsets.dtype == torch.int32 and offsets.tolist() == [1, 3, 6]
    assert counts.tolist() == [1, 2, 3]
    assert order.tolist() == [1, 0, 2, 0, 1, 2]  # expert 0: token 1; expert 1: 0, 2; expert 2: 0, 1, 2
    assert torch.allclose(weights.view(-1)[:1], torch.softmax(torch.tensor([3.0, 2.0]), 0)[:1])


def test_route_rejects_top_k_above_the_expert_count() -> None:
    with pytest.raises(ValueError, match="top_k must be in 1..3"):
        kernels.nn.route(torch.zeros(2, 3), top_k=4)


def test_moe_block_matches_its_torch_reference() -> None:
    torch.manual_seed(4)
    block = kernels.nn.MoE(16, 24, experts=4, top_k=2, device=DEVICE, dtype=torch.float16)
    x = torch.randn(2, 5, 16, device=DEVICE).half()
    with torch.no_grad():
        assert _error(block(x), block.reference(x)) < FP16_TOLERANCE


@pytest.mark.gpu
def test_patched_layer_captured_in_a_cuda_graph_replays_new_inputs() -> None:
    torch.manual_seed(5)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.SiLU(), torch.nn.Linear(512, 256))
    model = model.cuda().half()
    plain = [m for m in model]
    x = torch.randn(32, 256, device="cuda").half()
    kernels.patch(model, everywhere=True)
    with torch.no_grad():
        kernels.ops.warm_for_capture(model, x)  # resolve and compile both modes' configs outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = model(x)
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
        kernels.unpatch(model)
        expected = model(x)
    assert plain[0] is model[0]
    assert _error(y, expected) < FP16_TOLERANCE


# ------------------------------------------------------------------------------- autocast, torch.func, float64

def _pair(bias: bool = True, dtype: torch.dtype = torch.float32) -> tuple[torch.nn.Module, torch.nn.Module]:
    torch.manual_seed(11)
    plain = torch.nn.Linear(32, 16, bias=bias).to(DEVICE, dtype)
    ours = kernels.patch(torch.nn.Sequential(torch.nn.Linear(32, 16, bias=bias).to(DEVICE, dtype)), everywhere=True)
    ours[0].load_state_dict(plain.state_dict())
    return plain, ours


@pytest.mark.parametrize("bias", [True, False])
def test_under_autocast_a_patched_linear_computes_and_returns_autocasts_dtype(bias: bool) -> None:
    """As torch's linear: operands cast to float16 (autocast's dtype here), the result float16, so the next
    layer (torch.matmul, autocast too) gets the dtype it expects."""
    plain, ours = _pair(bias)
    x = torch.randn(8, 32, device=DEVICE)
    with torch.autocast(DEVICE, dtype=torch.float16):
        want, got = plain(x), ours(x)
        assert (got @ torch.randn(16, 4, device=DEVICE)).dtype == torch.float16
    assert got.dtype == want.dtype == torch.float16
    assert relative_error(got, want) < FP16_TOLERANCE


def test_under_autocast_the_compiled_patched_linear_casts_too() -> None:
    plain, ours = _pair()
    compiled = torch.compile(ours, fullgraph=True, backend="aot_eager")
    x = torch.randn(8, 32, device=DEVICE)
    with torch.autocast(DEVICE, dtype=torch.float16):
        got = compiled(x)
        want = plain(x)
    assert got.dtype == torch.float16 and relative_error(got, want) < FP16_TOLERANCE
    torch._dynamo.reset()


def test_torch_func_transforms_get_torchs_answers_not_silent_zeros() -> None:
    """The operators have a backward only: under jvp torch would return a zero tangent without a word."""
    plain, ours = _pair()
    x, tangent = torch.randn(8, 32, device=DEVICE), torch.randn(8, 32, device=DEVICE)
    _, want = torch.func.jvp(plain, (x,), (tangent,))
    _, got = torch.func.jvp(ours, (x,), (tangent,))
    assert got.abs().max() > 0 and relative_error(got, want) < FP32_TOLERANCE
    grad_want = torch.func.grad(lambda v: plain(v).square().sum())(x)
    grad_got = torch.func.grad(lambda v: ours(v).square().sum())(x)
    assert relative_error(grad_got, grad_want) < FP32_TOLERANCE
    with torch.no_grad():
        assert relative_error(torch.func.vmap(ours)(x[:, None]), torch.func.vmap(plain)(x[:, None])) < FP32_TOLERANCE


def test_a_float64_model_runs_as_torchs_does() -> None:
    """The kernels take float16, bfloat16 and float32; a float64 layer is torch's to compute, as before patch."""
    plain, ours = _pair(dtype=torch.float64)
    x = torch.randn(8, 32, device=DEVICE, dtype=torch.float64, requires_grad=True)
    got = ours(x)
    assert got.dtype == torch.float64 and torch.allclose(got, plain(x))
    got.sum().backward()
    assert x.grad is not None


def test_an_moe_block_in_float32_runs_its_torch_reference() -> None:
    """moe_matmul takes float16 and bfloat16; a fresh module is float32, and must still run."""
    torch.manual_seed(12)
    block = kernels.nn.MoE(16, 32, 4).to(DEVICE)
    x = torch.randn(6, 16, device=DEVICE)
    assert torch.equal(block(x), block.reference(x))


def test_malformed_calls_get_errors_that_name_the_problem() -> None:
    _, ours = _pair()
    with pytest.raises(RuntimeError, match="at least one dimension"):
        ours(torch.tensor(1.0, device=DEVICE))
    with pytest.raises(ValueError, match="non-empty|at least one"):
        kernels.grouped_matmul([], [])
    x = torch.randn(4, 8, device=DEVICE, dtype=torch.float16)
    with pytest.raises(ValueError, match=r"w \[E, K, N\]"):
        kernels.ops.moe_matmul(x, torch.randn(8, 4, device=DEVICE, dtype=torch.float16),
                               torch.tensor([4], dtype=torch.int32, device=DEVICE))


def test_a_flop_counter_counts_a_patched_linear_as_torchs() -> None:
    from torch.utils.flop_counter import FlopCounterMode

    plain, ours = _pair()
    x = torch.randn(8, 32, device=DEVICE)
    counts = []
    for model in (plain, ours):
        with FlopCounterMode(display=False) as counter:
            model(x)
        counts.append(counter.get_total_flops())
    assert counts[0] == counts[1] == 2 * 8 * 32 * 16


def test_the_kept_transposed_weight_follows_the_weight_it_was_made_from() -> None:
    """Linear keeps weight.t() (a torch call per forward otherwise): a new Parameter, new data under the
    same Parameter, an in-place update and a deep copy must each give the right result."""
    torch.manual_seed(0)
    layer = kernels.nn.Linear(8, 4)
    x = torch.randn(3, 8)

    def check() -> None:
        with torch.no_grad():
            assert torch.allclose(layer(x), torch.nn.functional.linear(x, layer.weight, layer.bias), atol=1e-5)

    check()
    kept = layer._kept_t[1]
    check()
    assert layer._kept_t[1] is kept, "kept between calls"
    with torch.no_grad():
        layer.weight.mul_(2)  # in place: the kept view sees it
    check()
    layer.weight.data = torch.randn(4, 8)  # new data under the same Parameter
    check()
    layer.weight = torch.nn.Parameter(torch.randn(4, 8))  # a new Parameter
    check()
    copied = copy.deepcopy(layer)
    with torch.no_grad():
        copied.weight.mul_(3)
        assert torch.allclose(copied(x), torch.nn.functional.linear(x, copied.weight, copied.bias), atol=1e-5)
    check()


def test_the_kept_transposed_weight_goes_with_a_cast_a_pickle_and_unpatch() -> None:
    """It would pin the old data after .half() or .to(), ride along in torch.save, and outlive unpatch."""
    import io

    layer = kernels.nn.Linear(8, 4)
    with torch.no_grad():
        layer(torch.randn(2, 8))
    assert "_kept_t" in layer.__dict__
    layer.double()
    assert "_kept_t" not in layer.__dict__
    with torch.no_grad():
        layer(torch.randn(2, 8, dtype=torch.float64))  # torch's linear (float64): nothing kept
        layer.float()(torch.randn(2, 8))
    buffer = io.BytesIO()
    torch.save(layer, buffer)
    buffer.seek(0)
    assert "_kept_t" not in torch.load(buffer, weights_only=False).__dict__
    model = torch.nn.Sequential(layer)
    kernels.unpatch(model)
    assert type(model[0]) is torch.nn.Linear and "_kept_t" not in model[0].__dict__


def test_a_parametrized_weight_is_computed_on_every_call() -> None:
    """torch.nn.utils.parametrize moves the weight out of the Parameters' dict behind a property: the patched
    forward must use what the property computes, and keep no view of it."""
    from torch.nn.utils import parametrize

    class Doubled(torch.nn.Module):
        def forward(self, w: torch.Tensor) -> torch.Tensor:
            return 2 * w

    torch.manual_seed(1)
    layer = kernels.nn.Linear(8, 4)
    x = torch.randn(3, 8)
    parametrize.register_parametrization(layer, "weight", Doubled())
    with torch.no_grad():
        want = torch.nn.functional.linear(x, layer.weight, layer.bias)
        assert torch.allclose(layer(x), want, atol=1e-5)
        assert "_kept_t" not in layer.__dict__
    layer.bias = None
    with torch.no_grad():
        assert torch.allclose(layer(x), torch.nn.functional.linear(x, layer.weight), atol=1e-5)


@pytest.mark.parametrize("experts,tokens,top_k", [(3, 1, 1), (4, 7, 2), (8, 64, 2), (16, 33, 4)])
def test_route_counting_sort_gives_the_stable_sort_of_torch(monkeypatch, experts, tokens, top_k) -> None:
    torch.manual_seed(experts + tokens)
    logits = torch.randn(tokens, experts)
    monkeypatch.setattr(kernels._routing, "_COUNTING_ROWS", 0)  # count eagerly, whatever the row count
    counted = kernels.nn._route(logits, top_k)
    monkeypatch.setattr(kernels._routing, "_COUNTING_CELLS", 0)  # the torch.sort path, for many experts and tokens
    assert not kernels._routing._counting(tokens * top_k, experts)
    sorted_ = kernels.nn._route(logits, top_k)
    for name in ("perm", "position", "gate", "offsets", "counts"):
        assert torch.equal(getattr(counted, name), getattr(sorted_, name)), name
    flat = torch.topk(logits, top_k, dim=-1).indices.reshape(-1)
    assert torch.equal(counted.perm, torch.sort(flat, stable=True).indices)
    assert torch.equal(counted.perm[counted.position], torch.arange(tokens * top_k))  # position inverts perm


@pytest.mark.parametrize("experts,tokens,top_k", [(3, 1, 1), (4, 7, 2), (128, 1, 8), (128, 16, 8), (200, 5, 3),
                                                   (4, 256, 2), (4, 384, 2), (8, 300, 2), (128, 130, 8),
                                                   (512, 3, 8)])
def test_eager_sizes_are_sorted_in_triton_as_torch_sorts_them(experts, tokens, top_k) -> None:
    """Eagerly, up to _TRITON_ROWS rows and _TRITON_EXPERTS experts, sort_by_expert runs in Triton (_sort_kernel,
    one program up to _ONE_PROGRAM_ROWS rows, chunks past it): the same stable order, places, counts and offsets
    as torch.sort and a count, and each sorted row's token. The sizes span one and many blocks, the one-program
    limit (512 rows), whole and partial chunks, experts not a power of two, and the most experts."""
    torch.manual_seed(experts + tokens)
    flat = torch.topk(torch.randn(tokens, experts), top_k, dim=-1).indices.reshape(-1).to(DEVICE)
    assert kernels._routing._in_triton(flat, experts)
    routed = kernels._routing.sort_by_expert(flat, experts, top_k)
    assert torch.equal(routed.perm, torch.sort(flat, stable=True).indices)
    assert torch.equal(routed.perm[routed.position], torch.arange(tokens * top_k, device=flat.device))
    assert torch.equal(routed.token, routed.perm // top_k)
    want = torch.bincount(flat, minlength=experts)
    assert torch.equal(routed.counts, want) and torch.equal(routed.offsets, torch.cumsum(want, 0).to(torch.int32))


def test_sizes_past_triton_take_torchs_sort_with_the_same_fields() -> None:
    flat = torch.randint(0, 600, (40,), device=DEVICE)  # more experts than the Triton sort takes
    assert not kernels._routing._in_triton(flat, 600)
    routed = kernels._routing.sort_by_expert(flat, 600, 4)
    assert torch.equal(routed.perm, torch.sort(flat, stable=True).indices)
    assert torch.equal(routed.token, routed.perm // 4)
    assert torch.equal(routed.offsets, torch.cumsum(torch.bincount(flat, minlength=600), 0).to(torch.int32))


@pytest.mark.parametrize("weights_dtype", [torch.float32, torch.float16])
def test_combine_sums_each_tokens_rows_by_their_weights_in_float32(weights_dtype) -> None:
    torch.manual_seed(3)
    tokens, top_k, hidden = 5, 3, 1100  # two column blocks, the second one partial
    rows = torch.randn(tokens * top_k, hidden, device=DEVICE, dtype=torch.float16)
    position = torch.randperm(tokens * top_k).to(DEVICE)
    weights = torch.softmax(torch.randn(tokens, top_k), -1).to(DEVICE, weights_dtype)
    got = kernels._routing.combine(rows, position, weights, torch.float16)
    want = (rows[position].view(tokens, top_k, hidden).float() * weights.float().unsqueeze(-1)).sum(1)
    assert got.dtype == torch.float16 and got.shape == (tokens, hidden)
    assert (got.float() - want).abs().max() <= 1e-2 * want.abs().max()


def test_moe_block_takes_no_tokens_and_its_combine_keeps_gradients() -> None:
    torch.manual_seed(6)
    block = kernels.nn.MoE(16, 24, experts=4, top_k=2, device=DEVICE, dtype=torch.float16)
    with torch.no_grad():
        assert block(torch.randn(0, 16, device=DEVICE).half()).shape == (0, 16)
    routed = kernels.nn._route(torch.randn(5, 4, requires_grad=True), 2)
    assert routed.gate.requires_grad  # the combine's weights carry the router's gradient


def test_route_under_torch_compile_counts_and_takes_masked_maxima_as_eager_routing_sorts() -> None:
    """Traced, routing takes the k largest by masked maxima and sorts by counting (few rows: eagerly it would
    take torch.topk and torch.sort); both give what the eager path gives."""
    torch.manual_seed(9)
    logits = torch.randn(5, 8)
    assert not kernels._routing._counting(10, 8), "5 tokens x top-2 run eagerly: torch.sort"
    eager = kernels.nn._route(logits, 2)
    traced = torch.compile(lambda x: tuple(kernels.nn._route(x, 2)), backend="aot_eager", fullgraph=True)(logits)
    for name, got in zip(kernels.nn._Routed._fields, traced):
        assert torch.equal(got, getattr(eager, name)), name
    values, indices = torch.compile(lambda x: kernels.nn._top_k(x, 3), backend="aot_eager", fullgraph=True)(logits)
    expected = torch.topk(logits, 3, dim=-1)
    assert torch.equal(values, expected.values) and torch.equal(indices, expected.indices)


# ------------------------------------------------------------------------------------------ gated MLPs

class _Phi3MLP(torch.nn.Module):
    """The shape of transformers' Phi3MLP: one stacked [gate; up] projection, chunked."""

    def __init__(self, hidden: int = 16, ffn: int = 24) -> None:
        super().__init__()
        self.gate_up_proj = torch.nn.Linear(hidden, 2 * ffn, bias=False)
        self.down_proj = torch.nn.Linear(ffn, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(up * torch.nn.functional.silu(gate))


class _MetaFeedForward(torch.nn.Module):
    """The shape of Meta's Llama FeedForward (and transformers' Mixtral expert MLP): w2(silu(w1(x)) * w3(x))."""

    def __init__(self, hidden: int = 16, ffn: int = 24) -> None:
        super().__init__()
        self.w1 = torch.nn.Linear(hidden, ffn, bias=False)
        self.w2 = torch.nn.Linear(ffn, hidden, bias=False)
        self.w3 = torch.nn.Linear(hidden, ffn, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(torch.nn.functional.silu(self.w1(x)) * self.w3(x))


def _gated_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    """The (a, b) shapes of each kernels.gated_matmul call from here on (a spy: the call itself runs)."""
    calls: list[tuple] = []
    real = kernels.gated_matmul

    def spy(a, b):
        calls.append((tuple(a.shape), tuple(b.shape)))
        return real(a, b)

    monkeypatch.setattr(kernels, "gated_matmul", spy)
    monkeypatch.setattr(kernels._eager, "gated_matmul", spy)  # where the operators look it up, per call
    return calls


@pytest.mark.parametrize("make", [LlamaMLP, _MetaFeedForward, _Phi3MLP],
                         ids=["gate_proj-up_proj", "w1-w3", "gate_up_proj"])
def test_patch_fuses_a_silu_gated_mlp_into_one_gated_call_with_the_same_parameters(monkeypatch, make) -> None:
    torch.manual_seed(0)
    mlp = make().to(DEVICE)
    params = dict(mlp.named_parameters())
    state = {name: t.clone() for name, t in mlp.state_dict().items()}
    x = torch.randn(3, 5, 16, device=DEVICE)
    with torch.no_grad():
        expected = mlp(x)
    calls = _gated_calls(monkeypatch)
    kernels.patch(mlp, everywhere=True)
    assert isinstance(mlp, kernels.nn.FusedMLP) and isinstance(mlp, make)
    assert dict(mlp.named_parameters()) == params  # the very same objects
    assert mlp.state_dict().keys() == state.keys()
    assert all(torch.equal(mlp.state_dict()[name], t) for name, t in state.items())
    with torch.no_grad():
        got = mlp(x)
    # The 15 rows against [Wg Wu]^T (a signature's first call on a GPU also runs its graph winner, to warm it).
    assert calls and set(calls) == {((15, 16), (16, 48))}
    assert _error(got, expected) < FP32_TOLERANCE
    kernels.unpatch(mlp)
    assert type(mlp) is make
    with torch.no_grad():
        assert _error(mlp(x), expected) < FP32_TOLERANCE


def test_patch_leaves_an_mlp_of_another_activation_or_with_no_telling_weights_as_it_is() -> None:
    torch.manual_seed(0)
    gelu = LlamaMLP(act=torch.nn.GELU()).to(DEVICE)
    zeros = LlamaMLP().to(DEVICE)
    torch.nn.init.zeros_(zeros.gate_proj.weight)  # silu(0) = gelu(0): the check cannot tell, so no fusion
    biased = LlamaMLP().to(DEVICE)
    biased.gate_proj.bias = torch.nn.Parameter(torch.zeros(24, device=DEVICE))  # gated_matmul takes no bias
    x = torch.randn(4, 16, device=DEVICE)
    for mlp in (gelu, zeros, biased):
        with torch.no_grad():
            expected = mlp(x)
        kernels.patch(mlp, everywhere=True)
        assert not isinstance(mlp, kernels.nn.FusedMLP) and type(mlp) is LlamaMLP
        assert type(mlp.gate_proj) is kernels.nn.Linear  # its Linears are patched all the same
        with torch.no_grad():
            assert _error(mlp(x), expected) < FP32_TOLERANCE


def test_patch_leaves_the_callers_random_stream_as_it_was() -> None:
    mlp = LlamaMLP().to(DEVICE)
    torch.manual_seed(1)
    expected = torch.rand(4)
    torch.manual_seed(1)
    kernels.patch(mlp, everywhere=True)
    assert isinstance(mlp, kernels.nn.FusedMLP)
    assert torch.equal(torch.rand(4), expected)


def test_a_fused_mlp_trains_through_its_own_forward_with_torchs_gradients(monkeypatch) -> None:
    torch.manual_seed(0)
    mlp = LlamaMLP().to(DEVICE)
    reference = copy.deepcopy(mlp)
    kernels.patch(mlp, everywhere=True)
    calls = _gated_calls(monkeypatch)
    x = torch.randn(6, 16, device=DEVICE)
    mlp(x).square().sum().backward()
    reference(x).square().sum().backward()
    assert calls == []  # a gradient for the weights is wanted: the module's own forward ran
    for name, p in reference.named_parameters():
        assert _error(dict(mlp.named_parameters())[name].grad, p.grad) < FP32_TOLERANCE, name
    # Frozen weights (a gradient for x only): the gated call, and x's gradient is torch's.
    for p in (*mlp.parameters(), *reference.parameters()):
        p.requires_grad_(False)
    xs = [x.clone().requires_grad_() for _ in range(2)]
    mlp(xs[0]).square().sum().backward()
    reference(xs[1]).square().sum().backward()
    assert calls
    assert _error(xs[0].grad, xs[1].grad) < FP32_TOLERANCE


def test_a_fused_mlp_follows_a_cast_new_weights_a_copy_and_a_pickle() -> None:
    torch.manual_seed(0)
    mlp = LlamaMLP().to(DEVICE)
    kernels.patch(mlp, everywhere=True)
    x = torch.randn(5, 16, device=DEVICE)

    def check(module: torch.nn.Module, tolerance: float = FP32_TOLERANCE) -> None:
        plain = LlamaMLP().to(device=DEVICE, dtype=module.gate_proj.weight.dtype)
        plain.load_state_dict(module.state_dict())
        xx = x.to(module.gate_proj.weight.dtype)
        with torch.no_grad():
            assert _error(module(xx), plain(xx)) < tolerance

    # New weights loaded in place, and new Parameters assigned: both are what the next call reads.
    with torch.no_grad():
        mlp.load_state_dict({k: torch.randn_like(v) for k, v in mlp.state_dict().items()})
    check(mlp)
    mlp.load_state_dict({k: torch.randn_like(v) for k, v in mlp.state_dict().items()}, assign=True)
    check(mlp)
    mlp.up_proj.weight.data = torch.randn_like(mlp.up_proj.weight)  # new data under the same Parameter
    check(mlp)
    # Under inference_mode new weights are not stacked (the Parameters' data would become inference
    # tensors): the module's own forward runs, and the next call outside stacks them.
    mlp.gate_proj.weight.data = torch.randn_like(mlp.gate_proj.weight)
    with torch.inference_mode():
        check(mlp)
    assert mlp.gate_proj.weight.data_ptr() != mlp.up_proj.weight.data_ptr() - mlp.gate_proj.weight.nbytes
    check(mlp)
    assert mlp.gate_proj.weight.data_ptr() == mlp.up_proj.weight.data_ptr() - mlp.gate_proj.weight.nbytes
    mlp.half()
    assert mlp.gate_proj.weight.dtype == torch.float16 and isinstance(mlp, kernels.nn.FusedMLP)
    check(mlp, FP16_TOLERANCE)
    copied = copy.deepcopy(mlp)
    assert type(copied) is LlamaMLP  # a copy is of the module's own class (patch it again)
    check(copied, FP16_TOLERANCE)
    pickled = pickle.loads(pickle.dumps(mlp))
    assert type(pickled) is LlamaMLP
    check(pickled, FP16_TOLERANCE)
    assert isinstance(mlp, kernels.nn.FusedMLP)  # pickling left the original fused
    check(mlp, FP16_TOLERANCE)


def test_patch_without_fuse_mlp_keeps_the_gated_mlps_forward() -> None:
    mlp = LlamaMLP().to(DEVICE)
    kernels.patch(mlp, fuse_mlp=False, everywhere=True)
    assert type(mlp) is LlamaMLP and type(mlp.gate_proj) is kernels.nn.Linear


def test_patch_says_what_it_patched_and_fused(caplog) -> None:
    model = torch.nn.Sequential(LlamaMLP(), LlamaMLP(act=torch.nn.GELU()), torch.nn.Linear(16, 16)).to(DEVICE)
    with caplog.at_level("INFO", logger="kernels.nn"):
        kernels.patch(model, everywhere=True)
    assert "7 nn.Linear patched, 1 SiLU-gated MLPs fused" in caplog.text


def test_a_float64_gated_mlp_is_left_to_torch() -> None:
    """The kernels take no float64: patch leaves the MLP and its Linears as they were (torch runs them
    anyway), and the model computes at float64's precision."""
    torch.manual_seed(0)
    mlp = LlamaMLP().to(DEVICE, torch.float64)
    x = torch.randn(3, 16, device=DEVICE, dtype=torch.float64)
    with torch.no_grad():
        expected = mlp(x)
        kernels.patch(mlp, everywhere=True)
        got = mlp(x)
    assert not isinstance(mlp, kernels.nn.FusedMLP)
    assert all(type(m) is torch.nn.Linear for m in mlp.modules() if isinstance(m, torch.nn.Linear))
    assert got.dtype == torch.float64 and _error(got, expected) < 1e-12


def test_a_fused_mlp_whose_weight_is_parametrized_since_runs_its_own_forward(monkeypatch) -> None:
    """A parametrization computes the weight on every call: there is no storage to stack, so the module's own
    forward runs, and computes with the parametrized weight."""
    torch.manual_seed(0)
    mlp = LlamaMLP().to(DEVICE)
    kernels.patch(mlp, everywhere=True)
    plain = LlamaMLP().to(DEVICE)
    plain.load_state_dict(mlp.state_dict())

    class Doubled(torch.nn.Module):
        def forward(self, w: torch.Tensor) -> torch.Tensor:
            return 2 * w

    for module in (mlp, plain):
        torch.nn.utils.parametrize.register_parametrization(module.gate_proj, "weight", Doubled())
    calls = _gated_calls(monkeypatch)
    x = torch.randn(4, 16, device=DEVICE)
    with torch.no_grad():
        assert _error(mlp(x), plain(x)) < FP32_TOLERANCE
    assert calls == []
