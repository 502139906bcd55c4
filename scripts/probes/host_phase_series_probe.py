"""How long do the host's slow phases last, and what follows them? (scripts/probes/host_phase_probe.py asked
whether the phase follows the core, its clock or neither; this one samples a minute as a time series.)
The twenty-fifth session
found torch.matmul on bf16 1x4608x3584 costing 14-21 us of host time a call at some moments and 23-39 us at
others, and the twenty-sixth found the same with the process pinned to one CPU (``torch_call_modes_probe.py
--pin``). This probe samples, every few milliseconds for ``--seconds``, side by side:

- ``python``: a fixed pure-Python loop (the CPU's own speed, no driver, no GPU);
- ``launch``: the host cost of a one-element ``add_`` (one kernel launch through torch, no cuBLAS);
- ``matmul``: the host cost of torch.matmul on the problem (cuBLAS's call);
- ``ours``: the host cost of kernels.matmul on the problem (our C++ path, whatever the shipped table picks);
- ``steal``: the hypervisor's steal time over the sample (/proc/stat), where the machine is a VM.

and reports how they move together (Pearson correlation over the samples) and each one's spread. If
``python`` moves with ``matmul``, the slow level is the host CPU's speed; if only ``launch`` does, the
driver's launch path; if neither, something inside cuBLAS's call.

    PYTHONPATH=. python3 scripts/probes/host_phase_series_probe.py [--seconds 60] [--key bf16:nt:1x4608x3584]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def steal_jiffies() -> int:
    with open("/proc/stat") as stream:
        fields = stream.readline().split()
    return int(fields[8]) if len(fields) > 8 else 0


def python_loop_us() -> float:
    start = time.perf_counter()
    total = 0
    for value in range(20000):
        total += value
    return (time.perf_counter() - start) * 1e6


def enqueue_us(call, count: int) -> float:
    import torch

    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(count):
        call()
    elapsed = (time.perf_counter() - start) / count * 1e6
    torch.cuda.synchronize()
    return elapsed


def pearson(xs: list[float], ys: list[float]) -> float:
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    cov = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    vx = sum((x - mx) ** 2 for x in xs)
    vy = sum((y - my) ** 2 for y in ys)
    return cov / (vx * vy) ** 0.5 if vx and vy else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--key", default="bf16:nt:1x4608x3584", help="dtype:layout:MxNxK (layout nt: B = w.t())")
    parser.add_argument("--calls", type=int, default=50, help="calls per sample, enqueued without waiting")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    import torch

    import kernels

    dtype, _, shape = args.key.split(":")
    m, n, k = (int(x) for x in shape.split("x"))
    kind = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    a = torch.randn(m, k, device="cuda", dtype=kind)
    b = torch.randn(n, k, device="cuda", dtype=kind).t()
    one = torch.zeros(1, device="cuda")
    for _ in range(200):
        torch.matmul(a, b)
        kernels.matmul(a, b)
        one.add_(1)
    samples = []
    end = time.monotonic() + args.seconds
    while time.monotonic() < end:
        steal = steal_jiffies()
        sample = dict(t=time.monotonic(), python=python_loop_us(),
                      launch=enqueue_us(lambda: one.add_(1), args.calls),
                      matmul=enqueue_us(lambda: torch.matmul(a, b), args.calls),
                      ours=enqueue_us(lambda: kernels.matmul(a, b), args.calls))
        sample["steal"] = steal_jiffies() - steal
        samples.append(sample)
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, {time.strftime('%Y-%m-%d %H:%M:%S')}, "
          f"{args.key}, {len(samples)} samples over {args.seconds:g} s")
    for name in ("python", "launch", "matmul", "ours", "steal"):
        values = sorted(s[name] for s in samples)
        q = [values[int(f * (len(values) - 1))] for f in (0.05, 0.25, 0.5, 0.75, 0.95)]
        print(f"{name:7} p5 {q[0]:8.2f}  p25 {q[1]:8.2f}  p50 {q[2]:8.2f}  p75 {q[3]:8.2f}  p95 {q[4]:8.2f}")
    columns = ("python", "launch", "matmul", "ours")
    for i, x in enumerate(columns):
        for y in columns[i + 1:]:
            print(f"pearson({x}, {y}) = {pearson([s[x] for s in samples], [s[y] for s in samples]):+.2f}")
    # the series in one-second bins: does the level come in phases?
    start = samples[0]["t"]
    bins: dict[int, list[dict]] = {}
    for sample in samples:
        bins.setdefault(int(sample["t"] - start), []).append(sample)
    print("second  python_us  launch_us  matmul_us  ours_us  steal")
    for second, group in sorted(bins.items()):
        print(f"{second:6d}  {statistics.median(s['python'] for s in group):9.1f}  "
              f"{statistics.median(s['launch'] for s in group):9.2f}  {statistics.median(s['matmul'] for s in group):9.2f}"
              f"  {statistics.median(s['ours'] for s in group):7.2f}"
              f"  {sum(s['steal'] for s in group):5d}")
    if args.json:
        with open(args.json, "w") as stream:
            json.dump(samples, stream)


if __name__ == "__main__":
    main()
