"""``python -m tuner`` end to end: search, list, export and import through real processes and SQLite files.

Each process costs seconds (torch, triton and optuna imports), so the steps of one workflow share a
test and the error paths that need no fresh process call ``tuner.cli.main`` in this one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import kernels
from db import Store
from tuner.cli import main

ROOT = Path(__file__).resolve().parents[2]
ON_GPU = torch.cuda.is_available()
# Without a GPU the CLI searches under Triton's interpreter. With one it searches the GPU itself (in-process,
# no worker pool): the GPU image's numpy (>= 2.4) breaks triton 3.6's interpreter (GPU.md).
SEARCH_ON = ["--device", "auto", "--workers", "0"] if ON_GPU else ["--device", "cpu"]
DEVICE = kernels.current_device()
SHAPE = "16x32x32"
KEY = f"fp16:nn:{SHAPE}"


def _env(tmp_path: Path, interpret: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("TUNER_DB", "TRITON_INTERPRET")}
    # Keep the caller's PYTHONPATH after the project: on the GPU machine optuna comes from there.
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env.update(PYTHONPATH=path, XDG_CACHE_HOME=str(tmp_path / "cache"),
               TUNER_DB=f"sqlite:///{tmp_path / 'unused-default.db'}")
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    return env


def tuner(tmp_path: Path, *args: str, interpret: bool = not ON_GPU) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tuner", *args], cwd=ROOT, env=_env(tmp_path, interpret),
                          capture_output=True, text=True, timeout=300)


def _records(url: str, mode: str | None = None) -> list:
    """The database's records (of one dispatch mode, if given; a search stores one per mode)."""
    with Store(url) as store:
        return [r for r in store.records() if mode is None or r.mode == mode]


@pytest.fixture(scope="module")
def tuned(tmp_path_factory) -> tuple[str, subprocess.CompletedProcess, Path]:
    """A database holding one matmul problem tuned on the CPU by the CLI."""
    tmp = tmp_path_factory.mktemp("tuned")
    url = f"sqlite:///{tmp / 'tuned.db'}"
    done = tuner(tmp, "search", *SEARCH_ON, "--shape", SHAPE, "--trials", "3", "--seed", "0", "--db", url)
    return url, done, tmp


def test_search_stores_a_winner(tuned) -> None:
    url, done, tmp = tuned
    assert done.returncode == 0, done.stderr
    assert f"tuning 1 matmul problem(s) on {DEVICE.name} ({DEVICE.alias})" in done.stdout
    assert "trial 3/3" in done.stdout and "graph winner: VARIANT:" in done.stdout
    assert "eager winner: VARIANT:" in done.stdout
    assert sorted(r.mode for r in _records(url)) == ["eager", "graph"]
    [record] = _records(url, "graph")
    assert (record.device_name, record.kernel, record.problem_key, record.trials) == (DEVICE.name, "matmul", KEY, 3)
    assert not (tmp / "unused-default.db").exists(), "--db must win over TUNER_DB"


def test_list_export_and_import_round_trip(tuned, tmp_path, capsys) -> None:
    url, done, _ = tuned
    assert done.returncode == 0, done.stderr
    listed = tuner(tmp_path, "list", "--db", url)
    assert listed.returncode == 0, listed.stderr
    assert KEY in listed.stdout and DEVICE.alias in listed.stdout and "matmul" in listed.stdout
    assert "eager" in listed.stdout and "graph" in listed.stdout

    exported = tmp_path / "records.json"
    out = tuner(tmp_path, "export", "--db", url, "-o", str(exported))
    assert out.returncode == 0, out.stderr
    assert "exported 2 record(s)" in out.stdout  # the problem's eager and graph winners
    assert json.loads(exported.read_text())["records"][0]["problem_key"] == KEY

    fresh = f"sqlite:///{tmp_path / 'fresh.db'}"
    imported = tuner(tmp_path, "import", str(exported), "--db", fresh)
    assert imported.returncode == 0, imported.stderr
    assert "2 new, 0 replaced, 0 kept" in imported.stdout
    assert _records(fresh) == _records(url)

    assert main(["import", str(exported), "--db", fresh]) == 0  # again: the same record, not faster
    assert "0 new, 0 replaced, 2 kept" in capsys.readouterr().out
    assert _records(fresh) == _records(url)


