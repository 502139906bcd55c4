"""Is torch.matmul's eager time on a memory-bound 1-token problem bimodal, and what state goes with it?

scripts/probes/contest_vs_bench_probe.py (H100, 2026-11-25) timed torch.matmul on bf16 1x2048x10944 at
20.7 us in one pass and 26-29 us in the others, in one process, with the split-K winner at 22.0 against
22.6-24.8 us: the winner's 1.15x holds in one state of the GPU and turns into 0.94x in the other. Here one
process times torch.matmul and the split-K config, eager over the tuner's rotation, many times, after
different things (nothing, a pause, a burst of large GEMMs, a busy loop of small ones), and reads the SM
clock, memory clock, power and P-state from nvidia-smi after each timing.

    PYTHONPATH=. python3 scripts/probes/gemv_state_probe.py [--key bf16:nt:1x2048x10944] [--repeats 6]
"""

from __future__ import annotations

import argparse
import subprocess
import time

import torch
import triton

import kernels
from kernels import MATMUL, Config, Problem
from tuner import timing
from tuner.bench import Bench

QUERY = "clocks.sm,clocks.mem,power.draw,pstate,temperature.gpu"


def gpu_state() -> str:
    try:
        return subprocess.run(["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=10).stdout.strip()
    except Exception as error:  # a probe: the timings stand without it
        return f"nvidia-smi failed: {error!r}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--key", default="bf16:nt:1x2048x10944")
    parser.add_argument("--repeats", type=int, default=6)
    args = parser.parse_args()
    device = kernels.current_device()
    print(f"# {device.name}, torch {torch.__version__}, triton {triton.__version__}, {time.strftime('%Y-%m-%d')}, "
          f"{args.key}; state columns: {QUERY}", flush=True)
    kernels._native.start(block=True)
    problem = Problem.from_key("matmul", args.key)
    eager = kernels.explain("matmul", problem, device, "eager").config
    bench = Bench(MATMUL, problem, device)
    rotation = bench.rotation()
    big = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
    small = torch.randn(64, 64, device="cuda", dtype=torch.float16)

    def before_nothing() -> None:
        pass

    def before_pause() -> None:
        torch.cuda.synchronize()
        time.sleep(1.0)

    def before_heavy() -> None:  # about 200 ms of dense GEMMs: power and clocks move
        for _ in range(100):
            big @ big
        torch.cuda.synchronize()

    def before_host_bound() -> None:  # about 200 ms of tiny GEMMs: a GPU mostly waiting on the host
        until = time.perf_counter() + 0.2
        while time.perf_counter() < until:
            small @ small
        torch.cuda.synchronize()

    befores = {"nothing": before_nothing, "pause 1 s": before_pause, "large GEMMs": before_heavy,
               "tiny GEMMs": before_host_bound}
    with kernels.dispatch_mode("eager"):
        for repeat in range(args.repeats):
            for name, before in befores.items():
                before()
                theirs, ours = timing.eager_ms_side_by_side(
                    [lambda x: torch.matmul(*x), lambda x: kernels.matmul(*x)], rotation, 30.0)
                state = gpu_state()
                print(f"[{repeat}] after {name:12} torch {theirs * 1e3:6.1f} us  ours({eager.get('VARIANT', 'tiled')}) "
                      f"{ours * 1e3:6.1f} us  {theirs / ours:.3f}x  | {state}", flush=True)
    # Is the slow state the host's? The host's issue time per call (no synchronize inside the loop: the
    # queue takes them), the GPU's back-to-back time (Bench.back_to_back: a graph of calls then, queued calls since 2026-11-26), and the
    # eager side by side, in turn.
    for repeat in range(args.repeats):
        issue = {}
        for label, call in (("torch", lambda x: torch.matmul(*x)), ("ours", lambda x: kernels.matmul(*x))):
            torch.cuda.synchronize()
            started = time.perf_counter()
            for i in range(200):
                call(rotation[i % len(rotation)])
            issue[label] = (time.perf_counter() - started) / 200 * 1e6
            torch.cuda.synchronize()
        ours_b2b, torch_b2b = bench.back_to_back(eager)
        theirs, ours = timing.eager_ms_side_by_side(
            [lambda x: torch.matmul(*x), lambda x: kernels.matmul(*x)], rotation, 30.0)
        print(f"[{repeat}] host issue: torch {issue['torch']:5.1f} us ours {issue['ours']:5.1f} us | back to back: "
              f"torch {torch_b2b * 1e3:5.1f} us ours {ours_b2b * 1e3:5.1f} us | eager: torch {theirs * 1e3:5.1f} us "
              f"ours {ours * 1e3:5.1f} us", flush=True)
    # Each side alone, back to back, per block: is the state a property of the moment or of the side?
    for repeat in range(2):
        for label, call in (("torch alone", lambda x: torch.matmul(*x)), ("ours alone", lambda x: kernels.matmul(*x))):
            ms = timing.eager_ms(call, rotation)
            print(f"[{repeat}] {label:12} {ms * 1e3:6.1f} us | {gpu_state()}", flush=True)


if __name__ == "__main__":
    main()
