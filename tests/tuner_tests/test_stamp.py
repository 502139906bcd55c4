"""Stamping stored eager records (tuner/stamp.py, ``python -m tuner stamp``): each record's winner is timed
again through the public call, pass after pass, and the median pass is stored; winners never change.

On the CPU the real kernels run under the interpreter through the real Bench and the public call, and a
test double stands in for the GPU's eager timer (there is none here): it runs the call and returns the
times each pass scripts, so that which pass is stored can be checked. On the GPU (marked) the CLI stamps a
real SQLite file with real timings."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

import kernels
from db import Record, Store, plausibility_problems
from kernels import MATMUL, Config, Problem
from tuner.bench import Bench
from tuner.stamp import stamp_eager, stampable, store_stamps, summary

ROOT = Path(__file__).resolve().parents[2]
PROBLEM = Problem.from_key("matmul", "fp16:nt:16x32x32")
CUBLAS = {"VARIANT": "cublas", "num_warps": 4, "num_stages": 3}
LONG_AGO = datetime(2026, 1, 1, tzinfo=timezone.utc)


def _record(device: kernels.DeviceInfo, config: dict, mode: str = "eager", time_ms: float = 0.010,
            cublas_ms: float = 0.020, key: str = PROBLEM.key) -> Record:
    problem = Problem.from_key("matmul", key)
    tiled = MATMUL.default_config(problem, device).as_dict()
    return Record(device_name=device.name, device_alias=device.alias, compute_capability=device.compute_capability,
                  sm_count=device.sm_count, kernel="matmul", problem_key=key, dtype=problem.dtype,
                  layout=problem.layout, shapes=problem.shapes, config=config, time_ms=time_ms,
                  tflops=problem.flops / (time_ms * 1e-3) / 1e12, cublas_ms=cublas_ms, triton_config=tiled,
                  triton_ms=time_ms if config == tiled else 0.03, torch_version="2.9.0", triton_version="3.4.0",
                  cuda_version="", trials=20, created_at=LONG_AGO, mode=mode)


class ScriptedTimer:
    """Stands in for the GPU's eager timer (timing.eager_ms_side_by_side has no CPU form): runs the call,
    then returns the baseline's ms, or ours for the pass under way (``ours_ms[pass]``); or raises in the
    passes listed in ``fail``."""

    def __init__(self, ours_ms: list[float], baseline_ms: float, fail: tuple[int, ...] = ()) -> None:
        self.ours_ms, self.baseline_ms, self.fail = ours_ms, baseline_ms, fail
        self.benches = 0
        self.calls: list[str] = []
        self.graphs: list[Config | None] = []  # the graph winner each contest was asked to hold beside

    def make_bench(self, device: kernels.DeviceInfo):
        def make(spec, problem) -> Bench:
            self.benches += 1
            bench = Bench(spec, problem, device, eager_timer=self.eager_timer, timer=lambda fn: 1.0)
            contest = bench.contest

            def noting_the_graph_winner(configs, rounds=3, mode="graph", graph=None):
                self.graphs.append(graph)
                return contest(configs, rounds, mode, graph)

            bench.contest = noting_the_graph_winner
            return bench
        return make

    def eager_timer(self, call, inputs) -> float:
        call(inputs[0])
        if call is MATMUL.baseline:
            self.calls.append("baseline")
            return self.baseline_ms
        self.calls.append("ours")
        pass_ = self.benches - 1
        if pass_ in self.fail:
            raise RuntimeError("CUDA out of memory (scripted)")
        return self.ours_ms[pass_]


@pytest.fixture
def device(torch_device) -> kernels.DeviceInfo:
    return kernels.current_device(torch_device)


def test_the_median_pass_is_stored_and_the_winner_kept(device) -> None:
    tiled = MATMUL.default_config(PROBLEM, device).as_dict()
    eager, graph = _record(device, tiled), _record(device, tiled, mode="graph", time_ms=0.008)
    timer = ScriptedTimer(ours_ms=[0.015, 0.020, 0.010], baseline_ms=0.030)  # 2.0x, 1.5x, 3.0x
    before = datetime.now(timezone.utc) - timedelta(seconds=1)
    pauses: list[float] = []
    (stamp,) = stamp_eager([eager, graph], device, passes=3, pause_s=0.25, make_bench=timer.make_bench(device),
                           sleep=pauses.append)
    assert stamp.passes == pytest.approx((2.0, 1.5, 3.0))
    assert timer.graphs == [Config.from_dict(graph.config)] * 3, "timed beside its graph winner, as dispatch holds it"
    assert pauses == [0.25, 0.25], "the passes are spread in time"
    stamped = stamp.record
    assert stamped.config == tiled and stamped.key == eager.key
    assert (stamped.time_ms, stamped.cublas_ms, stamped.triton_ms) == pytest.approx((0.015, 0.030, 0.015))
    assert stamp.speedup == pytest.approx(2.0) and stamp.was == pytest.approx(2.0) and not stamp.losing
    assert plausibility_problems(stamped) == [], "the stamped record agrees with itself (tflops from its time)"
    assert stamped.created_at > before and stamped.torch_version != "2.9.0"
    assert "ours" in timer.calls and "baseline" in timer.calls


def test_a_winner_that_no_longer_wins_gives_its_place_to_cublas_timed_the_same_way(device) -> None:
    tiled = MATMUL.default_config(PROBLEM, device).as_dict()
    # Passes 1-2: the Triton winner (0.8x, 0.9x); passes 3-4: cuBLAS through our dispatch path.
    timer = ScriptedTimer(ours_ms=[0.025, 0.0222, 0.019, 0.021], baseline_ms=0.020)
    (stamp,) = stamp_eager([_record(device, tiled, time_ms=0.010, cublas_ms=0.015)], device, passes=2,
                           make_bench=timer.make_bench(device), sleep=lambda s: None)
    assert timer.benches == 4 and stamp.demoted_from == pytest.approx((0.8, 0.9), abs=1e-3)
    assert kernels.is_baseline(Config.from_dict(stamp.record.config))
    assert stamp.passes == pytest.approx((0.020 / 0.019, 0.020 / 0.021))
    assert stamp.speedup == pytest.approx(0.020 / 0.021), "the lower middle of two passes"
    assert stamp.record.triton_config == tiled and stamp.record.triton_ms == pytest.approx(0.025)
    assert not stamp.losing and stamp.was == pytest.approx(1.5)
    assert "1 stamped, 1 moved by more than 3%; 1 Triton winner(s) slower than the baseline now, cuBLAS in their " \
           f"place: {PROBLEM.key} (0.800x, cuBLAS 0.952x)" == summary([stamp])
    assert plausibility_problems(stamp.record) == []


def test_a_losing_winner_stays_where_cublas_reads_slower_still(device) -> None:
    tiled = MATMUL.default_config(PROBLEM, device).as_dict()
    timer = ScriptedTimer(ours_ms=[0.0202, 0.0206], baseline_ms=0.020)  # Triton 0.99x, then cuBLAS 0.97x
    (stamp,) = stamp_eager([_record(device, tiled)], device, passes=1, make_bench=timer.make_bench(device),
                           sleep=lambda s: None)
    assert timer.benches == 2 and stamp.record.config == tiled and stamp.losing and stamp.demoted_from == ()
    assert summary([stamp]).endswith(f"decide them again with `python -m tuner search` or scripts/redecide.py: {PROBLEM.key}")


def test_a_winner_that_holds_is_not_timed_again(device) -> None:
    tiled = MATMUL.default_config(PROBLEM, device).as_dict()
    timer = ScriptedTimer(ours_ms=[0.019], baseline_ms=0.020)
    (stamp,) = stamp_eager([_record(device, tiled)], device, passes=1, make_bench=timer.make_bench(device))
    assert timer.benches == 1 and stamp.demoted_from == () and stamp.record.config == tiled


def test_a_failed_reading_costs_only_that_pass_and_a_record_never_read_is_left_out(device, caplog) -> None:
    tiled = MATMUL.default_config(PROBLEM, device).as_dict()
    timer = ScriptedTimer(ours_ms=[0.010, 0.0, 0.020], baseline_ms=0.030, fail=(1,))
    (stamp,) = stamp_eager([_record(device, tiled)], device, passes=3, pause_s=0,
                           make_bench=timer.make_bench(device), sleep=lambda s: None)
    assert stamp.passes == pytest.approx((3.0, 1.5)) and stamp.speedup == pytest.approx(1.5)
    assert "CUDA out of memory" in caplog.text
    never = ScriptedTimer(ours_ms=[0.0], baseline_ms=0.030, fail=(0,))
    assert stamp_eager([_record(device, tiled)], device, passes=1, make_bench=never.make_bench(device)) == []


def test_a_gpu_bound_cublas_winner_is_stamped_at_par(device) -> None:
    """Judged by its graph record's baseline time (50 us or more: search.GPU_BOUND_EAGER_MS): our path runs
    torch's kernel, so the reading's difference from 1.00x is the method's noise."""
    bound = "fp16:nt:16x32x64"
    records = [_record(device, CUBLAS, key=bound), _record(device, CUBLAS, mode="graph", key=bound, cublas_ms=0.08),
               _record(device, CUBLAS), _record(device, CUBLAS, mode="graph", cublas_ms=0.01)]
    timer = ScriptedTimer(ours_ms=[0.018, 0.018], baseline_ms=0.020)
    stamps = {s.record.problem_key: s for s in stamp_eager(records, device, passes=1, make_bench=timer.make_bench(device))}
    assert stamps[bound].record.time_ms == stamps[bound].record.cublas_ms == pytest.approx(0.020)
    assert stamps[PROBLEM.key].speedup == pytest.approx(0.020 / 0.018), "a host-bound one keeps its reading"


