"""Fuzzing the command line in this process: every argument list ends in exit 0 (or 1: nothing to
export) or in exit 2 with an ``error:`` line; never a traceback, never a hang, and an error leaves the
database as it was. Search's shape, dtype, layout and kernel arguments are fuzzed through the function
that turns them into problems (a valid search would run for minutes under the interpreter)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

import kernels
from tuner import commands
from tuner.cli import UserError, main

from .conftest import examples, time_limit
from .test_fuzz_import import VALID

pytestmark = pytest.mark.fuzz


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict[str, str]:
    """A database with one record, and files an import may be pointed at."""
    tmp = tmp_path_factory.mktemp("cli")
    db = tmp / "t.db"
    assert main(["import", _write(tmp / "valid.json", json.dumps(VALID)), "--db", str(db)]) == 0
    forged = json.loads(json.dumps(VALID))
    forged["records"][0].update(time_ms=1e-300, tflops=1e300)
    (tmp / "folder").mkdir()
    return {"DB": str(db), "VALID": str(tmp / "valid.json"), "FORGED": _write(tmp / "forged.json", json.dumps(forged)),
            "DEEP": _write(tmp / "deep.json", "[" * 100_000), "BINARY": _write_bytes(tmp / "b.json", b"\xff\xfe\x00"),
            "FOLDER": str(tmp / "folder"), "MISSING": str(tmp / "missing.json"), "OUT": str(tmp / "out.json"),
            "NODB": f"sqlite:///{tmp / 'no' / 'x.db'}"}


def _write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def _write_bytes(path: Path, data: bytes) -> str:
    path.write_bytes(data)
    return str(path)


_TOKENS = ["list", "export", "import", "devices", "--db", "DB", "NODB", "--device", "h100", "cpu", "--kernel",
           "matmul", "nope", "-o", "OUT", "FOLDER", "VALID", "FORGED", "DEEP", "BINARY", "MISSING",
           "--on-conflict", "faster", "error", "keep", "bogus", "-v", "--", "-", "", "\x00"]
_token = st.sampled_from(_TOKENS) | st.text(max_size=6)
# Mostly a subcommand followed by its options in pairs, so that most cases get past argparse.
_pairs = st.sampled_from([["--db", "DB"], ["--db", "NODB"], ["-o", "OUT"], ["-o", "FOLDER"], ["--device", "h100"],
                          ["--kernel", "matmul"], ["--on-conflict", "error"], ["--on-conflict", "bogus"], ["VALID"],
                          ["FORGED"], ["DEEP"], ["BINARY"], ["FOLDER"], ["MISSING"]]) | _token.map(lambda t: [t])
argvs = (st.builds(lambda command, rest: [command, *[t for pair in rest for t in pair]],
                   st.sampled_from(["list", "export", "import", "devices"]), st.lists(_pairs, max_size=4))
         | st.lists(_token, max_size=7))


@settings(max_examples=examples(150))
@given(argv=argvs)
def test_every_argument_list_exits_cleanly_with_one_error_line(world, argv, capsys) -> None:
    argv = [world.get(token, token) for token in argv]
    before = Path(world["DB"]).read_bytes()
    with time_limit(20):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse: --help, or a usage error
            code = exc.code
    out, err = capsys.readouterr()
    assert "Traceback" not in err and "Traceback" not in out
    assert code in (0, 1, 2), (argv, code, err)
    event(f"exit {code}" + (f" ({argv[0]})" if argv and argv[0] in _TOKENS[:4] else ""))
    if code == 2:
        assert err.startswith("error: "), (argv, err)
        assert Path(world["DB"]).read_bytes() == before, argv


_shape_texts = st.lists(st.text(alphabet="0123456789x+- ", max_size=14)
                        | st.builds(lambda *d: "x".join(map(str, d)), *[st.integers(-2, 2**40)] * 3), min_size=1, max_size=3)


@settings(max_examples=examples(300))
@given(kernel=st.sampled_from(["matmul", "grouped_matmul", "moe_matmul"]),
       dtype=st.lists(st.sampled_from(["fp16", "bf16", "fp32", "int8", ""]), max_size=2) | st.none(),
       layout=st.lists(st.sampled_from(["nn", "nt", "tn", "tt", "n", "xx"]), max_size=2) | st.none(),
       shape=_shape_texts)
def test_search_problem_arguments_give_problems_with_work_or_a_user_error(kernel, dtype, layout, shape) -> None:
    args = argparse.Namespace(kernel=kernel, dtype=dtype, layout=layout, shape=shape)
    with time_limit(5):
        try:
            problems = commands._problems(args, kernels.current_device("cpu"))
        except UserError as exc:
            assert str(exc) and "\n" not in str(exc)
            return
    assert problems and all(p.flops > 0 and max(max(s) for s in p.shapes) <= 2**24 for p in problems)
