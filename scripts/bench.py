"""Benchmark tuned kernels against what users already have, on the GPU, with correctness checked.

Dense problems: cuBLAS (torch.matmul), kernels.matmul as dispatched (tuned), the best Triton config
found by the search (cuBLAS excluded), and triton.autotune over the matmul tutorial's configs.
Groups: kernels.grouped_matmul, a loop of torch.matmul, and torch._grouped_mm (bf16 only).
Every timed kernel is first checked against a float32 reference on fresh random inputs.
Times: median of triton.testing.do_bench (L2 flushed), all columns measured side by side in this run;
with --rounds N, the columns of a row are timed in N interleaved rounds and each figure is the median
over rounds (the JSON keeps each column's slowest-over-fastest round as "spread").

    python scripts/bench.py --db sqlite:///h100.db --dtype fp16 --layout nn --layout nt --json out.json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Callable

import torch
import triton
import triton.testing

import kernels
from kernels import Problem, gemm
from kernels.dispatch import Dispatcher
from tuner import suites

SUITE = suites.DENSE_GPU
GROUPS = suites.GROUPS_GPU

AUTOTUNE_CONFIGS = [triton.Config({k: v for k, v in c.as_dict().items()
                                   if k in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_SIZE_M")},
                                  num_warps=c.num_warps, num_stages=c.num_stages)
                    for c in gemm.tutorial_configs()]
_autotuned = triton.autotune(configs=AUTOTUNE_CONFIGS, key=["M", "N", "K"])(gemm._tiled_kernel)


def autotune_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    m, k = a.shape
    n = b.shape[1]
    c = torch.empty((m, n), dtype=a.dtype, device=a.device)

    def grid(meta: dict) -> tuple[int]:
        return (triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]),)

    _autotuned[grid](a, b, c, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                     c.stride(0), c.stride(1), EVEN_K=k % 128 == 0,
                     INDEX_64=False, DOT_PRECISION="ieee", ALIGN=1, C_ALIGN=1, WRAP_ALIGNED=True)
    return c


def rel_err(out, ref) -> float:
    outs = out if isinstance(out, list) else [out]
    refs = ref if isinstance(ref, list) else [ref]
    num = sum(float((o.float() - r).pow(2).sum()) for o, r in zip(outs, refs))
    den = sum(float(r.pow(2).sum()) for r in refs)
    return math.sqrt(num / den) if den else 0.0


def checked(fn, ref, tol: float) -> bool:
    """Whether fn's output matches ref; a failure or a wrong result is reported and the column skipped."""
    try:
        err = rel_err(fn(), ref)
    except Exception as exc:  # report and move on: one broken column must not sink the table
        print(f"    failed: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}", file=sys.stderr)
        return False
    if not err <= tol:
        print(f"    wrong result: rel err {err:.3g}", file=sys.stderr)
        return False
    return True


# Rounds of side-by-side timing per row (--rounds). One do_bench median per column and round, the
# columns interleaved (A B C, A B C, ...): a drift in clocks or host load then hits every column alike.
ROUNDS = 1


