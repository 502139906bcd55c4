"""Write a shipped table (kernels/tables/<alias>.json): a device's records from tuning databases,
newest database last (it wins), as one export document (db.io, schema_version 2).

    PYTHONPATH=. python3 scripts/ship_table.py --device h100 --db sqlite:///corpus.db \
        --base kernels/tables/h100.json -o kernels/tables/h100.json

``--base`` keeps an earlier table's records (the public suite's) unless a database has the same
problem and mode; ``--only corpus-part`` keeps only problems of that corpus part from the databases
(matmul's, the stacked query/key/value projections', gated_matmul's and the biased q/k/v's matmul_bias
ones: tuner.corpus.corpus_problems).
``--same-winners`` (with ``--base``): a problem's database records replace the base's only where every
mode names the same winner in both, so that a re-decision (scripts/redecide.py) refreshes the stored
times without flipping winners on a contest's noise (host-bound eager contests moved 10-20% between
processes on one H100 box, docs/BENCHMARKS.md, 2026-11-25).
``--settle-gpu-bound``: every eager cuBLAS record of a GPU-bound call (torch.matmul at 50 us or more in the
problem's graph record; base and databases) stores torch.matmul's eager time, as the tuner does since
2026-11-26 (tuner.search.at_par_when_gpu_bound):

    PYTHONPATH=. python3 scripts/ship_table.py --device h100 --base kernels/tables/h100.json --settle-gpu-bound \
        -o kernels/tables/h100.json

``--stamp`` (on that GPU): every eager record of the device is timed again as the user's call runs, in
``--stamp-passes`` passes, and stores its median pass (tuner.stamp; winners unchanged), so that the
table's eager speed-ups are what a user's process measures. A Triton winner slower than torch.matmul
now gives its place to cuBLAS (timed the same way).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from db import Record, Store, dump_document, load_document
from db.io import _write_atomically


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", required=True)
    parser.add_argument("--db", action="append", default=[])
    parser.add_argument("--base", default=None)
    # Not "unseen": those models stay out of every shipped table, so that they keep measuring shapes nobody tuned.
    parser.add_argument("--only", default=None, choices=("tuned", "held_out", "all"),
                        help="tuned, held_out or all: corpus problems only")
    parser.add_argument("--same-winners", action="store_true",
                        help="replace a base problem's records only where the databases name the same winners")
    parser.add_argument("--settle-gpu-bound", action="store_true",
                        help="eager cuBLAS records of GPU-bound calls store torch.matmul's time (1.00x)")
    parser.add_argument("--stamp", action="store_true",
                        help="time the device's eager records again on this GPU and store their median pass")
    parser.add_argument("--stamp-passes", type=int, default=3, help="with --stamp: passes over the records")
    parser.add_argument("-o", "--output", required=True)
    args = parser.parse_args()
    if args.stamp_passes < 1:
        parser.error(f"--stamp-passes {args.stamp_passes}: give 1 or more")
    if not args.db and not args.base:
        parser.error("nothing to write: pass --db (a tuning database) or --base (a table), or both")
    if args.same_winners and not args.base:
        parser.error("--same-winners keeps the base's winners: pass --base too")
    records = {}
    if args.base:
        for record in load_document(args.base):
            records[record.key] = record
    keep = None
    if args.only:
        from tuner import corpus

        # (kernel, problem key): a gated MLP's key can read like a matmul key of another part
        keep = {(kernel, p.key) for kernel in ("matmul", "gated_matmul", "matmul_bias")
                for p in corpus.corpus_problems(args.only, kernel)}
        keep |= {("matmul", p.key) for p in corpus.corpus_problems(args.only, "matmul", qkv=True)}
    found: dict[tuple, Record] = {}
    for url in args.db:
        with Store(url, create=False) as store:
            for record in store.records(device=args.device):
                if keep is None or (record.kernel, record.problem_key) in keep:
                    found[record.key] = record
    kept = _other_winners(records, found) if args.same_winners else set()
    records.update((key, record) for key, record in found.items() if key[:3] not in kept)
    if args.settle_gpu_bound:
        records = _settled(records)
    if args.stamp:
        records = _stamped(records, args.device, args.stamp_passes)
    _write_atomically(Path(args.output), json.dumps(dump_document(list(records.values())), indent=1) + "\n")
    print(f"wrote {len(records)} records to {args.output}"
          + (f"; kept the base's records of {len(kept)} problems whose winners differ" if args.same_winners else ""))


def _settled(records: dict[tuple, Record]) -> dict[tuple, Record]:
    """``records`` with every eager cuBLAS record of a GPU-bound call at par (tuner.search.at_par_when_gpu_bound),
    judged by torch.matmul's time in the same problem's graph record (none: left as it is)."""
    from tuner.search import at_par_when_gpu_bound

    graph_ms = {record.key[:3]: record.cublas_ms for record in records.values() if record.mode == "graph"}
    return {key: at_par_when_gpu_bound(record, graph_ms.get(key[:3])) for key, record in records.items()}


def _stamped(records: dict[tuple, Record], device_alias: str, passes: int) -> dict[tuple, Record]:
    """``records`` with the eager ones of this GPU timed again (tuner.stamp.stamp_eager), which must be
    the table's device."""
    import kernels
    from tuner.stamp import stamp_eager, stampable, summary

    device = kernels.current_device()
    if device_alias not in (device.alias, device.name):
        raise SystemExit(f"--stamp times on this GPU, {device.name} ({device.alias}), not on {device_alias}: "
                         "run it on the table's GPU, or leave --stamp out")
    count = sum(r.device_name == device.name and stampable(r) is None for r in records.values())

    def progress(pass_: int, index: int, stamp, note: str) -> None:
        if stamp is not None and pass_ == passes:
            print(f"[{index}/{count}] {stamp.record.problem_key:28} {stamp.was or 0:.3f}x -> {stamp.speedup:.3f}x "
                  + " ".join(f"{s:.3f}" for s in stamp.passes), flush=True)
        elif note:
            print(f"[pass {pass_}] {note}", flush=True)

    stamps = stamp_eager(list(records.values()), device, passes=passes, progress=progress)
    print(summary(stamps))
    return {**records, **{s.record.key: s.record for s in stamps}}


def _other_winners(base: dict[tuple, Record], found: dict[tuple, Record]) -> set[tuple]:
    """(device, kernel, problem) of every problem in both whose winner differs in some mode."""
    return {key[:3] for key, record in found.items() if key in base and base[key].config != record.config}


if __name__ == "__main__":
    main()
