"""scripts/stored_drift.py: a fresh process's measured speed-ups against an exported table's stored ones, each
record outside 3% put down to the side whose time moved. The rows are written as bench_dispatch.py --json writes
them (no GPU here to measure them); the table is a real SQLite store's export."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from db import Record, Store, export_records

ROOT = Path(__file__).resolve().parents[2]
GPU = "NVIDIA H100 80GB HBM3"

sys.path.insert(0, str(ROOT / "scripts"))
import stored_drift  # noqa: E402


def _record(key: str, time_us: float, torch_us: float, variant: str, mode: str = "eager") -> Record:
    m, n, k = (int(x) for x in key.split(":")[2].split("x"))
    return Record(device_name=GPU, device_alias="h100", compute_capability="9.0", sm_count=132, kernel="matmul",
                  problem_key=key, dtype="bf16", layout="nt", shapes=((m, n, k),), config={"VARIANT": variant},
                  time_ms=time_us / 1e3, tflops=2 * m * n * k / (time_us * 1e6), cublas_ms=torch_us / 1e3, triton_config=None, triton_ms=None,
                  torch_version="2.11.0", triton_version="3.6.0", cuda_version="13.0", trials=3, mode=mode)


def _row(key: str, ours_us: float, torch_us: float) -> dict:
    return {"problem": key, "eager": {"ours_ms": ours_us / 1e3, "cublas_ms": torch_us / 1e3,
                                      "speedup": torch_us / ours_us, "config": "VARIANT: x", "source": "shipped"}}


# (stored ours, stored torch, measured ours, measured torch) in us, and what the script must call each
CASES = {
    "bf16:nt:8x3584x3584": (13.0, 16.0, 13.1, 16.2, stored_drift.HELD),  # both within 3%
    "bf16:nt:8x3072x3072": (10.8, 15.5, 10.9, 12.3, stored_drift.TORCH_MOVED),  # GPU-bound ours, torch faster
    "bf16:nt:1x576x2048": (8.2, 15.7, 7.2, 14.8, stored_drift.OURS_MOVED),  # host-bound ours, faster
}


@pytest.fixture
def table(tmp_path: Path) -> Path:
    path = tmp_path / "table.json"
    with Store(f"sqlite:///{tmp_path / 'stamped.db'}") as store:
        for key, (ours, torch_us, *_) in CASES.items():
            store.put(_record(key, ours, torch_us, "tiled"))
        store.put(_record("bf16:nt:1x4096x4096", 9.0, 15.0, "gemv", mode="graph"))  # another mode: not read
        export_records(store, path)
    return path


def _bench_json(tmp_path: Path, rows: list[dict]) -> Path:
    path = tmp_path / "fresh.json"
    path.write_text(json.dumps({"device": GPU, "rows": rows}))
    return path


def _script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "stored_drift.py"), *args], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))})


def test_each_record_is_put_down_to_the_side_that_moved(tmp_path: Path, table: Path) -> None:
    rows = [_row(key, ours, torch_us) for key, (_, _, ours, torch_us, _) in CASES.items()]
    rows.append(_row("bf16:nt:1x4096x4096", 9.0, 15.0))  # only a graph record: no eager drift to read
    done = _script(str(_bench_json(tmp_path, rows)), "--table", str(table))
    assert done.returncode == 0, done.stderr
    verdicts = {line.split()[0]: line.rsplit("  ", 1)[1] for line in done.stdout.splitlines()
                if line.startswith("bf16:")}
    assert verdicts == {key: verdict for key, (*_, verdict) in CASES.items() if verdict != stored_drift.HELD}
    assert ("summary: {'records': 3, 'held': 1, 'torch moved': 1, 'ours moved': 1, 'ours_within': 2, "
            "'torch_within': 1}") in done.stdout


def test_a_file_that_is_not_a_bench_output_is_refused_by_name(tmp_path: Path, table: Path) -> None:
    stray = tmp_path / "stray.json"
    stray.write_text(json.dumps([1, 2]))
    done = _script(str(stray), "--table", str(table))
    assert done.returncode == 2
    assert "stray.json: not a scripts/bench_dispatch.py --json output" in done.stderr


def test_rows_with_no_record_in_the_table_say_what_to_check(tmp_path: Path, table: Path) -> None:
    done = _script(str(_bench_json(tmp_path, [_row("bf16:nt:2x2x2", 1.0, 1.0)])), "--table", str(table))
    assert done.returncode == 2
    assert "has a timed record of NVIDIA H100 80GB HBM3" in done.stderr and "check --mode, --kernel" in done.stderr
