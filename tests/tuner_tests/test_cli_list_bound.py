"""`python -m tuner list` says which eager records' baselines the host paces (their speed-up moves with the host's
speed, docs/BENCHMARKS.md, 2026-11-27): a real SQLite file holding made-up records (no GPU here)."""

from __future__ import annotations

from pathlib import Path

from db import Record, Store
from tests.db_tests.conftest import make_record
from tuner.cli import main
from tuner.commands import baseline_bound
from tuner.timing import HOST_PACED_MS, HOST_PACED_RATIO


def _record(key: str, mode: str, time_ms: float, cublas_ms: float) -> Record:
    m, n, k = (int(x) for x in key.split(":")[-1].split("x"))
    return make_record(m, n, k, dtype="bf16", mode=mode, time_ms=time_ms, cublas_ms=cublas_ms, triton_ms=time_ms)


HOST_BOUND = "bf16:nt:1x4096x4096"  # torch's eager call takes 18 us, its kernel 10 us
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


def test_a_long_grouped_key_is_shown_by_its_start_and_its_gemm_count() -> None:
    # A decode step of a 128-expert model, as record mode keys it (list --untuned once printed "(0 GEMMs)").
    from tuner.commands import _short_key

    key = "bf16:nt:" + "+".join(["1x1536x2048"] * 8 + ["0x1536x2048"] * 120)
    shown = _short_key(key)
    assert shown.startswith("bf16:nt:1x1536x2048+") and shown.endswith("... (128 GEMMs)") and len(shown) < 60
    assert _short_key("fp16:nn:16x32x32") == "fp16:nn:16x32x32"
