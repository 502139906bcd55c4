"""scripts/ship_table.py merges re-decided records into a shipped table; ``--same-winners`` refreshes the
stored times of problems whose winners stay and keeps the base's records where a winner flipped."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from db import Store, dump_document, load_document

from .conftest import TILED, make_record

ROOT = Path(__file__).resolve().parents[2]
CUBLAS = {"VARIANT": "cublas", "num_warps": 4, "num_stages": 3}


def _ship(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "ship_table.py"), *args], cwd=ROOT,
                          capture_output=True, text=True, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})


def test_same_winners_refreshes_times_and_keeps_flipped_problems(tmp_path: Path) -> None:
    base = [make_record(1, 2048, 2048, mode=mode, config=CUBLAS, time_ms=0.020, cublas_ms=0.020) for mode in ("eager", "graph")]
    base += [make_record(8, 2048, 2048, mode=mode, config=CUBLAS, time_ms=0.020, cublas_ms=0.020) for mode in ("eager", "graph")]
    (tmp_path / "base.json").write_text(json.dumps(dump_document(base)))
    url = f"sqlite:///{tmp_path / 're.db'}"
    with Store(url) as store:
        store.put_many([  # problem 1: the same winners, our cuBLAS path now timed under torch's
            make_record(1, 2048, 2048, mode="eager", config=CUBLAS, time_ms=0.019, cublas_ms=0.020),
            make_record(1, 2048, 2048, mode="graph", config=CUBLAS, time_ms=0.020, cublas_ms=0.020),
            # problem 2: the eager winner flipped to a Triton config
            make_record(8, 2048, 2048, mode="eager", config=TILED, time_ms=0.018, cublas_ms=0.020),
            make_record(8, 2048, 2048, mode="graph", config=CUBLAS, time_ms=0.021, cublas_ms=0.021)])
    out = tmp_path / "table.json"
    done = _ship("--device", "NVIDIA H100 80GB HBM3", "--db", url, "--base", str(tmp_path / "base.json"),
                 "--same-winners", "-o", str(out))
    assert done.returncode == 0, done.stderr
    assert "kept the base's records of 1 problems" in done.stdout
    shipped = {(r.problem_key, r.mode): r for r in load_document(out)}
    assert shipped[("fp16:nt:1x2048x2048", "eager")].time_ms == 0.019  # refreshed
    assert shipped[("fp16:nt:8x2048x2048", "eager")].config == CUBLAS  # kept: both modes of it
    assert shipped[("fp16:nt:8x2048x2048", "graph")].time_ms == 0.020
    # Without the flag the database wins outright.
    assert _ship("--device", "NVIDIA H100 80GB HBM3", "--db", url, "--base", str(tmp_path / "base.json"),
                 "-o", str(out)).returncode == 0
    assert {(r.problem_key, r.mode): r for r in load_document(out)}[("fp16:nt:8x2048x2048", "eager")].config == TILED


def test_same_winners_without_a_base_is_refused_with_the_fix(tmp_path: Path) -> None:
    done = _ship("--device", "h100", "--db", "sqlite:///nowhere.db", "--same-winners", "-o", str(tmp_path / "t.json"))
    assert done.returncode == 2 and "pass --base" in done.stderr
    assert not (ROOT / "nowhere.db").exists() and not (tmp_path / "t.json").exists()


def test_settle_gpu_bound_stores_torch_matmuls_time_for_gpu_bound_cublas_eager_records(tmp_path: Path) -> None:
    """A GPU-bound eager cuBLAS record (torch.matmul at 0.110 ms in its graph record) stored the contest's spread
    (0.105 ms, 1.048x): settled, it says 1.00x. Host-bound ones (by the graph record's time, or with none) keep
    our path's time, and graph and Triton records stay as they are."""
    base = [make_record(8192, 2048, 2048, mode="eager", config=CUBLAS, time_ms=0.105, cublas_ms=0.110),
            make_record(8192, 2048, 2048, mode="graph", config=CUBLAS, time_ms=0.108, cublas_ms=0.110),
            make_record(1, 2048, 2048, mode="eager", config=CUBLAS, time_ms=0.018, cublas_ms=0.020),
            make_record(8, 2048, 2048, mode="eager", config=TILED, time_ms=0.090, cublas_ms=0.110),
            # 60 us eager, but 30 us on the GPU (its graph record): host-bound, our path's time stands
            make_record(32, 2048, 2048, mode="eager", config=CUBLAS, time_ms=0.055, cublas_ms=0.060),
            make_record(32, 2048, 2048, mode="graph", config=CUBLAS, time_ms=0.030, cublas_ms=0.030)]
    (tmp_path / "base.json").write_text(json.dumps(dump_document(base)))
    out = tmp_path / "table.json"
    done = _ship("--device", "NVIDIA H100 80GB HBM3", "--base", str(tmp_path / "base.json"), "--settle-gpu-bound",
                 "-o", str(out))
    assert done.returncode == 0, done.stderr
    shipped = {(r.problem_key, r.mode): r for r in load_document(out)}
    settled = shipped[("fp16:nt:8192x2048x2048", "eager")]
    assert settled.time_ms == settled.cublas_ms == 0.110 and settled.speedup == 1.0
    assert settled.tflops == base[0].tflops * 0.105 / 0.110
    assert shipped[("fp16:nt:8192x2048x2048", "graph")].time_ms == 0.108
    assert shipped[("fp16:nt:1x2048x2048", "eager")].time_ms == 0.018
    assert shipped[("fp16:nt:8x2048x2048", "eager")].time_ms == 0.090
    assert shipped[("fp16:nt:32x2048x2048", "eager")].time_ms == 0.055


def test_ship_table_with_nothing_to_write_is_refused_with_the_fix(tmp_path: Path) -> None:
    done = _ship("--device", "h100", "-o", str(tmp_path / "t.json"))
    assert done.returncode == 2 and "pass --db" in done.stderr and not (tmp_path / "t.json").exists()


def test_only_keeps_each_kernels_problems_of_that_corpus_part(tmp_path: Path) -> None:
    """``--only tuned`` keeps the tuned part's matmul, stacked query/key/value, gated_matmul and biased q/k/v
    (matmul_bias) problems and drops the held-out part's (a gated MLP's key is checked against the gated
    problems, not the matmul ones)."""
    from tuner import corpus

    gated_config = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_SIZE_M": 1, "GEMV_BLOCK_N": 2,
                    "GEMV_BLOCK_K": 1024, "num_warps": 4, "num_stages": 2}
    records, expected = [], set()
    for kernel, qkv in (("matmul", False), ("gated_matmul", False), ("matmul", True), ("matmul_bias", False)):
        for part in ("tuned", "held_out"):
            problem = next(p for p in corpus.corpus_problems(part, kernel, qkv=qkv) if p.shapes[0][0] == 1)
            m, n, k = problem.shapes[0]
            changes = dict(kernel=kernel, problem_key=problem.key, dtype=problem.dtype, mode="graph", time_ms=0.05,
                           cublas_ms=0.06)
            if kernel in ("gated_matmul", "matmul_bias"):
                changes.update(config=gated_config, triton_config=gated_config)
            records.append(make_record(m, n, k, **changes))
            if part == "tuned":
                expected.add((kernel, problem.key))
    url = f"sqlite:///{tmp_path / 'parts.db'}"
    with Store(url) as store:
        store.put_many(records)
    out = tmp_path / "table.json"
    done = _ship("--device", "NVIDIA H100 80GB HBM3", "--db", url, "--only", "tuned", "-o", str(out))
    assert done.returncode == 0, done.stderr
    assert {(r.kernel, r.problem_key) for r in load_document(out)} == expected