def test_import_of_broken_file_exits_2_and_leaves_db_unchanged(tuned, tmp_path, capsys) -> None:
    url, done, _ = tuned
    assert done.returncode == 0, done.stderr
    exported = tmp_path / "records.json"
    assert main(["export", "--db", url, "-o", str(exported)]) == 0
    document = json.loads(exported.read_text())
    good = dict(document["records"][0], problem_key="fp16:nn:16x32x64", shapes=[[16, 32, 64]])
    bad = dict(document["records"][0], config={**document["records"][0]["config"], "BLOCK_M": 17})
    document["records"] = [good, bad]
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps(document))
    before = _records(url)
    capsys.readouterr()

    assert main(["import", str(broken), "--db", url]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "nothing was imported" in err and "BLOCK_M=17" in err
    assert "Traceback" not in err
    assert _records(url) == before

    broken.write_text("{not json")
    assert main(["import", str(broken), "--db", url]) == 2
    assert "not JSON" in capsys.readouterr().err
    assert _records(url) == before


def test_grouped_search_tunes_a_group(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'grouped.db'}"
    group = "16x32x32+8x16x32"
    done = tuner(tmp_path, "search", "--kernel", "grouped_matmul", *SEARCH_ON, "--shape", group,
                 "--trials", "2", "--seed", "0", "--db", url)
    assert done.returncode == 0, done.stderr
    [record] = _records(url, "graph")
    assert (record.kernel, record.problem_key, record.shapes) == ("grouped_matmul", f"fp16:nn:{group}",
                                                                  ((16, 32, 32), (8, 16, 32)))


def test_moe_search_tunes_an_expert_group(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'moe.db'}"
    group = "16x32x32+0x32x32+8x32x32"
    done = tuner(tmp_path, "search", "--kernel", "moe_matmul", *SEARCH_ON, "--shape", group,
                 "--trials", "2", "--seed", "0", "--db", url)
    assert done.returncode == 0, done.stderr
    assert "measured" in done.stdout and "waiting for compiles" in done.stdout, "the wall-time summary line"
    [record] = _records(url, "graph")
    assert (record.kernel, record.problem_key) == ("moe_matmul", f"fp16:nn:{group}")


def test_moe_gated_search_tunes_the_fused_gate_up_product(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'moe_gated.db'}"
    group = "16x32x32+0x32x32+8x32x32"  # N: the output's width (the gate's); the weights hold 2N = 64 columns
    done = tuner(tmp_path, "search", "--kernel", "moe_gated_matmul", *SEARCH_ON, "--layout", "nt", "--shape", group,
                 "--trials", "2", "--seed", "0", "--db", url)
    assert done.returncode == 0, done.stderr
    records = _records(url)
    assert {(r.kernel, r.problem_key) for r in records} == {("moe_gated_matmul", f"fp16:nt:{group}")}
    assert {r.mode for r in records} == {"eager", "graph"}
    listed = tuner(tmp_path, "list", "--kernel", "moe_gated_matmul", "--db", url)
    assert listed.returncode == 0 and "moe_gated_matmul" in listed.stdout, listed.stderr


@pytest.mark.skipif(ON_GPU, reason="this machine has the GPU the test pretends is missing")
def test_gpu_device_without_gpu_exits_2_pointing_to_device_cpu(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'never.db'}"
    done = tuner(tmp_path, "search", "--device", "h100", "--shape", SHAPE, "--trials", "1", "--db", url,
                 interpret=False)
    assert done.returncode == 2
    assert done.stderr.startswith("error: --device h100") and "--device cpu" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "never.db").exists()


