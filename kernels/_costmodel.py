"""A cost model learnt from every timed trial: predicted time / cuBLAS time of a config on a problem.

The search ranks its warm start with it (tuner/search.py ``_model_picks``); ``kernels._fallback`` is a
fallback by it, evaluated but not what dispatch runs (docs/COSTMODEL.md).
numpy and the standard library only: the runtime must not import Optuna or the tuner.

Two learners, compared by ``scripts/costmodel_eval.py`` (docs/COSTMODEL.md has the numbers):

- ``knn``: the log ratio of the same config on the nearest observed problems (log-shape distance,
  as dispatch's "nearest tuned problem"), inverse-distance weighted; a config never observed
  borrows from the observations nearest in (problem, config) space, at a distance penalty.
- ``ridge``: least squares on problem x config features (log M/N/K, log tile sizes, split, warps,
  stages, variant one-hot, tiles per SM wave, padding waste, tile arithmetic intensity) and their
  pairwise products, fitted per kernel and layout; learns trends that carry to shapes far from every
  observation.

Both predict per mode ("eager" or "graph"); a model fitted on one mode's observations answers only
for that mode. ``evidence`` says how far the nearest observation of the same config lies, which the
fallback policy uses to refuse a guess that nothing measured nearby backs.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ._spec import Config, Problem, is_baseline, is_row_loop

MODES = ("eager", "graph")
KINDS = ("knn", "ridge")
FORMAT_VERSION = 5  # 2: gemv among the variants, its own blocks in the features; 3: the epilogues' row loop too;
# 4: fp32 a feature of its own (it had counted as fp16); 5: ridge weights per kernel and layout

_VARIANTS = ("tiled", "splitk", "tma", "repack", "gemv")
# fp16 and bf16 share element size and tensor-core rate: the same shape in the other one counts as
# one factor of 2 farther (kernels/_spec.py HALF_SIBLING_PENALTY says the same for dispatch).
_DTYPE_PENALTY = {frozenset(("fp16", "bf16")): 1.0}
# A different config is this far away per unit of config-feature distance (a factor 2 in one tile).
_CONFIG_WEIGHT = 1.0
_KNN_K = 8
# Ridge strength on standardised features: a first guess, not yet tuned on measured data (the sweeps
# hold two dense problems); scripts/costmodel_eval.py on a quick-tuned corpus database should set it.
RIDGE_ALPHA = 1e-2
_SMS = 132  # the H100's; the waves feature only needs the right order of magnitude elsewhere


@dataclass(frozen=True)
class Observation:
    """One timed config on one problem in one mode, beside cuBLAS on the same problem and mode."""

    problem: Problem
    config: Config
    mode: str
    time_ms: float
    cublas_ms: float

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"observation mode {self.mode!r} is not one of {', '.join(MODES)}")
        # An infinite time would make every ridge weight, and so every prediction, NaN.
        if not all(0 < t < math.inf for t in (self.time_ms, self.cublas_ms)):
            raise ValueError(f"observation of {self.problem.key} needs positive, finite times, got "
                             f"{self.time_ms} ms and cuBLAS {self.cublas_ms} ms; leave out the trials that failed "
                             "or were not timed")

    @property
    def log_ratio(self) -> float:
        return math.log(self.time_ms / self.cublas_ms)


def _dims(problem: Problem) -> tuple[float, float, float]:
    """(M, N, K) of a dense problem; a group's total rows with its first GEMM's N and K."""
    m = sum(s[0] for s in problem.shapes)
    return float(max(m, 1)), float(max(problem.shapes[0][1], 1)), float(max(problem.shapes[0][2], 1))


def shape_distance(p: Problem, q: Problem) -> float:
    """Log2 distance of (M, N, K); another layout or kernel is infinitely far, the other half type 1."""
    if p.kernel != q.kernel or p.layout != q.layout:
        return math.inf
    extra = 0.0
    if p.dtype != q.dtype:
        extra = _DTYPE_PENALTY.get(frozenset((p.dtype, q.dtype)), math.inf)
    return math.sqrt(sum((math.log2(a) - math.log2(b)) ** 2 for a, b in zip(_dims(p), _dims(q)))) + extra


def _variant(config: Config) -> str:
    """``config``'s variant, a row loop (``is_row_loop``: the epilogue kernels' has no VARIANT) counted as gemv."""
    return "gemv" if is_row_loop(config) else config.get("VARIANT", "tiled")


def _blocks(config: Config) -> tuple[float, float, float]:
    """The (rows, columns, K run) a program of ``config`` covers: a row loop's own blocks (its BLOCK_M/N/K are
    folded placeholders), else BLOCK_M/N/K."""
    if is_row_loop(config):
        return 1.0, float(config.get("GEMV_BLOCK_N", 1)), float(config.get("GEMV_BLOCK_K", 256))
    return tuple(float(config.get(name, 64)) for name in ("BLOCK_M", "BLOCK_N", "BLOCK_K"))  # type: ignore[return-value]


def _config_vector(config: Config) -> np.ndarray:
    get = config.get
    variant = _variant(config)
    onehot = [4.0 * (variant == v) for v in _VARIANTS]  # a variant change weighs as two factors of 2 in a tile
    bm, bn, bk = _blocks(config)
    return np.array([math.log2(bm), math.log2(bn), math.log2(bk),
                     math.log2(get("SPLIT_K", 1)), math.log2(config.num_warps), 0.5 * config.num_stages,
                     0.5 * math.log2(get("GROUP_SIZE_M", 8)), *onehot], dtype=float)


def config_distance(a: Config, b: Config) -> float:
    return float(np.linalg.norm(_config_vector(a) - _config_vector(b))) / 2.0


def features(problem: Problem, config: Config) -> np.ndarray:
    """The ridge learner's raw features of (problem, config), before products and scaling."""
    m, n, k = _dims(problem)
    bm, bn, bk = _blocks(config)
    split = float(config.get("SPLIT_K", 1))
    tiles = math.ceil(m / bm) * math.ceil(n / bn) * len(problem.shapes)
    programs = tiles * split
    waves = programs / _SMS
    wave_waste = math.ceil(waves) / waves - 1.0  # idle fraction of the last wave
    pad_waste = (math.ceil(m / bm) * bm * math.ceil(n / bn) * bn) / (m * n) - 1.0
    k_steps = math.ceil(k / (bk * split))
    intensity = bm * bn / (bm + bn)  # FLOPs per element loaded in one K step of a tile
    variant = _variant(config)
    return np.array([math.log2(m), math.log2(n), math.log2(k), math.log2(bm), math.log2(bn), math.log2(bk),
                     math.log2(split), math.log2(config.num_warps), float(config.num_stages),
                     math.log2(programs), math.log2(max(waves, 1e-3)), wave_waste, math.log2(1 + pad_waste),
                     math.log2(k_steps), math.log2(intensity), float(problem.dtype == "bf16"),
                     float(problem.dtype == "fp32"), *(float(variant == v) for v in _VARIANTS)], dtype=float)


