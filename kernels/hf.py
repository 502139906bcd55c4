"""Hugging Face transformers 5 models on the tuned kernels, through transformers' own extension points.

transformers 5 keeps a MoE model's routed experts as 3-D ``gate_up_proj`` [E, 2I, H] and ``down_proj``
[E, H, I] Parameters of one ``...Experts`` module, whose forward it picks by name from
``transformers.integrations.moe.ExpertsInterface`` (``model.set_experts_implementation(name)``). We
register ``experts_forward`` there as ``"triton_tuner"``: the gate/up product and its SiLU gating run as one
``moe_gated_matmul`` launch where dispatch runs a Triton config for it (kernels/moe_gated.py), else as one
``moe_matmul`` launch and one gating pass over its output (``kernels.epilogue.silu_mul``); the down product as
one ``moe_matmul`` launch; the rows are sorted by expert on the device (``kernels._routing.sort_by_expert``:
no host sync, CUDA-graph safe). Where dispatch runs none of our kernels for a call, transformers' own
"grouped_mm" implementation runs it (``_path``).

``kernels.patch(model)`` calls ``patch_experts`` when transformers is imported, ``fuse_routers`` (a top-k router's
softmax, top-k and renormalization as one launch) and ``fuse_rotary`` (the attention modules' rotary embeddings
as one launch, kernels/rope.py); everything else of a
transformers model (its ``nn.Linear`` layers, SiLU-gated MLPs, query/key/value projections, DeepSeek's
shared experts) is patched as any torch module is (kernels/nn.py). Importing ``kernels`` never imports
this module, nor transformers.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import logging
import sys
import weakref
from collections.abc import Callable, Iterator
from typing import NamedTuple

import torch
from torch import nn
from transformers.activations import SiLUActivation
from transformers.integrations import moe as _hf_moe

from . import _device, _modes, moe, moe_gated, ops
from ._evidence import Evidence
from ._launch import BoundedDict, data_layout
from .dispatch import DISPATCHER
from ._record_mode import RECORDER as _REC
from ._spec import is_baseline
from .epilogue import silu_mul
from . import rope
from .rope import apply_rotary
from ._routing import _on_triton, combine, sort_by_expert, top_k_softmax
from ._mixin import _mixed_class, _MixedIn

__all__ = ["IMPLEMENTATION", "FusedTopKRouter", "RotaryAttention", "experts_forward", "fuse_rotary", "fuse_routers",
           "patch_experts", "register", "stock_implementation", "unpatch_experts"]

log = logging.getLogger(__name__)
_COMPILING = torch.compiler.is_dynamo_compiling  # folded to True while Dynamo traces (kernels/_plans.py)
_IS_COMPILING = torch.compiler.is_compiling  # not ``torch.`` in traced code: docs/PYTORCH.md, "Guards"
_GRAD_ENABLED = torch.is_grad_enabled

IMPLEMENTATION = "triton_tuner"  # the name users pass to set_experts_implementation / experts_implementation=

_DTYPES = (torch.float16, torch.bfloat16)  # what moe_matmul takes
_SILU = (nn.SiLU, SiLUActivation)
_BEFORE = "_triton_tuner_experts_before"  # a patched model's own implementation, kept in its __dict__
_DECODING = "_triton_tuner_decoding"  # set on an experts module while generate decodes (``_decoding``)
_DECODE_HOOK = "_optimize_model_for_decode"  # GenerationMixin's context for its decode steps


def register() -> None:
    """Make ``"triton_tuner"`` a valid experts implementation for every transformers model (idempotent)."""
    _hf_moe.ExpertsInterface.register(IMPLEMENTATION, experts_forward)


def _stock(module: nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
           top_k_weights: torch.Tensor) -> torch.Tensor:
    """What vanilla runs for the calls ``experts_forward`` declines: transformers' default experts implementation,
    "grouped_mm", which its ``generate`` switches to "batched_mm" for the decode steps (``_decoding``)."""
    return stock_implementation(_in_decode(module), hidden_states.device.type)(
        module, hidden_states, top_k_index, top_k_weights)


def stock_implementation(decoding: bool, device_type: str) -> Callable[..., torch.Tensor]:
    """transformers' choice for a model on "grouped_mm": "batched_mm" in ``generate``'s decode steps off the CPU
    (``GenerationMixin._optimize_model_for_decode``), else "grouped_mm". A patched model's name, "triton_tuner",
    keeps ``generate`` from switching, so the calls that fall back switch here; with "grouped_mm" kept in decode
    a switched model ran MoE decode at batch 1 at 0.79x of vanilla (H200, no table, 2026-11-28, torch
    2.11.0+cu130, triton 3.6.0, ``scripts/bench_models.py --no-shipped --control``; docs/PYTORCH.md)."""
    if decoding and device_type != "cpu":
        return _hf_moe.batched_mm_experts_forward
    return _hf_moe.grouped_mm_experts_forward


@contextlib.contextmanager
def _decoding(model: nn.Module) -> Iterator[None]:
    """A patched model's ``_optimize_model_for_decode``: transformers' own, and the experts modules told that
    ``generate`` is decoding, so that the calls they fall back on run what vanilla would (``_stock``)."""
    experts = _experts_modules(model)
    with type(model)._optimize_model_for_decode(model):
        for module in experts:
            module.__dict__[_DECODING] = True
        try:
            yield
        finally:
            for module in experts:
                module.__dict__.pop(_DECODING, None)


def _takes(module: nn.Module, x: torch.Tensor) -> bool:
    """Whether our path computes what ``module``'s experts compute: SiLU-gated, concatenated [gate; up]
    weights without bias or post-norm, one device (no expert parallelism), a dtype ``moe_matmul`` runs, on a
    device Triton runs on (the GPU, or the CPU under TRITON_INTERPRET=1). The parameters and the activation
    are read from the module's dicts: nn.Module.__getattr__ is a Python call each."""
    if not (getattr(module, "has_gate", False) and getattr(module, "is_concatenated", False)) or module.has_bias \
            or module.has_post_expert_norm or module._is_expert_parallel:
        return False
    if type(module)._apply_gate is not _hf_moe._default_apply_gate or type(module._modules.get("act_fn")) not in _SILU:
        return False
    params = module._parameters
    gate_up, down = params.get("gate_up_proj"), params.get("down_proj")
    if gate_up is None or down is None or x.dtype not in _DTYPES or gate_up.dtype != x.dtype or down.dtype != x.dtype:
        return False
    if x.is_cuda:
        return True
    return x.is_cpu and _device.INTERPRETED


