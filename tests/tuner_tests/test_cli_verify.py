"""`python -m tuner verify`: the stored winners of this machine checked again with the search's check.

On the CPU the machine is the interpreter, and its stored winners are the records tuned there (device "cpu"),
in a real SQLite file. A bf16 record stands for a winner that is wrong on its machine: the interpreter's bf16
``tl.dot`` returns garbage (GPU.md), so the very kernel the record names computes a wrong product here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from db import Store
from kernels import BASELINE, Config
from tests.db_tests.conftest import make_record
from tuner.cli import main

CPU = dict(device_name="cpu", device_alias="cpu", compute_capability="", sm_count=1)
TILED = Config.make(VARIANT="tiled", BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, GROUP_SIZE_M=1, SPLIT_K=1, NUM_SM=132,
                    FLATTEN=False, EPILOGUE_SUBTILE=False, num_warps=4, num_stages=2).as_dict()


def _cpu_record(dtype: str, mode: str = "graph", config: dict = TILED):
    return make_record(16, 32, 64, dtype=dtype, layout="nn", mode=mode, config=config, triton_config=TILED, **CPU)


def _database(tmp_path: Path, *records) -> str:
    url = f"sqlite:///{tmp_path / 'tuner.db'}"
    with Store(url) as store:
        store.put_many(list(records))
    return url


@pytest.mark.interpreter
def test_right_winners_pass_and_the_exit_code_is_0(tmp_path: Path, capsys) -> None:
    url = _database(tmp_path, _cpu_record("fp16"), _cpu_record("fp16", "eager"),
                    _cpu_record("fp32", config=BASELINE.as_dict()))
    assert main(["verify", "--device", "cpu", "--db", url, "--no-shipped"]) == 0
    out = capsys.readouterr().out
    assert "3 of 3 stored winner(s) pass; 0 fail" in out
    assert "FAILED" not in out
    row = next(line.split() for line in out.splitlines() if line.startswith("database"))
    assert row[:5] == ["database", "matmul", "2", "1", "0"]


@pytest.mark.interpreter
def test_a_wrong_winner_is_named_and_the_exit_code_is_1(tmp_path: Path, capsys) -> None:
    url = _database(tmp_path, _cpu_record("fp16"), _cpu_record("bf16"))
    assert main(["verify", "--device", "cpu", "--db", url, "--no-shipped"]) == 1
    out = capsys.readouterr().out
    assert "FAILED database matmul bf16:nn:16x32x64 graph: VARIANT: tiled, BLOCK_M: 16" in out
    assert "wrong_result: wrong result: element [" in out
    assert "1 of 2 stored winner(s) pass; 1 fail" in out


def test_a_gpu_this_machine_lacks_is_a_user_error(tmp_path: Path, capsys) -> None:
    url = _database(tmp_path, _cpu_record("fp16"))
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert main(["verify", "--device", "h100", "--db", url]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --device h100: verify runs the stored winners on the GPU they are for")
    assert "--device cpu" in err and "Traceback" not in err


def test_a_gpu_with_no_stored_winners_is_named_with_those_that_have_some(tmp_path: Path, capsys) -> None:
    url = _database(tmp_path, _cpu_record("fp16"), make_record(16, 32, 64))  # the interpreter's and an H100's
    assert main(["verify", "--device", "a100", "--db", url, "--no-shipped"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --device a100: no stored winners of that GPU (GPUs with stored winners: h100)")
    assert "Traceback" not in err


def test_the_shipped_tables_gpus_are_known_without_a_database(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("TUNER_DB", raising=False)
    assert main(["verify", "--device", "a100"]) == 2
    err = capsys.readouterr().err
    known = err.split("(GPUs with stored winners: ", 1)[1].split(")", 1)[0].split(", ")
    assert {"h100", "h200"} <= set(known) and "a100" not in known  # the shipped tables' GPUs
    assert not (tmp_path / "cache").exists()


def _this_gpu() -> dict:
    import torch

    from kernels import current_device

    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    here = current_device()
    return dict(compute_capability=here.compute_capability, sm_count=here.sm_count)


@pytest.mark.gpu
def test_another_gpus_winners_are_checked_here_where_the_compute_capability_is_the_same(tmp_path: Path,
                                                                                          capsys) -> None:
    """A sibling GPU's table (an H100's on an H200): the same compiled kernels, so the check's verdict holds
    there. The record is stored under a GPU name this machine does not have, with this GPU's capability."""
    sibling = dict(device_name="Sibling GPU 80GB", device_alias="sibling", **_this_gpu())
    fp16 = make_record(64, 128, 256, dtype="fp16", layout="nn", config=TILED, triton_config=TILED, **sibling)
    url = _database(tmp_path, fp16)
    assert main(["verify", "--device", "sibling", "--db", url, "--no-shipped", "--workers", "0"]) == 0
    out = capsys.readouterr().out
    assert "checking the stored winners of Sibling GPU 80GB on this" in out
    assert "1 of 1 stored winner(s) pass; 0 fail" in out


@pytest.mark.gpu
def test_another_compute_capabilitys_winners_are_refused_here(tmp_path: Path, capsys) -> None:
    here = _this_gpu()
    other = "8.0" if here["compute_capability"] != "8.0" else "9.0"
    url = _database(tmp_path, make_record(64, 128, 256, device_name="Other GPU", device_alias="other",
                                          compute_capability=other, sm_count=here["sm_count"]))
    assert main(["verify", "--device", "other", "--db", url, "--no-shipped", "--workers", "0"]) == 2
    err = capsys.readouterr().err
    assert f"error: --device other: its winners are for compute capability {other} and this machine's" in err


@pytest.mark.interpreter
def test_a_missing_database_is_a_user_error(tmp_path: Path, capsys) -> None:
    assert main(["verify", "--device", "cpu", "--db", f"sqlite:///{tmp_path / 'none.db'}"]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert not (tmp_path / "none.db").exists()


@pytest.mark.interpreter
def test_nothing_stored_is_said(tmp_path: Path, capsys) -> None:
    url = _database(tmp_path, make_record(16, 32, 64))  # an H100 record: not this machine's
    assert main(["verify", "--device", "cpu", "--db", url, "--no-shipped"]) == 0
    assert "no stored winner for cpu; nothing to verify" in capsys.readouterr().out


@pytest.mark.interpreter
def test_without_a_database_the_shipped_tables_alone_are_read_and_nothing_is_created(tmp_path: Path, capsys,
                                                                                      monkeypatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("TUNER_DB", raising=False)
    assert main(["verify", "--device", "cpu"]) == 0  # the shipped tables hold no record of the interpreter
    assert "no stored winner for cpu" in capsys.readouterr().out
    assert not (tmp_path / "cache").exists()
