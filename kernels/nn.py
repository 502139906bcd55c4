"""Drop-in modules: a model's ``nn.Linear`` layers, SiLU-gated MLPs, RMSNorms and MoE experts run on our kernels.

``kernels.patch(model)`` turns a model's ``nn.Linear`` layers into ``kernels.nn.Linear`` in place (the same
Parameter objects, the same state dict), and each SiLU-gated MLP it can show to be one into a ``FusedMLP``
(the gate and up projections in one ``gated_matmul`` launch), where dispatch runs one of our kernels for
them (kernels/_evidence.py), and each RMSNorm into a ``FusedRMSNorm`` (one launch, kernels/norm.py);
``kernels.unpatch(model)`` turns them back.
Both go through the custom operators of ``kernels.ops``, so ``torch.compile(fullgraph=True)`` traces them
and autograd runs.
"""

from __future__ import annotations

import copy
import logging
import sys
import types
from typing import Any, NamedTuple

import torch
from torch import nn
from torch.nn.modules import module as _torch_module

from . import _device
from ._evidence import Evidence, Route, takes_ours
from ._launch import data_layout
from ._mixin import _mixed_class, _MixedIn, _new_module  # _new_module: pickles of patched modules name it here
from ._routing import _on_triton, combine, sort_by_expert
from .epilogue import GATED_MATMUL, MATMUL_BIAS
from .gemm import MATMUL
from .norm import FORMULAS, MAX_WIDTH, Formula, rms_norm, rms_norm_reference
# The functions themselves, not ``ops.`` reads: under torch.compile every object that traced code reaches by two
# paths (this module's ``ops`` and the functions' own globals; this module's ``torch`` and transformers') costs a
# guard that Dynamo checks in Python on every call of the compiled code (docs/PYTORCH.md, "Guards").
from .ops import gated_matmul_call, linear_call, moe_matmul_call

__all__ = ["FusedMLP", "FusedRMSNorm", "Linear", "MoE", "SharedInput", "SharedInputLinear", "patch", "route",
           "sort_by_expert", "unpatch"]

log = logging.getLogger(__name__)

_COMPILING = torch.compiler.is_dynamo_compiling  # folded to True while Dynamo traces (kernels/_plans.py)
_IS_COMPILING = torch.compiler.is_compiling  # the same, also under other tracers (make_fx)
_AUTOCAST_ON = torch._C._is_any_autocast_enabled
_GRAD_ENABLED = torch.is_grad_enabled
_INFERENCE_MODE_ON = torch.is_inference_mode_enabled
_LINEAR = nn.functional.linear
_SILU = nn.functional.silu
_NN_LINEAR = nn.Linear
_PARAMETER = nn.Parameter


class Linear(nn.Linear):
    """An ``nn.Linear`` whose forward is the tuned GEMM: y = x @ W^T (+ bias in the epilogue), x flattened to 2-D."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The Parameters from their dict: self.weight goes through nn.Module.__getattr__, a Python call that
        # cost about as much as the rest of this method (timeit on our CPU machine). A parametrized weight
        # (torch.nn.utils.parametrize) is no longer in the dict: its property computes it.
        params = self._parameters
        weight = params.get("weight")
        if weight is None:
            weight = self.weight
        bias = params["bias"] if "bias" in params else self.bias
        route = self.__dict__.get("_route")
        if route is not None and not _COMPILING() and not takes_ours(route, x):
            return _LINEAR(x, weight, bias)  # dispatch runs cuBLAS for these rows: torch's own call costs less
        if x.dim() == 2:  # the common 2-D call: no reshapes (each is host time)
            return linear_call(x, weight, bias, self._transposed)
        if x.dim() == 0:
            raise RuntimeError(f"{type(self).__name__}: the input must have at least one dimension (features "
                               f"last, {self.in_features} of them); got a 0-D tensor")
        rows = x.reshape(-1, x.shape[-1])
        return linear_call(rows, weight, bias, self._transposed).reshape(*x.shape[:-1], self.out_features)

    def _transposed(self, weight: torch.Tensor) -> torch.Tensor | None:
        """``weight.t()``, kept while it views this weight's current data: a new Parameter, or new data under
        the same one (``weight.data = ...``), makes another. A few reads per call, where t() is a torch call.
        None for a weight that is not a Parameter (a parametrization's, new on every call; autocast's cast):
        ``ops.linear_call`` transposes it. Asked on its direct path alone (no tracing, no torch.func)."""
        if type(weight) is not nn.Parameter:
            return None
        kept = self.__dict__.get("_kept_t")
        layout = data_layout(weight)
        if kept is not None and kept[0] is weight and kept[2] == layout:
            return kept[1]
        with torch.no_grad():  # the direct path's view (no gradient is wanted there)
            weight_t = weight.t()
        # not Module.__setattr__: no parameter bookkeeping
        self.__dict__["_kept_t"] = (weight, weight_t, layout)
        return weight_t

    def _apply(self, fn, recurse: bool = True):  # .to(), .half(), .cpu(): the kept view would pin the old data
        self.__dict__.pop("_kept_t", None)
        return super()._apply(fn, recurse)

    def __getstate__(self) -> dict:  # pickles (torch.save of the module) carry no kept view
        state = super().__getstate__()
        state.pop("_kept_t", None)
        return state

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> Linear:
        """``linear`` as a ``Linear``: the object itself, its class changed, sharing every Parameter."""
        linear.__class__ = cls
        return linear


def patch(model: nn.Module, fuse_mlp: bool = True, fuse_qkv: bool = True, everywhere: bool = False,
          fuse_norm: bool = True, fuse_rotary: bool = True, fuse_router: bool = True) -> nn.Module:
    """Make the ``nn.Linear`` layers in ``model`` (itself included) run on the tuned kernels, in place; returns it.

    Only where that can be faster: a Linear (or a fused group below) is patched where dispatch runs one of
    our kernels for its problem at some row count on this GPU (kernels/_evidence.py). The others keep
    torch's forward, which costs less host time than ours around the same cuBLAS call: on a GPU with no
    table no GEMM changes (the RMSNorms below still do). Record mode (``TUNER_RECORD=1``) patches everything, to see every problem, as
    does ``everywhere=True`` (every module on our path whatever dispatch runs: to test or profile it).

    Subclasses of ``nn.Linear`` other than plain ones (e.g. quantized layers) are left alone: their forward
    is not ``nn.Linear``'s, so swapping it would change what they compute. With ``fuse_mlp``, each SiLU-gated
    MLP (see ``FusedMLP``) computes its gate and up projections in one ``gated_matmul`` launch. With
    ``fuse_qkv``, the query, key and value projections of each attention module run as one GEMM wherever the
    model calls them on one input (see ``SharedInput``). A transformers 5 MoE model's routed experts switch
    to the ``"triton_tuner"`` experts implementation (kernels/hf.py): one ``moe_gated_matmul`` for the gate/up
    product with its SiLU gating where dispatch runs a Triton config for it, one ``moe_matmul`` per other GEMM.
    With ``fuse_norm``, each RMSNorm whose forward computes one of ``kernels.norm.FORMULAS`` runs it as one
    launch (see ``FusedRMSNorm``) where its weight lives on a GPU: no table is asked, as there is no cuBLAS
    call to compare with, only torch's six to eight launches where ours is one.
    """
    first = next(model.parameters(), None)
    if first is not None and first.device.type == "cpu" and not _device.INTERPRETED:
        log.warning("kernels.patch: the model's weights are on the CPU, where none of our kernels runs, so its "
                    "modules keep torch's forward; move the model to its GPU first (model.to('cuda')), then "
                    "patch it")
    evidence = Evidence(everywhere=everywhere)
    norms = sum(_fuse_norm(module) for module in model.modules()) if fuse_norm else 0
    # The MLPs first: the check runs each one's own forward on torch's Linears.
    fused = sum(_fuse(module, evidence) for module in model.modules()) if fuse_mlp else 0
    shared = sum(_share_input(module, evidence) for module in model.modules()) if fuse_qkv else 0
    linears = shared * len(_SHARED_INPUT_NAMES[0])  # the groups' members are patched Linears too
    left = 0
    for module in model.modules():
        if type(module) is nn.Linear:
            spec, n, k = _linear_spec(module), module.out_features, module.in_features
            if evidence.runs_a_kernel(spec, n, k, module.weight):
                Linear.from_linear(module)
                module.__dict__["_route"] = evidence.route(spec, n, k)
                linears += 1
            else:
                left += 1
    hf = _transformers()
    experts = hf is not None and hf.patch_experts(model, evidence)
    rotary = hf.fuse_rotary(model) if hf is not None and fuse_rotary else 0
    routers = hf.fuse_routers(model) if hf is not None and fuse_router else 0
    log.info("kernels.patch: %d nn.Linear patched, %d SiLU-gated MLPs fused, %d query/key/value groups fused, "
             "%d RMSNorms in one launch%s%s%s%s", linears, fused, shared, norms,
             f", {rotary} attention modules' rotary embeddings in one launch" if rotary else "",
             f", {routers} MoE routers in one launch" if routers else "",
             ", routed experts on moe_matmul" if experts else "",
             f"; {left} nn.Linear left on torch's path (dispatch runs cuBLAS for every problem of theirs here: "
             f"record and tune them to change that, docs/PYTORCH.md)" if left else "")
    return model


def _linear_spec(linear: nn.Module) -> Any:
    """The kernel a Linear's call dispatches on: the fused-bias GEMM where it has a bias."""
    return MATMUL_BIAS if linear.bias is not None else MATMUL