_KEPT = "_triton_tuner_experts"  # an experts module's _Kept, in its __dict__
_KEPT_PATHS = 4096  # routed row counts kept per experts module: prefill lengths vary without end


class _Kept:
    """An experts module's weights as ``moe_matmul`` takes them ([E, K, N] views), made once: a view is a torch
    call of about 2 us of host time (timeit, CPU build machine, torch 2.13.0+cpu, 2026-11-29), two per call.
    Valid while the module's Parameters are the same objects over the same data (``_kept``); with them, the
    path each routed row count takes (``_path``), valid while the dispatcher's ``changes`` count reads the same."""

    __slots__ = ("gate_up", "down", "layouts", "gate_up_w", "down_w", "paths")

    def __init__(self, gate_up: nn.Parameter, down: nn.Parameter, transposed: bool) -> None:
        self.gate_up, self.down = gate_up, down
        self.layouts = (data_layout(gate_up), data_layout(down))
        with torch.no_grad():  # the eager path's views (a call that wants a gradient views them itself)
            self.gate_up_w = gate_up if transposed else gate_up.transpose(1, 2)
            self.down_w = down if transposed else down.transpose(1, 2)
        self.paths = BoundedDict(_KEPT_PATHS)  # (routed rows, mode) -> (dispatcher's changes, path)


def _kept(module: nn.Module) -> _Kept:
    """``module``'s ``_Kept``, made again where its Parameters or their data changed (the old views went with
    it; ``model.to()`` drops it, see ``_apply_dropping_kept``)."""
    params = module._parameters
    gate_up, down = params["gate_up_proj"], params["down_proj"]
    kept = module.__dict__.get(_KEPT)
    if kept is None or kept.gate_up is not gate_up or kept.down is not down or \
            kept.layouts != (data_layout(gate_up), data_layout(down)):
        kept = _Kept(gate_up, down, module.is_transposed)
        module.__dict__[_KEPT] = kept
        # ``.to()``, ``.cpu()``, ``.half()``: the kept views would hold the old data until the next call.
        if not isinstance(module.__dict__.get("_apply"), _OnModule):
            module.__dict__["_apply"] = _OnModule(_apply_dropping_kept, module)
    return kept


