"""Read-only commands create nothing, and hostile inputs end in one line and exit 2 (issue 15).

In-process through ``tuner.cli.main``: each case needs no fresh interpreter.
"""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

import kernels
from kernels.dispatch import Dispatcher
from kernels.gemm import MATMUL
from tuner.cli import main


def _one_error_line(capsys: pytest.CaptureFixture) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert "Traceback" not in err and lines and lines[0].startswith("error: "), err
    return err


@pytest.mark.parametrize("command", [["list"], ["export", "-o", "out.json"]])
def test_read_only_command_on_a_missing_database_names_it_and_creates_nothing(
        command, tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    url = f"sqlite:///{tmp_path / 'no' / 'such' / 'dir' / 'x.db'}"
    assert main([*command, "--db", url]) == 2
    err = _one_error_line(capsys)
    assert url in err and "does not exist" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_tuner_db_garbage_is_a_clear_error_and_creates_no_file(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TUNER_DB", "garbage")
    assert main(["list"]) == 2
    assert "garbage does not exist" in _one_error_line(capsys)
    assert list(tmp_path.iterdir()) == []


def test_runtime_lookup_with_the_default_database_creates_no_folder(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("TUNER_DB", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    device = kernels.current_device("cpu")
    problem = kernels.Problem.from_key("matmul", "fp16:nn:16x32x32")
    assert Dispatcher(None, use_shipped=False).choose(MATMUL, problem, device).source == "default"
    assert not (tmp_path / "cache").exists()


def test_deeply_nested_import_is_one_error_and_touches_no_database(tmp_path: Path, capsys) -> None:
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 200_000 + "]" * 200_000)
    assert main(["import", str(deep), "--db", f"sqlite:///{tmp_path / 't.db'}"]) == 2
    assert "nested deeper" in _one_error_line(capsys)
    assert not (tmp_path / "t.db").exists()


def test_search_of_an_empty_problem_is_refused(tmp_path: Path, capsys) -> None:
    # The device this process computes on: in-process, --device cpu needs the interpreter, which a GPU run has off.
    device = kernels.current_device().alias
    assert main(["search", "--device", device, "--shape", "0x0x0", "--db", f"sqlite:///{tmp_path / 't.db'}"]) == 2
    assert "has no work" in _one_error_line(capsys)
    assert not (tmp_path / "t.db").exists()


def test_a_usage_error_is_one_line_with_exit_2(capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["list", "--bogus"])
    assert exited.value.code == 2
    err = _one_error_line(capsys)
    assert len(err.strip().splitlines()) == 1 and "--bogus" in err


def test_a_corrupt_database_is_named_as_damaged(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "bad.db"
    bad.write_bytes(b"SQLite format 3\x00" + bytes(range(256)) * 20)
    assert main(["list", "--db", str(bad)]) == 2
    assert "damaged" in _one_error_line(capsys)


OLD_DB = Path(__file__).resolve().parents[1] / "data" / "v1_tuner.db"


def test_list_of_a_newer_schema_names_the_release_to_install(tmp_path: Path, capsys) -> None:
    path = tmp_path / "new.db"
    shutil.copy(OLD_DB, path)
    assert main(["import", str(_export_of(OLD_DB, tmp_path, capsys)), "--db", str(path)]) == 0  # migrates
    with sqlite3.connect(path) as connection:
        connection.execute("UPDATE tuner_alembic_version SET version_num = '0099_future'")
    before = path.read_bytes()
    for command in (["list"], ["export", "-o", str(tmp_path / "o.json")]):
        assert main([*command, "--db", str(path)]) == 2
        err = _one_error_line(capsys)
        assert "0099_future" in err and "install" in err
    assert path.read_bytes() == before


def test_list_reads_an_older_schema_without_migrating_it(tmp_path: Path, capsys) -> None:
    path = tmp_path / "old.db"
    shutil.copy(OLD_DB, path)
    before = path.read_bytes()
    assert main(["list", "--db", str(path)]) == 0
    assert "h100" in capsys.readouterr().out
    assert path.read_bytes() == before, "a command that only reads must not migrate"


def _export_of(source: Path, tmp_path: Path, capsys) -> Path:
    out, copy = tmp_path / "v1.json", tmp_path / "source.db"
    shutil.copy(source, copy)  # the checked-in file is never opened, even to read
    assert main(["export", "--db", str(copy), "-o", str(out)]) == 0
    capsys.readouterr()
    return out
