"""The PyTorch layer's answers where a reviewer found them wrong: inference_mode, hooks and replaced children of a
fused MLP, training mode and extra arguments, grad mode between projections, new weight data at the same
address, the meta device, ``matmul_bias``'s bias and autograd of direct calls, and ``moe_matmul``'s rows past
the last expert on its baseline path.

On the CPU these run the kernels under the interpreter, in float32 (float16 for moe_matmul); the same tests run
on the GPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import kernels
import kernels.nn
from _helpers import DEVICE, LlamaMLP, relative_error as _error
from kernels import moe
from kernels._spec import BASELINE

FP32_TOLERANCE = 1e-4
FP16_TOLERANCE = 1e-2  # relative L2 error of fp16 outputs against a float32 reference


class _Projections(nn.Module):
    """An attention's three projections of one input, returned as they are."""

    def __init__(self, hidden: int = 8, bias: bool = False) -> None:
        super().__init__()
        self.q_proj = nn.Linear(hidden, hidden, bias=bias)
        self.k_proj = nn.Linear(hidden, 4, bias=bias)
        self.v_proj = nn.Linear(hidden, 4, bias=bias)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.q_proj(x), self.k_proj(x), self.v_proj(x)


def _matmul_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    """The (a, b) shapes of each kernels.matmul and kernels.matmul_bias call from here on (spies: the calls run)."""
    calls: list[tuple] = []
    for name in ("matmul", "matmul_bias"):
        real = getattr(kernels, name)

        def spy(a, b, *rest, real=real, **kwargs):
            calls.append((tuple(a.shape), tuple(b.shape)))
            return real(a, b, *rest, **kwargs)

        monkeypatch.setattr(kernels, name, spy)
        monkeypatch.setattr(kernels._eager, name, spy)  # where the operators look it up, per call
    return calls


def _patched_projections(bias: bool) -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(0)
    module = _Projections(bias=bias).to(DEVICE)
    plain = _Projections(bias=bias).to(DEVICE)
    plain.load_state_dict(module.state_dict())
    return kernels.patch(module, everywhere=True), plain


# ------------------------------------------------------------------------------------------ q, k and v

@pytest.mark.parametrize("bias", [False, True])
def test_qkv_projections_under_inference_mode_run_one_stacked_gemm(monkeypatch, bias) -> None:
    module, plain = _patched_projections(bias)
    calls = _matmul_calls(monkeypatch)
    for _ in range(2):
        x = torch.randn(2, 3, 8, device=DEVICE)
        with torch.inference_mode():
            got = module(x)
            want = plain(x)
        assert all(_error(g, w) < FP32_TOLERANCE for g, w in zip(got, want))
    # One [6, 8] @ [8, 16] per forward (a signature's first call on a GPU also runs its graph winner).
    assert set(calls) == {((6, 8), (8, 16))}
    assert module.q_proj.__dict__["_shared"].fusing


def test_an_inference_tensor_input_is_served_by_identity() -> None:
    module, plain = _patched_projections(bias=False)
    with torch.inference_mode():
        x = torch.randn(3, 8, device=DEVICE)  # an inference tensor: it has no version counter
        got, want = module(x), plain(x)
    assert all(_error(g, w) < FP32_TOLERANCE for g, w in zip(got, want))


def test_a_biased_group_holds_its_joint_weights_right_after_patch() -> None:
    """The biases move into their joint storage before their addresses are kept: the group's check then
    finds its joint weights current, and under inference_mode (where nothing is stacked again) it fuses."""
    module, _ = _patched_projections(bias=True)
    group = module.q_proj.__dict__["_shared"]
    assert kernels.nn._holds(group.joint, kernels.nn._member_params(group.members))


def test_a_member_called_under_grad_mode_does_not_take_a_product_made_without_it() -> None:
    """q and k under no_grad (stop-gradient scores), v with its weight trained: v's gradient must arrive."""

    class Attention(_Projections):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            with torch.no_grad():
                scores = (self.q_proj(x) @ self.k_proj(x).t()).softmax(-1)
            return scores @ self.v_proj(x)

    torch.manual_seed(0)
    module = Attention(bias=False).to(DEVICE)
    module.k_proj = nn.Linear(8, 8, bias=False).to(DEVICE)
    module.v_proj = nn.Linear(8, 8, bias=False).to(DEVICE)
    plain = Attention(bias=False).to(DEVICE)
    plain.k_proj, plain.v_proj = nn.Linear(8, 8, bias=False).to(DEVICE), nn.Linear(8, 8, bias=False).to(DEVICE)
    plain.load_state_dict(module.state_dict())
    kernels.patch(module, everywhere=True)
    x = torch.randn(3, 8, device=DEVICE)
    module(x).sum().backward()
    plain(x).sum().backward()
    assert module.v_proj.weight.grad is not None
    assert _error(module.v_proj.weight.grad, plain.v_proj.weight.grad) < FP32_TOLERANCE