def _apply_dropping_kept(module: nn.Module, fn: Callable, recurse: bool = True) -> nn.Module:
    """``module._apply`` (what ``.to()``, ``.cpu()`` and ``.half()`` call on every submodule), dropping the kept
    views first: they would hold the old data."""
    module.__dict__.pop(_KEPT, None)
    return type(module)._apply(module, fn, recurse)


class _OnModule:
    """``function(module, ...)``, kept in ``module``'s own ``__dict__`` as a method of that one instance (an
    experts module's ``_apply``, a patched model's ``_optimize_model_for_decode``). It holds the module weakly:
    a bound partial would make a cycle, and a deleted or replaced model's GPU memory would wait for the garbage
    collector. A deep copy or a pickle of the module gets one bound to the copy."""

    __slots__ = ("_function", "_module")

    def __init__(self, function: Callable, module: nn.Module) -> None:
        self._function, self._module = function, weakref.ref(module)

    def __call__(self, *args: object, **kwargs: object) -> object:
        return self._function(self._module(), *args, **kwargs)

    def __deepcopy__(self, memo: dict) -> _OnModule:
        module = self._module()
        return _OnModule(self._function, memo.get(id(module), module))  # the copy, made before its __dict__'s

    def __reduce__(self) -> tuple:
        return _OnModule, (self._function, self._module())


def experts_forward(self: nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                    top_k_weights: torch.Tensor) -> torch.Tensor:
    """The routed experts of one MoE layer: ``sum_k w_k * down_e(silu(gate_e(x)) * up_e(x))`` per token.

    ``hidden_states`` [T, H], ``top_k_index`` [T, k] each token's experts, ``top_k_weights`` [T, k] their
    weights: ExpertsInterface's signature. Calls our path cannot compute (see ``_takes``) run what vanilla
    would (transformers' "grouped_mm" implementation, "batched_mm" in generate's decode steps); so do the calls
    ``_path`` gives to it, and decode steps whose routed weights are small (``_BATCHED_DECODE_BYTES``)."""
    # Asked first: what the rule saves is host time.
    if _in_decode(self) and _batched_decode_is_cheaper(self, top_k_index.numel()):
        return _stock(self, hidden_states, top_k_index, top_k_weights)
    if not _takes(self, hidden_states):
        return _stock(self, hidden_states, top_k_index, top_k_weights)
    tokens, top_k = top_k_index.shape
    # Traced or differentiated: the unfused operators. The fused kernel has no backward; and the choice between
    # it and them reads dispatch's host-side tables, which a traced graph must not (a traced call always takes
    # our path, deciding nothing), and where its baseline won, the fused operator would run torch's silu and
    # multiply eagerly, outside the graph Inductor fuses them into.
    compiling = _IS_COMPILING()
    inference = not compiling and not _GRAD_ENABLED()
    if inference:  # the views kept with the module, and the path decided once per routed row count
        kept = _kept(self)
        gate_up_w, down_w, wants_grad = kept.gate_up_w, kept.down_w, False
    else:
        # moe_matmul takes w as [E, K, N] of any strides: transformers stores [E, N, K] unless is_transposed.
        gate_up_w = self.gate_up_proj if self.is_transposed else self.gate_up_proj.transpose(1, 2)
        down_w = self.down_proj if self.is_transposed else self.down_proj.transpose(1, 2)
        wants_grad = _GRAD_ENABLED() and (
            hidden_states.requires_grad or gate_up_w.requires_grad or down_w.requires_grad)
    traced = compiling or wants_grad
    if compiling:
        path = _UNFUSED
    elif inference:
        path = _kept_path(kept, hidden_states, tokens * top_k)
    else:
        path = _path(hidden_states, tokens * top_k, gate_up_w, down_w, not wants_grad)
    if path is _STOCK_PATH:
        return _stock(self, hidden_states, top_k_index, top_k_weights)
    routed = sort_by_expert(top_k_index.reshape(-1), gate_up_w.shape[0], top_k)
    offsets = routed.offsets
    rows = hidden_states.index_select(0, routed.token)
    # all_rows: the offsets end at T * k (every row is routed), so no output fill is needed.
    if path is _FUSED:
        h = ops.moe_gated_matmul_call(rows, gate_up_w, offsets, True)  # one launch: [S, I], no [S, 2I] written
    else:
        gate_up = ops.moe_matmul_call(rows, gate_up_w, offsets, True)
        # silu_mul is a launch of its own, with no backward and nothing Dynamo traces: torch's ops there.
        h = moe_gated.gating(gate_up) if traced else silu_mul(gate_up)  # one pass over [S, 2I] on the GPU
    down = ops.moe_matmul_call(h, down_w, offsets, True)
    # Back to (token, slot) order, summed over k.
    return combine(down, routed.position, top_k_weights, hidden_states.dtype)


