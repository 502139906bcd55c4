"""scripts/bench_models.py's pieces on the CPU: tiny real transformers models, one round, under the interpreter."""

from __future__ import annotations

import json
import os
import statistics
import sys
from pathlib import Path

import pytest

if os.environ.get("CI"):
    import transformers  # noqa: F401  (CI installs the [hf] extra)
else:
    pytest.importorskip("transformers", minversion="5")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import bench_models  # noqa: E402


def test_cpu_smoke_times_every_column_and_checks_both_models_against_fp32(tmp_path: Path) -> None:
    assert bench_models.main(["--cpu-smoke", "--models", "Llama-3.1-8B,Qwen3-30B-A3B", "--out", str(tmp_path)]) == 0
    found = json.loads((tmp_path / "bench_models.json").read_text())
    cells = {(row["model"], row["setting"]): row for row in found["rows"]}
    assert set(cells) == {(m, s) for m in ("Llama-3.1-8B", "Qwen3-30B-A3B") for s in ("prefill8", "generate_b1")}
    assert set(cells["Llama-3.1-8B", "prefill8"]["ms"]) == {"vanilla", "patched"}
    assert set(cells["Qwen3-30B-A3B", "generate_b1"]["ms"]) == {"vanilla", "eager_experts", "patched"}
    assert all(ms > 0 for row in found["rows"] for ms in row["ms"].values())
    assert [row["part"] for row in found["rows"]] == ["held-out"] * 4
    for errors in found["correctness"].values():
        assert 0 < errors["vanilla"] < 1e-2 and 0 < errors["patched"] < 1e-2  # fp16 against fp32
        assert len(errors["ratios"]) == 2 and all(r > 0 for r in errors["ratios"])  # --cpu-smoke: two prompts
        assert errors["patched_no_further"] == all(r <= 1 for r in errors["ratios"])
    assert "held-out models" in (tmp_path / "bench_models.txt").read_text()


def test_quick_picks_a_tuned_and_a_held_out_model_and_unknown_names_are_refused(capsys) -> None:
    args = bench_models.parse_args(["--quick"])
    assert {bench_models.MODELS[m].part for m in args.models} == {"tuned", "held-out"}
    assert args.static == [] and args.prefill == [512]
    with pytest.raises(SystemExit):
        bench_models.parse_args(["--models", "GPT-5"])
    assert "unknown model(s) GPT-5" in capsys.readouterr().err


def test_the_budget_skips_settings_it_cannot_start(tmp_path: Path) -> None:
    args = bench_models.parse_args(["--cpu-smoke", "--models", "Llama-3.1-8B", "--budget-s", "0",
                                    "--out", str(tmp_path)])
    rows, checks = bench_models.run(args)
    assert [row.note.startswith("skipped") for row in rows] == [True, True] and "Llama-3.1-8B" in checks


def test_control_times_an_unpatched_copy_and_profile_writes_each_columns_table(tmp_path: Path) -> None:
    assert bench_models.main(["--cpu-smoke", "--models", "Llama-3.1-8B", "--control", "--profile",
                              "--out", str(tmp_path)]) == 0
    found = json.loads((tmp_path / "bench_models.json").read_text())
    for row in found["rows"]:
        assert set(row["ms"]) == {"vanilla", "patched", "control"}
        assert len(row["rounds"]["control"]) == len(row["rounds"]["patched"]) >= 1
        # paired ratios: each round's vanilla over that round's patched, and vanilla over the copy (A/A)
        pairs = [v / p for v, p in zip(row["rounds"]["vanilla"], row["rounds"]["patched"])]
        assert row["ratios"]["vanilla"] == pytest.approx(statistics.median(pairs))
        assert row["ratios"]["control"] > 0
        text = (tmp_path / "profiles" / f"Llama-3.1-8B_{row['setting']}.txt").read_text()
        assert all(f"==== {col}" in text for col in ("vanilla", "patched", "control"))
    text = (tmp_path / "bench_models.txt").read_text()
    assert "A/A (an unpatched copy against vanilla)" in text and "cells under 0.98x" in text


