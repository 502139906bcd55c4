"""Offline search for a user kernel decorated with ``kernels.autotune``: one resumable Optuna study per key.

Each candidate is first checked (its tensor arguments after the call against ``reference=``'s, or else the first
config's that ran), then timed with the decorator's own timer. The winner is stored as the decorator stores it, so
the next process that calls the kernel at that key reads it instead of tuning.
"""

from __future__ import annotations

import importlib
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import torch

import kernels
from db import Record, Store
from db.recorded import recorded
from kernels._autotune_core import (AutotuneError, Key, Launch, make_record, outputs_close, problem_key,
                                    split_problem_key)

from .search import optuna_storage
from .errors import device_faulted
from .workers import TimingWorker, WorkerLost, exit_if_device_faulted

_logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class KernelOutcome:
    """One key's search: the stored record, or why nothing was stored."""

    key: Key
    record: Record | None
    error: str | None = None


def load_kernel(target: str) -> kernels.Autotuner:
    """``my_pkg.my_mod:my_kernel`` -> the ``kernels.autotune`` object it names."""
    module_name, sep, attribute = target.partition(":")
    if not sep or not module_name or not attribute:
        raise ValueError(f"--kernel {target!r}: name a user kernel as MODULE:NAME, e.g. my_pkg.my_mod:my_kernel")
    try:
        found: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"--kernel {target}: cannot import {module_name} ({exc}); run from the folder that holds it "
                         "or put it on PYTHONPATH") from None
    for part in attribute.split("."):
        found = getattr(found, part, None)
    if not isinstance(found, kernels.Autotuner):
        raise ValueError(f"--kernel {target}: {attribute} is not a kernel decorated with @kernels.autotune "
                         f"(it is {type(found).__name__})")
    return found


def keys_from_file(path: str) -> list[Key]:
    """Keys from a JSON list: each an object of key values, with ``"dtypes"``: the argument dtypes (Triton's order)."""
    try:
        items = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"--problems {path}: cannot read it as JSON ({exc})") from None
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise ValueError(f"--problems {path}: for a user kernel, write a JSON list of key objects, e.g. "
                         '[{"n_cols": 781, "dtypes": ["float32", "float32"]}]')
    return [Key({k: v for k, v in i.items() if k != "dtypes"}, tuple(i.get("dtypes", ()))) for i in items]


def recorded_keys(store: Store, tuner: kernels.Autotuner, device: kernels.DeviceInfo) -> list[Key]:
    """The keys record mode saw for this kernel (this source) on this device kind and nobody tuned yet."""
    keys = []
    for problem in recorded(store, device.name, untuned=True):
        if problem.key.kernel == tuner.name:
            key, stamp = split_problem_key(problem.key.problem_key)
            if stamp == tuner.stamp:
                keys.append(key)
    return keys


def search_kernel(tuner: kernels.Autotuner, target: str, keys: Sequence[Key], store: Store,
                  device: kernels.DeviceInfo, trials: int = 40, seed: int | None = None, isolated: bool = True,
                  on_done: Callable[[KernelOutcome], None] | None = None) -> list[KernelOutcome]:
    """Tune each key and store its winner; a key that fails says why and stores nothing.

    ``isolated``: each candidate is checked and timed in a worker process (``TimingWorker``), so one that kills
    its process (an illegal address, a compiler crash) or hangs costs that trial only; ``target`` (MODULE:NAME)
    is how the worker imports the kernel.
    """
    if tuner.inputs is None:
        raise ValueError(f"{tuner.name} has no inputs=: give the decorator a function from key values to a "
                         "kernels.Launch, so that a search can make the call's arguments")
    storage = optuna_storage(store.url)
    worker = TimingWorker() if isolated else None
    outcomes = []
    try:
        for key in keys:
            try:
                record = _search_one(tuner, target, key, store, storage, device, trials, seed, worker)
                outcome = KernelOutcome(key, record)
            except AutotuneError as exc:
                outcome = KernelOutcome(key, None, str(exc))
            outcomes.append(outcome)
            if on_done:
                on_done(outcome)
    finally:
        if worker is not None:
            worker.close()
    return outcomes


def _search_one(tuner: kernels.Autotuner, target: str, key: Key, store: Store, storage: Any,
                device: kernels.DeviceInfo, trials: int, seed: int | None, worker: TimingWorker | None) -> Record:
    configs = tuner.candidates(key) if tuner.space is None else _space_points(tuner, key)
    study = optuna.create_study(study_name=f"autotune:{device.name}:{tuner.name}:{problem_key(key, tuner.stamp)}",
                                storage=storage, load_if_exists=True, direction="minimize",
                                sampler=optuna.samplers.TPESampler(seed=seed))
    done = {t.params.get("index") for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE}
    for warm in range(min(len(tuner.configs), len(configs))):
        if warm not in done:
            study.enqueue_trial({"index": warm}, skip_if_exists=True)

    def objective(trial: optuna.Trial) -> float:
        config = configs[trial.suggest_int("index", 0, len(configs) - 1)]
        if worker is None:
            return evaluate(target, key.text, str(config), tuner)
        try:
            return worker.call(evaluate, target, key.text, str(config))
        except WorkerLost as exc:
            _logger.warning("%s %s: config %s ended its worker (%s) and is skipped", tuner.name, key.text, config, exc)
            return float("inf")

    left = min(trials, len(configs)) - len(done)
    if left > 0:
        study.optimize(objective, n_trials=left)
    finished = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE and t.value != float("inf")]
    if not finished:
        raise AutotuneError(f"{tuner.name} failed or gave wrong outputs for every config tried at key {key.text}, so "
                            "nothing was stored; run one config with TRITON_INTERPRET=1 to see why")
    best = min(finished, key=lambda t: t.value)
    record = make_record(tuner.name, device, key, tuner.stamp, configs[best.params["index"]], best.value,
                         len(finished))
    store.put(record)
    return record