# In generate's decode steps vanilla runs transformers' "batched_mm": it copies each routed row's expert weights,
# then multiplies (bmm), so it passes over those weights about three times to our path's once, but as a few ops
# dispatched by torch's C++, where our path is five launches from Python. Measured at a decode step of one
# token (Qwen3-30B-A3B, 8 routed rows over 128 experts, 75 MB of weights; H200, 2026-11-28, torch 2.11.0+cu130,
# triton 3.6.0, scripts/moe_host_cost.py): batched_mm 120-125 us a call back to back, ours 204-238 us, each
# host-paced (GPU time 78 against 60 us); at 16 tokens (128 rows, 1.2 GB) batched_mm 836 us, ours 217 us.
# So where batched_mm's two extra passes over the routed experts' weights cost less GPU time than our ~100 us
# of extra host time, decode steps run it: 160 MB is what two passes read in 100 us at the H100's 3.35 TB/s
# (the slower of the two GPUs measured). A model with larger experts (Mixtral: 350 MB each) keeps our path
# from its first token. Since our calls keep their plans (moe.Ready, _Kept; 2026-11-29) our path at 8 routed
# rows read 123-247 us against batched_mm's 140-268 (faster in two of four processes), and generate at batch 1
# and 2 read the same with the rule and without it (0.993x and 1.002x, 0.988x and 0.974x of vanilla; H200,
# 2026-11-29, torch 2.11.0+cu130, triton 3.6.0, experts_probe.py and decode_rule_probe.py in
# docs/runs/2026-11-29-h200-moe-ready-plans): the rule stands until a measurement tells the two apart.
_BATCHED_DECODE_BYTES = 160 << 20


def _in_decode(module: nn.Module) -> bool:
    """Whether ``generate`` is in its decode steps for this experts module (``_decoding``)."""
    return bool(module.__dict__.get(_DECODING))


def _batched_decode_is_cheaper(module: nn.Module, rows: int) -> bool:
    """Whether transformers' batched_mm costs less than our path for a decode step routing ``rows`` rows through
    ``module``'s experts (see _BATCHED_DECODE_BYTES). Record mode takes our path (its calls must be counted), and
    so does a traced call (which runs our operators, as before this rule)."""
    params = module._parameters
    gate_up, down = params["gate_up_proj"], params["down_proj"]
    expert_bytes = (gate_up.shape[1] * gate_up.shape[2] + down.shape[1] * down.shape[2]) * gate_up.element_size()
    return rows * expert_bytes <= _BATCHED_DECODE_BYTES and not _REC.on and not _IS_COMPILING()


def _kept_path(kept: _Kept, x: torch.Tensor, rows: int) -> str:
    """``_path`` of an inference call, kept per routed row count and dispatch mode while dispatch's answers
    stand (record mode asks ``_path`` on every call: it counts them)."""
    mode = _modes.current(x.is_cuda)
    found = kept.paths.get((rows, mode))
    changes = DISPATCHER.changes
    if found is not None and found[0] == changes and not _REC.on:
        return found[1]
    path = _path(x, rows, kept.gate_up_w, kept.down_w, True)
    kept.paths[(rows, mode)] = (changes, path)
    return path


# The three ways an eager call computes the experts (``_path``).
_FUSED = "fused"  # moe_gated_matmul for the gate/up product and its gating, then moe_matmul for the down one
_UNFUSED = "unfused"  # moe_matmul, silu_mul, moe_matmul
_STOCK_PATH = "stock"  # transformers' own "grouped_mm" implementation


