"""transformers 5 models on the tuned kernels: real model classes from tiny configs, random weights.

``kernels.patch`` changes the modules it should (Linears, SiLU-gated MLPs, query/key/value groups, the
routed experts through the "triton_tuner" experts implementation) and the patched model computes what the
vanilla one does; record mode sees every kernel a patched model runs. On the CPU the kernels run under
Triton's interpreter (fp32 for dense models, fp16 for MoE: moe_matmul takes fp16/bf16; bf16 dot products are
wrong under the interpreter).
"""

from __future__ import annotations

import copy
import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from _helpers import DEVICE, relative_error

import kernels
from kernels._record_mode import RECORDER
from kernels.nn import FusedMLP, FusedRMSNorm, Linear, SharedInputLinear, sort_by_expert

if os.environ.get("CI"):
    import transformers  # CI installs the [hf] extra (scripts/setup.sh): a missing one fails, not skips
else:
    transformers = pytest.importorskip("transformers", minversion="5")

from kernels import hf  # noqa: E402  (needs transformers)

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import compile_host_cost  # noqa: E402  (scripts/ is not a package: its list of Python-checked guards)

# One layer, widths that keep each model's own constraints (heads x head_dim, rope dims); ids within vocab.
_COMMON = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
               num_key_value_heads=1, head_dim=16, vocab_size=64, max_position_embeddings=64,
               pad_token_id=0, bos_token_id=0, eos_token_id=0)
_EXPERTS = dict(num_experts_per_tok=2, moe_intermediate_size=32)
_DEEPSEEK = dict(_EXPERTS, n_routed_experts=4, n_shared_experts=1, first_k_dense_replace=0, n_group=1,
                 topk_group=1, kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=8, qk_nope_head_dim=8,
                 v_head_dim=16, head_dim=8)

# name -> (config class, model class, config overrides, whether its MLP is SiLU-gated)
DENSE = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}, True),
    "mistral": ("MistralConfig", "MistralForCausalLM", {}, True),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}, True),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {}, True),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", {}, False),  # GELU-gated: its Linears only
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", {}, False),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {}, True),  # one stacked gate_up_proj
    "glm": ("GlmConfig", "GlmForCausalLM", {}, True),
}
MOE = {
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", dict(num_local_experts=4, num_experts_per_tok=2)),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(_EXPERTS, num_experts=4)),
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM",
                  dict(_EXPERTS, num_experts=4, shared_expert_intermediate_size=64)),
    "deepseek_v2": ("DeepseekV2Config", "DeepseekV2ForCausalLM", _DEEPSEEK),
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM", _DEEPSEEK),
}

# Relative L2 error of the patched logits to the vanilla ones: fp32 kernels against torch's fp32 (about 1e-6
# measured here), fp16 ones against torch's fp16 (about 1e-3: another summation order in half precision).
TOLERANCE = {torch.float32: 1e-4, torch.float16: 1e-2}


def build(spec: tuple, dtype: torch.dtype, seed: int = 0) -> torch.nn.Module:
    config_name, model_name, overrides = spec[:3]
    config = getattr(transformers, config_name)(**{**_COMMON, **overrides})
    torch.manual_seed(seed)
    return getattr(transformers, model_name)(config).to(dtype=dtype, device=DEVICE).eval()


def tokens(seed: int = 1, length: int = 8) -> torch.Tensor:
    return torch.randint(1, 64, (1, length), generator=torch.Generator().manual_seed(seed)).to(DEVICE)


def logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits


@pytest.fixture(autouse=True)
def fresh_dispatch(own_database: None) -> Iterator[None]:
    """No shipped table and a fresh dispatch cache: every test resolves its own problems."""
    kernels.clear_cache()
    yield
    kernels.clear_cache()


@pytest.mark.parametrize("name", list(DENSE))
def test_patch_swaps_every_linear_fuses_silu_mlps_and_keeps_the_logits(name: str) -> None:
    model = build(DENSE[name], torch.float32)
    ids = tokens()
    want = logits(model, ids)
    norms = [m for m in model.modules() if type(m).__name__.endswith("RMSNorm")]
    kernels.patch(model, everywhere=True)
    layer = model.model.layers[0]
    assert not [n for n, m in model.named_modules() if type(m) is torch.nn.Linear]
    assert isinstance(model.lm_head, Linear)
    assert isinstance(layer.mlp, FusedMLP) == DENSE[name][3]
    if hasattr(layer.self_attn, "q_proj"):  # Phi-3 has one stacked qkv_proj
        assert type(layer.self_attn.k_proj) is SharedInputLinear
    # every RMSNorm (Qwen3's per-head q and k norms too) in one launch, in its family's formula
    assert len(norms) >= 3 and all(isinstance(m, FusedRMSNorm) for m in norms)
    assert {m.__dict__["_formula"].name for m in norms} == {"gemma" if name.startswith("gemma") else "llama"}
    got = logits(model, ids)
    assert relative_error(got, want) < TOLERANCE[torch.float32]
    kernels.unpatch(model)
    assert not isinstance(layer.mlp, FusedMLP) and type(model.lm_head) is torch.nn.Linear
    assert not any(isinstance(m, FusedRMSNorm) for m in model.modules())


