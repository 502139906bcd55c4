"""Where a layer's time goes, per GPU kernel: torch against ours, eager and compiled (a probe for issue 13).

    PYTHONPATH=.:scripts python3 scripts/probes/layer_profile.py --setting decoder/prefill/2048 --out $OUT

For each column it waits for the C++ path of cuBLAS plans (so no build runs under the timing), times
back-to-back calls as bench_layers.py does, then profiles a few calls with torch.profiler and prints the
GPU kernels by total time. The question it answers: which kernels make ours slower than torch where every
GEMM is cuBLAS in both.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import pstats
import os
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import kernels  # noqa: E402
from bench_layers import COMPILE_OPTIONS, build, inputs, ours, time_calls  # noqa: E402


def column_fn(column: str, model: torch.nn.Module, x: torch.Tensor):
    """A column of bench_layers.py without its CUDA graph: compiled as that script compiles it, or eager."""
    options = COMPILE_OPTIONS.get(column.removesuffix("_graph"))
    if options is not None:
        compiled = torch.compile(model, dynamic=False, **options)
        return lambda: compiled(x)
    return lambda: model(x)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--setting", action="append", default=None, help="layer/mode/tokens (repeatable)")
    parser.add_argument("--columns", default="torch_eager,ours_eager,compile_default,ours_compile",
                        help="bench_layers.py columns (a _graph column runs uncaptured, to be profiled)")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--rows", type=int, default=14)
    parser.add_argument("--cprofile", action="store_true", help="also cProfile 20 calls of each column (host time)")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    args = parser.parse_args()
    device, dtype = torch.device("cuda"), torch.bfloat16
    print(f"# C++ path of cuBLAS plans: {kernels._native.start(block=True)}", flush=True)
    for setting in args.setting or ["decoder/prefill/2048"]:
        layer, mode, tokens = setting.split("/")
        model = build(layer, False, device, dtype)
        x = inputs(model, mode, int(tokens), device, dtype)
        for column in args.columns.split(","):
            torch._dynamo.reset()
            context = ours(model) if column.startswith("ours") else contextlib.nullcontext(model)
            with context as m, torch.no_grad():
                fn = column_fn(column, m, x)
                start = time.perf_counter()
                fn()
                torch.cuda.synchronize()
                setup = time.perf_counter() - start
                ms = [time_calls(fn, device, args.iters) for _ in range(3)]
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    for _ in range(5):
                        fn()
                    torch.cuda.synchronize()
                host = None
                if args.cprofile:
                    host = cProfile.Profile()
                    host.enable()
                    for _ in range(20):
                        fn()
                    torch.cuda.synchronize()
                    host.disable()
            events = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
            total = sum(e.self_device_time_total for e in events) / 5 / 1e3
            print(f"\n## {setting} {column}: {min(ms):.3f} ms per call (of {['%.3f' % v for v in ms]}), "
                  f"GPU kernels {total:.3f} ms per call, first call {setup:.1f} s", flush=True)
            for e in sorted(events, key=lambda e: -e.self_device_time_total)[:args.rows]:
                print(f"  {e.self_device_time_total / 5 / 1e3:8.3f} ms  x{e.count // 5:<3d} {e.key[:110]}")
            if host is not None:
                text = io.StringIO()
                pstats.Stats(host, stream=text).sort_stats("tottime").print_stats(args.rows)
                print("  host, 20 calls, by own time:\n" + "\n".join("    " + line for line in
                                                                   text.getvalue().splitlines()[6:] if line.strip()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
