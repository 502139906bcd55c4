"""scripts/bench_dispatch.py refuses a negative --settle-s (how long an eager timing may wait for the host's
nominal speed), and stored gated figures (timed against another baseline than its own), before it reads a
database or touches a GPU: one error naming the flag, exit 2, no file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _bench(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_dispatch.py"), *args,
                           "--db", f"sqlite:///{tmp_path / 'none.db'}", "--key", "fp16:nt:64x64x64"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


def test_a_negative_wait_for_the_host_is_refused_before_anything_runs(tmp_path: Path) -> None:
    done = _bench(tmp_path, "--settle-s", "-1")
    assert done.returncode == 2, done.stderr
    assert "--settle-s -1.0: give the seconds a timing may wait for the host, 0 or more" in done.stderr
    assert list(tmp_path.iterdir()) == [], "nothing written: no database, no cache"


def test_stored_gated_figures_are_refused_with_the_command_that_compares_them(tmp_path: Path) -> None:
    for stored in (["--stored"], ["--stored-table", str(ROOT / "kernels" / "tables" / "h100.json")]):
        done = _bench(tmp_path, "--kernel", "gated_matmul", *stored)
        assert done.returncode == 2, done.stderr
        assert "--stored with --kernel gated_matmul" in done.stderr
        assert "python -m tuner stamp --kernel gated_matmul --dry-run" in done.stderr
        assert list(tmp_path.iterdir()) == [], "nothing written: no database, no cache"