# The families whose apply_rotary_pos_emb is rotate_half's formula on the whole head, laid out as q is. Phi-3's
# concatenates a rotated part and a passed-through one (a contiguous output), GLM's rotates interleaved pairs of
# a partial head, DeepSeek-V2's multiplies complex numbers: each keeps its own.
ROTATE_HALF = {"llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "mixtral", "qwen3_moe", "qwen2_moe",
               "deepseek_v3"}
# DeepSeek-V3's attention names it, but with rope_interleave (its config's default) calls an interleaved one
CALLS_ROTATE_HALF = ROTATE_HALF - {"deepseek_v3"}


@pytest.mark.parametrize("name", list(DENSE) + list(MOE))
def test_rotary_embeddings_run_in_one_launch_with_the_same_logits_bit_for_bit(name: str) -> None:
    from kernels import rope

    model = build({**DENSE, **MOE}[name], torch.float16)
    unpatched = build({**DENSE, **MOE}[name], torch.float16, seed=1)  # the same class, left as it is
    modeling = sys.modules[type(model).__module__]
    own = getattr(modeling, "apply_rotary_pos_emb", None)
    own = getattr(own, "__wrapped__", own)  # an earlier patch in this process put the stand-in there
    ids = tokens()
    unpatched_logits, vanilla_logits = logits(unpatched, ids), logits(model, ids)
    # Norms and MLPs left, no table's evidence for the Linears: the rest of the model is patched alike in both
    # runs (a MoE model's experts switch on the CPU), so only the rotary changes.
    lean = dict(fuse_mlp=False, fuse_qkv=False, fuse_norm=False, fuse_router=False)
    kernels.patch(model, fuse_rotary=False, **lean)
    want = logits(model, ids)
    kernels.patch(model, **lean)
    attention = [m for m in model.modules() if isinstance(m, hf.RotaryAttention)]
    assert len(attention) == (name in ROTATE_HALF)  # one layer, one attention module
    rope._LAUNCHES.clear()
    assert torch.equal(logits(unpatched, ids), unpatched_logits)
    assert len(rope._LAUNCHES) == 0  # an unpatched model of the class keeps torch's ops
    got = logits(model, ids)
    if name in ROTATE_HALF:
        stand_in = modeling.apply_rotary_pos_emb
        assert stand_in.fused_by_kernels and stand_in.__wrapped__ is own
        assert (len(rope._LAUNCHES) > 0) == (name in CALLS_ROTATE_HALF)  # the kernel ran, in place of torch's ops
    assert torch.equal(got, want)  # float16: the kernel's bits are torch's
    kernels.patch(model, **lean)  # patching again mixes nothing in twice, and keeps one stand-in
    assert getattr(getattr(modeling, "apply_rotary_pos_emb", None), "__wrapped__", own) is own
    kernels.unpatch(model)
    assert not any(isinstance(m, hf.RotaryAttention) for m in model.modules())
    rope._LAUNCHES.clear()
    assert torch.equal(logits(model, ids), vanilla_logits) and len(rope._LAUNCHES) == 0


# The routers whose forward is a softmax, top-k and (Mixtral, and Qwen's with norm_topk_prob) renormalization.
# DeepSeek-V3's adds a correction bias (a buffer) to sigmoid scores; DeepSeek-V2's in half precision computes
# in float32 from rows it casts (in a float32 model it is a softmax and a top-k, scaled by 1.0 here).
TOP_K_ROUTERS = {("mixtral", torch.float16), ("qwen3_moe", torch.float16), ("qwen2_moe", torch.float16),
                 ("mixtral", torch.float32), ("qwen3_moe", torch.float32), ("qwen2_moe", torch.float32),
                 ("deepseek_v2", torch.float32)}


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("name", list(MOE))
def test_top_k_routers_run_in_one_launch_and_keep_the_logits(name: str, dtype: torch.dtype) -> None:
    from kernels import _routing

    model = build(MOE[name], dtype)
    ids = tokens()
    lean = dict(fuse_mlp=False, fuse_qkv=False, fuse_norm=False, fuse_rotary=False)
    kernels.patch(model, fuse_router=False, **lean)  # the experts switch alike in both runs
    want = logits(model, ids)
    _routing._ROUTERS.clear()
    kernels.patch(model, **lean)
    routers = [m for m in model.modules() if isinstance(m, hf.FusedTopKRouter)]
    assert len(routers) == ((name, dtype) in TOP_K_ROUTERS)
    got = logits(model, ids)
    if routers:
        assert len(_routing._ROUTERS) > 0  # the kernel ran
        formula = routers[0].__dict__["_router_formula"]
        assert formula.renormalize == (name == "mixtral" or bool(getattr(model.config, "norm_topk_prob", False)))
        assert formula.scores_in_float32 == (name == "mixtral" and dtype == torch.float16)
    assert relative_error(got, want) <= (0.0 if dtype == torch.float16 else 1e-6)
    kernels.unpatch(model)
    assert not any(isinstance(m, hf.FusedTopKRouter) for m in model.modules())