def test_an_in_place_write_into_v_keeps_the_backward_of_q_and_k() -> None:
    """Frozen projections, a gradient for x: q, k and v are handed out as tensors of their own, not views of
    one output sharing its version counter."""

    class Attention(_Projections):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
            scores = (q @ k.transpose(-1, -2)).softmax(-1)  # saves q and k for the backward
            v.mul_(0.5)
            return scores @ v

    torch.manual_seed(0)
    module = Attention().to(DEVICE).requires_grad_(False)
    module.k_proj = nn.Linear(8, 8, bias=False).to(DEVICE).requires_grad_(False)
    module.v_proj = nn.Linear(8, 8, bias=False).to(DEVICE).requires_grad_(False)
    x = torch.randn(2, 3, 8, device=DEVICE, requires_grad=True)
    module(x).sum().backward()
    want, x.grad = x.grad.clone(), None
    kernels.patch(module, everywhere=True)
    module(x).sum().backward()
    assert _error(x.grad, want) < FP32_TOLERANCE


# ------------------------------------------------------------------------------------------ gated MLPs

def _patched_mlp(module: nn.Module | None = None) -> nn.Module:
    torch.manual_seed(0)
    module = (module if module is not None else LlamaMLP()).to(DEVICE)
    kernels.patch(module, everywhere=True)
    assert isinstance(module, kernels.nn.FusedMLP)
    return module