def side_by_side(columns: dict[str, Callable | None], ref, tol: float) -> dict[str, float | None]:
    """Median ms per column over ROUNDS interleaved rounds, for the columns whose output is right; None
    for the others. ``spread`` is each column's slowest round over its fastest."""
    good = {name: fn for name, fn in columns.items() if fn is not None and checked(fn, ref, tol)}
    rounds: dict[str, list[float]] = {name: [] for name in good}
    for _ in range(ROUNDS):
        for name, fn in good.items():
            rounds[name].append(float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")))
    times: dict = {name: statistics.median(rounds[name]) if name in good else None for name in columns}
    times["spread"] = {name: max(ms) / min(ms) for name, ms in rounds.items()}
    return times


def bench_dense(problem: Problem, dispatcher: Dispatcher, device, autotune: bool = True) -> dict:
    spec = kernels.get_kernel("matmul")
    a, b = spec.make_inputs(problem, torch.device("cuda"), 99)
    ref = a.float() @ b.float()
    tol = {"fp16": 5e-3, "bf16": 3e-2, "fp32": 5e-3}[problem.dtype]
    choice = dispatcher.choose(spec, problem, device)
    record = _record(dispatcher, device, problem)
    cfg = kernels.Config.from_dict(record.triton_config) if record and record.triton_config else None
    row = {"problem": problem.key, "source": choice.source, "config": str(choice.config),
           "triton_config": str(cfg) if cfg else None}
    row.update(side_by_side({
        "cublas_ms": lambda: torch.matmul(a, b),
        "dispatch_ms": lambda: kernels.matmul(a, b),
        "triton_ms": (lambda: kernels.matmul_with(cfg, a, b)) if cfg else None,
        "autotune_ms": (lambda: autotune_matmul(a, b)) if autotune and problem.dtype != "fp32" else None,
    }, ref, tol))
    if cfg is None and not kernels.is_baseline(choice.config):
        row["triton_ms"] = row["dispatch_ms"]
    return row


def _record(dispatcher: Dispatcher, device, problem: Problem):
    from db import Store

    with Store(dispatcher.url, create=False) as store:
        return store.get(device.name, problem.kernel, problem.key)


def bench_group(name: str, key: str, dtype: str) -> dict:
    spec = kernels.get_kernel("grouped_matmul")
    problem = Problem.from_key("grouped_matmul", f"{dtype}:nn:{key}")
    As, Bs = spec.make_inputs(problem, torch.device("cuda"), 5)
    ref = [a.float() @ b.float() for a, b in zip(As, Bs)]
    tol = {"fp16": 5e-3, "bf16": 3e-2}[dtype]
    grouped_mm: Callable | None = None
    if dtype == "bf16" and hasattr(torch, "_grouped_mm") and len({b.shape for b in Bs}) == 1:
        a_cat = torch.cat(As)
        b_stack = torch.stack([b.t().contiguous() for b in Bs]).transpose(1, 2)  # (G, K, N), K-major
        offs = torch.tensor([a.shape[0] for a in As], device="cuda").cumsum(0).to(torch.int32)
        sizes = [a.shape[0] for a in As]

        def grouped_mm_split() -> list[torch.Tensor]:
            return list(torch._grouped_mm(a_cat, b_stack, offs=offs).split(sizes))
        grouped_mm = grouped_mm_split

    row = {"group": name, "problem": problem.key[:60], "dtype": dtype}
    row.update(side_by_side({"ours_ms": lambda: kernels.grouped_matmul(As, Bs),
                             "loop_ms": lambda: [torch.matmul(a, b) for a, b in zip(As, Bs)],
                             "grouped_mm_ms": grouped_mm}, ref, tol))
    return row


def bench_moe(name: str, key: str, dtype: str) -> dict:
    """kernels.moe_matmul against torch._grouped_mm (bf16) and a loop, on the same contiguous operands.

    The weights are stored [E, N, K] and passed transposed (layout nt), the K-major form
    torch._grouped_mm takes. The loop reads the expert boundaries from a host list, as a caller who
    has them would; moe_matmul and _grouped_mm read them from the device.
    """
    spec = kernels.get_kernel("moe_matmul")
    problem = Problem.from_key("moe_matmul", f"{dtype}:nt:{key}")
    x, w, offsets, ends = spec.make_inputs(problem, torch.device("cuda"), 7)
    ref = spec.reference((x, w, offsets, ends))
    tol = {"fp16": 5e-3, "bf16": 3e-2}[dtype]
    out = torch.empty_like(ref, dtype=x.dtype)

    def loop() -> torch.Tensor:
        start = 0
        for e, end in enumerate(ends):
            if end > start:
                torch.matmul(x[start:end], w[e], out=out[start:end])
            start = end
        return out

    grouped_mm = (lambda: torch._grouped_mm(x, w, offs=offsets)) if dtype == "bf16" and hasattr(torch, "_grouped_mm") \
        else None
    row = {"group": name, "problem": problem.key[:60], "dtype": dtype}
    row.update(side_by_side({"ours_ms": lambda: kernels.moe_matmul(x, w, offsets), "loop_ms": loop,
                             "grouped_mm_ms": grouped_mm}, ref, tol))
    return row


def _group_table(ours: str, bench, suite: dict[str, str]) -> list[dict]:
    """Bench every group in fp16 and bf16; print the rows as they come, then the geomeans."""
    print(f"| group | dtype | {ours} ms | loop of torch.matmul ms | torch._grouped_mm ms | vs loop | vs _grouped_mm |")
    print("|---|---|---:|---:|---:|---:|---:|")
    rows = []
    for dtype in ("fp16", "bf16"):
        for name, key in suite.items():
            row = bench(name, key, dtype)
            rows.append(row)
            o, lp, gm = row["ours_ms"], row["loop_ms"], row["grouped_mm_ms"]
            print(f"| {name} | {dtype} | {fmt(o)} | {fmt(lp)} | {fmt(gm)} | "
                  f"{(lp / o) if o and lp else float('nan'):.2f}x | {(gm / o) if o and gm else float('nan'):.2f}x |",
                  flush=True)
    for dtype, column in (("fp16", "loop_ms"), ("bf16", "loop_ms"), ("bf16", "grouped_mm_ms")):
        done = [r for r in rows if r["dtype"] == dtype and r["ours_ms"] and r[column]]
        print(f"geomean {dtype} {ours} vs {column[:-3]}: {geomean([r[column] / r['ours_ms'] for r in done]):.3f}x")
    return rows


def geomean(values: list[float]) -> float:
    values = [v for v in values if v and v > 0]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else float("nan")


def fmt(x: float | None) -> str:
    return f"{x:.4f}" if x else "-"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", default=None)
    parser.add_argument("--dtype", action="append")
    parser.add_argument("--layout", action="append")
    parser.add_argument("--shape", action="append")
    parser.add_argument("--groups", action="store_true", help="also benchmark the grouped GEMM groups")
    parser.add_argument("--moe", action="store_true", help="also benchmark kernels.moe_matmul on the MoE groups")
    parser.add_argument("--no-dense", action="store_true")
    parser.add_argument("--no-autotune", action="store_true", help="skip the triton.autotune column")
    parser.add_argument("--rounds", type=int, default=1,
                        help="interleaved timing rounds per row; each figure is the median over rounds (default 1)")
    parser.add_argument("--json", default="bench.json")
    args = parser.parse_args()
    global ROUNDS
    ROUNDS = args.rounds
    kernels.use_database(args.db)
    dispatcher = Dispatcher(args.db)
    device = kernels.current_device()
    header = (f"{device.name}, {time.strftime('%Y-%m-%d')}, torch {torch.__version__}, triton {triton.__version__}, "
              f"CUDA {torch.version.cuda}")
    print(header)
    dense = []
    if not args.no_dense:
        print("| problem | cuBLAS ms | kernels.matmul ms | best Triton ms | triton.autotune ms | "
              "dispatch/cuBLAS | Triton/cuBLAS | source |")
        print("|---|---:|---:|---:|---:|---:|---:|---|")
        for dtype in args.dtype or ["fp16"]:
            for layout in args.layout or ["nn"]:
                for shape in args.shape or SUITE:
                    row = bench_dense(Problem.from_key("matmul", f"{dtype}:{layout}:{shape}"), dispatcher, device,
                                      autotune=not args.no_autotune)
                    dense.append(row)
                    c = row["cublas_ms"]
                    sp = c / row["dispatch_ms"] if c and row["dispatch_ms"] else None
                    tr = c / row["triton_ms"] if c and row["triton_ms"] else None
                    print(f"| {row['problem']} | {fmt(c)} | {fmt(row['dispatch_ms'])} | {fmt(row['triton_ms'])} | "
                          f"{fmt(row['autotune_ms'])} | {sp and f'{sp:.2f}x'} | {tr and f'{tr:.2f}x'} | "
                          f"{row['source']} |", flush=True)
        print(f"geomean speed-up over cuBLAS: dispatch {geomean([r['cublas_ms'] / r['dispatch_ms'] for r in dense if r['cublas_ms'] and r['dispatch_ms']]):.3f}x, "
              f"best Triton {geomean([r['cublas_ms'] / r['triton_ms'] for r in dense if r['cublas_ms'] and r['triton_ms']]):.3f}x, "
              f"triton.autotune {geomean([r['cublas_ms'] / r['autotune_ms'] for r in dense if r['cublas_ms'] and r['autotune_ms']]):.3f}x; "
              f"cuBLAS chosen for {sum(1 for r in dense if 'cublas' in r['config'])}/{len(dense)} problems")
    groups = _group_table("kernels.grouped_matmul", bench_group, GROUPS) if args.groups else []
    moe = _group_table("kernels.moe_matmul", bench_moe, suites.MOE_GPU) if args.moe else []
    with open(args.json, "w") as f:
        json.dump({"header": header, "rounds": ROUNDS, "dense": dense, "groups": groups, "moe": moe}, f, indent=1)
    spreads = [(ratio, row.get("problem"), column) for row in dense + groups + moe
               for column, ratio in row["spread"].items()]
    if ROUNDS > 1 and spreads:
        ratio, problem, column = max(spreads)
        print(f"largest round-to-round spread over {ROUNDS} rounds: {ratio:.2f}x ({column}, {problem})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