@pytest.mark.parametrize("args, message", [
    (["--shape", "16x32"], "--shape '16x32' must be MxNxK"),
    (["--shape", "16x32x32", "--layout", "nz"], "--layout one of nn, nt, tn, tt"),
    (["--kernel", "grouped_matmul", "--dtype", "fp32", "--shape", SHAPE], "does not take --dtype fp32"),
    (["--kernel", "conv", "--shape", SHAPE], "unknown kernel 'conv'"),
    (["--trials", "0", "--shape", SHAPE], "--trials 0 must be at least 1"),
    (["--sampler", "annealing", "--shape", SHAPE], "--sampler annealing is not one of"),
    (["--ahead", "0", "--shape", SHAPE], "--ahead 0 must be at least 1"),
    (["--eager-passes", "0", "--shape", SHAPE], "--eager-passes 0 must be at least 1"),
    (["--budget", "ten", "--shape", SHAPE], "--budget 'ten' must be a positive number of trials (40) or seconds"),
    (["--budget", "0s", "--shape", SHAPE], "--budget '0s' must be"),
    (["--kernel", "moe_matmul", "--shape", "16x32x32+8x64x32"], "shares one N and one K"),
])
def test_bad_search_arguments_exit_2_with_a_message(args, message, tmp_path, capsys) -> None:
    # --device auto is this machine's GPU, or cpu (the interpreter tests/conftest.py turned on) without one.
    db = tmp_path / "never.db"
    assert main(["search", "--device", "auto", "--db", f"sqlite:///{db}", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and message in err
    assert not db.exists()


def test_devices_lists_what_this_process_sees(capsys) -> None:
    assert main(["devices"]) == 0
    out = capsys.readouterr().out
    if torch.cuda.is_available():
        assert "cuda:0" in out and "alias=" in out
    else:
        assert "no GPU visible" in out and "--device cpu" in out


def test_import_conflict_under_on_conflict_error_exits_2(tuned, tmp_path, capsys) -> None:
    url, done, _ = tuned
    assert done.returncode == 0, done.stderr
    exported = tmp_path / "records.json"
    assert main(["export", "--db", url, "-o", str(exported)]) == 0
    before = _records(url)
    assert main(["import", str(exported), "--db", url, "--on-conflict", "error"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "--on-conflict" in err
    assert _records(url) == before


def test_import_of_missing_file_exits_2(tmp_path, capsys) -> None:
    assert main(["import", str(tmp_path / "missing.json"), "--db", f"sqlite:///{tmp_path / 'x.db'}"]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_import_with_unknown_on_conflict_exits_2(tmp_path, capsys) -> None:
    document = tmp_path / "empty.json"
    document.write_text(json.dumps({"schema": "triton-tuner/records", "schema_version": 1, "records": []}))
    assert main(["import", str(document), "--db", f"sqlite:///{tmp_path / 'x.db'}", "--on-conflict", "newest"]) == 2
    assert "on_conflict 'newest' is not one of" in capsys.readouterr().err


def test_budget_takes_trials_seconds_or_both() -> None:
    from tuner.commands import parse_budget
    from tuner.search import Budget

    assert parse_budget(["40"]) == Budget(40, None)
    assert parse_budget(["30s"]) == Budget(1_000_000, 30.0)
    assert parse_budget(["25", "2.5s"]) == Budget(25, 2.5)


def test_search_stops_at_a_seconds_budget(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'budget.db'}"
    # --no-shipped rides along: the flag reaches the search (tests/tuner_tests/test_search.py checks what it does)
    done = tuner(tmp_path, "search", *SEARCH_ON, "--shape", SHAPE, "--budget", "1s", "--budget", "50",
                 "--seed", "0", "--no-shipped", "--db", url)
    assert done.returncode == 0, done.stderr
    [record] = _records(url, "graph")
    assert 1 <= record.trials < 50


def test_the_eager_passes_default_is_the_searchs() -> None:
    """The CLI keeps Optuna out of its import, so it spells the default out: it must be the search's."""
    from tuner.cli import build_parser
    from tuner.search import EAGER_PASSES

    assert build_parser().parse_args(["search"]).eager_passes == EAGER_PASSES


@pytest.mark.parametrize("command", [["search"], ["explain", "--device", "h100"]])
def test_the_corpus_choices_are_the_corpus_parts(command) -> None:
    """The CLI spells the corpus parts out (tuner.corpus imports kernels): they must be the corpus's own."""
    from tuner.cli import CORPUS_PARTS, build_parser
    from tuner.corpus import PARTS

    assert sorted(CORPUS_PARTS) == sorted(PARTS)
    parser = build_parser()
    for part in PARTS:
        assert parser.parse_args([*command, "--corpus", part]).corpus == part
    with pytest.raises(SystemExit):
        parser.parse_args([*command, "--corpus", "not-a-part"])
