"""Decide a shipped table's winners again by the side-by-side contest, on the GPU, into a database.

Tables whose contests timed their sides seconds apart (before 2026-11-24's side-by-side timing,
tuner/timing.py) store speed-ups that a fresh process does not see again, most of all in eager mode.
For each matmul problem of the table on this GPU, its records' winners and best Triton configs meet
cuBLAS again, per mode (tuner.quick.redecide), and the new records go into --db (resumable: problems
already there are skipped). Merge them into the table with scripts/ship_table.py.

    PYTHONPATH=. python3 scripts/redecide.py --table kernels/tables/h100.json --db sqlite:///re.db --every 5

Each eager Triton winner must win three contests in all (tuner.search.confirm_eager), as in a search.
``--eager-only`` stores the eager records alone: for a change to what an eager call costs (a cheaper host
path for some variant), where the graph winners stand. Merge those with scripts/ship_table.py --base TABLE.

``--add-variant NAME`` adds the kernel's seed configs of that variant to each problem's candidates, so that a
new variant meets the stored winners and cuBLAS in the same contest; ``--rows M`` keeps the problems with M rows:

    PYTHONPATH=. python3 scripts/redecide.py --table kernels/tables/h100.json --db sqlite:///gemv.db \
        --rows 1 --add-variant gemv

Merge those with scripts/ship_table.py --base TABLE, without --same-winners (winners change).

``--fast-host-only`` runs no contest of Triton configs: each eager record whose winner is a Triton config is
checked against cuBLAS back to back on the GPU (tuner.search.holds_on_a_fast_host, the rule since
2026-11-25), and where it fails, a cuBLAS eager record goes into --db (tuner.quick.recheck_eager). Merge
those with scripts/ship_table.py --base TABLE, without --same-winners (every one of them changes a winner).
A rerun skips the problems already replaced in --db.

``--recontest`` (with ``--fast-host-only``): a winner that holds meets our cuBLAS path in an eager contest
again, and its record goes into --db whoever wins (the winner with its time now, or cuBLAS where it no
longer beats that path by WIN_MARGIN): eager wins stored on a slower host than today's are tried again.
``--passes N`` contests the winners that held N times in all, ``--pause-s`` apart: one contest meets one
phase of the host (on the H100 and H200 boxes torch.matmul's host time moves by 1.5x from second to
second), and a win must hold in every pass. A pass can only demote. A rerun on the same --db skips the
first pass for the problems decided there and runs the later passes again, over the winners that held:
more contests, never fewer.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import torch
import triton

import kernels
from db import Record, Store, dump_document, load_document
from kernels import MATMUL, MODES, Config, Problem
from tuner.bench import Bench, SideBySide
from tuner.quick import QUICK_CONTEST_EAGER_MS, QUICK_GRAPH_MS, recheck_eager, redecide
from tuner.search import at_par_when_gpu_bound


def candidates_by_problem(table: str, device_name: str) -> dict[str, list[Config]]:
    found: dict[str, list[Config]] = {}
    for record in load_document(Path(table)):
        if record.device_name != device_name or record.kernel != "matmul":
            continue
        configs = found.setdefault(record.problem_key, [])
        for values in (record.config, record.triton_config):
            if values and values.get("VARIANT") != "cublas":
                configs.append(Config.from_dict(values))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", required=True)
    parser.add_argument("--db", required=True, help="where the new records go (created if missing)")
    parser.add_argument("--every", type=int, default=1, help="every N-th problem only (a sample)")
    parser.add_argument("--budget-s", type=float, default=480.0, help="stop after this many seconds")
    parser.add_argument("--key", action="append", help="only these problems (repeatable)")
    parser.add_argument("--rows", type=int, help="only the problems with this many rows (M)")
    parser.add_argument("--add-variant", help="add the kernel's seed configs of this variant to the candidates")
    parser.add_argument("-o", "--output", help="also export the new records to this JSON file")
    parser.add_argument("--fast-host-only", action="store_true",
                        help="only check eager Triton winners back to back on the GPU (no contest of other configs)")
    parser.add_argument("--recontest", action="store_true",
                        help="with --fast-host-only: winners that hold meet cuBLAS in an eager contest again")
    parser.add_argument("--passes", type=int, default=1,
                        help="with --recontest: contest the winners that held again, this many passes in all")
    parser.add_argument("--pause-s", type=float, default=5.0, help="seconds between passes")
    parser.add_argument("--eager-only", action="store_true",
                        help="store only the eager records (the graph contest still decides the winner held beside)")
    args = parser.parse_args()
    if args.eager_only and args.fast_host_only:
        parser.error("--eager-only goes with the full redecision (--fast-host-only writes eager records alone anyway)")
    if args.recontest and not args.fast_host_only:
        parser.error("--recontest goes with --fast-host-only (a full redecision runs every contest anyway)")
    if args.passes < 1:
        parser.error(f"--passes {args.passes}: give 1 or more (contests of each winner that holds)")
    if args.add_variant and args.add_variant not in kernels.gemm.VARIANTS:
        parser.error(f"--add-variant {args.add_variant}: not a matmul variant; choose one of "
                     f"{', '.join(kernels.gemm.VARIANTS)}")
    if args.fast_host_only and (args.add_variant or args.rows):
        parser.error("--add-variant and --rows go with the full redecision, not --fast-host-only")
    if args.passes > 1 and not args.recontest:
        parser.error("--passes goes with --recontest (without it a pass writes only demotions: nothing to pass on)")
    if args.fast_host_only:
        recheck_table(args)
        return
    logging.basicConfig(level=logging.INFO, format="  %(message)s")
    device = kernels.current_device()
    problems = sorted(candidates_by_problem(args.table, device.name).items())[:: args.every]
    if args.key:
        problems = [(key, configs) for key, configs in problems if key in args.key]
    if args.rows is not None:
        problems = [(key, configs) for key, configs in problems
                    if Problem.from_key("matmul", key).shape[0] == args.rows]
    print(f"# {device.name}, torch {torch.__version__}, triton {triton.__version__}, {time.strftime('%Y-%m-%d')}, "
          f"{len(problems)} problems of {args.table}", flush=True)
    started = time.monotonic()
    with Store(args.db) as store:
        for index, (key, configs) in enumerate(problems, 1):
            stored_modes = (kernels.EAGER,) if args.eager_only else MODES
            if all(store.get(device.name, "matmul", key, mode) for mode in stored_modes):
                continue
            if time.monotonic() - started > args.budget_s:
                print(f"# budget spent after {index - 1} problems; run again to go on", flush=True)
                break
            problem = Problem.from_key("matmul", key)
            if args.add_variant:
                configs = configs + [c for c in MATMUL.seeds(problem, device) if c["VARIANT"] == args.add_variant]
            bench = Bench(MATMUL, problem, device, side_by_side=SideBySide(QUICK_GRAPH_MS, QUICK_CONTEST_EAGER_MS))
            records = redecide(MATMUL, problem, device, configs, bench)
            store.put_many([records[mode] for mode in stored_modes], on_conflict="replace")
            print(f"[{index}/{len(problems)}] {key:28} " + "  ".join(
                f"{mode} {records[mode].speedup:.3f}x {records[mode].config.get('VARIANT', 'tiled')}" for mode in MODES),
                flush=True)
        if args.output:
            Path(args.output).write_text(json.dumps(dump_document(store.records(device=device.name, kernel="matmul")), indent=1))
    kernels.clear_cache()
    print(f"# {time.monotonic() - started:.0f} s")


def recheck_table(args: argparse.Namespace) -> None:
    device = kernels.current_device()
    stored = {(r.problem_key, r.mode): r for r in load_document(Path(args.table))
              if r.device_name == device.name and r.kernel == "matmul"}
    keys = sorted(key for key, mode in stored if mode == kernels.EAGER
                  and not kernels.is_baseline(Config.from_dict(stored[key, mode].config)))
    keys = [key for key in keys if not args.key or key in args.key][:: args.every]
    print(f"# {device.name}, torch {torch.__version__}, triton {triton.__version__}, {time.strftime('%Y-%m-%d')}, "
          f"{len(keys)} eager Triton winners of {args.table}, checked back to back"
          + (f", then in an eager contest ({args.passes} passes)" if args.recontest else ""), flush=True)
    started, replaced, failed = time.monotonic(), 0, 0
    with Store(args.db) as store:
        for pass_ in range(args.passes):
            if pass_:
                if time.monotonic() - started > args.budget_s:
                    print(f"# budget spent before pass {pass_ + 1}; run again to go on", flush=True)
                    break
                time.sleep(args.pause_s)  # another moment, maybe another phase of the host
            for index, key in enumerate(keys, 1):
                current = store.get(device.name, "matmul", key, kernels.EAGER)
                if current is not None and (pass_ == 0 or kernels.is_baseline(Config.from_dict(current.config))):
                    continue  # decided by an earlier run, or cuBLAS already: nothing a later pass could change
                if current is None and pass_ > 0:
                    continue  # not checked in the first pass (budget, an error)
                if time.monotonic() - started > args.budget_s:
                    print(f"# budget spent in pass {pass_ + 1} at problem {index} of {len(keys)}; run again to go on",
                          flush=True)
                    break
                outcome = _recheck_one(store, device, key, current or stored[key, kernels.EAGER],
                                       stored.get((key, kernels.GRAPH)), stored[key, kernels.EAGER].speedup,
                                       args.recontest)
                replaced += outcome.startswith("cuBLAS")
                failed += outcome.startswith("not checked")
                print(f"[{pass_ + 1}: {index}/{len(keys)}] {key:28} {outcome}", flush=True)
            else:
                continue
            break  # the budget ended this pass
        if args.output:
            records = store.records(device=device.name, kernel="matmul")
            Path(args.output).write_text(json.dumps(dump_document(records), indent=1))
    kernels.clear_cache()
    print(f"# {replaced} of {len(keys)} replaced by cuBLAS, {failed} not checked; {time.monotonic() - started:.0f} s")


def _recheck_one(store: Store, device: kernels.DeviceInfo, key: str, eager: Record, graph: Record | None, was: float,
                 recontest: bool) -> str:
    """Check one eager winner (tuner.quick.recheck_eager); its new record, if any, goes into ``store``.
    Returns what happened, for the log."""
    problem = Problem.from_key("matmul", key)
    try:
        record = recheck_eager(MATMUL, problem, device, eager,
                               Config.from_dict(graph.config) if graph is not None else None, recontest=recontest)
    except Exception as error:  # one problem's failure (out of memory in a capture) ends only its check
        return f"not checked: {type(error).__name__}: {error}"
    if record is None:
        return "holds"
    record = at_par_when_gpu_bound(record, graph.cublas_ms if graph is not None else None)
    store.put_many([record], on_conflict="replace")
    if kernels.is_baseline(Config.from_dict(record.config)):
        return f"cuBLAS now: {record.speedup:.3f}x (was {was:.3f}x)"
    return f"holds, {record.speedup:.3f}x now (was {was:.3f}x)"


if __name__ == "__main__":
    main()