def _expand(x: np.ndarray) -> np.ndarray:
    """Features, their pairwise products (upper triangle) and a constant: a quadratic model."""
    rows, cols = np.triu_indices(x.shape[1])
    return np.hstack([x, x[:, rows] * x[:, cols], np.ones((x.shape[0], 1))])


@dataclass
class CostModel:
    """A fitted model: ``predict_ratio`` is predicted time / cuBLAS time on the problem, per mode."""

    kind: str
    # per mode: (problem key, kernel, config text, log ratio) of every observation (knn, evidence)
    points: dict[str, list[tuple[str, str, str, float]]]
    # per mode, per kernel and layout (``_ridge_group``): ridge weights, feature means and scales (ridge)
    ridge: dict[str, dict[str, dict[str, list[float]]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"cost model kind {self.kind!r} is not one of {', '.join(KINDS)}")
        self._index = {mode: _Index(rows) for mode, rows in self.points.items()}

    @property
    def modes(self) -> tuple[str, ...]:
        return tuple(self.points)

    def _rows(self, mode: str) -> _Index:
        if mode not in self._index:
            raise KeyError(f"the cost model has no observations in mode {mode!r}; it has {', '.join(self.modes) or 'none'}")
        return self._index[mode]

    def predict_ratio(self, problem: Problem, config: Config, mode: str = "graph") -> float:
        """Predicted time of ``config`` on ``problem`` over cuBLAS's, in ``mode``; inf if unknowable."""
        if is_baseline(config):
            return 1.0
        if self.kind == "ridge":
            return self._ridge(problem, config, mode)
        return self._knn(problem, config, mode)

    def _knn(self, problem: Problem, config: Config, mode: str) -> float:
        index = self._rows(mode)
        d = index.shape_distances(problem)
        d = d + np.where(index.config_ids == index.ids.get(config, -1), 0.0,
                         0.5 + _CONFIG_WEIGHT * index.config_distances(config))
        finite = np.isfinite(d)
        if not finite.any():
            return math.inf
        near = np.argsort(np.where(finite, d, np.inf))[:min(_KNN_K, int(finite.sum()))]
        weights = 1.0 / (0.25 + d[near]) ** 2
        return float(math.exp(np.dot(weights, index.y[near]) / weights.sum()))

    def _ridge(self, problem: Problem, config: Config, mode: str) -> float:
        self._rows(mode)
        fitted = self.ridge.get(mode, {}).get(_ridge_group(problem))
        if not fitted:
            return math.inf
        x = (features(problem, config) - np.array(fitted["mean"])) / np.array(fitted["scale"])
        y = float((_expand(x[None, :]) @ np.array(fitted["weights"]))[0])
        return math.exp(min(y, 20.0))

    def evidence(self, problem: Problem, config: Config, mode: str = "graph") -> float:
        """Log-shape distance to the nearest observation of this very config in ``mode`` (inf if none)."""
        index = self._rows(mode)
        same = index.config_ids == index.ids.get(config, -1)
        return float(index.shape_distances(problem)[same].min()) if same.any() else math.inf

    def rank(self, problem: Problem, candidates: Iterable[Config], mode: str = "graph") -> list[tuple[Config, float]]:
        """The candidates, best predicted first, each with its predicted ratio to cuBLAS."""
        scored = [(c, self.predict_ratio(problem, c, mode)) for c in dict.fromkeys(candidates)]
        return sorted(scored, key=lambda pair: pair[1])

    def to_json(self) -> str:
        return json.dumps({"format": FORMAT_VERSION, "kind": self.kind, "points": self.points, "ridge": self.ridge})

    @classmethod
    def from_json(cls, text: str) -> CostModel:
        doc = json.loads(text)
        if doc.get("format") != FORMAT_VERSION:
            raise ValueError(f"cost model format {doc.get('format')!r} is not {FORMAT_VERSION}; refit it with this code")
        points = {mode: [tuple(row) for row in rows] for mode, rows in doc["points"].items()}
        return cls(doc["kind"], points, doc.get("ridge", {}))


class _Index:
    """One mode's observations as arrays, so a prediction is a few vector operations."""

    def __init__(self, rows: Sequence[tuple[str, str, str, float]]) -> None:
        problems = [Problem.from_key(kernel, key) for key, kernel, _, _ in rows]
        self.ids: dict[Config, int] = {}
        parsed = [Config.parse(text) for _, _, text, _ in rows]
        for config in parsed:
            self.ids.setdefault(config, len(self.ids))  # Config equality ignores the order of its values
        configs = list(self.ids)
        self.config_ids = np.array([self.ids[c] for c in parsed], dtype=int)
        self.y = np.array([y for *_, y in rows], dtype=float)
        self.log_dims = np.log2(np.array([_dims(p) for p in problems], dtype=float).reshape(-1, 3))
        groups = [(p.kernel, p.layout, p.dtype) for p in problems]
        self.groups = list(dict.fromkeys(groups))
        self.group_ids = np.array([self.groups.index(g) for g in groups], dtype=int)
        self.config_vectors = np.array([_config_vector(c) for c in configs]).reshape(len(configs), -1)

    def shape_distances(self, problem: Problem) -> np.ndarray:
        base = np.sqrt(((self.log_dims - np.log2(np.array(_dims(problem)))) ** 2).sum(axis=1))
        extra = np.array([_group_penalty(problem, g) for g in self.groups] or [0.0], dtype=float)
        return base + extra[self.group_ids]

    def config_distances(self, config: Config) -> np.ndarray:
        per_config = np.linalg.norm(self.config_vectors - _config_vector(config), axis=1) / 2.0
        return per_config[self.config_ids]


def _group_penalty(problem: Problem, group: tuple[str, str, str]) -> float:
    kernel, layout, dtype = group
    if kernel != problem.kernel or layout != problem.layout:
        return math.inf
    return 0.0 if dtype == problem.dtype else _DTYPE_PENALTY.get(frozenset((dtype, problem.dtype)), math.inf)


def fit(observations: Iterable[Observation], kind: str = "knn", alpha: float = RIDGE_ALPHA) -> CostModel:
    """Fit a model to observations of any problems and configs; modes are kept apart."""
    by_mode: dict[str, list[Observation]] = {}
    for obs in observations:
        if not is_baseline(obs.config):
            by_mode.setdefault(obs.mode, []).append(obs)
    points = {mode: [(o.problem.key, o.problem.kernel, str(o.config), o.log_ratio) for o in rows]
              for mode, rows in by_mode.items()}
    ridge: dict[str, dict[str, dict[str, list[float]]]] = {}
    if kind == "ridge":
        for mode, rows in by_mode.items():
            groups: dict[str, list[Observation]] = {}
            for obs in rows:
                groups.setdefault(_ridge_group(obs.problem), []).append(obs)
            ridge[mode] = {group: _fit_ridge(members, alpha) for group, members in groups.items()}
    return CostModel(kind, points, ridge)


def _ridge_group(problem: Problem) -> str:
    """The observations one ridge fit learns from: one kernel and layout. The features tell neither apart, and
    nothing carries across them (knn counts them infinitely far: ``_group_penalty``)."""
    return f"{problem.kernel}:{problem.layout}"


def _fit_ridge(rows: Sequence[Observation], alpha: float) -> dict[str, list[float]]:
    raw = np.array([features(o.problem, o.config) for o in rows])
    mean, scale = raw.mean(axis=0), raw.std(axis=0)
    scale[scale == 0] = 1.0
    x = _expand((raw - mean) / scale)
    y = np.array([o.log_ratio for o in rows])
    penalty = alpha * len(rows) * np.eye(x.shape[1])
    penalty[-1, -1] = 0.0  # the constant is not shrunk
    weights = np.linalg.solve(x.T @ x + penalty, x.T @ y)
    return {"weights": weights.tolist(), "mean": mean.tolist(), "scale": scale.tolist()}