def _formula(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return module.down_proj(F.silu(module.gate_proj(x)) * module.up_proj(x))


def test_a_forward_hook_on_the_up_projection_still_runs_after_patch() -> None:
    torch.manual_seed(0)
    module = LlamaMLP().to(DEVICE)
    calls = []
    module.up_proj.register_forward_hook(lambda mod, args, out: (calls.append(1), out * 2)[1])
    x = torch.randn(3, 16, device=DEVICE)
    with torch.no_grad():
        want = module(x)
    kernels.patch(module, everywhere=True)
    assert isinstance(module, kernels.nn.FusedMLP)
    calls.clear()
    with torch.no_grad():
        got = module(x)
    assert calls == [1] and _error(got, want) < FP32_TOLERANCE


def test_hooks_added_after_patch_and_global_hooks_run_too() -> None:
    module = _patched_mlp()
    x = torch.randn(3, 16, device=DEVICE)
    seen = []
    handle = module.gate_proj.register_forward_pre_hook(lambda mod, args: seen.append("gate"))
    with torch.no_grad():
        module(x)
    handle.remove()
    handle = nn.modules.module.register_module_forward_hook(lambda mod, args, out: seen.append(type(mod).__name__))
    try:
        with torch.no_grad():
            module(x)
    finally:
        handle.remove()
    assert seen[0] == "gate" and seen.count("Linear") == 3  # gate, up and down, each seen by the global hook


def test_a_child_replaced_after_patch_by_an_adapter_runs() -> None:
    """A LoRA-style Linear subclass put in place of the up projection after patch: its forward runs, and
    its adapter Parameters get their gradient."""

    class LoRALinear(nn.Linear):
        def __init__(self, base: nn.Linear, rank: int = 2) -> None:
            super().__init__(base.in_features, base.out_features, bias=False, device=base.weight.device)
            self.weight = base.weight
            self.A = nn.Parameter(torch.randn(rank, base.in_features, device=base.weight.device))
            self.B = nn.Parameter(torch.randn(base.out_features, rank, device=base.weight.device))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return F.linear(x, self.weight) + (x @ self.A.t()) @ self.B.t()

    module = _patched_mlp().requires_grad_(False)
    module.up_proj = LoRALinear(module.up_proj)
    x = torch.randn(3, 16, device=DEVICE)
    got = module(x)
    assert _error(got, _formula(module, x)) < FP32_TOLERANCE
    got.sum().backward()
    assert module.up_proj.A.grad is not None


def test_a_module_patched_in_eval_mode_keeps_its_dropout_in_train_mode() -> None:
    class FeedForward(nn.Module):  # llama2.c's FeedForward
        def __init__(self) -> None:
            super().__init__()
            self.w1, self.w2, self.w3 = nn.Linear(8, 16, bias=False), nn.Linear(16, 8, bias=False), \
                nn.Linear(8, 16, bias=False)
            self.dropout = nn.Dropout(0.5)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.dropout(self.w2(F.silu(self.w1(x)) * self.w3(x)))

    module = _patched_mlp(FeedForward().eval())
    x = torch.randn(16, 8, device=DEVICE)
    module.train().requires_grad_(False)
    torch.manual_seed(7)  # seeds the GPU's generator too, which dropout draws from there
    got = module(x)
    torch.manual_seed(7)
    want = FeedForward.forward(module, x)
    assert torch.equal(got == 0, want == 0) and bool((got == 0).any())
    module.eval()
    with torch.no_grad():
        assert _error(module(x), module.w2(F.silu(module.w1(x)) * module.w3(x))) < FP32_TOLERANCE


def test_a_module_patched_in_train_mode_without_dropout_stays_fused_in_both_modes(monkeypatch) -> None:
    module = _patched_mlp(LlamaMLP().train())
    assert module.__dict__["_fused_modes"] == {False, True}
    calls = []
    real = kernels.gated_matmul

    def spy(a, b):
        return calls.append(1) or real(a, b)

    monkeypatch.setattr(kernels, "gated_matmul", spy)
    monkeypatch.setattr(kernels._eager, "gated_matmul", spy)  # where the operators look it up, per call
    x = torch.randn(3, 16, device=DEVICE)
    with torch.no_grad():
        module(x)  # on a GPU a signature's first call runs once more, in graph mode (ops._call): not counted
        calls.clear()
        module(x)
        module.eval()
        module(x)
    assert calls == [1, 1]


def test_a_forward_with_more_arguments_runs_with_them() -> None:
    class ScaledMLP(LlamaMLP):
        def forward(self, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
            return super().forward(x) * scale

    module = _patched_mlp(ScaledMLP())
    x = torch.randn(3, 16, device=DEVICE)
    with torch.no_grad():
        want = _formula(module, x) * 2.0
        assert _error(module(x, scale=2.0), want) < FP32_TOLERANCE
        assert _error(module(x, 2.0), want) < FP32_TOLERANCE
        assert _error(module(x), want / 2) < FP32_TOLERANCE


def test_the_fused_check_leaves_the_callers_random_stream_and_flags_as_they_were() -> None:
    module = LlamaMLP().train()
    module.act_fn.eval()  # a mixed set of flags, restored as it was
    rng = torch.get_rng_state()
    kernels.patch(module, everywhere=True)
    assert torch.equal(torch.get_rng_state(), rng)
    assert module.training and not module.act_fn.training and module.gate_proj.training


# ------------------------------------------------------------------------------------------ Linear

def test_new_weight_data_at_the_same_address_gets_a_new_transposed_weight() -> None:
    torch.manual_seed(0)
    layer = kernels.patch(nn.Linear(8, 4, bias=False).to(DEVICE), everywhere=True)
    x = torch.randn(2, 8, device=DEVICE)
    with torch.no_grad():
        layer(x)
        layer.weight.data = layer.weight.data[:2]  # the first two output rows: the same address
        layer.out_features = 2
        assert _error(layer(x), F.linear(x, layer.weight)) < FP32_TOLERANCE
    square = kernels.patch(nn.Linear(8, 8, bias=False).to(DEVICE), everywhere=True)
    with torch.no_grad():
        square(x)
        square.weight.data = square.weight.data.t()  # the same address and shape, other strides
        assert _error(square(x), F.linear(x, square.weight)) < FP32_TOLERANCE


def test_a_qkv_group_restacks_after_new_data_at_the_same_address() -> None:
    module, plain = _patched_projections(bias=False)
    x = torch.randn(3, 8, device=DEVICE)
    with torch.no_grad():
        module(x)
        for m in (module, plain):
            m.q_proj.weight.data = m.q_proj.weight.data.t()  # square: same address and shape
        got, want = module(x), plain(x)
    assert all(_error(g, w) < FP32_TOLERANCE for g, w in zip(got, want))


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("grad", [False, True])
def test_a_patched_model_runs_on_the_meta_device(bias, grad) -> None:
    layer = kernels.patch(nn.Sequential(nn.Linear(8, 4, bias=bias), LlamaMLP(4, 6)), everywhere=True).to("meta")
    x = torch.randn(2, 3, 8, device="meta")
    with torch.set_grad_enabled(grad):
        y = layer(x)
    assert y.device.type == "meta" and y.shape == (2, 3, 4)


# ------------------------------------------------------------------------------------------ epilogues

@pytest.mark.parametrize("bias_of", [lambda: torch.randn(4, 6), lambda: torch.randn(1, 6),
                                     lambda: torch.randn(6).half()], ids=["MxN", "1xN", "fp16"])
def test_matmul_bias_takes_one_bias_row_in_as_dtype_on_every_path(bias_of) -> None:
    from kernels import epilogue
    from kernels._device import current_device

    a, b, bias = torch.randn(4, 8, device=DEVICE), torch.randn(8, 6, device=DEVICE), bias_of().to(DEVICE)
    with pytest.raises(epilogue.BiasError, match="matmul_bias: bias .*pass"):
        kernels.matmul_bias(a, b, bias)
    kernels.matmul_bias(a, b, torch.randn(6, device=DEVICE))  # the signature known: its fast paths
    with pytest.raises(epilogue.BiasError, match="matmul_bias: bias .*pass"):
        kernels.matmul_bias(a, b, bias)
    config = epilogue.default_config(epilogue.MATMUL_BIAS.problem_of(a, b), current_device(a.device))
    with pytest.raises(epilogue.BiasError, match="matmul_bias: bias .*pass"):
        epilogue.matmul_bias_with(config, a, b, bias)


def test_direct_epilogue_calls_keep_autograd() -> None:
    torch.manual_seed(0)
    a = torch.randn(4, 8, device=DEVICE, requires_grad=True)
    b = torch.randn(8, 6, device=DEVICE, requires_grad=True)
    bias = torch.randn(6, device=DEVICE, requires_grad=True)
    kernels.matmul_bias(a, b, bias).square().sum().backward()
    grads = [t.grad for t in (a, b, bias)]
    for t in (a, b, bias):
        t.grad = None
    torch.addmm(bias, a, b).square().sum().backward()
    assert all(g is not None and _error(g, t.grad) < FP32_TOLERANCE for g, t in zip(grads, (a, b, bias)))
    w = torch.randn(8, 12, device=DEVICE, requires_grad=True)
    a.grad = None
    kernels.gated_matmul(a, w).sum().backward()
    got = a.grad.clone(), w.grad.clone()
    a.grad = w.grad = None
    gate, up = (a @ w).chunk(2, dim=-1)
    (F.silu(gate) * up).sum().backward()
    assert _error(got[0], a.grad) < FP32_TOLERANCE and _error(got[1], w.grad) < FP32_TOLERANCE
    with torch.no_grad():
        assert not kernels.matmul_bias(a, b, bias).requires_grad


# ------------------------------------------------------------------------------------------ moe_matmul

def test_moe_matmul_on_its_baseline_leaves_rows_past_the_last_expert_alone() -> None:
    torch.manual_seed(0)
    x = torch.randn(6, 8, dtype=torch.float16, device=DEVICE, requires_grad=True)
    w = torch.randn(2, 8, 4, dtype=torch.float16, device=DEVICE)
    offsets = torch.tensor([2, 4], dtype=torch.int32, device=DEVICE)  # rows 4 and 5 go to no expert
    want = torch.cat([x[:2] @ w[0], x[2:4] @ w[1]]).detach().float()
    with moe.pinning([BASELINE], x, w) as installers:
        installers[0]()
        for _ in range(20):  # dirty the allocator: a fresh torch.empty shows what it held
            torch.full((6, 4), 7.0, dtype=torch.float16, device=DEVICE)
        out = torch.full((6, 4), -1.0, dtype=torch.float16, device=DEVICE)
        torch.ops.triton_tuner.moe_matmul_out(x.detach(), w, offsets, out)
        assert torch.equal(out[4:], torch.full((2, 4), -1.0, dtype=torch.float16, device=DEVICE))
        assert _error(out[:4], want) < FP16_TOLERANCE
        y = torch.ops.triton_tuner.moe_matmul(x, w, offsets, False)
        assert torch.equal(y[4:].detach(), torch.zeros(2, 4, dtype=torch.float16, device=DEVICE))
        y.backward(torch.ones_like(y))
    assert torch.equal(x.grad[4:], torch.zeros(2, 8, dtype=torch.float16, device=DEVICE))
    fresh = moe.launch(BASELINE, x.detach(), w, offsets)
    assert torch.equal(fresh[4:], torch.zeros(2, 4, dtype=torch.float16, device=DEVICE))


def test_a_hook_on_the_activation_and_an_activation_replaced_after_patch_are_honoured() -> None:
    """The fused call skips the activation module: a hook that records the MLP's activations sees every call
    only if the MLP then runs its own forward, and an activation swapped for another computes another formula."""
    module = _patched_mlp()
    x = torch.randn(3, 16, device=DEVICE)
    seen = []
    handle = module.act_fn.register_forward_hook(lambda mod, args, out: seen.append(out.shape))
    with torch.no_grad():
        got = module(x)
    handle.remove()
    assert seen == [(3, 24)] and _error(got, _formula(module, x)) < FP32_TOLERANCE
    module.act_fn = nn.GELU()
    with torch.no_grad():
        got = module(x)
        want = module.down_proj(F.gelu(module.gate_proj(x)) * module.up_proj(x))
    assert _error(got, want) < FP32_TOLERANCE
    module.extra = nn.Identity()  # a child added since: not the module the check ran on
    with torch.no_grad():
        assert _error(module(x), want) < FP32_TOLERANCE
