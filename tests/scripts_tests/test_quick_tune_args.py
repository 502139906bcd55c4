"""scripts/quick_tune.py's problem selection (--kernel, --corpus, --keys, --m), read before any GPU work: the
script itself tunes on a GPU."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tuner import corpus

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def _problems_of(**given):
    sys.path.insert(0, str(SCRIPTS))
    try:
        import bench_dispatch
    finally:
        sys.path.remove(str(SCRIPTS))
    args = dict(key=None, keys=None, corpus=None, dtype=None, limit=0, kernel="matmul", m=None)
    return bench_dispatch.problems_of(argparse.Namespace(**{**args, **given}))


def test_the_gated_corpus_narrowed_by_rows_of_a() -> None:
    problems = _problems_of(kernel="gated_matmul", corpus="all", m=[1, 8])
    assert {p.kernel for p in problems} == {"gated_matmul"}
    assert {p.shapes[0][0] for p in problems} == {1, 8}
    expected = [e.problem.key for e in corpus.gated_entries("all") if e.problem.shapes[0][0] in (1, 8)]
    assert [p.key for p in problems] == expected and len(expected) == 6 * 2 * 2


def test_keys_are_problems_of_the_kernel_asked_and_a_comment_is_skipped(tmp_path: Path) -> None:
    keys = tmp_path / "keys.txt"
    keys.write_text("# a header\nbf16:nt:64x28672x8192\nbf16:nt:64x2816x2048  # why this one\n")
    problems = _problems_of(kernel="gated_matmul", keys=str(keys))
    assert [(p.kernel, p.key) for p in problems] == [("gated_matmul", "bf16:nt:64x28672x8192"),
                                                     ("gated_matmul", "bf16:nt:64x2816x2048")]
    assert [p.kernel for p in _problems_of(keys=str(keys))] == ["matmul", "matmul"], "matmul unless told"
    assert _problems_of(keys=str(keys), m=[1]) == [], "no problem of those has one row"


def test_the_bias_corpus_is_the_biased_qkv_projections_as_matmul_bias_problems() -> None:
    problems = _problems_of(kernel="matmul_bias", corpus="tuned", m=[1])
    assert [(p.kernel, p.key) for p in problems] == [("matmul_bias", "fp16:nt:1x4608x3584"),
                                                     ("matmul_bias", "bf16:nt:1x4608x3584")]
