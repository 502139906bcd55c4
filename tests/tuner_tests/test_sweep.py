"""scripts/sweep.py: a sweep stopped by its time budget resumes where its file ends.

On the device this process computes on: under the interpreter in CI, where the timings are wall clock
(meaningless as speed), and on the GPU where there is one (in-process --device cpu needs the
interpreter, which a GPU run has off). What is under test is that the file is whole after every chunk
and that a second run measures only what the first did not.
"""

from __future__ import annotations

import json

import pytest

import kernels
from scripts import sweep  # scripts/ is a plain folder; pytest puts the repository root on the path

PROBLEM = "fp16:nn:16x32x32+8x32x32"
DEVICE = kernels.current_device()
# Compile workers, and so the configs of a run's first chunk: fewer than --limit, so that a run stopped
# by its budget is incomplete. The default (cores - 2, up to 14) would take all six at once on the
# 16-core GPU box or any CI runner with 8 cores.
WORKERS = 2


@pytest.fixture(autouse=True)
def _workers(monkeypatch: pytest.MonkeyPatch) -> None:
    from tuner import workers

    monkeypatch.setattr(workers, "default_workers", lambda: WORKERS)


def _sweep(out, *extra: str) -> dict:
    assert sweep.main(["--device", DEVICE.alias, "--kernel", "moe_matmul", "--problem", PROBLEM, "--limit", "6",
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

    from kernels import Problem

    spec = kernels.get_kernel("moe_matmul")
    ordered = [c.as_dict() for c in spec.space.enumerate(Problem.from_key(spec.name, PROBLEM), DEVICE)]
    expected = list(ordered)
    random.Random(0).shuffle(expected)

    def shuffled(out, *extra: str) -> dict:
        assert sweep.main(["--device", DEVICE.alias, "--kernel", "moe_matmul", "--problem", PROBLEM, "--shuffle",
                           "--out", str(out), *extra]) == 0
        return json.loads(out.read_text())

    def swept(document: dict) -> list[str]:
        # Workers finish in any order; which configs a run covered is what must not depend on it.
        return sorted(json.dumps(r["config"], sort_keys=True) for r in document["rows"])

    def first_of(configs: list[dict], n: int) -> list[str]:
        return sorted(json.dumps(c, sort_keys=True) for c in configs[:n])

    first = shuffled(tmp_path / "a.json", "--budget-s", "0")
    again = shuffled(tmp_path / "b.json", "--budget-s", "0")
    n = first["swept"]
    assert 0 < n < len(ordered) and not first["complete"]
    assert swept(first) == swept(again) == first_of(expected, n)
    assert first_of(expected, n) != first_of(ordered, n), "not the enumeration's first configs"
    resumed = shuffled(tmp_path / "a.json", "--budget-s", "0")
    assert swept(resumed) == first_of(expected, resumed["swept"]) and resumed["swept"] > n


def test_resuming_with_another_timer_is_refused(tmp_path) -> None:
    out = tmp_path / "sweep.json"
    _sweep(out, "--budget-s", "0")
    with pytest.raises(SystemExit, match="--rep-ms"):
        _sweep(out, "--rep-ms", "15")


def test_a_complete_sweep_times_the_configs_near_its_best_again(tmp_path) -> None:
    from scripts.sweep import row_ms

    out = tmp_path / "sweep.json"
    document = _sweep(out, "--confirm-rounds", "3", "--confirm-within", "10", "--confirm-cap", "2")
    assert document["swept"] == 6 and document["confirmed"]["configs"] == 2  # all of the sample, so confirmed
    assert document["confirmed"]["rounds"] == 3 and document["confirmed"]["baseline_ms"] > 0
    confirmed = [r for r in document["rows"] if "confirmed_ms" in r]
    fastest = sorted(document["rows"], key=lambda r: r["time_ms"])[:2]
    assert sorted(confirmed, key=lambda r: r["time_ms"]) == fastest
    assert all(r["confirmed_ms"] > 0 for r in confirmed)
    assert row_ms({"time_ms": 1.0, "confirmed_ms": 1.1}) == 1.1 and row_ms({"time_ms": 1.0, "confirmed_ms": 2.0}) == 1.0
    again = _sweep(out, "--confirm-rounds", "3")
    assert again["rows"] == document["rows"], "a confirmed sweep is not confirmed again"


def test_an_incomplete_sweep_is_not_confirmed(tmp_path) -> None:
    document = _sweep(tmp_path / "sweep.json", "--budget-s", "0", "--confirm-rounds", "3")
    assert not document["complete"] and document["confirmed"] is None
    assert not any("confirmed_ms" in r for r in document["rows"])


class _ScriptedContest:
    """Stands in for the GPU bench's side-by-side timing (no GPU here): each contest returns the next
    scripted times for the configs it is given, by their BLOCK_M."""

    problem = None

    def __init__(self, *medians: dict[int, float]) -> None:
        self.medians = list(medians)
        self.contests: list[list[int]] = []

    def contest(self, configs, rounds: int):
        script = self.medians.pop(0)
        self.contests.append([c["BLOCK_M"] for c in configs])
        return [script[c["BLOCK_M"]] for c in configs], 0.03


class _NoCompile:
    def check(self, problem, configs) -> dict:
        return {}


def test_a_disturbed_confirmation_is_timed_again_and_keeps_its_lowest_median(monkeypatch) -> None:
    monkeypatch.setattr(sweep, "CONTEST_PAUSE_S", 0.0)
    rows = [{"config": {"BLOCK_M": m}, "time_ms": 0.0060} for m in (16, 32)] + \
        [{"config": {"BLOCK_M": 64}, "time_ms": 0.0200}]  # far from the best: not confirmed
    # 32's first median is 2x its sweep timing (disturbed); its second is believable.
    bench = _ScriptedContest({16: 0.0061, 32: 0.0120}, {32: 0.0062})
    summary = sweep._confirm(_NoCompile(), bench, rows, within=0.08, cap=40, rounds=5)
    assert bench.contests == [[16, 32], [32]], "only the disturbed config is timed again"
    assert [r.get("confirmed_ms") for r in rows] == [0.0061, 0.0062, None]
    assert summary["attempts"] == 2 and summary["disturbed"] == 0
    always = _ScriptedContest({16: 0.0200, 32: 0.0061}, {16: 0.0150}, {16: 0.0180})
    rows = [{"config": {"BLOCK_M": m}, "time_ms": 0.0060} for m in (16, 32)]
    summary = sweep._confirm(_NoCompile(), always, rows, within=0.08, cap=40, rounds=5)
    assert summary["attempts"] == 3 and summary["disturbed"] == 1
    assert rows[0]["confirmed_ms"] == 0.0180 and sweep.row_ms(rows[0]) == 0.0060, "still disturbed: not used"


def test_a_sweep_where_nothing_ran_has_nothing_to_confirm() -> None:
    rows = [{"config": {"BLOCK_M": m}, "status": "compile_error", "time_ms": None} for m in (16, 32)]
    bench = _ScriptedContest()
    assert sweep._confirm(_NoCompile(), bench, rows, within=0.08, cap=40, rounds=2) is None
    assert bench.contests == [] and not any("confirmed_ms" in r for r in rows)
