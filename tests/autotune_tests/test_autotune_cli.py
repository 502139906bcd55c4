"""The CLI on a user kernel: search --problems and --recorded, list, explain, export and import; and the ported
tutorials' outputs. Timing goes through the kernels' test double (``_kernels.FakeTimer``): no GPU timer here."""

from __future__ import annotations

import json

import pytest
import torch

import kernels
from db import Store
from tuner.cli import main

from . import _kernels
from ._kernels import DEVICE, call

TARGET = "tests.autotune_tests._kernels:cli_kernel"


def _records(db_url: str) -> list:
    with Store(db_url) as store:
        return store.records()


def test_search_of_problems_file_stores_the_fastest_checked_config(db_url, tmp_path, capsys) -> None:
    problems = tmp_path / "keys.json"
    problems.write_text(json.dumps([{"n": 40, "dtypes": ["float32", "float32"]}]))
    search = ["search", "--db", db_url, "--kernel", TARGET, "--problems", str(problems),
              "--workers", "0"]  # in process, so that this process's timer double counts the timings
    assert main(search) == 0
    (record,) = _records(db_url)
    assert record.kernel == "tests.autotune_tests.scale" and record.config["BLOCK"] == 32  # the timer's 1.0 ms
    assert record.problem_key.startswith("n=40;float32,float32@")
    # Resumable: a second run finds the study done and measures nothing more.
    calls = _kernels.CLI_TIMER.calls
    assert main(search) == 0
    assert _kernels.CLI_TIMER.calls == calls

    assert main(["list", "--db", db_url, "--kernel", "tests.autotune_tests.scale"]) == 0
    assert "n=40;float32,float32@" in capsys.readouterr().out
    assert main(["explain", "--db", db_url, "--kernel", TARGET, "n=40;float32,float32",
                 "n=41;float32,float32"]) == 0
    out = capsys.readouterr().out
    assert "record" in out and "BLOCK: 32" in out and "default" in out

    exported = tmp_path / "out.json"
    assert main(["export", "--db", db_url, "-o", str(exported)]) == 0
    other = f"sqlite:///{tmp_path / 'other.db'}"
    assert main(["import", "--db", other, str(exported)]) == 0
    assert [r.config for r in _records(other)] == [record.config]


def test_search_of_recorded_keys_tunes_what_record_mode_saw(db_url, monkeypatch) -> None:
    monkeypatch.setattr(_kernels.cli_kernel, "db", db_url)
    monkeypatch.setattr(_kernels.cli_kernel, "mode", "record")
    _kernels.cli_kernel.clear()
    call(_kernels.cli_kernel, 24)
    assert _records(db_url) == []
    assert main(["search", "--db", db_url, "--kernel", TARGET, "--recorded", "--workers", "0"]) == 0
    assert [r.problem_key.split("@")[0] for r in _records(db_url)] == ["n=24;float32,float32"]
    _kernels.cli_kernel.clear()


def test_search_of_a_space_kernel_in_the_timing_worker_checks_against_the_first_config(db_url, tmp_path) -> None:
    problems = tmp_path / "keys.json"
    problems.write_text(json.dumps([{"n": 20, "dtypes": ["float32", "float32"]}]))
    target = "tests.autotune_tests._kernels:space_kernel"
    assert main(["search", "--db", db_url, "--kernel", target, "--problems", str(problems),
                 "--trials", "5", "--seed", "0"]) == 0
    (record,) = _records(db_url)
    assert record.config["BLOCK"] <= 32 and record.trials >= 1


@pytest.mark.parametrize("argv, message", [
    (["--kernel", "tests.autotune_tests._kernels:nothing", "--problems", "x.json"], "is not a kernel decorated"),
    (["--kernel", "no_such_module_x:k", "--recorded"], "cannot import no_such_module_x"),
    (["--kernel", TARGET], "give --recorded or --problems FILE"),
    (["--kernel", TARGET, "--shape", "16x16x16", "--recorded"], "--shape apply to the tuner's own kernels"),
])
def test_bad_user_kernel_arguments_exit_2_with_the_fix(db_url, argv, message, capsys) -> None:
    assert main(["search", "--db", db_url, *argv]) == 2
    assert message in capsys.readouterr().err


def test_a_user_record_with_an_impossible_time_is_not_imported(db_url, tmp_path, capsys) -> None:
    from db import plausibility_problems

    record = {"dtype": "any", "layout": "any", "kernel": "my.kernel", "problem_key": "n=1;@abc", "time_ms": 0.0}
    assert any("time_ms must be above 0" in p for p in plausibility_problems(record))


# The tutorials, ported: right outputs under kernels.autotune ---------------------------------------------

def test_ported_tutorials_compute_what_torch_does(db_url, monkeypatch) -> None:
    from examples import layer_norm, matmul, softmax

    timer = _kernels.FakeTimer()
    for tuner in (softmax.softmax_kernel, layer_norm.layer_norm_kernel, layer_norm.layer_norm_space_kernel,
                  matmul.matmul_kernel):
        monkeypatch.setattr(tuner, "db", db_url)
        monkeypatch.setattr(tuner, "_do_bench", timer)
        tuner.clear()
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 37, generator=gen).to(DEVICE)
    torch.testing.assert_close(softmax.softmax(x), torch.softmax(x, 1))
    w, b = torch.rand(37, generator=gen).to(DEVICE), torch.randn(37, generator=gen).to(DEVICE)
    want = torch.nn.functional.layer_norm(x, (37,), w, b)
    torch.testing.assert_close(layer_norm.layer_norm(x, w, b), want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(layer_norm.layer_norm(x, w, b, kernel=layer_norm.layer_norm_space_kernel), want,
                               atol=1e-5, rtol=1e-5)
    a = torch.randn(16, 32, generator=gen).half().to(DEVICE)
    bm = torch.randn(32, 24, generator=gen).half().to(DEVICE)
    torch.testing.assert_close(matmul.matmul(a, bm).float(), a.float() @ bm.float(), atol=2e-2, rtol=1e-2)
    assert len(_records(db_url)) == 4