def _transformers() -> Any:
    """kernels.hf where the program has imported transformers (a transformers model can exist only then);
    None otherwise, so that patching a plain torch model never imports transformers."""
    if "transformers" not in sys.modules:
        return None
    try:
        from . import hf
    except ImportError as exc:  # transformers before 5 has no ExpertsInterface: its models keep their experts
        log.debug("kernels.patch leaves transformers' experts alone: %s", exc)
        return None
    return hf


def unpatch(model: nn.Module) -> nn.Module:
    """Undo ``patch``: every ``kernels.nn.Linear`` in ``model`` becomes a plain ``nn.Linear`` again, and every
    ``FusedMLP`` and ``FusedRMSNorm`` its own class (its gate and up weights stay in one storage: the same values, the same state
    dict, as do the projections of a ``SharedInput`` group), and every other module ``patch`` mixed a forward
    into (transformers' routers and attention modules, kernels/hf.py) its own class."""
    for module in model.modules():
        if type(module) in (Linear, SharedInputLinear):
            for name in ("_kept_t", "_route") + _SHARED_STATE:
                module.__dict__.pop(name, None)
            module.__class__ = nn.Linear
        elif isinstance(module, _MixedIn):  # FusedMLP, FusedRMSNorm; kernels.hf's FusedTopKRouter, RotaryAttention
            for name in module._STATE:
                module.__dict__.pop(name, None)
            module.__class__ = type(module)._unfused
    hf = _transformers()
    if hf is not None:
        hf.unpatch_experts(model)
    return model


# ------------------------------------------------------------------------------------------ gated MLPs

class _Names(NamedTuple):
    """The Linears of a gated MLP, by the names a model gives them."""
    gate: str  # the gate projection; the stacked [gate; up] one where ``up`` is None
    up: str | None
    down: str


# Each is checked on the module's own forward before it is trusted (``_computes_gated_mlp``).
_CONVENTIONS = (
    _Names("gate_proj", "up_proj", "down_proj"),  # transformers' Llama, Mistral, Qwen2, DeepSeek MLPs
    _Names("w1", "w3", "w2"),  # Meta's Llama FeedForward, transformers' Mixtral expert MLP
    _Names("gate_up_proj", None, "down_proj"),  # transformers' Phi-3 MLP: one stacked [gate; up] weight
)


class _Joint(NamedTuple):
    """Weights (and biases) whose data share one storage, and the views a fused call runs on."""
    params: tuple[torch.Tensor, ...]  # the Parameter objects it was made from (kept alive: their ids stay theirs)
    param_ids: tuple[int, ...]  # their ids: another object means stale (an id, not the object: see ``_holds``)
    # their data's layouts then (``data_layout``): another (new .data, even at the same address) means stale too
    layouts: tuple[tuple, ...]
    weight: torch.Tensor  # [N_1 + N_2 + ..., K], each weight a view of its rows
    weight_t: torch.Tensor
    bias: torch.Tensor | None


def _holds(joint: _Joint | None, params: tuple[torch.Tensor, ...]) -> bool:
    """Whether ``joint`` is still made of ``params``: the same Parameters (a guard under torch.compile), with
    the same data (asked in eager calls only: data_ptr() would break the graph). By id: ``a is b`` of two
    objects that traced code reaches by two paths costs Dynamo a guard it checks in Python on every call of
    the compiled code; an id is one it checks in C++."""
    return joint is not None and len(joint.param_ids) == len(params) and \
        all(id(p) == kept for p, kept in zip(params, joint.param_ids)) and \
        (_IS_COMPILING() or all(data_layout(p) == seen for p, seen in zip(params, joint.layouts)))


