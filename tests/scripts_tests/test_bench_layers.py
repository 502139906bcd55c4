"""scripts/bench_layers.py runs end to end on tiny dims (--cpu-smoke), and ours matches torch there.

The GPU measurements themselves are the script's job on an H100, not a test's."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import kernels

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def test_cpu_smoke_run_writes_json_with_ours_matching_torch(tmp_path, db_url) -> None:
    sys.path.insert(0, str(SCRIPTS))
    try:
        import bench_layers
        kernels.use_database(db_url, use_shipped=False)
        assert bench_layers.main(["--cpu-smoke", "--layers", "decoder", "--columns", "torch_eager,ours_eager",
                                  "--iters", "1", "--out", str(tmp_path)]) == 0
    finally:
        sys.path.remove(str(SCRIPTS))
        kernels.use_database(None)
    rows = json.loads((tmp_path / "bench_layers.json").read_text())["rows"]
    assert {(r["setting"], r["column"]) for r in rows} == {
        (s, c) for s in ("decoder/decode/2", "decoder/prefill/8") for c in ("torch_eager", "ours_eager")}
    assert all(r["ok"] for r in rows)


def test_quick_tune_run_tunes_the_layers_untuned_problems_and_dispatch_then_uses_them(tmp_path, db_url) -> None:
    """--tune quick: the problems the layer poses that have no record are quick-tuned into the database
    (under the interpreter, on the CPU), and dispatch reads those records for the timed columns."""
    sys.path.insert(0, str(SCRIPTS))
    try:
        import bench_layers
        kernels.use_database(db_url, use_shipped=False)
        assert bench_layers.main(["--cpu-smoke", "--layers", "decoder", "--columns", "torch_eager,ours_eager",
                                  "--iters", "1", "--tune", "quick", "--db", db_url, "--out", str(tmp_path)]) == 0
    finally:
        sys.path.remove(str(SCRIPTS))
        kernels.use_database(None)
    result = json.loads((tmp_path / "bench_layers.json").read_text())
    assert all(r["ok"] for r in result["rows"])
    first = result["problems"]["decoder/decode/2"]
    assert first["tuned_here"] > 0 and first["tune_s"] > 0
    from_database = {c["problem"] for c in first["choices"] if c["source"] == "database"}
    assert any(c["kernel"] == "gated_matmul" for c in first["choices"] if c["problem"] in from_database), \
        "the gated problem was tuned and dispatch reads its record"
