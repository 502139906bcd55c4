"""Whole layers, end to end: a Llama-3-70B decoder layer and a Mixtral MoE block, torch against ours.

Columns (per layer and token count): torch eager; torch eager captured by hand in a CUDA graph;
torch.compile default; torch.compile(mode="max-autotune"); ours (kernels.patch: gate/up and q/k/v fused, MoE through
moe_matmul) eager, in a hand-captured CUDA graph, under torch.compile(fullgraph=True), and compiled then
captured in a CUDA graph (ours_compile_graph: Inductor's fusions around our operators). For each: the
latency (ms per layer call), the time to get there (compile/autotune of the first call; for ours the
tuner's search of every problem the layer poses, with --tune), and the error against torch eager.

Each setting's columns are timed in --rounds rounds, in the given order, then reversed, then in order again:
the GPU's speed drifts within a run (on an H100, 2026-11-24, the same cuBLAS kernels' time ranged 4.32-4.90
ms between the columns of one process: docs/BENCHMARKS.md, 2026-11-24), so one fixed order (torch
first, ours last) would tilt the comparison. A column's latency is the median of its rounds; setup and error are the first
round's (later rounds hit warm caches). Every round sets the column up afresh (run_column) and tears it
down, as ours patches the model in place and columns cannot be alive at once.

    PYTHONPATH=. python scripts/bench_layers.py --quick --out $OUT            # ~5 min on an H100
    PYTHONPATH=. python scripts/bench_layers.py --tune quick --out $OUT       # untuned problems quick-tuned first
    PYTHONPATH=. python scripts/bench_layers.py --tune 20 --out $OUT          # every problem searched first
    TRITON_INTERPRET=1 PYTHONPATH=. python scripts/bench_layers.py --cpu-smoke  # tiny dims, runs anywhere
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

import kernels
from kernels import moe
from _layers import DecoderDims, DecoderLayer, MoEDims, OursMoE, TorchMoE

LOG = logging.getLogger("bench_layers")
ALL_COLUMNS = ("torch_eager", "torch_graph", "compile_default", "compile_max_autotune",
               "ours_eager", "ours_graph", "ours_compile", "ours_compile_graph")
# torch.compile's options per compiled column. ours_compile_graph: Inductor fuses what lies between our operators
# (norms, rope, residuals), then the compiled layer is captured by hand in a CUDA graph, as max-autotune's own
# mode runs under CUDA graphs.
COMPILE_OPTIONS = {"compile_default": {}, "compile_max_autotune": {"mode": "max-autotune"},
                   "ours_compile": {"fullgraph": True}, "ours_compile_graph": {"fullgraph": True}}
QUICK_COLUMNS = ("torch_eager", "torch_graph", "compile_max_autotune", "ours_eager", "ours_graph")
TOLERANCE = {torch.bfloat16: 3e-2, torch.float16: 1e-2, torch.float32: 1e-3}  # relative L2 error vs eager


# ---------------------------------------------------------------------------------------------- timing

def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_calls(fn: Callable[[], object], device: torch.device, iters: int) -> float:
    """ms per call of ``fn`` run back to back (host included, as an eager model sees it)."""
    for _ in range(3 if device.type == "cuda" else 1):
        fn()
    _sync(device)
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    _sync(device)
    return (time.perf_counter() - start) / iters * 1e3


def captured(fn: Callable[[], torch.Tensor]) -> tuple[Callable[[], None], torch.Tensor]:
    """``fn`` captured in a CUDA graph after a warm-up on the stream that captures (torch's recipe; it
    leaves the capture nothing to allocate or zero): (replay, the graph's output)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            kernels.ops.warm_for_capture(fn)  # our graph winners resolved and compiled before capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        out = fn()
    return graph.replay, out


# ------------------------------------------------------------------------------------- ours on and off

FUSE_QKV = True  # --no-fuse-qkv: ours without the query/key/value projections stacked (an ablation)


@contextlib.contextmanager
def ours(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """``model`` running on our kernels as ``kernels.patch`` makes it (patched Linears, the gated MLP fused,
    the query, key and value projections one GEMM), the MoE block's experts on moe_matmul; then restored."""
    is_moe = isinstance(model, TorchMoE)
    kernels.patch(model, fuse_qkv=FUSE_QKV)
    if is_moe:
        model.__class__ = OursMoE
    else:
        missing = [what for what, done in (
            ("the gated MLP", isinstance(model.mlp, kernels.nn.FusedMLP)),
            ("the query/key/value projections", not FUSE_QKV or type(model.q_proj) is kernels.nn.SharedInputLinear))
            if not done]
        if missing:
            kernels.unpatch(model)
            raise RuntimeError(f"kernels.patch did not fuse {' and '.join(missing)} of the decoder layer: the ours "
                               "columns would not run what a patched model runs")
    try:
        yield model
    finally:
        kernels.unpatch(model)
        if is_moe:
            model.__class__ = TorchMoE


@contextlib.contextmanager
def recording(problems: set) -> Iterator[None]:
    """Every problem the package's dispatch sees while inside, added to ``problems`` (kernel, problem)."""
    saved = {name: getattr(kernels, name) for name in ("matmul", "matmul_bias", "gated_matmul", "moe_matmul")}

    def wrap(name: str, problem_of: Callable) -> Callable:
        def call(*args, **kwargs):
            problems.add(problem_of(*args))
            return saved[name](*args, **kwargs)
        return call

    wrapped = {
        "matmul": wrap("matmul", lambda a, b, *_: kernels.MATMUL.problem_of(a, b)),
        "matmul_bias": wrap("matmul_bias", lambda a, b, *_: kernels.MATMUL_BIAS.problem_of(a, b)),
        "gated_matmul": wrap("gated_matmul", lambda a, b: kernels.GATED_MATMUL.problem_of(a, b)),
        "moe_matmul": wrap("moe_matmul", lambda x, w, offsets, *_: moe.balanced_problem(
            moe._DTYPE_NAMES[x.dtype], "n" + moe.weight_layout(w), x.shape[0], w.shape[0], w.shape[2], x.shape[1])),
    }
    # Direct calls find the package's names; a patched model's, through kernels.ops, the operators' (kernels/_eager.py).
    for name, fn in wrapped.items():
        setattr(kernels, name, fn)
        setattr(kernels._eager, name, fn)
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(kernels, name, fn)
            setattr(kernels._eager, name, fn)


def untuned(problems: set) -> list:
    """The problems without a record of their own in some mode for this GPU (shipped or in the database)."""
    device = kernels.current_device()
    return sorted((p for p in problems if any(
        kernels.DISPATCHER.choose(kernels.get_kernel(p.kernel), p, device, mode).record_mode != mode
        for mode in kernels.MODES)), key=lambda p: (p.kernel, p.key))


def quick_tune(problems: set, db: str) -> tuple[float, int]:
    """Quick-tune (tuner/quick.py: a portfolio per problem, both modes) the problems nobody tuned yet
    into ``db``, as a user with the shipped tables would; (the seconds it took, problems tuned)."""
    from db import Store
    from tuner.quick import quick_tune as tune_portfolio
    from tuner.workers import CheckPool

    start = time.perf_counter()
    device = kernels.current_device()
    tuned = 0
    with Store(db) as store, CheckPool() as pool:
        for problem in untuned(problems):
            for result in tune_portfolio(kernels.get_kernel(problem.kernel), [problem], device, store, pool=pool):
                tuned += 1
                LOG.info("quick-tuned %s %s in %.1f s: eager %.3fx, graph %.3fx", problem.kernel, problem.key,
                         result.seconds, result.records["eager"].speedup, result.records["graph"].speedup)
    kernels.use_database(db)
    kernels.clear_cache()
    return time.perf_counter() - start, tuned


def chosen(problems: set) -> list[dict]:
    """What dispatch runs for each problem in each mode, and where that came from."""
    device = kernels.current_device()
    rows = []
    for p in sorted(problems, key=lambda p: (p.kernel, p.key)):
        spec = kernels.get_kernel(p.kernel)
        for mode in kernels.MODES:
            choice = kernels.DISPATCHER.choose(spec, p, device, mode)
            rows.append({"kernel": p.kernel, "problem": p.key, "mode": mode, "source": choice.source,
                         "config": choice.config.as_dict()})
            LOG.info("  %-13s %-26s %-5s %s", p.kernel, p.key, mode, choice.source)
    return rows


def tune(problems: set, db: str, budget: str) -> float:
    """Search every problem with the tuner's CLI into ``db``; the seconds it took."""
    start = time.perf_counter()
    by_family: dict[tuple[str, str, str], list[str]] = {}
    for p in problems:
        by_family.setdefault((p.kernel, p.dtype, p.layout), []).append(p.key.split(":", 2)[2])
    for (kernel, dtype, layout), shapes in sorted(by_family.items()):
        cmd = [sys.executable, "-m", "tuner", "search", "--db", db, "--kernel", kernel, "--dtype", dtype,
               "--layout", layout, "--budget", budget] + [a for s in shapes for a in ("--shape", s)]
        LOG.info("tuning: %s", " ".join(cmd))
        subprocess.run(cmd, check=True)
    kernels.use_database(db)
    kernels.clear_cache()
    return time.perf_counter() - start


# ----------------------------------------------------------------------------------------------- columns

def run_column(column: str, model: torch.nn.Module, x: torch.Tensor, iters: int, smoke: bool) -> tuple:
    """(latency ms, setup s, output) of one column."""
    if column not in ALL_COLUMNS:
        raise ValueError(f"no column named {column!r}; choose from {', '.join(ALL_COLUMNS)}")
    torch._dynamo.reset()
    context = ours(model) if column.startswith("ours") else contextlib.nullcontext(model)
    with context as m, torch.no_grad():
        start = time.perf_counter()
        layer = m
        if column in COMPILE_OPTIONS:
            options = dict(COMPILE_OPTIONS[column], **({"backend": "aot_eager"} if smoke else {}))
            layer = torch.compile(m, dynamic=False, **options)
        if column.endswith("graph"):
            if layer is not m:
                layer(x)  # compile outside the capture, on the stream that runs the layer
            replay, out = captured(lambda: layer(x))
            fn = replay
        else:
            fn = lambda: layer(x)  # noqa: E731
        fn()  # the first call: compiles, autotunes, resolves configs
        _sync(x.device)
        setup = time.perf_counter() - start
        latency = time_calls(fn, x.device, iters)
        result = out if column.endswith("graph") else fn()
        _sync(x.device)
        return latency, setup, result.detach().float().clone()


def _torch_output(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The layer's output through torch's own modules (the model is patched only inside ours' columns)."""
    with torch.no_grad():
        out = model(x)
    _sync(x.device)
    return out.detach().float().clone()


def error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out - ref).norm() / ref.norm().clamp_min(1e-6))


def round_order(columns: tuple[str, ...], round_index: int) -> tuple[str, ...]:
    """The order of the columns in round ``round_index``: as given in even rounds, reversed in odd ones, so a
    column timed late (clocks already dropped under load) in one round is timed early in the next."""
    return columns if round_index % 2 == 0 else columns[::-1]


def bench_setting(name: str, model: torch.nn.Module, x: torch.Tensor, columns: tuple, iters: int, smoke: bool,
                  tune_s: float, rounds: int = 1) -> list[dict]:
    """One row per column, in ``columns``' order: the median latency over ``rounds`` rounds of alternating
    order, with setup and error from the first round; a column that fails is an error row from then on."""
    first: dict[str, dict] = {}  # column -> its first round's row fields, or its error row
    latencies: dict[str, list[float]] = {c: [] for c in columns}
    # torch eager's output, the one every column is checked against, whether or not torch_eager is a column
    # (only it is kept, as outputs can be large: prefill)
    reference = _torch_output(model, x)
    for round_index in range(rounds):
        for column in round_order(columns, round_index):
            if "error_msg" in first.get(column, {}):
                continue  # failed in an earlier round: it would most likely fail again, at the same cost
            try:
                latency, setup, out = run_column(column, model, x, iters, smoke)
            except Exception as exc:  # a column that cannot run here (e.g. Inductor without a compiler) is reported
                LOG.warning("%s %s failed in round %d: %s", name, column, round_index, exc)
                first[column] = {"setting": name, "column": column, "error_msg": repr(exc)[:300],
                                 "round": round_index}
                continue
            latencies[column].append(latency)
            if round_index == 0:
                err = error(out, reference)
                first[column] = {"setup_s": setup + (tune_s if column.startswith("ours") else 0.0),
                                 "rel_error": err, "ok": err < TOLERANCE[x.dtype]}
            # this round's own setup (later rounds' show the warm caches); the error is checked in round 0 only
            LOG.info("%s round %d %-22s %9.3f ms  setup %7.1f s  err %.1e", name, round_index, column, latency,
                     setup, first[column]["rel_error"])
    return [first[c] if "error_msg" in first[c] else
            {"setting": name, "column": c, "latency_ms": statistics.median(latencies[c]),
             "latency_rounds_ms": latencies[c], **first[c]} for c in columns]


def settings(args: argparse.Namespace) -> list[tuple[str, str, int]]:
    """(layer, mode, tokens) to run."""
    if args.cpu_smoke:
        decode, prefill = (2,), (8,)
    else:
        decode, prefill = ((1, 32), (2048,)) if args.quick else ((1, 8, 32, 64), (2048, 8192))
        decode = args.decode if args.decode is not None else decode
        prefill = args.prefill if args.prefill is not None else prefill
    out = []
    for layer in args.layers:
        out += [(layer, "decode", t) for t in decode] + [(layer, "prefill", t) for t in prefill]
    return out


def build(layer: str, smoke: bool, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    torch.manual_seed(0)
    if layer == "decoder":
        dims = DecoderDims(hidden=64, heads=4, kv_heads=2, ffn=128, context=16) if smoke else DecoderDims()
        return DecoderLayer(dims, device=device, dtype=dtype).eval()
    dims = MoEDims(hidden=64, ffn=96, experts=4, top_k=2) if smoke else MoEDims()
    return TorchMoE(dims.hidden, dims.ffn, dims.experts, dims.top_k, device=device, dtype=dtype).eval()


def inputs(model: torch.nn.Module, mode: str, tokens: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    hidden = model.gate.in_features if isinstance(model, TorchMoE) else model.dims.hidden
    if isinstance(model, DecoderLayer):
        if mode == "decode":
            model.make_cache(tokens)  # one new token for each of `tokens` sequences
            return torch.randn(tokens, 1, hidden, device=device, dtype=dtype)
        model.cache = None
    return torch.randn(1, tokens, hidden, device=device, dtype=dtype)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="decode 1 and 32, prefill 2048, five columns")
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny dims on the CPU (set TRITON_INTERPRET=1)")
    parser.add_argument("--layers", default="decoder,moe", type=lambda s: s.split(","))
    tokens = lambda s: tuple(int(t) for t in s.split(",") if t)  # noqa: E731
    parser.add_argument("--decode", type=tokens, default=None, help="decode token counts (default 1,8,32,64)")
    parser.add_argument("--prefill", type=tokens, default=None, help="prefill token counts (default 2048,8192)")
    parser.add_argument("--columns", default=None, type=lambda s: tuple(s.split(",")), help="subset of columns")
    parser.add_argument("--tune", default=None, metavar="quick|BUDGET",
                        help="quick: quick-tune the layer's problems that have no record yet (shipped or in "
                             "--db); a budget (20, 30s): search every problem of each layer with it")
    parser.add_argument("--db", default=None, help="database for --tune (default: a fresh SQLite under --out)")
    parser.add_argument("--iters", type=int, default=None, help="timed calls per column (default 50; 10 prefill)")
    parser.add_argument("--rounds", type=int, default=2,
                        help="rounds per setting, the columns' order reversed every other round (default 2)")
    parser.add_argument("--no-fuse-qkv", action="store_true",
                        help="ours without the query/key/value projections stacked (kernels.patch(fuse_qkv=False))")
    parser.add_argument("--out", default=os.environ.get("OUT", "bench_layers_out"))
    args = parser.parse_args(argv)
    global FUSE_QKV
    FUSE_QKV = not args.no_fuse_qkv
    if args.rounds < 1:
        parser.error(f"--rounds {args.rounds}: each column needs at least one round; pass --rounds 1 or more")
    unknown = [c for c in args.columns or () if c not in ALL_COLUMNS]
    if unknown:  # before any GPU work: a misnamed column used to fail each round after the others had run
        parser.error(f"--columns: no column named {', '.join(unknown)}; choose from {', '.join(ALL_COLUMNS)}")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    smoke = args.cpu_smoke
    device = torch.device("cpu" if smoke else "cuda")
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    if device.type == "cuda":
        # What a process gets once the C++ path of cuBLAS plans is built (kernels/_native.py): built
        # first, so that no compile of it runs beside the timed calls (decoder decode 32, ours eager: 1.317 ms
        # on 2026-11-24, likely timed during the build; 0.817 with it built first, the same day).
        LOG.info("C++ path of cuBLAS plans: %s", kernels._native.start(block=True))
    columns = args.columns or (("torch_eager", "ours_eager", "ours_compile") if smoke
                               else QUICK_COLUMNS if args.quick else ALL_COLUMNS)
    rows: list[dict] = []
    problem_rows: dict[str, dict] = {}
    models: dict[str, torch.nn.Module] = {}
    for layer, mode, tokens in settings(args):
        dtype = (torch.float32 if layer == "decoder" else torch.float16) if smoke else torch.bfloat16
        model = models.get(layer) or models.setdefault(layer, build(layer, smoke, device, dtype))
        x = inputs(model, mode, tokens, device, dtype)
        tune_s, tuned = 0.0, 0
        name = f"{layer}/{mode}/{tokens}"
        problems: set = set()
        with ours(model) as m, recording(problems), torch.no_grad():
            m(x)
        db = args.db or f"sqlite:///{out_dir / 'tuned.db'}"
        if args.tune == "quick":
            tune_s, tuned = quick_tune(problems, db)
        elif args.tune:
            tune_s, tuned = tune(problems, db, args.tune), len(problems)
        LOG.info("%s: %d problems, %d tuned here in %.1f s; dispatch runs:", name, len(problems), tuned, tune_s)
        problem_rows[name] = {"tuned_here": tuned, "tune_s": tune_s, "choices": chosen(problems)}
        iters = args.iters or (3 if smoke else 10 if mode == "prefill" else 50)
        rows += bench_setting(name, model, x, columns, iters, smoke, tune_s, args.rounds)
        write_results(out_dir, args, columns, rows, problem_rows)  # after every setting: a cut-off run keeps it
    print(table(rows, columns))
    plot(rows, columns, out_dir)
    return 0


def write_results(out_dir: Path, args: argparse.Namespace, columns: tuple, rows: list[dict],
                  problems: dict[str, dict]) -> None:
    import triton

    device_name = "cpu" if args.cpu_smoke else torch.cuda.get_device_name()
    meta = {"device": device_name, "torch": torch.__version__, "triton": triton.__version__,
            "date": time.strftime("%Y-%m-%d %H:%M:%S"), "columns": columns, "rounds": args.rounds, "tuned": args.tune,
            "command": " ".join(sys.argv)}
    (out_dir / "bench_layers.json").write_text(json.dumps({"meta": meta, "rows": rows, "problems": problems},
                                                          indent=1))


def table(rows: list[dict], columns: tuple) -> str:
    """One line per setting: ms per column, ours' best over torch's best, and the correctness flags."""
    by_setting: dict[str, dict[str, dict]] = {}
    for r in rows:
        by_setting.setdefault(r["setting"], {})[r["column"]] = r
    lines = ["| setting | " + " | ".join(columns) + " | ours best / torch best | all ok |",
             "|---|" + "---:|" * (len(columns) + 2)]
    for name, cells in by_setting.items():
        ms = {c: cells[c]["latency_ms"] for c in columns if "latency_ms" in cells.get(c, {})}
        torch_best = min((v for c, v in ms.items() if not c.startswith("ours")), default=float("nan"))
        ours_best = min((v for c, v in ms.items() if c.startswith("ours")), default=float("nan"))
        ok = "yes" if all(cells[c].get("ok", False) for c in cells) else "NO"  # a failed column is not ok
        lines.append(f"| {name} | " + " | ".join(f"{ms[c]:.3f}" if c in ms else "-" for c in columns)
                     + f" | {torch_best / ours_best:.2f}x | {ok} |")
    return "\n".join(lines)


def plot(rows: list[dict], columns: tuple, out_dir: Path) -> None:
    """A bar chart per setting (PNG), where matplotlib is installed."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        LOG.info("matplotlib not installed: no plots")
        return
    for name in dict.fromkeys(r["setting"] for r in rows):
        cells = [r for r in rows if r["setting"] == name and "latency_ms" in r]
        fig, ax = plt.subplots(figsize=(7, 3))
        ax.barh([r["column"] for r in cells], [r["latency_ms"] for r in cells])
        ax.set_xlabel("ms per layer call")
        ax.set_title(name)
        fig.tight_layout()
        fig.savefig(out_dir / f"{name.replace('/', '_')}.png", dpi=120)
        plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