def _may_stack(first: torch.Tensor) -> bool:
    """Whether new weights may be stacked now: not under tracing, not under inference_mode (which would make
    the Parameters' new data inference tensors, unusable in training later), not in a CUDA graph capture (the
    stacked weights would live in the graph's memory pool). Elsewhere the module's own GEMMs run this time."""
    return not (_IS_COMPILING() or _INFERENCE_MODE_ON() or
                (first.is_cuda and torch.cuda.is_current_stream_capturing()))


def _joint_of(weights: tuple[torch.Tensor, ...], biases: tuple[torch.Tensor, ...] = ()) -> _Joint:
    """The weights (and biases) moved into one storage each (``_join``), with their views."""
    weight = _join(weights)
    bias = _join(biases) if biases else None  # moves the biases' data: their addresses are read after it
    params = weights + biases
    return _Joint(params, tuple(id(p) for p in params), tuple(data_layout(p) for p in params), weight, weight.t(),
                  bias)


class FusedMLP(_MixedIn):
    """A SiLU-gated MLP, ``down(silu(gate(x)) * up(x))``, whose gate and up projections run as one
    ``gated_matmul`` (x read once, one launch, the product in the epilogue).

    ``kernels.patch`` makes one of a module whose Linears are named as a model names them (``gate_proj``,
    ``up_proj``, ``down_proj`` in transformers' Llama, Mistral, Qwen2 and DeepSeek; ``w1``, ``w3``, ``w2`` in
    Meta's Llama and Mixtral's experts; Phi-3's one stacked ``gate_up_proj``), gate and up without a bias,
    once the module's own forward, run on two random rows, has given what the formula gives. Nothing else
    about the module is assumed: a GELU MLP or another formula fails the check and keeps its forward. The
    check needs weights that tell SiLU from another activation: patch after loading or initializing them
    (all-zero weights are left as they are).

    The class is the module's own class with this forward mixed in (``isinstance`` still holds). The gate
    and up Linears keep their Parameters (the state dict is unchanged); their data is moved into one
    [2N, K] storage, so that the stacked weight is a view, not a copy. Where a gradient is wanted for those
    weights, the module's own forward runs: ``gated_matmul`` would differentiate by the stacked weight, which
    is no Parameter. A pickle or deep copy of the module is of its own class (patch it again).

    The module's own forward also runs where the fused one would not be what it computes: a call with more
    arguments than x; a training flag under which the check did not hold (a dropout after the product: the
    check runs in both modes); gate or up Linears or the activation replaced since patch (an adapter, another
    activation), a child added, or hooks on them or global module hooks (the fused call would skip them).
    """

    _STATE = ("_stacked", "_gated_names", "_gated_kept", "_gated_children", "_fused_modes", "_route")

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if args or kwargs:
            return self._unfused.forward(self, x, *args, **kwargs)
        route = self.__dict__.get("_route")
        if route is not None and not _COMPILING() and not takes_ours(route, x):
            return self._torch_forward(x)  # dispatch runs cuBLAS for the gated product at these rows
        weight_t = self._stacked_weight_t()
        if weight_t is None:
            return self._unfused.forward(self, x)
        rows = x.reshape(-1, x.shape[-1])
        h = gated_matmul_call(rows, weight_t)
        return self._modules[self.__dict__["_gated_names"].down](h.reshape(*x.shape[:-1], h.shape[-1]))

    def _torch_forward(self, x: torch.Tensor) -> torch.Tensor:
        """What the module's own forward computes, as the same torch calls in the same order (the gate's and
        up's ``F.linear``, SiLU, the product, then the down Linear's call), without the module calls of the
        gate, the up and the activation: at decode rows, where each GEMM is short, those cost the patched MLP
        more host time than vanilla's (vanilla's over ours 0.909-0.982x at 16 and 64 rows, H200, 2026-11-29, torch
        2.11.0+cu130, triton 3.6.0, ``scripts/module_cost.py``; docs/PYTORCH.md "Never slower"). The module's
        own forward runs where this would not be what it computes (a training flag the check did not hold
        under, the gate or up Linears replaced or hooked) and where the gate and up Linears themselves run our
        kernels at these rows (their own evidence)."""
        state = self.__dict__
        names = state["_gated_names"]
        if self.training not in state["_fused_modes"] or not _children_as_checked(self, state["_gated_kept"]):
            return self._unfused.forward(self, x)
        gate_linear = self._modules[names.gate]
        if type(gate_linear) is not nn.Linear:  # a kernels.nn.Linear: its route (None: ours on every call)
            gate_route = gate_linear.__dict__.get("_route")
            if gate_route is None or takes_ours(gate_route, x):
                return self._unfused.forward(self, x)
        gate, up = _gate_and_up(self)
        down = self._modules[names.down]
        if gate is None or (up is None and names.up is not None):
            return self._unfused.forward(self, x)  # a parametrized weight: its property computes it
        if up is None:  # one [2N, K] Linear (Phi-3): up * act(gate), as its forward writes it
            gate_out, up_out = _LINEAR(x, gate).chunk(2, dim=-1)
            return down(up_out * _SILU(gate_out))
        return down(_SILU(_LINEAR(x, gate)) * _LINEAR(x, up))

    def _stacked_weight_t(self) -> torch.Tensor | None:
        """[Wg Wu]^T, or None where the module's own forward must run. Read through the dicts, not attribute
        access: nn.Module.__getattr__ cost about 0.5 us per name (timeit on the CPU machine, 2026-11-26)."""
        state = self.__dict__
        if self.training not in state["_fused_modes"] or not _children_as_checked(self, state["_gated_kept"]):
            return None
        gate, up = _gate_and_up(self)
        if gate is None or (gate.requires_grad and _GRAD_ENABLED()):
            return None  # a parametrization added since, or a gradient wanted for the weights
        if up is None:  # one [2N, K] weight already
            return gate.t() if self.__dict__["_gated_names"].up is None else None
        if up.requires_grad and _GRAD_ENABLED():
            return None
        stacked = self.__dict__.get("_stacked")
        if _holds(stacked, (gate, up)):
            return stacked.weight_t
        if not _may_stack(gate):
            return None
        stacked = _stack(gate, up)  # new Parameters, or new data under the old ones
        self.__dict__["_stacked"] = stacked  # not Module.__setattr__: not a buffer, not in the state dict
        return stacked.weight_t

    def _apply(self, fn: Any, recurse: bool = True) -> Any:  # .to(), .half(): each weight moves on its own
        self.__dict__.pop("_stacked", None)
        module = super()._apply(fn, recurse)
        gate, up = _gate_and_up(self)
        if gate is not None and up is not None and gate.is_floating_point() and gate.device.type != "meta":
            self.__dict__["_stacked"] = _stack(gate, up)
        return module

