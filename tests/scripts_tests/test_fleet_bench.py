"""scripts/fleet_bench.py end to end on the CPU (--cpu-dry-run: tiny shapes under the interpreter, CPU workers): the
scale runs, the kill run and the report, read back from its JSON; and the model's problems it writes on a GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))


def _bench(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    env.pop("TUNER_DB", None)
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "fleet_bench.py"), *args, "--out", str(tmp_path / "out")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)


def test_scale_kill_and_report_on_cpu_workers(tmp_path: Path) -> None:
    scale = _bench(tmp_path, "--phase", "scale", "--counts", "1,2", "--trials", "2", "--cpu-dry-run")
    assert scale.returncode == 0, scale.stdout + scale.stderr
    kill = _bench(tmp_path, "--phase", "kill", "--trials", "6", "--kill-after", "1", "--lease", "5", "--cpu-dry-run")
    assert kill.returncode == 0, kill.stdout + kill.stderr
    report = _bench(tmp_path, "--phase", "report")
    assert report.returncode == 0, report.stderr
    result = json.loads((tmp_path / "out" / "report.json").read_text())
    assert [run["workers"] for run in result["runs"]] == [1, 2]  # in the order run
    for run in result["runs"]:
        assert run["states"] == {"queued": 0, "running": 0, "done": 6, "failed": 0}
        assert run["timeline"]["first_claim_s"] > 0 and run["timeline"]["job_seconds"] > 0
        # Each worker said when it was ready, after its spawn and before the run's first claim.
        ready = run["timeline"]["worker_ready_s"]
        assert len(ready) == run["workers"] and all(0 < r < run["timeline"]["first_claim_s"] for r in ready), ready
        # and where its start-up went, phase by phase, no phase longer than the longest start-up
        phases = run["timeline"]["worker_phases_s"]
        assert list(phases) == ["imports", "device", "waiting for the run", "database"], phases
        assert all(0 <= seconds <= max(ready) for seconds in phases.values()), (phases, ready)
    assert set(result["speedup"]) == {"1", "2"} and result["speedup"]["1"]["speedup"] == 1.0
    assert result["replay"]["2"]["perfect"] <= result["replay"]["2"]["longest_first"]
    assert result["replay"]["2"]["perfect"] <= result["replay"]["2"]["kernel_longest_first"]
    assert result["kill"]["passed"], result["kill"]
    assert "speed-up" in report.stdout and "PASS" in report.stdout and "worker start-up: imports" in report.stdout


def test_the_kernel_replay_learns_which_kernel_runs_long() -> None:
    import fleet_bench

    # In claim order a long job comes last and runs alone. Once a job of each kernel has finished, the long
    # kernel's go first and the short ones fill the end: 6 s, a perfectly even split, against 8.
    jobs = [("short a", 1.0), ("long a", 4.0), ("short b", 1.0), ("short c", 1.0), ("short d", 1.0), ("long b", 4.0)]
    assert fleet_bench.replay([s for _, s in jobs], 2) == 8.0
    assert fleet_bench.replay_by_kernel(jobs, 2) == 6.0
    assert fleet_bench.replay_by_kernel(jobs, 1) == 12.0  # one worker: the order changes nothing


def test_a_models_problems_are_its_layers_at_each_row_count() -> None:
    import fleet_bench

    lines = fleet_bench.model_problems("Qwen2.5-7B", [1, 512])
    assert len(lines) == 8  # query/key/value (biased), output, gated MLP, down: at 2 row counts
    assert "matmul_bias bf16:nt:1x4608x3584" in lines and "gated_matmul bf16:nt:512x18944x3584" in lines
    assert "matmul bf16:nt:512x3584x3584" in lines and "matmul bf16:nt:1x3584x18944" in lines
