"""scripts/calibrate_check.py plans its cases without a GPU (--plan), and refuses to measure without one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from tests.tuner_tests.mutants import MUTANTS

ROOT = Path(__file__).resolve().parents[2]


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])), "TRITON_INTERPRET": "1"}
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "calibrate_check.py"), "--out", str(tmp_path / "o"),
                           *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


def test_the_plan_has_one_case_per_distinct_sweep_config_and_every_mutant(tmp_path: Path) -> None:
    done = _run(tmp_path, "--plan", "--no-more")
    assert done.returncode == 0, done.stderr
    sweeps = list((ROOT / "benchmarks" / "sweeps").rglob("*.json"))
    lines = done.stdout.splitlines()
    assert len(lines) == len(sweeps) + 1
    planned = {line.split()[1]: int(line.split()[0]) for line in lines[:-1]}
    for path in sweeps:
        rows = [r for r in json.loads(path.read_text())["rows"] if r["status"] == "ok"]
        assert 0 < planned[path.stem] <= len(rows)
    assert lines[-1].split()[0] == str(sum(planned.values())) and lines[-1].endswith(f"{len(MUTANTS)} mutants")


def test_without_a_gpu_it_measures_nothing(tmp_path: Path) -> None:
    if torch.cuda.is_available():
        return
    done = _run(tmp_path, "--no-more")
    assert done.returncode == 2 and "has no GPU" in done.stderr
    assert not (tmp_path / "o" / "calibrate_check.json").exists()