def _path(x: torch.Tensor, rows: int, gate_up_w: torch.Tensor, down_w: torch.Tensor, fusable: bool) -> str:
    """How an eager call routing ``rows`` rows (tokens times k) runs, per problem, by what dispatch runs for it:

    - fused, where ``fusable`` (no gradient wanted) and dispatch runs a Triton config for the fused gate/up
      problem (``moe_gated_matmul``): its record beat its baseline, ``torch._grouped_mm`` then torch's gating,
      which is what the unfused path's parts run where they are not tuned either. Not yet measured on a GPU
      against a tuned unfused path.
    - else stock, where both expert GEMMs (``moe_matmul``) are its baseline, ``torch._grouped_mm``: transformers'
      own "grouped_mm" implementation runs the same GEMMs with less host work, so it runs instead (the
      never-slower rule, per problem). On the shipped H100 and H200 tables every expert GEMM of Qwen3-30B-A3B
      and DeepSeek-V2-Lite is the baseline, and our path around it ran those models at 0.82-0.93x of vanilla
      in several eager settings and 0.87-0.90x on the H200 (``scripts/bench_models.py``, 2026-11-28,
      torch 2.11.0+cu130, triton 3.6.0; docs/PYTORCH.md).
    - else unfused: ``moe_matmul``, ``silu_mul``, ``moe_matmul``.

    Record mode never takes the stock path (the calls must be counted) and counts the gate/up product's other
    form too, so that ``search --recorded`` tunes both. Lookups of dispatch's cache, cleared with it
    (``kernels.clear_cache``)."""
    mode = _modes.current(x.is_cuda)
    fused_key = moe_gated.key_of(rows, gate_up_w, mode)
    fused = not is_baseline(moe_gated.resolve(fused_key)) and fusable
    if _REC.on:
        if fused:
            gate_up_key = moe.key_of(rows, gate_up_w, mode)
            moe.resolve(gate_up_key)  # notes the key in record mode
            _REC.counts[gate_up_key] += 1
        else:
            _REC.counts[fused_key] += 1
        return _FUSED if fused else _UNFUSED
    if fused:
        return _FUSED
    if is_baseline(moe.resolve(moe.key_of(rows, gate_up_w, mode))) and \
            is_baseline(moe.resolve(moe.key_of(rows, down_w, mode))):
        return _STOCK_PATH
    return _UNFUSED


def _experts_modules(model: nn.Module) -> list[nn.Module]:
    """The model's transformers experts modules: a 3-D ``gate_up_proj`` under ``use_experts_implementation``."""
    return [m for m in model.modules() if isinstance(getattr(m, "gate_up_proj", None), torch.Tensor)
            and m.gate_up_proj.dim() == 3 and hasattr(m, "_is_expert_parallel")]


def _expert_weights(experts: list[nn.Module]) -> list[torch.Tensor]:
    """Each experts module's two weights as ``moe_matmul`` takes them ([E, K, N] views): gate/up, then down."""
    return [w if m.is_transposed else w.transpose(1, 2) for m in experts for w in (m.gate_up_proj, m.down_proj)]


# transformers' own generic implementations, which ours replaces. Another one (a vendor kernel such as
# "deepgemm" or "sonicmoe", or one the user registered) was chosen on purpose: patch leaves it.
_STOCK = frozenset((None, "eager", "grouped_mm", "batched_mm"))