def test_a_fused_router_returns_its_own_forwards_triple_and_falls_back_where_the_kernel_cannot() -> None:
    spec = MOE["qwen3_moe"]
    model = build((spec[0], spec[1], dict(spec[2], num_experts=16, num_experts_per_tok=4, norm_topk_prob=True)),
                  torch.float32)
    router = model.model.layers[0].mlp.gate
    vanilla = copy.deepcopy(router)
    with torch.no_grad():
        router.weight.normal_()
        router.weight[5] = router.weight[3]  # experts 3 and 5 always tie: either may be chosen
    vanilla.load_state_dict(router.state_dict())
    kernels.patch(model)
    assert isinstance(router, hf.FusedTopKRouter)
    x = torch.randn(2, 7, router.hidden_dim, device=DEVICE)
    with torch.no_grad():
        (logits, scores, experts), (want_logits, want_scores, want_experts) = router(x), vanilla(x)
        probabilities = torch.softmax(want_logits, dim=-1)
        assert torch.equal(logits, want_logits)
        # the chosen experts are the most probable, up to equal probabilities; largest first
        assert torch.equal(probabilities.gather(1, experts).sort(dim=1).values,
                           probabilities.gather(1, want_experts).sort(dim=1).values)
        assert torch.allclose(scores, want_scores, rtol=1e-5, atol=1e-7)
        assert bool((scores[:, :-1] >= scores[:, 1:]).all()) and torch.allclose(scores.sum(-1), torch.ones(14, device=DEVICE))
        # its own forward: a router whose top_k changed since patch
        router.top_k = 2
        assert torch.equal(router(x)[2], vanilla.__class__.forward(router, x)[2])
        router.top_k = 4
    # a gradient wanted: its own forward, whose autograd graph reaches the weight
    _, scores, _ = router(x)
    scores.sum().backward()
    assert router.weight.grad is not None and scores.grad_fn is not None
    assert pickle_roundtrip_class(router) is type(vanilla)


@pytest.mark.parametrize("renormalized", [True, False])
def test_a_router_of_many_experts_is_found_renormalized_or_not_as_its_config_says(renormalized: bool) -> None:
    # Qwen3-30B-A3B's router: 128 experts, top-8. At its initial weights (std 0.02) the softmax is near uniform;
    # the patch-time check's random weight must not make it so peaked that both formulas hold.
    spec = MOE["qwen3_moe"]
    model = build((spec[0], spec[1], dict(spec[2], num_experts=128, num_experts_per_tok=8,
                                          norm_topk_prob=renormalized)), torch.float16)
    router = model.model.layers[0].mlp.gate
    vanilla = copy.deepcopy(router)
    kernels.patch(model)
    assert isinstance(router, hf.FusedTopKRouter)
    assert router.__dict__["_router_formula"].renormalize == renormalized
    x = torch.randn(9, router.hidden_dim, device=DEVICE, dtype=torch.float16)
    with torch.no_grad():
        (_, scores, _), (_, want, _) = router(x), vanilla(x)
    assert torch.allclose(scores.float(), want.float(), rtol=1e-2, atol=1e-4)


def test_olmoe_routes_and_rotates_in_one_launch_with_the_same_logits() -> None:
    # OLMoE: a top-k router without renormalization by default, Llama's rotary; not in MOE (its experts are
    # transformers' generic ones, covered there), here for the two fusions alone
    model = build(("OlmoeConfig", "OlmoeForCausalLM", dict(_EXPERTS, num_experts=8)), torch.float16)
    ids = tokens()
    lean = dict(fuse_mlp=False, fuse_qkv=False, fuse_norm=False)
    kernels.patch(model, fuse_rotary=False, fuse_router=False, **lean)
    want = logits(model, ids)
    kernels.patch(model, **lean)
    routers = [m for m in model.modules() if isinstance(m, hf.FusedTopKRouter)]
    assert len(routers) == 1 and not routers[0].__dict__["_router_formula"].renormalize
    assert sum(isinstance(m, hf.RotaryAttention) for m in model.modules()) == 1
    assert torch.equal(logits(model, ids), want)
    kernels.unpatch(model)


def test_a_fused_router_given_rows_of_another_dtype_runs_its_own_forward() -> None:
    model = build(MOE["deepseek_v2"], torch.float32)  # its router casts rows to float32 itself
    router = model.model.layers[0].mlp.gate
    vanilla = copy.deepcopy(router)
    kernels.patch(model)
    assert isinstance(router, hf.FusedTopKRouter)
    x = torch.randn(5, router.hidden_dim, device=DEVICE, dtype=torch.float16)
    with torch.no_grad():
        assert all(torch.equal(a, b) for a, b in zip(router(x), vanilla(x)))


def pickle_roundtrip_class(module: torch.nn.Module) -> type:
    import pickle

    return type(pickle.loads(pickle.dumps(module)))


@pytest.mark.parametrize("name", list(MOE))
def test_patch_puts_routed_experts_on_moe_matmul_and_keeps_the_logits(name: str) -> None:
    model = build(MOE[name], torch.float16)
    ids = tokens()
    want = logits(model, ids)
    before = model.config._experts_implementation
    kernels.patch(model, everywhere=True)
    assert model.config._experts_implementation == hf.IMPLEMENTATION
    mlp = model.model.layers[0].mlp
    shared = getattr(mlp, "shared_experts", None) or getattr(mlp, "shared_expert", None)
    if shared is not None:  # DeepSeek's and Qwen2-MoE's shared experts: a SiLU-gated MLP
        assert isinstance(shared, FusedMLP)
    x = torch.randn(3, 32, dtype=torch.float16, device=DEVICE)
    assert hf._takes(mlp.experts, x)  # our path, not the fallback to transformers' grouped_mm
    got = logits(model, ids)
    assert relative_error(got, want) < TOLERANCE[torch.float16]
    kernels.unpatch(model)
    assert model.config._experts_implementation == before


