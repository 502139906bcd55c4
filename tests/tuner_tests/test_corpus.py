"""The model corpus: every problem valid, the split by model, reproducible and disjoint."""

from __future__ import annotations

import json

import pytest

import kernels
from tuner import corpus


def test_split_is_by_model_disjoint_and_covers_the_corpus() -> None:
    tuned, held_out = corpus.entries("tuned"), corpus.entries("held_out")
    assert {e.model for e in tuned}.isdisjoint({e.model for e in held_out})
    assert {e.model for e in held_out} == set(json.loads(corpus.CORPUS_FILE.read_text())["held_out_models"])
    keys = [e.problem.key for e in tuned + held_out]
    assert len(keys) == len(set(keys)) and set(keys) == {p.key for p in corpus.corpus_problems("all")}
    assert [e.problem.key for e in corpus.entries("tuned")] == [e.problem.key for e in tuned], "stable order"


def test_every_problem_is_a_linear_layer_in_both_half_types_at_every_token_count() -> None:
    document = json.loads(corpus.CORPUS_FILE.read_text())
    problems = corpus.corpus_problems("all")
    for problem in problems:
        kernels.MATMUL.check_problem(problem)
        assert problem.layout == "nt" and problem.dtype in ("fp16", "bf16")
    shapes = {(p.shape[1], p.shape[2]) for p in problems}
    expected = {(n, k) for model in document["models"] for _, n, k in model["layers"]}
    assert shapes == expected
    assert {p.shape[0] for p in problems} == set(document["token_counts"])
    assert len(problems) == len(expected) * len(document["token_counts"]) * len(document["dtypes"])


def test_unknown_part_is_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match="tuned, held_out, all"):
        corpus.entries("test")