def patch_experts(model: nn.Module, evidence: Evidence | None = None) -> bool:
    """Switch a transformers model's routed experts to ``"triton_tuner"``, keeping the implementation it had for
    ``unpatch_experts``; False (nothing changed) for a model without experts it can switch, whose experts
    run an implementation other than transformers' generic ones, or where dispatch runs
    ``torch._grouped_mm`` for every expert GEMM (the fused gate/up one too) at every routed row count
    (``evidence``): there transformers' own implementations run the same GEMMs at less host time, and its
    ``generate`` switches "grouped_mm" to "batched_mm" for decoding, which a renamed implementation would keep
    from happening (on an H200 with no table, 2026-11-28, torch 2.11.0+cu130, triton 3.6.0,
    ``scripts/bench_models.py --no-shipped --control``: MoE decode at batch 1 0.79x of vanilla)."""
    setter = getattr(model, "set_experts_implementation", None)
    experts = _experts_modules(model) if setter is not None else []
    if not experts or not model._can_set_experts_implementation():
        return False
    if model.config._experts_implementation not in _STOCK | {IMPLEMENTATION}:
        log.info("kernels.patch leaves the experts on %r, chosen for this model", model.config._experts_implementation)
        return False
    evidence = evidence or Evidence()
    gate_up_weights = _expert_weights(experts)[::2]
    if not any(evidence.moe_runs_a_kernel(w) for w in _expert_weights(experts)) and \
            not any(evidence.moe_runs_a_kernel(w, gated=True) for w in gate_up_weights):
        log.info("kernels.patch leaves the experts on %r: dispatch runs torch._grouped_mm for all their GEMMs here",
                 model.config._experts_implementation)
        return False
    register()
    model.__dict__.setdefault(_BEFORE, model.get_experts_implementation())
    setter(IMPLEMENTATION)
    if hasattr(type(model), _DECODE_HOOK):  # a generative model: its decode steps fall back as vanilla's would
        model.__dict__[_DECODE_HOOK] = _OnModule(_decoding, model)
    return True


def unpatch_experts(model: nn.Module) -> None:
    """Give a model ``patch_experts`` switched its own experts implementation back."""
    before = model.__dict__.pop(_BEFORE, None)
    model.__dict__.pop(_DECODE_HOOK, None)
    for module in _experts_modules(model):
        module.__dict__.pop(_KEPT, None)
        module.__dict__.pop("_apply", None)
    if before is not None:
        model.set_experts_implementation(before)


# ---------------------------------------------------------------------------------------------- routers

class _RouterFormula(NamedTuple):
    k: int
    renormalize: bool  # the chosen probabilities divided by their sum (Mixtral; Qwen's norm_topk_prob)
    scores_in_float32: bool  # Mixtral's scores stay float32; Qwen's are cast to the logits' dtype


class FusedTopKRouter(_MixedIn):
    """A transformers top-k router (Mixtral's, Qwen2/3-MoE's, OLMoE's) whose softmax, top-k, renormalization and
    cast run as one launch (``kernels._routing.top_k_softmax``) after its logits' ``F.linear``: it returns
    what its own forward does, ``(logits, scores, experts)``, the experts chosen alike (among equal
    probabilities the lowest, as torch.topk on a GPU chooses) and the scores within a rounding.

    ``kernels.patch`` makes one of a module with one 2-D ``weight`` Parameter and an integer ``top_k``, on a GPU,
    once a copy of it, given a random weight, has returned that triple on random rows (``_router_formula``).
    The class is the module's own class with this forward mixed in; its own forward runs in training, under
    ``torch.compile`` (Inductor fuses it), where a gradient is wanted, and for operands the kernel does not take.
    """

    _STATE = ("_router_formula",)

    def forward(self, hidden_states: torch.Tensor, *args: object, **kwargs: object) -> object:
        if args or kwargs or self.training or _COMPILING():
            return self._unfused.forward(self, hidden_states, *args, **kwargs)
        formula = self.__dict__["_router_formula"]
        weight = self._parameters.get("weight")
        # DeepSeek-V2's router casts the rows to its float32 weight's dtype first: that is its own forward's
        if (weight is None or hidden_states.dtype != weight.dtype or self.__dict__.get("top_k") != formula.k
                or torch.is_grad_enabled() and (weight.requires_grad or hidden_states.requires_grad)):
            return self._unfused.forward(self, hidden_states)
        logits = torch.nn.functional.linear(hidden_states.reshape(-1, weight.shape[1]), weight)
        chosen = top_k_softmax(logits, formula.k, formula.renormalize,
                               torch.float32 if formula.scores_in_float32 else logits.dtype)
        if chosen is None:
            return self._unfused.forward(self, hidden_states)
        return logits, chosen[0], chosen[1]


def fuse_routers(model: nn.Module) -> int:
    """Make each top-k router of the model a ``FusedTopKRouter`` (``_fuse_router``); returns how many."""
    return sum(_fuse_router(module) for module in model.modules())