def test_every_column_takes_every_place_in_the_rounds() -> None:
    cols = ("vanilla", "patched", "control")
    orders = [bench_models.round_order(cols, r) for r in range(6)]
    assert all(sorted(order) == sorted(cols) for order in orders)
    for col in cols:
        assert sorted(order.index(col) for order in orders) == [0, 0, 1, 1, 2, 2]
    assert [bench_models.round_order(("vanilla", "patched"), r) for r in range(4)] == [
        ("vanilla", "patched"), ("patched", "vanilla"), ("patched", "vanilla"), ("vanilla", "patched")]


def test_the_correctness_line_says_on_how_many_prompts_patched_was_further() -> None:
    checks = {"A": {"vanilla": 1e-2, "patched": 1e-2, "ratios": [0.99, 1.0], "patched_no_further": True},
              "B": {"vanilla": 1e-2, "patched": 1.01e-2, "ratios": [0.985, 1.004, 1.007], "patched_no_further": False},
              "C": {"error": "RuntimeError: no GPU"}}
    text = bench_models.table([], checks)
    assert "A                  vanilla 1.00e-02  patched 1.00e-02  ok" in text
    assert "patched further on 2 of 3 prompt(s), x0.985-x1.007" in text
    assert "C                  RuntimeError: no GPU" in text
    with pytest.raises(SystemExit):
        bench_models.parse_args(["--check-prompts", "0"])


def test_a_profiled_static_cell_gives_the_gpus_ratio_beside_the_walls() -> None:
    # The GPU's times as a static cell stores them (gpu_ms fills them on a GPU only); a cell without them
    # leaves the two columns blank.
    static = bench_models.Row("Qwen2.5-7B", "tuned", "static_b1", "ms/token",
                              ms={"vanilla": 1.701, "patched": 1.814, "control": 1.6},
                              ratios={"vanilla": 0.976, "control": 0.907},
                              gpu_ms={"vanilla": 0.637, "patched": 0.601, "control": 0.635})
    eager = bench_models.Row("Qwen2.5-7B", "tuned", "generate_b1", "ms/token",
                             ms={"vanilla": 2.0, "patched": 1.6}, ratios={"vanilla": 1.25})
    lines = bench_models.table([static, eager], {}).splitlines()
    header = next(line for line in lines if line.startswith("model"))
    assert header.split()[-4:] == ["GPU", "x", "A/A", "unit"]
    row = next(line for line in lines if "static_b1" in line).split()
    assert row[-3:] == [f"{0.637 / 0.601:.3f}", f"{0.637 / 0.635:.3f}", "ms/token"]
    assert next(line for line in lines if "generate_b1" in line).split()[-1] == "ms/token"
    assert bench_models.gpu_ratio(eager, "patched") is None


def test_a_static_cell_gives_the_compiled_calls_guard_check_beside_the_walls() -> None:
    # guard_check_us fills these on a GPU, where transformers compiles forward for a static cache
    static = bench_models.Row("DeepSeek-V2-Lite", "tuned", "static_b1", "ms/token",
                              ms={"vanilla": 1.255, "patched": 1.287}, ratios={"vanilla": 0.955},
                              guard_us={"vanilla": 113.8, "patched": 176.9})
    row = next(line for line in bench_models.table([static], {}).splitlines() if "static_b1" in line)
    assert row.endswith("ms/token  guards 114 / 177 us")


def test_guard_check_us_times_a_compiled_call_with_its_guards_and_without() -> None:
    """What ``guard_check_us`` wraps and puts back: a model's ``_compiled_call``, as transformers keeps it (here a
    torch.compile of a small module with a backend that runs its graph, on the CPU)."""
    import torch

    class Tiny(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = torch.nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.proj(x))

    model = Tiny()
    assert bench_models.guard_check_us(model, lambda: None) is None, "nothing compiled: nothing to time"
    compiled = torch.compile(model, backend=lambda graph, inputs: graph, fullgraph=True)
    model.__dict__["_compiled_call"] = compiled
    x = torch.randn(2, 8)
    calls = []

    def generate() -> None:  # a few decode steps, as generate calls the compiled forward
        for _ in range(5):
            calls.append(model._compiled_call(x))

    generate()
    check = bench_models.guard_check_us(model, generate)
    assert isinstance(check, float) and len(calls) == 15
    assert model.__dict__["_compiled_call"] is compiled, "the compiled call is put back"