def test_only_eager_records_of_this_device_with_a_pinnable_call_are_stamped(device) -> None:
    tiled = MATMUL.default_config(PROBLEM, device).as_dict()
    # Another GPU than this one (on an H200, the H200 is this device: 2026-11-28).
    name, alias = ("NVIDIA H100 80GB HBM3", "h100") if device.alias == "h200" else ("NVIDIA H200", "h200")
    other = dataclasses.replace(_record(device, tiled), device_name=name, device_alias=alias)
    grouped = dataclasses.replace(_record(device, tiled), kernel="grouped_matmul")
    assert "graph record" in stampable(_record(device, tiled, mode="graph"))
    assert "cannot be pinned" in stampable(grouped)
    assert "no baseline" in stampable(dataclasses.replace(_record(device, tiled), cublas_ms=None))
    timer = ScriptedTimer(ours_ms=[0.010], baseline_ms=0.030)
    assert stamp_eager([other, grouped, _record(device, tiled, mode="graph")], device, passes=1,
                       make_bench=timer.make_bench(device)) == []
    assert timer.benches == 0
    with pytest.raises(ValueError, match="passes=0"):
        stamp_eager([], device, passes=0, make_bench=timer.make_bench(device))


def test_only_records_unchanged_since_they_were_read_are_stored(device, db_url) -> None:
    """A real SQLite file: while a stamp timed two problems, a search stored a newer record of one of them;
    that one stays as the search left it, and the other is replaced by its stamp."""
    tiled = MATMUL.default_config(PROBLEM, device).as_dict()
    other = "fp16:nt:16x32x64"
    read = [_record(device, tiled), _record(device, CUBLAS, key=other)]
    with Store(db_url) as store:
        store.put_many(read, on_conflict="replace")
    timer = ScriptedTimer(ours_ms=[0.010, 0.010], baseline_ms=0.030)
    stamps = stamp_eager(read, device, passes=1, make_bench=timer.make_bench(device))
    newer = dataclasses.replace(read[1], time_ms=0.012, tflops=read[1].tflops * 0.010 / 0.012,
                                created_at=datetime.now(timezone.utc))
    with Store(db_url) as store:
        store.put_many([newer], on_conflict="replace")  # the search's, during the stamp
        stored = store_stamps(store, stamps, read)
        after = {r.problem_key: r for r in store.records(device=device.name)}
    assert [r.problem_key for r in stored] == [PROBLEM.key]
    assert after[PROBLEM.key].speedup == pytest.approx(3.0) and after[PROBLEM.key].created_at > LONG_AGO
    assert after[other].time_ms == pytest.approx(0.012), "the search's newer record stays"


