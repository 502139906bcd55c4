"""The corpus of real model GEMM shapes (benchmarks/corpus/models.json) and its split by model.

Every nn.Linear of six public models, at seven token counts, in fp16 and bf16, with B = weight.t():
the problems users actually run. The split is by model, fixed in the data file, so that the
held-out part's shapes are ones the tuner never saw (a split by row would leak a layer's other
token counts into the tuned part).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from kernels import Problem

CORPUS_FILE = Path(__file__).resolve().parents[1] / "benchmarks" / "corpus" / "models.json"
PARTS = ("tuned", "held_out", "all")


@dataclass(frozen=True)
class CorpusEntry:
    problem: Problem
    model: str
    layers: tuple[str, ...]  # the layers of that model with this (N, K)
    part: str  # "tuned" or "held_out"


@functools.lru_cache(maxsize=1)
def _document() -> dict:
    return json.loads(CORPUS_FILE.read_text())


def entries(part: str = "all") -> list[CorpusEntry]:
    """The corpus problems of ``part`` ("tuned", "held_out" or "all"), in a stable order."""
    if part not in PARTS:
        raise ValueError(f"corpus part {part!r} is not one of {', '.join(PARTS)}")
    document = _document()
    held_out = set(document["held_out_models"])
    found: dict[str, CorpusEntry] = {}
    for model, n, k, layers in _layers(document):
        model_part = "held_out" if model in held_out else "tuned"
        if part != "all" and model_part != part:
            continue
        for dtype in document["dtypes"]:
            for m in document["token_counts"]:
                problem = Problem.from_key("matmul", f"{dtype}:nt:{m}x{n}x{k}")
                # Two models sharing a shape (none do today) keep the first, tuned part first.
                found.setdefault(problem.key, CorpusEntry(problem, model, layers, model_part))
    return list(found.values())


def corpus_problems(part: str = "all") -> list[Problem]:
    return [entry.problem for entry in entries(part)]


def _layers(document: dict) -> Iterator[tuple[str, int, int, tuple[str, ...]]]:
    """(model, N, K, layer names) for each distinct (N, K) of each model."""
    for model in document["models"]:
        by_shape: dict[tuple[int, int], list[str]] = {}
        for name, n, k in model["layers"]:
            by_shape.setdefault((int(n), int(k)), []).append(name)
        for (n, k), names in by_shape.items():
            yield model["name"], n, k, tuple(names)
