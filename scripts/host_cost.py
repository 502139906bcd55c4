"""Host time per cached call: kernels.matmul per variant against torch.matmul, in one run, on the GPU.

A loop of calls on a small problem (the GPU finishes each call before the host has issued the next),
timed by the wall clock with one synchronize at the end: the time per call is the host's. Beside it,
each call's GPU time from a CUDA-graph replay shows that the host is the bound. Variants are forced
through the public call (``kernels.matmul`` with the config pinned, as the tuner times it: a pinned
cuBLAS plan runs on the Python path; tiled, split-K and gemv plans, and the epilogues' Triton plans, are
launched from C++ after their first call, as dispatch's own are, and are timed again with that path suspended); "cublas plan, C++ path" is a signature resolved to cuBLAS as a
tuned table leaves it, served by kernels/_native.cpp (built first, or loaded from torch's build cache);
"cublas, nothing tuned" is dispatch with no table at all (an empty database, no shipped tables). The
public fused-bias call and a patched model's layer (``kernels.nn.Linear`` against ``torch.nn.Linear``,
64 -> 64 with a bias, under no_grad) follow, as dispatch picks for them on this GPU, then an attention
module's three projections of one input (torch's Linears, ours as three GEMMs, ours as one: kernels.patch's
default). ``--profile`` then
says where the host time of the tiled call, the Python cuBLAS plan and the patched layer goes.

    PYTHONPATH=. python3 scripts/host_cost.py [--calls 300] [--rounds 31] [--profile]

Before and after a change, in one run: ``--against OLD_TREE`` (a copy of the older tree, e.g.
``git archive 1996844 kernels tuner db scripts | tar -x -C .gpu/old-tree``) runs each tree's own copy of
this script in a fresh process, ``--pairs`` times, alternating which goes first, and prints each row's
"vs torch" (the ratio to torch.matmul in the same round, which cancels the host's drift between processes)
for both trees and their quotient. Both trees load one build of kernels/_native.cpp where its source is the
same (torch's extension cache); otherwise each process rebuilds it (30-60 s).

The host's speed wanders between rounds (torch.matmul ranged 14.5-24.8 us per call over 9 rounds of
3000 calls on the H100 box), so rounds are short, many and interleaved, and "vs torch" is the median of
each round's ratio to torch.matmul's time in the same round.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import os
import pstats
import subprocess
import sys
import tempfile
import statistics
import time
from pathlib import Path

import torch
import triton

import kernels
from kernels import BASELINE, Config, _evidence, _native, _plans, epilogue
from kernels.epilogue import MATMUL_BIAS, gated_matmul_with, matmul_bias_with
from tuner import timing

_BASE = dict(GROUP_SIZE_M=8, SPLIT_K=1, NUM_SM=132, FLATTEN=False, EPILOGUE_SUBTILE=False, num_warps=4, num_stages=3)
VARIANTS = {
    "cublas plan, Python path": ((64, 64, 64), BASELINE),
    "tiled": ((64, 64, 64), Config.from_dict({**_BASE, "VARIANT": "tiled", "BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64})),
    "splitk": ((64, 64, 256), Config.from_dict({**_BASE, "VARIANT": "splitk", "BLOCK_M": 64, "BLOCK_N": 64,
                                               "BLOCK_K": 64, "SPLIT_K": 2})),
    "tma": ((64, 64, 64), Config.from_dict({**_BASE, "VARIANT": "tma", "BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64})),
    "repack": ((64, 64, 60), Config.from_dict({**_BASE, "VARIANT": "repack", "BLOCK_M": 64, "BLOCK_N": 64,
                                              "BLOCK_K": 32})),
    # One row, as a decode step's: the launch is the tiled plan's (kernels/_plans.py _Direct), its kernel gemv's.
    "gemv": ((1, 64, 64), Config.from_dict({**_BASE, "VARIANT": "gemv", "GROUP_SIZE_M": 1, "BLOCK_M": 16, "BLOCK_N": 32,
                                           "BLOCK_K": 32, "GEMV_BLOCK_N": 4, "GEMV_BLOCK_K": 256})),
}


def host_us(call, calls: int) -> float:
    call()
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(calls):
        call()
    torch.cuda.synchronize()
    return (time.perf_counter() - started) * 1e6 / calls


@contextlib.contextmanager
def _nothing_tuned():
    """Dispatch as on a GPU with no table: an empty database, no shipped tables."""
    with tempfile.TemporaryDirectory() as folder:
        kernels.use_database(f"sqlite:///{folder}/none.db", use_shipped=False)
        try:
            yield
        finally:
            kernels.use_database(None)


def _put_cublas_plan(a: torch.Tensor, b: torch.Tensor) -> None:
    """The plan a tuned table's cuBLAS record leaves for (a, b), as its first call puts it."""
    _plans.put(_plans.signature(a, b), _plans.ModePlans(_plans._CUBLAS, _plans._CUBLAS))


