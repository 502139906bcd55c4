"""One case of tests/kernels_tests/test_compile_public.py, run in a fresh process so that no earlier eager call
hides the first call's path: the named public functions, called inside ``torch.compile(fullgraph=True)``.

    python tests/kernels_tests/_compile_case.py MODE FUNCTION [FUNCTION ...]

MODE is a ``torch.compile`` mode ("default", "reduce-overhead", "max-autotune"). In order: Dynamo's explain
counts graph breaks (0); the compiled function runs first, before any eager call, and matches torch; an eager
call of each function follows, then the same calls compiled again from scratch; then, compiled with
``dynamic=True``, two new shapes run against torch and share one graph. Each compiled function is called three
times (under "reduce-overhead" on a GPU: warm-up, capture, replay). Exits non-zero (an AssertionError)
on the first thing that is wrong. FUNCTION "autotune" is a user's ``kernels.autotune``'d kernel (GPU only: Dynamo
cannot trace a Triton launch under the interpreter): its graph keeps the config chosen at trace time, the first
config before the key is tuned and the tuned one after. "autotune_hook": one whose configs carry a
``triton.Config`` pre_hook (it zeroes the output the kernel adds into), which must run in the graph too.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch
import triton
import triton.language as tl

import kernels

# Relative L2 error of fp16 results against torch in fp32: the interpreter measures ~3e-4 per GEMM
# (tests/kernels_tests/test_compile.py). fp16 throughout: every family takes it (grouped and MoE take fp16 and
# bf16 only), the interpreter's fp16 dot is right (its bf16 one is not), and a GPU runs it without TF32.
TOLERANCE = 1e-2
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@triton.jit
def _twice(x_ptr, y_ptr, n_cols, BLOCK: tl.constexpr):
    # y = 2 * x over a [rows, n_cols] tensor: a program per row and BLOCK columns.
    row, cols = tl.program_id(0), tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    at = row * n_cols + cols
    tl.store(y_ptr + at, 2 * tl.load(x_ptr + at, mask=cols < n_cols), mask=cols < n_cols)


# A user's kernel as the README shows it (tuned on its first eager call), keyed by the column count alone, so that
# the rows of a dynamic=True compile stay symbolic while the key is specialized.
twice = kernels.autotune(configs=[triton.Config({"BLOCK": b}, num_warps=w) for b, w in ((16, 1), (64, 2), (256, 4))],
                         key=["n_cols"], name="tests.compile_case.twice")(_twice)


@triton.jit
def _add_twice(x_ptr, y_ptr, n_cols, BLOCK: tl.constexpr):
    # y += 2 * x: right only where y was zeroed first, which each config's pre_hook does.
    row, cols = tl.program_id(0), tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    at = row * n_cols + cols
    y = tl.load(y_ptr + at, mask=cols < n_cols)
    tl.store(y_ptr + at, y + 2 * tl.load(x_ptr + at, mask=cols < n_cols), mask=cols < n_cols)


def _zero_y(nargs: dict) -> None:
    nargs["y_ptr"].zero_()


# A user's kernel whose configs carry a triton.Config pre_hook, as split-K kernels zero their output.
accumulate = kernels.autotune(configs=[triton.Config({"BLOCK": b}, num_warps=w, pre_hook=_zero_y)
                                       for b, w in ((16, 1), (64, 2), (256, 4))],
                              key=["n_cols"], name="tests.compile_case.accumulate")(_add_twice)


def _autotune_hook(x: torch.Tensor) -> torch.Tensor:
    y = torch.full_like(x, float("nan"))  # NaN wherever the hook did not zero it first
    n_cols = x.shape[1]
    accumulate[lambda meta: (x.shape[0], triton.cdiv(n_cols, meta["BLOCK"]))](x, y, n_cols)
    return y


def _autotune(x: torch.Tensor) -> torch.Tensor:
    y = torch.empty_like(x)
    n_cols = x.shape[1]
    twice[lambda meta: (x.shape[0], triton.cdiv(n_cols, meta["BLOCK"]))](x, y, n_cols)
    return y


def _rand(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, device=DEVICE).to(torch.float16)


def _inputs(name: str, rows: int) -> tuple:
    """Operands of ``name`` with ``rows`` rows of A (tokens for moe_matmul), small (the interpreter)."""
    if name in ("matmul", "matmul_out"):
        return (_rand(rows, 16), _rand(16, 12))
    if name == "matmul_bias":
        return (_rand(rows, 16), _rand(16, 12), _rand(12))
    if name == "gated_matmul":
        return (_rand(rows, 16), _rand(16, 24))
    if name == "grouped_matmul":
        return ([_rand(rows, 16), _rand(2 * rows, 8)], [_rand(16, 12), _rand(8, 20)])
    if name in ("autotune", "autotune_hook"):
        return (_rand(rows, 300),)
    if name in ("moe_matmul", "moe_matmul_out", "moe_gated_matmul"):  # three experts; every row routed
        ends = torch.tensor([rows // 3, rows // 2, rows], dtype=torch.int32, device=DEVICE)
        width = 24 if name == "moe_gated_matmul" else 12  # the fused one: 12 gate columns, then 12 up columns
        return (_rand(rows, 16), _rand(3, 16, width), ends)
    raise ValueError(f"unknown case {name!r}")


def _call(name: str, args: tuple) -> object:
    """The public call of ``name`` (the ``_out`` cases: its ``out=`` form into a fresh buffer, returned)."""
    if name == "matmul_out":
        a, b = args
        return kernels.matmul(a, b, out=a.new_empty((a.shape[0], b.shape[1])))
    if name == "moe_matmul_out":
        x, w, ends = args
        return kernels.moe_matmul(x, w, ends, out=x.new_empty((x.shape[0], w.shape[2])))
    if name == "autotune":
        return _autotune(*args)
    if name == "autotune_hook":
        return _autotune_hook(*args)
    return getattr(kernels, name)(*args)


def _reference(name: str, args: tuple) -> object:
    """What torch computes, in fp32."""
    if name == "grouped_matmul":
        return [a.float() @ b.float() for a, b in zip(*args)]
    args = tuple(t.float() if t.is_floating_point() else t for t in args)
    if name in ("autotune", "autotune_hook"):
        return 2 * args[0]
    if name in ("matmul", "matmul_out"):
        return args[0] @ args[1]
    if name == "matmul_bias":
        return args[0] @ args[1] + args[2]
    if name == "gated_matmul":
        gate, up = (args[0] @ args[1]).chunk(2, dim=1)
        return torch.nn.functional.silu(gate) * up
    x, w, ends = args
    starts = [0] + ends.tolist()[:-1]
    product = torch.cat([x[s:e] @ w[i] for i, (s, e) in enumerate(zip(starts, ends.tolist()))])
    if name == "moe_gated_matmul":
        gate, up = product.chunk(2, dim=1)
        return torch.nn.functional.silu(gate) * up
    return product


def _check(name: str, got: object, args: tuple, where: str) -> None:
    want = _reference(name, args)
    pairs = zip(got, want) if isinstance(want, list) else [(got, want)]
    for mine, ref in pairs:
        error = float((mine.float() - ref).norm() / ref.norm())
        assert error < TOLERANCE, f"{name}, {where}: relative error {error:.2e}"


def _compiled(names: list[str], mode: str | None, dynamic: bool | None) -> Callable[[dict], dict]:
    def step(inputs: dict) -> dict:
        return {name: _call(name, inputs[name]) for name in names}
    return torch.compile(step, fullgraph=True, mode=mode, dynamic=dynamic)


def _run(step: Callable[[dict], dict], inputs: dict, where: str) -> None:
    """Three calls, each checked: under "reduce-overhead" on a GPU, Inductor's CUDA-graph trees warm up on
    the first, capture on the second and replay from the third (an output is checked before the next call
    overwrites it)."""
    for call in ("warm-up", "capture", "replay"):
        out = step(inputs)
        for name in out:
            _check(name, out[name], inputs[name], f"{where}, {call}")


def main(mode: str, names: list[str]) -> None:
    mode_arg = None if mode == "default" else mode
    torch.manual_seed(0)
    inputs = {name: _inputs(name, 7) for name in names}

    explained = torch._dynamo.explain(lambda inputs: {name: _call(name, inputs[name]) for name in names})(inputs)
    assert explained.graph_break_count == 0, f"{names}: graph breaks {explained.break_reasons}"
    assert explained.graph_count == 1, f"{names}: {explained.graph_count} graphs"
    torch._dynamo.reset()

    _run(_compiled(names, mode_arg, None), inputs, f"first call compiled ({mode})")  # before any eager call
    # A user kernel's untuned key runs its first config in the graph and is not kept: the eager call tunes it.
    assert "autotune" not in names or (not twice.cache and twice.best_config == twice.configs[0])

    for name in names:
        _check(name, _call(name, inputs[name]), inputs[name], "eager")
    tuned = next(iter(twice.cache.values()), None)

    torch._dynamo.reset()
    _run(_compiled(names, mode_arg, None), inputs, f"compiled after eager calls ({mode})")  # signatures they ran
    assert "autotune" not in names or (len(twice.cache) == 1 and twice.best_config == tuned), "not the tuned config"

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    step = _compiled(names, mode_arg, True)
    for rows in (9, 13):  # two shapes, one graph: the sizes are symbolic (none equal to another, which Dynamo
        # would take for one size: duck sizing)
        _run(step, {name: _inputs(name, rows) for name in names}, f"compiled, dynamic, {rows} rows ({mode})")
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    assert graphs == 1, f"{names}: dynamic=True compiled {graphs} graphs for two shapes"
    print(f"ok: {mode} {' '.join(names)}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
