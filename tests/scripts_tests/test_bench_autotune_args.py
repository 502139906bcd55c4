"""scripts/bench_autotune.py: --help works without a GPU, and an unknown family is refused before anything runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _bench(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_autotune.py"), *args], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=120)


def test_help_names_the_out_folder_and_the_budget(tmp_path: Path) -> None:
    done = _bench(tmp_path, "--help")
    assert done.returncode == 0, done.stderr
    assert "--out DIR" in done.stdout and "--budget-s" in done.stdout and "--smoke" in done.stdout


def test_an_unknown_family_is_refused_before_anything_runs(tmp_path: Path) -> None:
    done = _bench(tmp_path, "--families", "softmax,conv", "--out", str(tmp_path / "out"))
    assert done.returncode == 2
    assert "unknown conv; choose from softmax, layer_norm, matmul" in done.stderr
    assert not (tmp_path / "out").exists()