def _no_grad(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return module(x)


def _projections(modules: tuple[torch.nn.Module, ...], x: torch.Tensor) -> list[torch.Tensor]:
    """An attention module's query, key and value projections of one input, as its forward calls them."""
    with torch.no_grad():
        return [module(x) for module in modules]


class _Projections(torch.nn.Module):
    def __init__(self, widths: tuple[int, ...]) -> None:
        super().__init__()
        for name, width in zip(("q_proj", "k_proj", "v_proj"), widths):
            setattr(self, name, torch.nn.Linear(64, width, bias=False, device="cuda", dtype=torch.float16))


def _put_mixed_plans(a: torch.Tensor, b: torch.Tensor) -> None:
    """Plans of a signature whose eager record is cuBLAS and whose graph record is a tiled kernel."""
    _plans.put(_plans.signature(a, b), _plans.ModePlans(_plans._CUBLAS, _plans.build(VARIANTS["tiled"][1], a, b)))


def operands(shape: tuple[int, int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    m, n, k = shape
    return (torch.randn(m, k, device="cuda", dtype=torch.float16),
            torch.randn(k, n, device="cuda", dtype=torch.float16))


@contextlib.contextmanager
def _epilogue_pinned(pin: tuple):
    """("epilogue", spec, config, a, b[, "python"]): the public epilogue call on a and b runs config in every
    mode; with "python", on the Python path (the C++ path that serves a Triton epilogue plan suspended)."""
    _, spec, config, a, b, *python = pin
    with epilogue.pinning(spec, [config], a, b) as (install,):
        install()
        if python:
            _native.suspend()
        try:
            yield
        finally:
            if python:
                _native.resume()


ROOT = Path(__file__).resolve().parents[1]


def _tree_run(tree: Path, calls: int, rounds: int) -> dict:
    """The figures of ``tree``'s own copy of this script, run in a fresh process on that tree's packages."""
    others = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
              if p and Path(p).resolve() not in (ROOT, tree)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tree), *others]))
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "figures.json"
        subprocess.run([sys.executable, str(tree / "scripts" / "host_cost.py"), "--calls", str(calls),
                        "--rounds", str(rounds), "--json", str(out)], cwd=tree, env=env, check=True)
        return json.loads(out.read_text())