def test_stamping_on_a_cpu_without_a_timer_says_where_to_run_it() -> None:
    import tuner

    assert tuner.stamp_eager is stamp_eager, "part of the library's public names, usable without the CLI"
    with pytest.raises(ValueError, match="run it on that GPU"):
        stamp_eager([], kernels.current_device("cpu"))


def _tuner(*args: str, db: Path) -> subprocess.CompletedProcess:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path, "TUNER_DB": f"sqlite:///{db}"}
    return subprocess.run([sys.executable, "-m", "tuner", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)


@pytest.mark.parametrize("args", [[], ["--dry-run"], ["--passes", "0"], ["--settle-s", "-1"]])
def test_the_cli_on_a_missing_database_or_without_a_gpu_is_one_error_and_creates_nothing(
        args: list[str], tmp_path: Path, monkeypatch, capsys) -> None:
    """Without a GPU: where to run it; with one, on a database that is not there: that it is not there (or
    the bad --passes or --settle-s). Either way one line, exit 2, and no file."""
    from tuner.cli import main

    monkeypatch.chdir(tmp_path)
    url = f"sqlite:///{tmp_path / 'none.db'}"
    assert main(["stamp", *args, "--db", url]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1, err
    assert "run it there" in err or "does not exist" in err or "--passes 0" in err or "--settle-s -1" in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.gpu
def test_the_cli_stamps_a_real_database_on_the_gpu(tmp_path: Path) -> None:
    """A stored eager record with a made-up speed-up (9x) is timed for real and comes back with what the
    call gets; its winner and its graph record stay as they were."""
    device = kernels.current_device()
    key = "bf16:nt:16x4096x4096"
    tiled = MATMUL.default_config(Problem.from_key("matmul", key), device).as_dict()
    eager = _record(device, tiled, key=key, time_ms=0.020, cublas_ms=0.180)
    graph = _record(device, tiled, mode="graph", key=key, time_ms=0.020, cublas_ms=0.025)
    with Store(f"sqlite:///{tmp_path / 't.db'}") as store:
        store.put_many([eager, graph], on_conflict="replace")
    done = _tuner("stamp", "--passes", "2", db=tmp_path / "t.db")
    assert done.returncode == 0, done.stderr
    assert "1 stamped, 1 moved by more than 3%" in done.stdout, done.stdout
    with Store(f"sqlite:///{tmp_path / 't.db'}") as store:
        after = {r.mode: r for r in store.records(device=device.name)}
    demoted = "cuBLAS in their place" in done.stdout
    winner = Config.from_dict(after["eager"].config)
    assert kernels.is_baseline(winner) if demoted else after["eager"].config == tiled
    assert 0.3 < after["eager"].speedup < 3.0
    assert after["graph"] == graph