def _fuse_router(module: nn.Module) -> bool:
    weight = module._parameters.get("weight")
    if (isinstance(module, FusedTopKRouter) or module._modules or module._buffers or len(module._parameters) != 1
            or type(weight) is not nn.Parameter or weight.dim() != 2 or not isinstance(module.__dict__.get("top_k"), int)
            or not _on_triton(weight)):
        return False
    formula = _router_formula(module)
    if formula is None:
        return False
    module.__class__ = _mixed_class(FusedTopKRouter, type(module))
    module.__dict__["_router_formula"] = formula
    return True


_ROUTER_CHECK_ROWS = 16


def _router_formula(module: nn.Module) -> _RouterFormula | None:
    """What ``module``'s forward computes, found on a copy of it given a random weight: ``(logits, scores,
    experts)`` for random rows, the logits ``F.linear``'s, and the experts and scores ``top_k_softmax``'s with
    or without renormalization (the experts as a set, up to equal probabilities; the scores within 1e-5 in
    float32, 1e-2 in half precision); None where it computes something else (a sigmoid, grouped choice, a
    bias: DeepSeek's) or raises."""
    weight = module._parameters["weight"]
    generator = torch.Generator(device=weight.device).manual_seed(0)
    try:
        probe = copy.deepcopy(module)
        with torch.no_grad():
            # logits of about unit scale: a peaked softmax (one expert near 1) cannot tell a renormalized
            # choice from a plain one
            probe.weight.copy_(torch.randn(weight.shape, generator=generator, device=weight.device)
                               / weight.shape[1] ** 0.5)
            x = torch.randn(_ROUTER_CHECK_ROWS, weight.shape[1], generator=generator, device=weight.device).to(
                weight.dtype)
            out = probe.forward(x)
            if not (isinstance(out, tuple) and len(out) == 3 and all(isinstance(t, torch.Tensor) for t in out)):
                return None
            logits, scores, experts = out
            k = experts.shape[-1] if experts.dim() == 2 else 0
            if (k != module.__dict__["top_k"] or experts.dtype != torch.int64 or scores.shape != experts.shape
                    or logits.shape != (x.shape[0], weight.shape[0])
                    or not torch.equal(logits, torch.nn.functional.linear(x, probe.weight))
                    or scores.dtype not in (logits.dtype, torch.float32)):
                return None
            probabilities = torch.softmax(logits, dim=-1, dtype=torch.float32)
            tolerance = 1e-5 if scores.dtype == torch.float32 else 1e-2
            held = []
            for renormalize in (True, False):
                chosen = top_k_softmax(logits, k, renormalize, scores.dtype)
                if chosen is None:
                    return None
                # the same experts but for equal probabilities: the same probabilities chosen
                same_experts = torch.equal(probabilities.gather(1, chosen[1]).sort(dim=1).values,
                                           probabilities.gather(1, experts).sort(dim=1).values)
                if same_experts and torch.allclose(chosen[0].float(), scores.float(), rtol=tolerance, atol=1e-6):
                    held.append(renormalize)
            if len(held) == 1 or held and k == weight.shape[0]:  # one formula told apart (all experts: one)
                float32_scores = scores.dtype == torch.float32 and logits.dtype != torch.float32
                return _RouterFormula(k, held[0], float32_scores)
    except Exception as exc:  # another signature or input: not a router to fuse
        log.debug("%s is not fused: its forward on random rows raised %r", type(module).__name__, exc)
    return None


# --------------------------------------------------------------------------------------- rotary embeddings

_ROTARY = "apply_rotary_pos_emb"  # the function each modeling module defines and its attention forward calls


class RotaryAttention(_MixedIn):
    """An attention module whose forward calls its modeling module's ``apply_rotary_pos_emb`` where that is
    ``kernels.rope.fused_rotary``'s stand-in: the stand-in runs the one-launch kernel during this forward only
    (``kernels.rope.ACTIVE``), so that models of the same class left unpatched keep torch's ops. Under
    ``torch.compile`` the module's own forward is traced as it is."""

    def forward(self, *args: object, **kwargs: object) -> object:
        if _COMPILING():
            return self._unfused.forward(self, *args, **kwargs)
        active = rope.ACTIVE
        before, active.on = active.on, True
        try:
            return self._unfused.forward(self, *args, **kwargs)
        finally:
            active.on = before