def compare_trees(old: Path, pairs: int, calls: int, rounds: int) -> dict:
    """Each row's "vs torch" in ``old`` and in this tree, ``pairs`` runs each, alternating which runs first."""
    runs: dict[str, list[dict]] = {"old": [], "new": []}
    for pair in range(pairs):
        order = [("old", old), ("new", ROOT)] if pair % 2 == 0 else [("new", ROOT), ("old", old)]
        for label, tree in order:
            print(f"# pair {pair + 1}/{pairs}: {label} tree, {tree}", flush=True)
            runs[label].append(_tree_run(tree, calls, rounds))
    print(f"\n# vs torch.matmul, median over {pairs} runs per tree; old: {old}, new: {ROOT}")
    print(f"{'call':32} {'old vs torch':>13} {'new vs torch':>13} {'new / old':>10} {'old us':>8} {'new us':>8}")
    table = {}
    for name in runs["new"][0]:
        if name not in runs["old"][0]:
            continue
        old_ratio = statistics.median(run[name]["vs_torch"] for run in runs["old"])
        new_ratio = statistics.median(run[name]["vs_torch"] for run in runs["new"])
        old_us = statistics.median(run[name]["host_us"] for run in runs["old"])
        new_us = statistics.median(run[name]["host_us"] for run in runs["new"])
        table[name] = dict(old_vs_torch=old_ratio, new_vs_torch=new_ratio, old_host_us=old_us, new_host_us=new_us)
        print(f"{name:32} {old_ratio:12.3f}x {new_ratio:12.3f}x {new_ratio / old_ratio:10.3f} {old_us:8.2f} "
              f"{new_us:8.2f}")
    return dict(pairs=pairs, calls=calls, rounds=rounds, old=str(old), rows=table, runs=runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=31)
    parser.add_argument("--profile", action="store_true", help="cProfile the tiled call")
    parser.add_argument("--json", default=None, help="write the figures here")
    parser.add_argument("--against", type=Path, default=None, metavar="OLD_TREE",
                        help="time OLD_TREE's copy of this script and this tree's, in turns (see above)")
    parser.add_argument("--pairs", type=int, default=3, help="with --against: runs per tree")
    args = parser.parse_args()
    if args.against is not None:
        figures = compare_trees(args.against.resolve(), args.pairs, args.calls, args.rounds)
        if args.json:
            Path(args.json).write_text(json.dumps(figures, indent=1))
        return
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}, "
          f"{time.strftime('%Y-%m-%d')}, {args.calls} calls x {args.rounds} interleaved rounds")
    started = time.perf_counter()
    native = _native.start(block=True)
    print(f"# C++ path of cuBLAS plans: {native} after {time.perf_counter() - started:.1f} s")
    cases = {}
    for name, (shape, config) in VARIANTS.items():
        a, b = operands(shape)
        cases[name] = (a, b, config)
        with _plans.pinned(config, a, b):
            out = kernels.matmul(a, b)
        ref = a.float() @ b.float()
        assert (out.float() - ref).norm() <= 1e-2 * ref.norm(), name
    torch_a, torch_b = operands((64, 64, 64))
    samples: dict[str, list[float]] = {name: [] for name in ["torch.matmul", "torch.mm", *cases]}
    gpu_us = {"torch.matmul": timing.graph_ms(lambda: torch.matmul(torch_a, torch_b)) * 1e3,
              "torch.mm": timing.graph_ms(lambda: torch.mm(torch_a, torch_b)) * 1e3}
    for name, (a, b, config) in cases.items():
        with _plans.pinned(config, a, b):
            gpu_us[name] = timing.graph_ms(lambda: kernels.matmul(a, b)) * 1e3
    columns = [("torch.matmul", lambda: torch.matmul(torch_a, torch_b), None),
               ("torch.mm", lambda: torch.mm(torch_a, torch_b), None),
               ("cublas, nothing tuned", lambda: kernels.matmul(torch_a, torch_b), "untuned")]
    samples["cublas, nothing tuned"] = []
    with _nothing_tuned():
        gpu_us["cublas, nothing tuned"] = timing.graph_ms(lambda: kernels.matmul(torch_a, torch_b)) * 1e3
    columns += [(name, (lambda a=a, b=b: kernels.matmul(a, b)), (config, a, b)) for name, (a, b, config) in cases.items()]
    # The Triton plans that kernels/_native.cpp launches, again with that path suspended: before and after.
    for name in ("tiled", "splitk", "gemv"):
        a, b, config = cases[name]
        row = f"  {name}, Python path"
        columns.append((row, (lambda a=a, b=b: kernels.matmul(a, b)), (config, a, b, "python")))
        samples[row], gpu_us[row] = [], gpu_us[name]
    # The fused epilogues' Triton kernels through their explicit-config call (kernels/epilogue.py), beside
    # what torch runs for a bias: their launch is the part dispatch does not share with matmul. (The
    # dispatched call skips the explicit call's operand checks, which its signature's first call made.)
    epilogue_config = Config.make(BLOCK_M=64, BLOCK_N=64, BLOCK_K=64, GROUP_SIZE_M=8, num_warps=4, num_stages=3)
    gated_b = torch.randn(64, 128, device="cuda", dtype=torch.float16)
    bias = torch.randn(64, device="cuda", dtype=torch.float16)
    for name, call in (("torch.addmm (bias)", lambda: torch.addmm(bias, torch_a, torch_b)),
                       ("bias epilogue (Triton)", lambda: matmul_bias_with(epilogue_config, torch_a, torch_b, bias)),
                       ("gated epilogue (Triton)", lambda: gated_matmul_with(epilogue_config, torch_a, gated_b)),
                       ("kernels.matmul_bias", lambda: kernels.matmul_bias(torch_a, torch_b, bias))):
        columns.append((name, call, None))
        samples[name] = []
        gpu_us[name] = timing.graph_ms(call) * 1e3
    # The public epilogue calls with a config pinned, as dispatch serves a tuned signature: after its first
    # call, a repeated one runs its ready call (kernels/epilogue.py _READY), not the explicit call's checks.
    for name, kernel, b_operand, config in (
            ("kernels.matmul_bias, Triton", "matmul_bias", torch_b, epilogue_config),
            ("kernels.gated_matmul, Triton", "gated_matmul", gated_b, epilogue_config),
            ("kernels.gated_matmul, cuBLAS", "gated_matmul", gated_b, BASELINE)):
        spec = kernels.get_kernel(kernel)
        public = kernels.matmul_bias if kernel == "matmul_bias" else kernels.gated_matmul
        operands_ = (torch_a, b_operand, bias) if kernel == "matmul_bias" else (torch_a, b_operand)
        call = (lambda public=public, operands_=operands_: public(*operands_))
        pin = ("epilogue", spec, config, torch_a, b_operand)
        with _epilogue_pinned(pin):
            reference = spec.reference(operands_)
            assert (call().float() - reference).norm() <= 1e-2 * reference.norm(), name
            gpu_us[name] = timing.graph_ms(call) * 1e3
        columns.append((name, call, pin))
        samples[name] = []
        if config is not BASELINE:  # launched from C++ after its first call: the Python path beside it
            row = f"  {kernel}, Triton, Python path"
            columns.append((row, call, (*pin, "python")))
            samples[row], gpu_us[row] = [], gpu_us[name]
    # A model's layer, as a patched model calls it (no_grad, as inference runs): the module path adds the
    # autocast, functorch and forward-AD checks of kernels/ops.py to whatever dispatch picks for it.
    torch_linear = torch.nn.Linear(64, 64, device="cuda", dtype=torch.float16)
    our_linear = kernels.nn.Linear.from_linear(torch.nn.Linear(64, 64, device="cuda", dtype=torch.float16))
    # Patched, at a row count where dispatch runs cuBLAS: kernels.patch's module takes torch's own linear
    # there (kernels/_evidence.py); its route's answer is set to say so, whatever this GPU's tables hold.
    routed = kernels.nn.Linear.from_linear(torch.nn.Linear(64, 64, device="cuda", dtype=torch.float16))
    routed.__dict__["_route"] = _evidence.route_of(MATMUL_BIAS, 64, 64)
    _evidence._ROUTES[(routed.__dict__["_route"], torch_a.shape, torch_a.dtype, torch_a.get_device())] = False
    for name, module in (("torch nn.Linear", torch_linear), ("kernels nn.Linear", our_linear),
                         ("kernels nn.Linear, cuBLAS rows", routed)):
        call = (lambda module=module: _no_grad(module, torch_a))
        columns.append((name, call, None))
        samples[name] = []
        gpu_us[name] = timing.graph_ms(call) * 1e3
    # The three projections of a GQA attention (64 -> 64, 32, 32) of one input: three patched Linears, then
    # the same module patched as kernels.patch leaves it by default (one GEMM of N = 128, kernels.nn.SharedInput).
    torch_qkv, separate, shared = _Projections((64, 32, 32)), _Projections((64, 32, 32)), _Projections((64, 32, 32))
    kernels.patch(separate, fuse_qkv=False, everywhere=True)
    kernels.patch(shared, everywhere=True)
    assert type(shared.q_proj) is kernels.nn.SharedInputLinear
    for name, module in (("torch q/k/v Linears", torch_qkv), ("kernels q/k/v, 3 GEMMs", separate),
                         ("kernels q/k/v, 1 GEMM", shared)):
        modules = (module.q_proj, module.k_proj, module.v_proj)
        call = (lambda modules=modules: _projections(modules, torch_a))
        columns.append((name, call, None))
        samples[name] = []
        gpu_us[name] = timing.graph_ms(call) * 1e3
    if native == "ready":
        native_a, native_b = operands((64, 64, 64))
        columns.append(("cublas plan, C++ path", lambda: kernels.matmul(native_a, native_b), "native"))
        samples["cublas plan, C++ path"] = []
        _put_cublas_plan(native_a, native_b)
        gpu_us["cublas plan, C++ path"] = timing.graph_ms(lambda: kernels.matmul(native_a, native_b)) * 1e3
        # An eager record that cuBLAS won beside a graph record that a kernel won: eager calls from C++ too.
        mixed_a, mixed_b = operands((64, 64, 64))
        columns.append(("cublas eager/tiled graph", lambda: kernels.matmul(mixed_a, mixed_b), "mixed"))
        samples["cublas eager/tiled graph"] = []
        _put_mixed_plans(mixed_a, mixed_b)
        gpu_us["cublas eager/tiled graph"] = timing.graph_ms(lambda: kernels.matmul(mixed_a, mixed_b)) * 1e3
        columns.append(("  the same, Python path", lambda: kernels.matmul(mixed_a, mixed_b), "mixed-python"))
        samples["  the same, Python path"] = []
        gpu_us["  the same, Python path"] = gpu_us["cublas eager/tiled graph"]
    for round_ in range(args.rounds):  # interleaved, so drift of the host's speed hits every column alike
        order = columns if round_ % 2 == 0 else columns[::-1]
        for name, call, pin in order:
            if pin is None:
                samples[name].append(host_us(call, args.calls))
                continue
            if pin == "untuned":  # a GPU with no table: dispatch's cuBLAS shortcut (kernels/_plans.py _Fast)
                with _nothing_tuned():
                    samples[name].append(host_us(call, args.calls))
                continue
            if pin == "native":
                _put_cublas_plan(native_a, native_b)
                assert kernels._NATIVE.try_mm is not None and kernels._FAST.cublas_everywhere is not True
                samples[name].append(host_us(call, args.calls))
                continue
            if pin in ("mixed", "mixed-python"):
                _put_mixed_plans(mixed_a, mixed_b)
                if pin == "mixed-python":
                    _native.suspend()
                try:
                    samples[name].append(host_us(call, args.calls))
                finally:
                    if pin == "mixed-python":
                        _native.resume()
                continue
            if pin[0] == "epilogue":
                with _epilogue_pinned(pin):
                    samples[name].append(host_us(call, args.calls))
                continue
            with _plans.pinned(*pin[:3]):  # one variant pinned at a time: some share a signature
                python_path = pin[0] == BASELINE or pin[3:] == ("python",)
                if python_path:  # a pinned cuBLAS plan is served from C++ like dispatch's: not this row
                    _native.suspend()
                try:
                    samples[name].append(host_us(call, args.calls))
                finally:
                    if python_path:
                        _native.resume()
    torch_us = samples["torch.matmul"]
    print(f"{'call':24} {'host us/call (median)':>22} {'min':>7} {'max':>7} {'vs torch':>9} {'GPU us (graph)':>15}")
    figures = {}
    for name, values in samples.items():
        median = statistics.median(values)
        ratio = statistics.median(v / t for v, t in zip(values, torch_us))  # paired within each round
        figures[name] = dict(host_us=median, host_us_all=values, vs_torch=ratio, gpu_us=gpu_us[name])
        print(f"{name:24} {median:22.2f} {min(values):7.2f} {max(values):7.2f} {ratio:8.3f}x "
              f"{gpu_us[name]:15.2f}")
    for name in ("tiled", "cublas plan, Python path", "kernels nn.Linear") if args.profile else ():
        if name in cases:
            a, b, config = cases[name]
            pin, call = _plans.pinned(config, a, b), (lambda a=a, b=b: kernels.matmul(a, b))
        else:
            pin, call = contextlib.nullcontext(), (lambda: _no_grad(our_linear, torch_a))
        with pin:
            call()
            profiler = cProfile.Profile()
            profiler.enable()
            for _ in range(args.calls):
                call()
            profiler.disable()
        torch.cuda.synchronize()
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(14)
        print(f"## cProfile of {args.calls} calls, {name}\n" + text.getvalue())
    if args.json:
        with open(args.json, "w") as stream:
            json.dump(figures, stream, indent=1)


if __name__ == "__main__":
    main()
