"""`python -m tuner explain`: which config dispatch runs for a problem on a GPU, and why, read from a real SQLite
file and the shipped tables, with no GPU (the device named by its records) and without writing anything."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from db import Store
from tests.db_tests.conftest import make_record
from tuner.cli import main
from tuner.corpus import corpus_problems

# A whole matmul config (every parameter of today's space), as the search stores it
TILE = dict(VARIANT="tiled", BLOCK_M=16, BLOCK_N=64, BLOCK_K=64, GROUP_SIZE_M=8, SPLIT_K=1, NUM_SM=132,
            FLATTEN=False, EPILOGUE_SUBTILE=False, num_warps=4, num_stages=4)


@pytest.fixture(autouse=True)
def no_default_database(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The default database is a file that does not exist: explain must read around it, not create it."""
    default = tmp_path / "default" / "tuner.db"
    monkeypatch.setenv("TUNER_DB", f"sqlite:///{default}")
    return default


def _rows(out: str) -> dict[tuple[str, str], tuple[str, str]]:
    """(problem, mode) -> (source, config) of explain's table."""
    lines = [line for line in out.splitlines() if line and not line.startswith("#")]
    header, *rows = lines
    starts = [header.index(name) for name in ("problem", "mode", "source", "config")]
    return {(row[starts[0]:starts[1]].strip(), row[starts[1]:starts[2]].strip()):
            (row[starts[2]:starts[3]].strip(), row[starts[3]:].strip()) for row in rows}


def test_a_record_a_near_problem_and_a_far_one_on_a_gpu_named_by_its_records(tmp_path: Path, capsys) -> None:
    url = f"sqlite:///{tmp_path / 't.db'}"
    with Store(url) as store:  # a Triton win by 20% on 16x4096x4096, in graph replays
        store.put(make_record(16, 4096, 4096, mode="graph", config=TILE, triton_config=TILE, time_ms=0.050,
                              cublas_ms=0.060, triton_ms=0.050))
    keys = ["fp16:nt:16x4096x4096", "fp16:nt:16x4096x4608", "fp16:nt:16x512x512"]
    assert main(["explain", "--device", "h100", "--db", url, "--no-shipped", "--mode", "graph", *keys]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# NVIDIA H100 80GB HBM3 (h100, 132 SMs)")
    rows = _rows(out)
    assert rows[("fp16:nt:16x4096x4096", "graph")][0] == "database"
    assert rows[("fp16:nt:16x4096x4608", "graph")][0] == "nearest:fp16:nt:16x4096x4096"
    assert rows[("fp16:nt:16x4096x4608", "graph")][1] == rows[("fp16:nt:16x4096x4096", "graph")][1]
    far_source, far_config = rows[("fp16:nt:16x512x512", "graph")]
    assert far_source.startswith("cublas:") and "VARIANT: cublas" in far_config
    assert {mode for _, mode in rows} == {"graph"}


def test_the_shipped_tables_alone_explain_a_corpus_part_in_both_modes(capsys) -> None:
    assert main(["explain", "--device", "h200", "--kernel", "gated_matmul", "--corpus", "unseen"]) == 0
    rows = _rows(capsys.readouterr().out)
    problems = corpus_problems("unseen", "gated_matmul")
    assert set(rows) == {(p.key, mode) for p in problems for mode in ("eager", "graph")}
    assert any(source.startswith("nearest:") for source, _ in rows.values()), "the H200 table is near some"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without a GPU")
def test_auto_on_a_machine_without_a_gpu_names_the_gpus_it_could_explain(capsys) -> None:
    assert main(["explain", "bf16:nt:8x4096x4096"]) == 2
    err = capsys.readouterr().err
    assert "this machine sees no GPU: name one with --device" in err and "h100" in err and "h200" in err


@pytest.mark.parametrize("argv, message", [
    (["explain", "--device", "a100", "bf16:nt:8x4096x4096"], "--device a100: no records of that GPU"),
    (["explain", "--device", "h100", "bf16:nt:8x4096"], "'bf16:nt:8x4096' is not a matmul problem key"),
    (["explain", "--device", "h100"], "name the problems: KEYs"),
    (["explain", "--device", "h100", "--kernel", "conv", "fp16:nt:8x8x8"], "--kernel conv: unknown kernel 'conv'"),
    (["explain", "--device", "h100", "--kernel", "gated_matmul", "--corpus", "tuned", "--qkv"],
     "--corpus tuned --kernel gated_matmul"),
])
def test_bad_input_is_one_line_that_names_it(argv: list[str], message: str, capsys) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err


def test_it_writes_nothing_and_refuses_a_database_that_is_not_there(tmp_path: Path, no_default_database: Path,
                                                                  capsys) -> None:
    assert main(["explain", "--device", "h100", "bf16:nt:8x4096x4096"]) == 0, "the default database may be absent"
    missing = tmp_path / "typo.db"
    assert main(["explain", "--device", "h100", "--db", f"sqlite:///{missing}", "bf16:nt:8x4096x4096"]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert not missing.exists() and not no_default_database.parent.exists(), "a read-only command creates no file"
