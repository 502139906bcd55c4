"""`python -m tuner list` says which eager records' baselines the host paces (their speed-up moves with the host's
speed, docs/BENCHMARKS.md "Twenty-sixth session"): a real SQLite file holding made-up records (no GPU here)."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import kernels
from db import Record, Store
from kernels import MATMUL, Problem
from tuner.cli import main
from tuner.commands import baseline_bound
from tuner.timing import HOST_PACED_MS, HOST_PACED_RATIO

DEVICE = kernels.DeviceInfo("NVIDIA H100 80GB HBM3", "h100", "9.0", 132, 232448)


def _record(key: str, mode: str, time_ms: float, cublas_ms: float) -> Record:
    problem = Problem.from_key("matmul", key)
    config = MATMUL.default_config(problem, DEVICE).as_dict()
    return Record(device_name=DEVICE.name, device_alias=DEVICE.alias, compute_capability=DEVICE.compute_capability,
                  sm_count=DEVICE.sm_count, kernel="matmul", problem_key=key, dtype=problem.dtype,
                  layout=problem.layout, shapes=problem.shapes, config=config, time_ms=time_ms,
                  tflops=problem.flops / (time_ms * 1e-3) / 1e12, cublas_ms=cublas_ms, triton_config=config,
                  triton_ms=time_ms, torch_version="2.11.0", triton_version="3.6.0", cuda_version="13.0",
                  trials=20, created_at=datetime(2026, 11, 27, tzinfo=timezone.utc), mode=mode)


HOST_BOUND = "bf16:nt:1x4096x4096"  # torch's eager call 18 us, its kernel 10 us
GPU_BOUND = "bf16:nt:2048x4096x4096"  # 105 us against 100 us
SLOW_HOST = "bf16:nt:512x4096x4096"  # 60 us against 40: the host paces even a call this long


def test_each_eager_record_says_what_paces_its_baseline(tmp_path: Path, capsys) -> None:
    url = f"sqlite:///{tmp_path / 't.db'}"
    with Store(url) as store:
        store.put_many([_record(HOST_BOUND, "graph", 0.009, 0.010), _record(HOST_BOUND, "eager", 0.009, 0.018),
                        _record(GPU_BOUND, "graph", 0.098, 0.100), _record(GPU_BOUND, "eager", 0.099, 0.105),
                        _record(SLOW_HOST, "graph", 0.040, 0.040), _record(SLOW_HOST, "eager", 0.041, 0.060)])
    assert main(["list", "--db", url]) == 0
    out = capsys.readouterr().out
    header, *rows = out.splitlines()
    assert "bound" in header.split()
    bound = {(line.split()[2], line.split()[3]): line.split()[8] for line in rows if line.startswith("h100")}
    assert bound == {("bf16:nt:1x4096x4096", "eager"): "host", ("bf16:nt:1x4096x4096", "graph"): "-",
                     ("bf16:nt:2048x4096x4096", "eager"): "gpu", ("bf16:nt:2048x4096x4096", "graph"): "-",
                     ("bf16:nt:512x4096x4096", "eager"): "host", ("bf16:nt:512x4096x4096", "graph"): "-"}, out
    assert "bound host: the baseline's eager call is paced by the host" in out


def test_the_lines_between_host_and_gpu_and_a_record_without_its_graph_twin() -> None:
    long_call = 2 * HOST_PACED_MS
    assert baseline_bound(_record(GPU_BOUND, "eager", 0.05, long_call), long_call / HOST_PACED_RATIO) == "host"
    assert baseline_bound(_record(GPU_BOUND, "eager", 0.05, long_call), long_call / HOST_PACED_RATIO * 1.01) == "gpu"
    short_call = 0.99 * HOST_PACED_MS  # under the host's own cost in its slow phases: the host may pace it
    assert baseline_bound(_record(HOST_BOUND, "eager", 0.009, short_call), short_call) == "host"
    assert baseline_bound(_record(HOST_BOUND, "eager", 0.009, short_call), None) == "-", "no graph record"
    assert baseline_bound(_record(HOST_BOUND, "graph", 0.009, short_call), short_call) == "-"
