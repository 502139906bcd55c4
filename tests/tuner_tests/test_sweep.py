"""scripts/sweep.py under the interpreter: a sweep stopped by its time budget resumes where its file ends.

The timings are the interpreter's wall clock (meaningless as speed); what is under test is that the
file is whole after every chunk and that a second run measures only what the first did not.
"""

from __future__ import annotations

import json

import pytest

from scripts import sweep  # scripts/ is a plain folder; pytest puts the repository root on the path

PROBLEM = "fp16:nn:16x32x32+8x32x32"


def _sweep(out, *extra: str) -> dict:
    assert sweep.main(["--device", "cpu", "--kernel", "moe_matmul", "--problem", PROBLEM, "--limit", "6",
                       "--out", str(out), *extra]) == 0
    return json.loads(out.read_text())


def test_interrupted_sweep_resumes_without_measuring_anything_twice(tmp_path) -> None:
    out = tmp_path / "sweep.json"
    first = _sweep(out, "--budget-s", "0")  # stops after its first chunk
    assert 0 < first["swept"] < 6 and not first["complete"] and first["sample_of"] == 6
    second = _sweep(out)
    assert second["swept"] == 6 and [r["config"] for r in second["rows"][:first["swept"]]] == \
        [r["config"] for r in first["rows"]], "the first run's rows are kept as they were"
    configs = [json.dumps(r["config"], sort_keys=True) for r in second["rows"]]
    assert len(set(configs)) == 6, "no config swept twice"
    assert all(r["status"] == "ok" and r["time_ms"] > 0 for r in second["rows"])
    assert not (tmp_path / "sweep.json.tmp").exists()


def test_file_of_another_sweep_is_refused(tmp_path) -> None:
    out = tmp_path / "sweep.json"
    out.write_text(json.dumps({"kernel": "matmul", "problem": "fp16:nn:8x8x8", "device": "cpu", "rows": []}))
    with pytest.raises(SystemExit, match="pass another --out"):
        _sweep(out)


def test_shuffled_sweep_covers_a_seeded_sample_and_resumes_in_the_same_order(tmp_path) -> None:
    import random

    import kernels
    from kernels import Problem

    spec = kernels.get_kernel("moe_matmul")
    ordered = [c.as_dict() for c in spec.space.enumerate(Problem.from_key(spec.name, PROBLEM), kernels.CPU)]
    expected = list(ordered)
    random.Random(0).shuffle(expected)

    def shuffled(out, *extra: str) -> dict:
        assert sweep.main(["--device", "cpu", "--kernel", "moe_matmul", "--problem", PROBLEM, "--shuffle",
                           "--out", str(out), *extra]) == 0
        return json.loads(out.read_text())

    first = shuffled(tmp_path / "a.json", "--budget-s", "0")
    again = shuffled(tmp_path / "b.json", "--budget-s", "0")
    n = first["swept"]
    assert 0 < n < len(ordered) and not first["complete"]
    assert [r["config"] for r in first["rows"]] == [r["config"] for r in again["rows"]] == expected[:n]
    assert expected[:n] != ordered[:n], "not the enumeration's first configs"
    resumed = shuffled(tmp_path / "a.json", "--budget-s", "0")
    assert [r["config"] for r in resumed["rows"]] == expected[:resumed["swept"]] and resumed["swept"] > n


def test_resuming_with_another_timer_is_refused(tmp_path) -> None:
    out = tmp_path / "sweep.json"
    _sweep(out, "--budget-s", "0")
    with pytest.raises(SystemExit, match="--rep-ms"):
        _sweep(out, "--rep-ms", "15")
