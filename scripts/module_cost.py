"""Where a patched model's time goes, module by module: each module ``kernels.patch`` changed in the first decoder
layer (and the head), against vanilla's same module, at the row counts a user's settings pose, with the path the
patched module takes there.

    python3 scripts/module_cost.py --models Qwen2.5-7B --rows 1,16,512 --out DIR [--db URL | --no-shipped]
    TRITON_INTERPRET=1 PYTHONPATH=. python3 scripts/module_cost.py --cpu-smoke --out DIR   # tiny, on the CPU

A whole-model cell of ``scripts/bench_models.py`` under 1.00x says that a model lost, not where. This times each
patched module's call beside vanilla's in interleaved pairs (``--pairs``, vanilla first, then patched): "host"
(the call's return, the GPU idle before it) and "loop" (back-to-back calls: the slower of host and GPU paces them)
in us, as ``scripts/moe_host_cost.py`` times them, and "gpu" (the GPU's own time per call: ``gpu_us``), and says
which path the patched call took at those rows:
"ours" or "torch" for a Linear (its route: dispatch's evidence per call, docs/PYTORCH.md "Never slower"), "fused"
or "its Linears" for a fused gated MLP, "one launch" for an RMSNorm, "ours, everywhere" for a module patched
without evidence; and the share
of its calls the C++ path launched. The routed experts of a MoE model are ``scripts/moe_host_cost.py``'s. Writes
DIR/module_cost.json and prints a table; the script waits for the C++ path first (docs/BENCHMARKS.md, "A
benchmark's first minute, and the experts' sort").
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_models  # noqa: E402  (scripts/ is not a package)
from moe_host_cost import host_and_loop_us  # noqa: E402

import kernels  # noqa: E402
from kernels import _native  # noqa: E402
from kernels._evidence import takes_ours  # noqa: E402
from kernels.nn import FusedMLP, FusedRMSNorm  # noqa: E402


@dataclass
class Cell:
    model: str
    module: str
    kind: str  # the patched module's class
    rows: int
    path: str
    cxx_share: float  # of the patched calls timed, the share the C++ path launched (``served``)
    vanilla: list[dict] = field(default_factory=list)  # one {"host_us", "loop_us"} per pair
    patched: list[dict] = field(default_factory=list)

    def ratio(self, clock: str) -> float:
        """vanilla over patched (>1: patched faster), the median of the pairs'."""
        return statistics.median(v[clock] / p[clock] for v, p in zip(self.vanilla, self.patched))


def patched_modules(vanilla: torch.nn.Module, patched: torch.nn.Module) -> list[tuple[str, torch.nn.Module,
                                                                                        torch.nn.Module]]:
    """(name, vanilla's module, patched module) for each module of the first decoder layer and the head that
    ``kernels.patch`` changed and that takes one tensor: Linears, fused MLPs, q/k/v members, RMSNorms."""
    ours = dict(patched.named_modules())
    found = []
    for name, module in vanilla.named_modules():
        first_layer = ".layers.0." in f"{name}." or name == "lm_head"
        mine = ours.get(name)
        if not first_layer or mine is None or type(mine) is type(module):
            continue
        if isinstance(module, torch.nn.Linear) or isinstance(mine, (FusedMLP, FusedRMSNorm)):
            found.append((name, module, mine))
    return found


def width_of(module: torch.nn.Module, vanilla: torch.nn.Module) -> int:
    if isinstance(module, torch.nn.Linear):
        return module.in_features
    weight = module._parameters.get("weight")
    return weight.shape[0] if weight is not None and weight.dim() == 1 else vanilla.config.hidden_size


def path_of(module: torch.nn.Module, x: torch.Tensor) -> str:
    """The path the patched ``module`` takes for ``x`` (its route's answer; record mode aside)."""
    if isinstance(module, FusedRMSNorm):
        return "one launch"
    route = module.__dict__.get("_route")
    if route is None:
        return "ours, everywhere"
    if isinstance(module, FusedMLP):
        return "fused" if takes_ours(route, x) else "its Linears"
    return "ours" if takes_ours(route, x) else "torch"


def served() -> int:
    """Calls the C++ path has served so far by a Triton launch or a kept cublasLt plan (its at::mm calls are not
    counted: a share under 1.00 on a cuBLAS path may still be the C++ path's)."""
    return _native.launches() + _native.lt_served()


def measure(name: str, vanilla: torch.nn.Module, patched: torch.nn.Module, rows: list[int], pairs: int,
            calls: int, device: torch.device) -> list[Cell]:
    cells = []
    dtype = next(vanilla.parameters()).dtype
    for module_name, theirs, mine in patched_modules(vanilla, patched):
        for tokens in sorted({1 if module_name == "lm_head" else count for count in rows}):  # the head: the last token
            x = torch.randn(1, tokens, width_of(theirs, vanilla), device=device, dtype=dtype)
            cell = Cell(name, module_name, type(mine).__name__, tokens, path_of(mine, x), 0.0)
            before = 0
            for _ in range(pairs):
                theirs(x), mine(x)  # warm: compile, dispatch, plans
                cell.vanilla.append(host_and_loop_us(lambda: theirs(x), calls, device))
                before -= served()
                cell.patched.append(host_and_loop_us(lambda: mine(x), calls, device))
                before += served()
                if device.type == "cuda":
                    cell.vanilla[-1]["gpu_us"] = gpu_us(lambda: theirs(x), min(calls, 50))
                    cell.patched[-1]["gpu_us"] = gpu_us(lambda: mine(x), min(calls, 50))
            cell.cxx_share = round(before / (2 * calls * pairs), 3)
            cells.append(cell)
            print(json.dumps(asdict(cell)), flush=True)
    return cells


