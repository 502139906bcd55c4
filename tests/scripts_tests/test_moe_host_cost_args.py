"""scripts/moe_host_cost.py: what it refuses before any GPU work (the script itself times a GPU)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "moe_host_cost.py"), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def test_a_dense_model_is_refused_with_the_moe_models_named(tmp_path: Path) -> None:
    result = _run("--db", f"sqlite:///{tmp_path / 'x.db'}", "--out", str(tmp_path / "out"), "--model", "Qwen2.5-7B")
    assert result.returncode == 2
    assert "is not a MoE model" in result.stderr and "Qwen3-30B-A3B" in result.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "x.db").exists()
