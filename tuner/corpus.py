"""The corpus of real model GEMM shapes (benchmarks/corpus/models.json) and its split by model.

Every nn.Linear of six public models, at seven token counts, in fp16 and bf16, with B = weight.t():
the problems users actually run. The split is by model, fixed in the data file, so that the
held-out part's shapes are ones the tuner never saw (a split by row would leak a layer's other
token counts into the tuned part).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from kernels import Problem

CORPUS_FILE = Path(__file__).resolve().parents[1] / "benchmarks" / "corpus" / "models.json"
# Models outside the corpus, in the same form: never tuned, never shipped, never learned from. Where the
# corpus's split measures the fallback on one fixed pair of models, these are shapes nobody tuned at all.
UNSEEN_FILE = CORPUS_FILE.with_name("unseen.json")
PARTS = ("tuned", "held_out", "all", "unseen")  # "all": the corpus (tuned and held out), not the unseen models


@dataclass(frozen=True)
class CorpusEntry:
    problem: Problem
    model: str
    layers: tuple[str, ...]  # the layers of that model with this (N, K)
    part: str  # "tuned", "held_out" or "unseen"


@functools.lru_cache(maxsize=2)
def _document(path: Path = CORPUS_FILE) -> dict:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        # The corpus ships with the repository (benchmarks/corpus/), not inside the installed packages.
        raise ValueError(f"the model corpus file {path} is not here: it is part of a triton-tuner checkout "
                         "(benchmarks/corpus/), not of the installed package; run from a checkout, or list "
                         "the problems in a file and pass --problems FILE") from None


def entries(part: str = "all") -> list[CorpusEntry]:
    """The corpus problems of ``part`` ("tuned", "held_out" or "all"), or the unseen models' ("unseen"), in
    a stable order."""
    return _entries(part, "matmul", _layers)


Shapes = Callable[[dict], Iterator[tuple[str, int, int, tuple[str, ...]]]]


def _entries(part: str, kernel: str, shapes: Shapes) -> list[CorpusEntry]:
    """``kernel``'s problem for each (model, N, K, layer names) of ``shapes`` in ``part``, per dtype and token
    count. The unseen part leaves out the problems the corpus holds (tuned or held out there)."""
    if part not in PARTS:
        raise ValueError(f"corpus part {part!r} is not one of {', '.join(PARTS)}")
    if part == "unseen":
        known = {entry.problem.key for corpus_shapes in _CORPUS_SHAPES.get(kernel, (shapes,))
                 for entry in _entries("all", kernel, corpus_shapes)}
        return [entry for entry in _problems(_document(UNSEEN_FILE), kernel, shapes, lambda model: part)
                if entry.problem.key not in known]
    document = _document()
    held_out = set(document["held_out_models"])
    return _problems(document, kernel, shapes, lambda model: "held_out" if model in held_out else "tuned", part)


def _problems(document: dict, kernel: str, shapes: Shapes, part_of: Callable[[str], str], part: str = "all"
              ) -> list[CorpusEntry]:
    """The problems of ``document``'s models whose part (``part_of(model)``) is ``part`` (or any, "all")."""
    found: dict[str, CorpusEntry] = {}
    for model, n, k, layers in shapes(document):
        model_part = part_of(model)
        if part != "all" and model_part != part:
            continue
        for dtype in document["dtypes"]:
            for m in document["token_counts"]:
                problem = Problem.from_key(kernel, f"{dtype}:nt:{m}x{n}x{k}")
                # Two models sharing a shape (none do today) keep the first, tuned part first.
                found.setdefault(problem.key, CorpusEntry(problem, model, layers, model_part))
    return list(found.values())


def corpus_problems(part: str = "all", kernel: str = "matmul", qkv: bool = False) -> list[Problem]:
    """The corpus problems of ``part`` for ``kernel``: every nn.Linear for ``matmul``; each model's MLP gate
    and up projections, stacked, for ``gated_matmul`` (how scripts/_layers.py runs a decoder layer); each
    model's biased query, key and value projections, stacked, for ``matmul_bias``.
    ``qkv``: instead of the Linears, each model's query, key and value projections stacked (``matmul`` only)."""
    if qkv:
        if kernel != "matmul":
            raise ValueError(f"the stacked query/key/value projections are matmul problems, not {kernel!r} "
                             "(their biased ones are --kernel matmul_bias's problems)")
        return [entry.problem for entry in qkv_entries(part)]
    if kernel == "matmul":
        return [entry.problem for entry in entries(part)]
    if kernel == "gated_matmul":
        return [entry.problem for entry in gated_entries(part)]
    if kernel == "matmul_bias":
        return [entry.problem for entry in bias_entries(part)]
    raise ValueError(f"the corpus has matmul, gated_matmul and matmul_bias problems, not {kernel!r}")