def test_calls_that_fall_back_run_what_vanilla_runs_in_each_phase_of_generate() -> None:
    """transformers' generate runs "batched_mm" for its decode steps off the CPU where the model is on
    "grouped_mm"; a patched model's name keeps it from switching, so the experts' fallback switches itself."""
    from transformers.integrations.moe import batched_mm_experts_forward, grouped_mm_experts_forward

    assert hf.stock_implementation(True, "cuda") is batched_mm_experts_forward
    assert hf.stock_implementation(False, "cuda") is grouped_mm_experts_forward  # prefill, or a plain forward
    assert hf.stock_implementation(True, "cpu") is grouped_mm_experts_forward  # generate keeps grouped_mm there

    model = build(MOE["qwen3_moe"], torch.float16)
    vanilla_ids = _generate(model)
    kernels.patch(model, everywhere=True)
    experts = model.model.layers[0].mlp.experts
    phases: list[bool] = []
    experts.register_forward_pre_hook(lambda module, args: phases.append(bool(module.__dict__.get(hf._DECODING))))
    patched_ids = _generate(model)
    assert phases[0] is False and phases[1:] and all(phases[1:]), phases  # the prompt, then every decode step
    assert hf._DECODING not in experts.__dict__  # told only while generate decodes
    assert patched_ids.shape == vanilla_ids.shape == (1, 10)  # the prompt and 4 new tokens, both ways
    kernels.unpatch(model)
    assert "_optimize_model_for_decode" not in model.__dict__


def test_decode_steps_whose_routed_weights_are_small_run_batched_mm_as_vanilla_does(monkeypatch,
                                                                                    tmp_path: Path) -> None:
    """In generate's decode steps, where batched_mm's extra passes over the routed experts' weights cost less
    than our path's launches (hf._BATCHED_DECODE_BYTES), the experts run vanilla's decode implementation; past
    that size, or outside decode steps, they take our path (which asks _path)."""
    model = build(MOE["qwen3_moe"], torch.float16)
    experts = model.model.layers[0].mlp.experts
    x, index, weights = _experts_inputs(experts, 1, 2, seed=9)
    expert_bytes = (experts.gate_up_proj[0].numel() + experts.down_proj[0].numel()) * 2
    monkeypatch.setattr(hf, "_BATCHED_DECODE_BYTES", 4 * expert_bytes)
    assert hf._batched_decode_is_cheaper(experts, 4)
    assert not hf._batched_decode_is_cheaper(experts, 5)
    with kernels.recording(f"sqlite:///{tmp_path / 'recorded.db'}"):
        assert not hf._batched_decode_is_cheaper(experts, 4)  # record mode counts our path's calls
    asked = []
    real_path = hf._path
    monkeypatch.setattr(hf, "_path", lambda *a: asked.append(a[1]) or real_path(*a))
    with torch.no_grad():
        hf.experts_forward(experts, x, index, weights)  # not decoding: our path decides
        assert asked == [2]
        experts.__dict__[hf._DECODING] = True
        try:
            got = hf.experts_forward(experts, x, index, weights)  # 2 rows of small experts: vanilla's
            assert asked == [2]
            want = hf.stock_implementation(True, x.device.type)(experts, x, index, weights)
            assert torch.equal(got, want)
            x3, index3, weights3 = _experts_inputs(experts, 3, 2, seed=10)  # 6 rows: past the bytes, ours
            hf.experts_forward(experts, x3, index3, weights3)
            assert asked == [2, 6]
        finally:
            experts.__dict__.pop(hf._DECODING)