# What a process has set up for a key: (launch, the tensors before a call, the tensors after a correct one).
_PREPARED: dict[tuple[str, str], tuple[Launch, list[torch.Tensor], list[torch.Tensor]]] = {}


def evaluate(target: str, key_text: str, config_text: str, tuner: kernels.Autotuner | None = None) -> float:
    """Check one config at one key, then time it: its median ms, or inf where it faults or computes wrong.

    Runs in the timing worker (or in process, given ``tuner``); the key's inputs and expected outputs are made
    once per process. Raises AutotuneError where no config yields an expected output."""
    in_worker = tuner is None
    tuner = tuner or load_kernel(target)
    prepared = _PREPARED.get((target, key_text))
    if prepared is None:
        key = Key.parse(key_text)
        launch = tuner.inputs(key)
        pristine = _tensors_copy(launch)
        configs = tuner.candidates(key) if tuner.space is None else _space_points(tuner, key)
        prepared = _PREPARED[(target, key_text)] = (launch, pristine, _expected(tuner, launch, configs, pristine))
    launch, pristine, expected = prepared
    config = kernels.Config.parse(config_text)
    _restore(launch, pristine)
    wrong = _check(tuner, config, launch, expected)
    if wrong:
        _stop_if_the_gpu_faulted(tuner.name, config, wrong, in_worker=in_worker)
        _logger.warning("%s %s: config %s is skipped: %s", tuner.name, key_text, config, wrong)
        return float("inf")
    _restore(launch, pristine)
    try:
        return tuner.bench(config, launch.args, dict(launch.kwargs), launch.grid)
    except AutotuneError as exc:  # a fault while timing: Autotuner.bench names it (kernels/_autotune.py)
        if in_worker:
            _stop_if_the_gpu_faulted(tuner.name, config, str(exc).splitlines()[0], in_worker=True)
        raise


def _stop_if_the_gpu_faulted(name: str, config: Any, error: str, in_worker: bool) -> None:
    """A config that faulted the GPU while checked or timed is not a wrong config to skip: the process's CUDA
    context is gone, and every later candidate would fail in it. The timing worker exits as the check pool's do
    (its parent scores the candidate as lost and starts a sound worker); in process, the search stops with the
    config named."""
    if in_worker:
        exit_if_device_faulted(f"{name} config {config}", error)
    elif device_faulted():
        raise AutotuneError(f"{name}: checking config {config} in this process faulted the GPU ({error}); its "
                            "CUDA context is lost. Restart, and search in worker processes (leave out --workers 0)")


def _space_points(tuner: kernels.Autotuner, key: Key) -> list:
    """The list's configs (warm starts, first) then every valid point of the space: the study's choices."""
    points = tuner.space.configs(key.values)
    given = [c for c in tuner.configs if tuner.space.valid(c.as_dict(), key.values)]
    if not points and not given:
        raise AutotuneError(tuner._nothing_valid(key))
    return given + [p for p in points if p not in given]


def _tensors_copy(launch: Launch) -> list[torch.Tensor]:
    return [a.clone() for a in _tensors(launch)]


def _tensors(launch: Launch) -> list[torch.Tensor]:
    return [a for a in (*launch.args, *launch.kwargs.values()) if isinstance(a, torch.Tensor)]


def _restore(launch: Launch, pristine: list[torch.Tensor]) -> None:
    for tensor, saved in zip(_tensors(launch), pristine):
        tensor.copy_(saved)


def _run_once(tuner: kernels.Autotuner, config: Any, launch: Launch) -> list[torch.Tensor]:
    tuner.fn.run(*launch.args, grid=launch.grid, warmup=False, **dict(launch.kwargs), **config.as_dict())
    return [t.clone() for t in _tensors(launch)]


def _expected(tuner: kernels.Autotuner, launch: Launch, configs: list, pristine: list[torch.Tensor]) -> list:
    """The tensors after a correct call: the reference's, else those of the first config that runs."""
    if tuner.reference is not None:
        _restore(launch, pristine)
        tuner.reference(*launch.args, **dict(launch.kwargs))
        return [t.clone() for t in _tensors(launch)]
    last: Exception | None = None
    for config in configs:
        _restore(launch, pristine)
        try:
            return _run_once(tuner, config, launch)
        except Exception as exc:  # a faulting config is skipped; the next one may set the expectation
            last = exc
    raise AutotuneError(f"{tuner.name} failed for every one of its {len(configs)} config(s), so nothing was stored; "
                        f"the last error: {type(last).__name__}: {str(last).splitlines()[0] if str(last) else ''}")


def _check(tuner: kernels.Autotuner, config: Any, launch: Launch, expected: list) -> str | None:
    try:
        got = _run_once(tuner, config, launch)
    except Exception as exc:
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return outputs_close(got, expected, tuner.tolerance)
