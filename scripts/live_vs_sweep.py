"""How good is a live search's winner? Look it up in the committed sweep of the same problem.

For every record in the databases whose kernel, problem and device match a sweep, prints the best Triton
config the search found, its time in the sweep, and that as a share of the sweep's best throughput
(the yardstick of issue 4: 98% within 25 trials). Runs anywhere: it reads files only.

    python scripts/live_vs_sweep.py --db sqlite:///live-moe-0.db --db sqlite:///live-moe-1.db \
        --sweeps 'benchmarks/sweeps/*.json'
"""

from __future__ import annotations

import argparse
import glob
import sys

from db import Store
from kernels import Config
from replay import load_sweep  # scripts/ is this script's folder, so on its path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", action="append", required=True, help="SQLAlchemy URL (repeatable)")
    parser.add_argument("--sweeps", default="benchmarks/sweeps/*.json", help="glob of sweep files")
    args = parser.parse_args(argv)
    # A subspace sweep (one variant) cannot judge a winner of another variant; full sweeps come first.
    sweeps = {}
    for sweep in sorted((load_sweep(path) for path in glob.glob(args.sweeps)), key=lambda s: s.variant is None):
        sweeps[(sweep.spec.name, sweep.problem.key, sweep.device.name)] = sweep
    print("| database | problem | winner (best Triton) | search ms | sweep ms | sweep best ms | share of best |")
    print("|---|---|---|---:|---:|---:|---:|")
    for url in args.db:
        with Store(url) as store:
            for record in store.records():
                sweep = sweeps.get((record.kernel, record.problem_key, record.device_name))
                if sweep is None or not record.triton_config:
                    continue
                config = sweep.spec.space.canonical(Config.from_dict(record.triton_config), sweep.problem)
                best = sweep.best[1]
                found = sweep.results.get(config)
                swept = found.time_ms if found is not None and found.ok else None
                share = f"{best / swept:.1%}" if swept else "not in the sweep"
                print(f"| {url.rsplit('/', 1)[-1]} | {record.problem_key[:40]} | {config} | {record.triton_ms:.4f} | "
                      f"{swept if swept is None else f'{swept:.4f}'} | {best:.4f} | {share} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
