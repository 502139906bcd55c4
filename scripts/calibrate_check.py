"""Calibrate the correctness check on the GPU (kernels/_check.py): how close valid configs come to their bound,
and whether every mutant is rejected on real shapes.

Two parts, in one run, for docs/RELIABILITY.md:

1. Mutants (tests/tuner_tests/mutants.py) on real shapes, in fp16, bf16 and fp32 where the family takes it:
   each broken run and its unbroken config go through ``check_config``, the search's check. Every mutant must
   be rejected, every unbroken config must pass.
2. Valid configs: every config that ran in the committed sweeps (benchmarks/sweeps, H100, 2026-11-23), one per
   set of configs that compute the same numbers (launch options that only order or pipeline the same sums
   are left out: num_stages, GROUP_SIZE_M, NUM_SM, FLATTEN, EPILOGUE_SUBTILE), then a seeded sample of each
   family's space on more shapes and dtypes (bf16, fp32/TF32, K up to 14336, the gemv, repack and epilogue
   paths). Compiled and checked in parallel worker processes, the search's CheckPool, until ``--budget-s``.
   Each verdict is the worst element's error in units of its bound; times the margin it is the margin that
   config needed. A valid config over 1 is a false rejection (or a real bug): the table lists it.

    python scripts/calibrate_check.py --out runs/calibrate_check      # about 4-5 minutes on an H100

Prints a table per part and writes ``calibrate_check.json`` (every case) into --out.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import glob
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import kernels  # noqa: E402
from kernels import Config, Problem  # noqa: E402
from kernels._check import MARGIN, check_config, margin_for  # noqa: E402
from tests.tuner_tests.mutants import MUTANTS  # noqa: E402
from tuner.workers import CheckPool  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SAME_NUMBERS = {"num_stages", "GROUP_SIZE_M", "NUM_SM", "FLATTEN", "EPILOGUE_SUBTILE"}

# Shapes beyond the sweeps: (kernel, problem key, configs sampled from its space).
MORE = [
    ("matmul", "bf16:nn:16x4096x4096", 40), ("matmul", "fp32:nn:16x4096x4096", 40),
    ("matmul", "bf16:nt:4096x4096x4096", 40), ("matmul", "fp32:nt:512x4096x8192", 30),
    ("matmul", "bf16:nt:64x4096x14336", 30), ("matmul", "fp16:nn:1000x1000x1000", 30),
    ("matmul", "bf16:nn:3333x257x4099", 30), ("matmul", "bf16:nt:1x4096x8192", 30),
    ("matmul", "fp32:nt:1x4096x4096", 20),
    ("grouped_matmul", "bf16:nn:" + "+".join(["1024x1024x1024"] * 4), 30),
    ("grouped_matmul", "bf16:nt:" + "+".join(f"{m}x1536x4096" for m in (128, 384, 1000, 2048)), 30),
    ("moe_matmul", "fp16:nt:" + "+".join(["512x1536x4096"] * 8), 30),
    ("moe_gated_matmul", "bf16:nt:" + "+".join(["512x768x2048"] * 8), 30),  # margin: gated_matmul's until measured
    ("matmul_bias", "fp16:nt:512x4096x4096", 20), ("matmul_bias", "bf16:nt:512x4096x4096", 20),
    ("matmul_bias", "fp32:nt:512x4096x4096", 20), ("matmul_bias", "bf16:nt:1x4096x4096", 15),
    ("gated_matmul", "fp16:nt:512x14336x4096", 20), ("gated_matmul", "bf16:nt:512x14336x4096", 20),
    ("gated_matmul", "fp32:nt:512x14336x4096", 20), ("gated_matmul", "bf16:nt:1x14336x4096", 15),
    ("gated_matmul", "bf16:nt:4096x14336x4096", 15),
]


def _numbers_key(config: Config) -> tuple:
    return tuple(sorted((k, v) for k, v in config.as_dict().items() if k not in SAME_NUMBERS))


def _variant(config: Config) -> str:
    if config.get("VARIANT") is not None:
        return str(config["VARIANT"])
    return "gemv" if config.get("GEMV_BLOCK_N", 0) else "tiled"


def _fitted(spec, config: Config, problem: Problem, device) -> tuple[Config | None, str]:
    """``config``, with fewer stages if that is what it takes to fit this dtype's shared memory."""
    while True:
        reason = spec.space.violation(config, problem, device)
        if reason is None:
            return config, ""
        if config.num_stages <= 2:
            return None, reason
        config = config.replace(num_stages=config.num_stages - 1)


