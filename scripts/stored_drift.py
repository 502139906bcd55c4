"""Which side moved: a fresh process's speed-ups (scripts/bench_dispatch.py --json) against a table's stored ones.

A stored eager speed-up is torch.matmul's time over ours, both stamped in one process. Read again in another, it
can move because our call's time moved, or because torch's did while ours held: torch's host-bound call moves
with the host's speed (docs/BENCHMARKS.md, 2026-11-27). The bench reports only the ratio; this splits
each record outside 3% by which of its two times moved. It times nothing and needs no GPU.

    python3 scripts/stored_drift.py ROWS.json --table kernels/tables/h100.json [--mode eager] [--kernel matmul]

ROWS.json is a bench_dispatch.py --json output; --table an export (a shipped table, or `python -m tuner export`).
To compare with a table as it stood at a commit: `git show REV:kernels/tables/h100.json > /tmp/table.json`.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from db import ImportValidationError, Record, load_document  # noqa: E402 (the repository root first)

WITHIN = 0.03  # the bound: stored against measured within 3%

HELD = "held"  # the speed-up within 3%
TORCH_MOVED = "torch moved"  # the speed-up outside, our call's own time within 3% of its stored time
OURS_MOVED = "ours moved"  # our call's own time outside 3% of its stored time


@dataclass(frozen=True)
class Drift:
    problem: str
    config: str  # the stored winner's variant ("cublas", "gemv", ...)
    speedup: float  # measured speed-up / stored
    ours: float  # our call's measured time / its stored time
    torch: float  # torch's measured time / its stored time

    @property
    def verdict(self) -> str:
        if abs(self.speedup - 1) <= WITHIN:
            return HELD
        return TORCH_MOVED if abs(self.ours - 1) <= WITHIN else OURS_MOVED


def drifts(rows: list[dict], records: list[Record], mode: str, kernel: str, device: str) -> list[Drift]:
    """One Drift per measured row of ``mode`` that the table has a timed record of (same GPU, kernel, problem)."""
    stored = {r.problem_key: r for r in records
              if r.mode == mode and r.kernel == kernel and r.device_name == device}
    found = []
    for row in rows:
        side, record = row.get(mode), stored.get(row.get("problem"))
        if not side or record is None or not record.cublas_ms or record.time_ms <= 0:
            continue
        found.append(Drift(problem=row["problem"], config=str(record.config.get("VARIANT", "?")),
                           speedup=side["speedup"] / record.speedup, ours=side["ours_ms"] / record.time_ms,
                           torch=side["cublas_ms"] / record.cublas_ms))
    return found


def summary(found: list[Drift]) -> dict[str, int]:
    counts = {HELD: 0, TORCH_MOVED: 0, OURS_MOVED: 0}
    for drift in found:
        counts[drift.verdict] += 1
    return dict(records=len(found), **counts,
                ours_within=sum(abs(d.ours - 1) <= WITHIN for d in found),
                torch_within=sum(abs(d.torch - 1) <= WITHIN for d in found))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("rows", help="a scripts/bench_dispatch.py --json output")
    parser.add_argument("--table", required=True, help="the export whose stored records the rows are held against")
    parser.add_argument("--mode", default="eager", choices=("eager", "graph"))
    parser.add_argument("--kernel", default="matmul")
    args = parser.parse_args(argv)
    try:
        bench = json.loads(Path(args.rows).read_text())
        rows, device = bench["rows"], bench["device"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        parser.error(f"{args.rows}: not a scripts/bench_dispatch.py --json output ({exc}); give the file its --json wrote")
    try:
        records = load_document(args.table)
    except (OSError, ImportValidationError) as exc:
        parser.error(f"--table {args.table}: {exc}")
    found = drifts(rows, records, args.mode, args.kernel, device)
    if not found:
        parser.error(f"no {args.mode} {args.kernel} row of {args.rows} has a timed record of {device} in {args.table}: "
                     "check --mode, --kernel and that the table is this GPU's")
    print(f"# {args.rows} against {args.table}: {device}, {args.kernel}, {args.mode}")
    print(f"{'problem':28} {'stored':8} {'speed-up':>9} {'ours':>7} {'torch':>7}  measured/stored")
    for drift in sorted(found, key=lambda d: (d.verdict, d.problem)):
        if drift.verdict != HELD:
            print(f"{drift.problem:28} {drift.config:8} {drift.speedup:9.3f} {drift.ours:7.3f} {drift.torch:7.3f}  "
                  f"{drift.verdict}")
    print(f"summary: {summary(found)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
