"""scripts/bench_layers.py runs end to end on tiny dims (--cpu-smoke), and ours matches torch there.

The GPU measurements themselves are the script's job on an H100, not a test's."""

from __future__ import annotations

import json
import logging
import statistics
import sys
from pathlib import Path

import pytest
import torch

import kernels

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def _bench_layers():
    """scripts/bench_layers.py as a module (scripts/ is not a package)."""
    sys.path.insert(0, str(SCRIPTS))
    try:
        import bench_layers
    finally:
        sys.path.remove(str(SCRIPTS))
    return bench_layers


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


def test_rounds_alternate_the_column_order_starting_with_the_given_one() -> None:
    bench_layers = _bench_layers()
    columns = ("torch_eager", "torch_graph", "ours_eager")
    assert [bench_layers.round_order(columns, r) for r in range(4)] == [
        columns, columns[::-1], columns, columns[::-1]]


def test_column_failing_is_an_error_row_tried_once_and_others_report_the_median_of_their_rounds(caplog) -> None:
    """A plain Linear layer on the CPU: torch eager times in every round; a column that fails (an unknown one
    here) is reported once and not tried again in later rounds."""
    bench_layers = _bench_layers()
    torch.manual_seed(0)
    model, x = torch.nn.Linear(8, 8), torch.randn(2, 8)
    with caplog.at_level(logging.INFO, logger="bench_layers"):
        rows = bench_layers.bench_setting("linear", model, x, ("torch_eager", "no_such_column"), iters=1,
                                          smoke=True, tune_s=0.0, rounds=3)
    eager, failed = rows
    assert eager["column"] == "torch_eager" and len(eager["latency_rounds_ms"]) == 3
    assert eager["latency_ms"] == statistics.median(eager["latency_rounds_ms"])
    assert eager["ok"] and eager["rel_error"] == 0.0
    assert failed["column"] == "no_such_column" and "error_msg" in failed and failed["round"] == 0
    assert sum("failed" in r.getMessage() for r in caplog.records) == 1
    timed = [r.args[1:3] for r in caplog.records if r.levelno == logging.INFO and " round " in r.msg]
    assert timed == [(0, "torch_eager"), (1, "torch_eager"), (2, "torch_eager")]


def test_cpu_smoke_run_with_two_rounds_keeps_both_latencies_and_reports_their_median(tmp_path, db_url) -> None:
    sys.path.insert(0, str(SCRIPTS))
    try:
        import bench_layers
        kernels.use_database(db_url, use_shipped=False)
        assert bench_layers.main(["--cpu-smoke", "--layers", "decoder", "--columns", "torch_eager,ours_eager",
                                  "--iters", "1", "--rounds", "2", "--out", str(tmp_path)]) == 0
    finally:
        sys.path.remove(str(SCRIPTS))
        kernels.use_database(None)
    result = json.loads((tmp_path / "bench_layers.json").read_text())
    assert result["meta"]["rounds"] == 2
    assert [r["column"] for r in result["rows"]] == ["torch_eager", "ours_eager"] * 2  # decode, then prefill
    for row in result["rows"]:
        assert len(row["latency_rounds_ms"]) == 2
        assert row["latency_ms"] == statistics.median(row["latency_rounds_ms"])
        assert row["ok"]


def test_a_misnamed_column_is_refused_before_anything_runs(tmp_path, capsys) -> None:
    # A run on 2026-11-26 asked for "max_autotune": every round ran the other columns, then that one failed.
    bench_layers = _bench_layers()
    with pytest.raises(SystemExit) as exit_info:
        bench_layers.main(["--cpu-smoke", "--columns", "torch_graph,max_autotune", "--out", str(tmp_path / "out")])
    assert exit_info.value.code == 2
    assert "no column named max_autotune; choose from torch_eager, torch_graph, compile_default, " \
           "compile_max_autotune" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_every_column_is_checked_against_torch_even_without_a_torch_eager_column() -> None:
    """The reference is torch's own output, computed before any column runs: a run of graph and compiled
    columns alone (as the decode settings run) still says whether each output is right."""
    bench_layers = _bench_layers()
    torch.manual_seed(0)
    model, x = torch.nn.Linear(8, 8), torch.randn(2, 8)
    (row,) = bench_layers.bench_setting("linear", model, x, ("compile_default",), iters=1, smoke=True, tune_s=0.0)
    assert row["ok"] is True and row["rel_error"] < 1e-6
    with torch.no_grad():
        model.weight.add_(1.0)  # torch's output is taken afresh per setting: a changed layer is still right
    (row,) = bench_layers.bench_setting("linear", model, x, ("compile_default",), iters=1, smoke=True, tune_s=0.0)
    assert row["ok"] is True
    assert "yes" in bench_layers.table([row], ("compile_default",))
    assert "NO" in bench_layers.table([{**row, "ok": False}], ("compile_default",))
