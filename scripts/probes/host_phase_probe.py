"""What is the host's "phase"? torch.matmul's eager time per call on one small problem moves between two
values (11.5 and 25.8 us within one H100 run, docs/BENCHMARKS.md, fifteenth and eighteenth sessions).
This probe asks whether the phase follows the core the thread runs on, the core's clock, or neither.

For each placement (as the OS schedules it; pinned to one core near the GPU; pinned to one core far from
it, where the machine has one), it times windows of back-to-back calls, each window holding:
- torch.matmul and kernels.matmul, in blocks timed by CUDA events (timing.eager_ms_side_by_side);
- a pure-Python spin (no GPU), whose time tracks the host's speed alone;
- the core the thread ran on, and that core's clock where cpufreq shows it.

    PYTHONPATH=. python3 scripts/probes/host_phase_probe.py [--key bf16:nt:8x1024x8192] [--seconds 20] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch
import triton

import kernels
from kernels import MATMUL, Problem
from tuner import timing
from tuner.bench import Bench

KEYS = ("bf16:nt:8x1024x8192", "fp16:nt:8x2048x2816")


def current_cpu() -> int:
    """The core this thread last ran on (field 39 of /proc/thread-self/stat)."""
    stat = Path("/proc/thread-self/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[36])


def core_khz(cpu: int) -> int | None:
    path = Path(f"/sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_cur_freq")
    return int(path.read_text()) if path.exists() else None


def spin_us(loops: int = 20000) -> float:
    """Microseconds for a fixed pure-Python loop: the host's speed, with no GPU in it (timing.HostSpeed's spin)."""
    return timing.HostSpeed(loops).spin_us()


def gpu_cpus() -> tuple[list[int], int | None]:
    """The cores the GPU's PCI device calls local, and its NUMA node (sysfs), where the kernel says."""
    props = torch.cuda.get_device_properties(0)
    name = f"{props.pci_domain_id:04x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
    base = Path("/sys/bus/pci/devices") / name
    if not base.exists():
        return [], None
    return _parse_list((base / "local_cpulist").read_text().strip()), int((base / "numa_node").read_text().strip())


def _parse_list(text: str) -> list[int]:
    cpus: list[int] = []
    for part in text.split(","):
        if "-" in part:
            low, high = part.split("-")
            cpus.extend(range(int(low), int(high) + 1))
        elif part:
            cpus.append(int(part))
    return cpus


def windows(bench: Bench, seconds: float) -> list[dict]:
    rotation = bench.rotation()
    calls = [lambda x: torch.matmul(*x), lambda x: kernels.matmul(*x)]
    rows = []
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        spin = spin_us()
        theirs, ours = timing.eager_ms_side_by_side(calls, rotation, total_ms=20.0)
        cpu = current_cpu()
        rows.append({"t": round(time.perf_counter() - started, 3), "cpu": cpu, "khz": core_khz(cpu),
                     "spin_us": round(spin, 1), "torch_us": round(theirs * 1e3, 2), "ours_us": round(ours * 1e3, 2)})
    return rows


def summary(rows: list[dict]) -> dict:
    torch_us = sorted(r["torch_us"] for r in rows)
    ours_us = sorted(r["ours_us"] for r in rows)
    spins = sorted(r["spin_us"] for r in rows)
    slow = [r for r in rows if r["torch_us"] > 1.4 * torch_us[0]]
    fast = [r for r in rows if r["torch_us"] <= 1.4 * torch_us[0]]

    def pct(values: list[float], q: float) -> float:
        return values[min(len(values) - 1, int(q * len(values)))]

    return {
        "windows": len(rows), "cpus_seen": sorted({r["cpu"] for r in rows}),
        "torch_us_p10_p50_p90": [pct(torch_us, 0.1), pct(torch_us, 0.5), pct(torch_us, 0.9)],
        "ours_us_p10_p50_p90": [pct(ours_us, 0.1), pct(ours_us, 0.5), pct(ours_us, 0.9)],
        "spin_us_p10_p50_p90": [pct(spins, 0.1), pct(spins, 0.5), pct(spins, 0.9)],
        "slow_windows (torch > 1.4x its least)": len(slow),
        "spin_us median slow / fast": [statistics.median(r["spin_us"] for r in slow) if slow else None,
                                       statistics.median(r["spin_us"] for r in fast) if fast else None],
        "cpus of slow windows": sorted({r["cpu"] for r in slow}),
        "ratio_p10_p50_p90": [pct(sorted(r["torch_us"] / r["ours_us"] for r in rows), q) for q in (0.1, 0.5, 0.9)],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--key", action="append")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--json")
    args = parser.parse_args()
    device = kernels.current_device()
    print(f"# {device.name}, torch {torch.__version__}, triton {triton.__version__}, {time.strftime('%Y-%m-%d')}")
    print(f"# C++ path: {kernels._native.start(block=True)}")
    allowed = sorted(os.sched_getaffinity(0))
    local, node = gpu_cpus()
    local = [c for c in local if c in allowed]
    remote = [c for c in allowed if local and c not in local]
    governor = Path("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor")
    print(f"# cores allowed {len(allowed)} ({allowed[0]}-{allowed[-1]}); GPU NUMA node {node}, "
          f"{len(local)} local cores; governor {governor.read_text().strip() if governor.exists() else 'n/a'}",
          flush=True)
    placements: list[tuple[str, set[int]]] = [("unpinned", set(allowed))]
    if local:
        placements.append((f"pinned local core {local[len(local) // 2]}", {local[len(local) // 2]}))
    if remote:
        placements.append((f"pinned remote core {remote[len(remote) // 2]}", {remote[len(remote) // 2]}))
    if not local:
        placements.append((f"pinned core {allowed[len(allowed) // 2]}", {allowed[len(allowed) // 2]}))
    report = []
    for key in args.key or KEYS:
        problem = Problem.from_key("matmul", key)
        bench = Bench(MATMUL, problem, device)
        print(f"{key}: eager plan {kernels.explain('matmul', problem, device, 'eager').config}", flush=True)
        for label, cpus in placements:
            os.sched_setaffinity(0, cpus)
            rows = windows(bench, args.seconds)
            result = summary(rows)
            print(f"  {label}: {json.dumps(result)}", flush=True)
            report.append({"key": key, "placement": label, "summary": result, "rows": rows})
        os.sched_setaffinity(0, set(allowed))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