# torch's global module hooks (nn.modules.module.register_module_forward_hook ...): dicts changed in place.
def _global_hooks_in_module_py() -> bool:
    return bool(_global_forward_pre_hooks or _global_forward_hooks or  # noqa: F821 (module.py's globals)
                _global_backward_pre_hooks or _global_backward_hooks)  # noqa: F821


# Whether any global module hook is registered: the four dicts read as torch's own ``Module._call_impl`` reads
# them, as globals of torch/nn/modules/module.py. Read from here (a tuple of them, or ``_torch_module.``), each
# dict would be one object that traced code reaches by two paths: four guards that Dynamo checks in Python on
# every call of a compiled model (docs/PYTORCH.md, "Guards").
_any_global_hook = types.FunctionType(_global_hooks_in_module_py.__code__, vars(_torch_module), "_any_global_hook")


def _children_as_checked(module: nn.Module, kept: tuple[tuple[str, int, bool], ...]) -> bool:
    """Whether the gate and up Linears, and the module's other children but the down Linear (its activation),
    are the objects the check ran on (the Linears still plain ones), with no hook of their own and no global
    module hook: a fused call skips their forward, which hooks must see (an activation hook that records the
    MLP's activations, say), and an activation replaced since would compute another formula. ``kept`` names
    each child by its id (the objects stay alive in ``_gated_children``): see ``_holds``.

    A plain Linear is an ``nn.Linear`` or a ``kernels.nn.Linear``, no subclass. Traced, that is asked with
    ``isinstance``: Dynamo then guards the child's exact type in C++, where ``type(child)`` of the gate and the
    up, one class reached by two paths, costs a guard checked in Python; a subclass swapped in since the trace
    fails that guard, and only the trace that follows takes it for a Linear."""
    if _any_global_hook():
        return False
    modules = module._modules
    if len(modules) != len(kept) + 1:  # a child added since: not what the check ran
        return False
    compiling = _COMPILING()
    for name, child_id, linear in kept:
        child = modules.get(name)
        if id(child) != child_id or \
                (linear and not (isinstance(child, _NN_LINEAR) if compiling else type(child) in _PLAIN_LINEARS)) or \
                child._forward_hooks or child._forward_pre_hooks or child._backward_hooks or \
                child._backward_pre_hooks:
            return False
    return True


def _gate_and_up(module: nn.Module) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """A FusedMLP's (gate weight, up weight), or (the stacked [2N, K] weight, None); None for a weight that
    is no Parameter any more (a parametrization added since)."""
    names = module.__dict__["_gated_names"]
    modules = module._modules
    gate = modules[names.gate]._parameters.get("weight")
    return gate, None if names.up is None else modules[names.up]._parameters.get("weight")


def _stack(gate: torch.Tensor, up: torch.Tensor) -> _Joint:
    """One [2N, K] storage for both weights, their data moved into it (the Parameters stay), and its
    transposed view; no copy where they already lie one after the other in one storage."""
    return _joint_of((gate, up))


