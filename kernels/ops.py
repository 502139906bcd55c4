"""The tuned GEMMs as PyTorch custom operators, so that ``torch.compile`` traces them and autograd runs them.

``torch.ops.triton_tuner.matmul`` and friends call the Python dispatch (``kernels.matmul`` ...) inside, so
the config the user gets is the tuned one; each has a fake implementation (shapes only) so that
``torch.compile(fullgraph=True)`` records the call without a graph break, and the ``out=`` forms declare
their mutation in the schema (``Tensor(a!) out``). Under CUDA-graph capture the dispatch itself picks the
graph winner; the operator adds nothing on the host but the op-dispatch call.

Autograd: ``matmul``'s backward is two tuned GEMMs, dA = dC @ B^T and dB = A^T @ dC, each dispatched as a
problem of its own (its own shape and layout: ``B^T`` and ``A^T`` are transposed views, so the backward
problems carry the layout letters ``t``). ``moe_matmul``'s backward: the tokens' gradient is one more
``moe_matmul`` over the transposed experts; the experts' gradient, X_e^T @ dY_e per expert, is one
``grouped_matmul`` over the experts' row ranges, which the host must know, so it reads ``offsets`` (one
device sync) and cannot be captured in a CUDA graph. ``gated_matmul``'s backward recomputes the gate/up
product and runs three tuned ``matmul`` problems (see ``_gated_backward``). ``moe_gated_matmul`` has no
backward: ``kernels.moe_gated_matmul`` and kernels/hf.py take the unfused ``moe_matmul`` and torch's gating
where a gradient is wanted.

CUDA graphs (``torch.compile(mode="reduce-overhead")``, or ``torch.cuda.graph`` by hand): the first eager
call of a signature on a GPU also runs the graph winner once (``_call``), so a capture finds it resolved
and compiled; the two operators that cannot be captured say so with the ``cudagraph_unsafe`` tag, and
Inductor runs them between graphs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from . import _eager  # the public functions' eager bodies, looked up per call (a test may spy on one)
from . import _modes, _native
from . import moe as _moe
from ._record_mode import RECORDER as _REC
from .dispatch import DISPATCHER as _DISPATCHER
from ._grouped_dispatch import kept_plan as _kept_plan, traced_grouped_matmul, traced_moe_matmul

NAMESPACE = "triton_tuner"
_NATIVE = _native.NATIVE
_COMPILING = torch.compiler.is_dynamo_compiling  # Dynamo folds it to True while it traces (kernels/_plans.py)
# torch's functions as this module's own names: traced code that reads ``torch.`` here reaches the torch module by
# a second path beside the model's own code, a guard Dynamo checks in Python on every compiled call
# (docs/PYTORCH.md, "Guards"). A function read by two paths costs no such guard.
_IS_COMPILING = torch.compiler.is_compiling
_AUTOCAST_ON = torch._C._is_any_autocast_enabled
_DISPATCH_MODES = torch._C._len_torch_dispatch_stack
_FUNCTION_MODE_ON = torch._C._is_torch_function_mode_enabled
_GRAD_ENABLED = torch.is_grad_enabled
_TRANSFORMS = torch._C._functorch.peek_interpreter_stack
_F_LINEAR = torch.nn.functional.linear

__all__ = ["NAMESPACE", "gated_matmul", "gated_matmul_call", "grouped_matmul", "linear", "linear_call", "matmul",
           "matmul_out", "moe_gated_matmul", "moe_gated_matmul_call", "moe_matmul", "moe_matmul_call", "moe_matmul_out",
           "moe_weight_grad", "warm_for_capture"]


# ------------------------------------------------------------------------------------------------ matmul

@torch.library.custom_op(f"{NAMESPACE}::matmul", mutates_args=())
def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """C = A @ B through the tuned dispatch."""
    return _call(_eager.matmul, a, b)


@matmul.register_fake
def _(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    _check_matmul_shapes(a, b)
    return a.new_empty((a.shape[0], b.shape[1]))


@torch.library.custom_op(f"{NAMESPACE}::matmul_out", mutates_args=("out",))
def matmul_out(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> None:
    """C = A @ B written into ``out``."""
    _call(_eager.matmul, a, b, out=out)


@matmul_out.register_fake
def _(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> None:
    _check_matmul_shapes(a, b)


def _check_matmul_shapes(a: torch.Tensor, b: torch.Tensor) -> None:
    """What the fake can check without data: rank and inner dimension (dtype and device errors come at run)."""
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"triton_tuner::matmul takes [M, K] @ [K, N]; got {tuple(a.shape)} and {tuple(b.shape)}")


def _register_autograd(op: Any, backward: Callable[..., Any], setup: Callable[..., None]) -> None:
    """``op``'s autograd, its backward run under the dispatch mode forced where its forward ran.

    Why: on a GPU, autograd runs a backward pass on its own device thread, where a ``dispatch_mode``
    entered on the forward's thread does not reach (the forced mode is per thread). Without this, an
    eager step forced to graph mode ran its backward's GEMMs on the eager winners. (A compiled backward
    runs its own graph: there ``KERNELS_MODE`` or a real capture decides.)"""

    def setup_context(ctx: Any, inputs: tuple, output: Any) -> None:
        setup(ctx, inputs, output)
        ctx.forced_mode = _modes.LOCAL.mode

    def run_backward(ctx: Any, *grads: torch.Tensor) -> Any:
        if ctx.forced_mode is None:
            return backward(ctx, *grads)
        with _modes.dispatch_mode(ctx.forced_mode):
            return backward(ctx, *grads)

    op.register_autograd(run_backward, setup_context=setup_context)


def _dense_grad(grad: torch.Tensor) -> torch.Tensor:
    """A gradient the kernels can read: autograd may hand over an expanded (stride 0) or otherwise odd view."""
    if grad.stride(-1) == 1 or grad.stride(0) == 1:
        if 0 not in grad.stride():
            return grad
    return grad.contiguous()


def _matmul_setup(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
    a, b = inputs
    # Each operand only where the other's gradient needs it, as torch's mm saves: a frozen weight then
    # keeps no activation alive until the backward (and an inference-mode tensor is never saved).
    ctx.save_for_backward(a if ctx.needs_input_grad[1] else None, b if ctx.needs_input_grad[0] else None)


def _matmul_backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    a, b = ctx.saved_tensors
    grad = _dense_grad(grad)
    grad_a = matmul(grad, b.t()) if ctx.needs_input_grad[0] else None
    grad_b = matmul(a.t(), grad) if ctx.needs_input_grad[1] else None
    return grad_a, grad_b


_register_autograd(matmul, _matmul_backward, _matmul_setup)


# ------------------------------------------------------------------------------------------------ grouped

# cudagraph_unsafe: the launch's table holds the operands' addresses and is built on the host for each new
# set of them, then copied from pinned host memory. Inductor's CUDA-graph trees record at other addresses
# than they warm up at, so the capture would build a table, and each replay would re-read a pinned block
# that the host allocator has since handed out again. Inductor runs it between its graphs instead. (A
# hand capture at the warmed addresses, ``warm_for_capture``, reuses the table: that stays safe.)
@torch.library.custom_op(f"{NAMESPACE}::grouped_matmul", mutates_args=(), tags=(torch.Tag.cudagraph_unsafe,))
def grouped_matmul(As: Sequence[torch.Tensor], Bs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """[A_i @ B_i] in one launch through the tuned dispatch.

    The launch writes every C_i into one buffer; an operator's outputs may not alias each other, so all but
    the first are copied out (one extra read and write of the C_i, i > 0: the price of the operator form).
    """
    outputs = _eager.grouped_matmul(list(As), list(Bs))
    return [c if i == 0 else c.clone() for i, c in enumerate(outputs)]


@grouped_matmul.register_fake
def _(As: Sequence[torch.Tensor], Bs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    if len(As) != len(Bs):
        raise ValueError(f"triton_tuner::grouped_matmul takes as many A as B; got {len(As)} and {len(Bs)}")
    for a, b in zip(As, Bs):
        _check_matmul_shapes(a, b)
    return [a.new_empty((a.shape[0], b.shape[1])) for a, b in zip(As, Bs)]


# ------------------------------------------------------------------------------------------------ moe

@torch.library.custom_op(f"{NAMESPACE}::moe_matmul", mutates_args=())
def moe_matmul(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor, all_rows: bool = False) -> torch.Tensor:
    """Rows of expert e of ``x`` times ``w[e]``. Rows at or past ``offsets[-1]`` are zero, so the result is
    a well-defined tensor for autograd and the compiler; that costs a fill of the output, which a caller
    whose ``offsets[-1]`` is always T (a router's top-k, ``kernels.nn.route``) skips with ``all_rows=True``."""
    return _moe_matmul(x, w, offsets, all_rows)


def _moe_matmul(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor, all_rows: bool = False) -> torch.Tensor:
    if w.dim() != 3 or x.dim() != 2:
        _check_moe_shapes(x, w, offsets)  # the error that names the shapes, before w.shape[2] is read
    out = None if all_rows or x.shape[0] == 0 else x.new_zeros((x.shape[0], w.shape[2]))
    return _call(_eager.moe_matmul, x, w, offsets, out=out)


@moe_matmul.register_fake
def _(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor, all_rows: bool = False) -> torch.Tensor:
    _check_moe_shapes(x, w, offsets)
    return x.new_empty((x.shape[0], w.shape[2]))


@torch.library.custom_op(f"{NAMESPACE}::moe_matmul_out", mutates_args=("out",))
def moe_matmul_out(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor, out: torch.Tensor) -> None:
    """``moe_matmul`` written into ``out``; rows at or past ``offsets[-1]`` keep what ``out`` held."""
    _call(_eager.moe_matmul, x, w, offsets, out=out)


@moe_matmul_out.register_fake
def _(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor, out: torch.Tensor) -> None:
    _check_moe_shapes(x, w, offsets)


def _check_moe_shapes(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor) -> None:
    if x.dim() != 2 or w.dim() != 3 or offsets.dim() != 1 or x.shape[1] != w.shape[1] \
            or offsets.shape[0] != w.shape[0]:
        raise ValueError(f"triton_tuner::moe_matmul takes x [T, K], w [E, K, N], offsets [E]; got "
                         f"{tuple(x.shape)}, {tuple(w.shape)}, {tuple(offsets.shape)}")


@torch.library.custom_op(f"{NAMESPACE}::moe_gated_matmul", mutates_args=())
def moe_gated_matmul(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor, all_rows: bool = False) -> torch.Tensor:
    """silu(x @ w[e][:, :N]) * (x @ w[e][:, N:]) for the rows of expert e, w [E, K, 2N], in one launch. Rows at
    or past ``offsets[-1]`` are zero, as ``moe_matmul``'s (``all_rows=True`` skips that: every row routed).
    Forward only: ``kernels.moe_gated_matmul`` traces the unfused operators where a gradient is wanted."""
    return _moe_gated_matmul(x, w, offsets, all_rows)


def _moe_gated_matmul(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor, all_rows: bool = False) -> torch.Tensor:
    if w.dim() != 3 or x.dim() != 2:
        _check_moe_shapes(x, w, offsets)  # the error that names the shapes, before w.shape[2] is read
    out = _call(_eager.moe_gated_matmul, x, w, offsets)
    if all_rows or x.shape[0] == 0:
        return out
    return out.masked_fill_(~_moe._routed(x, offsets)[:, None], 0.0)  # on the device: no host sync


@moe_gated_matmul.register_fake
def _(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor, all_rows: bool = False) -> torch.Tensor:
    _check_moe_shapes(x, w, offsets)
    return x.new_empty((x.shape[0], w.shape[2] // 2))


# cudagraph_unsafe: it reads offsets on the host (a sync, which a capture forbids); Inductor's graph
# partitions run it between the CUDA graphs of the rest of the backward.
@torch.library.custom_op(f"{NAMESPACE}::moe_weight_grad", mutates_args=(), tags=(torch.Tag.cudagraph_unsafe,))
def moe_weight_grad(x: torch.Tensor, grad: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """dW[e] = x[rows of e]^T @ grad[rows of e], [E, K, N], as one tuned ``grouped_matmul`` over the
    non-empty experts. Reads ``offsets`` on the host (a sync): the row ranges are the group's shapes."""
    ends = [int(e) for e in offsets.tolist()]
    starts = [0] + ends[:-1]
    dw = x.new_zeros((len(ends), x.shape[1], grad.shape[1]))
    busy = [e for e, (s, t) in enumerate(zip(starts, ends)) if t > s]
    if busy and x.shape[1] > 0 and grad.shape[1] > 0:
        As = [x[starts[e]:ends[e]].t() for e in busy]
        Bs = [grad[starts[e]:ends[e]] for e in busy]
        for e, c in zip(busy, _eager.grouped_matmul(As, Bs)):
            dw[e].copy_(c)
    return dw


@moe_weight_grad.register_fake
def _(x: torch.Tensor, grad: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    return x.new_empty((offsets.shape[0], x.shape[1], grad.shape[1]))


def _moe_setup(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
    x, w, offsets, all_rows = inputs
    ctx.save_for_backward(x, w, offsets)
    ctx.all_rows = all_rows


def _moe_backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None, None, None]:
    x, w, offsets = ctx.saved_tensors
    grad = grad if grad.is_contiguous() else grad.contiguous()  # moe_matmul reads x row-major
    grad_x = moe_matmul(grad, w.transpose(1, 2), offsets, ctx.all_rows) if ctx.needs_input_grad[0] else None
    grad_w = moe_weight_grad(x, grad, offsets) if ctx.needs_input_grad[1] else None
    return grad_x, grad_w, None, None


_register_autograd(moe_matmul, _moe_backward, _moe_setup)


# ------------------------------------------------------------------------------------------------ epilogues

def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return _linear_t(x, weight.t(), bias)


def _linear_t(x: torch.Tensor, weight_t: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    if bias is None:
        return _call(_eager.matmul, x, weight_t)
    return _call(_eager.matmul_bias, x, weight_t, bias)


@torch.library.custom_op(f"{NAMESPACE}::linear", mutates_args=())
def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``nn.functional.linear`` on 2-D x: x @ weight^T (+ bias), the bias added in the GEMM's epilogue."""
    return _linear(x, weight, bias)


@linear.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"triton_tuner::linear takes x [M, K] and weight [N, K]; got {tuple(x.shape)} and "
                         f"{tuple(weight.shape)}")
    return x.new_empty((x.shape[0], weight.shape[0]))


def _linear_setup(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
    x, weight, bias = inputs
    # As _matmul_setup: x only for the weight's gradient, the weight only for x's.
    ctx.save_for_backward(x if ctx.needs_input_grad[1] else None, weight if ctx.needs_input_grad[0] else None)
    ctx.has_bias = bias is not None


def _linear_backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
    x, weight = ctx.saved_tensors
    grad = _dense_grad(grad)
    grad_x = matmul(grad, weight) if ctx.needs_input_grad[0] else None
    grad_w = matmul(grad.t(), x) if ctx.needs_input_grad[1] else None
    grad_b = grad.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
    return grad_x, grad_w, grad_b


_register_autograd(linear, _linear_backward, _linear_setup)


def _gated_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return _call(_eager.gated_matmul, a, b)


@torch.library.custom_op(f"{NAMESPACE}::gated_matmul", mutates_args=())
def gated_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """silu(A @ B[:, :N]) * (A @ B[:, N:]) in one launch; B [K, 2N] is the gate and up weights stacked."""
    return _gated_matmul(a, b)


@gated_matmul.register_fake
def _(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"triton_tuner::gated_matmul takes [M, K] @ [K, 2N]; got {tuple(a.shape)}, {tuple(b.shape)}")
    return a.new_empty((a.shape[0], b.shape[1] // 2))


def _gated_setup(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
    # Only A and B: the backward recomputes G = A @ Bg and U = A @ Bu. Saving them would keep the [M, 2N]
    # product that the fused forward exists not to write (2N columns per row, 7x the input's for
    # Llama-3-70B's MLP, per layer, until the backward) to spare one GEMM the size of the unfused
    # forward's: the backward's three GEMMs instead of two, +1/3 of the layer's training FLOPs.
    ctx.save_for_backward(*inputs)


def _gated_backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """y = silu(G) * U: dG = silu'(G) (dy U), dU = dy silu(G); dA = [dG dU] @ B^T, dB = A^T @ [dG dU].

    Three tuned ``matmul`` problems: the recomputed [G U] = A @ B, and the two products with the stacked
    [dG dU] [M, 2N], each one GEMM over both halves (dA = dG @ Bg^T + dU @ Bu^T is one inner dimension of
    2N; dB comes out stacked as B is). The elementwise part is torch's, in the inputs' dtype as torch's
    autograd of the same expression computes it (``silu_backward`` works in fp32 inside).
    """
    a, b = ctx.saved_tensors
    gu = matmul(a, b)
    n = gu.shape[1] // 2
    g, u = gu[:, :n], gu[:, n:]
    grad_gu = torch.cat([torch.ops.aten.silu_backward(grad * u, g), grad * torch.nn.functional.silu(g)], dim=1)
    grad_a = matmul(grad_gu, b.t()) if ctx.needs_input_grad[0] else None
    grad_b = matmul(a.t(), grad_gu) if ctx.needs_input_grad[1] else None
    return grad_a, grad_b


_register_autograd(gated_matmul, _gated_backward, _gated_setup)


# ------------------------------------------------------------------------------------------------ FLOPs

# What torch.utils.flop_counter.FlopCounterMode counts for each operator (2 per multiply-add, as for
# aten.mm): without a formula a patched model counted 0 FLOPs for its linear layers. moe_matmul counts
# every row of x once, as its GEMMs do (rows past offsets[-1] are not computed: an upper bound).
from torch.utils.flop_counter import register_flop_formula as _flops  # noqa: E402


@_flops([torch.ops.triton_tuner.matmul, torch.ops.triton_tuner.matmul_out])
def _(a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
    return 2 * a_shape[0] * a_shape[1] * b_shape[1]


@_flops(torch.ops.triton_tuner.linear)
def _(x_shape, w_shape, *args, out_shape=None, **kwargs) -> int:
    return 2 * x_shape[0] * x_shape[1] * w_shape[0]


@_flops(torch.ops.triton_tuner.gated_matmul)
def _(a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
    return 2 * a_shape[0] * a_shape[1] * b_shape[1]  # both halves of the stacked weight


@_flops([torch.ops.triton_tuner.moe_matmul, torch.ops.triton_tuner.moe_matmul_out])
def _(x_shape, w_shape, *args, out_shape=None, **kwargs) -> int:
    return 2 * x_shape[0] * x_shape[1] * w_shape[2]


@_flops(torch.ops.triton_tuner.moe_gated_matmul)
def _(x_shape, w_shape, *args, out_shape=None, **kwargs) -> int:
    return 2 * x_shape[0] * x_shape[1] * w_shape[2]  # both halves of the stacked weight


# ------------------------------------------------------------------------------------ under torch.compile

# What the public functions are when Dynamo traces them (their first line asks ``torch.compiler.is_dynamo_compiling``):
# the operators, whose fakes give the graph its shapes, so no Python body with locks, caches or a C++ call is
# traced. The compiled graph then runs each operator, which calls the public function eagerly.
# (``kernels.matmul``'s is kernels/_plans.py ``_traced``; ``kernels.matmul_bias`` and ``kernels.gated_matmul``
# are ``linear`` and ``gated_matmul`` themselves; ``traced_grouped_matmul`` and ``traced_moe_matmul``, imported
# above, live beside their eager bodies in kernels/_grouped_dispatch.py.)

# ------------------------------------------------------------------------------------------ direct calls

def _direct(*tensors: torch.Tensor | None) -> bool:
    """Whether an eager call may run an operator's body without the operator: nothing traces or watches
    it (no torch.compile, no tensor subclass such as a fake or an FX proxy, no torch function or
    dispatch mode such as a FLOP counter) and no gradient is wanted.

    Why: the operator's dispatch (schema parsing, autograd wrapper, re-entry) costs about 6 us of host
    time per call (docs/PYTORCH.md, "Eager calls"), 3-4x the tuned matmul's own call; an eager model
    pays it on every layer."""
    if _IS_COMPILING() or _DISPATCH_MODES() or _FUNCTION_MODE_ON():
        return False
    grad = _GRAD_ENABLED()
    for t in tensors:
        if t is not None and (type(t) not in _PLAIN or (grad and t.requires_grad)):
            return False
    return True


_PLAIN = (torch.Tensor, torch.nn.Parameter)


def linear_call(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                transposed: Callable[[torch.Tensor], torch.Tensor | None] | None = None) -> torch.Tensor:
    """``linear``, without the operator's dispatch where nothing traces the call and no gradient is wanted
    (``_direct``): what ``kernels.nn.Linear`` runs. Under autocast its operands are cast first, as torch's
    linear casts them; under a torch.func transform or forward-mode AD, or in a dtype the kernels do not
    take (float64), torch's own linear runs (``_torch_only``). ``transposed(weight)``: ``weight.t()`` as the
    caller keeps it (a view costs host time on every call), or None; asked on the direct path alone, which
    these checks have already found untraced and untransformed."""
    if _AUTOCAST_ON():
        x, weight, bias = _autocast(x, weight, bias)
    if _torch_only(x):
        return _F_LINEAR(x, weight, bias)
    if _direct(x, weight, bias):
        weight_t = transposed(weight) if transposed is not None else None
        return _linear_t(x, weight.t() if weight_t is None else weight_t, bias)
    return linear(x, weight, bias)


def gated_matmul_call(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``gated_matmul``, direct where ``_direct`` allows; cast under autocast and in torch where
    ``_torch_only`` says, as ``linear_call``."""
    if _AUTOCAST_ON():
        a, b = _autocast(a, b)
    if _torch_only(a):
        gate, up = (a @ b).chunk(2, dim=-1)
        return torch.nn.functional.silu(gate) * up
    return _gated_matmul(a, b) if _direct(a, b) else gated_matmul(a, b)


_KERNEL_DTYPES = frozenset((torch.float16, torch.bfloat16, torch.float32))
_forward_ad = torch.autograd.forward_ad


def _torch_only(x: torch.Tensor) -> bool:
    """Whether a call must run in torch, not on our kernels: a dtype they do not take (float64: torch
    computes it, where we would refuse), a device they do not run on (meta: shapes only, as a model built
    there is; another backend), or, in eager code, a torch.func transform (vmap, grad, jvp, ...)
    or forward-mode AD. Our operators have a backward only: under jvp torch would give a zero tangent
    without a word, and grad or vmap would fail inside the operator."""
    if x.dtype not in _KERNEL_DTYPES or not (x.is_cuda or x.is_cpu):
        return True
    if _TRANSFORMS() is None and _forward_ad._current_level < 0:
        return False  # the common case, asked first: two reads
    return not _IS_COMPILING()


def _autocast(*tensors: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
    """``tensors`` as autocast would hand them to torch's linear or matmul: floating tensors cast to its
    dtype where it is on for their device (a patched model's linear layers then compute and return in
    float16 or bfloat16 as torch's do, and the next layer gets the dtype it expects)."""
    device = next(t for t in tensors if t is not None).device.type
    if not torch.is_autocast_enabled(device):
        return tensors
    dtype = torch.get_autocast_dtype(device)
    return tuple(t.to(dtype) if t is not None and t.is_floating_point() and t.dtype != dtype else t for t in tensors)


def moe_matmul_call(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor, all_rows: bool = False) -> torch.Tensor:
    """``moe_matmul``, direct where ``_direct`` allows; the operator (its fake: shapes only) on the meta
    device or another the kernels do not run on. A direct call of a repeated signature with every row routed
    runs its kept plan at once (``_kept_moe_plan``), or its handed-over plan from C++ (``_native_moe``)."""
    c = _native_moe(_NATIVE.try_moe, x, w, offsets, all_rows)
    if c is not None:
        return c
    if _direct(x, w, offsets) and (x.is_cuda or x.is_cpu):
        plan = _kept_moe_plan(False, x, w, offsets, all_rows)
        return _moe.run_ready(plan, x, w, offsets) if plan is not None else _moe_matmul(x, w, offsets, all_rows)
    return moe_matmul(x, w, offsets, all_rows)


def moe_gated_matmul_call(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor,
                          all_rows: bool = False) -> torch.Tensor:
    """``moe_gated_matmul``, direct where ``_direct`` allows, as ``moe_matmul_call``."""
    c = _native_moe(_NATIVE.try_moe_gated, x, w, offsets, all_rows)
    if c is not None:
        return c
    if _direct(x, w, offsets) and (x.is_cuda or x.is_cpu):
        plan = _kept_moe_plan(True, x, w, offsets, all_rows)
        return _moe.run_ready(plan, x, w, offsets) if plan is not None else _moe_gated_matmul(x, w, offsets, all_rows)
    return moe_gated_matmul(x, w, offsets, all_rows)


def _native_moe(native: Callable[..., torch.Tensor | None] | None, x: torch.Tensor, w: torch.Tensor,
                offsets: torch.Tensor, all_rows: bool) -> torch.Tensor | None:
    """The C++ path's answer (kernels/_native.py ``remember_moe``) for a call that ``_kept_moe_plan`` would serve,
    or None. The C++ path itself declines what ``_direct`` declines (a tensor subclass, a torch function or
    dispatch mode, a wanted gradient), a call in graph mode, and a signature it was not handed."""
    if native is None or not all_rows or _UNWARMED or _COMPILING():
        return None
    return native(x, w, offsets)


def _kept_moe_plan(gated: bool, x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor, all_rows: bool) -> Any:
    """The kept plan (kernels/_grouped_dispatch.py ``kept_plan``) of a direct call that needs nothing between
    here and it: every row routed (the plan fills no rows past the last end) and no warm-up owed to a forced
    mode (``_UNWARMED``; a plan's signature has resolved, so ``_call`` would warm nothing). ``_moe_matmul``'s
    checks, ``_call`` and the eager body's entry are host time on every call of a repeated experts GEMM."""
    return _kept_plan(gated, x, w, offsets) if all_rows and not _UNWARMED else None


# ------------------------------------------------------------------------------------------------ capture

_CAPTURABLE = ("cuda",)  # devices whose streams capture (a CPU test adds "cpu" and a stand-in capture check)


def _call(fn: Callable[..., torch.Tensor], a: torch.Tensor, b: torch.Tensor, *rest: Any, **kwargs: Any) -> torch.Tensor:
    """``fn(a, b, ...)``; on a GPU, a signature's first call outside a capture runs once more in graph mode.

    Why: ``torch.compile(mode="reduce-overhead")`` runs each graph once (warm-up), then captures it, and
    dispatch picks the graph winner while the stream captures: a config that may never have run, whose
    Triton compile and module load would then happen inside the capture (where a compile fails). The
    warm-up's second run leaves the capture nothing but launches (a capture stream without kept scratch
    takes split-K or repack scratch for the call from its graph's pool, kernels/gemm.py ``_Scratch``), as
    ``warm_for_capture`` does for a capture by hand. Price: one more GEMM per new signature, result
    dropped (rewriting ``out`` with the same values). Skipped where a mode is forced (the capture then runs
    the config the eager calls ran). A "first call" is one that made dispatch resolve a config
    (``Dispatcher.resolutions``): a signature first called through ``kernels.matmul`` itself, not through
    these operators, was resolved then, so its capture needs ``warm_for_capture`` as a capture by hand does.
    """
    resolutions = _DISPATCHER.resolutions
    out = fn(a, b, *rest, **kwargs)
    # A resolution means a signature's first call (or its first after kernels.clear_cache()): two integer
    # reads per call, where a set of signatures cost building a key of shapes and strides on every call.
    if (_DISPATCHER.resolutions != resolutions or _UNWARMED) and a.device.type in _CAPTURABLE:
        _warm(fn, a, b, rest, kwargs, resolved=_DISPATCHER.resolutions != resolutions)
    return out


# Signatures first called under a mode forced on this thread (``dispatch_mode``, a backward inheriting a
# forward's), whose warm-up waits for their first call in auto mode. Checked per call only while not empty.
_UNWARMED: set[tuple] = set()
_UNWARMED_CAPACITY = 4096


def _warm(fn: Callable[..., torch.Tensor], a: torch.Tensor, b: torch.Tensor, rest: tuple, kwargs: dict,
          resolved: bool) -> None:
    """Run ``fn`` once in graph mode where this call is a signature's first outside a capture (``_call``)."""
    if _modes.capturing():
        return
    key = (fn, a.shape, b.shape, a.stride(), b.stride(), a.dtype, a.device) if _UNWARMED or _modes.LOCAL.mode else None
    if _modes.forced() is not None:
        if resolved and _modes.LOCAL.mode is not None and len(_UNWARMED) < _UNWARMED_CAPACITY:
            _UNWARMED.add(key)  # forced for this block only: a later auto call may be captured
        return  # forced for the process (KERNELS_MODE): captures run the configs eager calls ran
    if resolved or key in _UNWARMED:
        with _REC.uncounted(), _modes.dispatch_mode(_modes.GRAPH):  # record mode counts the workload's calls
            fn(a, b, *rest, **kwargs)
        _UNWARMED.discard(key)


def warm_for_capture(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run ``fn`` once per dispatch mode before a CUDA graph captures it: every config the capture will use
    (the graph winners) is then resolved and compiled, so nothing is looked up, compiled or loaded while
    the stream captures. Returns the last result."""
    fn(*args, **kwargs)
    with _modes.dispatch_mode(_modes.GRAPH):
        return fn(*args, **kwargs)
