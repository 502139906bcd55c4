"""Write a shipped table (kernels/tables/<alias>.json): a device's records from tuning databases,
newest database last (it wins), as one export document (db.io, schema_version 2).

    PYTHONPATH=. python3 scripts/ship_table.py --device h100 --db sqlite:///corpus.db \
        --base kernels/tables/h100.json -o kernels/tables/h100.json

``--base`` keeps an earlier table's records (the public suite's) unless a database has the same
problem and mode; ``--only corpus-part`` keeps only problems of that corpus part from the databases.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from db import Store, dump_document, load_document
from db.io import _write_atomically


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", required=True)
    parser.add_argument("--db", action="append", required=True)
    parser.add_argument("--base", default=None)
    parser.add_argument("--only", default=None, help="tuned, held_out or all: corpus problems only")
    parser.add_argument("-o", "--output", required=True)
    args = parser.parse_args()
    records = {}
    if args.base:
        for record in load_document(args.base):
            records[record.key] = record
    keep = None
    if args.only:
        from tuner import corpus

        keep = {p.key for p in corpus.corpus_problems(args.only)}
    for url in args.db:
        with Store(url, create=False) as store:
            for record in store.records(device=args.device):
                if keep is None or record.problem_key in keep:
                    records[record.key] = record
    _write_atomically(Path(args.output), json.dumps(dump_document(list(records.values())), indent=1) + "\n")
    print(f"wrote {len(records)} records to {args.output}")


if __name__ == "__main__":
    main()