def _generate(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model.generate(tokens(length=6), max_new_tokens=4, do_sample=False)


def _experts_inputs(experts: torch.nn.Module, tokens: int, top_k: int, seed: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, experts.gate_up_proj.shape[-1], generator=gen).to(experts.gate_up_proj)
    scores = torch.rand(tokens, experts.num_experts, generator=gen)
    weights, index = torch.topk(scores.softmax(-1), top_k, dim=-1)
    return x, index.to(DEVICE), weights.to(DEVICE)


@pytest.mark.parametrize("name", ["mixtral", "qwen3_moe"])
def test_experts_implementation_registers_by_name_and_matches_an_fp32_reference(name: str) -> None:
    hf.register()
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    assert ALL_EXPERTS_FUNCTIONS[hf.IMPLEMENTATION] is hf.experts_forward
    model = build(MOE[name], torch.float16)
    model.set_experts_implementation(hf.IMPLEMENTATION)  # transformers' own switch, without kernels.patch
    experts = model.model.layers[0].mlp.experts
    # Skewed routing (expert 1 busy, expert 2 idle) and a token count no tile divides.
    x, index, weights = _experts_inputs(experts, 13, 2, seed=3)
    index[:9, 0] = 1
    index[:9, 1] = 0
    index[index == 2] = 3
    with torch.no_grad():
        got = experts(x, index, weights)
    gate_up, down = (p.detach().float().cpu() for p in (experts.gate_up_proj, experts.down_proj))
    want = torch.zeros(x.shape)
    for t in range(x.shape[0]):
        for slot in range(index.shape[1]):
            e = int(index[t, slot])
            gate, up = (gate_up[e] @ x[t].float().cpu()).chunk(2)
            want[t] += float(weights[t, slot]) * (down[e] @ (torch.nn.functional.silu(gate) * up))
    assert got.dtype == torch.float16 and got.shape == x.shape
    assert relative_error(got, want) < TOLERANCE[torch.float16]


def test_patch_leaves_experts_on_an_implementation_chosen_for_the_model() -> None:
    """Only transformers' generic implementations are replaced: a vendor's or the user's own stays."""
    from transformers.integrations.moe import ExpertsInterface, grouped_mm_experts_forward

    ExpertsInterface.register("users_own", grouped_mm_experts_forward)
    model = build(MOE["mixtral"], torch.float16)
    model.set_experts_implementation("users_own")
    kernels.patch(model, everywhere=True)
    assert model.config._experts_implementation == "users_own"
    assert isinstance(model.lm_head, Linear)  # the rest of the model is patched as usual
    kernels.unpatch(model)
    assert model.config._experts_implementation == "users_own"


def test_training_through_the_experts_gives_transformers_gradients() -> None:
    """A loss backward through the patched experts (moe_matmul's backward, torch's gating) reaches the expert
    weights with the gradients transformers' own implementation gives."""
    import copy

    vanilla = build(MOE["mixtral"], torch.float16).train()
    patched = kernels.patch(copy.deepcopy(vanilla), everywhere=True)
    ids = tokens()
    for model in (vanilla, patched):
        model(ids, labels=ids).loss.backward()
    for name in ("gate_up_proj", "down_proj"):
        want = getattr(vanilla.model.layers[0].mlp.experts, name).grad
        got = getattr(patched.model.layers[0].mlp.experts, name).grad
        assert got is not None and float(want.float().norm()) > 0
        assert relative_error(got, want) < TOLERANCE[torch.float16]


def test_experts_decline_what_they_cannot_compute_and_run_transformers_grouped_mm() -> None:
    """float32 experts (moe_matmul takes fp16/bf16): transformers' own implementation, the same result."""
    from transformers.integrations.moe import grouped_mm_experts_forward

    model = build(MOE["mixtral"], torch.float32)
    experts = model.model.layers[0].mlp.experts
    x, index, weights = _experts_inputs(experts, 5, 2, seed=4)
    assert not hf._takes(experts, x)
    with torch.no_grad():
        assert torch.equal(hf.experts_forward(experts, x, index, weights),
                           grouped_mm_experts_forward(experts, x, index, weights))


def test_experts_whose_gemms_both_dispatch_to_the_baseline_run_transformers_grouped_mm(monkeypatch) -> None:
    """The never-slower rule: where dispatch runs torch._grouped_mm for both expert GEMMs and for the fused
    gate/up product (no record says our kernel wins), transformers' own implementation runs them with less host
    work around them. Pinning one GEMM to a Triton config brings our (unfused) path back."""
    from transformers.integrations.moe import grouped_mm_experts_forward

    model = build(MOE["qwen3_moe"], torch.float16)
    experts = model.model.layers[0].mlp.experts
    x, index, weights = _experts_inputs(experts, 5, 2, seed=5)
    ours = []
    monkeypatch.setattr(hf, "sort_by_expert", lambda *a: ours.append(1) or sort_by_expert(*a))
    rows = x.new_empty((10, x.shape[1]))
    gate_up_w, down_w = experts.gate_up_proj.transpose(1, 2), experts.down_proj.transpose(1, 2)
    middle = x.new_empty((10, down_w.shape[1]))
    triton_config = kernels.get_kernel("moe_matmul").default_config(
        kernels.moe.problem_of(rows, gate_up_w, torch.tensor([10] * experts.num_experts, dtype=torch.int32,
                                                             device=rows.device)),
        kernels.current_device(x.device))
    with kernels.moe.pinning([kernels.BASELINE], rows, gate_up_w) as (gate_up_baseline,), \
            kernels.moe_gated.pinning([kernels.BASELINE], rows, gate_up_w) as (fused_baseline,), \
            kernels.moe.pinning([kernels.BASELINE, triton_config], middle, down_w) as (down_baseline, down_triton):
        fused_baseline()  # the fused gate/up problem's too: the rule covers all three
        gate_up_baseline()
        down_baseline()
        with torch.no_grad():
            got = hf.experts_forward(experts, x, index, weights)
            assert not ours
            assert torch.equal(got, grouped_mm_experts_forward(experts, x, index, weights))
            down_triton()
            got = hf.experts_forward(experts, x, index, weights)
        assert ours == [1]
        assert relative_error(got, grouped_mm_experts_forward(experts, x, index, weights)) < TOLERANCE[torch.float16]


def test_inference_keeps_the_weight_views_until_the_weights_change() -> None:
    """The [E, K, N] views of the experts' weights are made once per module, not per call; new data under the
    same Parameter, a new Parameter, or ``.to()`` makes the next call see the new weights (never the old)."""
    from transformers.integrations.moe import grouped_mm_experts_forward

    model = build(MOE["qwen3_moe"], torch.float16)
    experts = model.model.layers[0].mlp.experts
    x, index, weights = _experts_inputs(experts, 5, 2, seed=11)

    def check() -> None:
        with torch.no_grad():
            got = hf.experts_forward(experts, x, index, weights)
            want = grouped_mm_experts_forward(experts, x, index, weights)
            assert relative_error(got, want) < TOLERANCE[torch.float16]

    check()
    kept = experts.__dict__[hf._KEPT]
    check()
    assert experts.__dict__[hf._KEPT] is kept
    with torch.no_grad():
        experts.gate_up_proj.data = torch.randn_like(experts.gate_up_proj)  # new data, same Parameter
    check()
    assert experts.__dict__[hf._KEPT] is not kept
    experts.down_proj = torch.nn.Parameter(torch.randn_like(experts.down_proj))  # a new Parameter
    check()
    model.to(torch.float32)  # .to() drops the views, which would hold the fp16 data
    assert hf._KEPT not in experts.__dict__
    model.to(torch.float16)
    check()
    kernels.unpatch(kernels.patch(model, everywhere=True))
    assert hf._KEPT not in experts.__dict__ and "_apply" not in experts.__dict__


def test_a_repeated_inference_call_runs_kept_plans_only(monkeypatch) -> None:
    """From the second call of a routed row count on, the experts' GEMMs run their kept plans (kernels.moe.Ready)
    with no operand checks, dispatch lookup or ready-launch key built again, and give the same result."""
    from kernels import moe

    model = build(MOE["qwen3_moe"], torch.float16)
    experts = model.model.layers[0].mlp.experts
    x, index, weights = _experts_inputs(experts, 6, 2, seed=12)
    whole: list[str] = []
    real_tiles, real_resolve = moe.run_tiles, kernels.DISPATCHER.resolve
    with torch.no_grad():
        first = hf.experts_forward(experts, x, index, weights)
        monkeypatch.setattr(moe, "run_tiles", lambda *a, **k: whole.append("tiles") or real_tiles(*a, **k))
        monkeypatch.setattr(kernels.DISPATCHER, "resolve",
                            lambda *a, **k: whole.append("resolve") or real_resolve(*a, **k))
        monkeypatch.setattr(moe, "operands_ok", lambda *a: whole.append("checks") or True)
        again = hf.experts_forward(experts, x, index, weights)
    assert whole == []
    assert torch.equal(first, again)


def test_a_patched_moe_model_is_freed_on_del_and_copies_bind_their_own_hooks() -> None:
    """The hooks a patched model keeps in its modules' ``__dict__`` (an experts module's ``_apply``, the model's
    decode context) hold their module weakly: ``del`` frees the model with no garbage collection (its GPU memory
    at once), and a deep copy's or a pickle's hooks act on the copy, not on the original."""
    import gc
    import io
    import weakref

    model = kernels.patch(build(MOE["qwen3_moe"], torch.float16), everywhere=True)
    experts = model.model.layers[0].mlp.experts
    x, index, weights = _experts_inputs(experts, 4, 2, seed=13)
    with torch.no_grad():
        experts(x, index, weights)  # keeps the views, installs the _apply hook
    assert hf._KEPT in experts.__dict__ and hf._DECODE_HOOK in model.__dict__

    twin = copy.deepcopy(model)
    twin_experts = twin.model.layers[0].mlp.experts
    twin.to(torch.float32)  # the copy's hook drops the copy's views, not the original's
    assert hf._KEPT not in twin_experts.__dict__ and hf._KEPT in experts.__dict__
    with twin._optimize_model_for_decode():  # the copy's decode context marks the copy's experts
        assert twin_experts.__dict__.get(hf._DECODING) and not experts.__dict__.get(hf._DECODING)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    loaded.to(torch.float32)
    assert hf._KEPT not in loaded.model.layers[0].mlp.experts.__dict__ and hf._KEPT in experts.__dict__

    gc.disable()
    try:
        gone = weakref.ref(model)
        del model, experts, twin, twin_experts, loaded
        assert gone() is None, "a reference cycle keeps the patched model alive until the garbage collector runs"
    finally:
        gc.enable()


# A small tile of the fused MoE kernel's space, valid for the tiny experts here (the interpreter's time grows
# with the tile).
FUSED_TILE = kernels.Config.make(BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, NUM_SM=4, num_warps=2, num_stages=2)


@pytest.mark.parametrize("name", ["mixtral", "qwen3_moe"])
def test_experts_run_the_fused_gate_up_kernel_with_the_config_stored_for_it(name: str, db_url: str,
                                                                            monkeypatch) -> None:
    """A stored Triton record for the fused gate/up problem: one moe_gated_matmul launch with that config (no
    gating pass), then moe_matmul for the down product, and the result is transformers' own."""
    from transformers.integrations.moe import grouped_mm_experts_forward

    from db import Store
    from kernels import moe_gated
    from test_dispatch import make_record

    model = build(MOE[name], torch.float16)
    model.set_experts_implementation(hf.IMPLEMENTATION)
    experts = model.model.layers[0].mlp.experts
    x, index, weights = _experts_inputs(experts, 7, 2, seed=8)
    inner, hidden = experts.down_proj.shape[-1], x.shape[1]
    problem = moe_gated.balanced_problem("fp16", "nt", 14, experts.num_experts, inner, hidden)
    device = kernels.current_device(x.device)
    assert moe_gated.SPACE.violation(FUSED_TILE, problem, device) is None
    with Store(db_url) as store:
        store.put(make_record(device, problem.key, FUSED_TILE, kernel="moe_gated_matmul"))
    kernels.clear_cache()
    launched, gated = [], []
    real = moe_gated.run_checked
    monkeypatch.setattr(moe_gated, "run_checked", lambda config, *args: launched.append(config) or real(config, *args))
    monkeypatch.setattr(hf, "silu_mul", lambda c: gated.append(c) or hf.moe_gated.gating(c))
    with torch.no_grad():
        got = experts(x, index, weights)
        want = grouped_mm_experts_forward(experts, x, index, weights)
    assert launched == [FUSED_TILE] and not gated
    assert got.dtype == torch.float16 and relative_error(got, want) < TOLERANCE[torch.float16]


def test_experts_whose_fused_problem_dispatches_to_the_baseline_run_the_unfused_kernels(monkeypatch) -> None:
    """The fused kernel runs only where dispatch runs a Triton config for its problem: pinned to its baseline,
    the gate/up product is moe_matmul and the gating pass, as before the fused kernel."""
    from transformers.integrations.moe import grouped_mm_experts_forward

    model = build(MOE["mixtral"], torch.float16)
    experts = model.model.layers[0].mlp.experts
    x, index, weights = _experts_inputs(experts, 5, 2, seed=9)
    rows = x.new_empty((10, x.shape[1]))
    gate_up_w = experts.gate_up_proj.transpose(1, 2)
    gated = []
    monkeypatch.setattr(hf, "silu_mul", lambda c: gated.append(c.shape) or hf.moe_gated.gating(c))
    with kernels.moe_gated.pinning([kernels.BASELINE], rows, gate_up_w) as (fused_baseline,), torch.no_grad():
        fused_baseline()
        got = hf.experts_forward(experts, x, index, weights)
    assert gated == [(10, gate_up_w.shape[2])]
    assert relative_error(got, grouped_mm_experts_forward(experts, x, index, weights)) < TOLERANCE[torch.float16]


def test_importing_kernels_and_patching_a_torch_model_never_import_transformers() -> None:
    code = ("import sys, torch, kernels\n"
            "m = torch.nn.Sequential(torch.nn.Linear(8, 8))\n"
            "kernels.patch(m, everywhere=True); kernels.unpatch(m)\n"
            "assert 'transformers' not in sys.modules, 'transformers was imported'\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH")))))
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr


# ----------------------------------------------------------------------------------------- record mode

def _recorded(path: Path) -> dict[str, list[tuple[str, int]]]:
    """kernel -> [(problem key, calls)] rows recorded into the SQLite file at ``path``."""
    with sqlite3.connect(path) as connection:
        rows = connection.execute("select kernel, problem_key, calls from tuner_recorded").fetchall()
    found: dict[str, list[tuple[str, int]]] = {}
    for kernel, key, calls in sorted(rows):
        found.setdefault(kernel, []).append((key, calls))
    return found


def _tuner(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("TUNER_DB", "TUNER_RECORD")}
    env.update(PYTHONPATH=os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH")))),
               XDG_CACHE_HOME=str(tmp_path / "cache"), TUNER_DB=f"sqlite:///{tmp_path / 'unused-default.db'}")
    if not torch.cuda.is_available():  # the CPU's tuner runs kernels under the interpreter; a GPU's compiles them
        env["TRITON_INTERPRET"] = "1"
    return subprocess.run([sys.executable, "-m", "tuner", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)


@pytest.fixture
def recorder_off() -> Iterator[None]:
    if RECORDER.on:
        pytest.skip("TUNER_RECORD=1 records this whole process; this test starts and stops the recorder")
    yield
    while RECORDER.on:
        RECORDER.stop()


@pytest.mark.usefixtures("recorder_off")
def test_record_mode_counts_every_kernel_a_patched_moe_model_runs(tmp_path: Path) -> None:
    """Qwen2-MoE runs all five: biased q/k/v (matmul_bias), the shared expert (gated_matmul), o_proj and
    the routers (matmul), the routed experts (moe_gated_matmul for the gate/up product, moe_matmul for the
    down one, and the unfused gate/up problem counted beside the fused one)."""
    model = kernels.patch(build(MOE["qwen2_moe"], torch.float16), everywhere=True)
    path = tmp_path / "recorded.db"
    with kernels.recording(f"sqlite:///{path}"):
        for _ in range(2):
            logits(model, tokens())
    found = _recorded(path)
    assert set(found) == {"matmul", "matmul_bias", "gated_matmul", "moe_matmul", "moe_gated_matmul"}
    assert found["matmul_bias"] == [("fp16:nt:8x64x32", 2)]  # q (32) + k (16) + v (16), stacked
    assert found["gated_matmul"] == [("fp16:nt:8x64x32", 2)]  # the shared expert, 2 x 32 wide
    # The experts' two GEMMs: 16 routed rows over 4 experts, gate/up [32 -> 64] and down [32 -> 32].
    assert [(key.split(":")[0], calls) for key, calls in found["moe_matmul"]] == [("fp16", 2), ("fp16", 2)]
    # The fused gate/up product: its problem is counted whichever form ran (the other one is, too).
    assert found["moe_gated_matmul"] == [("fp16:nt:" + "+".join(["4x32x32"] * 4), 2)]


@pytest.mark.slow
@pytest.mark.usefixtures("recorder_off")
def test_recorded_model_problems_are_listed_then_all_tuned_by_search_recorded(tmp_path: Path) -> None:
    model = kernels.patch(build(MOE["qwen2_moe"], torch.float16), everywhere=True)
    url = f"sqlite:///{tmp_path / 'tuner.db'}"
    with kernels.recording(url):
        logits(model, tokens(length=4))
    kinds = set(_recorded(tmp_path / "tuner.db"))
    listed = _tuner(tmp_path, "list", "--untuned", "--db", url)
    assert listed.returncode == 0, listed.stderr
    header, *rows = listed.stdout.splitlines()
    column = header.index("kernel")  # a GPU's name has spaces ("NVIDIA H200"): read the kernel's column
    assert {row[column:].split()[0] for row in rows} == kinds
    # The device the problems were recorded on (auto: this GPU, or the CPU without one).
    done = _tuner(tmp_path, "search", "--recorded", "--trials", "1", "--seed", "0", "--workers", "0", "--db", url)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no recorded problem is left untuned" in _tuner(tmp_path, "list", "--untuned", "--db", url).stdout


def test_experts_trace_whole_under_torch_compile_fullgraph() -> None:
    """No graph break: the sort, both moe_matmul operators and the combine trace into one graph (aot_eager:
    the trace is what is checked; Inductor's code generation is not this test's)."""
    model = kernels.patch(build(MOE["mixtral"], torch.float16), everywhere=True)
    experts = model.model.layers[0].mlp.experts
    x, index, weights = _experts_inputs(experts, 5, 2, seed=5)
    with torch.no_grad():
        want = experts(x, index, weights)
        compiled = torch.compile(lambda x, i, w: experts(x, i, w), fullgraph=True, backend="aot_eager")
        got = compiled(x, index, weights)
    assert relative_error(got, want) < TOLERANCE[torch.float16]


@pytest.mark.parametrize("name", ["llama", "qwen3_moe"])
def test_a_patched_model_with_every_fusion_traces_whole_under_torch_compile(name: str) -> None:
    """The norms, rotary embeddings, routers and experts under Dynamo: 0 graph breaks, the eager logits (each
    mixed-in forward traces its module's own ops there)."""
    model = kernels.patch(build({**DENSE, **MOE}[name], torch.float16), everywhere=True)
    assert any(isinstance(m, hf.RotaryAttention) for m in model.modules())
    assert (name == "qwen3_moe") == any(isinstance(m, hf.FusedTopKRouter) for m in model.modules())
    ids = tokens()
    with torch.no_grad():
        want = model(ids, use_cache=False).logits
        explained = torch._dynamo.explain(lambda i: model(i, use_cache=False).logits)(ids)
        assert explained.graph_break_count == 0, explained.break_reasons
        got = torch.compile(lambda i: model(i, use_cache=False).logits, fullgraph=True, backend="aot_eager")(ids)
    assert relative_error(got, want) < TOLERANCE[torch.float16]


def test_a_patched_model_s_compiled_call_checks_no_more_python_guards_per_layer_than_vanilla() -> None:
    """Every guard that Dynamo checks in Python costs the host on every call of the compiled model (H200,
    2026-11-29: a patched 2-layer model's guard check 24-63 us a decode step above vanilla's, docs/BENCHMARKS.md,
    "The static-cache cells' host time: Dynamo's guards"). The gated MLPs and the norms, whose traced paths
    check their state, add none per layer; the rotary embeddings' mixed-in attention class one per layer (an
    alias of its class that transformers' own decorator reads). Not asked here: the query/key/value groups,
    two a layer (three members share one group)."""
    extra = {}
    for layers in (2, 4):
        spec = ("LlamaConfig", "LlamaForCausalLM", {"num_hidden_layers": layers})
        vanilla = compile_host_cost.python_checked_guards(build(spec, torch.float32), tokens())
        patched = compile_host_cost.python_checked_guards(
            kernels.patch(build(spec, torch.float32), everywhere=True, fuse_qkv=False), tokens())
        assert not [g for g in patched if "_gated" in g or "_stacked" in g or "mlp" in g], patched
        extra[layers] = len(patched) - len(vanilla)
    assert extra[4] - extra[2] <= 2, f"Python-checked guards above vanilla's grow with depth: {extra}"


@pytest.mark.gpu
def test_experts_never_make_the_host_wait_once_warm() -> None:
    model = kernels.patch(build(MOE["qwen3_moe"], torch.bfloat16), everywhere=True)
    experts = model.model.layers[0].mlp.experts
    x, index, weights = _experts_inputs(experts, 64, 2, seed=6)
    with torch.no_grad():
        experts(x, index, weights)  # first call: compile, dispatch resolution
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            for _ in range(3):
                experts(x, index, weights)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
