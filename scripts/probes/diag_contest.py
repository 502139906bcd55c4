"""Is the final contest (tuner.search.head_to_head) itself wrong on a host-bound group? GPU only.

In one live search on the H100 (2026-11-23, docs/SEARCH.md "Live, sixth session") the contest timed
the grouped 4x128^3 finalists at about 0.08 ms, where the search had timed them at 0.006 ms. This
script times those three finalists the way the search does (``Bench.measure``) and the way the
contest does (``Bench.contest``), in this process and in the isolated timing worker, checks that a
call does not synchronise, and prints the host-plus-GPU time of one call:

    PYTHONPATH=. python scripts/probes/diag_contest.py

On the H100 every contest read 6.0-6.8 us (docs/runs/h100-session6/call4-diag-contest.txt): the
disturbance did not reproduce in isolation.
"""

from __future__ import annotations

import time
import warnings

import torch

import kernels
from kernels import Config, Problem
from tuner import suites
from tuner.bench import Bench
from tuner.workers import CheckPool, IsolatedBench

# The three finalists of the disturbed live search (its database: docs/runs/h100-session6/live-dbs/).
FINALISTS = ("BLOCK_M: 16, BLOCK_N: 32, BLOCK_K: 128, NUM_SM: 128, num_warps: 4, num_stages: 5",
             "BLOCK_M: 16, BLOCK_N: 32, BLOCK_K: 128, NUM_SM: 128, num_warps: 2, num_stages: 4",
             "BLOCK_M: 32, BLOCK_N: 32, BLOCK_K: 32, NUM_SM: 64, num_warps: 2, num_stages: 3")


def host_us_per_call(run, calls: int = 200) -> float:
    """Wall time of ``calls`` back-to-back calls, synchronised once at the end, per call."""
    start = time.perf_counter()
    for _ in range(calls):
        run()
    torch.cuda.synchronize()
    return 1e6 * (time.perf_counter() - start) / calls


def sync_warnings(run) -> list[str]:
    """What torch's sync debug mode reports for a few calls of ``run``."""
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(3):
                run()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    return [str(w.message)[:120] for w in caught]


def main() -> None:
    if not torch.cuda.is_available():
        raise SystemExit("diag_contest.py times kernels on a GPU; this machine has none")
    problem = Problem.from_key("grouped_matmul", "fp16:nn:" + suites.GROUPS_GPU["4x128^3"])
    configs = [Config.parse(text) for text in FINALISTS]
    spec = kernels.get_kernel("grouped_matmul")
    bench = Bench(spec, problem, kernels.current_device())
    print("in-process measure", [round(bench.measure(c).time_ms, 4) for c in configs])
    print("in-process contest", bench.contest(configs))
    print("in-process contest one", bench.contest(configs[:1]))
    inputs = bench._fresh_inputs()
    spec.execute(configs[0], inputs)
    torch.cuda.synchronize()
    print("sync warnings:", sync_warnings(lambda: (spec.execute(configs[0], inputs), spec.baseline(inputs))))
    print(f"host+gpu per call {host_us_per_call(lambda: spec.execute(configs[0], inputs)):.1f} us")
    with CheckPool() as pool:
        pool.start()
        isolated = IsolatedBench(pool.timing, "grouped_matmul", problem, kernels.current_device(), seed=1)
        print("isolated measure", [round(isolated.measure(c).time_ms, 4) for c in configs])
        print("isolated contest", isolated.contest(configs))
        print("isolated baseline", isolated.baseline_ms())
        print("isolated contest again", isolated.contest(configs))


if __name__ == "__main__":
    main()