def _join(params: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """``params`` (same dtype, device and trailing shape) as one tensor, concatenated along the first dimension,
    with each Parameter's data moved to its rows of it: afterwards each is a view of the joint tensor, which is
    no copy. Where they already lie one after the other in one storage, nothing moves."""
    with torch.no_grad():
        first = params[0]
        offset = first.storage_offset()
        adjacent = True
        for p in params:
            adjacent = adjacent and p.is_contiguous() and p.shape[1:] == first.shape[1:] and p.dtype is first.dtype \
                and p.device == first.device and p.storage_offset() == offset \
                and p.untyped_storage().data_ptr() == first.untyped_storage().data_ptr()
            offset += p.numel()
        rows = sum(p.shape[0] for p in params)
        if adjacent:
            return first.detach().as_strided((rows, *first.shape[1:]), first.stride())
        joint = torch.cat([p.detach() for p in params])
        start = 0
        for p in params:
            p.data = joint[start:start + p.shape[0]]
            start += p.shape[0]
        return joint


_PLAIN_LINEARS = (nn.Linear, Linear)


def _linear_child(module: nn.Module, name: str, bias_allowed: bool) -> nn.Module | None:
    """``module``'s child ``name`` where it is a plain (or patched) Linear with a weight of its own to share."""
    child = module._modules.get(name)
    if type(child) not in _PLAIN_LINEARS or (child.bias is not None and not bias_allowed):
        return None
    weight = child._parameters.get("weight")  # a parametrized weight is computed: no storage to share
    # A tensor subclass (a DTensor shard, a quantized tensor) has no plain storage to stack into.
    if weight is None or type(weight.data) is not torch.Tensor or not weight.is_floating_point() \
            or weight.device.type == "meta":
        return None
    return child


def _gated_children(module: nn.Module) -> tuple[_Names, tuple[nn.Module, ...]] | None:
    """The names and the (gate, up, down) Linears, or (gate_up, down), where ``module`` has the shape of a
    gated MLP by one of the conventions; else None."""
    for names in _CONVENTIONS:
        down = _linear_child(module, names.down, bias_allowed=True)
        gate = _linear_child(module, names.gate, bias_allowed=False)
        if down is None or gate is None:
            continue
        if names.up is None:
            if gate.out_features == 2 * down.in_features:
                return names, (gate, down)
            continue
        up = _linear_child(module, names.up, bias_allowed=False)
        if up is not None and up.weight.shape == gate.weight.shape and up.weight.dtype == gate.weight.dtype \
                and up.weight.device == gate.weight.device and down.in_features == gate.out_features:
            return names, (gate, up, down)
    return None


_CHECK_ROWS = 2


def _fused_modes(module: nn.Module, names: _Names, children: tuple[nn.Module, ...]) -> frozenset[bool]:
    """The training flags (False: eval, True: train) under which ``module``'s own forward gives the gated
    MLP's formula (``_computes_gated_mlp``): a dropout after the product holds in eval mode only. The flags
    of ``module`` and its submodules are set directly (no ``train()`` override runs) and restored, and the
    caller's random streams are left as they were (a train-mode dropout draws from them)."""
    flags = [(m, m.training) for m in module.modules()]
    device = children[0].weight.device
    modes = []
    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            for mode in (False, True):
                for m, _ in flags:
                    m.training = mode
                if _computes_gated_mlp(module, names, children):
                    modes.append(mode)
    finally:
        for m, flag in flags:
            m.training = flag
    return frozenset(modes)


def _computes_gated_mlp(module: nn.Module, names: _Names, children: tuple[nn.Module, ...]) -> bool:
    """Whether ``module``'s own forward gives ``down(silu(gate(x)) * up(x))`` on random rows (drawn from a
    generator of its own: the caller's random stream is left as it was)."""
    first = children[0].weight
    generator = torch.Generator(device=first.device).manual_seed(0)
    x = torch.randn(_CHECK_ROWS, first.shape[1], generator=generator, device=first.device, dtype=first.dtype)
    try:
        with torch.no_grad():
            got = module.forward(x)
            if names.up is None:
                gate, up = children[0](x).chunk(2, dim=-1)
            else:
                gate, up = children[0](x), children[1](x)
            want = children[-1](nn.functional.silu(gate) * up)
    except Exception as exc:  # another signature, another input: not a module to fuse
        log.debug("%s is not fused: its forward on %d random rows raised %r", type(module).__name__, _CHECK_ROWS, exc)
        return False
    if not isinstance(got, torch.Tensor) or got.shape != want.shape or not bool(torch.isfinite(want).all()):
        return False
    scale = want.float().norm()
    tolerance = 1e-4 if first.dtype in (torch.float32, torch.float64) else 1e-2  # relative L2 error
    return bool(scale > 0) and bool((got.float() - want.float()).norm() <= tolerance * scale)


def _fuse(module: nn.Module, evidence: Evidence) -> bool:
    """Make ``module`` a ``FusedMLP`` where it is a SiLU-gated MLP by its Linears and by its forward's result,
    and dispatch runs one of our kernels for its gated product (``evidence``)."""
    if isinstance(module, FusedMLP):
        return True
    found = _gated_children(module)
    if found is None:
        return False
    names, children = found
    gate = children[0]
    width = gate.out_features // 2 if names.up is None else gate.out_features
    if not evidence.runs_a_kernel(GATED_MATMUL, width, gate.in_features, gate.weight):
        return False
    modes = _fused_modes(module, names, children)
    if not modes:
        return False
    module.__class__ = _mixed_class(FusedMLP, type(module))
    # Its own copy: one tuple shared by every MLP would be one object that traced code reaches by many paths.
    module.__dict__["_gated_names"] = _Names(*names)
    module.__dict__["_fused_modes"] = modes
    module.__dict__["_route"] = evidence.route(GATED_MATMUL, width, gate.in_features)  # per call: its own forward
    # (name, the child's id, whether it is the gate or up Linear) for every child but the down Linear (so the
    # activation too), as the check saw them; the children themselves kept alive, so that the ids stay theirs
    kept = [(name, child) for name, child in module._modules.items() if name != names.down]
    module.__dict__["_gated_kept"] = tuple((name, id(child), name in (names.gate, names.up)) for name, child in kept)
    module.__dict__["_gated_children"] = tuple(child for _, child in kept)
    if names.up is not None:
        module.__dict__["_stacked"] = _stack(children[0].weight, children[1].weight)
    return True


# ------------------------------------------------------------------------------------------ RMSNorms

class FusedRMSNorm(_MixedIn):
    """An RMSNorm module whose forward is one launch of ``kernels.norm.rms_norm`` in the formula its own forward
    was found to compute (``kernels.norm.FORMULAS``: Llama's, Gemma's, or the weight's product before rounding).

    ``kernels.patch`` makes one of a module with a single 1-D ``weight`` Parameter and an ``eps`` or
    ``variance_epsilon`` float, on a GPU, once a copy of it, given a random weight, has computed that formula
    on random rows and on a row whose mean square is near eps (which tells a wrong eps). The class is the
    module's own class with this forward mixed in (``isinstance`` still holds), and the state dict is
    unchanged. Its own forward runs under ``torch.compile`` (Inductor fuses it), where a gradient is wanted
    (the kernel has no backward), under autocast, and on operands the kernel does not take (``rms_norm``).
    A pickle or deep copy of the module is of its own class (patch it again).
    """

    _STATE = ("_formula", "_eps_name")

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if args or kwargs or _COMPILING():
            return self._unfused.forward(self, x, *args, **kwargs)
        state = self.__dict__
        weight = self._parameters.get("weight")
        out = None if weight is None else rms_norm(x, weight, state[state["_eps_name"]], state["_formula"])
        return out if out is not None else self._unfused.forward(self, x)


_EPS_NAMES = ("variance_epsilon", "eps")


def _fuse_norm(module: nn.Module) -> bool:
    """Make ``module`` a ``FusedRMSNorm`` where it has an RMSNorm's parameters and its forward computes one of
    the formulas (``_norm_formula``)."""
    if isinstance(module, FusedRMSNorm) or module._modules or module._buffers:
        return False
    weight = module._parameters.get("weight")
    if type(weight) is not nn.Parameter or len(module._parameters) != 1 or weight.dim() != 1 \
            or not 0 < weight.shape[0] <= MAX_WIDTH or weight.dtype not in (torch.float16, torch.bfloat16,
                                                                           torch.float32):
        return False
    eps_name = next((name for name in _EPS_NAMES if isinstance(module.__dict__.get(name), float)), None)
    if eps_name is None or not _on_triton(weight):
        return False
    formula = _norm_formula(module, eps_name)
    if formula is None:
        return False
    module.__class__ = _mixed_class(FusedRMSNorm, type(module))
    module.__dict__["_formula"] = formula
    module.__dict__["_eps_name"] = eps_name
    return True


_NORM_CHECK_ROWS = 3


def _norm_formula(module: nn.Module, eps_name: str) -> Formula | None:
    """The formula ``module``'s forward computes, found on a copy of it given a random weight (a freshly
    initialised weight of ones, or of zeros in Gemma, cannot tell the formulas apart): random rows and one
    scaled so that its mean square is near eps, each within a relative error of ``tolerance``; None where no
    formula holds (a LayerNorm, another epsilon, another formula) or the forward raises."""
    weight = module._parameters["weight"]
    eps = module.__dict__[eps_name]
    # In the module's dtype, and in bfloat16, whose rounding tells the formulas' orders apart (in float32
    # Llama's and the weighted-then-rounded one agree): a model patched in float32 may be cast after.
    errors = {formula: 0.0 for formula in FORMULAS}
    for dtype in dict.fromkeys((weight.dtype, torch.bfloat16)):
        generator = torch.Generator(device=weight.device).manual_seed(0)
        try:
            probe = copy.deepcopy(module).to(dtype)
            with torch.no_grad():
                probe.weight.copy_(torch.rand(weight.shape, generator=generator, device=weight.device) * 2 - 0.5)
                x = torch.randn(_NORM_CHECK_ROWS, weight.shape[0], generator=generator, device=weight.device,
                                dtype=dtype)
                x[-1] *= max(eps, 1e-30) ** 0.5  # mean square near eps: a wrong eps moves this row by ~sqrt(2)
                got = probe.forward(x)
                for formula in FORMULAS:
                    error = _row_error(got, rms_norm_reference(x, probe.weight, eps, formula))
                    errors[formula] = max(errors[formula], error / (1e-5 if dtype == torch.float32 else 2e-3))
        except Exception as exc:  # another signature or input: not a norm to fuse
            log.debug("%s is not fused: its forward on random rows raised %r", type(module).__name__, exc)
            return None
    formula = min(FORMULAS, key=errors.__getitem__)  # errors in units of each dtype's tolerance
    return formula if errors[formula] <= 1.0 else None


def _row_error(got: object, want: torch.Tensor) -> float:
    """The largest relative L2 error of a row (inf where the shapes or dtypes differ)."""
    if not isinstance(got, torch.Tensor) or got.shape != want.shape or got.dtype != want.dtype:
        return float("inf")
    difference = (got.float() - want.float()).norm(dim=-1)
    scale = want.float().norm(dim=-1)
    if not bool(torch.isfinite(difference).all()) or not bool((scale > 0).all()):
        return float("inf")
    return float((difference / scale).max())


# ------------------------------------------------------------------------- projections of one input

# The Linears an attention module calls on one input, by the names models give them. Nothing is checked
# on the module's forward (it needs masks, positions, caches): each Linear keeps returning its own product,
# and fusion stops by itself where the model does not call them on one input (``SharedInput``).
_SHARED_INPUT_NAMES = (
    ("q_proj", "k_proj", "v_proj"),  # transformers' Llama, Mistral, Qwen2, Gemma, OPT, BART
    ("wq", "wk", "wv"),  # Meta's Llama
    ("query", "key", "value"),  # BERT, RoBERTa, ViT
    ("q", "k", "v"),  # T5
)


class _Pending(NamedTuple):
    input: torch.Tensor  # held until every member has had its columns
    # the input's version counter then; None under torch.compile (Dynamo cannot read it) and for an inference
    # tensor (inference_mode's: it has none), where the input's identity alone is asked
    version: int | None
    output: torch.Tensor  # [..., N_1 + N_2 + ...]
    waiting: int  # a bit per member that has not had its columns
    grad: bool  # grad mode then: a member called under the other one runs its own GEMM


class SharedInput:
    """Linears a model calls on one input (an attention module's query, key and value projections) computed
    as one GEMM over their stacked weights: the input read once, one launch, one larger problem in place of
    two or three small ones (at decode the key and value projections of a GQA model are short kernels that
    never reach the card's copy rate).

    ``kernels.patch`` makes each member a ``SharedInputLinear``. The first member called on an input runs
    the stacked product and returns its columns; the others, called on that same tensor (the same object,
    not written since: its version counter says so), get theirs from it. Each still returns exactly its own
    ``x @ W^T + b`` (a view of the stacked output's columns), so nothing about the module's forward is
    assumed. Where the model calls a member on another input while another member has not yet had its
    columns (cross-attention: keys and values of the encoder's states; a cache that skips the key and value
    projections), the group stops fusing for good and each member runs its own GEMM.

    Under ``torch.compile`` the same object is asked for, not the version counter (Dynamo cannot read it): a
    model that writes into the input in place between its projections must be patched with
    ``fuse_qkv=False``.
    """

    def __init__(self, members: tuple[nn.Module, ...]) -> None:
        self.members = members
        bounds, start = [], 0
        for member in members:
            bounds.append((start, member.out_features))
            start += member.out_features
        self.bounds = tuple(bounds)
        self.fusing = True
        self.route: Route | None = None  # kernels/_evidence.py: None takes the stacked GEMM on every call
        self.joint: _Joint | None = _joint(members)
        self.pending: _Pending | None = None  # the product of the input the members are being called on

    def columns(self, slot: int, x: torch.Tensor, own: bool = True) -> torch.Tensor | None:
        """Member ``slot``'s product with ``x``, or None where it must run its own GEMM. ``own``: whether the
        member's own Parameters are those the stacked weight was made of, as the member asks it under tracing
        (``_own_params_hold``); there this reads no member, each of which the traced code also reaches as its
        module's child: an alias that Dynamo would check in Python on every call (docs/PYTORCH.md, "Guards")."""
        compiling = _IS_COMPILING()
        grad = _GRAD_ENABLED()
        # One read of one attribute: a thread that calls the same module meanwhile replaces the whole tuple,
        # so what is read here is one input's product, never another's (at worst the group stops fusing).
        pending = self.pending
        if pending is not None:
            if pending.input is x and (compiling or pending.version is None or pending.version == x._version):
                waiting = pending.waiting & ~(1 << slot)
                self.pending = pending._replace(waiting=waiting) if waiting else None
                if pending.grad is not grad or not own:  # made without a graph, wanted with one (or the reverse)
                    return None
                return self._handed_out(pending.output, slot)
            # Another input while a member still waits: this model does not call them all on one input.
            self.pending = None
            self.fusing = False
            if not compiling:
                log.info("kernels.nn: projections of widths %s are not called on one input; each runs its own "
                         "GEMM from now on", "/".join(str(width) for _, width in self.bounds))
            return None
        if x.dim() == 0 or _AUTOCAST_ON() or not own:
            return None  # the member's own forward raises, or casts as torch's linear does
        # Traced, each member has asked about its own Parameters (``own``): a stale one runs its own GEMM, and the
        # stacked weight's rows of the others stay theirs.
        joint = self.joint if compiling else self._current()
        if joint is None:
            return None
        rows = x if x.dim() == 2 else x.reshape(-1, x.shape[-1])
        output = linear_call(rows, joint.weight, joint.bias, self._weight_t)
        if x.dim() != 2:
            output = output.reshape(*x.shape[:-1], output.shape[-1])
        self.pending = _Pending(x, None if compiling or x.is_inference() else x._version, output,
                                ((1 << len(self.bounds)) - 1) & ~(1 << slot), grad)
        return self._handed_out(output, slot)

    def _handed_out(self, output: torch.Tensor, slot: int) -> torch.Tensor:
        """Member ``slot``'s columns of the stacked output: a view, or a copy where autograd records it. Views
        of one output share its version counter: an in-place write into v would fail q's and k's backward."""
        start, width = self.bounds[slot]
        columns = output.narrow(-1, start, width)
        return columns.clone() if output.requires_grad else columns

    def _weight_t(self, weight: torch.Tensor) -> torch.Tensor:
        return self.joint.weight_t

    def stack_if_ready(self) -> None:
        """Stack the members' weights again where they agree (one dtype and device, as after a cast of the
        whole module) and may be stacked now (not on the meta device, not under inference_mode)."""
        params = _member_params(self.members)
        if params is not None and params[0].is_floating_point() and params[0].device.type != "meta" and \
                not _INFERENCE_MODE_ON():
            self.joint = _joint(self.members)

    def _current(self) -> _Joint | None:
        """The joint weights, stacked again where a member's Parameters or their data changed; None where the
        members must run their own GEMMs this time (a gradient wanted for a weight, a parametrized weight)."""
        params = _member_params(self.members)
        if params is None:
            return None
        if _GRAD_ENABLED() and any(p.requires_grad for p in params):
            return None  # the stacked weight is no Parameter: autograd would not reach the members'
        if _holds(self.joint, params):
            return self.joint
        if not _may_stack(params[0]):
            return None
        self.joint = _joint(self.members)
        return self.joint


def _member_params(members: tuple[nn.Module, ...]) -> tuple[torch.Tensor, ...] | None:
    """The members' weights, then their biases (all or none), as Parameters; None where one is not (a
    parametrization added since) or where they no longer match (one bias removed, a dtype changed)."""
    weights = tuple(m._parameters.get("weight") for m in members)
    biases = tuple(m._parameters.get("bias") for m in members)
    if any(type(w) is not _PARAMETER for w in weights):
        return None
    first = weights[0]
    if any(w.dtype is not first.dtype or w.device != first.device or w.shape[1] != first.shape[1] for w in weights):
        return None
    if all(b is None for b in biases):
        return weights
    if any(type(b) is not _PARAMETER or b.dtype is not first.dtype for b in biases):
        return None
    return weights + biases


def _joint(members: tuple[nn.Module, ...]) -> _Joint | None:
    params = _member_params(members)
    if params is None:
        return None
    return _joint_of(params[:len(members)], params[len(members):])


class SharedInputLinear(Linear):
    """A ``kernels.nn.Linear`` that is one of a ``SharedInput`` group: its product comes from the group's stacked
    GEMM where the model calls the group on one input, from its own GEMM elsewhere. Pickled and deep-copied
    as a ``kernels.nn.Linear`` (patch the copy again to fuse it)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        group = self.__dict__.get("_shared")
        if group is not None and group.fusing and (group.route is None or _COMPILING() or
                                                   takes_ours(group.route, x)):
            slot = self.__dict__["_slot"]
            y = group.columns(slot, x, _own_params_hold(self, group.joint, slot) if _COMPILING() else True)
            if y is not None:
                return y
        return Linear.forward(self, x)

    def _apply(self, fn: Any, recurse: bool = True) -> Any:  # .to(), .half(): each member's weight moves alone
        group = self.__dict__.get("_shared")
        if group is not None:  # the joint weight must not keep the old storage alive after the cast
            group.joint = None
            group.pending = None
        module = super()._apply(fn, recurse)
        if group is not None:
            group.stack_if_ready()  # once the last member has moved: all of one dtype and device again
        return module

    def __reduce_ex__(self, protocol: Any) -> Any:
        state = {name: value for name, value in self.__getstate__().items() if name not in _SHARED_STATE}
        return _new_module, (Linear,), state


_SHARED_STATE = ("_shared", "_slot")  # what a SharedInputLinear keeps in its __dict__


def _own_params_hold(member: nn.Module, joint: _Joint | None, slot: int) -> bool:
    """Under tracing: whether ``member``'s weight (and bias) are the Parameters whose data the stacked weight
    holds at ``slot`` (by id, as ``_holds``), with no gradient wanted for them (the stacked weight is no
    Parameter: autograd would not reach theirs)."""
    if joint is None:
        return False
    params = member._parameters
    weight = params.get("weight")
    if id(weight) != joint.param_ids[slot] or (weight.requires_grad and _GRAD_ENABLED()):
        return False
    members = len(joint.param_ids) if joint.bias is None else len(joint.param_ids) // 2
    bias = params.get("bias")
    if joint.bias is None:
        return bias is None
    return id(bias) == joint.param_ids[members + slot] and not (bias.requires_grad and _GRAD_ENABLED())


def _shared_input_members(module: nn.Module) -> tuple[nn.Module, ...] | None:
    """The projections of ``module`` that one naming convention names, where they can share one GEMM: plain
    (or patched) Linears with weights of their own, one input width, dtype and device, biases all or none."""
    for names in _SHARED_INPUT_NAMES:
        members = tuple(_linear_child(module, name, bias_allowed=True) for name in names)
        if any(m is None for m in members) or any(isinstance(m, SharedInputLinear) for m in members):
            continue
        if _member_params(members) is not None and len({id(m) for m in members}) == len(members):
            return members
    return None


def _share_input(module: nn.Module, evidence: Evidence) -> bool:
    """Make ``module``'s projections of one input a ``SharedInput`` group, where it has them and dispatch runs
    one of our kernels for their stacked product at some row count (``evidence``). At the row counts where it
    runs cuBLAS, each member runs its own GEMM, as torch's Linear would.

    Stacking on cuBLAS (one ``F.linear`` on the stacked weight where the members make three) was tried on an
    H200 (2026-11-28, torch 2.11.0+cu130, triton 3.6.0, transformers 5.24.0: whole 2-layer Qwen2.5-7B and Llama-3.1-8B
    forwards at 1, 16 and 512 tokens, docs/runs/2026-11-28-h200-record-tune/ab_forward.py) and read 0.94-1.02x
    of vanilla where an unpatched copy read 0.97-1.08x: no gain shown, so neither a group without
    evidence nor a group's cuBLAS rows take it, and a model on a GPU with no table stays as it was."""
    members = _shared_input_members(module)
    if members is None:
        return False
    first = members[0]
    spec, width = _linear_spec(first), sum(m.out_features for m in members)
    if not evidence.runs_a_kernel(spec, width, first.in_features, first.weight):
        return False
    group = SharedInput(members)
    group.route = evidence.route(spec, width, first.in_features)  # per call: each member's own GEMM
    for slot, member in enumerate(members):
        member.__class__ = SharedInputLinear
        member.__dict__["_shared"] = group
        member.__dict__["_slot"] = slot
        # its own GEMM, where it runs one, routes as a patched Linear does
        member.__dict__["_route"] = evidence.route(_linear_spec(member), member.out_features, member.in_features)
    return True


def route(logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Top-k routing in torch, laid out for ``moe_matmul``.

    Returns (order, weights, offsets, counts): ``order`` [T * top_k] the token of each sorted row, ``weights``
    [T * top_k] each sorted row's gate weight (softmax over the chosen k), ``offsets`` [E] int32 the running
    end row of each expert, on the device (no host sync), and ``counts`` [E] the rows per expert.
    """
    routed = _route(logits, top_k)
    return routed.token, routed.gate[routed.perm], routed.offsets, routed.counts


class _Routed(NamedTuple):
    perm: torch.Tensor  # [T * k]: the (token, slot) index, token * k + slot, of each sorted row
    position: torch.Tensor  # [T * k]: the sorted row of each (token, slot); perm's inverse
    gate: torch.Tensor  # [T * k]: each (token, slot)'s gate weight, in (token, slot) order
    offsets: torch.Tensor  # [E] int32 running end rows
    counts: torch.Tensor  # [E] int64 rows per expert
    token: torch.Tensor  # [T * k]: the token of each sorted row (perm // k)


# Under torch.compile, top-k over this few experts is k masked maxima, which Inductor fuses with the softmax
# into the router's one reduction; torch.topk is two kernels of its own (a gather and a sort), 5 us each in a
# one-token Mixtral step on the H100 (2026-11-26, docs/BENCHMARKS.md).
_FUSED_TOP_K_EXPERTS = 256
_FUSED_TOP_K = 4


def _top_k(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """torch.topk(logits, k, dim=-1): the k largest, largest first, with their indices."""
    if not (_IS_COMPILING() and k <= _FUSED_TOP_K and logits.shape[-1] <= _FUSED_TOP_K_EXPERTS):
        return torch.topk(logits, k, dim=-1)
    values, indices, rest = [], [], logits
    for _ in range(k):
        value, index = rest.max(dim=-1, keepdim=True)
        values.append(value)
        indices.append(index)
        rest = rest.scatter(-1, index, float("-inf"))
    return torch.cat(values, -1), torch.cat(indices, -1)


def _route(logits: torch.Tensor, top_k: int) -> _Routed:
    experts = logits.shape[-1]
    if not 1 <= top_k <= experts:
        raise ValueError(f"top_k must be in 1..{experts} (the number of experts); got {top_k}")
    gate, chosen = _top_k(logits, top_k)
    gate = torch.softmax(gate.float(), dim=-1).to(logits.dtype).reshape(-1)
    routed = sort_by_expert(chosen.reshape(-1), experts, top_k)
    return _Routed(routed.perm, routed.position, gate, routed.offsets, routed.counts, routed.token)


_MOE_DTYPES = (torch.float16, torch.bfloat16)


class MoE(nn.Module):
    """A Mixtral-style sparse MLP: router, top-k, and per-expert SwiGLU (w1 gate, w3 up, w2 down), the three
    expert GEMMs each one ``moe_matmul`` launch. Weights are stored as nn.Linear would: [E, out, in]. In
    another dtype than float16 or bfloat16 (float32, the default of a fresh module) the block runs its
    torch reference, expert by expert: right, not fast."""

    def __init__(self, hidden: int, ffn: int, experts: int, top_k: int = 2,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        self.top_k = top_k
        self.gate = nn.Linear(hidden, experts, bias=False, **factory)
        self.w1 = nn.Parameter(torch.empty(experts, ffn, hidden, **factory))
        self.w3 = nn.Parameter(torch.empty(experts, ffn, hidden, **factory))
        self.w2 = nn.Parameter(torch.empty(experts, hidden, ffn, **factory))
        for w, fan_in in ((self.w1, hidden), (self.w3, hidden), (self.w2, ffn)):
            nn.init.normal_(w, std=fan_in ** -0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.w1.dtype not in _MOE_DTYPES:  # moe_matmul runs float16 and bfloat16 (float32 is nn's default)
            return self.reference(x)
        tokens = x.reshape(-1, x.shape[-1])
        routed = _route(self.gate(tokens), self.top_k)
        offsets = routed.offsets
        rows = tokens.index_select(0, routed.token)
        # route's offsets end at T * top_k, every row: no output fill needed (all_rows=True)
        gate = moe_matmul_call(rows, self.w1.transpose(1, 2), offsets, True)
        up = moe_matmul_call(rows, self.w3.transpose(1, 2), offsets, True)
        down = moe_matmul_call(nn.functional.silu(gate) * up, self.w2.transpose(1, 2), offsets, True)
        # Back to (token, slot) order and summed over each token's k rows: a gather, no atomics (index_add_
        # of the weighted rows into zeros took 0.15 ms of a 2048-token Mixtral block on the H100, of 2.9;
        # docs/BENCHMARKS.md, 2026-11-26), as transformers' experts are combined (kernels/hf.py).
        out = combine(down, routed.position, routed.gate.view(tokens.shape[0], self.top_k), x.dtype)
        return out.reshape(x.shape)

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        """The same block in plain torch, expert by expert: what ``forward`` must equal."""
        tokens = x.reshape(-1, x.shape[-1])
        logits = self.gate(tokens)
        gate, chosen = torch.topk(logits, self.top_k, dim=-1)
        gate = torch.softmax(gate.float(), dim=-1).to(x.dtype)
        out = torch.zeros_like(tokens)
        for e in range(self.w1.shape[0]):
            token, slot = torch.nonzero(chosen == e, as_tuple=True)
            h = nn.functional.silu(tokens[token] @ self.w1[e].t()) * (tokens[token] @ self.w3[e].t())
            out.index_add_(0, token, (h @ self.w2[e].t()) * gate[token, slot][:, None])
        return out.reshape(x.shape)
