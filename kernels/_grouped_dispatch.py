"""The eager bodies of ``kernels.grouped_matmul``, ``kernels.moe_matmul`` and ``kernels.moe_gated_matmul``:
config lookup, then one launch.

Their operators (kernels/ops.py) call these; these reach the operators through ``torch.ops.triton_tuner``
(registered when the package loads), so neither module imports the other's caller.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence

import torch

from . import _device, _modes, _native, grouped, moe, moe_gated
from ._device import current_device
from ._launch import SLOT_A, SLOT_B, SLOT_C, SLOT_D, BoundedDict
from ._plans import OUT_WITH_GRAD
from ._record_mode import RECORDER as _REC
from ._spec import BASELINE, is_baseline
from .dispatch import DISPATCHER
from .grouped import GROUPED_MATMUL
from .moe import MOE_MATMUL

__all__ = ["grouped_matmul", "moe_gated_matmul", "moe_matmul", "traced_grouped_matmul", "traced_moe_gated_matmul",
           "traced_moe_matmul"]

_COMPILING = torch.compiler.is_dynamo_compiling  # Dynamo folds it to True while it traces (kernels/_plans.py)
_GRAD_ENABLED = torch.is_grad_enabled
_NATIVE = _native.NATIVE


def grouped_matmul(As: Sequence[torch.Tensor], Bs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """[A_i @ B_i for each i] in one persistent launch, with the config tuned for this group.

    A repeated call with the same operands (same addresses, shapes and strides) finds its config,
    pointer table and output layout in one lookup; new operands pay one checked pass to build them.
    It has no backward: an operand that requires grad, in grad mode, raises (use torch.no_grad()).
    Under torch.compile the call is its operator, ``torch.ops.triton_tuner.grouped_matmul``.
    """
    if _COMPILING():  # traced: the operator, not this body
        return traced_grouped_matmul(As, Bs)
    pairs = grouped.signature(As, Bs)
    if pairs is not None and _GRAD_ENABLED() and (any(map(_WANTS_GRAD, As)) or any(map(_WANTS_GRAD, Bs))):
        raise RuntimeError("kernels.grouped_matmul has no backward, but an operand requires grad; call it under "
                           "torch.no_grad() or on detached tensors (A.detach()), or use kernels.matmul per pair")
    mode = _modes.current(pairs is not None and As[0].is_cuda)
    launch = grouped.CALLS.get((pairs, mode), _MISSING) if pairs is not None else _MISSING
    if launch is _MISSING:
        problem = GROUPED_MATMUL.problem_of(As, Bs)  # the precise check, with messages
        device = As[0].device
        if device.type == "cpu" and not _device.INTERPRETED:
            return [torch.matmul(a, b) for a, b in zip(As, Bs)]
        key = (device, problem, mode)
        config = DISPATCHER.cached(key) or DISPATCHER.resolve(key, GROUPED_MATMUL, problem, current_device(device), mode)
        launch = None if is_baseline(config) else grouped.prepare(config, pairs, device)
        if launch is None or not launch.built_in_capture:  # a table filled only by its graph's replay
            grouped.CALLS.put((pairs, mode), launch)
        if _REC.on:
            _REC.seen((pairs, mode) if pairs is not None else (problem, mode), GROUPED_MATMUL.name, problem,
                      current_device(device))
            if pairs is None:  # never cached: every call comes here
                _REC.counts[(problem, mode)] += 1
    if _REC.on and pairs is not None:
        _REC.counts[(pairs, mode)] += 1
    if launch is None:  # cuBLAS won this group
        return GROUPED_MATMUL.baseline((As, Bs))
    return launch(As[0])


_MISSING = object()
_WANTS_GRAD = operator.attrgetter("requires_grad")


def moe_matmul(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor,
               out: torch.Tensor | None = None) -> torch.Tensor:
    """Mixture-of-experts GEMM in one launch: rows ``offsets[e-1]:offsets[e]`` of ``x`` times ``w[e]``.

    ``x`` [T, K] holds the tokens sorted by expert, ``w`` [E, K, N] the experts (``w_nk.transpose(1, 2)``
    for weights stored [E, N, K]), ``offsets`` [E] int32 the running end rows, on the device (as for
    ``torch._grouped_mm``). Rows at or past ``offsets[-1]`` are not written. The host never reads
    ``offsets``: the config is the one tuned for (T, E, N, K) on this GPU. Operands that require grad, in
    grad mode, take ``kernels.ops.moe_matmul`` (a tuned backward; it zeroes the rows past ``offsets[-1]``).
    Under torch.compile the call is that operator (``moe_matmul_out`` with ``out=``).

    A repeated signature (shapes, strides, dtypes, devices, mode) makes one dict lookup, then launches
    (``moe.Ready``); its first call checks the operands and resolves the config. On a GPU an eager signature's
    plan is then served from C++ (``_hand_over``).
    """
    if _COMPILING():  # traced: the operator, not this body
        return traced_moe_matmul(x, w, offsets, out)
    if out is None:
        native = _NATIVE.try_moe
        if native is not None:  # a handed-over signature, served from C++; anything else comes back None
            c = native(x, w, offsets)
            if c is not None:
                return c
    signature = _signature(False, x, w, offsets) if out is None else None
    plan = _served(signature, x, w)
    if plan is not None:
        return moe.run_ready(plan, x, w, offsets)
    changes = DISPATCHER.changes  # before resolving: a clear while it resolves leaves the plan stale
    if not moe.operands_ok(x, w, offsets):
        moe.check_operands(x, w, offsets)
    if _wants_grad(x, w):  # the launch records no autograd graph
        if out is not None:
            raise RuntimeError(OUT_WITH_GRAD.format(name="moe_matmul"))
        # The operator with a backward; it zeroes the rows at or past offsets[-1], which this leaves unwritten.
        return torch.ops.triton_tuner.moe_matmul(x, w, offsets)  # registered by kernels/ops.py
    if x.device.type == "cpu" and not _device.INTERPRETED:
        return moe.launch(BASELINE, x, w, offsets, out)
    key = moe.dispatch_key(x, w, _modes.current(x.is_cuda))
    config = DISPATCHER.cached(key)
    if config is None:
        problem = moe.balanced_problem(moe._DTYPE_NAMES[x.dtype], "n" + key[6], *key[2:6])
        config = DISPATCHER.resolve(key, MOE_MATMUL, problem, current_device(x.device), key[-1])
        if _REC.on:
            _REC.seen(key, MOE_MATMUL.name, problem, current_device(x.device))
    if _REC.on:
        _REC.counts[key] += 1
    plan = moe.ready(config, key, changes, x, w, offsets, False, moe.launch) if signature is not None else None
    _keep(signature, plan)
    c = moe.launch(config, x, w, offsets, out)
    _hand_over(plan, False, x, w, offsets)
    return c


def moe_gated_matmul(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """silu(x @ w_gate) * (x @ w_up) per expert in one launch: ``moe_matmul``'s operands with w [E, K, 2N], the
    gate's N columns then the up's (``gate_up_proj.transpose(1, 2)`` of a transformers experts module), and
    an [T, N] output. Rows at or past ``offsets[-1]`` are not written. The host never reads ``offsets``.

    It has no backward of its own: operands that require grad, in grad mode, take the unfused operators
    (``kernels.ops.moe_matmul``, whose backward is tuned, then torch's gating). Under torch.compile the call
    is its operator, ``torch.ops.triton_tuner.moe_gated_matmul`` (it zeroes the rows past ``offsets[-1]``).
    A repeated signature makes one dict lookup, as ``moe_matmul``'s.
    """
    if _COMPILING():  # traced: an operator, not this body
        return traced_moe_gated_matmul(x, w, offsets)
    native = _NATIVE.try_moe_gated
    if native is not None:
        c = native(x, w, offsets)
        if c is not None:
            return c
    signature = _signature(True, x, w, offsets)
    plan = _served(signature, x, w)
    if plan is not None:
        return moe.run_ready(plan, x, w, offsets)
    changes = DISPATCHER.changes
    if not moe_gated.operands_ok(x, w, offsets):
        moe_gated.check_operands(x, w, offsets)
    if _wants_grad(x, w):  # the launch records no autograd graph
        return _unfused_gated(x, w, offsets)
    if x.device.type == "cpu" and not _device.INTERPRETED:
        return moe_gated.launch(BASELINE, x, w, offsets)
    key = moe_gated.dispatch_key(x, w, _modes.current(x.is_cuda))
    config = moe_gated.resolve(key)
    if _REC.on:
        _REC.counts[key] += 1
    plan = moe.ready(config, key, changes, x, w, offsets, True, moe_gated.launch) if signature is not None else None
    _keep(signature, plan)
    c = moe_gated.launch(config, x, w, offsets)
    _hand_over(plan, True, x, w, offsets)
    return c


# Each eager signature's ``moe.Ready``: (gated, x's and w's shapes and strides, the three dtypes, offsets'
# shape, the three devices, the dispatch mode). Ever-new signatures start it again past its capacity.
_READY: BoundedDict = BoundedDict(4096)


def _signature(gated: bool, x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor) -> tuple | None:
    """What a ``moe.Ready`` is kept by; None for operands that are not tensors (the checks name them)."""
    try:
        return (gated, x.shape, x.stride(), w.shape, w.stride(), x.dtype, w.dtype, offsets.dtype, offsets.shape,
                x.device, w.device, offsets.device, _modes.current(x.is_cuda))
    except (AttributeError, TypeError):
        return None


def _served(signature: tuple | None, x: torch.Tensor, w: torch.Tensor) -> moe.Ready | None:
    """The kept plan of ``signature`` where a call may run it now (dispatch's answers unchanged since it was
    made, no gradient wanted), counted in record mode; else None (the call takes the whole path)."""
    plan = _READY.get(signature)
    if plan is None or plan.changes != DISPATCHER.changes or _wants_grad(x, w):
        return None
    if _REC.on:
        _REC.counts[plan.key] += 1
    return plan


def kept_plan(gated: bool, x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor) -> moe.Ready | None:
    """``_served`` for kernels/ops.py's direct calls, which have checked that nothing traces or watches the call
    (``ops._direct``'s conditions): the eager body's own lookup, before the operator's wrappers."""
    return _served(_signature(gated, x, w, offsets), x, w)


def _keep(signature: tuple | None, plan: moe.Ready | None) -> None:
    if plan is not None:
        _READY[signature] = plan


def _hand_over(plan: moe.Ready | None, gated: bool, x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor) -> None:
    """Hand an eager GPU signature's plan to the C++ path (kernels/_native.py ``remember_moe``), which then serves
    its calls while the dispatcher's answers stand: its Triton launch, once a call has compiled it, or, for
    ``moe_matmul``, torch._grouped_mm where that is the whole plan. From Python the kept plan still cost the
    signature's key and lookup: 1.19-1.20x torch._grouped_mm's host time at 8 routed rows, against 1.00-1.01x
    from C++ (H200, 2026-11-29, torch 2.11.0+cu130, triton 3.6.0; docs/BENCHMARKS.md "MoE plans served from
    C++")."""
    if plan is None or not x.is_cuda or plan.key[-1] != _modes.EAGER or not _native.wanted():
        return
    fields = (*x.shape, *w.shape, *x.stride(), *w.stride(), offsets.shape[0], offsets.stride(0))
    if plan.kernel is None:  # the baseline: served from C++ where it is torch._grouped_mm and nothing else
        if not gated and plan.checked is moe.grouped_mm_call:
            _native.remember_moe(fields, x.dtype, offsets.dtype, x.device, False, plan.changes, None)
        return
    if not plan.kernel.ready():
        return  # not adopted by this call's launch (launch hooks listening): the kept plan serves it in Python
    made = plan.kernel.native_launch((x, w, x, offsets, *plan.ints), {0: SLOT_A, 1: SLOT_B, 2: SLOT_C, 3: SLOT_D})
    if made is not None:
        _native.remember_moe(fields, x.dtype, offsets.dtype, x.device, gated, plan.changes, [made])


def clear_ready() -> None:
    """Forget every ``moe.Ready`` (``kernels.clear_cache``): stale ones are never run, but they hold launches."""
    _READY.clear()


def _wants_grad(x: torch.Tensor, w: torch.Tensor) -> bool:
    return (x.requires_grad or w.requires_grad) and _GRAD_ENABLED()


# What the two functions are when Dynamo traces them: the operators, whose fakes give the graph its shapes, so
# no Python body with locks or caches is traced. The compiled graph then runs each operator, which calls the
# function eagerly.

def traced_grouped_matmul(As: Sequence[torch.Tensor], Bs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    return torch.ops.triton_tuner.grouped_matmul(list(As), list(Bs))


def traced_moe_matmul(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor,
                      out: torch.Tensor | None = None) -> torch.Tensor:
    """The operator zeroes the rows at or past ``offsets[-1]``, which the eager call leaves unwritten."""
    if out is None:
        return torch.ops.triton_tuner.moe_matmul(x, w, offsets)
    torch.ops.triton_tuner.moe_matmul_out(x, w, offsets, out)
    return out


def traced_moe_gated_matmul(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """The fused operator, or where a gradient is wanted the unfused ones (the fused one has no backward)."""
    if (x.requires_grad or w.requires_grad) and _GRAD_ENABLED():
        return _unfused_gated(x, w, offsets)
    return torch.ops.triton_tuner.moe_gated_matmul(x, w, offsets)


def _unfused_gated(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """``moe_matmul``'s operator (a tuned backward; rows past ``offsets[-1]`` zero) and torch's gating."""
    return moe_gated.gating(torch.ops.triton_tuner.moe_matmul(x, w, offsets))  # registered by kernels/ops.py
