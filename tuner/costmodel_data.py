"""Observations for the cost model (kernels/_costmodel.py), gathered from where timings live.

Three sources, each giving ``Observation(problem, config, mode, time_ms, cublas_ms)``:

- a database: every measured trial of every Optuna study in it (study name
  ``DEVICE|KERNEL|PROBLEM_KEY``, trial ``user_attrs["config"]``), not only winners. A trial's
  ``user_attrs["eager_ms"]`` / ``["graph_ms"]`` give its time per mode; a trial without them is
  taken as graph mode at ``trial.value``. Quick timings (``timing: quick``, a candidate cut short
  as >10% off the best) are kept: they are real times of slow configs. cuBLAS's time per mode comes
  from that problem's record (``cublas_eager_ms`` / ``cublas_graph_ms`` where the record has them,
  else ``cublas_ms`` as graph); a study whose problem has no record is skipped.
- sweep files (``benchmarks/sweeps/*.json``, written by scripts/sweep.py): every ok row, against
  the sweep's ``baseline_ms``, as graph mode (do_bench with L2 flushed).
- a rows file, the simple format a GPU corpus run writes: a JSON list of objects

      {"problem_key": "bf16:nt:128x4096x4096", "kernel": "matmul" (optional, default matmul),
       "device": "NVIDIA H100 80GB HBM3" (optional), "config": "BLOCK_M: 64, ..." or "cublas",
       "mode": "eager" | "graph", "time_ms": 0.0123}

  where ``config`` is ``str(Config)`` (``Config.parse``-able) or a dict, and the rows with config
  ``"cublas"`` give each (problem, mode) its cuBLAS time; a problem and mode without a cuBLAS row
  is skipped.
"""

from __future__ import annotations

import glob
import json
import logging
import math
from collections.abc import Iterable

import optuna

from kernels import Config, Problem
from kernels._costmodel import MODES, CostModel, Observation
from kernels._spec import is_baseline

from db import Store

logger = logging.getLogger(__name__)


def _config(value: object) -> Config:
    if isinstance(value, dict):
        return Config.from_dict(value)
    if value == "cublas":
        return Config.make(VARIANT="cublas")
    return Config.parse(str(value))


def from_database(url: str, device: str | None = None) -> list[Observation]:
    """Every measured trial of the studies in the database at ``url`` whose problem has a record."""
    store = Store(url, create=False)
    cublas: dict[tuple[str, str, str], dict[str, float]] = {}
    try:
        for r in store.records(device=device):  # one record per mode; a legacy record is graph
            if r.cublas_ms:
                cublas.setdefault((r.device_name, r.kernel, r.problem_key), {})[getattr(r, "mode", "graph")] = r.cublas_ms
    finally:
        store.close()
    storage = optuna.storages.RDBStorage(url)
    observations = []
    for summary in optuna.get_all_study_summaries(storage, include_best_trial=False):
        parts = summary.study_name.split("|")
        if len(parts) != 3 or (parts[0], parts[1], parts[2]) not in cublas:
            continue
        device_name, kernel, key = parts
        problem, base = Problem.from_key(kernel, key), cublas[(device_name, kernel, key)]
        study = optuna.load_study(study_name=summary.study_name, storage=storage)
        for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
            attrs = trial.user_attrs
            if attrs.get("status", "ok") != "ok" or attrs.get("repeat") or "config" not in attrs:
                continue
            times = {mode: attrs.get(f"{mode}_ms") for mode in MODES}
            if not any(times.values()):
                times["graph"] = trial.value
            config = _config(attrs["config"])
            observations += [Observation(problem, config, mode, float(t), base[mode])
                             for mode, t in times.items() if t and mode in base and math.isfinite(t)]
    logger.info("%d observations from the studies in %s", len(observations), url)
    return observations


def from_sweeps(pattern: str, kernel: str | None = "matmul") -> list[Observation]:
    """Every ok row of the sweep files matching ``pattern`` (graph mode); ``kernel`` filters."""
    observations = []
    for path in sorted(glob.glob(pattern)):
        with open(path) as f:
            doc = json.load(f)
        if kernel and doc["kernel"] != kernel:
            continue
        problem = Problem.from_key(doc["kernel"], doc["problem"])
        for row in doc["rows"]:
            if row["status"] == "ok" and row.get("time_ms"):
                time_ms = row.get("confirmed_ms") or row["time_ms"]
                observations.append(Observation(problem, Config.from_dict(row["config"]), "graph",
                                                float(time_ms), float(doc["baseline_ms"])))
    return observations


def from_rows(rows: Iterable[dict], device: str | None = None) -> list[Observation]:
    """Observations from rows of the simple format (see the module docstring)."""
    rows = [r for r in rows if device is None or r.get("device", device) == device]
    cublas = {(r.get("kernel", "matmul"), r["problem_key"], r["mode"]): float(r["time_ms"])
              for r in rows if r["config"] == "cublas" or (isinstance(r["config"], dict) and is_baseline(_config(r["config"])))}
    observations, missing = [], set()
    for r in rows:
        config = _config(r["config"])
        kernel = r.get("kernel", "matmul")
        if is_baseline(config):
            continue
        base = cublas.get((kernel, r["problem_key"], r["mode"]))
        if base is None:
            missing.add((r["problem_key"], r["mode"]))
            continue
        observations.append(Observation(Problem.from_key(kernel, r["problem_key"]), config, r["mode"],
                                        float(r["time_ms"]), base))
    if missing:
        logger.warning("%d (problem, mode) pairs have no cuBLAS row and were skipped, e.g. %s",
                       len(missing), sorted(missing)[0])
    return observations


def from_rows_file(path: str, device: str | None = None) -> list[Observation]:
    with open(path) as f:
        rows = json.load(f)
    if not isinstance(rows, list):
        raise ValueError(f"{path} must hold a JSON list of rows (see tuner/costmodel_data.py); it holds a {type(rows).__name__}")
    return from_rows(rows, device)


def ranked_warm_start(model: CostModel, problem: Problem, candidates: Iterable[Config], mode: str = "graph",
                      count: int = 8) -> list[Config]:
    """The ``count`` candidates the model predicts fastest on ``problem``: the search's first trials
    (tuner.search's warm start can put them after what dispatch would pick). Candidates are usually
    ``spec.space.enumerate(problem, device)``; configs predicted no better than unknowable are left out."""
    if mode not in model.modes:
        return []
    return [config for config, ratio in model.rank(problem, candidates, mode)[:count] if math.isfinite(ratio)]