def gpu_us(fn: Callable[[], object], calls: int) -> float:
    """The GPU's own time per call in eager mode: ``calls`` back-to-back calls queued behind a sleeping kernel
    (``torch.cuda._sleep``), so that the host has queued them all before the GPU starts on them; timed by
    events. Where the GPU woke before the host had queued them (the start event done by then), the sleep is
    doubled and the timing taken again. A CUDA graph would time the captured path, which for our kernels is
    the graph-mode winner."""
    cycles = _SLEEP_CYCLES
    for _ in range(4):
        torch.cuda.synchronize()
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(cycles)
        begin.record()
        for _ in range(calls):
            fn()
        queued_in_time = not begin.query()
        end.record()
        torch.cuda.synchronize()
        if queued_in_time:
            break
        cycles *= 2
    return round(begin.elapsed_time(end) / calls * 1e3, 1)


_SLEEP_CYCLES = 100_000_000  # about 50 ms at a 2 GHz clock: longer than the host takes to queue 50 calls


def table(cells: list[Cell]) -> str:
    lines = [f"{'model':18} {'module':46} {'rows':>5} {'path':16} {'C++':>5} {'loop x':>7} {'host x':>7} "
             f"{'GPU x':>7} {'vanilla us':>10} {'patched us':>10}"]
    for c in cells:
        gpu = f"{c.ratio('gpu_us'):>7.3f}" if "gpu_us" in c.vanilla[0] else f"{'-':>7}"
        lines.append(f"{c.model:18} {c.module:46} {c.rows:>5} {c.path:16} {c.cxx_share:>5.2f} "
                     f"{c.ratio('loop_us'):>7.3f} {c.ratio('host_us'):>7.3f} {gpu} {statistics.median(v['loop_us'] for v in c.vanilla):>10.1f} "
                     f"{statistics.median(p['loop_us'] for p in c.patched):>10.1f}")
    lines.append("loop x, host x, GPU x: vanilla over patched, the median of the pairs' (>1: patched faster); "
                 "us: loop time")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=lambda s: s.split(","), default=["Qwen2.5-7B"],
                        help="models of scripts/bench_models.py, comma-separated (default Qwen2.5-7B)")
    parser.add_argument("--rows", type=lambda s: [int(v) for v in s.split(",")], default=[1, 16, 512],
                        help="rows per call: decode batch sizes and prompt lengths (default 1,16,512)")
    parser.add_argument("--pairs", type=int, default=2, help="interleaved vanilla/patched pairs (default 2)")
    parser.add_argument("--calls", type=int, default=100, help="calls per timing (default 100, at least 21)")
    parser.add_argument("--db", default=None, help="a tuned database's SQLAlchemy URL (default: dispatch's)")
    parser.add_argument("--no-shipped", action="store_true", help="set the shipped tables aside")
    parser.add_argument("--everywhere", action="store_true",
                        help="patch every module without asking for evidence (our path everywhere, as record mode)")
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny dims on the CPU (TRITON_INTERPRET=1)")
    parser.add_argument("--out", required=True, help="folder for module_cost.json")
    args = parser.parse_args(argv)
    unknown = [m for m in args.models if m not in bench_models.MODELS]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; choose from {', '.join(bench_models.MODELS)}")
    if args.calls < 21:
        parser.error("--calls must be at least 21: the first 20 of each timing warm up")
    if not args.cpu_smoke and not torch.cuda.is_available():
        parser.error("this script times the GPU: run it on a machine with a CUDA GPU, or pass --cpu-smoke")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = torch.device("cpu" if args.cpu_smoke else "cuda")
    dtype = torch.float16 if args.cpu_smoke else torch.bfloat16
    if args.db is not None or args.no_shipped:
        kernels.use_database(args.db, use_shipped=not args.no_shipped)
    if not args.cpu_smoke:
        print(json.dumps({"C++ path": _native.start(block=True)}), flush=True)
    cells: list[Cell] = []
    with torch.no_grad():
        for name in args.models:
            vanilla = bench_models.build(bench_models.MODELS[name], 1, device, dtype, args.cpu_smoke)
            patched = kernels.patch(copy.deepcopy(vanilla), everywhere=args.everywhere)
            cells += measure(name, vanilla, patched, args.rows, args.pairs, args.calls, device)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "module_cost.json").write_text(json.dumps([asdict(c) for c in cells], indent=1))
    print(table(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