# ------------------------------------------------------------------------------------------------ mutants

def run_mutants_apart(out: Path) -> list[dict]:
    """``run_mutants``, each mutant and dtype in a fresh process: a mutant that faults the GPU (a misaligned
    address stays with its CUDA context) then costs its own row only. Run in one process on the H100
    (2026-11-28), the first grouped mutant's fault was read by every case after it; run per mutant on the H200
    (the same day), the grouped offset mutant's fp16 fault failed its bf16 row's unbroken config."""
    rows = []
    cases = [(index, mutant, dtype) for index, mutant in enumerate(MUTANTS)
             for dtype in ("fp16", "bf16", "fp32") if dtype in kernels.get_kernel(mutant.kernel).dtypes]
    for index, mutant, dtype in cases:
        part = out / f"mutant-{index}-{dtype}.json"
        done = subprocess.run([sys.executable, __file__, "--one-mutant", f"{index}:{dtype}", "--out", str(part)],
                              capture_output=True, text=True)
        if done.returncode == 0 and part.exists():
            rows += json.loads(part.read_text())
            part.unlink()
            continue
        last = (done.stderr.strip().splitlines() or ["no output"])[-1][:200]
        rows.append(dict(kernel=mutant.kernel, bug=mutant.bug, dtype=dtype, problem="-", sound=None, mutant=None,
                         mutant_reason=f"its process failed ({done.returncode}): {last}", rejected=True,
                         sound_passes=False, status="process failed"))
        print(f"  mutant {mutant.kernel:<14} {mutant.bug:<46} {dtype}: its process failed: {last}", flush=True)
    return rows


