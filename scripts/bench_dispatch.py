"""What a user's call gets: kernels.matmul against torch.matmul, per dispatch mode, on the GPU.

``--kernel matmul_bias``: kernels.matmul_bias against torch.addmm (what nn.Linear runs with a bias), the same way.
``--kernel gated_matmul``: kernels.gated_matmul against a torch MLP's gate: silu(x @ Wg.t()) * (x @ Wu.t()), the
two projections' weights the halves of the stacked B (--corpus: the models' SiLU-gated MLPs).

For each problem, in each mode, both calls are timed side by side, finely interleaved, the way the
tuner's contest times its finalists (tuner/timing.py ``*_side_by_side``): eager = the public call back
to back over rotating inputs (host time included), in blocks of about 1 ms taken in turn; graph = the
call captured in a CUDA graph and replayed (L2 flushed), the two graphs replayed in turn. ``--rounds``
scales the time spent per problem. Dispatch
decides the config as it would for the user (no config is forced); the source of each choice is
reported. With --stored, each problem's stored record (its speed-up over cuBLAS) is set beside the
speed-up measured here, in this fresh process. With --control, torch.matmul is timed against itself in
the same way (an A/A run): how far from 1.00x the method reads where nothing differs, on this host now.
With --passes N, the whole list is timed N times, 2 s apart, and each problem keeps its median pass (per
mode): the host's speed moves from second to second on the GPU boxes, and one pass meets one phase of it.
This is how a stamp (tuner/stamp.py, ``python -m tuner stamp``) times the records it stores. Eager figures
are read at the host's nominal speed (tuner/timing.py ``eager_side_by_side``: turns inside a slow-host burst
are set aside, and through a slow phase of seconds the timing waits, ``--settle-s``), as a stamp reads what it
stores; the figures over every turn are reported beside them ("as run"). A SIGTERM (``timeout``) ends the
run early: the summary and --json then cover the problems finished ("stopped" names the signal), and the exit
status is 143.

    PYTHONPATH=. python3 scripts/bench_dispatch.py --corpus held_out --db sqlite:///fresh.db --json out.json
    PYTHONPATH=. python3 scripts/bench_dispatch.py --keys keys.txt --no-shipped --modes graph
"""

from __future__ import annotations

import argparse
import json
import math
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import triton

import kernels
from db import Store
from kernels import Problem
from tuner import timing
from kernels._check import check_outputs, largest_k
from tuner.bench import Bench
from tuner.stamp import STAMP_PAUSE_S


GRAPH_BUDGET = timing.FULL_MS
EAGER_MS = timing.SIDE_EAGER_MS / 3  # per side and round


def problems_of(args: argparse.Namespace) -> list[Problem]:
    keys = list(args.key or [])
    if args.keys:
        keys += [line.split("#")[0].strip() for line in Path(args.keys).read_text().splitlines()]
    kernel = getattr(args, "kernel", "matmul")
    problems = [Problem.from_key(kernel, key) for key in keys if key]
    if args.corpus:
        from tuner import corpus

        problems += corpus.corpus_problems(args.corpus, kernel, qkv=getattr(args, "qkv", False))
    if args.dtype:
        problems = [p for p in problems if p.dtype in args.dtype]
    if getattr(args, "m", None):
        problems = [p for p in problems if p.shapes[0][0] in args.m]
    problems = problems[:: getattr(args, "every", 1) or 1]
    if args.limit:
        problems = problems[: args.limit]
    return problems