def fuse_rotary(model: nn.Module) -> int:
    """Make the model's attention modules ``RotaryAttention``s where their forward calls their modeling module's
    ``apply_rotary_pos_emb`` and that function gives the same bits as ``kernels.rope.apply_rotary`` on random
    queries, keys and angles (``_computes_rotary``): Llama's, Mistral's, Qwen2/3's, Gemma's, Mixtral's and their
    MoE variants' do; Phi-3's (a partial rotary, concatenated), GLM's (interleaved pairs) and DeepSeek-V2's
    (complex numbers) keep theirs. The modeling module's function is replaced by the stand-in
    (``kernels.rope.fused_rotary``), which runs the module's own function outside a patched attention's
    forward and stays in place after ``unpatch``. Returns how many attention modules changed."""
    weight = next(model.parameters(), None)
    if weight is None or not _on_triton(weight):
        return 0
    checked: dict[str, bool] = {}
    fused = 0
    for module in model.modules():
        cls = type(module)
        if isinstance(module, RotaryAttention) or not _calls_rotary(cls):
            continue
        modeling = sys.modules.get(cls.__module__)
        if cls.__module__ not in checked:
            checked[cls.__module__] = modeling is not None and _put_stand_in(modeling, weight.device)
        if checked[cls.__module__]:
            module.__class__ = _mixed_class(RotaryAttention, cls)
            fused += 1
    return fused


def _calls_rotary(cls: type) -> bool:
    """Whether ``cls.forward`` (under its decorators: transformers' ``deprecate_kwarg``) names the function."""
    code = getattr(inspect.unwrap(cls.forward), "__code__", None)
    return code is not None and _ROTARY in code.co_names


def _put_stand_in(modeling: object, device: torch.device) -> bool:
    """Whether ``modeling.apply_rotary_pos_emb`` is (now) ``fused_rotary``'s stand-in for a function that gives
    ``apply_rotary``'s bits."""
    function = getattr(modeling, _ROTARY, None)
    if getattr(function, "fused_by_kernels", False):
        return True
    if not callable(function) or not _computes_rotary(function, device):
        return False
    setattr(modeling, _ROTARY, rope.fused_rotary(function))
    return True


def _computes_rotary(original: Callable, device: torch.device) -> bool:
    """Whether ``original(q, k, cos, sin)`` gives ``apply_rotary``'s outputs, bit for bit and laid out alike, on
    random [B, heads, S, D] queries and keys (transposed views, as attention modules make them; a single key
    head) and the cos and sin of random angles, in float16 and, on a GPU, bfloat16 (the interpreter rounds
    bfloat16 otherwise than a GPU does)."""
    generator = torch.Generator(device=device).manual_seed(0)
    dtypes = (torch.float16,) if device.type == "cpu" else (torch.float16, torch.bfloat16)
    try:
        for dtype in dtypes:
            for dim in (16, 64):
                def rand(*shape: int) -> torch.Tensor:
                    return torch.randn(shape, generator=generator, device=device).to(dtype)
                q, k = rand(2, 5, 3, dim).transpose(1, 2), rand(2, 5, 1, dim).transpose(1, 2)
                angles = torch.rand(2, 5, dim // 2, generator=generator, device=device) * 100
                angles = torch.cat((angles, angles), dim=-1)
                cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
                with torch.no_grad():
                    want, got = original(q, k, cos, sin), apply_rotary(q, k, cos, sin)
                if got is None or not isinstance(want, tuple) or len(want) != 2 \
                        or not all(_same(a, b) for a, b in zip(got, want)):
                    return False
    except Exception as exc:  # another signature: not the formula
        log.debug("%s is not fused: it raised %r on random queries and keys", original, exc)
        return False
    return True


def _same(got: torch.Tensor, want: object) -> bool:
    """The same values, bit for bit, and the same strides along every dimension longer than one."""
    return (isinstance(want, torch.Tensor) and got.shape == want.shape and got.dtype == want.dtype
            and torch.equal(got, want)
            and all(a == b for a, b, size in zip(got.stride(), want.stride(), got.shape) if size > 1))


register()  # importing this module makes "triton_tuner" a name set_experts_implementation takes