def run_mutants(device, torch_device: torch.device, on_cpu: bool = False,
                only: tuple[int, str] | None = None) -> list[dict]:
    """Each mutant and its unbroken config through the search's check (``on_cpu``: the tests' small shapes;
    ``only``: that mutant, in that dtype, alone)."""
    rows = []
    for index, mutant in enumerate(MUTANTS):
        if only is not None and index != only[0]:
            continue
        spec = kernels.get_kernel(mutant.kernel)
        for dtype in ("fp16", "bf16", "fp32"):
            if dtype not in spec.dtypes or (only is not None and dtype != only[1]):
                continue
            problem, config = mutant.cpu_case(dtype) if on_cpu else mutant.gpu_case(dtype)
            row = dict(kernel=mutant.kernel, bug=mutant.bug, dtype=dtype, problem=problem.key[:80])
            config, why = _fitted(spec, config, problem, device)
            if config is None:
                rows.append({**row, "status": "skipped", "reason": why})
                continue
            row["config"] = str(config)
            start = time.perf_counter()
            for side, checked in (("sound", spec), ("mutant", mutant.spec())):
                try:
                    verdict = check_config(checked, problem, config, torch_device, 1000 + index)
                    row[side] = verdict.error
                    row[f"{side}_reason"] = verdict.reason
                except Exception as exc:  # the search would record it as an error: rejected, but say so
                    row[side] = None
                    row[f"{side}_reason"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            row["rejected"] = row["mutant"] is None or not row["mutant"] <= 1.0
            row["sound_passes"] = row["sound"] is not None and row["sound"] <= 1.0
            row["seconds"] = round(time.perf_counter() - start, 2)
            rows.append(row)
            print(f"  mutant {mutant.kernel:<14} {dtype} {mutant.bug:<46} sound {_fmt(row['sound']):>8}  mutant "
                  f"{_fmt(row['mutant']) if row['mutant'] is not None else 'error':>10}  "
                  f"{'rejected' if row['rejected'] else 'MISSED'}", flush=True)
    return rows


# ---------------------------------------------------------------------------------------------- valid configs

def sweep_cases() -> list[tuple[str, Problem, Config]]:
    cases = []
    for path in sorted(glob.glob(str(ROOT / "benchmarks/sweeps/**/*.json"), recursive=True)):
        document = json.loads(Path(path).read_text())
        problem = Problem.from_key(document["kernel"], document["problem"])
        seen = set()
        for row in document["rows"]:
            if row.get("status") != "ok":
                continue
            config = Config.from_dict(row["config"])
            if _numbers_key(config) not in seen:
                seen.add(_numbers_key(config))
                cases.append((Path(path).stem, problem, config))
    return cases


def more_cases(device) -> list[tuple[str, Problem, Config]]:
    rng = random.Random(0)
    cases = []
    for kernel, key, count in MORE:
        spec = kernels.get_kernel(kernel)
        problem = Problem.from_key(kernel, key)
        seeds = {_numbers_key(c): c for c in spec.seeds(problem, device)}  # what the search measures first
        rest = {_numbers_key(c): c for c in spec.space.enumerate(problem, device) if _numbers_key(c) not in seeds}
        others = list(rest.values())
        rng.shuffle(others)
        for config in (list(seeds.values()) + others)[:count]:
            cases.append((f"{kernel} {key[:48]}", problem, config))
    return cases


def _round_robin(cases: list[tuple[str, Problem, Config]]) -> list[tuple[str, Problem, Config]]:
    """Cases interleaved group by group, so that a run cut short by its budget covers every group."""
    groups: dict[str, list] = collections.defaultdict(list)
    for case in cases:
        groups[case[0]].append(case)
    order = []
    while any(groups.values()):
        for name in list(groups):
            if groups[name]:
                order.append(groups[name].pop(0))
    return order


def run_valid(cases: list, workers: int, deadline: float, chunk: int) -> list[dict]:
    rows = []
    with CheckPool(workers=workers) as pool:
        pool.start()
        for start in range(0, len(cases), chunk):
            if time.monotonic() > deadline:
                break
            part = cases[start:start + chunk]
            results = pool.check_each([(problem, config) for _, problem, config in part], seed=start)
            for (group, problem, config), result in zip(part, results):
                rows.append(dict(group=group, kernel=problem.kernel, dtype=problem.dtype, problem=problem.key[:80],
                                 k=max(k for _, _, k in problem.shapes), variant=_variant(config), config=str(config),
                                 status=result.status, error=result.rel_error, reason=result.reason,
                                 margin=margin_for(problem.kernel, problem.dtype, config)))
            done = len(rows)
            print(f"  checked {done}/{len(cases)} valid configs, {sum(r['status'] == 'wrong_result' for r in rows)} "
                  f"rejected, {deadline - time.monotonic():.0f} s left", flush=True)
    return rows


def summarize(rows: list[dict]) -> list[dict]:
    by: dict[tuple, list[dict]] = collections.defaultdict(list)
    for row in rows:
        by[(row["kernel"], row["dtype"], row["variant"])].append(row)
    table = []
    for (kernel, dtype, variant), group in sorted(by.items()):
        errors = sorted(r["error"] for r in group if r["error"] is not None and r["status"] == "ok")
        worst = max(group, key=lambda r: r["error"] if r["error"] is not None else -1)
        table.append(dict(kernel=kernel, dtype=dtype, variant=variant, configs=len(group),
                          ok=sum(r["status"] == "ok" for r in group),
                          rejected=sum(r["status"] == "wrong_result" for r in group),
                          other=sum(r["status"] not in ("ok", "wrong_result") for r in group),
                          k_max=max(r["k"] for r in group), margin=group[0]["margin"],
                          max_error=worst["error"], p99_error=errors[int(0.99 * (len(errors) - 1))] if errors else None,
                          needed_margin=None if worst["error"] is None else worst["error"] * group[0]["margin"],
                          worst_config=worst["config"], worst_problem=worst["problem"]))
    return table


def _print_table(title: str, header: list[str], rows: list[list]) -> None:
    print(f"\n{title}")
    widths = [max(len(str(x)) for x in [h] + [r[i] for r in rows]) for i, h in enumerate(header)]
    for line in [header] + rows:
        print("  ".join(str(x).ljust(w) for x, w in zip(line, widths)))


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for calibrate_check.json")
    parser.add_argument("--budget-s", type=float, default=270, help="stop starting valid checks after this long")
    parser.add_argument("--workers", type=int, default=14, help="compile-and-check processes (default 14)")
    parser.add_argument("--chunk", type=int, default=56, help="valid checks handed to the workers at a time")
    parser.add_argument("--no-mutants", action="store_true")
    parser.add_argument("--no-more", action="store_true", help="the sweeps' configs only")
    parser.add_argument("--plan", action="store_true",
                        help="list how many cases each group has, for an H100, and stop (no GPU needed)")
    parser.add_argument("--one-mutant", default=None, help=argparse.SUPPRESS)  # a child's INDEX:DTYPE
    args = parser.parse_args(argv)
    if args.one_mutant is not None:
        rows = run_mutants(kernels.current_device(), torch.device("cuda", torch.cuda.current_device()),
                           only=(int(args.one_mutant.partition(":")[0]), args.one_mutant.partition(":")[2]))
        Path(args.out).write_text(json.dumps(rows, default=str))
        return 0
    if args.plan:
        h100 = kernels.described_device("NVIDIA H100 80GB HBM3", "9.0", 132)
        cases = sweep_cases() + ([] if args.no_more else more_cases(h100))
        for group, count in collections.Counter(group for group, _, _ in cases).items():
            print(f"{count:5d}  {group}")
        print(f"{len(cases):5d}  valid configs; {len(MUTANTS)} mutants")
        return 0
    if not torch.cuda.is_available():
        print("error: calibrate_check.py measures the GPU's errors; this machine has no GPU", file=sys.stderr)
        return 2
    begin = time.monotonic()
    deadline = begin + args.budget_s
    device = kernels.current_device()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"{device.name}, torch {torch.__version__}, triton {triton.__version__}, margin {MARGIN} "
          f"(gated bf16 {margin_for('gated_matmul', 'bf16')})", flush=True)

    mutants = [] if args.no_mutants else run_mutants_apart(out)
    cases = sweep_cases() + ([] if args.no_more else more_cases(device))
    cases = _round_robin(cases)
    print(f"{len(cases)} valid configs to check ({time.monotonic() - begin:.0f} s so far)", flush=True)
    valid = run_valid(cases, args.workers, deadline, args.chunk)
    summary = summarize(valid)

    if mutants:
        _print_table("Mutants (the search's check on real shapes; error in units of the bound, right <= 1)",
                     ["kernel", "bug", "dtype", "problem", "sound", "mutant", "verdict"],
                     [[m["kernel"], m["bug"], m["dtype"], m["problem"][:40], _fmt(m.get("sound")),
                       _fmt(m.get("mutant")) if m.get("mutant") is not None else m.get("status", "error"),
                       "skipped" if m.get("status") == "skipped" else
                       ("rejected" if m["rejected"] else "MISSED") + ("" if m["sound_passes"] else ", SOUND FAILS")]
                      for m in mutants])
    _print_table("Valid configs (worst element in units of its bound; needed margin = that x the margin)",
                 ["kernel", "dtype", "variant", "configs", "rejected", "other", "K max", "p99", "max",
                  "margin", "needed"],
                 [[s["kernel"], s["dtype"], s["variant"], s["configs"], s["rejected"], s["other"], s["k_max"],
                   _fmt(s["p99_error"]), _fmt(s["max_error"]), s["margin"], _fmt(s["needed_margin"])]
                  for s in summary])
    false = [r for r in valid if r["status"] == "wrong_result"]
    for r in false[:20]:
        print(f"REJECTED VALID {r['kernel']} {r['problem']} {r['config']}: {r['reason']}")
    document = dict(device=device.name, torch=torch.__version__, triton=triton.__version__,
                    date=datetime.date.today().isoformat(),
                    command=" ".join([os.path.basename(sys.argv[0])] + sys.argv[1:]),
                    margin=MARGIN, planned=len(cases), checked=len(valid), seconds=round(time.monotonic() - begin, 1),
                    mutants=mutants, summary=summary, valid=valid)
    (out / "calibrate_check.json").write_text(json.dumps(document, indent=1, default=str))
    missed = [m for m in mutants if m.get("status") != "skipped" and not m["rejected"]]
    print(f"\n{len(valid)} of {len(cases)} valid configs checked, {len(false)} rejected; "
          f"{len(mutants) - len(missed)} of {len(mutants)} mutant cases rejected or skipped, {len(missed)} missed; "
          f"{time.monotonic() - begin:.0f} s; {out / 'calibrate_check.json'}")
    return 1 if false or missed else 0


if __name__ == "__main__":
    sys.exit(main())
