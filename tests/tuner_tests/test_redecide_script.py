"""scripts/redecide.py --fast-host-only --recontest --passes N: a winner that held is contested again in a
later pass, a demoted one is not, and every new record lands in --db. The contest itself needs a GPU: a
stand-in for ``tuner.quick.recheck_eager`` plays its outcomes here (no GPU timer on a CPU), and the device
is an H100's DeviceInfo, so that the table's records are this run's."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
from pathlib import Path

import pytest

import kernels
from db import Store, dump_document
from kernels._spec import DeviceInfo

from tests.db_tests.conftest import H100, TILED, make_record

ROOT = Path(__file__).resolve().parents[2]
CUBLAS = {"VARIANT": "cublas", "num_warps": 4, "num_stages": 3}
H100_DEVICE = DeviceInfo(name=H100["device_name"], alias="h100", compute_capability="9.0", sm_count=132,
                         shared_memory_bytes=232_448)


def _script():
    spec = importlib.util.spec_from_file_location("redecide_script", ROOT / "scripts" / "redecide.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_passes_contest_the_winners_that_held_again_and_leave_demoted_ones(tmp_path: Path, monkeypatch) -> None:
    table = [make_record(m, 2048, 2048, mode=mode, config=TILED if mode == "eager" else CUBLAS)
             for m in (1, 8, 32) for mode in ("eager", "graph")]
    # An eager cuBLAS winner: not checked.
    table += [make_record(64, 2048, 2048, mode=mode, config=CUBLAS) for mode in ("eager", "graph")]
    (tmp_path / "table.json").write_text(json.dumps(dump_document(table)))
    # Outcomes per problem, pass after pass: "keep" (the winner holds, refreshed) or "cublas" (demoted).
    plays = {"fp16:nt:1x2048x2048": ["keep", "cublas", "never"], "fp16:nt:8x2048x2048": ["keep", "keep", "keep"],
             "fp16:nt:32x2048x2048": ["cublas", "never", "never"]}
    seen: list[tuple[str, float]] = []

    def stand_in(spec, problem, device, eager, graph=None, bench=None, recontest=False):
        assert recontest and device is H100_DEVICE and graph == kernels.Config.from_dict(CUBLAS)
        seen.append((problem.key, eager.time_ms))
        outcome = plays[problem.key][sum(key == problem.key for key, _ in seen) - 1]
        assert outcome != "never", f"{problem.key} was contested after it was demoted"
        config = CUBLAS if outcome == "cublas" else eager.config
        return dataclasses.replace(eager, config=config, time_ms=eager.time_ms * 0.9, tflops=eager.tflops / 0.9)

    script = _script()
    monkeypatch.setattr(script, "recheck_eager", stand_in)
    monkeypatch.setattr(kernels, "current_device", lambda *args: H100_DEVICE)
    url = f"sqlite:///{tmp_path / 'rc.db'}"
    args = argparse.Namespace(table=str(tmp_path / "table.json"), db=url, every=1, budget_s=60.0, key=None,
                              output=None, fast_host_only=True, recontest=True, passes=3, pause_s=0.0)
    script.recheck_table(args)
    assert [key for key, _ in seen] == ["fp16:nt:1x2048x2048", "fp16:nt:32x2048x2048", "fp16:nt:8x2048x2048",
                                        "fp16:nt:1x2048x2048", "fp16:nt:8x2048x2048", "fp16:nt:8x2048x2048"]
    assert seen[3][1] == seen[0][1] * 0.9, "a later pass starts from the record the earlier pass wrote"
    with Store(url) as store:
        eager = {r.problem_key: r.config for r in store.records(device=H100["device_name"], kernel="matmul")}
    assert eager == {"fp16:nt:1x2048x2048": CUBLAS, "fp16:nt:8x2048x2048": TILED, "fp16:nt:32x2048x2048": CUBLAS}
    seen.clear()
    script.recheck_table(args)  # a rerun: the first pass skips what --db decided; later passes go on
    assert [key for key, _ in seen] == ["fp16:nt:8x2048x2048", "fp16:nt:8x2048x2048"]


def test_eager_only_stores_the_eager_records_alone_and_a_rerun_skips_them(tmp_path: Path, monkeypatch) -> None:
    """scripts/redecide.py --eager-only: both contests run (the graph winner is held beside the eager
    contest), only the eager record lands in --db, and a rerun skips the problems decided there."""
    table = [make_record(m, 2048, 2048, mode=mode, config=TILED) for m in (1, 8) for mode in ("eager", "graph")]
    (tmp_path / "table.json").write_text(json.dumps(dump_document(table)))
    decided: list[str] = []

    def stand_in(spec, problem, device, candidates, bench=None, trials=1):
        decided.append(problem.key)
        mine = [r for r in table if r.problem_key == problem.key]
        return {r.mode: dataclasses.replace(r, config=CUBLAS if r.mode == "graph" else TILED) for r in mine}

    script = _script()
    monkeypatch.setattr(script, "redecide", stand_in)
    monkeypatch.setattr(script, "Bench", lambda *args, **kwargs: None)
    monkeypatch.setattr(kernels, "current_device", lambda *args: H100_DEVICE)
    url = f"sqlite:///{tmp_path / 'eager.db'}"
    argv = ["redecide.py", "--table", str(tmp_path / "table.json"), "--db", url, "--eager-only"]
    monkeypatch.setattr("sys.argv", argv)
    script.main()
    assert decided == ["fp16:nt:1x2048x2048", "fp16:nt:8x2048x2048"]
    with Store(url) as store:
        stored = store.records(device=H100["device_name"], kernel="matmul")
    assert sorted((r.problem_key, r.mode) for r in stored) == [("fp16:nt:1x2048x2048", "eager"),
                                                                ("fp16:nt:8x2048x2048", "eager")]
    decided.clear()
    script.main()
    assert decided == [], "a rerun skips the problems whose eager record is in --db"
    monkeypatch.setattr("sys.argv", argv + ["--fast-host-only"])
    with pytest.raises(SystemExit) as refused:
        script.main()
    assert refused.value.code == 2, "--eager-only with --fast-host-only is refused"