def _addmm(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return torch.addmm(bias, a, b)


def _torch_gate(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """What a torch model's gated MLP runs: its gate and up Linears (each weight a half of the stacked B), then
    silu and the product."""
    n = b.shape[1] // 2
    return torch.nn.functional.silu(a @ b[:, :n]) * (a @ b[:, n:])


# Per kernel: (the public call, what a user of torch runs instead: nn.Linear's forward for a bias).
CALLS = {"matmul": (kernels.matmul, torch.matmul), "matmul_bias": (kernels.matmul_bias, _addmm),
         "gated_matmul": (kernels.gated_matmul, _torch_gate)}


def measure(problem: Problem, device: kernels.DeviceInfo, modes: list[str], rounds: int,
            control: bool = False, settle_s: float = 0.0) -> dict:
    """One problem's row: per mode, our call's and torch's (torch.matmul, or torch.addmm for matmul_bias)
    times side by side. ``control``: our side is torch's too (an A/A run; the choice dispatch would make
    is still reported). ``settle_s``: the eager timing waits up to this long for the host's nominal speed,
    as a stamp's does (timing.eager_side_by_side)."""
    spec = kernels.get_kernel(problem.kernel)
    public, torch_call = CALLS[problem.kernel]
    bench = Bench(spec, problem, device)
    rotation = bench.rotation()
    inputs = rotation[0]
    row: dict = {"problem": problem.key}
    ref = spec.reference(inputs)
    for mode in modes:
        with kernels.dispatch_mode(mode):
            out = public(*inputs)
        verdict = check_outputs(out, ref, problem.dtype, largest_k(problem.shapes))
        if not verdict.ok:
            raise AssertionError(f"{problem.key} {mode}: {verdict.reason}")
        choice = kernels.explain(problem.kernel, problem, device, mode)
        ours_call = torch_call if control else public
        extra: dict = {}
        if mode == "eager":
            # The figure at the host's nominal speed (what the tuner stores), and over every turn as
            # this run's host gave it (timing.eager_side_by_side).
            reading = timing.eager_side_by_side(
                [lambda x: torch_call(*x), lambda x: ours_call(*x)], rotation, EAGER_MS * rounds,
                settle_s=settle_s)
            theirs, ours = reading.nominal_ms
            extra = dict(as_run_speedup=reading.all_ms[0] / reading.all_ms[1],
                         nominal_turns=reading.nominal_turns, turns=reading.turns, waited_s=reading.waited_s)
        else:
            theirs, ours = timing.graph_ms_side_by_side(
                [lambda: torch_call(*inputs), lambda: ours_call(*inputs)],
                (GRAPH_BUDGET[0], GRAPH_BUDGET[1] * rounds))
        row[mode] = dict(ours_ms=ours, cublas_ms=theirs, speedup=theirs / ours,
                         config=str(choice.config), source=choice.source, **extra)
    bench.release()
    return row


def confirm(rows: list[dict], problems: list[Problem], device: kernels.DeviceInfo, modes: list[str],
            args: argparse.Namespace) -> None:
    """Each row under ``args.confirm`` in a mode, measured again in that mode with 3x the rounds: the
    second figure goes beside the first as ``confirmed``. The A/A run (--control) spreads 1.1% per
    problem with tails to 0.93x (H100, 2026-11-25), so a single reading under 0.97x among 400 problems
    says little. The geomean and the first counts stay those of the first pass (measuring the low rows
    alone again would bias them upward); the second pass says which losses are real."""
    for row, problem in zip(rows, problems):
        for mode in modes:
            if row[mode]["speedup"] < args.confirm:
                again = measure(problem, device, [mode], 3 * args.rounds, args.control, args.settle_s)[mode]
                row[mode]["confirmed"] = again["speedup"]


class Stopped(Exception):
    """SIGTERM (``timeout``, a device tool's time limit) reached the measuring loop."""


def _raise_stopped(signum: int, frame: object) -> None:
    raise Stopped(signal.Signals(signum).name)


def measure_passes(problems: list[Problem], measure_one: Callable[[Problem], dict], passes: int,
                   report: Callable[[int, int, Problem, dict], None] = lambda *_: None,
                   pause_s: float = STAMP_PAUSE_S) -> tuple[list[list[dict]], str | None]:
    """Every problem measured ``passes`` times (``pause_s`` apart), the rows of each pass, and what stopped the
    run early (the signal's name), or None. A SIGTERM ends the loop between or inside problems and keeps every
    row finished by then: a run that its time limit stops still reports what it measured (a GPU session's
    call ends at a hard limit, and the host's slow phases make a run's length hard to foresee)."""
    previous = signal.signal(signal.SIGTERM, _raise_stopped)
    measured: list[list[dict]] = []
    try:
        for pass_ in range(passes):
            if pass_:
                time.sleep(pause_s)  # as far apart as a stamp's passes
            measured.append([])
            for index, problem in enumerate(problems, 1):
                row = measure_one(problem)
                measured[-1].append(row)
                report(pass_, index, problem, row)
    except Stopped as exc:
        return measured, str(exc)
    finally:
        signal.signal(signal.SIGTERM, previous)
    return measured, None


def median_pass(readings: list[dict], modes: list[str]) -> dict:
    """One problem's row from its row of each pass: per mode, the pass of median speed-up (the lower
    middle of an even count), with every pass's speed-up beside it as ``passes``."""
    row = dict(readings[0])
    for mode in modes:
        speedups = [reading[mode]["speedup"] for reading in readings]
        row[mode] = dict(readings[timing.median_pass(speedups)][mode], passes=speedups)
    return row


HOST_BOUND_MS = timing.HOST_PACED_MS  # torch.matmul under this a call (eager): the host may set the pace


def drift_by_kind(rows: list[dict], mode: str) -> dict[str, dict]:
    """Measured/stored speed-up per kind of record: host-bound or GPU-bound (torch.matmul's time here
    against HOST_BOUND_MS; in graph mode every call is GPU-bound), cuBLAS or Triton. Where the GPU bounds
    the call the stored figure should hold within 3%; where the host does, it moves with the host's speed
    (docs/BENCHMARKS.md, 2026-11-25)."""
    kinds: dict[str, list[float]] = {}
    for row in rows:
        side = row[mode]
        if "stored_speedup" not in side:
            continue
        bound = "host" if mode == "eager" and side["cublas_ms"] < HOST_BOUND_MS else "gpu"
        picked = "cublas" if "VARIANT: cublas" in side["config"] else "triton"
        kinds.setdefault(f"{bound}-bound {picked}", []).append(side["speedup"] / side["stored_speedup"])
    return {kind: dict(count=len(drift), within_3pct=sum(abs(d - 1) <= 0.03 for d in drift))
            for kind, drift in sorted(kinds.items())}


def corpus_parts(kernel: str, qkv: bool) -> dict[str, str]:
    """Problem key -> "tuned" or "held_out", for the corpus problems --corpus all measures."""
    from tuner import corpus

    entries = corpus.qkv_entries("all") if qkv else corpus.gated_entries("all") if kernel == "gated_matmul" else \
        corpus.bias_entries("all") if kernel == "matmul_bias" else corpus.entries("all")
    return {entry.problem.key: entry.part for entry in entries}


def by_part(rows: list[dict], mode: str, parts: dict[str, str]) -> dict[str, dict]:
    """Per corpus part: how many problems, their geomean speed-up, how many under 0.97x, the worst."""
    summary = {}
    for part in ("tuned", "held_out"):
        mine = [row for row in rows if parts.get(row["problem"]) == part]
        if mine:
            worst = min(mine, key=lambda row: row[mode]["speedup"])
            summary[part] = dict(problems=len(mine), geomean=geomean([row[mode]["speedup"] for row in mine]),
                                 under_097=sum(row[mode]["speedup"] < 0.97 for row in mine),
                                 worst=(worst["problem"], worst[mode]["speedup"]))
    return summary


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--key", action="append", help="a problem key, e.g. bf16:nt:8x4096x4096 (repeatable)")
    parser.add_argument("--keys", help="a file of problem keys, one per line")
    parser.add_argument("--corpus", help="a part of the model corpus: tuned, held_out or all; or unseen, models "
                                         "outside it that no table holds (tuner/corpus.py)")
    parser.add_argument("--qkv", action="store_true",
                        help="with --corpus: the models' query/key/value projections stacked (kernels.patch runs them so)")
    parser.add_argument("--kernel", default="matmul", choices=tuple(CALLS),
                        help="matmul (against torch.matmul), matmul_bias (against torch.addmm; --corpus: the "
                             "biased query/key/value projections, stacked) or gated_matmul (against a torch MLP's "
                             "gate and up Linears, silu and the product; --corpus: the SiLU-gated MLPs)")
    parser.add_argument("--dtype", action="append", help="only these dtypes")
    parser.add_argument("--limit", type=int, default=0)
    parser.add_argument("--db", default=None, help="the database dispatch reads (default: TUNER_DB or the default file)")
    parser.add_argument("--no-shipped", action="store_true", help="leave the shipped tables out")
    parser.add_argument("--modes", default="eager,graph")
    parser.add_argument("--rounds", type=int, default=3, help="time per problem per side: rounds x 20 ms (eager), rounds x the graph budget")
    parser.add_argument("--stored", action="store_true", help="compare with each problem's stored speed-up")
    parser.add_argument("--stored-table", default=None, help="... as stored in this export (a shipped table)")
    parser.add_argument("--every", type=int, default=1, help="every N-th problem only (a sample)")
    parser.add_argument("--graph-budget", default="25,100", help="do_bench warm-up,rep ms of the graph timing")
    parser.add_argument("--confirm", type=float, default=0.0,
                        help="measure each problem under this speed-up again, with 3x the rounds, and report both")
    parser.add_argument("--control", action="store_true",
                        help="time torch.matmul against itself (A/A): the method's own spread on this host")
    parser.add_argument("--passes", type=int, default=1,
                        help="time the whole list this many times, 2 s apart; each problem keeps its median pass")
    parser.add_argument("--settle-s", type=float, default=timing.HOST_SETTLE_S,
                        help="eager: wait up to this long for the host's nominal speed before and while timing, as "
                             "a stamp does (0: time in whatever phase the host is)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if args.settle_s < 0:
        parser.error(f"--settle-s {args.settle_s}: give the seconds a timing may wait for the host, 0 or more")
    if args.kernel == "gated_matmul" and (args.stored or args.stored_table):
        parser.error("--stored with --kernel gated_matmul: a gated record's speed-up is against one cuBLAS GEMM and "
                     "the gating pass, and this script times a torch MLP's two Linears; compare the stored figures "
                     "with `python -m tuner stamp --kernel gated_matmul --dry-run` instead")
    modes = args.modes.split(",")
    kernels.use_database(args.db, use_shipped=not args.no_shipped)
    device = kernels.current_device()
    problems = problems_of(args)
    print(f"# {device.name}, torch {torch.__version__}, triton {triton.__version__}, {time.strftime('%Y-%m-%d')}, "
          f"{len(problems)} problems, db {args.db}, shipped {'off' if args.no_shipped else 'on'}, "
          f"{args.rounds} rounds, {args.passes} pass(es), eager waits up to {args.settle_s:g} s for the host"
          + (", CONTROL: torch.matmul against itself" if args.control else ""), flush=True)
    # What a process gets once the C++ path of cuBLAS plans is built (kernels/_native.py): wait for it
    # here, so that the figures do not depend on how far a background build got.
    print(f"# C++ path of cuBLAS plans: {kernels._native.start(block=True)}", flush=True)
    if "eager" in modes and args.settle_s > 0:
        print(f"# {timing.learn_host()}", flush=True)
    global GRAPH_BUDGET
    GRAPH_BUDGET = tuple(int(x) for x in args.graph_budget.split(","))
    stored = {}
    if args.stored_table:
        from db import load_document

        stored = {(r.problem_key, r.mode): r for r in load_document(args.stored_table)
                  if r.device_name == device.name and r.kernel == args.kernel}
    elif args.stored:
        with Store(args.db, create=False) as store:
            stored = {(r.problem_key, r.mode): r for r in store.records(device=device.name, kernel=args.kernel)}
    if args.passes < 1:
        parser.error(f"--passes {args.passes}: give 1 or more")
    started = time.monotonic()

    def report(pass_: int, index: int, problem: Problem, row: dict) -> None:
        text = "  ".join(f"{m} {row[m]['speedup']:.3f}x ({row[m]['source'][:24]})" for m in modes)
        print(f"[{pass_ + 1}: {index}/{len(problems)}] {problem.key:28} {text}", flush=True)

    passes, stopped = measure_passes(
        problems, lambda problem: measure(problem, device, modes, args.rounds, args.control, args.settle_s),
        args.passes, report)
    rows = [median_pass(list(readings), modes) for readings in zip(*passes)]  # the problems every pass finished
    if stopped:
        print(f"# stopped by {stopped} after {len(rows)} of {len(problems)} problems: every figure below is over "
              f"those {len(rows)}, none measured again", flush=True)
        if not rows:
            return 128 + signal.SIGTERM
    for row in rows:
        for mode in modes:
            record = stored.get((row["problem"], mode))
            if record is not None and record.speedup:
                row[mode]["stored_speedup"] = record.speedup
    if args.confirm and not stopped:
        confirm(rows, problems, device, modes, args)
    summary = {}
    for mode in modes:
        ratios = [row[mode]["speedup"] for row in rows]
        worst = sorted(rows, key=lambda row: row[mode]["speedup"])[:5]
        summary[mode] = dict(geomean=geomean(ratios), under_097=sum(r < 0.97 for r in ratios),
                             under_098=sum(r < 0.98 for r in ratios), problems=len(ratios),
                             worst=[(row["problem"], row[mode]["speedup"], row[mode]["source"]) for row in worst])
        drift = [row[mode]["speedup"] / row[mode]["stored_speedup"] for row in rows if "stored_speedup" in row[mode]]
        if drift:
            summary[mode]["stored_vs_measured"] = dict(count=len(drift), within_3pct=sum(abs(d - 1) <= 0.03 for d in drift),
                                                       worst=min(drift, key=lambda d: -abs(d - 1)),
                                                       by_kind=drift_by_kind(rows, mode))
        print(f"{mode}: geomean {summary[mode]['geomean']:.3f}x cuBLAS over {len(ratios)}, "
              f"{summary[mode]['under_097']} under 0.97x; worst: "
              + ", ".join(f"{p} {s:.2f}x" for p, s, _ in summary[mode]["worst"][:3]))
        if args.corpus == "all":  # both parts measured: each reported on its own, as the issue asks
            summary[mode]["by_part"] = by_part(rows, mode, corpus_parts(args.kernel, args.qkv))
            for part, figures in summary[mode]["by_part"].items():
                print(f"  {part} part: geomean {figures['geomean']:.3f}x over {figures['problems']}, "
                      f"{figures['under_097']} under 0.97x; worst {figures['worst'][0]} {figures['worst'][1]:.3f}x")
        if args.confirm and not stopped:
            again = [row[mode]["confirmed"] for row in rows if "confirmed" in row[mode]]
            summary[mode]["confirmed"] = dict(measured_again=len(again), still_under_097=sum(r < 0.97 for r in again),
                                              still_under_098=sum(r < 0.98 for r in again))
            print(f"  under {args.confirm:.2f}x measured again (3x the rounds): {summary[mode]['confirmed']}; "
                  + ", ".join(f"{row['problem']} {row[mode]['speedup']:.3f}->{row[mode]['confirmed']:.3f}x"
                              for row in rows if "confirmed" in row[mode]))
        if drift:
            print(f"  measured/stored speed-up: {summary[mode]['stored_vs_measured']}")
        as_run = [row[mode]["as_run_speedup"] for row in rows if "as_run_speedup" in row[mode]]
        if as_run:
            # Every turn counted, slow-host bursts included: beside the nominal figures, not instead of them.
            as_run_drift = [row[mode]["as_run_speedup"] / row[mode]["stored_speedup"] for row in rows
                            if "stored_speedup" in row[mode]]
            summary[mode]["as_run"] = dict(geomean=geomean(as_run), under_097=sum(r < 0.97 for r in as_run),
                                           within_3pct_of_stored=sum(abs(d - 1) <= 0.03 for d in as_run_drift),
                                           turns_nominal=sum(row[mode]["nominal_turns"] for row in rows),
                                           turns=sum(row[mode]["turns"] for row in rows),
                                           waited_s=round(sum(row[mode]["waited_s"] for row in rows), 1))
            print(f"  as run (every turn, host bursts included): {summary[mode]['as_run']}")
    print(f"# {time.monotonic() - started:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(dict(device=device.name, torch=torch.__version__,
                                                   triton=triton.__version__, date=time.strftime("%Y-%m-%d"),
                                                   argv=sys.argv, stopped=stopped, summary=summary,
                                                   rows=rows), indent=1))
    return 128 + signal.SIGTERM if stopped else 0  # a stopped run says so in its status too


if __name__ == "__main__":
    sys.exit(main())
