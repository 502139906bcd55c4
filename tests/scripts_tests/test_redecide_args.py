"""scripts/redecide.py: what its new options refuse, before any GPU work (the script itself runs on a GPU)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "redecide.py"), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("args,message", [
    (("--add-variant", "gemm"), "not a matmul variant; choose one of tiled, splitk, tma, repack, gemv"),
    (("--fast-host-only", "--rows", "1"), "--add-variant and --rows go with the full redecision"),
    (("--fast-host-only", "--add-variant", "gemv"), "--add-variant and --rows go with the full redecision"),
])
def test_bad_options_name_the_problem_and_create_nothing(args, message, tmp_path: Path) -> None:
    result = _run("--table", "kernels/tables/h100.json", "--db", f"sqlite:///{tmp_path / 'new.db'}", *args, cwd=ROOT)
    assert result.returncode == 2
    assert message in result.stderr
    assert not (tmp_path / "new.db").exists()
