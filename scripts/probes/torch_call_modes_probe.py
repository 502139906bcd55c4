"""Why does torch's own eager call read two speeds in two processes? torch.addmm on bf16 1x4608x3584 (a
Qwen2.5-7B decode step's q/k/v with its bias) took 21.5 us a call in one fresh process and 15.8 us in the
next, on one H100 machine, while our call read 15.8-16.3 us in both (docs/BENCHMARKS.md, "Twenty-fifth
session"). The GPU takes about 15.8 us either way: the slow readings are the host's or another kernel's.

Each of ``--processes`` fresh processes, for each problem and each torch call (torch.addmm with the bias,
torch.matmul without), reports:
- ``loop``: wall time per call of back-to-back calls with one synchronize at the end (what an eager model
  and the bench see: max(host, GPU));
- ``enqueue``: wall time per call of 100 calls without waiting (the host's own cost while the launch
  queue has room);
- ``kernels``: the CUDA kernels one call launched (torch.profiler), with their mean GPU time: a second
  kernel (a split-K reduction) or another GEMM kernel in the slow processes would say it is cuBLAS's choice.

    PYTHONPATH=. python3 scripts/probes/torch_call_modes_probe.py [--processes 6] [--key bf16:nt:1x4608x3584]

Is the level the CPU the thread runs on? ``--repeat R`` measures each problem R times in a process, each
reading tagged with the CPU the thread ran on before and after it; ``--pin 0,8`` runs one more process pinned
(sched_setaffinity, inherited by the CUDA driver's threads) to each listed CPU.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

CHILD = r"""
import json, os, sys, time, torch
from torch.profiler import ProfilerActivity, profile

keys = json.loads(sys.argv[1])
repeat = int(sys.argv[2])
pin = sys.argv[3]
if pin != "-":
    os.sched_setaffinity(0, {int(pin)})


def cpu():
    # field 39 of /proc/self/stat: the CPU the main thread last ran on
    with open("/proc/self/stat") as stream:
        return int(stream.read().rsplit(")", 1)[1].split()[36])


tensors = {}
for key in keys:
    dtype, layout, shape = key.split(":")
    m, n, k = (int(x) for x in shape.split("x"))
    kind = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    tensors[key] = (torch.randn(m, k, device="cuda", dtype=kind), torch.randn(n, k, device="cuda", dtype=kind).t(),
                    torch.randn(n, device="cuda", dtype=kind))
out = []
for rep in range(repeat):
    for key in keys:
        a, b, bias = tensors[key]
        for name, call in (("torch.addmm", lambda: torch.addmm(bias, a, b)), ("torch.matmul", lambda: torch.matmul(a, b))):
            for _ in range(200):
                call()
            torch.cuda.synchronize()
            before = cpu()
            start = time.perf_counter()
            for _ in range(2000):
                call()
            torch.cuda.synchronize()
            loop = (time.perf_counter() - start) / 2000 * 1e6
            start = time.perf_counter()
            for _ in range(100):
                call()
            enqueue = (time.perf_counter() - start) / 100 * 1e6
            torch.cuda.synchronize()
            kernels = {}
            if rep == 0:
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    for _ in range(20):
                        call()
                    torch.cuda.synchronize()
                for event in prof.key_averages():
                    if event.device_type.name == "CUDA" and event.count:
                        kernels[event.key[:70]] = (event.count / 20, event.device_time_total / event.count)
            out.append(dict(key=key, call=name, rep=rep, cpus=(before, cpu()), loop_us=loop, enqueue_us=enqueue,
                            kernels=kernels))
print(json.dumps(out))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=6)
    parser.add_argument("--key", action="append", help="dtype:layout:MxNxK (layout nt: B = w.t())")
    parser.add_argument("--repeat", type=int, default=1, help="measurements of each problem per process")
    parser.add_argument("--pin", default="", help="comma-separated CPUs: one more process pinned to each")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    keys = args.key or ["bf16:nt:1x4608x3584", "bf16:nt:128x4608x3584", "fp16:nt:1x4608x3584"]
    import torch

    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, {time.strftime('%Y-%m-%d')}, "
          f"{args.processes} fresh processes")
    rows = []
    runs = [(process, "-") for process in range(args.processes)]
    runs += [(args.processes + i, cpu) for i, cpu in enumerate(c for c in args.pin.split(",") if c)]
    for process, pin in runs:
        done = subprocess.run([sys.executable, "-c", CHILD, json.dumps(keys), str(args.repeat), pin],
                              capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            print(f"process {process}: failed\n{done.stderr[-2000:]}")
            continue
        for row in json.loads(done.stdout.strip().splitlines()[-1]):
            row["process"] = process
            row["pin"] = pin
            rows.append(row)
            kernels = "; ".join(f"{name} x{count:g} {us:.1f}us" for name, (count, us) in row["kernels"].items())
            print(f"p{process} pin {pin:>2} rep {row['rep']} cpu {row['cpus'][0]:>2}->{row['cpus'][1]:<2} "
                  f"{row['key']:22} {row['call']:13} loop {row['loop_us']:6.2f} us  "
                  f"enqueue {row['enqueue_us']:6.2f} us  {kernels}", flush=True)
    if args.json:
        with open(args.json, "w") as stream:
            json.dump(rows, stream, indent=1)


if __name__ == "__main__":
    main()
