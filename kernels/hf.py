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

``kernels.patch(model)`` calls ``patch_experts`` when transformers is imported; everything else of a
transformers model (its ``nn.Linear`` layers, SiLU-gated MLPs, query/key/value projections, DeepSeek's
shared experts) is patched as any torch module is (kernels/nn.py). Importing ``kernels`` never imports
this module, nor transformers.
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from collections.abc import Callable, Iterator

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
from ._routing import combine, sort_by_expert

__all__ = ["IMPLEMENTATION", "experts_forward", "patch_experts", "register", "stock_implementation", "unpatch_experts"]

log = logging.getLogger(__name__)

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
    compiling = torch.compiler.is_compiling()
    inference = not compiling and not torch.is_grad_enabled()
    if inference:  # the views kept with the module, and the path decided once per routed row count
        kept = _kept(self)
        gate_up_w, down_w, wants_grad = kept.gate_up_w, kept.down_w, False
    else:
        # moe_matmul takes w as [E, K, N] of any strides: transformers stores [E, N, K] unless is_transposed.
        gate_up_w = self.gate_up_proj if self.is_transposed else self.gate_up_proj.transpose(1, 2)
        down_w = self.down_proj if self.is_transposed else self.down_proj.transpose(1, 2)
        wants_grad = torch.is_grad_enabled() and (
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
    return rows * expert_bytes <= _BATCHED_DECODE_BYTES and not _REC.on and not torch.compiler.is_compiling()


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


register()  # importing this module makes "triton_tuner" a name set_experts_implementation takes
