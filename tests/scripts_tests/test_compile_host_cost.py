"""scripts/compile_host_cost.py on the CPU: a tiny real transformers model, vanilla and patched, each compiled in a
fresh process with a backend that runs nothing, under the interpreter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

if os.environ.get("CI"):
    import transformers  # noqa: F401  (CI installs the [hf] extra)
else:
    pytest.importorskip("transformers", minversion="5")

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "compile_host_cost.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600, check=False)


def test_a_patched_model_traces_more_guards_and_every_cell_is_timed(tmp_path: Path) -> None:
    out = tmp_path / "rows.json"
    done = _run("--layers", "1", "--rounds", "1", "--calls", "50", "--variants", "vanilla,qkv", "--json", str(out))
    assert done.returncode == 0, done.stderr[-4000:]
    rows = {row["variant"]: row for row in json.loads(out.read_text())}
    assert set(rows) == {"vanilla", "qkv"}
    # The q/k/v group's traced path reads the group's state and its members' hooks: guards torch's Linears lack.
    assert rows["qkv"]["guards"] > rows["vanilla"]["guards"] > 100
    # ... and aliases among them, which Dynamo checks in Python: its three members share one group (docs/PYTORCH.md,
    # "Guards"); torch's own model has a few too
    assert rows["qkv"]["python_guards"] > rows["vanilla"]["python_guards"] > 0
    for row in rows.values():
        assert 0 < row["unguarded_us"] and 0 < row["guarded_us"]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("torch ") and "1 layers, 1 rounds of 50 calls" in lines[0]
    assert lines[1].split() == ["variant", "guards", "in", "Python", "call", "us", "unguarded", "us", "check", "us",
                                "vs", "vanilla"]
    assert lines[2].split()[0] == "vanilla" and lines[3].split()[0] == "qkv"


def test_an_unknown_variant_is_refused_with_the_choices() -> None:
    done = _run("--variants", "vanilla,flash")
    assert done.returncode == 2
    assert "--variants vanilla,flash: unknown flash; choose from vanilla, linears, mlp, qkv, norm, rotary, all" \
        in done.stderr