def gated_entries(part: str = "all") -> list[CorpusEntry]:
    """Each SiLU-gated MLP of the corpus as one ``gated_matmul`` problem per dtype and token count:
    silu(x @ W_gate.t()) * (x @ W_up.t()) with the two weights stacked, N the MLP's width. A gate and an up
    projection pair up by their prefix ("mlp.gate_proj" with "mlp.up_proj"); a "gate_up_proj" is the pair
    already stacked (N halved). Models whose MLP gates with another activation (Gemma-2: GELU) have none."""
    return _entries(part, "gated_matmul", _gated_layers)


def _gated_layers(document: dict) -> Iterator[tuple[str, int, int, tuple[str, ...]]]:
    """(model, N, K, layer names) of each gate/up pair of each SiLU-gated model."""
    for model in document["models"]:
        if model["config"].get("hidden_act") == "silu":
            for names, n, k in _gated_pairs(model["layers"]):
                yield model["name"], n, k, names


def _gated_pairs(layers: list) -> Iterator[tuple[tuple[str, ...], int, int]]:
    """(layer names, N, K) of each gate/up pair in a model's layer list."""
    shapes = {name: (int(n), int(k)) for name, n, k in layers}
    for name, (n, k) in shapes.items():
        if name.endswith("gate_up_proj") and n % 2 == 0:
            yield (name,), n // 2, k
        elif name.endswith("gate_proj") and shapes.get(name[: -len("gate_proj")] + "up_proj") == (n, k):
            yield (name, name[: -len("gate_proj")] + "up_proj"), n, k


def qkv_entries(part: str = "all") -> list[CorpusEntry]:
    """Each model's query, key and value projections as one ``matmul`` problem per dtype and token count:
    x @ [Wq; Wk; Wv].t(), what ``kernels.patch`` runs for them (kernels.nn.SharedInput). Models that stack
    them already (Phi-3's ``qkv_proj``) have them among their Linears; models without the three (DeepSeek's
    latent attention) have none."""
    return _entries(part, "matmul", _qkv_layers)


_QKV = ("q_proj", "k_proj", "v_proj")


def _qkv_layers(document: dict, biased: bool | None = None) -> Iterator[tuple[str, int, int, tuple[str, ...]]]:
    """(model, N, K, names) of each model's q/k/v stacked; ``biased``: only models whose three carry a
    bias (True) or none (False); None: every model."""
    for model in document["models"]:
        shapes = {name: (int(n), int(k)) for name, n, k in model["layers"]}
        with_bias = set(_QKV) <= set(model.get("biased", ()))
        if biased is not None and with_bias != biased:
            continue
        if all(name in shapes for name in _QKV) and len({shapes[name][1] for name in _QKV}) == 1:
            yield model["name"], sum(shapes[name][0] for name in _QKV), shapes["q_proj"][1], _QKV


def bias_entries(part: str = "all") -> list[CorpusEntry]:
    """Each model's query, key and value projections that carry a bias (Qwen2.5's), stacked as
    ``kernels.patch`` runs them (kernels.nn.SharedInput, the biases stacked too): one ``matmul_bias``
    problem per dtype and token count. The same shapes are among ``qkv_entries``' matmul problems, which
    a patched model of theirs never calls: its call carries the bias."""
    return _entries(part, "matmul_bias", functools.partial(_qkv_layers, biased=True))


def _layers(document: dict) -> Iterator[tuple[str, int, int, tuple[str, ...]]]:
    """(model, N, K, layer names) for each distinct (N, K) of each model."""
    for model in document["models"]:
        by_shape: dict[tuple[int, int], list[str]] = {}
        for name, n, k in model["layers"]:
            by_shape.setdefault((int(n), int(k)), []).append(name)
        for (n, k), names in by_shape.items():
            yield model["name"], n, k, tuple(names)


# Every way the corpus poses a kernel's problems: an unseen problem is one that none of them poses.
_CORPUS_SHAPES: dict[str, tuple[Shapes, ...]] = {
    "matmul": (_layers, _qkv_layers),
    "gated_matmul": (_gated_layers,),
    "matmul_bias": (functools.partial(_qkv_layers, biased=True),),
}
